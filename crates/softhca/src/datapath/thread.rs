//! The device's datapath thread: steps when no application thread does, and sleeps in
//! epoll on its doorbell and sockets otherwise ([`DatapathThread`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca_io::{self as sio, Events, Poller};

use super::mcast::Picked;
use super::schedule::DatapathShared;
use super::takeover::Takeover;
use crate::config::PollMode;
use crate::error::Error;
use crate::stats::Stats;
use crate::Nanos;

/// Token of the doorbell in the poller (sockets use their index).
const DOORBELL: u64 = u64::MAX;
/// Token of the multicast group sockets in the poller.
const MCAST: u64 = u64::MAX - 1;
/// The scheduler slice the datapath thread asks for (Linux's shortest is 100 µs).
const DP_SLICE_NS: u64 = 100_000;
/// The nice value the datapath thread asks for (weight about 3× the default's). With two
/// processes spinning on memory on two cores (perftest's `ib_write_lat -c UC`, qperf's
/// `rc_rdma_write_poll_lat`), only this thread can place the peer's WRITE, and at nice 0
/// its wake-ups waited about 2 ms for a CPU.
const DP_NICE: i32 = -5;

/// The datapath thread's own state: its poller.
pub(crate) struct DatapathThread {
    shared: Arc<DatapathShared>,
    /// The doorbell, and the sockets while `watching_sockets`.
    poller: Poller,
    /// The sockets are in `poller`. Not while an application thread progresses them
    /// itself: an epoll registration is a callback that runs for every datagram the
    /// socket receives, in the sender's system call on loopback, and nobody waits on
    /// it then. Leaving and re-entering costs one `epoll_ctl` per socket each time the
    /// application starts or stops polling; the re-entry reports data already queued
    /// (epoll checks readiness when a file is added).
    watching_sockets: bool,
    /// The multicast group sockets, in `poller` with the others.
    mcast: Picked,
    events: Events,
}

/// What the loop of [`DatapathThread::run`] carries from one turn to the next.
struct Turns {
    last_active: Instant,
    iterations: u64,
    /// The application's polling window this thread last slept out (0: none).
    slept_out: Nanos,
    /// How far beyond the application's window end this thread sleeps (see
    /// `APP_WINDOW_STRETCH_MAX_NS`); 0 until it finds a window extended.
    stretch: Nanos,
    takeover: Takeover,
}

impl DatapathThread {
    pub(crate) fn new(shared: Arc<DatapathShared>) -> Result<DatapathThread, Error> {
        let poller = Poller::new()?;
        for (i, s) in shared.sockets.iter().enumerate() {
            poller.add(s.as_raw_fd(), i as u64)?;
        }
        poller.add(shared.doorbell.as_raw_fd(), DOORBELL)?;
        Ok(DatapathThread {
            poller,
            watching_sockets: true,
            mcast: Picked::default(),
            events: Events::with_capacity(shared.sockets.len() + 1),
            shared,
        })
    }

    /// Picks up the multicast group sockets again if they changed: in the poller
    /// while it watches the sockets.
    fn refresh_mcast(&mut self) {
        let Some(gone) = self.mcast.refresh(&self.shared) else {
            return;
        };
        if self.watching_sockets {
            for s in &gone {
                let _ = self.poller.delete(s.as_raw_fd());
            }
            for s in &self.mcast.sockets {
                if let Err(e) = self.poller.add(s.as_raw_fd(), MCAST) {
                    tracing::warn!("datapath poller: {e}");
                }
            }
        }
    }

    /// Puts the sockets into the poller, or takes them out (see `watching_sockets`).
    fn watch_sockets(&mut self, on: bool) {
        if on == self.watching_sockets {
            return;
        }
        let unicast = self.shared.sockets.iter().enumerate();
        let tokens = unicast.map(|(i, s)| (s.as_raw_fd(), i as u64));
        let mcast = self.mcast.sockets.iter().map(|s| (s.as_raw_fd(), MCAST));
        for (fd, token) in tokens.chain(mcast) {
            let r = if on {
                self.poller.add(fd, token)
            } else {
                self.poller.delete(fd)
            };
            if let Err(e) = r {
                // Only resource exhaustion makes epoll_ctl fail here; the sockets are
                // then polled when the doorbell or a deadline wakes the thread.
                tracing::warn!("datapath poller: {e}");
            }
        }
        self.watching_sockets = on;
    }

    pub(crate) fn run(mut self, cpu: Option<usize>) {
        if let Some(cpu) = cpu {
            if let Err(e) = sio::pin_current_thread(cpu) {
                tracing::warn!("cannot pin the datapath thread to CPU {cpu}: {e}");
            }
        }
        // The thread sleeps most of the time and must run soon after it wakes: with the
        // default slice, on two cores busy with spinning applications, it waited for a
        // slice to end.
        if let Err(e) = sio::request_short_slice(DP_SLICE_NS) {
            tracing::debug!("no short scheduler slice for the datapath thread: {e}");
        }
        // Where allowed (root): woken by a packet while the application threads spin
        // on memory, it must run now (`request_nice` says why the slice is not enough).
        if let Err(e) = sio::request_nice(DP_NICE) {
            tracing::debug!("datapath thread keeps its nice value: {e}");
        }
        let shared = self.shared.clone();
        let mut turns = Turns {
            last_active: Instant::now(),
            iterations: 0,
            slept_out: 0,
            stretch: 0,
            takeover: Takeover::default(),
        };
        while !shared.stop.load(Ordering::Relaxed) {
            turns.iterations += 1;
            let app_until = shared.app_active_until.load(Ordering::Relaxed);
            let now = shared.now();
            let app_polls = now < app_until;
            if !app_polls && self.step(&mut turns, app_until, now) {
                continue;
            }
            self.idle(&mut turns, app_polls, app_until, now);
        }
        Stats::add(&shared.stats.loop_iterations, turns.iterations);
    }

