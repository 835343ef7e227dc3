//! The datapath: sockets ↔ engine, one batch at a time.
//!
//! One step: receive a batch from every socket (no engine lock held) → lock the engine
//! once → feed every datagram (GRO datagrams split into their segments) → run expired
//! timers → move completions and events out → fill the transmit buffers → unlock →
//! send the batch. Nothing is allocated, locked or system-called per packet.
//!
//! Who runs a step: the application thread itself whenever it polls an empty CQ
//! ([`Shared::progress_inline`], run to completion: no hand-off, no wake-up, the way
//! user-space NIC drivers progress in `poll_cq`), or the device's datapath thread when
//! no application thread is polling (timers, blocked or busy applications). On a 2-core
//! machine every hand-off between threads costs more than the packet work itself: with
//! the datapath thread alone in the loop, most of a 64 KiB transfer's time went to
//! wake-ups and context switches. While the application polls,
//! the datapath thread sleeps on its doorbell only, not on the sockets, so arriving
//! packets do not wake it for nothing.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use softhca_io::{self as sio, Events, Poller, RecvBatch, RoceSocket};
use softhca_transport::{DatagramInfo, Transmit, TxPiece};

use crate::config::PollMode;
use crate::context::{Core, EngineCompletion, Shared, Stats};
use crate::error::Error;
use crate::senders::Senders;
use crate::strand::StrandPolicy;
use crate::{CqId, Nanos};

/// BTH opcode of an RC ACKNOWLEDGE (ACK or NAK), IBTA 9.2 table 38.
const ACKNOWLEDGE: u8 = 0x11;
/// Datagrams per `recvmmsg` per socket.
const RECV_BATCH: usize = 32;
/// Transmit buffers filled per lock hold.
const TX_BATCH: usize = 16;
/// Bytes per transmit buffer: one full GSO super-datagram (64 KiB less IP/UDP headers).
const TX_BUF: usize = 65_507;
/// Token of the doorbell in the poller (sockets use their index).
const DOORBELL: u64 = u64::MAX;
/// How long a full socket buffer may hold up a batch before its packets are dropped
/// (RoCE recovers them by retransmission).
const SEND_STALL_LIMIT: Duration = Duration::from_millis(200);
/// After an application thread progressed the datapath, the datapath thread leaves the
/// sockets to it for this long. An application that stops polling without saying so
/// (no `req_notify`, no blocking wait) delays its traffic by at most this much, and one
/// that keeps doing it gets no windows for a while (`crate::strand`).
pub(crate) const APP_WINDOW_NS: u64 = 2_000_000;
/// The scheduler slice the datapath thread asks for (Linux's shortest is 100 µs).
const DP_SLICE_NS: u64 = 100_000;
/// Inline steps per poll when each one fills every transmit buffer.
pub(crate) const INLINE_STEPS: usize = 4;

/// How a step feeds the datagrams it received.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Feed {
    /// The CQ the application thread running the step polls, when it may be handed its
    /// completions before the trailing ACKs of the same datagram are fed (see
    /// [`Progress::step`]).
    answers_on: Option<CqId>,
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Step {
    /// Packets received or sent.
    pub active: bool,
    /// Every transmit buffer was filled: there may be more to send right away.
    pub more_tx: bool,
    /// Datagrams were received.
    pub received: bool,
}

/// The preallocated buffers of a step; behind `Shared::progress`, so whichever thread
/// holds that lock runs the datapath.
pub(crate) struct Progress {
    rx: Vec<RecvBatch>,
    rx_count: Vec<usize>,
    /// With several sockets: their pollfds, to receive only where there is something
    /// (see [`Progress::receive`]); empty with one socket.
    readiness: Vec<libc::pollfd>,
    local_ips: Vec<IpAddr>,
    tx_bufs: Vec<Box<[u8]>>,
    /// Per transmit buffer: where its packets' bytes are (zero-copy send: payloads stay
    /// in registered memory, see `Engine::poll_transmit_gather`).
    tx_pieces: Vec<Vec<TxPiece>>,
    /// Per transmit buffer: the iovecs of a gathered transmit, rebuilt at each send.
    tx_iov: Vec<Vec<libc::iovec>>,
    /// Build transmits zero-copy (off under fault injection, which cuts transmits by
    /// bytes).
    zero_copy: bool,
    tx: Vec<(usize, Transmit)>,
    /// Completions made while building `tx` (a UC or UD send completes when its last
    /// packet is built), delivered once `tx` has been handed to the kernel: their
    /// payloads may still be in registered memory (zero-copy), and an application that
    /// sees the completion may write the buffer again. Kept here, out of the engine, so
    /// that no other thread delivers them early.
    after_send: Vec<EngineCompletion>,
    /// An application thread's step completed work and left the ACKs it owes in the
    /// engine for that thread's next call (see [`Progress::step`]).
    held: bool,
    /// The last transmit of an application's post, kept back for its next call to fill
    /// up: its buffer index and the Transmit (see [`Progress::defer_tail`]).
    deferred: Option<(usize, Transmit)>,
    /// The last call was an application's post, not a step: posts come in a burst.
    burst: bool,
    /// Where the last step stopped feeding its received datagrams (socket, datagram,
    /// segment): trailing ACKs it left for the next step (see [`Progress::step`]). The
    /// receive buffers and counts stay as they are until then.
    rx_resume: Option<(usize, usize, usize)>,
    /// Sockets connected to peers, for transmits built in the buffer (see `senders`).
    senders: Senders,
    /// Fault injection: drop probability per packet (ppm) and its xorshift state.
    drop_ppm: u32,
    drop_rng: u64,
}

