//! Direct receive ([`DirectRx`]): bulk datagrams whose payload continues a message in
//! progress are received with their payload straight in registered memory (the
//! transport's `direct` module says what may land where, and why a packet that fails
//! never shows bytes RC forbids).
//!
//! Per datagram: `MSG_PEEK` its first header, ask the engine for a plan, `recvmsg` with
//! a scatter list [header | registered memory | ICRC] per GRO segment, and hand each
//! segment to the engine, all in one hold of the engine lock (so no region is
//! deregistered meanwhile). That is two system calls per datagram instead of a share of
//! one `recvmmsg`, so it runs only while bulk datagrams arrive ("armed"); a bulk
//! datagram it cannot plan (a message's First) is received into a buffer and fed in
//! turn, and a run of them disarms it (not the packets after a loss, whose
//! retransmission is plannable again); so is a short datagram, and a run of those
//! disarms it too.

use std::io;
use std::net::IpAddr;

use softhca_io::{RecvBatch, RecvMeta, RoceSocket, ScatterRecv};
use softhca_transport::{DatagramInfo, DirectPlan, Engine};
use softhca_wire as wire;

use super::schedule::DatapathShared;
use super::RECV_BATCH;
use crate::stats::Stats;
use crate::Nanos;

/// Datagrams at least this long arm direct receive; a run of [`MAX_SHORTS`] shorter
/// ones disarms it (ACKs, small messages: the batch receive is cheaper for them).
const BULK: usize = 2048;
/// Short datagrams (and bundles, whose packets of several sizes no plan places) in a row
/// that disarm direct receive. Not one: a camera's frame ends with a WRITE with
/// immediate of no payload, often bundled with the frame's Last, and a batch receive
/// after it took the next frame's first datagrams into buffers, to be copied again.
const MAX_SHORTS: u8 = 4;
/// Unplannable bulk datagrams in a row that disarm direct receive (READ responses, a
/// peer's WRITE Only packets): one First between the runs of Middles of a message is not.
const MAX_MISSES: u8 = 4;
/// Batch receives of bulk datagrams before direct receive is tried again after it was
/// disarmed by misses.
const COOLDOWN: u32 = 256;
/// Bytes of a datagram peeked at: the BTH is all a plan needs.
const PEEK: usize = 64;
/// The largest UDP payload: a GRO datagram is at most this long.
const MAX_DATAGRAM: usize = 65_535;

/// What the batch receive should do after a direct receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
    /// The socket is empty.
    Empty,
    /// A whole batch was received directly: the step handles it before receiving more.
    Full,
    /// Receive into the buffers (a batch).
    Batch,
}

/// One GRO segment of a direct receive: its offset and length in the datagram, and
/// where its payload went when it went to registered memory.
#[derive(Debug, Clone, Copy)]
struct Segment {
    at: usize,
    len: usize,
    placed: Option<(*mut u8, usize)>,
}

/// Direct receive state of a device's datapath (behind the stepper's lock).
pub(crate) struct DirectRx {
    rx: ScatterRecv,
    head: [u8; PEEK],
    /// Headers, ICRCs and segments not placed in registered memory, each at its offset
    /// in the datagram.
    scratch: Box<[u8]>,
    iov: Vec<libc::iovec>,
    segments: Vec<Segment>,
    armed: bool,
    misses: u8,
    shorts: u8,
    cooldown: u32,
}

// SAFETY: the raw pointers in `iov` and `segments` name `scratch` (owned here) and
// registered memory; they are rebuilt for every datagram and only used while the engine
// lock that keeps that memory registered is held, by the thread holding the stepper's
// lock.
unsafe impl Send for DirectRx {}

impl DirectRx {
    pub(crate) fn new() -> DirectRx {
        DirectRx {
            rx: ScatterRecv::default(),
            head: [0; PEEK],
            scratch: vec![0; MAX_DATAGRAM].into_boxed_slice(),
            iov: Vec::with_capacity(3 * 64),
            segments: Vec::with_capacity(64),
            armed: false,
            misses: 0,
            shorts: 0,
            cooldown: 0,
        }
    }

    /// Direct receive is worth trying on the next receive.
    pub(super) fn armed(&self) -> bool {
        self.armed
    }

    /// After a batch receive: bulk datagrams arm direct receive (unless it is cooling
    /// down after misses).
    pub(super) fn saw_batch(&mut self, batch: &RecvBatch) {
        if self.armed || !batch.iter().any(|(m, _)| m.len >= BULK) {
            return;
        }
        if self.cooldown > 0 {
            self.cooldown -= 1;
        } else {
            self.armed = true;
            self.misses = 0;
            self.shorts = 0;
        }
    }

