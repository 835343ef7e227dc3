//! One datapath step: receive, feed the engine, build transmits ([`Stepper`]).

use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;
use smallvec::SmallVec;
use softhca_io::{self as sio, Impair, RecvBatch, RecvMeta, RoceSocket};
use softhca_transport::{DatagramInfo, Engine, SegmentKind, Transmit, TxPiece};

use super::bundle::Bundler;
use super::direct::{DirectRx, Then};
use super::mcast::McastRx;
use super::schedule::{wake_by_hold_end, wake_by_window_end, DatapathShared};
use super::senders::Senders;
use super::{RECV_BATCH, TX_BATCH, TX_BUF};
use crate::ring::{EngineCompletion, LockedEngine};
use crate::stats::Stats;
use crate::{CqId, Nanos};

/// Posts of a burst left unbuilt at most (see [`Stepper::transmit_with`]): past that
/// the burst's transmits are built, and sent when a round is full, as before, so
/// that an application posting a long burst before it polls does not hold the wire.
const UNBUILT_MAX: usize = 8;

/// Bytes of transmits the first round of a burst builds before they are sent (four
/// full GSO sends); a round after a full one takes every buffer. Why: a large message
/// then leaves in parts, and the peer works on the first while the rest is built. A
/// 1 MiB READ's responses went out only once all 1 MiB was copied out, the requester
/// idle meanwhile, and an MPI 1 MiB ping-pong (UCX's rendezvous is a READ) waited for
/// that every time. A stream fills whole rounds and is not cut.
const ROUND_BYTES: usize = 4 * TX_BUF;

/// What one step did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Step {
    /// Packets received or sent.
    pub active: bool,
    /// Every transmit buffer was filled: there may be more to send right away.
    pub more_tx: bool,
    /// Datagrams were received.
    pub received: bool,
    /// The step holds ACKs for the application's answer.
    pub held: bool,
}

/// What a step received, for the counters.
#[derive(Debug, Clone, Copy, Default)]
struct RxCounts {
    datagrams: u64,
    packets: u64,
    gro: u64,
    truncated: u64,
}

/// The preallocated buffers of a step; behind [`DatapathShared::stepper`], so whichever
/// thread holds that lock runs the datapath.
pub(crate) struct Stepper {
    pub(super) rx: Vec<RecvBatch>,
    pub(super) rx_count: Vec<usize>,
    /// With several sockets: their pollfds, to receive only where there is something
    /// (see [`Stepper::receive`]); empty with one socket.
    readiness: Vec<libc::pollfd>,
    pub(super) local_ips: Vec<IpAddr>,
    pub(super) tx_bufs: Vec<Box<[u8]>>,
    /// Per transmit buffer: where its packets' bytes are (zero-copy send: payloads stay
    /// in registered memory, see `Engine::poll_transmit_gather`).
    pub(super) tx_pieces: Vec<Vec<TxPiece>>,
    /// Per transmit buffer: the iovecs of a gathered transmit, rebuilt at each send.
    pub(super) tx_iov: Vec<Vec<libc::iovec>>,
    pub(super) tx: Vec<(usize, Transmit)>,
    /// Completions made while building `tx` (a UC or UD send completes when its last
    /// packet is built), delivered once `tx` has been handed to the kernel: their
    /// payloads may still be in registered memory (zero-copy), and an application that
    /// sees the completion may write the buffer again. Kept here, out of the engine, so
    /// that no other thread delivers them early.
    pub(super) after_send: Vec<EngineCompletion>,
    /// The transmits being sent are an application's post while the datapath thread
    /// serves it: `after_send` is held from the CQs (see `LockedEngine::hold_sends`).
    pub(super) hold_sends: bool,
    /// An application thread's step completed work and left the ACKs it owes in the
    /// engine, unbuilt, for that thread's next call: an application that answers a
    /// completion posts at once, and the ACK leaves with the answer, in one GSO send.
    /// Sent at the next post or poll, when the application blocks or when its polling
    /// window ends; never held twice. While the datapath thread serves an application
    /// that spins on memory (see `takeover`), any step that received requests holds
    /// their ACKs for the answer, for at most `SERVE_HOLD_NS`.
    held: bool,
    /// Transmits of an application's posts, kept back for its next call: their buffer
    /// indices and Transmits, in send order; the last may be filled up (see
    /// [`Stepper::keep_back`]).
    deferred: SmallVec<[(usize, Transmit); TX_BATCH]>,
    /// The last call was an application's post, not a step: posts come in a burst.
    burst: bool,
    /// Posts of the current burst left unbuilt for the application's next call (see
    /// [`Stepper::transmit_with`]).
    unbuilt: usize,
    /// The last build filled its round (every buffer, or [`ROUND_BYTES`]): more may wait.
    tx_full: bool,
    /// Datagrams came in since the last idle step: the next one warms the receive
    /// buffers ([`softhca_transport::Engine::warm_receives`]).
    warm_due: bool,
    /// Where the last step stopped feeding its received datagrams (socket, datagram,
    /// segment): the trailing ACKs of its last datagram, left for the next step so that
    /// the polling application got the completion before them. The receive buffers and
    /// counts stay as they are until then.
    rx_resume: Option<(usize, usize, usize)>,
    /// Sockets connected to peers, for transmits built in the buffer (see `senders`).
    pub(super) senders: Senders,
    /// Fault injection ([`crate::Config::tx_drop_ppm`]).
    pub(super) impair: Option<Impair>,
    /// Direct receive into registered memory ([`crate::Config::direct_rx`]).
    direct: Option<DirectRx>,
    /// Which transmits leave in bundles, and the bundles (see `bundle`).
    pub(super) bundler: Bundler,
    /// What the multicast group sockets received (see `mcast`).
    mcast: McastRx,
}

