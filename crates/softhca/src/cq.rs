//! Completion queues and completion channels.
//!
//! A CQ is a bounded ring of [`Completion`]s that the datapath fills and the application
//! drains: [`Cq::poll`] takes only the ring's own lock, never the engine's, so polling
//! costs no more than a hardware CQ poll plus an uncontended mutex.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::context::Context;
use crate::error::Error;
use crate::event::{ChannelShared, EventObject};
use crate::ring::{pop_into, CqRing, ARM_NEXT, ARM_SOLICITED};
use crate::{Completion, CqId};

/// Which CQ a completion channel event is about: the [`CqId`] of the [`Cq`]
/// (compare with [`Cq::id`]).
pub type CqHandleId = CqId;

/// A completion queue (`ibv_cq`). Dropping it destroys the CQ; QPs that use it keep it
/// alive, so it is never destroyed under them.
#[derive(Debug)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

#[derive(Debug)]
pub(crate) struct CqInner {
    pub(crate) ctx: Arc<Context>,
    pub(crate) ring: Arc<CqRing>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let id = self.ring.id;
        // The kernel drops a destroyed CQ's pending events (`ib_uverbs_release_ucq`).
        if let Some(ch) = &self.ring.channel {
            ch.events.retire(|&c| c == id);
        }
        self.ring.events.retire(|e| e.names(EventObject::Cq(id.0)));
        self.ctx.destroy_cq(id);
    }
}

impl Cq {
    pub(crate) fn new(ctx: Arc<Context>, ring: Arc<CqRing>) -> Cq {
        Cq {
            inner: Arc::new(CqInner { ctx, ring }),
        }
    }

    /// The CQ's identifier (what [`CompChannel::get_event`] returns for it).
    pub fn id(&self) -> CqId {
        self.inner.ring.id
    }

    /// The number of completions the CQ holds (`cqe`).
    pub fn capacity(&self) -> usize {
        self.inner.ring.cap.load(Ordering::Relaxed)
    }

    /// Resizes the CQ to hold `cqe` completions (`ibv_resize_cq`), checked as rxe does
    /// (`rxe_cq_chk_attr`): 1 ..= [`crate::MAX_CQE`], and not fewer than it holds now.
    /// Completions already in the CQ are kept.
    pub fn resize(&self, cqe: u32) -> Result<(), Error> {
        if cqe == 0 || cqe > crate::MAX_CQE {
            return Err(Error::InvalidArgument("cqe must be 1..=4194303"));
        }
        // Completions of work posted before this call count.
        self.inner.ctx.shared().settle();
        let ring = &self.inner.ring;
        let q = ring.q.lock();
        if (cqe as usize) < q.len() {
            return Err(Error::InvalidArgument(
                "cqe smaller than the completions the CQ holds",
            ));
        }
        ring.cap.store(cqe as usize, Ordering::Relaxed);
        Ok(())
    }

    /// Moves up to `out.len()` completions into `out`, oldest first; returns how many
    /// (`ibv_poll_cq`). Never blocks on the datapath: only the ring's own lock is taken.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        let n = self.poll_now(out);
        let shared = self.inner.ctx.shared();
        if let (true, Some(timer)) = (n > 0, &shared.turnaround) {
            timer.taken(shared.now());
        }
        n
    }

    fn poll_now(&self, out: &mut [Completion]) -> usize {
        if out.is_empty() {
            return 0;
        }
        let shared = self.inner.ctx.shared();
        let n = self.pop(out);
        if n > 0 {
            // This thread polls: work it posts is run at its next empty poll
            // (`datapath`). (An empty poll says so in its inline step, with the clock
            // reading the step takes anyway: one clock read less per empty poll.)
            shared.app_polling();
            return n;
        }
        // Empty: run the datapath here rather than wait for its thread.
        if shared.progress_inline(self.inner.ring.id) {
            return self.pop(out);
        }
        let n = self.pop(out);
        if n == 0 && shared.stepper.is_locked() {
            // The datapath thread is in a step: an application spinning on an empty CQ
            // (as ibv_rc_pingpong and perftest do) must not starve it on a small machine
            // (with 2 cores and two spinning processes it ran only at scheduler ticks).
            std::thread::yield_now();
        }
        n
    }

    fn pop(&self, out: &mut [Completion]) -> usize {
        let n = {
            let mut q = self.inner.ring.q.lock();
            pop_into(&mut q, out)
        };
        if n > 0 {
            self.inner.ring.overflowed.store(false, Ordering::Relaxed);
        }
        n
    }

    /// Arms the CQ (`ibv_req_notify_cq`): the next completion added (or, with
    /// `solicited_only`, the next solicited or unsuccessful one) fires the completion
    /// channel once. Completions already in the CQ do not fire it, so poll after arming.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), Error> {
        if self.inner.ring.channel.is_none() {
            return Err(Error::InvalidArgument(
                "req_notify on a CQ without a completion channel",
            ));
        }
        let want = if solicited_only {
            ARM_SOLICITED
        } else {
            ARM_NEXT
        };
        // An existing "next" arm is stronger than a solicited one; keep it.
        let _ = self.inner.ring.arm.fetch_max(want, Ordering::AcqRel);
        // Arming precedes blocking on the channel: the datapath thread must run things.
        self.inner.ctx.shared().app_will_block();
        Ok(())
    }

    /// Convenience for applications and tests: waits up to `timeout` until at least one
    /// completion is there, then polls into `out`. Spins briefly, then sleeps on the
    /// ring's condition variable (no channel needed). Returns 0 on timeout.
    pub fn wait(&self, out: &mut [Completion], timeout: Duration) -> Result<usize, Error> {
        let start = Instant::now();
        let spin = Duration::from_micros(20).min(timeout);
        loop {
            let n = self.poll(out);
            if n > 0 || out.is_empty() {
                return Ok(n);
            }
            if start.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        let deadline = start + timeout;
        let ring = &self.inner.ring;
        self.inner.ctx.shared().app_will_block();
        ring.waiters.fetch_add(1, Ordering::SeqCst);
        let mut q = ring.q.lock();
        let n = loop {
            let n = pop_into(&mut q, out);
            if n > 0 {
                break n;
            }
            if ring.cv.wait_until(&mut q, deadline).timed_out() {
                break pop_into(&mut q, out);
            }
        };
        drop(q);
        ring.waiters.fetch_sub(1, Ordering::SeqCst);
        Ok(n)
    }
}

