//! Sending a step's transmits: their order, the socket each leaves through, their ICRC
//! (sealed here and nowhere else in softhca), their iovecs, and `sendmmsg`.
//!
//! The engine builds every transmit unsealed, because the ICRC covers the UDP source
//! port and the IPv4 ID (IBTA A17.4.1 masks neither), and both depend on the socket a
//! transmit leaves through, which is chosen here ([`super::senders`]). Each is sealed once
//! its socket is known, just before it is sent ([`Stepper::send`]). A payload left in
//! registered memory (zero-copy send) is read for its ICRC there, under the datapath lock
//! that deregistration waits for, as the kernel reads it in the same hold (see
//! [`external_bytes`]).

use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use softhca_io as sio;
use softhca_transport::{External, Transmit, TxPiece};

use super::schedule::DatapathShared;
use super::step::Stepper;
use super::{TX_BATCH, TX_BUF};
use crate::ring::EngineCompletion;
use crate::stats::Stats;

/// How long a full socket buffer may hold up a batch before its packets are dropped
/// (RoCE recovers them by retransmission).
const SEND_STALL_LIMIT: Duration = Duration::from_millis(200);

/// Seals the pieces of transmit `t` for UDP source port `sport`, piece `i` with IPv4 ID
/// `first_id + i` (as GSO numbers segments), or ID 0 each when `bundled` (see
/// [`super::bundle`]). False when a piece could not be sealed (the rest are left as they
/// are).
fn seal(
    t: &Transmit,
    buf: &mut [u8],
    pieces: &[TxPiece],
    (sport, first_id, bundled): (u16, u16, bool),
) -> bool {
    let step = u16::from(!bundled);
    pieces.iter().enumerate().all(|(i, p)| {
        let payload = p.external.as_ref().map_or(&[][..], external_bytes);
        t.seal(
            buf,
            p,
            payload,
            sport,
            first_id.wrapping_add(step.wrapping_mul(i as u16)),
        )
    })
}

/// The bytes of a payload the engine left in registered memory, read while the datapath
/// lock ([`DatapathShared::stepper`]) is held.
fn external_bytes(e: &External) -> &[u8] {
    // SAFETY: the engine checked `addr..addr + len` against a region registered when it
    // built the piece, in this hold of the datapath lock or in one that kept the
    // transmit back; deregistration takes that lock and sends what was kept back first
    // (`Context::with_core_no_transmit`), so the region is still registered here, as
    // the kernel relies on when it reads the same bytes through the iovecs. The
    // application writes them meanwhile only by breaking the verbs contract (a send
    // buffer is the application's again at its completion, after the send); the ICRC
    // then covers garbage, as a NIC's DMA would read.
    unsafe { std::slice::from_raw_parts(e.addr as *const u8, e.len) }
}

fn in_buffer(pieces: &[TxPiece]) -> bool {
    pieces.iter().all(|p| p.external.is_none())
}

impl Stepper {
    /// Sends the filled transmit buffers: per socket, the transmits in send order, each
    /// run of them that goes the same way (device socket, or one peer's connected
    /// socket) in one `sendmmsg` batch.
    pub(super) fn send(&mut self, shared: &DatapathShared) {
        let st = &shared.stats;
        Stats::add(&st.tx_batches, 1);
        Stats::add(&st.tx_transmits, self.tx.len() as u64);
        self.build_iovecs();
        for (si, sock) in shared.sockets.iter().enumerate() {
            self.send_from(shared, si, sock);
        }
        for (ip, port, sock) in &shared.sport_sockets {
            self.send_from_port(shared, (*ip, *port), sock);
        }
        let unmatched = self
            .tx
            .iter()
            .filter(|(_, t)| !self.local_ips.contains(&t.src))
            .count();
        if unmatched > 0 {
            tracing::debug!("{unmatched} transmits from an address this device does not serve");
            Stats::add(&st.tx_no_socket, unmatched as u64);
        }
        if self.after_send.is_empty() {
            return;
        }
        let mut core = shared.engine.lock();
        // Only RDMA WRITEs (UC's: RC completes at the ACK): what a memory-spinning peer
        // answers; a SEND's peer polls its receive CQ and answers with a SEND, which
        // this application polls for.
        let writes = |c: &EngineCompletion| c.1.opcode == softhca_transport::WcOpcode::RdmaWrite;
        if self.hold_sends && self.after_send.iter().all(writes) {
            let now = shared.now();
            core.hold_sends(&mut self.after_send, now + super::SERVE_HOLD_NS);
            core.deliver_holding(shared);
            drop(core);
            Stats::add(&st.tx_sends_held, 1);
            // Released by this application's next step that receives, or by whichever
            // step comes at the hold's end (the datapath thread's, if it stops polling).
            super::schedule::wake_by_hold_end(shared, now);
        } else {
            core.deliver_after(shared, &mut self.after_send);
        }
    }