    /// A step while no application polls; returns whether to loop again at once (the
    /// step was active, or an application thread is in one).
    fn step(&mut self, turns: &mut Turns, app_until: Nanos, now: Nanos) -> bool {
        let shared = &*self.shared;
        // The window ran out with no poll since (a poll moves `app_until`, an
        // application about to block sets it to 0).
        let expired = turns.slept_out != 0 && app_until == turns.slept_out;
        turns.slept_out = 0;
        turns.stretch = 0;
        let Some(step) = shared.stepper.try_lock().map(|mut s| s.step(shared, None)) else {
            // An application thread is in a step right now.
            std::thread::yield_now();
            return true;
        };
        if expired && step.received {
            Stats::add(&shared.stats.app_strandings, 1);
            if let Some(until) = turns.takeover.stranded(now) {
                Stats::add(&shared.stats.app_served, 1);
                shared.serve_until.store(until, Ordering::Relaxed);
            }
        }
        if step.active {
            turns.last_active = Instant::now();
        }
        // Serving an application that spins on memory, a step that holds the ACKs of
        // what it placed sleeps until the answer (the application's post sends them),
        // a packet or the hold's end: looping at once sent them a few microseconds
        // later, alone, and their arrival woke the peer's datapath thread, which took
        // the CPU its spinning application needed.
        if step.held && shared.serving(now) {
            return false;
        }
        step.active
    }

    /// Nothing to do right now: sleep, spin or yield, as the poll mode says.
    fn idle(&mut self, turns: &mut Turns, app_polls: bool, app_until: Nanos, now: Nanos) {
        let shared = Arc::clone(&self.shared);
        let sleep = app_polls
            || match shared.poll {
                PollMode::Busy => false,
                // Not while serving an application that spins elsewhere (see
                // `takeover`): its thread holds a CPU already, and on two cores this
                // thread's spin took the CPU the peer needed.
                PollMode::Adaptive { spin_us } => {
                    now < shared.serve_until.load(Ordering::Relaxed)
                        || turns.last_active.elapsed() >= Duration::from_micros(u64::from(spin_us))
                }
                PollMode::Blocking => true,
            };
        if sleep {
            let iterations = std::mem::take(&mut turns.iterations);
            Stats::add(&shared.stats.loop_iterations, iterations);
            if app_polls {
                // The application runs sockets and timers; look again when its window
                // ends (or when it says it will block: the doorbell), later each time
                // it has polled through the last one.
                turns.stretch = if turns.slept_out == 0 {
                    0
                } else {
                    (turns.stretch * 2)
                        .clamp(super::APP_WINDOW_NS, super::APP_WINDOW_STRETCH_MAX_NS)
                };
                turns.slept_out = app_until;
                self.sleep(Some(app_until + turns.stretch), true);
            } else {
                let d = shared.deadline.load(Ordering::Relaxed);
                self.sleep((d != Nanos::MAX).then_some(d), false);
                turns.last_active = Instant::now();
            }
        } else if shared.poll == PollMode::Busy {
            std::hint::spin_loop();
        } else {
            // Adaptive: spin, but let a thread waiting for this CPU have it. The
            // application threads this datapath wakes (a completion channel, a blocking
            // CQ wait) need a CPU right then, and on two cores the other one often spins
            // too (the peer's datapath thread, on loopback).
            std::thread::yield_now();
        }
    }

    /// Sleeps in epoll until a packet (unless the application polls the sockets), a
    /// doorbell or `deadline`.
    fn sleep(&mut self, deadline: Option<Nanos>, doorbell_only: bool) {
        let shared = Arc::clone(&self.shared);
        shared
            .thread_wake
            .store(deadline.unwrap_or(Nanos::MAX), Ordering::SeqCst);
        shared.window_sleep.store(doorbell_only, Ordering::SeqCst);
        shared.sleeping.store(true, Ordering::SeqCst);
        // Dekker with `DatapathShared::kick`: a post after our last `pending.swap` either
        // sees `sleeping` and rings, or we see `pending` here. (While the application
        // polls, pending work is its own to run.)
        let woken = if doorbell_only {
            // Cleared by an application about to block (`DatapathShared::app_will_block`).
            shared.app_active_until.load(Ordering::SeqCst) == 0
        } else {
            // An application that started polling since the loop looked: go back and
            // sleep only until its window ends (see `wake_by_window_end`).
            shared.pending.load(Ordering::SeqCst)
                || shared.app_active_until.load(Ordering::SeqCst) > shared.now()
        };
        if woken || shared.stop.load(Ordering::SeqCst) {
            shared.sleeping.store(false, Ordering::SeqCst);
            return;
        }
        let timeout = deadline.map(|d| Duration::from_nanos(d.saturating_sub(shared.now())));
        Stats::add(&shared.stats.sleeps, 1);
        self.refresh_mcast();
        self.watch_sockets(!doorbell_only);
        if let Err(e) = self.poller.wait(&mut self.events, timeout) {
            tracing::warn!("epoll_wait: {e}");
            std::thread::sleep(Duration::from_millis(1));
        }
        shared.sleeping.store(false, Ordering::SeqCst);
        if self.events.iter().any(|e| e.token == DOORBELL) {
            shared.doorbell.drain();
        }
    }
}
