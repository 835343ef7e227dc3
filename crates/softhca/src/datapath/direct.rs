//! Direct receive ([`DirectRx`]): bulk datagrams whose payload continues a message in
//! progress are received with their payload straight in registered memory (the
//! transport's `direct` module says what may land where, and why a packet that fails
//! never shows bytes RC forbids).
//!
//! Per datagram: `MSG_PEEK` its first header, ask the engine for a plan, `recvmsg` with
//! a scatter list [header | registered memory | ICRC] per GRO segment, and hand each
//! segment to the engine, all in one hold of the engine lock (so no region is
//! deregistered meanwhile). After a datagram that ended inside a message, the next one
//! is guessed to continue it (same size and GRO stride, the next PSN) and received
//! without the peek; a datagram of another shape is then put together from the pieces
//! and handled from that copy (another header of the same shape is the engine's to
//! notice: it remakes the plan for every segment). That is up to two system calls per
//! datagram instead of a share of one `recvmmsg`, so it runs only while bulk datagrams
//! arrive ("armed"); a bulk
//! datagram it cannot plan (a message's First) is received into a buffer and fed in
//! turn, and a run of them disarms it (not the packets after a loss, whose
//! retransmission is plannable again); so is a short datagram, and a run of those
//! disarms it too.

use std::io;
use std::net::{IpAddr, SocketAddr};

use softhca_wire::Bth;

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
    /// Put together in `joined` (a guess the datagram did not fit), not in `scratch`.
    joined: bool,
}

