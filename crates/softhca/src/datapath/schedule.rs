//! Who runs the datapath, and when: the state the application threads and the datapath
//! thread share ([`DatapathShared`]), the application's polling windows, the doorbell
//! (`kick`), and the steps application threads run inline when they post or poll.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use softhca_io::{EventFd, RoceSocket};

use super::step::Stepper;
use super::{APP_WINDOW_NS, INLINE_STEPS};
use crate::config::PollMode;
use crate::ring::{DeliveryEnv, LockedEngine};
use crate::stats::Stats;
use crate::turnaround::Turnaround;
use crate::{CqId, Nanos};

/// State shared by the application-facing handles and the datapath thread.
pub(crate) struct DatapathShared {
    /// The engine, and where its completions and events go.
    pub engine: Mutex<LockedEngine>,
    /// When the device opened: time zero of the engine's clock.
    pub epoch: Instant,
    pub sockets: Vec<RoceSocket>,
    /// Multipath's extra source ports: (address, port, socket), send only.
    pub sport_sockets: Vec<(std::net::IpAddr, u16, RoceSocket)>,
    /// The multicast groups' sockets, receive only.
    pub mcast: super::McastSockets,
    pub doorbell: EventFd,
    /// Set by the datapath just before it sleeps in epoll: posters ring the doorbell only
    /// then, so a busy datapath costs posters no syscall.
    pub sleeping: AtomicBool,
    /// Set by posters: the engine has new work (the datapath must lock it even if no
    /// packet arrived). Dekker pair with `sleeping` (both SeqCst).
    pub pending: AtomicBool,
    pub stop: AtomicBool,
    pub stats: Stats,
    pub poll: PollMode,
    /// The datapath's buffers: whoever holds this runs a datapath step (the datapath
    /// thread, or an application thread polling a CQ).
    pub stepper: Mutex<Stepper>,
    /// Until when (engine clock) the datapath thread leaves the sockets to the
    /// application threads; 0 when an application is about to block.
    pub app_active_until: AtomicU64,
    /// Until when (engine clock) application polls open no window: the datapath thread
    /// serves the sockets (see [`DatapathShared::app_window`]); written by the datapath
    /// thread.
    pub serve_until: AtomicU64,
    /// The engine's next timer (engine clock; `Nanos::MAX`: none), as of the last step.
    pub deadline: AtomicU64,
    /// When the sleeping datapath thread wakes by itself (`Nanos::MAX`: only for I/O).
    pub thread_wake: AtomicU64,
    /// The datapath thread sleeps (or last slept) only to see whether a polling
    /// application still polls, on its doorbell alone.
    pub window_sleep: AtomicBool,
    /// Times each turnaround when `SOFTHCA_STATS` is set (`crate::turnaround`).
    pub turnaround: Option<Box<Turnaround>>,
    /// `SOFTHCA_STATS`: print the counters when the device closes, or at exit.
    pub print_stats: bool,
}

impl DeliveryEnv for DatapathShared {
    fn stats(&self) -> &Stats {
        &self.stats
    }

    fn now(&self) -> Nanos {
        DatapathShared::now(self)
    }
}

impl DatapathShared {
    /// Nanoseconds since the device was opened: the engine's clock.
    pub(crate) fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// How long an application thread's poll at `now` leaves the sockets to application
    /// threads: [`APP_WINDOW_NS`], or 0 while the application is known to wait for
    /// traffic without polling (see `takeover`).
    pub(crate) fn app_window(&self, now: Nanos) -> Nanos {
        if now < self.serve_until.load(Ordering::Relaxed) {
            0
        } else {
            APP_WINDOW_NS
        }
    }

    /// An application thread's step at `now`: opens its polling window (see
    /// [`DatapathShared::app_window`]); false when the window is shut, the application
    /// being known not to poll for what it waits for.
    pub(crate) fn open_app_window(&self, now: Nanos) -> bool {
        let window = self.app_window(now);
        self.app_active_until.store(now + window, Ordering::Relaxed);
        window > 0
    }

    /// Whether the datapath thread serves the sockets for an application that spins on
    /// memory (see `takeover`).
    pub(crate) fn serving(&self, now: Nanos) -> bool {
        now < self.serve_until.load(Ordering::Relaxed)
    }

    /// Whether an application thread progressed the datapath within the last window.
    pub(crate) fn app_polls(&self) -> bool {
        self.now() < self.app_active_until.load(Ordering::Relaxed)
    }

    /// Posts with `post` under the engine lock, and transmits what it made ready at once
    /// in the same lock hold (as a NIC starts sending at its doorbell) unless another
    /// thread is in a datapath step: that one then sees `pending`. The datapath thread
    /// is woken only when nobody polls and it may sleep.
    pub(crate) fn post<R>(&self, post: impl FnOnce(&mut LockedEngine, Nanos) -> R) -> R {
        if let Some(mut p) = self.stepper.try_lock() {
            let (r, more) = p.transmit_with(self, true, post);
            self.after_transmit(p, more);
            return r;
        }
        let r = {
            let mut core = self.engine.lock();
            let r = post(&mut core, self.now());
            core.deliver(self);
            r
        };
        self.posted();
        r
    }

    /// Work was posted (see [`DatapathShared::post`]).
    pub(crate) fn posted(&self) {
        self.pending.store(true, Ordering::SeqCst);
        if let Some(mut p) = self.stepper.try_lock() {
            let more = p.transmit(self);
            self.after_transmit(p, more);
        } else if !self.app_polls() {
            self.kick();
        }
    }