// SAFETY: the raw pointers in `tx_iov` name `tx_bufs` (owned here) and registered
// memory that deregistration keeps alive while this struct's lock is held (see
// `Context::with_core_no_transmit`); they are rebuilt before each send and only read by
// the kernel during that send, by the thread holding the lock.
unsafe impl Send for Stepper {}

impl Stepper {
    pub(crate) fn new(
        sockets: &[RoceSocket],
        impair: Option<Impair>,
        connected: bool,
        sockbuf: usize,
        direct_rx: bool,
        bundle_limits: Vec<usize>,
    ) -> Stepper {
        // Fault injection cuts transmits apart after they are sealed: it keeps the
        // device sockets, whose seal does not depend on what was sent before.
        let gso = sockets.iter().all(|s| s.capabilities().gso);
        let bound = sockets.first().map_or(0, RoceSocket::bound_ifindex);
        let senders = Senders::new(connected && impair.is_none(), gso, sockbuf, bound);
        // Fault injection cuts transmits apart as they are sent: no bundles then.
        let limits = if impair.is_none() {
            bundle_limits
        } else {
            Vec::new()
        };
        let bundler = Bundler::new(limits, gso);
        let readiness = if sockets.len() > 1 {
            let poll_in = |s: &RoceSocket| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            sockets.iter().map(poll_in).collect()
        } else {
            Vec::new()
        };
        Stepper {
            rx: sockets
                .iter()
                .map(|s| RecvBatch::for_socket(s, RECV_BATCH))
                .collect(),
            rx_count: vec![0; sockets.len()],
            readiness,
            local_ips: sockets.iter().map(|s| s.local_addr().ip()).collect(),
            tx_bufs: (0..TX_BATCH)
                .map(|_| vec![0u8; TX_BUF].into_boxed_slice())
                .collect(),
            tx_pieces: (0..TX_BATCH).map(|_| Vec::with_capacity(64)).collect(),
            tx_iov: (0..TX_BATCH).map(|_| Vec::with_capacity(3 * 64)).collect(),
            tx: Vec::with_capacity(TX_BATCH),
            after_send: Vec::new(),
            hold_sends: false,
            held: false,
            deferred: SmallVec::new(),
            burst: false,
            unbuilt: 0,
            tx_full: false,
            warm_due: false,
            rx_resume: None,
            senders,
            impair,
            direct: direct_rx.then(DirectRx::new),
            bundler,
            mcast: McastRx::default(),
        }
    }