// SAFETY: the raw pointers in `tx_iov` name `tx_bufs` (owned here) and registered
// memory that deregistration keeps alive while this struct's lock is held (see
// `Context::with_core_no_transmit`); they are rebuilt before each send and only read by
// the kernel during that send, by the thread holding the lock.
unsafe impl Send for Progress {}

impl Progress {
    pub(crate) fn new(
        sockets: &[RoceSocket],
        drop_ppm: u32,
        connected: bool,
        sockbuf: usize,
    ) -> Progress {
        // Fault injection cuts transmits apart after they are sealed: it keeps the
        // device sockets, whose seal does not depend on what was sent before.
        let gso = sockets.iter().all(|s| s.capabilities().gso);
        let senders = Senders::new(connected && drop_ppm == 0, gso, sockbuf);
        Progress {
            rx: sockets
                .iter()
                .map(|s| RecvBatch::for_socket(s, RECV_BATCH))
                .collect(),
            rx_count: vec![0; sockets.len()],
            readiness: if sockets.len() > 1 {
                sockets
                    .iter()
                    .map(|s| libc::pollfd {
                        fd: s.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect()
            } else {
                Vec::new()
            },
            local_ips: sockets.iter().map(|s| s.local_addr().ip()).collect(),
            tx_bufs: (0..TX_BATCH)
                .map(|_| vec![0u8; TX_BUF].into_boxed_slice())
                .collect(),
            tx_pieces: (0..TX_BATCH).map(|_| Vec::with_capacity(64)).collect(),
            tx_iov: (0..TX_BATCH).map(|_| Vec::with_capacity(3 * 64)).collect(),
            zero_copy: drop_ppm == 0,
            tx: Vec::with_capacity(TX_BATCH),
            after_send: Vec::new(),
            held: false,
            deferred: None,
            burst: false,
            rx_resume: None,
            senders,
            drop_ppm,
            drop_rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// Fault injection: whether to drop the next packet (xorshift64*).
    fn inject_drop(rng: &mut u64, ppm: u32) -> bool {
        *rng ^= *rng >> 12;
        *rng ^= *rng << 25;
        *rng ^= *rng >> 27;
        let r = rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 32) % 1_000_000 < u64::from(ppm)
    }

    /// The doorbell half of a step, for a thread that just posted work: no receive, the
    /// engine builds what is ready and it goes out now (as a NIC starts sending at its
    /// doorbell). Returns whether every transmit buffer was filled (more to send).
    pub(crate) fn transmit(&mut self, shared: &Shared) -> bool {
        self.transmit_with(shared, false, |_, _| ()).1
    }

    /// [`Progress::transmit`] after posting with `post` in the same engine lock hold (one
    /// lock, one clock read and one completion pass per post instead of two). `app`: the
    /// caller is an application posting; while it polls (its window is open) it will
    /// call again soon, and the last transmit of a burst may wait for that call (see
    /// [`Progress::defer_tail`]).
    pub(crate) fn transmit_with<R>(
        &mut self,
        shared: &Shared,
        app: bool,
        post: impl FnOnce(&mut Core, Nanos) -> R,
    ) -> (R, bool) {
        shared.pending.store(false, Ordering::SeqCst);
        let now = shared.now();
        let defer = app && now < shared.app_active_until.load(Ordering::Relaxed);
        let mut core = shared.core.lock();
        let r = post(&mut core, now);
        let (ntx, deadline) = self.process_locked(core, shared, now, None, false, defer);
        self.burst = defer;
        shared
            .deadline
            .store(deadline.unwrap_or(Nanos::MAX), Ordering::Relaxed);
        if self.deferred.is_some() {
            Stats::add(&shared.stats.tx_deferred, 1);
            wake_by_window_end(shared, now);
        }
        if !self.tx.is_empty() {
            match &shared.turnaround {
                None => self.send(shared),
                Some(timer) => {
                    let sending = shared.now();
                    self.send(shared);
                    timer.sent(now, sending, shared.now());
                }
            }
        }
        (r, ntx == TX_BATCH)
    }

    /// One step. `force` runs the engine even with nothing received and nothing
    /// pending (the last step left transmits behind).
    ///
    /// `polled`: the caller is an application thread polling this CQ. When this step
    /// completes work and has nothing but ACKs to send (typically the ACK of the request
    /// just completed), they stay in the engine, unbuilt, for that thread's next call:
    /// an application that answers a completion (ping-pong, RPC) posts at once, and the
    /// ACK leaves with its answer, as the last segment of the same GSO send (see
    /// `Qp::plan`): one datagram for the kernel to carry instead of two, and one
    /// `recvmmsg` at the peer. Held ACKs go out at the next post or poll of any thread,
    /// when the application blocks (`app_will_block` wakes the datapath thread), or
    /// when its polling window ends, and are never held twice: a held ACK is late by one
    /// poll cycle at most (two when the next step only feeds the ACKs this one left, see
    /// below).
    ///
    /// Such a step also leaves the trailing ACKs of the last datagram it received for
    /// the next step, when the packets before them made a completion on the polled CQ
    /// and the ACKs complete sends on another CQ: an answer arrives with the ACK of the
    /// request it answers as the last segment of one GSO datagram (see above), and the
    /// application, which polls for the answer, gets it without waiting for the ACK to
    /// be parsed, checked and applied (about a third of the engine's work for an 8 B
    /// SEND ping-pong). The next step (the application's next poll, after it answered,
    /// or the datapath thread's at the end of the polling window) feeds them before it
    /// receives anything new. An application that polls the send CQ (perftest's
    /// `ib_send_lat` waits there for each send) or one CQ for both gets the ACK in the
    /// same step: it waits for what the ACK completes.
    pub(crate) fn step(&mut self, shared: &Shared, force: bool, polled: Option<CqId>) -> Step {
        let may_hold = polled.is_some();
        let resume = self.rx_resume.is_some();
        let rx = if resume { 0 } else { self.receive(shared) };
        let now = shared.now();
        if let (true, Some(timer)) = (rx > 0, &shared.turnaround) {
            timer.received(now);
        }
        self.burst = false;
        let mut may_hold = may_hold;
        if may_hold {
            // An application thread polls: the datapath thread leaves the sockets to it
            // for a while (see `Shared::app_polling`), unless the application is known
            // not to poll for what it waits for; then nothing is held for its next call
            // either.
            let window = shared.app_window(now);
            shared
                .app_active_until
                .store(now + window, Ordering::Relaxed);
            may_hold = window > 0;
        }
        let pending = shared.pending.swap(false, Ordering::SeqCst);
        let due = shared.deadline.load(Ordering::Relaxed) <= now;
        let was_held = self.held || self.deferred.is_some();
        let mut step = Step {
            active: rx > 0 || resume,
            received: rx > 0,
            ..Step::default()
        };
        if rx > 0 || resume || pending || due || force || was_held {
            let core = shared.core.lock();
            // A step that only feeds the ACKs the last one left keeps what that one
            // held: it is not the application's next call (`ib_send_lat` polls its send
            // CQ right after the answer came, for the send the ACK completes; a held ACK
            // sent alone there cost a `sendmmsg` and the peer a datagram per round trip).
            let keep = resume && self.held && self.deferred.is_none();
            let hold = may_hold && (!was_held || keep);
            let feed = Feed {
                // Never twice for one datagram.
                answers_on: polled.filter(|_| hold && !resume),
            };
            let (ntx, deadline) = self.process_locked(core, shared, now, Some(feed), hold, false);
            shared
                .deadline
                .store(deadline.unwrap_or(Nanos::MAX), Ordering::Relaxed);
            step.more_tx = ntx == TX_BATCH;
            let left = self.rx_resume.is_some();
            if left {
                Stats::add(&shared.stats.rx_acks_deferred, 1);
            }
            if self.held && !keep {
                Stats::add(&shared.stats.tx_held, 1);
            }
            // Something waits for this application's next call: the datapath thread
            // takes it over at the end of the polling window if that call never comes.
            if left || (self.held && !keep) {
                wake_by_window_end(shared, now);
            }
            if self.held {
                step.active = true;
            } else if !self.tx.is_empty() {
                step.active = true;
                self.send(shared);
            }
        }
        step
    }

    /// Sends what a step held for the application's answer (before a QP or the device
    /// goes away: the peer must still get the ACKs of what completed here).
    pub(crate) fn flush_held(&mut self, shared: &Shared) {
        if self.held || self.deferred.is_some() {
            self.transmit(shared);
        }
    }

    /// One `recvmmsg` per socket that has datagrams; returns the number received.
    ///
    /// With several sockets (a default device serves every interface address and a
    /// loopback one), one `poll(2)` with zero timeout says which: an empty poll, the
    /// common call of a polling application, is then one system call instead of one
    /// per socket (with three sockets, bulk receive and small-message latency through
    /// the default configuration paid two empty `recvmmsg` per step). Not an epoll
    /// set: its registration runs a callback for every datagram received, in the
    /// sender's system call on loopback (see `Datapath::watching_sockets`).
    fn receive(&mut self, shared: &Shared) -> usize {
        let mut ready = u64::MAX;
        if !self.readiness.is_empty() && crate::sys::ready_now(&mut self.readiness) {
            ready = self
                .readiness
                .iter()
                .enumerate()
                .filter(|(i, p)| *i < 64 && p.revents != 0)
                .fold(0, |m, (i, _)| m | 1 << i);
        }
        let mut total = 0;
        for (i, s) in shared.sockets.iter().enumerate() {
            if i < 64 && ready & 1 << i == 0 {
                self.rx_count[i] = 0;
                continue;
            }
            self.rx_count[i] = match s.recv(&mut self.rx[i]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => {
                    // e.g. ICMP port unreachable reported on the socket: nothing to do.
                    tracing::trace!("recv on {}: {e}", s.local_addr());
                    Stats::add(&shared.stats.rx_errors, 1);
                    0
                }
            };
            total += self.rx_count[i];
        }
        total
    }

    /// Under the engine lock (released on return): feed, time, deliver, fill transmits.
    /// Returns the number of filled transmit buffers and the next deadline. With
    /// `may_hold`, a step that completed work and has only ACKs to send leaves them in
    /// the engine (sets `held`, see [`Progress::step`]).
    fn process_locked(
        &mut self,
        mut core: parking_lot::MutexGuard<'_, Core>,
        shared: &Shared,
        now: Nanos,
        rx: Option<Feed>,
        may_hold: bool,
        may_defer: bool,
    ) -> (usize, Option<Nanos>) {
        let (mut datagrams, mut packets, mut gro, mut truncated) = (0u64, 0u64, 0u64, 0u64);
        // Received datagrams are fed by steps only (a post leaves them to the next step),
        // from where the last step stopped if it left trailing ACKs.
        let start = if rx.is_some() {
            self.rx_resume.take()
        } else {
            None
        };
        let answers_on = rx.and_then(|f| f.answers_on);
        let (first_socket, first_datagram, first_segment) = start.unwrap_or_default();
        // The last datagram received: the only one whose trailing ACKs may wait.
        let last = (0..self.rx.len())
            .rev()
            .find(|&i| self.rx_count[i].min(self.rx[i].len()) > 0)
            .map(|i| (i, self.rx_count[i].min(self.rx[i].len()) - 1));
        let sockets = if rx.is_some() { self.rx.len() } else { 0 };
        'feed: for i in first_socket..sockets {
            let batch = &self.rx[i];
            let n = self.rx_count[i].min(batch.len());
            let from = if i == first_socket { first_datagram } else { 0 };
            for k in from..n {
                let (meta, buf) = batch.get(k);
                let skip = if start.is_some() && (i, k) == (first_socket, first_datagram) {
                    first_segment
                } else {
                    0
                };
                if skip == 0 {
                    datagrams += 1;
                    if meta.truncated {
                        truncated += 1;
                        continue;
                    }
                    if meta.stride < meta.len {
                        gro += 1;
                    }
                }
                let dst = meta.dst_ip.unwrap_or(self.local_ips[i]);
                // Where the run of ACKs that ends the last datagram starts: only from there
                // on may the rest wait (found once: asking at every segment whether all
                // after it are ACKs walked a 64-segment datagram 2000 times).
                let acks_from = match answers_on.filter(|_| Some((i, k)) == last) {
                    Some(_) => sio::segments(&meta, buf)
                        .enumerate()
                        .filter(|(_, s)| s.first() != Some(&ACKNOWLEDGE))
                        .last()
                        .map_or(0, |(j, _)| j + 1),
                    None => usize::MAX,
                };
                for (j, seg) in sio::segments(&meta, buf).enumerate().skip(skip) {
                    if let Some(cq) = answers_on.filter(|_| j > 0 && j >= acks_from) {
                        let engine = &core.engine;
                        // What the application polls for is here, and the ACKs after it
                        // complete nothing it polls for: they wait for the next step.
                        let wait = engine.has_completion_on(cq)
                            && sio::segments(&meta, buf)
                                .skip(j)
                                .all(|s| engine.send_cq_for(s) != Some(cq));
                        if wait {
                            self.rx_resume = Some((i, k, j));
                            break 'feed;
                        }
                    }
                    let info = DatagramInfo {
                        src: meta.src,
                        dst,
                        segment_index: j as u16,
                    };
                    core.engine.handle_datagram(now, &info, seg);
                    packets += 1;
                }
            }
        }
        if core.engine.poll_timeout().is_some_and(|d| d <= now) {
            core.engine.handle_timeout(now);
        }
        let completed = core.engine.has_completions();
        core.deliver(shared);
        self.tx.clear();
        // Held again by a step that feeds what the last one left (see `Progress::step`).
        let keep = self.held && start.is_some();
        self.held = may_hold && (completed || keep) && core.engine.only_acks_ready();
        let bufs = if self.held { 0 } else { TX_BATCH };
        // A transmit kept back by the last post goes first, filled up if it can be.
        let kept = if self.held {
            None
        } else {
            self.deferred.take()
        };
        if let Some((b, prev)) = kept {
            let t = core
                .engine
                .poll_transmit_append(now, &mut self.tx_bufs[b], &mut self.tx_pieces[b], &prev)
                .unwrap_or(prev);
            self.tx.push((b, t));
        }
        let taken = kept.map(|(b, _)| b);
        for (b, buf) in self.tx_bufs.iter_mut().enumerate().take(bufs) {
            if Some(b) == taken {
                continue;
            }
            let t = if self.zero_copy {
                core.engine
                    .poll_transmit_gather(now, buf, &mut self.tx_pieces[b])
            } else {
                self.tx_pieces[b].clear();
                core.engine.poll_transmit(now, buf)
            };
            match t {
                Some(t) => self.tx.push((b, t)),
                None => break,
            }
        }
        // Building packets completes work too (UC and UD sends): after the send.
        if self.tx.is_empty() {
            core.deliver(shared);
        } else {
            while let Some(c) = core.engine.poll_completion() {
                self.after_send.push(c);
            }
        }
        if may_defer && self.zero_copy && self.after_send.is_empty() {
            self.defer_tail();
        }
        let deadline = core.engine.poll_timeout();
        drop(core);
        let st = &shared.stats;
        if datagrams > 0 {
            Stats::add(&st.rx_batches, 1);
        }
        Stats::add(&st.rx_datagrams, datagrams);
        Stats::add(&st.rx_packets, packets);
        Stats::add(&st.rx_gro_datagrams, gro);
        Stats::add(&st.rx_truncated, truncated);
        (self.tx.len(), deadline)
    }

    /// Keeps the last transmit of this post back, for the application's next post to
    /// fill up ([`softhca_transport::Engine::poll_transmit_append`]), when it has room
    /// for more packets of its size and either
    /// - it is the short end of a large message: bulk packets (not the small ones
    ///   connected sockets carry) right after a full GSO send of the same size; or
    /// - the post is not the first of a burst (the call before it was a post too, no
    ///   poll in between): an application posting one WR per call, as perftest's
    ///   bandwidth tests do, then gets GSO sends of many messages, as one posting a list
    ///   does. A ping-pong application polls between its posts, so its messages never
    ///   wait.
    ///
    /// The application's next poll, a blocking wait, a teardown (`flush_held`) or the
    /// end of its polling window (the datapath thread) sends it as it is.
    ///
    /// Not when building completed work (UC and UD sends complete once their packets are
    /// with the kernel; the application may then write the buffer a kept-back packet
    /// still points into). An RC request completes only when acknowledged, after it left.
    ///
    /// Measured (perftest `ib_write_bw` through the drop-in library, one WR per post):
    /// at 64 KiB each message left as 15 packets and 1, 1.44 datagrams per message; at
    /// 4 KiB each message was one `sendmmsg` of one datagram.
    fn defer_tail(&mut self) {
        const MIN_SEGMENT: usize = 1024;
        // Every buffer filled: more is waiting to be built, and goes out now anyway.
        if self.tx.is_empty() || self.tx.len() >= TX_BATCH {
            return;
        }
        let Some(&(b, t)) = self.tx.last() else {
            return;
        };
        let seg = t.segment_size.max(1);
        // The transmit before it is a full GSO send of the same run (the same size to the
        // same peer, no room for one more packet): a message too large for one send, not
        // a message whose first packet went out with an ACK (ibv_rc_pingpong at MTU 1024:
        // [First, ACK] then [Middle, Middle, Last], which must not wait).
        let tail_of_large = seg >= MIN_SEGMENT && self.tx.len() >= 2 && {
            let prev = &self.tx[self.tx.len() - 2].1;
            prev.segment_size == seg && prev.dst == t.dst && prev.len + seg > TX_BUF
        };
        let appendable = (tail_of_large || self.burst)
            && t.len.is_multiple_of(seg)
            && t.len + seg <= TX_BUF
            && self.tx_pieces[b].len() == t.packets();
        if appendable {
            self.tx.pop();
            self.deferred = Some((b, t));
        }
    }

    /// Fault injection: drops packets of `list` at random, splitting a GSO transmit
    /// around a dropped segment so the others still leave.
    fn drop_some<'a>(
        rng: &mut u64,
        ppm: u32,
        list: SmallVec<[sio::Transmit<'a>; TX_BATCH]>,
        shared: &Shared,
    ) -> SmallVec<[sio::Transmit<'a>; TX_BATCH]> {
        let mut out = SmallVec::new();
        let mut dropped = 0u64;
        for t in list {
            let seg = t.segment_size.unwrap_or(t.contents.len()).max(1);
            let mut run_start = 0;
            let mut off = 0;
            while off < t.contents.len() {
                let end = (off + seg).min(t.contents.len());
                if Self::inject_drop(rng, ppm) {
                    dropped += 1;
                    if off > run_start {
                        out.push(Self::part(&t, &t.contents[run_start..off]));
                    }
                    run_start = end;
                }
                off = end;
            }
            if run_start < t.contents.len() {
                out.push(Self::part(&t, &t.contents[run_start..]));
            }
        }
        Stats::add(&shared.stats.tx_injected_drops, dropped);
        out
    }

    /// Segments `contents` of GSO transmit `t` (plain if one segment is left).
    fn part<'a>(t: &sio::Transmit<'a>, contents: &'a [u8]) -> sio::Transmit<'a> {
        sio::Transmit {
            dst: t.dst,
            src_ip: t.src_ip,
            contents,
            pieces: &[],
            segment_size: t.segment_size.filter(|&s| s < contents.len()),
        }
    }

    /// The iovecs of each gathered transmit (one with a payload left in registered
    /// memory): per packet its headers, its payload, its pad and ICRC.
    fn build_iovecs(&mut self) {
        for &(b, _) in &self.tx {
            let iov = &mut self.tx_iov[b];
            iov.clear();
            let pieces = &self.tx_pieces[b];
            if pieces.iter().all(|p| p.external.is_none()) {
                continue; // all in the buffer, back to back: sent as plain bytes
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

    /// Sends the filled transmit buffers: per socket, the transmits in send order, each
    /// run of them that goes the same way (device socket, or one peer's connected
    /// socket) in one `sendmmsg` batch.
    fn send(&mut self, shared: &Shared) {
        let st = &shared.stats;
        Stats::add(&st.tx_batches, 1);
        Stats::add(&st.tx_transmits, self.tx.len() as u64);
        self.build_iovecs();
        for (si, sock) in shared.sockets.iter().enumerate() {
            let ip = self.local_ips[si];
            // Transmits of ACKs only go last, the others first, each in its order (see
            // `only_acks`).
            let mut order: SmallVec<[usize; TX_BATCH]> = SmallVec::new();
            order.extend((0..self.tx.len()).filter(|&k| self.tx[k].1.src == ip));
            if order.len() > 1 {
                // Stable: each group keeps its order.
                let (bufs, pieces, tx) = (&self.tx_bufs, &self.tx_pieces, &self.tx);
                order.sort_by_key(|&k| only_acks(&bufs[tx[k].0], &pieces[tx[k].0], &tx[k].1));
            }
            // The way of each, in send order, and the seal of its packets built in the
            // buffer (the engine leaves them to us, `Engine::set_late_seal`): for their
            // peer's connected socket if wholly in the buffer, else for this device socket.
            let mut via: SmallVec<[Option<usize>; TX_BATCH]> = SmallVec::new();
            via.extend(order.iter().map(|&k| {
                let (b, t) = self.tx[k];
                let (buf, pieces) = (&mut self.tx_bufs[b], &self.tx_pieces[b]);
                let way = self.senders.route(&t, pieces, buf, st);
                if way.is_none() && self.zero_copy {
                    seal_for_device(&t, pieces, buf);
                }
                way
            }));
            let (bufs, iovs) = (&self.tx_bufs, &self.tx_iov);
            // Filled in place: collecting moved the whole inline array (1.6 KiB) per send.
            let mut list: SmallVec<[sio::Transmit<'_>; TX_BATCH]> = SmallVec::new();
            list.extend(order.iter().map(|&k| {
                let (b, t) = self.tx[k];
                sio::Transmit {
                    dst: t.dst,
                    src_ip: None,
                    // For a gathered transmit `pieces` has the bytes (`contents` is
                    // the buffer, which starts with its first packet's header all the
                    // same).
                    contents: &bufs[b][..t.len.min(TX_BUF)],
                    pieces: &iovs[b],
                    segment_size: (t.segment_size > 0 && t.segment_size < t.len)
                        .then_some(t.segment_size),
                }
            }));
            if self.drop_ppm > 0 {
                // (No connected sockets then: `via` is all None.)
                list = Self::drop_some(&mut self.drop_rng, self.drop_ppm, list, shared);
            }
            let mut i = 0;
            while i < list.len() {
                let way = via.get(i).copied().flatten();
                let run = list[i..]
                    .iter()
                    .enumerate()
                    .take_while(|(j, _)| via.get(i + j).copied().flatten() == way)
                    .count();
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
        let unmatched = self
            .tx
            .iter()
            .filter(|(_, t)| !self.local_ips.contains(&t.src))
            .count();
        if unmatched > 0 {
            tracing::debug!("{unmatched} transmits from an address this device does not serve");
            Stats::add(&st.tx_no_socket, unmatched as u64);
        }
        if !self.after_send.is_empty() {
            shared
                .core
                .lock()
                .deliver_after(shared, &mut self.after_send);
        }
    }
}

/// Seals the packets of `t` built in its buffer (`Engine::set_late_seal`) for the device
/// socket: its UDP port, and the IPv4 ID Linux gives a GSO segment of an unconnected
/// socket, its index in the send (a plain datagram is segment 0).
fn seal_for_device(t: &Transmit, pieces: &[TxPiece], buf: &mut [u8]) {
    for (i, p) in pieces.iter().enumerate() {
        if p.external.is_none() {
            t.seal(buf, p, t.src_port, i as u16);
        }
    }
}

/// Whether every packet of transmit `t` (in `buf`, laid out as `pieces` says when it was
/// built for a gathered send, else back to back) is an RC ACKNOWLEDGE (0x11, ACK or NAK).
///
/// Such transmits leave after the others of their batch. Why: an ACK held for the
/// application's next post (see [`Progress::step`]) would otherwise lead its batch, and
/// on loopback `sendmmsg` delivers the datagrams one by one: a peer spinning on its
/// socket then picks up the ACK alone, processes it, and only on its next `recvmmsg`
/// finds the request it is waiting for (measured: about a third of the 8 B SEND half
/// round trip). Moving an ACK later is always safe: it is cumulative (a later response
/// acknowledges everything before it, IBTA 9.7.5.1), and nothing else moves, so no
/// request stream and no READ or atomic response stream changes order. (Ordering by a
/// transmit's first opcode, as before, was not: a transmit led by a request can carry
/// an ACK, of the same QP or, since transmits span QPs, of another, and then went ahead
/// of READ responses built before that ACK.)
fn only_acks(buf: &[u8], pieces: &[TxPiece], t: &Transmit) -> bool {
    if pieces.is_empty() {
        let seg = t.segment_size.max(1);
        (0..t.len.min(buf.len()))
            .step_by(seg)
            .all(|o| buf[o] == ACKNOWLEDGE)
    } else {
        pieces
            .iter()
            .all(|p| buf.get(p.start) == Some(&ACKNOWLEDGE))
    }
}

/// A step held packets for the polling application: make sure the datapath thread wakes
/// by the end of the application's polling window, to send them if the application
/// goes quiet (no post, no poll, no blocking wait). Without this, a datapath thread
/// asleep in a long wait from before the application started polling slept on: our
/// `recvmmsg` had drained the sockets, so epoll never woke it, and the held ACK left
/// only when the peer's retransmission arrived (68 ms; test `held_ack.rs`).
///
/// Dekker with [`Datapath::sleep`]: the window is published with a read-modify-write
/// (SeqCst) before `sleeping` is read, and the thread sets `sleeping` before it reads
/// the window; so either it sees the window and sleeps only until its end, or we see
/// it asleep and ring. Runs once per held step, not per poll.
fn wake_by_window_end(shared: &Shared, now: Nanos) {
    let until = now + shared.app_window(now);
    shared.app_active_until.fetch_max(until, Ordering::SeqCst);
    if shared.sleeping.load(Ordering::SeqCst) && shared.thread_wake.load(Ordering::SeqCst) > until {
        Stats::add(&shared.stats.doorbells, 1);
        shared.doorbell.notify();
    }
}

/// The datapath thread's own state: its poller.
pub(crate) struct Datapath {
    shared: Arc<Shared>,
    /// The doorbell, and the sockets while `watching_sockets`.
    poller: Poller,
    /// The sockets are in `poller`. Not while an application thread progresses them
    /// itself: an epoll registration is a callback that runs for every datagram the
    /// socket receives, in the sender's system call on loopback, and nobody waits on
    /// it then (measured: 0.25 µs more per `sendmmsg` of an 8 B ping-pong step). Leaving
    /// and re-entering costs one `epoll_ctl` per socket each time the application starts
    /// or stops polling; the re-entry reports data already queued (epoll checks
    /// readiness when a file is added).
    watching_sockets: bool,
    events: Events,
}

impl Datapath {
    pub(crate) fn new(shared: Arc<Shared>) -> Result<Datapath, Error> {
        let poller = Poller::new()?;
        for (i, s) in shared.sockets.iter().enumerate() {
            poller.add(s.as_raw_fd(), i as u64)?;
        }
        poller.add(shared.doorbell.as_raw_fd(), DOORBELL)?;
        Ok(Datapath {
            poller,
            watching_sockets: true,
            events: Events::with_capacity(shared.sockets.len() + 1),
            shared,
        })
    }

    /// Puts the sockets into the poller, or takes them out (see `watching_sockets`).
    fn watch_sockets(&mut self, on: bool) {
        if on == self.watching_sockets {
            return;
        }
        for (i, s) in self.shared.sockets.iter().enumerate() {
            let r = if on {
                self.poller.add(s.as_raw_fd(), i as u64)
            } else {
                self.poller.delete(s.as_raw_fd())
            };
            if let Err(e) = r {
                // Only resource exhaustion makes epoll_ctl fail here; the sockets are
                // then polled when the doorbell or a deadline wakes the thread.
                tracing::warn!("datapath poller: {e}");
            }
        }
        self.watching_sockets = on;
    }

    pub(crate) fn run(mut self, cpu: Option<usize>) {
        if let Some(cpu) = cpu {
            if let Err(e) = sio::pin_current_thread(cpu) {
                tracing::warn!("cannot pin the datapath thread to CPU {cpu}: {e}");
            }
        }
        // The thread sleeps most of the time and must run soon after it wakes: with the
        // default slice, on two cores busy with spinning applications, it waited for a
        // slice to end (`ib_write_lat` mean 170 µs with a 100 µs slice, 650 µs
        // without, p99 2 ms against 4 ms; bandwidth unchanged).
        if let Err(e) = sio::request_short_slice(DP_SLICE_NS) {
            tracing::debug!("no short scheduler slice for the datapath thread: {e}");
        }
        let shared = self.shared.clone();
        let mut more_tx = false;
        let mut last_active = Instant::now();
        let mut iterations = 0u64;
        // The application's polling window this thread last slept out (0: none).
        let mut slept_out: Nanos = 0;
        let mut strandings = StrandPolicy::default();
        while !shared.stop.load(Ordering::Relaxed) {
            iterations += 1;
            let app_until = shared.app_active_until.load(Ordering::Relaxed);
            let now = shared.now();
            let app_polls = now < app_until;
            if !app_polls {
                // The window ran out with no poll since (a poll moves `app_until`, an
                // application about to block sets it to 0).
                let expired = slept_out != 0 && app_until == slept_out;
                slept_out = 0;
                // `None`: an application thread is in a step right now.
                let step = shared
                    .progress
                    .try_lock()
                    .map(|mut p| p.step(&shared, more_tx, None));
                if let Some(step) = step {
                    if expired && step.received {
                        Stats::add(&shared.stats.app_strandings, 1);
                        if let Some(until) = strandings.stranded(now) {
                            Stats::add(&shared.stats.app_served, 1);
                            shared.serve_until.store(until, Ordering::Relaxed);
                        }
                    }
                    more_tx = step.more_tx;
                    if step.active {
                        last_active = Instant::now();
                        continue;
                    }
                } else {
                    std::thread::yield_now();
                    continue;
                }
            }
            let sleep = app_polls
                || match shared.poll {
                    PollMode::Busy => false,
                    // Not while serving an application that spins elsewhere (see
                    // `crate::strand`): its thread holds a CPU already, and on
                    // two cores this thread's spin took the CPU the peer needed
                    // (`ib_write_lat` p50: 4 ms spinning, 31 µs sleeping at once).
                    PollMode::Adaptive { spin_us } => {
                        now < shared.serve_until.load(Ordering::Relaxed)
                            || last_active.elapsed() >= Duration::from_micros(u64::from(spin_us))
                    }
                    PollMode::Blocking => true,
                };
            if sleep {
                Stats::add(
                    &shared.stats.loop_iterations,
                    std::mem::take(&mut iterations),
                );
                if app_polls {
                    // The application runs sockets and timers; look again when its
                    // window ends (or when it says it will block: the doorbell).
                    slept_out = app_until;
                    self.sleep(Some(app_until), true);
                } else {
                    let d = shared.deadline.load(Ordering::Relaxed);
                    self.sleep((d != Nanos::MAX).then_some(d), false);
                    last_active = Instant::now();
                }
            } else if shared.poll == PollMode::Busy {
                std::hint::spin_loop();
            } else {
                // Adaptive: spin, but let a thread waiting for this CPU have it. The
                // application threads this datapath wakes (a completion channel, a
                // blocking CQ wait) need a CPU right then, and on two cores the other
                // one often spins too (the peer's datapath thread, on loopback):
                // `ib_send_lat -e` p50 57-65 µs spinning, 18-31 µs yielding; READ
                // latency and bandwidth, which this spin is for, unchanged.
                std::thread::yield_now();
            }
        }
        Stats::add(&shared.stats.loop_iterations, iterations);
    }

    /// Sleeps in epoll until a packet (unless the application polls the sockets), a
    /// doorbell or `deadline`.
    fn sleep(&mut self, deadline: Option<Nanos>, doorbell_only: bool) {
        let shared = Arc::clone(&self.shared);
        shared
            .thread_wake
            .store(deadline.unwrap_or(Nanos::MAX), Ordering::SeqCst);
        shared.sleeping.store(true, Ordering::SeqCst);
        // Dekker with `Shared::kick`: a post after our last `pending.swap` either sees
        // `sleeping` and rings, or we see `pending` here. (While the application polls,
        // pending work is its own to run.)
        let woken = if doorbell_only {
            // Cleared by an application about to block (`Shared::app_will_block`).
            shared.app_active_until.load(Ordering::SeqCst) == 0
        } else {
            // An application that started polling since the loop looked: go back and
            // sleep only until its window ends (see `wake_by_window_end`).
            shared.pending.load(Ordering::SeqCst)
                || shared.app_active_until.load(Ordering::SeqCst) > shared.now()
        };
        if woken || shared.stop.load(Ordering::SeqCst) {
            shared.sleeping.store(false, Ordering::SeqCst);
            return;
        }
        let timeout = deadline.map(|d| Duration::from_nanos(d.saturating_sub(shared.now())));
        Stats::add(&shared.stats.sleeps, 1);
        self.watch_sockets(!doorbell_only);
        if let Err(e) = self.poller.wait(&mut self.events, timeout) {
            tracing::warn!("epoll_wait: {e}");
            std::thread::sleep(Duration::from_millis(1));
        }
        shared.sleeping.store(false, Ordering::SeqCst);
        if self.events.iter().any(|e| e.token == DOORBELL) {
            shared.doorbell.drain();
        }
    }
}

/// Sends every transmit of `list` on `sock`, waiting for buffer space when the socket is
/// full, dropping one that the kernel refuses (for RoCE that is a lost packet).
/// Hands `list` to the kernel, waiting while the socket buffer is full; returns whether
/// every transmit went (false: some were dropped after an error or a long stall).
fn send_all(shared: &Shared, sock: &sio::RoceSocket, list: &[sio::Transmit<'_>]) -> bool {
    let mut all = true;
    let mut off = 0;
    let mut stalled: Option<Instant> = None;
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

/// Waits for the socket to drain; returns how many transmits to skip (all of them once
/// the stall has lasted too long, or the device is closing).
fn wait_writable(
    shared: &Shared,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn transmit(len: usize, segment_size: usize) -> Transmit {
        Transmit {
            dst: "127.0.0.1:4791".parse().unwrap(),
            src: "127.0.0.2".parse().unwrap(),
            len,
            segment_size,
            src_port: 4791,
        }
    }

    fn piece(start: usize) -> TxPiece {
        TxPiece {
            start,
            head: 20,
            external: None,
            tail: 0,
            tail_crc: None,
        }
    }

    /// Every packet is looked at, not only the first: a transmit led by a request (or
    /// a READ response) that ends with an ACK keeps its place.
    #[test]
    fn only_acks_looks_at_every_packet() {
        // Back to back: three 20-byte segments.
        let mut buf = vec![0u8; 60];
        for o in [0, 20, 40] {
            buf[o] = 0x11;
        }
        assert!(only_acks(&buf, &[], &transmit(60, 20)));
        buf[0] = 0x04; // SEND Only, then two ACKs
        assert!(!only_acks(&buf, &[], &transmit(60, 20)));
        buf[0] = 0x11;
        buf[40] = 0x10; // READ response Only last
        assert!(!only_acks(&buf, &[], &transmit(60, 20)));
        // Gathered: the pieces say where each packet starts.
        let mut buf = vec![0u8; 40];
        buf[0] = 0x11;
        buf[20] = 0x11;
        let pieces = [piece(0), piece(20)];
        assert!(only_acks(&buf, &pieces, &transmit(40, 20)));
        buf[20] = 0x0a; // a WRITE Only of another QP
        assert!(!only_acks(&buf, &pieces, &transmit(40, 20)));
    }
}