    /// Sends the transmits from device socket `si`'s address: those of ACKs only last,
    /// the others first, each in its order (an ACK that leads its batch is picked up
    /// alone by a peer spinning on its socket, which finds the request it waits for only
    /// at its next `recvmmsg`; moving an ACK later is safe, as it is cumulative).
    fn send_from(&mut self, shared: &DatapathShared, si: usize, sock: &sio::RoceSocket) {
        let st = &shared.stats;
        let ip = self.local_ips[si];
        let mut order: SmallVec<[usize; TX_BATCH]> = SmallVec::new();
        let extra = |t: &Transmit| {
            shared
                .sport_sockets
                .iter()
                .any(|(a, p, _)| *a == t.src && *p == t.src_port)
        };
        order.extend(
            (0..self.tx.len()).filter(|&k| self.tx[k].1.src == ip && !extra(&self.tx[k].1)),
        );
        if order.is_empty() {
            return;
        }
        // Stable: each group keeps its order.
        order.sort_by_key(|&k| self.tx[k].1.only_acks);
        let via = self.route_and_seal(&order, st);
        let (order, via) = self.send_bundles(shared, sock, order, via);
        if order.is_empty() {
            return;
        }
        // Filled in place: collecting moved the whole inline array per send.
        let mut list: SmallVec<[sio::Transmit<'_>; TX_BATCH]> = SmallVec::new();
        let (bufs, iovs) = (&self.tx_bufs, &self.tx_iov);
        list.extend(order.iter().map(|&k| io_transmit(bufs, iovs, self.tx[k])));
        if let Some(impair) = self.impair.as_mut() {
            // No connected sockets under fault injection: everything takes `sock`.
            send_impaired(impair, shared, sock, &list);
            return;
        }
        let mut i = 0;
        while i < list.len() {
            let way = via[i];
            let run = via[i..].iter().take_while(|&&w| w == way).count();
            let part = &list[i..i + run];
            match way.and_then(|w| self.senders.socket(w).map(|s| (w, s))) {
                Some((w, s)) => {
                    let ok = send_all(shared, s, part);
                    self.senders.sent(w, ok, part.len(), st);
                }
                None => {
                    send_all(shared, sock, part);
                }
            }
            i += run;
        }
    }

    /// Sends the transmits of a multipath extra source port from its socket, in order,
    /// sealed for that port (no connected sockets: their ports are others). Injected
    /// loss (`SOFTHCA_TX_DROP`) applies here as on the device sockets.
    fn send_from_port(
        &mut self,
        shared: &DatapathShared,
        (ip, port): (IpAddr, u16),
        sock: &sio::RoceSocket,
    ) {
        let order: SmallVec<[usize; TX_BATCH]> = (0..self.tx.len())
            .filter(|&k| self.tx[k].1.src == ip && self.tx[k].1.src_port == port)
            .collect();
        if order.is_empty() {
            return;
        }
        for &k in &order {
            let (b, t) = self.tx[k];
            let (buf, pieces) = (&mut self.tx_bufs[b], &self.tx_pieces[b]);
            seal(&t, buf, pieces, (port, 0, false));
        }
        let (bufs, iovs) = (&self.tx_bufs, &self.tx_iov);
        let list: SmallVec<[sio::Transmit<'_>; TX_BATCH]> = order
            .iter()
            .map(|&k| io_transmit(bufs, iovs, self.tx[k]))
            .collect();
        match self.impair.as_mut() {
            Some(impair) => send_impaired(impair, shared, sock, &list),
            None => {
                send_all(shared, sock, &list);
            }
        }
    }

    /// Sends the bundled transmits of `order` (see [`super::bundle`]) from `sock`;
    /// returns the others with their ways.
    fn send_bundles(
        &mut self,
        shared: &DatapathShared,
        sock: &sio::RoceSocket,
        order: SmallVec<[usize; TX_BATCH]>,
        via: SmallVec<[Option<usize>; TX_BATCH]>,
    ) -> (
        SmallVec<[usize; TX_BATCH]>,
        SmallVec<[Option<usize>; TX_BATCH]>,
    ) {
        if !order.iter().any(|&k| self.bundler.marked(k)) {
            return (order, via);
        }
        let (bundled, rest): (SmallVec<[usize; TX_BATCH]>, SmallVec<[usize; TX_BATCH]>) =
            order.iter().copied().partition(|&k| self.bundler.marked(k));
        let via = order
            .iter()
            .zip(via)
            .filter(|(k, _)| !self.bundler.marked(**k))
            .map(|(_, w)| w)
            .collect();
        let list = self
            .bundler
            .build(&bundled, &self.tx, &self.tx_bufs, &self.tx_pieces);
        let st = &shared.stats;
        Stats::add(&st.tx_bundles, list.len() as u64);
        Stats::add(&st.tx_bundled_transmits, bundled.len() as u64);
        send_all(shared, sock, &list);
        (rest, via)
    }

    /// The way each transmit of `order` leaves, in send order (the slot of a connected
    /// socket, or None: the device socket), its packets sealed for it.
    fn route_and_seal(
        &mut self,
        order: &[usize],
        st: &Stats,
    ) -> SmallVec<[Option<usize>; TX_BATCH]> {
        let mut via = SmallVec::new();
        for &k in order {
            let (b, t) = self.tx[k];
            let (buf, pieces) = (&mut self.tx_bufs[b], &self.tx_pieces[b]);
            if self.bundler.marked(k) {
                seal(&t, buf, pieces, (t.src_port, 0, true));
                via.push(None);
                continue;
            }
            let way = self.senders.way(&t, st);
            let slot = match way {
                Some(w) if seal(&t, buf, pieces, (w.sport, w.first_id, false)) => {
                    self.senders.planned(&w);
                    Some(w.slot)
                }
                _ => {
                    if !seal(&t, buf, pieces, (t.src_port, 0, false)) {
                        tracing::debug!("a transmit could not be sealed; its peer drops it");
                    }
                    None
                }
            };
            via.push(slot);
        }
        via
    }

    /// The iovecs of each gathered transmit (one with a payload left in registered
    /// memory): per packet its headers, its payload, its pad and ICRC.
    fn build_iovecs(&mut self) {
        for (k, &(b, _)) in self.tx.iter().enumerate() {
            let iov = &mut self.tx_iov[b];
            iov.clear();
            let pieces = &self.tx_pieces[b];
            // All in the buffer, back to back: sent as plain bytes; or in a bundle, which
            // makes its own iovecs.
            if in_buffer(pieces) || self.bundler.marked(k) {
                continue;
            }
            let buf = self.tx_bufs[b].as_ptr();
            for p in pieces {
                iov.push(libc::iovec {
                    iov_base: buf.wrapping_add(p.start) as *mut libc::c_void,
                    iov_len: p.head,
                });
                if let Some(e) = p.external {
                    iov.push(libc::iovec {
                        iov_base: e.addr as *mut libc::c_void,
                        iov_len: e.len,
                    });
                }
                iov.push(libc::iovec {
                    iov_base: buf.wrapping_add(p.start + p.head) as *mut libc::c_void,
                    iov_len: p.tail,
                });
            }
        }
    }
}

/// Transmit `t`, in buffer `b`, as the socket layer sends it.
fn io_transmit<'a>(
    bufs: &'a [Box<[u8]>],
    iovs: &'a [Vec<libc::iovec>],
    (b, t): (usize, Transmit),
) -> sio::Transmit<'a> {
    sio::Transmit {
        dst: t.dst,
        src_ip: None,
        tos: t.tos,
        // For a gathered transmit `pieces` has the bytes (`contents` is the buffer,
        // which starts with its first packet's header all the same).
        contents: &bufs[b][..t.len.min(TX_BUF)],
        pieces: &iovs[b],
        segment_size: (t.segment_size > 0 && t.segment_size < t.len).then_some(t.segment_size),
    }
}

