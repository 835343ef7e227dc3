//! Bundling a step's transmits to one softhca peer into as few datagrams as the
//! interface MTU allows, whatever their packets' sizes (`softhca_wire::bundle`).
//!
//! Why: on loopback a datagram costs the sender's system call about as much as its
//! bytes (an skb through the IP stack, the loopback device and the receiver's socket).
//! GSO already sends a run of equal-sized packets as one; a burst of 8 KiB SENDs at MTU
//! 4096 (UCX's default fragment) is [4096, 4096, 64] per message, three packets the
//! kernel carried as one GSO datagram per message, and an ACK beside data took its own.
//!
//! Which transmits: every one of a batch from one device address to one peer that took
//! bundles in the multipath negotiation ([`softhca_transport::Engine::bundles_to`]), with
//! one IP TOS, when packing them makes fewer datagrams than sending them as they are (a
//! lone transmit leaves as it did, through a connected socket when it may; a run of full
//! 64 KiB GSO sends is left alone) and two of each packet fit a bundle (on a 1500-byte
//! link full packets gain nothing: GSO carries them in one send and cuts them later).
//! All or none of a peer's transmits, so their order holds. A bundled packet is sealed
//! with IPv4 ID 0, the rule the receiver checks it by (plain packets take the ID the
//! kernel writes).

use std::net::{IpAddr, SocketAddr};

use smallvec::SmallVec;
use softhca_io as sio;
use softhca_transport::{Transmit, TxPiece};
use softhca_wire::{bundle_header, BUNDLE_ENTRY_LEN, BUNDLE_HEADER_LEN};

use super::TX_BATCH;

/// The most iovecs one message may have (Linux `UIO_MAXIOV`).
const MAX_IOV: usize = 1024;
/// Iovecs per packet at most: its length, headers, external payload, tail.
const IOV_PER_PACKET: usize = 4;

/// How many bundles of at most `limit` bytes `packets` make, packed in order.
fn bundles_for<'a>(limit: usize, packets: impl Iterator<Item = &'a TxPiece>) -> usize {
    let mut n = 0;
    let mut bytes = limit;
    for p in packets {
        let need = BUNDLE_ENTRY_LEN + p.wire_len();
        if bytes + need > limit {
            n += 1;
            bytes = BUNDLE_HEADER_LEN;
        }
        bytes += need;
    }
    n
}

/// The bundles of one step, and what they are made of.
pub(super) struct Bundler {
    /// Per device socket: the largest bundle it sends (UDP payload bytes); 0: none.
    limits: Vec<usize>,
    /// The device sockets send GSO datagrams (a transmit of equal packets is one).
    gso: bool,
    /// Per transmit of the step (`Stepper::tx`): the largest bundle it leaves in; 0: it
    /// leaves as it is.
    marked: SmallVec<[usize; TX_BATCH]>,
    header: [u8; BUNDLE_HEADER_LEN],
    /// Each bundled packet's length, as it goes on the wire (the iovecs point here:
    /// reserved before they are made, so it does not move while they live).
    lens: Vec<[u8; BUNDLE_ENTRY_LEN]>,
    /// Per bundle: its iovecs, destination and TOS.
    bundles: Vec<(Vec<libc::iovec>, SocketAddr, u8)>,
    /// How many of `bundles` this send uses.
    used: usize,
}

impl Bundler {
    /// `limits`: per device socket, the largest bundle (see `addr::bundle_limit`); `gso`:
    /// whether they send GSO datagrams.
    pub(super) fn new(limits: Vec<usize>, gso: bool) -> Bundler {
        Bundler {
            limits,
            gso,
            marked: SmallVec::new(),
            header: bundle_header(),
            lens: Vec::new(),
            bundles: Vec::new(),
            used: 0,
        }
    }

    /// Whether transmit `k` of the step leaves in a bundle (after [`Bundler::plan`]).
    pub(super) fn marked(&self, k: usize) -> bool {
        self.marked.get(k).is_some_and(|&l| l > 0)
    }