    /// Receives datagrams from `socket` while they can be placed directly; returns how
    /// many, and what the batch receive should do next.
    pub(super) fn receive(
        &mut self,
        shared: &DatapathShared,
        socket: &RoceSocket,
        local_ip: IpAddr,
    ) -> (usize, Then) {
        let mut done = 0;
        while done < RECV_BATCH {
            let meta = match self.rx.peek(socket, &mut self.head) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (done, Then::Empty),
                // Let the batch receive see and count it.
                Err(_) => return (done, Then::Batch),
            };
            let short = meta.len < BULK || wire::is_bundle(&self.head);
            self.shorts = if short { self.shorts + 1 } else { 0 };
            if self.shorts >= MAX_SHORTS || meta.len > MAX_DATAGRAM {
                self.armed = false;
                return (done, Then::Batch);
            }
            let mut core = shared.engine.lock();
            let head = &self.head[..meta.len.min(PEEK)];
            // A short one or a bundle is received whole into the buffer and fed (no plan,
            // no miss).
            let plan = (!short)
                .then(|| core.engine.direct_plan(meta.src.ip(), head))
                .flatten();
            if plan.is_none() && !short {
                // Received into the buffer, and fed now, so that the datagrams behind it
                // are still received directly, in order, in this same step (one ACK for
                // all of them, not one per message).
                // The packets after a loss are not counted: the retransmission
                // behind them is plannable again.
                if !core.engine.direct_awaits_earlier(head) {
                    self.misses += 1;
                }
                if self.misses >= MAX_MISSES {
                    self.armed = false;
                    self.cooldown = COOLDOWN;
                }
            } else {
                self.misses = 0;
            }
            let header_len = plan.map_or(0, |p| p.header_len);
            self.lay_out(&meta, plan.as_ref());
            // SAFETY: `iov` names `scratch` and, per segment, a part of the plan's
            // `[dst, dst + room)` in registered memory, which stays registered while
            // `core` (the engine lock) is held; nothing else reads or writes those bytes
            // during the call (the application must not touch the target of a WRITE
            // or receive in progress).
            let got = unsafe { self.rx.recv(socket, &mut self.iov) };
            let got = match got {
                Ok(m) => m,
                Err(_) => return (done, Then::Batch),
            };
            done += 1;
            let now = shared.now();
            let info = DatagramInfo {
                src: got.src,
                dst: got.dst_ip.unwrap_or(local_ip),
                segment_index: 0,
                tos: got.tos,
            };
            let st = &shared.stats;
            Stats::add(&st.rx_datagrams, 1);
            if got.len != meta.len || got.stride != meta.stride || got.truncated {
                // Not the datagram peeked at (never with one receiver per socket): what
                // landed stayed inside the plan's range; the packets are dropped.
                Stats::add(&st.rx_truncated, 1);
                continue;
            }
            self.feed_segments(&mut core.engine, now, &info, header_len, st);
            if !self.armed {
                return (done, Then::Batch);
            }
        }
        // More in the socket is received directly by the next step, not into the
        // buffers by this one: half of a stream went through them when it was.
        (done, Then::Full)
    }

    /// Hands the segments laid out by `lay_out` to the engine: those placed in
    /// registered memory to be checked and executed there, the others from `scratch`.
    fn feed_segments(
        &self,
        engine: &mut Engine,
        now: Nanos,
        info: &DatagramInfo,
        header_len: usize,
        st: &Stats,
    ) {
        if self.segments.len() > 1 {
            Stats::add(&st.rx_gro_datagrams, 1);
        }
        Stats::add(&st.rx_packets, self.segments.len() as u64);
        for (k, s) in self.segments.iter().enumerate() {
            let info = DatagramInfo {
                segment_index: k as u16,
                ..*info
            };
            let bytes = &self.scratch[s.at..s.at + s.len];
            match s.placed {
                None => engine.handle_datagram(now, &info, bytes),
                Some(placed) => {
                    let (head, rest) = bytes.split_at(header_len);
                    let icrc = rest[rest.len() - 4..].try_into().unwrap_or_default();
                    // SAFETY: `placed` lies in the plan's range (`lay_out`), and the
                    // engine lock has been held since the plan was made.
                    unsafe { engine.handle_datagram_placed(now, &info, head, placed, icrc) };
                }
            }
        }
    }

    /// The scatter list for a datagram of `meta.len` bytes in GRO segments of
    /// `meta.stride`: each segment's payload goes to registered memory, in order, while
    /// it fits the plan's room; the first one that does not, and all after it, go to
    /// `scratch` whole (all of them without a plan).
    fn lay_out(&mut self, meta: &RecvMeta, plan: Option<&DirectPlan>) {
        self.iov.clear();
        self.segments.clear();
        let stride = if meta.stride == 0 || meta.stride > meta.len {
            meta.len
        } else {
            meta.stride
        };
        let base = self.scratch.as_mut_ptr();
        let piece = |at: usize, len: usize| libc::iovec {
            iov_base: base.wrapping_add(at).cast(),
            iov_len: len,
        };
        let header_len = plan.map_or(0, |p| p.header_len);
        let (mut dst, mut room) = plan.map_or((std::ptr::null_mut(), 0), |p| (p.dst, p.room));
        let mut direct = plan.is_some();
        let mut at = 0;
        while at < meta.len {
            let len = stride.min(meta.len - at);
            let payload = len.saturating_sub(header_len + 4);
            direct = direct && payload > 0 && payload <= room;
            let placed = direct.then_some((dst, payload));
            if direct {
                self.iov.push(piece(at, header_len));
                self.iov.push(libc::iovec {
                    iov_base: dst.cast(),
                    iov_len: payload,
                });
                self.iov.push(piece(at + len - 4, 4));
                dst = dst.wrapping_add(payload);
                room -= payload;
            } else {
                self.iov.push(piece(at, len));
            }
            self.segments.push(Segment { at, len, placed });
            at += len;
        }
    }
}