/// Sends `list` from `sock`, less the packets the fault injection drops (counted).
fn send_impaired<'a>(
    impair: &'a mut sio::Impair,
    shared: &DatapathShared,
    sock: &sio::RoceSocket,
    list: &[sio::Transmit<'a>],
) {
    let mut kept: SmallVec<[(usize, sio::Transmit<'a>); TX_BATCH]> = SmallVec::new();
    Stats::add(
        &shared.stats.tx_injected_drops,
        impair.apply(list, &mut kept),
    );
    let kept: SmallVec<[sio::Transmit<'a>; TX_BATCH]> = kept.into_iter().map(|(_, t)| t).collect();
    send_all(shared, sock, &kept);
}

/// Hands `list` to the kernel on `sock`, waiting while the socket buffer is full, dropping
/// a transmit the kernel refuses (for RoCE that is a lost packet); returns whether every
/// transmit went (false: some were dropped after an error or a long stall).
fn send_all(shared: &DatapathShared, sock: &sio::RoceSocket, list: &[sio::Transmit<'_>]) -> bool {
    let mut all = true;
    let mut off = 0;
    let mut stalled: Option<Instant> = None;
    // The position whose send reported an earlier datagram's ICMP error.
    let mut refused_at = None;
    while off < list.len() {
        let skipped = match sock.send(&list[off..]) {
            Ok(0) => wait_writable(shared, sock, &mut stalled, list.len() - off),
            Ok(n) => {
                off += n;
                stalled = None;
                0
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_writable(shared, sock, &mut stalled, list.len() - off)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            // A connected socket reports an ICMP error about an earlier datagram (port
            // unreachable: a peer not up yet; host unreachable: no ARP answer) at its next
            // send, which it refuses without sending (`sock_alloc_send_pskb` takes
            // `sk_err`): that datagram goes again, once.
            Err(e) if is_async_icmp_error(&e) && refused_at.replace(off) != Some(off) => {
                Stats::add(&shared.stats.tx_refused, 1);
                0
            }
            Err(e) => {
                tracing::debug!("send to {} failed: {e}; dropped", list[off].dst);
                Stats::add(&shared.stats.tx_errors, 1);
                1
            }
        };
        off += skipped;
        all &= skipped == 0;
    }
    all
}

/// The errors an ICMP message leaves on a connected UDP socket (`icmp_err_convert`).
fn is_async_icmp_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH)
    )
}

/// Waits for the socket to drain; returns how many transmits to skip (all of them once
/// the stall has lasted too long, or the device is closing).
fn wait_writable(
    shared: &DatapathShared,
    sock: &sio::RoceSocket,
    stalled: &mut Option<Instant>,
    left: usize,
) -> usize {
    Stats::add(&shared.stats.tx_would_block, 1);
    let since = *stalled.get_or_insert_with(Instant::now);
    if since.elapsed() > SEND_STALL_LIMIT || shared.stop.load(Ordering::Relaxed) {
        Stats::add(&shared.stats.tx_errors, left as u64);
        return left;
    }
    let _ = crate::sys::poll_fd(
        sock.as_raw_fd(),
        libc::POLLOUT,
        Some(Duration::from_millis(1)),
    );
    0
}