    /// Decides which of `tx` leave in bundles. `takes`: the largest bundle a peer takes;
    /// `own_port`: whether a transmit leaves from a socket of its own (multipath's extra
    /// source ports), never bundled.
    pub(super) fn plan(
        &mut self,
        tx: &[(usize, Transmit)],
        pieces: &[Vec<TxPiece>],
        local_ips: &[IpAddr],
        takes: impl Fn(SocketAddr) -> usize,
        own_port: impl Fn(&Transmit) -> bool,
    ) {
        self.marked.clear();
        self.marked.resize(tx.len(), 0);
        if tx.len() < 2 || self.limits.iter().all(|&l| l == 0) {
            return;
        }
        let key = |t: &Transmit| (t.src, t.dst, t.tos);
        for k in 0..tx.len() {
            let (_, t) = &tx[k];
            if self.marked[k] > 0 || tx[..k].iter().any(|(_, u)| key(u) == key(t)) {
                continue; // decided with the first of its peer's transmits
            }
            let ours = local_ips
                .iter()
                .position(|ip| *ip == t.src)
                .and_then(|si| self.limits.get(si).copied())
                .unwrap_or(0);
            let limit = if ours > 0 { ours.min(takes(t.dst)) } else { 0 };
            let fits = |(b, u): &(usize, Transmit)| {
                !own_port(u)
                    && pieces[*b].len() == u.packets()
                    && pieces[*b]
                        .iter()
                        .all(|p| BUNDLE_HEADER_LEN + 2 * (BUNDLE_ENTRY_LEN + p.wire_len()) <= limit)
            };
            let group = || {
                tx.iter()
                    .enumerate()
                    .skip(k)
                    .filter(|(_, e)| key(&e.1) == key(t))
            };
            // Only where bundles make fewer datagrams than plain sends (a run of full GSO
            // sends, 64 KiB writes, would each become a bundle of the same size).
            let plain: usize = group()
                .map(|(_, (_, u))| if self.gso { 1 } else { u.packets() })
                .sum();
            let bundle = limit > 0
                && plain >= 2
                && group().all(|(_, e)| fits(e))
                && bundles_for(limit, group().flat_map(|(_, (b, _))| &pieces[*b])) < plain;
            if bundle {
                for (j, _) in group() {
                    self.marked[j] = limit;
                }
            }
        }
    }

    /// Packs the marked transmits `order` (one device socket's, in send order) into
    /// bundles, packets in order, each as full as its peer's limit allows; returns them
    /// to send.
    pub(super) fn build<'a>(
        &'a mut self,
        order: &[usize],
        tx: &[(usize, Transmit)],
        bufs: &'a [Box<[u8]>],
        pieces: &[Vec<TxPiece>],
    ) -> SmallVec<[sio::Transmit<'a>; TX_BATCH]> {
        let total: usize = order.iter().map(|&k| pieces[tx[k].0].len()).sum();
        self.lens.clear();
        self.lens.reserve(total);
        self.used = 0;
        // Bytes in the open bundle (the last of `bundles[..used]`).
        let mut bytes = 0;
        for &k in order {
            let (b, t) = tx[k];
            let limit = self.marked.get(k).copied().unwrap_or(0);
            for p in &pieces[b] {
                let len = p.wire_len();
                let room = self.current().is_some_and(|(iov, dst, tos)| {
                    (*dst, *tos) == (t.dst, t.tos)
                        && bytes + BUNDLE_ENTRY_LEN + len <= limit
                        && iov.len() + IOV_PER_PACKET <= MAX_IOV
                });
                if !room {
                    self.open_bundle(t.dst, t.tos);
                    bytes = BUNDLE_HEADER_LEN;
                }
                bytes += BUNDLE_ENTRY_LEN + len;
                self.push_packet(&bufs[b], p, len);
            }
        }
        self.bundles[..self.used]
            .iter()
            .map(|(iov, dst, tos)| sio::Transmit {
                dst: *dst,
                src_ip: None,
                tos: *tos,
                contents: &[],
                pieces: iov,
                segment_size: None,
            })
            .collect()
    }

    /// The open bundle: its iovecs, destination and TOS.
    fn current(&self) -> Option<&(Vec<libc::iovec>, SocketAddr, u8)> {
        self.bundles[..self.used].last()
    }

    fn open_bundle(&mut self, dst: SocketAddr, tos: u8) {
        if self.used == self.bundles.len() {
            self.bundles.push((Vec::with_capacity(64), dst, tos));
        }
        let (iov, d, t) = &mut self.bundles[self.used];
        iov.clear();
        (*d, *t) = (dst, tos);
        iov.push(libc::iovec {
            iov_base: self.header.as_ptr() as *mut libc::c_void,
            iov_len: BUNDLE_HEADER_LEN,
        });
        self.used += 1;
    }

    /// Appends packet `p` (of a transmit in `buf`) to the open bundle.
    fn push_packet(&mut self, buf: &[u8], p: &TxPiece, len: usize) {
        debug_assert!(self.lens.len() < self.lens.capacity());
        // At most 65507 bytes: every limit is below u16::MAX.
        self.lens.push((len as u16).to_be_bytes());
        let len_ptr = self.lens.last().map_or(std::ptr::null(), |l| l.as_ptr());
        let Some((iov, _, _)) = self.bundles[..self.used].last_mut() else {
            return;
        };
        let at = |off: usize, n: usize| libc::iovec {
            iov_base: buf.as_ptr().wrapping_add(off) as *mut libc::c_void,
            iov_len: n,
        };
        iov.push(libc::iovec {
            iov_base: len_ptr as *mut libc::c_void,
            iov_len: BUNDLE_ENTRY_LEN,
        });
        match p.external {
            // Headers and tail back to back in the buffer.
            None => iov.push(at(p.start, p.head + p.tail)),
            Some(e) => {
                iov.push(at(p.start, p.head));
                iov.push(libc::iovec {
                    iov_base: e.addr as *mut libc::c_void,
                    iov_len: e.len,
                });
                iov.push(at(p.start + p.head, p.tail));
            }
        }
    }
}
