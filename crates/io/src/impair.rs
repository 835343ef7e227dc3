//! Fault injection on the way to the kernel: seeded random loss of the datagrams a sender
//! hands to its sockets, for recovery tests that run on one host without privileges.
//! Impairments of a link between two network namespaces (loss, delay, reordering,
//! duplication, corruption) are `softhca-testbed`'s.

use crate::Transmit;

/// Drops packets of outgoing transmits at random, `ppm` in a million, from a fixed seed
/// (xorshift64*): a GSO transmit is cut around a dropped segment so that the others
/// still leave.
#[derive(Debug, Clone)]
pub struct Impair {
    ppm: u32,
    rng: u64,
    /// The iovecs of the cut transmits that gather their bytes.
    iov: Vec<libc::iovec>,
}

// SAFETY: `iov` holds addresses copied from transmits, never dereferenced here; they are
// only handed back to the caller, inside the transmits it sends.
unsafe impl Send for Impair {}

/// One run of packets of a transmit that survives: transmit index, byte range, iovecs.
type Run = (usize, usize, usize, std::ops::Range<usize>);

impl Impair {
    /// Loss of `ppm` packets per million; `None` for 0.
    pub fn loss_ppm(ppm: u32) -> Option<Impair> {
        (ppm > 0).then(|| Impair {
            ppm,
            rng: 0x9E37_79B9_7F4A_7C15,
            iov: Vec::new(),
        })
    }

    /// Whether to drop the next packet.
    fn drop_next(&mut self) -> bool {
        let rng = &mut self.rng;
        *rng ^= *rng >> 12;
        *rng ^= *rng << 25;
        *rng ^= *rng >> 27;
        let r = rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 32) % 1_000_000 < u64::from(self.ppm)
    }

    /// The transmits of `list` less the packets dropped, in order, into `out` (each cut
    /// transmit keeps its destination and segment size); returns the packets dropped.
    /// `out[i]` is `list[from[i]]` or a part of it.
    pub fn apply<'a>(
        &'a mut self,
        list: &[Transmit<'a>],
        out: &mut impl Extend<(usize, Transmit<'a>)>,
    ) -> u64 {
        self.iov.clear();
        let mut runs: Vec<Run> = Vec::new();
        let mut dropped = 0;
        for (i, t) in list.iter().enumerate() {
            let len = t.byte_len();
            let seg = t.segment_size.unwrap_or(len).max(1);
            let (mut run_start, mut off) = (0, 0);
            while off < len {
                let end = (off + seg).min(len);
                if self.drop_next() {
                    dropped += 1;
                    if off > run_start {
                        runs.push(self.cut(i, t, run_start, off));
                    }
                    run_start = end;
                }
                off = end;
            }
            if run_start < len {
                runs.push(self.cut(i, t, run_start, len));
            }
        }
        let this: &'a Impair = self;
        out.extend(runs.into_iter().map(|(i, start, end, iov)| {
            let t = &list[i];
            let contents = if t.pieces.is_empty() {
                t.contents.get(start..end).unwrap_or_default()
            } else {
                t.contents
            };
            let part = Transmit {
                dst: t.dst,
                src_ip: t.src_ip,
                contents,
                pieces: this.iov.get(iov).unwrap_or_default(),
                segment_size: t.segment_size.filter(|&s| s < end - start),
                tos: t.tos,
            };
            (i, part)
        }));
        dropped
    }

    /// Bytes `start..end` of `t`: their iovecs (for a gathered transmit) are added.
    fn cut(&mut self, i: usize, t: &Transmit<'_>, start: usize, end: usize) -> Run {
        let first = self.iov.len();
        let (mut skip, mut left) = (start, end - start);
        for v in t.pieces {
            if left == 0 {
                break;
            }
            if skip >= v.iov_len {
                skip -= v.iov_len;
                continue;
            }
            let n = (v.iov_len - skip).min(left);
            self.iov.push(libc::iovec {
                iov_base: (v.iov_base as *mut u8).wrapping_add(skip) as *mut libc::c_void,
                iov_len: n,
            });
            left -= n;
            skip = 0;
        }
        (i, start, end, first..self.iov.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(contents: &[u8], seg: usize) -> Transmit<'_> {
        Transmit {
            dst: "127.0.0.1:4791".parse().unwrap(),
            src_ip: None,
            tos: 0,
            contents,
            pieces: &[],
            segment_size: Some(seg),
        }
    }

    #[test]
    fn none_dropped_at_zero_and_all_at_a_million() {
        assert!(Impair::loss_ppm(0).is_none());
        let bytes = [7u8; 100];
        let list = [plain(&bytes, 10)];
        let mut all = Impair::loss_ppm(1_000_000).unwrap();
        let mut out = Vec::new();
        assert_eq!(all.apply(&list, &mut out), 10);
        assert!(out.is_empty());
    }

    /// The surviving packets leave whole, in order, from the transmit they were in.
    #[test]
    fn cuts_keep_whole_packets_in_order() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let list = [plain(&bytes[..600], 100), plain(&bytes[600..], 100)];
        let mut imp = Impair::loss_ppm(300_000).unwrap();
        let mut out = Vec::new();
        let dropped = imp.apply(&list, &mut out);
        let kept: usize = out.iter().map(|(_, t)| t.byte_len()).sum();
        assert_eq!(kept + dropped as usize * 100, 1000);
        assert!(dropped > 0 && kept > 0, "seeded: some of each");
        for (i, t) in &out {
            assert_eq!(t.byte_len() % 100, 0);
            let at = t.contents.as_ptr() as usize - list[*i].contents.as_ptr() as usize;
            assert_eq!(at % 100, 0, "cut at a packet boundary");
        }
    }

    /// A gathered transmit is cut by its iovecs, at the same packet boundaries.
    #[test]
    fn gathered_transmits_are_cut_by_iovec() {
        let head = [1u8; 4];
        let body = [2u8; 6];
        let v = |b: &[u8]| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        };
        // Five 10-byte packets, each a head and a body.
        let iov: Vec<libc::iovec> = (0..5).flat_map(|_| [v(&head), v(&body)]).collect();
        let t = Transmit {
            pieces: &iov,
            ..plain(&head, 10)
        };
        let mut imp = Impair::loss_ppm(400_000).unwrap();
        let mut out = Vec::new();
        let dropped = imp.apply(std::slice::from_ref(&t), &mut out);
        let kept: usize = out.iter().map(|(_, t)| t.byte_len()).sum();
        assert_eq!(kept + dropped as usize * 10, 50);
        for (_, p) in &out {
            assert_eq!(p.pieces.len() % 2, 0, "whole packets: head and body each");
        }
    }
}