    /// The doorbell half of a step, for a thread that just posted work: no receive, the
    /// engine builds what is ready and it goes out now (as a NIC starts sending at its
    /// doorbell). Returns whether the round was full (more to send).
    pub(crate) fn transmit(&mut self, shared: &DatapathShared) -> bool {
        self.transmit_with(shared, false, |_, _| ()).1
    }

    /// [`Stepper::transmit`] after posting with `post` in the same engine lock hold (one
    /// lock, one clock read and one completion pass per post instead of two). `app`: the
    /// caller is an application posting; while it polls (its window is open) it will
    /// call again soon, and the last transmit of a burst may wait for that call (see
    /// [`Stepper::keep_back`]).
    ///
    /// A post within a burst (after another post, with the window open) is not even
    /// built, up to [`UNBUILT_MAX`] of them: what it makes would wait for the burst's end
    /// anyway, and the application's next call builds them all in one pass. UCX sends
    /// a 64 KiB MPI message as eight 8 KiB posts; building each apart cost about a third
    /// of the 530 ns a post took.
    pub(crate) fn transmit_with<R>(
        &mut self,
        shared: &DatapathShared,
        app: bool,
        post: impl FnOnce(&mut LockedEngine, Nanos) -> R,
    ) -> (R, bool) {
        shared.pending.store(false, Ordering::SeqCst);
        let now = shared.now();
        let defer = app && now < shared.app_active_until.load(Ordering::Relaxed);
        let mut core = shared.engine.lock();
        let r = post(&mut core, now);
        if defer && self.burst && self.unbuilt < UNBUILT_MAX {
            drop(core);
            self.unbuilt += 1;
            Stats::add(&shared.stats.tx_deferred, 1);
            // The next step runs the engine; the datapath thread sends it if the
            // application goes quiet.
            shared.pending.store(true, Ordering::SeqCst);
            wake_by_window_end(shared, now);
            return (r, false);
        }
        let (ntx, deadline) = self.process_locked(core, shared, now, None, false, defer);
        self.burst = defer;
        shared
            .deadline
            .store(deadline.unwrap_or(Nanos::MAX), Ordering::Relaxed);
        if !self.deferred.is_empty() {
            Stats::add(&shared.stats.tx_deferred, 1);
            wake_by_window_end(shared, now);
        }
        if !self.tx.is_empty() {
            self.hold_sends = app && shared.serving(now);
            match &shared.turnaround {
                None => self.send(shared),
                Some(timer) => {
                    let sending = shared.now();
                    self.send(shared);
                    timer.sent(now, sending, shared.now());
                }
            }
            self.hold_sends = false;
        }
        (r, self.tx_full && ntx > 0)
    }

