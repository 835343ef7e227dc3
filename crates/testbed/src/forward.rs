//! The forwarder: one thread per direction reads frames from one tap, decides their fate
//! with a seeded RNG, holds delayed ones in a deadline heap and writes them to the other.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Impairment, Shared};

/// Frame counts of one direction.
#[derive(Debug, Default)]
pub struct DirectionStats {
    /// Frames read from the source tap.
    pub received: AtomicU64,
    /// Frames written to the destination tap (duplicates included).
    pub delivered: AtomicU64,
    /// Frames dropped by the loss setting.
    pub dropped: AtomicU64,
    /// Extra copies made by the duplication setting.
    pub duplicated: AtomicU64,
    /// Frames with a flipped bit.
    pub corrupted: AtomicU64,
    /// Frames dropped because the delay queue was full.
    pub overflow: AtomicU64,
    /// Writes the destination tap refused.
    pub write_errors: AtomicU64,
}

impl DirectionStats {
    /// `(name, value)` of every count, for printing.
    pub fn snapshot(&self) -> [(&'static str, u64); 7] {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("received", g(&self.received)),
            ("delivered", g(&self.delivered)),
            ("dropped", g(&self.dropped)),
            ("duplicated", g(&self.duplicated)),
            ("corrupted", g(&self.corrupted)),
            ("overflow", g(&self.overflow)),
            ("write_errors", g(&self.write_errors)),
        ]
    }
}

/// How long a thread sleeps in poll when nothing is due, so `stop` is seen promptly.
const IDLE: Duration = Duration::from_millis(20);

