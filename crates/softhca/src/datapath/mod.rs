//! The datapath: sockets ↔ engine, one batch at a time.
//!
//! One step ([`step`]): receive a batch from every socket (no engine lock held) → lock
//! the engine once → feed every datagram (GRO datagrams split into their segments) → run
//! expired timers → move completions and events out → fill the transmit buffers → unlock
//! → seal and send the batch ([`tx`]). Nothing is allocated, locked or system-called per
//! packet.
//!
//! Who runs a step ([`schedule`]): the application thread itself whenever it polls an
//! empty CQ (run to completion: no hand-off, no wake-up, the way user-space NIC drivers
//! progress in `poll_cq`), or the device's datapath thread ([`thread`]) when no
//! application thread is polling (timers, blocked or busy applications). On a 2-core
//! machine every hand-off between threads costs more than the packet work itself. While
//! the application polls, the datapath thread sleeps on its doorbell only, not on the
//! sockets, so arriving packets do not wake it for nothing; when the application waits
//! without polling, the thread takes the sockets over ([`takeover`]).

mod bundle;
mod direct;
mod mcast;
mod schedule;
mod senders;
mod step;
mod takeover;
mod thread;
mod tx;

pub(crate) use mcast::McastSockets;
pub(crate) use schedule::DatapathShared;
pub(crate) use step::Stepper;
pub(crate) use thread::DatapathThread;

/// Datagrams per `recvmmsg` per socket.
const RECV_BATCH: usize = 32;
/// Transmit buffers filled per lock hold.
const TX_BATCH: usize = 16;
/// Bytes per transmit buffer: one full GSO super-datagram (64 KiB less IP/UDP headers).
const TX_BUF: usize = 65_507;
/// After an application thread progressed the datapath, the datapath thread leaves the
/// sockets to it for this long. An application that stops polling without saying so
/// (no `req_notify`, no blocking wait) delays its traffic by at most this much, and one
/// that keeps doing it gets no windows for a while ([`takeover`]). Short, because a
/// responder's application owes one-sided operations (READ, atomics, WRITE) no poll,
/// and one that polls now and then (UCX progresses about every millisecond) must not
/// hold its peer's READs for a window each.
const APP_WINDOW_NS: u64 = 200_000;
/// The datapath thread checks that a polling application still polls at the end of its
/// window; each window it finds extended doubles the next look's delay beyond the
/// window end, up to this. Each look is a wake-up that preempts a spinning thread on a
/// busy machine (two MPI ranks on two cores lost a fifth of their 64 KiB ping-pong rate
/// to one every 200 µs per process); the price is that an application that stops
/// polling without saying so, after polling steadily, may leave its traffic (and held
/// ACKs, and timers) waiting this much longer once.
const APP_WINDOW_STRETCH_MAX_NS: u64 = 1_600_000;
/// How long the datapath thread, serving an application that spins on memory, holds the
/// ACKs of what it placed for the application's answer (see `Stepper::held`): a few
/// times the answer's usual delay, far below a retransmit timeout or tail-loss probe.
const SERVE_HOLD_NS: u64 = 50_000;
/// Inline steps per poll when each one fills its round of transmits.
const INLINE_STEPS: usize = 4;