    /// One step. A step that fills its round of transmits leaves `pending` set, so the
    /// next one runs the engine for the rest. `polled`: the caller is an application
    /// thread polling this CQ; its completions come first: the step may hold the ACKs it
    /// owes (see `held`) and leave the trailing ACKs it received (see `rx_resume`).
    pub(crate) fn step(&mut self, shared: &DatapathShared, polled: Option<CqId>) -> Step {
        // What the application's last posts kept back leaves before anything is received:
        // the peer waits for it, and what came in meanwhile (ACKs, mostly) can wait the
        // few microseconds its receive and handling take.
        if (!self.deferred.is_empty() || self.unbuilt > 0) && self.transmit(shared) {
            // Every buffer filled: the step below builds the rest.
            shared.pending.store(true, Ordering::SeqCst);
        }
        let resume = self.rx_resume.is_some();
        let rx = if resume { 0 } else { self.receive(shared) };
        let now = shared.now();
        if let (true, Some(timer)) = (rx > 0, &shared.turnaround) {
            timer.received(now);
        }
        self.burst = false;
        // An application thread polls: the datapath thread leaves the sockets to it for a
        // while, unless the application is known not to poll for what it waits for; then
        // the datapath thread serves it, and what a step holds waits for its answer.
        let serving = shared.serving(now);
        let may_hold = (polled.is_some() && shared.open_app_window(now)) || serving;
        let pending = shared.pending.swap(false, Ordering::SeqCst);
        let due = shared.deadline.load(Ordering::Relaxed) <= now;
        let was_held = self.held || !self.deferred.is_empty();
        let mut step = Step {
            active: rx > 0 || resume,
            received: rx > 0,
            ..Step::default()
        };
        if !(rx > 0 || resume || pending || due || was_held) {
            // Idle after receiving: bring the receive buffers the next messages land in
            // into this CPU's cache now, not while the next message waits to be copied.
            if self.warm_due {
                self.warm_due = false;
                shared.engine.lock().engine.warm_receives();
            }
            return step;
        }
        self.warm_due |= rx > 0;
        let core = shared.engine.lock();
        // A step that only feeds the ACKs the last one left keeps what that one held: it
        // is not the application's next call (`ib_send_lat` polls its send CQ right after
        // the answer came, for the send the ACK completes).
        let keep = resume && self.held && self.deferred.is_empty();
        let hold = may_hold && (!was_held || keep);
        // Never twice for one datagram.
        let answers_on = polled.filter(|_| hold && !resume);
        let (ntx, deadline) = self.process_locked(core, shared, now, Some(answers_on), hold, false);
        shared
            .deadline
            .store(deadline.unwrap_or(Nanos::MAX), Ordering::Relaxed);
        step.more_tx = self.tx_full && ntx > 0;
        if step.more_tx {
            // Whoever steps next builds the rest: the datapath thread's next step, or an
            // application thread's when it polls through that thread's sleep (a flag of
            // the datapath thread's own left a large UC message to crawl out a round per
            // window).
            shared.pending.store(true, Ordering::SeqCst);
        }
        let left = self.rx_resume.is_some();
        if left {
            Stats::add(&shared.stats.rx_acks_deferred, 1);
        }
        if self.held && !keep {
            let st = &shared.stats;
            Stats::add(
                if serving {
                    &st.tx_serve_held
                } else {
                    &st.tx_held
                },
                1,
            );
        }
        // Something waits for this application's next call: the datapath thread takes it
        // over at the end of the polling window (the hold, if serving) if that call never
        // comes.
        if left || (self.held && !keep) {
            if serving {
                wake_by_hold_end(shared, now);
            } else {
                wake_by_window_end(shared, now);
            }
        }
        if self.held {
            step.active = true;
            step.held = true;
        } else if !self.tx.is_empty() {
            step.active = true;
            self.send(shared);
        }
        step
    }

    /// Sends what a step held for the application's answer and what posted work made
    /// ready (before a QP or the device goes away: the peer must still get the ACKs of
    /// what completed here, and a UD or UC send posted before `ibv_destroy_qp` is on the
    /// wire after it, as with rxe, whose post runs the requester before it returns).
    pub(crate) fn flush_held(&mut self, shared: &DatapathShared) {
        let mut more = self.held
            || !self.deferred.is_empty()
            || self.unbuilt > 0
            || shared.pending.load(Ordering::SeqCst);
        // Finite: a transmit receives nothing, so only work already posted is built.
        while more {
            more = self.transmit(shared);
        }
        // And the completions held with them: nothing waits for an answer any more.
        shared.engine.lock().deliver(shared);
    }

    /// One `recvmmsg` per socket that has datagrams; returns the number received.
    ///
    /// With several sockets (a default device serves every interface address and a
    /// loopback one), one `poll(2)` with zero timeout says which: an empty poll, the
    /// common call of a polling application, is then one system call instead of one
    /// per socket. Not an epoll set: its registration runs a callback for every datagram
    /// received, in the sender's system call on loopback (see
    /// `DatapathThread::watching_sockets`).
    fn receive(&mut self, shared: &DatapathShared) -> usize {
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
            self.rx_count[i] = 0;
            if i < 64 && ready & 1 << i == 0 {
                continue;
            }
            if let Some(d) = self.direct.as_mut().filter(|d| d.armed()) {
                let (n, then) = d.receive(shared, s, self.local_ips[i]);
                total += n;
                if then != Then::Batch {
                    continue;
                }
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
            if let Some(d) = self.direct.as_mut().filter(|_| self.rx_count[i] > 0) {
                d.saw_batch(&self.rx[i]);
            }
            total += self.rx_count[i];
        }
        total + self.mcast.receive(shared)
    }

