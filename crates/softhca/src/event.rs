//! Asynchronous events (`ibv_get_async_event`): the transport's QP/SRQ events plus the
//! device's own (CQ overflow).

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use softhca_transport as transport;

use crate::error::Error;
use crate::sys::SemEventFd;
use crate::{CqId, Qpn, SrqId};

/// An asynchronous event (`enum ibv_event_type`), as [`crate::Context::get_async_event`]
/// returns it. The same variants as the transport's event, plus [`AsyncEvent::CqErr`],
/// which only the device layer can raise (it owns the completion rings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// A QP hit a fatal error (`IBV_EVENT_QP_FATAL`).
    QpFatal(Qpn),
    /// Invalid request on the responder (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr(Qpn),
    /// Access violation on the responder (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessErr(Qpn),
    /// First packet received in RTR (`IBV_EVENT_COMM_EST`).
    CommEst(Qpn),
    /// SQD reached with nothing outstanding (`IBV_EVENT_SQ_DRAINED`).
    SqDrained(Qpn),
    /// Last WQE reached on an SRQ-attached QP in ERR (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached(Qpn),
    /// An SRQ fell below its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`); the limit disarms.
    SrqLimitReached(SrqId),
    /// SRQ error (`IBV_EVENT_SRQ_ERR`).
    SrqErr(SrqId),
    /// A completion queue overflowed (`IBV_EVENT_CQ_ERR`): completions were lost, as rxe
    /// does when `rxe_cq_post` finds the queue full.
    CqErr(CqId),
}

impl From<transport::AsyncEvent> for AsyncEvent {
    fn from(e: transport::AsyncEvent) -> Self {
        use transport::AsyncEvent as T;
        match e {
            T::QpFatal(q) => AsyncEvent::QpFatal(q),
            T::QpReqErr(q) => AsyncEvent::QpReqErr(q),
            T::QpAccessErr(q) => AsyncEvent::QpAccessErr(q),
            T::CommEst(q) => AsyncEvent::CommEst(q),
            T::SqDrained(q) => AsyncEvent::SqDrained(q),
            T::QpLastWqeReached(q) => AsyncEvent::QpLastWqeReached(q),
            T::SrqLimitReached(s) => AsyncEvent::SrqLimitReached(s),
            T::SrqErr(s) => AsyncEvent::SrqErr(s),
        }
    }
}

/// A queue of events behind a counting eventfd that is readable exactly while an entry
/// is queued: the shape of a completion channel and of a context's `async_fd`. The fd
/// count always equals the number of entries; an entry whose object is gone is kept as a
/// tombstone (`None`) so that the count stays right, and readers skip it, as the kernel
/// drops the events of a destroyed CQ (`ib_uverbs_release_ucq`).
#[derive(Debug)]
pub(crate) struct EventQueue<T> {
    q: Mutex<VecDeque<Option<T>>>,
    fd: SemEventFd,
}

/// Events kept before the oldest are dropped (a process that never reads them must not
/// grow without bound).
const MAX_QUEUED: usize = 4096;

impl<T: Copy> EventQueue<T> {
    pub(crate) fn new() -> Result<Self, Error> {
        Ok(EventQueue {
            q: Mutex::new(VecDeque::with_capacity(16)),
            fd: SemEventFd::new()?,
        })
    }

    pub(crate) fn push(&self, e: T) {
        let mut q = self.q.lock();
        if q.len() >= MAX_QUEUED {
            // Keep the fd count equal to the queue length: take one for the dropped event
            // (the count is at least MAX_QUEUED - readers in flight, so this never waits).
            q.pop_front();
            self.fd.try_take();
        }
        q.push_back(Some(e));
        drop(q);
        self.fd.post();
    }

    /// The next event, waiting up to `timeout` (`None`: forever); `None` on timeout.
    pub(crate) fn get(&self, timeout: Option<Duration>) -> Option<T> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            match self.fd.take(left) {
                Ok(true) => {
                    if let Some(e) = self.q.lock().pop_front().flatten() {
                        return Some(e);
                    }
                }
                _ => return None,
            }
            if left.is_some_and(|l| l.is_zero()) {
                return None;
            }
        }
    }

    /// The next event as `read(2)` of the kernel's event file gives it
    /// (`ib_uverbs_event_read`): blocks unless the fd has `O_NONBLOCK`, which gives
    /// `EAGAIN` when nothing is queued; a signal interrupts the wait with `EINTR` (or
    /// restarts it, as the handler's `SA_RESTART` says).
    pub(crate) fn read(&self) -> std::io::Result<T> {
        loop {
            self.fd.read_one()?;
            if let Some(e) = self.q.lock().pop_front().flatten() {
                return Ok(e);
            }
        }
    }

    /// Turns the queued events `stale` matches into tombstones (their object is gone).
    pub(crate) fn retire(&self, stale: impl Fn(&T) -> bool) {
        for e in self.q.lock().iter_mut() {
            if e.as_ref().is_some_and(&stale) {
                *e = None;
            }
        }
    }

    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// Sets or clears the fd's `O_NONBLOCK` (see [`EventQueue::read`]).
    pub(crate) fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        self.fd.set_nonblocking(on)
    }
}

/// A context's async event queue (`ibv_context::async_fd`).
pub(crate) type AsyncQueue = EventQueue<AsyncEvent>;

impl AsyncEvent {
    /// Whether the event names the object `gone`.
    pub(crate) fn names(&self, gone: EventObject) -> bool {
        self.object() == gone
    }

    /// The object an event is about (its `ibv_async_event::element`).
    pub(crate) fn object(&self) -> EventObject {
        match *self {
            AsyncEvent::QpFatal(q)
            | AsyncEvent::QpReqErr(q)
            | AsyncEvent::QpAccessErr(q)
            | AsyncEvent::CommEst(q)
            | AsyncEvent::SqDrained(q)
            | AsyncEvent::QpLastWqeReached(q) => EventObject::Qp(q.value()),
            AsyncEvent::SrqLimitReached(s) | AsyncEvent::SrqErr(s) => EventObject::Srq(s.0),
            AsyncEvent::CqErr(c) => EventObject::Cq(c.0),
        }
    }
}

/// The object an async event is about; the device routes each event to the context that
/// created the object, as the kernel queues it on that uverbs file's async queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum EventObject {
    Qp(u32),
    Srq(u32),
    Cq(u32),
}

/// The state shared by a [`crate::CompChannel`] and the CQ rings attached to it: the
/// channel's queue of fired CQs and its acknowledgement counts.
#[derive(Debug)]
pub(crate) struct ChannelShared {
    pub(crate) events: EventQueue<CqId>,
    pub(crate) acked: std::sync::atomic::AtomicU64,
    pub(crate) delivered: std::sync::atomic::AtomicU64,
}

impl ChannelShared {
    pub(crate) fn new() -> Result<Self, Error> {
        Ok(ChannelShared {
            events: EventQueue::new()?,
            acked: std::sync::atomic::AtomicU64::new(0),
            delivered: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// A CQ of the channel completed while armed.
    pub(crate) fn fire(&self, cq: CqId) {
        self.events.push(cq);
    }
}
