//! The data pattern `--verify` checks: every byte is a function of (QP, message, offset).
//!
//! A message's bytes come from an xorshift64* stream seeded by its QP and message index,
//! so a stale buffer, a misplaced packet or a message delivered twice all show as a
//! mismatch. The generator makes 8 bytes per step, fast enough to verify at several GB/s.

/// Seed for message `msg` on QP index `qp`, mixed so neighbouring seeds share no bits.
fn seed(qp: u32, msg: u64) -> u64 {
    // splitmix64 finaliser over (qp, msg).
    let mut z = (u64::from(qp) << 48) ^ msg ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let z = z ^ (z >> 31);
    // xorshift must not start at zero.
    if z == 0 {
        1
    } else {
        z
    }
}

/// The xorshift64* stream.
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Fills `buf` with the pattern of message `msg` on QP `qp`.
pub fn fill(buf: &mut [u8], qp: u32, msg: u64) {
    let mut s = Stream(seed(qp, msg));
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&s.next().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = s.next().to_le_bytes();
    rest.copy_from_slice(&last[..rest.len()]);
}

/// Checks `buf` against the pattern; on mismatch returns (offset, expected, found).
///
/// Compares a u64 per step: a slice comparison per 8 bytes is a `memcmp` call each,
/// which made the server's check, not the transport, the limit of a verified run
/// (40 % of its CPU at 2 Gb/s).
pub fn check(buf: &[u8], qp: u32, msg: u64) -> Result<(), (usize, u8, u8)> {
    let mut s = Stream(seed(qp, msg));
    let mut chunks = buf.chunks_exact(8);
    for (k, c) in (&mut chunks).enumerate() {
        let want = s.next();
        let got = c.try_into().map_or(!want, u64::from_le_bytes);
        if got != want {
            return Err(mismatch(k * 8, c, &want.to_le_bytes()));
        }
    }
    let rest = chunks.remainder();
    let want = s.next().to_le_bytes();
    if rest != &want[..rest.len()] {
        return Err(mismatch(buf.len() - rest.len(), rest, &want));
    }
    Ok(())
}

/// The first differing byte of `got` against `want`, at `off` + its index.
fn mismatch(off: usize, got: &[u8], want: &[u8]) -> (usize, u8, u8) {
    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    (off + i, want[i], got[i])
}

/// A description of a mismatch for the error message.
pub fn describe(qp: u32, msg: u64, (off, want, got): (usize, u8, u8)) -> String {
    format!("QP {qp} message {msg} offset {off}: expected {want:#04x}, found {got:#04x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_detects() {
        for len in [1usize, 7, 8, 9, 4096, 4099] {
            let mut b = vec![0u8; len];
            fill(&mut b, 3, 17);
            assert!(check(&b, 3, 17).is_ok());
            assert!(check(&b, 3, 18).is_err());
            if len >= 8 {
                assert!(check(&b, 4, 17).is_err());
            }
            b[len / 2] ^= 0x10;
            assert_eq!(check(&b, 3, 17).unwrap_err().0, len / 2);
            b[len / 2] ^= 0x10;
            b[len - 1] ^= 1;
            assert_eq!(check(&b, 3, 17).unwrap_err().0, len - 1);
        }
    }
}