/// Direct receive state of a device's datapath (behind the stepper's lock).
pub(crate) struct DirectRx {
    rx: ScatterRecv,
    head: [u8; PEEK],
    /// Headers, ICRCs and segments not placed in registered memory, each at its offset
    /// in the datagram.
    scratch: Box<[u8]>,
    /// Segments of a guessed datagram of another shape, each at its offset.
    joined: Box<[u8]>,
    iov: Vec<libc::iovec>,
    segments: Vec<Segment>,
    /// The next datagram's expected metadata, its headers in `head` (see the module
    /// comment), and the local address of the socket it is expected on.
    guess: Option<(RecvMeta, SocketAddr)>,
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
            joined: vec![0; MAX_DATAGRAM].into_boxed_slice(),
            iov: Vec::with_capacity(3 * 64 + 1),
            segments: Vec::with_capacity(64),
            guess: None,
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
        // The batch took datagrams off the socket: the one after them is not guessed.
        self.guess = None;
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
            let on = socket.local_addr();
            // A guess holds for the socket whose stream it continues only.
            let guessed = self.guess.take().filter(|g| g.1 == on).map(|g| g.0);
            let meta = match guessed {
                Some(g) => g,
                None => match self.rx.peek(socket, &mut self.head) {
                    Ok(m) => m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (done, Then::Empty),
                    // Let the batch receive see and count it.
                    Err(_) => return (done, Then::Batch),
                },
            };
            if !self.count_short(meta.len, wire::is_bundle(&self.head)) {
                return (done, Then::Batch);
            }
            let short = self.shorts > 0;
            let mut core = shared.engine.lock();
            let head = &self.head[..meta.len.min(PEEK)];
            // A short one or a bundle is received whole into the buffer and fed (no plan,
            // no miss).
            let plan = (!short)
                .then(|| core.engine.direct_plan(meta.src.ip(), head))
                .flatten();
            if guessed.is_some() && plan.is_none() {
                // The message the guess continued is over: look at the datagram.
                continue;
            }
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
            self.lay_out(&meta, plan.as_ref(), guessed.is_some());
            // SAFETY: `iov` names `scratch` and, per segment, a part of the plan's
            // `[dst, dst + room)` in registered memory, which stays registered while
            // `core` (the engine lock) is held; nothing else reads or writes those bytes
            // during the call (the application must not touch the target of a WRITE
            // or receive in progress).
            let got = unsafe { self.rx.recv(socket, &mut self.iov) };
            let got = match got {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.guess = guessed.map(|g| (g, on));
                    return (done, Then::Empty);
                }
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
            let fits = got.len == meta.len && got.stride == meta.stride && !got.truncated;
            if !self.accept(guessed.is_some(), &got, fits, st) {
                continue;
            }
            self.feed_segments(&mut core.engine, now, &info, header_len, st);
            if fits && plan.is_some() {
                self.guess = self.next_guess(&got, header_len).map(|g| (g, on));
            }
            if !self.armed {
                return (done, Then::Batch);
            }
        }
        // More in the socket is received directly by the next step, not into the
        // buffers by this one: half of a stream went through them when it was.
        (done, Then::Full)
    }

    /// Whether the datagram received (`got`) is handled: as laid out when it `fits`,
    /// or, a guess of another shape, from its misfit segments joined. Otherwise it was
    /// not the datagram peeked at (never with one receiver per socket): what landed
    /// stayed inside the plan's range, and its packets are dropped.
    fn accept(&mut self, guessed: bool, got: &RecvMeta, fits: bool, st: &Stats) -> bool {
        if guessed && !got.truncated {
            let missed = &st.rx_direct_guess_missed;
            Stats::add(if fits { &st.rx_direct_guessed } else { missed }, 1);
            if !fits {
                self.join_misfits(got);
                // The first byte received went to `scratch` (it starts every layout).
                self.count_short(got.len, wire::is_bundle(&self.scratch));
            }
            return true;
        }
        if !fits {
            Stats::add(&st.rx_truncated, 1);
        }
        fits
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
            let from = if s.joined {
                &self.joined
            } else {
                &self.scratch
            };
            let bytes = &from[s.at..s.at + s.len];
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

    /// Counts a datagram of `len` bytes (a bundle or not) towards the run of short
    /// ones; false, and disarmed, when the run is long enough (or the datagram too long
    /// for any plan).
    fn count_short(&mut self, len: usize, bundle: bool) -> bool {
        let short = len < BULK || bundle;
        self.shorts = if short { self.shorts + 1 } else { 0 };
        if self.shorts >= MAX_SHORTS || len > MAX_DATAGRAM {
            self.armed = false;
            return false;
        }
        true
    }

    /// After a datagram received as laid out: the next one, guessed to continue the
    /// message its last segment belongs to when that is a Middle (the next PSN, the same
    /// size and GRO stride); its headers go to `head`.
    fn next_guess(&mut self, got: &RecvMeta, header_len: usize) -> Option<RecvMeta> {
        let last = self.segments.last()?;
        let mut bth = Bth::parse(&self.scratch[last.at..last.at + last.len]).ok()?;
        if last.placed.is_none() || header_len != wire::BTH_LEN || !bth.opcode.is_middle() {
            return None;
        }
        bth.psn = bth.psn.next();
        bth.emit(&mut self.head).ok()?;
        Some(*got)
    }

    /// A guessed datagram turned out of another shape (`got`): each of its segments
    /// that does not lie where the guess laid one out is put together in `joined` from
    /// the scatter list's pieces, and `segments` describes the datagram received.
    fn join_misfits(&mut self, got: &RecvMeta) {
        let stride = if got.stride == 0 || got.stride > got.len {
            got.len
        } else {
            got.stride
        };
        let laid = std::mem::take(&mut self.segments);
        let mut at = 0;
        while at < got.len || (at == 0 && got.len == 0) {
            let len = stride.min(got.len - at);
            let k = self.segments.len();
            let seg = match laid.get(k) {
                Some(s) if s.at == at && s.len == len => *s,
                _ => {
                    self.gather(at, len);
                    Segment {
                        at,
                        len,
                        placed: None,
                        joined: true,
                    }
                }
            };
            self.segments.push(seg);
            if len == 0 {
                break;
            }
            at += len;
        }
    }

    /// Copies bytes `at..at + len` of the datagram just received from the scatter
    /// list's pieces to the same place in `joined`.
    fn gather(&mut self, at: usize, len: usize) {
        let mut off = 0;
        let mut out = at;
        for v in &self.iov {
            let (start, end) = (off, off + v.iov_len);
            off = end;
            let (from, to) = (start.max(at), end.min(at + len));
            if from >= to {
                continue;
            }
            // SAFETY: the iovec names `scratch` or registered memory that stays
            // registered while the engine lock is held (held since the plan was made),
            // and `recvmsg` has just written it.
            let piece = unsafe {
                std::slice::from_raw_parts(v.iov_base.cast::<u8>().add(from - start), to - from)
            };
            self.joined[out..out + piece.len()].copy_from_slice(piece);
            out += piece.len();
        }
    }

    /// The scatter list for a datagram of `meta.len` bytes in GRO segments of
    /// `meta.stride`: each segment's payload goes to registered memory, in order, while
    /// it fits the plan's room; the first one that does not, and all after it, go to
    /// `scratch` whole (all of them without a plan). A guessed datagram may be longer
    /// than guessed: the rest of `scratch` takes what follows.
    fn lay_out(&mut self, meta: &RecvMeta, plan: Option<&DirectPlan>, guessed: bool) {
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
            self.segments.push(Segment {
                at,
                len,
                placed,
                joined: false,
            });
            at += len;
        }
        if guessed && meta.len < MAX_DATAGRAM {
            self.iov.push(piece(meta.len, MAX_DATAGRAM - meta.len));
        }
    }
}