    /// After a transmit step that filled every buffer (`more`), runs further ones, up to
    /// [`INLINE_STEPS`] in all, then hands what is left to the datapath thread.
    fn after_transmit(&self, mut p: parking_lot::MutexGuard<'_, Stepper>, mut more: bool) {
        for _ in 1..INLINE_STEPS {
            if !more {
                break;
            }
            more = p.transmit(self);
        }
        drop(p);
        if more {
            self.pending.store(true, Ordering::SeqCst);
            self.kick();
        } else {
            self.wake_for_timer();
        }
    }

    /// A timer earlier than the sleeping datapath thread's wake-up: wake it (the
    /// application may stop polling at any time and never come back for it). Not when
    /// the thread sleeps only to see whether the application still polls:
    /// the application's own steps run the timer while it polls, the thread's wake-up
    /// when it stops. Why: a QP's armed timer (the tail-loss probe's, a millisecond
    /// after each send, fires early and re-arms as the probe moves on) often falls
    /// inside the window, and a ping-pong rang the doorbell at nearly every post; the
    /// woken thread raced the application for each answer, and the round trip stayed
    /// 5-10 times longer for as long as the test ran.
    fn wake_for_timer(&self) {
        let wake = self.thread_wake.load(Ordering::SeqCst);
        if self.deadline.load(Ordering::Relaxed) < wake && !self.window_sleep.load(Ordering::SeqCst)
        {
            self.kick();
        }
    }

    /// An application thread polls a CQ: it will run the datapath itself (even when the
    /// datapath thread holds it right now, that thread hands the sockets back after its
    /// step).
    pub(crate) fn app_polling(&self) {
        let now = self.now();
        self.app_active_until
            .store(now + self.app_window(now), Ordering::Relaxed);
    }

    /// Called by an application thread that polls and finds its CQ empty: runs datapath
    /// steps itself unless another thread is in one. Returns whether packets moved.
    /// `polled`: the CQ the thread polls (its completions come first, see
    /// `Stepper::step`).
    pub(crate) fn progress_inline(&self, polled: CqId) -> bool {
        let Some(mut p) = self.stepper.try_lock() else {
            self.app_polling();
            return false;
        };
        let mut any = false;
        for _ in 0..INLINE_STEPS {
            let step = p.step(self, Some(polled));
            any |= step.active;
            // More to send: the step left `pending` set for the next one.
            if !step.more_tx {
                break;
            }
        }
        drop(p);
        self.wake_for_timer();
        any
    }

    /// Sends packets held for an application's answer now (see `Stepper::step`).
    pub(crate) fn flush_held(&self) {
        self.stepper.lock().flush_held(self);
    }

    /// Waits for a step under way on another thread, then builds and sends what posted
    /// work made ready: a UC or UD send posted before this call has completed after it
    /// (a control verb that counts completions, `ibv_resize_cq`, sees them as the
    /// kernel's rxe, whose post runs the requester, would).
    pub(crate) fn settle(&self) {
        let mut p = self.stepper.lock();
        let more = p.transmit(self);
        // Held send completions too (see `LockedEngine::hold_sends`).
        self.engine.lock().deliver(self);
        self.after_transmit(p, more);
    }

    /// An application thread is about to block (arming a CQ, a blocking wait): the
    /// datapath thread takes the sockets back at once.
    pub(crate) fn app_will_block(&self) {
        if self.app_active_until.swap(0, Ordering::SeqCst) != 0 {
            self.kick();
        }
    }

    /// Tells the datapath there is new work; rings the doorbell only if it sleeps.
    pub(crate) fn kick(&self) {
        self.pending.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            Stats::add(&self.stats.doorbells, 1);
            self.doorbell.notify();
        }
    }
}

/// A step held ACKs while the datapath thread serves an application spinning on memory:
/// make sure the datapath thread wakes by the end of the hold.
pub(super) fn wake_by_hold_end(shared: &DatapathShared, now: Nanos) {
    let until = now + super::SERVE_HOLD_NS;
    shared.deadline.fetch_min(until, Ordering::SeqCst);
    if shared.sleeping.load(Ordering::SeqCst) && shared.thread_wake.load(Ordering::SeqCst) > until {
        Stats::add(&shared.stats.doorbells, 1);
        shared.doorbell.notify();
    }
}

/// A step held packets for the polling application: make sure the datapath thread wakes
/// by the end of the application's polling window, to send them if the application
/// goes quiet (no post, no poll, no blocking wait). Without this, a datapath thread
/// asleep in a long wait from before the application started polling sleeps on (our
/// `recvmmsg` drained the sockets, so epoll does not wake it), and the held packets
/// leave only when the peer retransmits (test `held_ack.rs`).
///
/// Dekker with `DatapathThread::sleep`: the window is published with a read-modify-write
/// (SeqCst) before `sleeping` is read, and the thread sets `sleeping` before it reads
/// the window; so either it sees the window and sleeps only until its end (or the
/// stretch beyond it, `APP_WINDOW_STRETCH_MAX_NS`), or we see it asleep and ring. A
/// thread asleep for a window is not rung: that would be a wake-up per held step.
/// Runs once per held step, not per poll.
pub(super) fn wake_by_window_end(shared: &DatapathShared, now: Nanos) {
    let until = now + shared.app_window(now);
    shared.app_active_until.fetch_max(until, Ordering::SeqCst);
    if shared.sleeping.load(Ordering::SeqCst)
        && !shared.window_sleep.load(Ordering::SeqCst)
        && shared.thread_wake.load(Ordering::SeqCst) > until
    {
        Stats::add(&shared.stats.doorbells, 1);
        shared.doorbell.notify();
    }
}
