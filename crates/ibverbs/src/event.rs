//! Asynchronous events and event acknowledgement: `ibv_get_async_event` /
//! `ibv_ack_async_event` on the context's real `async_fd`, and the accounting that makes
//! `ibv_destroy_cq`/`_qp`/`_srq` wait for every event they reported to be acknowledged,
//! as libibverbs does with each object's `mutex`, `cond` and `*_events_completed`.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};

use softhca::AsyncEvent;

use crate::abi::*;
use crate::cq::CqBox;
use crate::device::CtxBox;
use crate::ffi::{guard_neg, guard_val, nonnull_mut};
use crate::qp::{QpBox, SrqBox};

/// Events handed to the program for one object (what the kernel reports as
/// `*_events_reported` at destroy time).
#[derive(Debug, Default)]
pub(crate) struct Reported(AtomicU32);

impl Reported {
    pub(crate) fn add(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    fn get(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }
}

/// The `mutex`/`cond` pair every libibverbs object carries for event acknowledgement.
pub(crate) struct AckLock {
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
}

impl AckLock {
    /// # Safety
    /// Both must point into a live object of ours whose fields were zero-initialised
    /// (`PTHREAD_*_INITIALIZER` on glibc) and stay valid for the lock's use.
    pub(crate) unsafe fn new(mutex: *mut pthread_mutex_t, cond: *mut pthread_cond_t) -> Self {
        // Our mirrors have glibc's sizes (checked against verbs.h at build time).
        AckLock {
            mutex: mutex.cast(),
            cond: cond.cast(),
        }
    }

    /// Adds `n` to `*field` and wakes a destroyer waiting for it (`ibv_ack_cq_events`,
    /// `ibv_ack_async_event`).
    ///
    /// # Safety
    /// `field` points into the same live object.
    pub(crate) unsafe fn ack(&self, field: *mut u32, n: u32) {
        // SAFETY: a valid, initialised mutex/cond of a live object (constructor contract);
        // `field` is only written under that mutex.
        unsafe {
            libc::pthread_mutex_lock(self.mutex);
            *field = (*field).wrapping_add(n);
            libc::pthread_cond_signal(self.cond);
            libc::pthread_mutex_unlock(self.mutex);
        }
    }

    /// Waits until every `(completed, reported)` pair is equal, as libibverbs'
    /// `ibv_cmd_destroy_*` does before freeing the object.
    ///
    /// # Safety
    /// The `completed` pointers point into the same live object.
    pub(crate) unsafe fn wait_acked(&self, pairs: &[(*const u32, &Reported)]) {
        // SAFETY: as in `ack`.
        unsafe {
            libc::pthread_mutex_lock(self.mutex);
            while pairs.iter().any(|&(done, rep)| *done != rep.get()) {
                libc::pthread_cond_wait(self.cond, self.mutex);
            }
            libc::pthread_mutex_unlock(self.mutex);
        }
    }
}

pub(crate) unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard_neg("ibv_get_async_event", || {
        // SAFETY: a context of ours and the caller's out-parameter (verb contract).
        let (c, out) = unsafe { (CtxBox::from_ctx(ctx)?, nonnull_mut(event)?) };
        loop {
            // A read(2) of async_fd in its own mode: blocks, or EAGAIN / EINTR.
            let e = c.ctx.read_async_event()?;
            let reg = c.registry.lock();
            let (element, ty) = match e {
                AsyncEvent::QpFatal(q) => (qp_element(&reg, q.value()), IBV_EVENT_QP_FATAL),
                AsyncEvent::QpReqErr(q) => (qp_element(&reg, q.value()), IBV_EVENT_QP_REQ_ERR),
                AsyncEvent::QpAccessErr(q) => {
                    (qp_element(&reg, q.value()), IBV_EVENT_QP_ACCESS_ERR)
                }
                AsyncEvent::CommEst(q) => (qp_element(&reg, q.value()), IBV_EVENT_COMM_EST),
                AsyncEvent::SqDrained(q) => (qp_element(&reg, q.value()), IBV_EVENT_SQ_DRAINED),
                AsyncEvent::QpLastWqeReached(q) => {
                    (qp_element(&reg, q.value()), IBV_EVENT_QP_LAST_WQE_REACHED)
                }
                AsyncEvent::SrqLimitReached(s) => {
                    (srq_element(&reg, s.0), IBV_EVENT_SRQ_LIMIT_REACHED)
                }
                AsyncEvent::SrqErr(s) => (srq_element(&reg, s.0), IBV_EVENT_SRQ_ERR),
                AsyncEvent::CqErr(q) => (
                    reg.cqs.get(&q.0).map(|&p| {
                        // SAFETY: registered CQs are alive.
                        unsafe { (*(p as *const CqBox)).async_reported.add() };
                        ibv_async_element {
                            cq: p as *mut ibv_cq,
                        }
                    }),
                    IBV_EVENT_CQ_ERR,
                ),
            };
            // An event for an object destroyed meanwhile names nothing: skip it.
            if let Some(element) = element {
                *out = ibv_async_event {
                    element,
                    event_type: ty,
                };
                return Ok(0);
            }
        }
    })
}

fn qp_element(reg: &crate::device::Registry, qpn: u32) -> Option<ibv_async_element> {
    reg.qps.get(&qpn).map(|&p| {
        // SAFETY: registered QPs are alive.
        unsafe { (*(p as *const QpBox)).reported.add() };
        ibv_async_element {
            qp: p as *mut ibv_qp,
        }
    })
}

fn srq_element(reg: &crate::device::Registry, id: u32) -> Option<ibv_async_element> {
    reg.srqs.get(&id).map(|&p| {
        // SAFETY: registered SRQs are alive.
        unsafe { (*(p as *const SrqBox)).reported.add() };
        ibv_async_element {
            srq: p as *mut ibv_srq,
        }
    })
}

pub(crate) unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard_val("ibv_ack_async_event", (), || {
        // SAFETY: the caller's event, as ibv_get_async_event filled it.
        let Some(ev) = (unsafe { event.as_ref() }) else {
            return;
        };
        // SAFETY: the element is the live object the event named (the program acks
        // before it destroys the object: destroy waits for this very ack).
        unsafe {
            match ev.event_type {
                IBV_EVENT_CQ_ERR => {
                    let cq = ev.element.cq;
                    if let Ok(b) = CqBox::from_ptr(cq) {
                        let lock = b.ack_lock();
                        lock.ack(&raw mut (*(cq as *mut CqBox)).cq.async_events_completed, 1);
                    }
                }
                IBV_EVENT_SRQ_LIMIT_REACHED | IBV_EVENT_SRQ_ERR => {
                    let srq = ev.element.srq;
                    if let Ok(b) = SrqBox::from_ptr(srq) {
                        b.ack_lock().ack(&raw mut (*srq).events_completed, 1);
                    }
                }
                IBV_EVENT_QP_FATAL
                | IBV_EVENT_QP_REQ_ERR
                | IBV_EVENT_QP_ACCESS_ERR
                | IBV_EVENT_COMM_EST
                | IBV_EVENT_SQ_DRAINED
                | IBV_EVENT_PATH_MIG
                | IBV_EVENT_PATH_MIG_ERR
                | IBV_EVENT_QP_LAST_WQE_REACHED => {
                    let qp = ev.element.qp;
                    if let Ok(b) = QpBox::from_ptr(qp) {
                        b.ack_lock().ack(&raw mut (*qp).events_completed, 1);
                    }
                }
                // Port and device events name no object.
                _ => {}
            }
        }
    })
}
