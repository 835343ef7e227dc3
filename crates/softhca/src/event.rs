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

/// The device's async event queue: a mutex-protected queue plus a counting eventfd that
/// is readable exactly while events are queued (`ibv_context::async_fd`).
#[derive(Debug)]
pub(crate) struct AsyncQueue {
    q: Mutex<VecDeque<AsyncEvent>>,
    fd: SemEventFd,
}

/// Events kept before the oldest are dropped (a process that never reads them must not
/// grow without bound).
const MAX_QUEUED: usize = 4096;

impl AsyncQueue {
    pub(crate) fn new() -> Result<Self, Error> {
        Ok(AsyncQueue {
            q: Mutex::new(VecDeque::with_capacity(64)),
            fd: SemEventFd::new()?,
        })
    }

    pub(crate) fn push(&self, e: AsyncEvent) {
        let mut q = self.q.lock();
        if q.len() >= MAX_QUEUED {
            // Keep the fd count equal to the queue length: take one for the dropped event.
            q.pop_front();
            self.fd.try_take();
        }
        q.push_back(e);
        drop(q);
        self.fd.post();
    }

    pub(crate) fn get(&self, timeout: Option<Duration>) -> Option<AsyncEvent> {
        match self.fd.take(timeout) {
            Ok(true) => self.q.lock().pop_front(),
            _ => None,
        }
    }

    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}