    /// Under the engine lock (released on return): feed what was received (`rx`, for a
    /// step: `Some(the CQ polled, if its completions come first)`), run timers, deliver,
    /// fill transmits. Returns the number of filled transmit buffers and the next
    /// deadline. With `may_hold`, a step that completed work and has only ACKs to send
    /// leaves them in the engine (sets `held`).
    fn process_locked(
        &mut self,
        mut core: MutexGuard<'_, LockedEngine>,
        shared: &DatapathShared,
        now: Nanos,
        rx: Option<Option<CqId>>,
        may_hold: bool,
        may_defer: bool,
    ) -> (usize, Option<Nanos>) {
        self.unbuilt = 0;
        // Received datagrams are fed by steps only (a post leaves them to the next step),
        // from where the last step stopped if it left trailing ACKs.
        let start = rx.and_then(|_| self.rx_resume.take());
        let mut counts = match rx {
            Some(answers_on) => self.feed(&mut core, now, answers_on, start),
            None => RxCounts::default(),
        };
        if rx.is_some() {
            let (datagrams, packets) = self.mcast.feed(&mut core.engine, now);
            counts.datagrams += datagrams;
            counts.packets += packets;
        }
        if core.engine.poll_timeout().is_some_and(|d| d <= now) {
            core.engine.handle_timeout(now);
        }
        let completed = core.engine.has_completions();
        // Held send completions go in before what this step's packets complete, or when
        // their hold ends; a step with neither leaves them held.
        let release = counts.packets > 0 || core.held_sends_until().is_some_and(|t| t <= now);
        let deliver = |core: &mut LockedEngine| {
            if release {
                core.deliver(shared)
            } else {
                core.deliver_holding(shared)
            }
        };
        deliver(&mut core);
        // Held again by a step that feeds what the last one left.
        let keep = self.held && start.is_some();
        // Serving an application that spins on memory, the ACKs of what was placed wait
        // for its answer too: it posts the moment it sees the bytes, the ACK leaves with
        // the answer, and the peer, polling its send CQ for that ACK, takes the answer in
        // the same step. Sent one by one, each half round trip woke the peer's datapath
        // thread twice (for the ACK, then for the answer); `ib_write_lat` paid for it.
        let serving = may_hold && shared.serving(now);
        self.held = may_hold
            && (completed || keep || (serving && counts.packets > 0))
            && core.engine.only_acks_ready();
        self.tx.clear();
        if !self.held {
            self.build_transmits(&mut core.engine, now);
        }
        // Building packets completes work too (UC and UD sends): after the send.
        if self.tx.is_empty() {
            deliver(&mut core);
        } else {
            while let Some(c) = core.engine.poll_completion() {
                self.after_send.push(c);
            }
        }
        if may_defer && self.after_send.is_empty() {
            self.keep_back();
        }
        self.plan_bundles(&core.engine, shared);
        let mut deadline = core.engine.poll_timeout();
        if self.held && serving {
            let end = now + super::SERVE_HOLD_NS;
            deadline = Some(deadline.map_or(end, |d| d.min(end)));
        }
        if let Some(end) = core.held_sends_until() {
            deadline = Some(deadline.map_or(end, |d| d.min(end)));
        }
        drop(core);
        let st = &shared.stats;
        if counts.datagrams > 0 {
            Stats::add(&st.rx_batches, 1);
        }
        Stats::add(&st.rx_datagrams, counts.datagrams);
        Stats::add(&st.rx_packets, counts.packets);
        Stats::add(&st.rx_gro_datagrams, counts.gro);
        Stats::add(&st.rx_truncated, counts.truncated);
        (self.tx.len(), deadline)
    }

    /// Decides which transmits leave in bundles (see `bundle`), before any is sealed: a
    /// bundled packet is sealed differently.
    fn plan_bundles(&mut self, engine: &Engine, shared: &DatapathShared) {
        let own_port = |t: &Transmit| {
            shared
                .sport_sockets
                .iter()
                .any(|(a, p, _)| *a == t.src && *p == t.src_port)
        };
        self.bundler.plan(
            &self.tx,
            &self.tx_pieces,
            &self.local_ips,
            |dst| engine.bundles_to(dst),
            own_port,
        );
    }