/// A completion channel (`ibv_comp_channel`): a real file descriptor, readable while a
/// CQ notification is pending, usable with poll/epoll/select.
#[derive(Debug, Clone)]
pub struct CompChannel {
    pub(crate) inner: Arc<ChannelShared>,
    _ctx: Arc<Context>,
}

impl CompChannel {
    pub(crate) fn new(ctx: Arc<Context>) -> Result<CompChannel, Error> {
        Ok(CompChannel {
            inner: Arc::new(ChannelShared::new()?),
            _ctx: ctx,
        })
    }

    /// The file descriptor: readable while [`CompChannel::get_event`] would return at once.
    pub fn fd(&self) -> RawFd {
        self.inner.events.fd()
    }

    /// Sets or clears `O_NONBLOCK` on [`CompChannel::fd`] (it starts non-blocking; the C
    /// library makes it blocking, as the kernel's).
    pub fn set_nonblocking(&self, on: bool) -> Result<(), Error> {
        self.inner
            .events
            .set_nonblocking(on)
            .map_err(|source| Error::Os {
                what: "fcntl(comp_channel)",
                source,
            })
    }

    /// Takes the next CQ notification as rdma-core's `ibv_get_cq_event` does, with a
    /// `read(2)` of [`CompChannel::fd`] in the fd's own blocking mode: `EAGAIN`
    /// (`WouldBlock`) with `O_NONBLOCK` and nothing pending, `EINTR` (`Interrupted`) on a
    /// signal.
    pub fn read_event(&self) -> std::io::Result<CqHandleId> {
        self._ctx.shared().app_will_block();
        let cq = self.inner.events.read()?;
        self.inner.delivered.fetch_add(1, Ordering::Relaxed);
        Ok(cq)
    }

    /// Takes the next CQ notification (`ibv_get_cq_event`), waiting up to `timeout`
    /// (`None`: forever). `Ok(None)` on timeout. Re-arm the CQ with
    /// [`Cq::req_notify`] to get the next one.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CqHandleId>, Error> {
        self._ctx.shared().app_will_block();
        let cq = self.inner.events.get(timeout);
        if cq.is_some() {
            self.inner.delivered.fetch_add(1, Ordering::Relaxed);
        }
        Ok(cq)
    }

    /// Acknowledges `n` events (`ibv_ack_cq_events`). In Rust nothing waits on the count
    /// (a CQ is only destroyed once no handle refers to it); it is kept for the C layer.
    pub fn ack_events(&self, n: u32) {
        self.inner.acked.fetch_add(u64::from(n), Ordering::Relaxed);
    }

    /// Events returned by [`CompChannel::get_event`] and not yet acknowledged.
    pub fn unacked_events(&self) -> u64 {
        self.inner
            .delivered
            .load(Ordering::Relaxed)
            .saturating_sub(self.inner.acked.load(Ordering::Relaxed))
    }
}