pub(crate) fn run(
    from: &OwnedFd,
    to: &OwnedFd,
    shared: &Shared,
    stats: &DirectionStats,
    seed: u64,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut heap: BinaryHeap<Reverse<(Instant, u64, Vec<u8>)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut buf = vec![0u8; 65536];
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while heap.peek().is_some_and(|Reverse((t, _, _))| *t <= now) {
            if let Some(Reverse((_, _, frame))) = heap.pop() {
                write_frame(to, &frame, stats);
            }
        }
        // SAFETY: `buf` is valid for `buf.len()` writable bytes for the whole call.
        let n = unsafe { libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            // EAGAIN (or a transient error): wait for a frame or the next deadline.
            let wait = heap
                .peek()
                .map(|Reverse((t, _, _))| t.saturating_duration_since(now))
                .unwrap_or(IDLE)
                .min(IDLE);
            let mut pfd = libc::pollfd {
                fd: from.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = wait.as_micros().div_ceil(1000) as libc::c_int;
            // SAFETY: one valid pollfd for the duration of the call.
            unsafe { libc::poll(&mut pfd, 1, ms) };
            continue;
        }
        let frame = &buf[..n as usize];
        stats.received.fetch_add(1, Ordering::Relaxed);
        let imp: Impairment = *shared.impairment.lock();
        if imp.loss > 0.0 && rng.gen::<f64>() < imp.loss {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let copies = if imp.dup > 0.0 && rng.gen::<f64>() < imp.dup {
            stats.duplicated.fetch_add(1, Ordering::Relaxed);
            2
        } else {
            1
        };
        for _ in 0..copies {
            let corrupt = imp.corrupt > 0.0 && rng.gen::<f64>() < imp.corrupt;
            let delay = if imp.jitter.is_zero() {
                imp.delay
            } else {
                let j = imp.jitter.as_secs_f64();
                Duration::from_secs_f64((imp.delay.as_secs_f64() + rng.gen_range(-j..=j)).max(0.0))
            };
            if !corrupt && delay.is_zero() && heap.is_empty() {
                write_frame(to, frame, stats);
                continue;
            }
            let mut owned = frame.to_vec();
            if corrupt {
                corrupt_frame(&mut owned, &mut rng);
                stats.corrupted.fetch_add(1, Ordering::Relaxed);
            }
            if heap.len() >= shared.queue_limit {
                stats.overflow.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            seq += 1;
            heap.push(Reverse((now + delay, seq, owned)));
        }
    }
}

fn write_frame(to: &OwnedFd, frame: &[u8], stats: &DirectionStats) {
    // SAFETY: `frame` is valid for `frame.len()` readable bytes for the whole call.
    let r = unsafe { libc::write(to.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
    if r < 0 {
        stats.write_errors.fetch_add(1, Ordering::Relaxed);
    } else {
        stats.delivered.fetch_add(1, Ordering::Relaxed);
    }
}

/// Flips one random bit of an Ethernet frame. In an IPv4/IPv6 UDP datagram the bit is in
/// the UDP payload and a non-zero UDP checksum is recomputed, so only an end-to-end check
/// (RoCEv2's ICRC) can notice; any other frame gets a bit flipped after the MAC header.
pub fn corrupt_frame(frame: &mut [u8], rng: &mut impl Rng) {
    if let Some(udp) = udp_offset(frame) {
        let len = udp_len(frame, udp);
        if len > 8 {
            let bit = rng.gen_range(0..(len - 8) * 8);
            frame[udp + 8 + bit / 8] ^= 1 << (bit % 8);
            fix_udp_checksum(frame, udp, len);
            return;
        }
    }
    if frame.len() > 14 {
        let bit = rng.gen_range(0..(frame.len() - 14) * 8);
        frame[14 + bit / 8] ^= 1 << (bit % 8);
    }
}

/// Offset of the UDP header in an untagged Ethernet frame, if it carries one (IPv4
/// without fragmentation, or IPv6 whose next header is UDP).
fn udp_offset(f: &[u8]) -> Option<usize> {
    let ethertype = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
    match ethertype {
        0x0800 => {
            let ihl = usize::from(f.get(14)? & 0x0f) * 4;
            let frag = u16::from_be_bytes([*f.get(20)?, *f.get(21)?]) & 0x3fff;
            (ihl >= 20 && *f.get(23)? == 17 && frag == 0 && f.len() >= 14 + ihl + 8)
                .then_some(14 + ihl)
        }
        0x86dd => (*f.get(20)? == 17 && f.len() >= 14 + 40 + 8).then_some(54),
        _ => None,
    }
}

/// The UDP length field, clamped to the bytes present.
fn udp_len(f: &[u8], udp: usize) -> usize {
    usize::from(u16::from_be_bytes([f[udp + 4], f[udp + 5]])).min(f.len() - udp)
}

fn fix_udp_checksum(f: &mut [u8], udp: usize, len: usize) {
    let old = u16::from_be_bytes([f[udp + 6], f[udp + 7]]);
    let v4 = f[12] == 0x08;
    if v4 && old == 0 {
        return; // IPv4 UDP without a checksum stays so.
    }
    f[udp + 6] = 0;
    f[udp + 7] = 0;
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            let hi = u32::from(c[0]) << 8;
            sum += hi | c.get(1).map_or(0, |&lo| u32::from(lo));
        }
    };
    if v4 {
        add(&f[26..34]);
    } else {
        add(&f[22..54]);
    }
    add(&[0, 17]);
    add(&(len as u32).to_be_bytes());
    add(&f[udp..udp + len]);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let mut c = !(sum as u16);
    if c == 0 {
        c = 0xffff;
    }
    f[udp + 6..udp + 8].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4/UDP frame with a correct checksum (computed by `fix_udp_checksum` from a
    /// known-good reference: the sum over pseudo-header + datagram folds to 0xffff).
    fn frame() -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + 32];
        f[12] = 0x08;
        f[14] = 0x45;
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 99, 0, 1]);
        f[30..34].copy_from_slice(&[10, 99, 0, 2]);
        f[34..36].copy_from_slice(&0xc000u16.to_be_bytes());
        f[36..38].copy_from_slice(&4791u16.to_be_bytes());
        f[38..40].copy_from_slice(&40u16.to_be_bytes());
        f[40] = 1;
        for (i, b) in f[42..].iter_mut().enumerate() {
            *b = i as u8;
        }
        fix_udp_checksum(&mut f, 34, 40);
        f
    }

    fn verifies(f: &[u8]) -> bool {
        let mut sum: u32 = 0;
        let mut add = |b: &[u8]| {
            for c in b.chunks(2) {
                sum += u32::from(c[0]) << 8 | c.get(1).map_or(0, |&lo| u32::from(lo));
            }
        };
        add(&f[26..34]);
        add(&[0, 17, 0, 40]);
        add(&f[34..74]);
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum == 0xffff
    }

    #[test]
    fn corruption_flips_one_payload_bit_and_keeps_the_checksum_valid() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let good = frame();
        assert!(verifies(&good));
        for _ in 0..200 {
            let mut f = good.clone();
            corrupt_frame(&mut f, &mut rng);
            assert!(verifies(&f), "checksum recomputed");
            let flipped: u32 = f[42..]
                .iter()
                .zip(&good[42..])
                .map(|(a, b)| (a ^ b).count_ones())
                .sum();
            assert_eq!(flipped, 1, "exactly one payload bit");
            assert_eq!(f[..40], good[..40], "headers and addresses untouched");
        }
    }

    #[test]
    fn non_ip_frames_get_a_bit_after_the_mac_header() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let good = vec![0u8; 60];
        let mut f = good.clone();
        corrupt_frame(&mut f, &mut rng);
        assert_eq!(f[..14], good[..14]);
        let flipped: u32 = f.iter().map(|b| b.count_ones()).sum();
        assert_eq!(flipped, 1);
    }
}
