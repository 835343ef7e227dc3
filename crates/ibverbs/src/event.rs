//! Asynchronous events: `ibv_get_async_event` / `ibv_ack_async_event` on the context's
//! real `async_fd`.

use std::ffi::c_int;

use softhca::AsyncEvent;

use crate::abi::*;
use crate::device::CtxBox;
use crate::errno::Errno;
use crate::ffi::{guard_neg, guard_val, nonnull_mut};

pub(crate) unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard_neg("ibv_get_async_event", || {
        // SAFETY: a context of ours and the caller's out-parameter (verb contract).
        let (c, out) = unsafe { (CtxBox::from_ctx(ctx)?, nonnull_mut(event)?) };
        loop {
            // Blocks until an event is queued (the fd is readable), as libibverbs does.
            let Some(e) = c.ctx.get_async_event(None) else {
                continue;
            };
            let reg = c.registry.lock();
            let qp = |n: u32| {
                reg.qps.get(&n).map(|&p| ibv_async_element {
                    qp: p as *mut ibv_qp,
                })
            };
            let (element, ty) = match e {
                AsyncEvent::QpFatal(q) => (qp(q.value()), IBV_EVENT_QP_FATAL),
                AsyncEvent::QpReqErr(q) => (qp(q.value()), IBV_EVENT_QP_REQ_ERR),
                AsyncEvent::QpAccessErr(q) => (qp(q.value()), IBV_EVENT_QP_ACCESS_ERR),
                AsyncEvent::CommEst(q) => (qp(q.value()), IBV_EVENT_COMM_EST),
                AsyncEvent::SqDrained(q) => (qp(q.value()), IBV_EVENT_SQ_DRAINED),
                AsyncEvent::QpLastWqeReached(q) => (qp(q.value()), IBV_EVENT_QP_LAST_WQE_REACHED),
                AsyncEvent::SrqLimitReached(s) => (
                    reg.srqs.get(&s.0).map(|&p| ibv_async_element {
                        srq: p as *mut ibv_srq,
                    }),
                    IBV_EVENT_SRQ_LIMIT_REACHED,
                ),
                AsyncEvent::SrqErr(s) => (
                    reg.srqs.get(&s.0).map(|&p| ibv_async_element {
                        srq: p as *mut ibv_srq,
                    }),
                    IBV_EVENT_SRQ_ERR,
                ),
                AsyncEvent::CqErr(q) => (
                    reg.cqs.get(&q.0).map(|&p| ibv_async_element {
                        cq: p as *mut ibv_cq,
                    }),
                    IBV_EVENT_CQ_ERR,
                ),
            };
            // An event for an object already destroyed names nothing: skip it.
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

pub(crate) unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard_val("ibv_ack_async_event", (), || {
        // Nothing waits on acknowledgements: softhca objects live while referenced.
        let _ = Errno::INVAL;
        let _ = event;
    })
}