    /// Feeds the received datagrams to the engine, from `start` (where the last step
    /// stopped) if given. With `answers_on`, the trailing ACKs of the last datagram wait
    /// for the next step (`rx_resume`) when what that CQ's poller waits for is here and
    /// they complete nothing on it.
    fn feed(
        &mut self,
        core: &mut LockedEngine,
        now: Nanos,
        answers_on: Option<CqId>,
        start: Option<(usize, usize, usize)>,
    ) -> RxCounts {
        let mut counts = RxCounts::default();
        let (first_socket, first_datagram, first_segment) = start.unwrap_or_default();
        // The last datagram received: the only one whose trailing ACKs may wait.
        let last = (0..self.rx.len())
            .rev()
            .find(|&i| self.rx_count[i].min(self.rx[i].len()) > 0)
            .map(|i| (i, self.rx_count[i].min(self.rx[i].len()) - 1));
        for i in first_socket..self.rx.len() {
            let n = self.rx_count[i].min(self.rx[i].len());
            let from = if i == first_socket { first_datagram } else { 0 };
            for k in from..n {
                let skip = if start.is_some() && (i, k) == (first_socket, first_datagram) {
                    first_segment
                } else {
                    0
                };
                let answers = answers_on.filter(|_| Some((i, k)) == last);
                if let Some(j) = self.feed_datagram(core, now, (i, k), skip, answers, &mut counts) {
                    self.rx_resume = Some((i, k, j));
                    return counts;
                }
            }
        }
        counts
    }

    /// Feeds datagram `k` of socket `i` from segment `skip` on. Returns the segment it
    /// stopped at when its trailing ACKs wait for the next step (see [`Stepper::feed`]).
    fn feed_datagram(
        &self,
        core: &mut LockedEngine,
        now: Nanos,
        (i, k): (usize, usize),
        skip: usize,
        answers_on: Option<CqId>,
        counts: &mut RxCounts,
    ) -> Option<usize> {
        let (meta, buf) = self.rx[i].get(k);
        if skip == 0 {
            counts.datagrams += 1;
            if meta.truncated {
                counts.truncated += 1;
                return None;
            }
            if meta.stride < meta.len {
                counts.gro += 1;
            }
        }
        let dst = meta.dst_ip.unwrap_or(self.local_ips[i]);
        let acks_from = answers_on.map_or(usize::MAX, |_| trailing_acks(&meta, buf));
        for (j, seg) in sio::segments(&meta, buf).enumerate().skip(skip) {
            if let Some(cq) = answers_on.filter(|_| j > 0 && j >= acks_from) {
                // What the application polls for is here, and the ACKs after it complete
                // nothing it polls for: they wait for the next step.
                let engine = &core.engine;
                let wait = engine.has_completion_on(cq)
                    && sio::segments(&meta, buf)
                        .skip(j)
                        .all(|s| completes_on(engine, s) != Some(cq));
                if wait {
                    return Some(j);
                }
            }
            let info = DatagramInfo {
                src: meta.src,
                dst,
                segment_index: j as u16,
                tos: meta.tos,
            };
            core.engine.handle_datagram(now, &info, seg);
            counts.packets += 1;
        }
        None
    }

    /// Fills the transmit buffers: first the transmits the last posts kept back, the last
    /// of them filled up if it can be, then new ones until the engine has nothing more,
    /// every buffer is used or the round has [`ROUND_BYTES`] (then `tx_full` is set: more
    /// may be waiting).
    fn build_transmits(&mut self, engine: &mut Engine, now: Nanos) {
        // The buffers in use, one bit each.
        const _: () = assert!(TX_BATCH <= 64);
        let mut taken = 0u64;
        let last = self.deferred.len().checked_sub(1);
        for (i, (b, prev)) in self.deferred.drain(..).enumerate() {
            let t = if Some(i) == last {
                engine
                    .poll_transmit_append(now, &mut self.tx_bufs[b], &mut self.tx_pieces[b], &prev)
                    .unwrap_or(prev)
            } else {
                prev
            };
            self.tx.push((b, t));
            taken |= 1 << b;
        }
        let mut bytes: usize = self.tx.iter().map(|(_, t)| t.len).sum();
        // A round that follows a full one (a stream) may take every buffer.
        let cap = if self.tx_full {
            usize::MAX
        } else {
            ROUND_BYTES
        };
        self.tx_full = true;
        for (b, buf) in self.tx_bufs.iter_mut().enumerate() {
            if taken & (1 << b) != 0 {
                continue;
            }
            if bytes >= cap {
                return;
            }
            match engine.poll_transmit_gather(now, buf, &mut self.tx_pieces[b]) {
                Some(t) => {
                    bytes += t.len;
                    self.tx.push((b, t));
                }
                None => {
                    self.tx_full = false;
                    return;
                }
            }
        }
    }

    /// Keeps transmits of this post back for the application's next call, while it
    /// polls (its window is open):
    /// - within a burst (the call before this post was a post too, no poll in between),
    ///   the trailing run of bulk transmits (packets of at least `MIN_SEGMENT`), so that
    ///   the burst's posts leave in one `sendmmsg` at its end or when a round is full
    ///   (see [`ROUND_BYTES`]), and the last one may be filled up
    ///   ([`softhca_transport::Engine::poll_transmit_append`]) with packets of its size.
    ///   An application posting one WR per call, as perftest's bandwidth tests
    ///   do, then gets GSO sends of many messages, as one posting a list does; one whose
    ///   messages do not fill whole packets (UCX's 8 KiB + header eager fragments: two
    ///   full packets and a short one) gets one system call per burst instead of one per
    ///   post. A ping-pong application polls between its posts: its messages never wait.
    /// - the short end of a large message: bulk packets right after a full GSO send of
    ///   the same size, filled up by the next post.
    ///
    /// The application's next poll, a blocking wait, a teardown (`flush_held`), a call
    /// that fills every buffer or the end of its polling window (the datapath thread)
    /// sends them.
    ///
    /// Not when building completed work (UC and UD sends complete once their packets are
    /// with the kernel; the application may then write the buffer a kept-back packet
    /// still points into). An RC request completes only when acknowledged, after it left.
    fn keep_back(&mut self) {
        const MIN_SEGMENT: usize = 1024;
        // A full round: more is waiting to be built, and this goes out now anyway.
        if self.tx.is_empty() || self.tx_full {
            return;
        }
        let bulk = |t: &Transmit| t.segment_size >= MIN_SEGMENT;
        if self.burst {
            // The whole run waits, full GSO sends too: they leave with the rest of the
            // burst in one `sendmmsg` (at the latest when a round is full) instead of
            // one system call per post.
            let run = self.tx.iter().rev().take_while(|(_, t)| bulk(t)).count();
            let from = self.tx.len() - run;
            self.deferred.extend(self.tx.drain(from..));
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
        let tail_of_large = bulk(&t) && self.tx.len() >= 2 && {
            let prev = &self.tx[self.tx.len() - 2].1;
            prev.segment_size == seg && prev.dst == t.dst && prev.len + seg > TX_BUF
        };
        let appendable = tail_of_large
            && t.len.is_multiple_of(seg)
            && t.len + seg <= TX_BUF
            && self.tx_pieces[b].len() == t.packets();
        if appendable {
            self.tx.pop();
            self.deferred.push((b, t));
        }
    }
}

/// Where the run of ACKs that ends a datagram starts (found once: asking at every segment
/// whether all after it are ACKs is quadratic in a GRO datagram's segments).
fn trailing_acks(meta: &RecvMeta, buf: &[u8]) -> usize {
    sio::segments(meta, buf)
        .enumerate()
        .filter(|(_, s)| Engine::segment_kind(s) == SegmentKind::Other)
        .last()
        .map_or(0, |(j, _)| j + 1)
}

/// The CQ an ACK completes sends on; None for anything else.
fn completes_on(engine: &Engine, segment: &[u8]) -> Option<CqId> {
    match Engine::segment_kind(segment) {
        SegmentKind::Ack { qpn } => engine.send_cq(qpn),
        SegmentKind::Other => None,
    }
}
