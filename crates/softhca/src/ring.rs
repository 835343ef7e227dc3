//! Where the engine's output goes: completions into the CQ rings, async events to the
//! context that owns their object ([`LockedEngine::deliver`]); and the CQ ring itself
//! ([`CqRing`]), filled by the datapath and drained by [`crate::Cq`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex, MutexGuard};
use rustc_hash::FxHashMap as HashMap;
use softhca_transport::Engine;

use crate::event::{AsyncEvent, AsyncQueue, ChannelShared, EventObject};
use crate::stats::Stats;
use crate::{Completion, CqId, Nanos, WcStatus};

/// What delivery needs from the device around the engine: its counters and its clock
/// (read only when a CQ overrun moves a QP to ERR).
pub(crate) trait DeliveryEnv {
    fn stats(&self) -> &Stats;
    fn now(&self) -> Nanos;
}

/// Everything behind the one engine lock: the engine and the CQ rings it feeds (so the
/// ring table needs no lock of its own).
pub(crate) struct LockedEngine {
    pub engine: Engine,
    pub cqs: HashMap<u32, Arc<CqRing>>,
    /// The async event queue of the context that created each QP and SRQ: events go to
    /// that context only, as the kernel queues them on the creating uverbs file.
    pub owners: HashMap<EventObject, Weak<AsyncQueue>>,
    /// UC WRITE completions kept out of their CQs for a while (see
    /// [`LockedEngine::hold_sends`]); every delivery but a step's puts them first.
    held_sends: Vec<EngineCompletion>,
    /// When they go in at the latest.
    held_sends_until: Nanos,
}

// SAFETY: the engine holds raw pointers into registered memory (the MR table). They are
// only dereferenced by engine code running under `DatapathShared::engine`'s mutex, and the memory
// stays valid until deregistered under that same mutex (see `crate::mr`), so moving the
// engine between threads is sound. Everything else in it is Send already.
unsafe impl Send for LockedEngine {}

/// A completion as the engine hands it out, with the CQ it goes to.
pub(crate) type EngineCompletion = (CqId, softhca_transport::Completion);

/// A run of completions for one CQ: its id, ring, held ring lock and what was pushed.
type RingRun<'a> = (
    CqId,
    &'a Arc<CqRing>,
    parking_lot::MutexGuard<'a, std::collections::VecDeque<crate::Completion>>,
    PushRun,
);

impl LockedEngine {
    pub(crate) fn new(
        engine: Engine,
        cqs: HashMap<u32, Arc<CqRing>>,
        owners: HashMap<EventObject, Weak<AsyncQueue>>,
    ) -> LockedEngine {
        LockedEngine {
            engine,
            cqs,
            owners,
            held_sends: Vec::new(),
            held_sends_until: 0,
        }
    }

    /// Keeps the completions of UC RDMA WRITEs an application just posted out of their
    /// CQs until the next step that receives a packet, or `until`.
    ///
    /// Why: an application served while it spins on memory (see `datapath::takeover`)
    /// polls its send CQ right after each post, then watches its buffer for the peer's
    /// answer, calling nothing (`ib_write_lat -c UC`). On RC its poll waits for the
    /// ACK, which comes with the answer, so its own step places the answer; a UC send
    /// completes at once, and every answer waited for the datapath thread's wake-up. A
    /// completion reported later is still a valid one (verbs set no deadline), and
    /// completions stay in order within each QP: whatever else is delivered first
    /// belongs to another QP, as a step that receives releases these before the packets'
    /// own completions.
    pub(crate) fn hold_sends(&mut self, sends: &mut Vec<EngineCompletion>, until: Nanos) {
        if self.held_sends.is_empty() {
            self.held_sends_until = until;
        }
        self.held_sends.append(sends);
    }

    /// When held send completions go in at the latest, if any are held.
    pub(crate) fn held_sends_until(&self) -> Option<Nanos> {
        (!self.held_sends.is_empty()).then_some(self.held_sends_until)
    }

    /// [`LockedEngine::deliver`], except that held send completions stay held.
    pub(crate) fn deliver_holding(&mut self, shared: &impl DeliveryEnv) {
        let held = std::mem::take(&mut self.held_sends);
        self.deliver(shared);
        self.held_sends = held;
    }

    /// Moves every completion the engine has into its CQ ring and every async event into
    /// the event queue. Called with the engine lock held, once per datapath batch and
    /// after each control/post call. Completions for the same CQ in a row share one ring
    /// lock and one notification.
    pub(crate) fn deliver(&mut self, shared: &impl DeliveryEnv) {
        self.deliver_after(shared, &mut Vec::new());
    }

    /// [`LockedEngine::deliver`], the completions in `earlier` (taken from the engine before,
    /// see `Stepper::after_send`) first, in their order.
    pub(crate) fn deliver_after(
        &mut self,
        shared: &impl DeliveryEnv,
        earlier: &mut Vec<EngineCompletion>,
    ) {
        if !self.held_sends.is_empty() {
            let mut held = std::mem::take(&mut self.held_sends);
            held.append(earlier);
            std::mem::swap(&mut held, earlier);
        }
        if self.deliver_once(shared, earlier) {
            // The flush completions of the QPs just moved to ERR.
            self.deliver(shared);
        }
    }

    /// One pass of [`LockedEngine::deliver_after`]; true when a CQ overrun moved a QP to ERR.
    fn deliver_once(
        &mut self,
        shared: &impl DeliveryEnv,
        earlier: &mut Vec<EngineCompletion>,
    ) -> bool {
        let LockedEngine {
            engine,
            cqs,
            owners,
            ..
        } = self;
        let mut run: Option<RingRun<'_>> = None;
        // QPs whose completion was lost to a full CQ (rare; usually empty).
        let mut overrun: Vec<u32> = Vec::new();
        let mut earlier = earlier.drain(..);
        while let Some((cq, c)) = earlier.next().or_else(|| engine.poll_completion()) {
            if run.as_ref().map(|r| r.0) != Some(cq) {
                if let Some((_, ring, guard, pr)) = run.take() {
                    drop(guard);
                    ring.notify(pr);
                }
                match cqs.get(&cq.0) {
                    Some(ring) => run = Some((cq, ring, ring.lock(), PushRun::default())),
                    None => {
                        Stats::add(&shared.stats().completions_no_cq, 1);
                        continue;
                    }
                }
            }
            if let Some((_, ring, guard, pr)) = run.as_mut() {
                let before = ring.overflows.load(Ordering::Relaxed);
                let qpn = c.qp_num;
                ring.push_locked(guard, c, pr);
                if ring.overflows.load(Ordering::Relaxed) != before {
                    Stats::add(&shared.stats().cq_overflows, 1);
                    if !overrun.contains(&qpn) {
                        overrun.push(qpn);
                    }
                }
            }
        }
        if let Some((_, ring, guard, pr)) = run.take() {
            drop(guard);
            ring.notify(pr);
        }
        // A completion the QP could not report is a work queue catastrophic error
        // (IBTA 11.6.3.1, "CQ overrun": the affiliated QPs go to the error state; mlx4/5
        // raise IBV_EVENT_QP_FATAL for them): the QP moves to ERR, which flushes what is
        // still queued on it, and its owner hears of it on the async event fd.
        let mut moved = false;
        for qpn in overrun {
            let to_err = softhca_transport::QpAttr {
                qp_state: softhca_transport::QpState::Err,
                ..Default::default()
            };
            let q = softhca_transport::Qpn::new(qpn);
            let was_err = engine
                .query_qp(q)
                .is_ok_and(|(a, _)| a.qp_state == softhca_transport::QpState::Err);
            if !was_err
                && engine
                    .modify_qp(
                        shared.now(),
                        q,
                        &to_err,
                        softhca_transport::QpAttrMask::STATE,
                    )
                    .is_ok()
            {
                route(owners, AsyncEvent::QpFatal(q));
                moved = true;
            }
        }
        while let Some(e) = engine.poll_event() {
            route(owners, AsyncEvent::from(e));
        }
        moved
    }

    /// Records that `obj` belongs to the context whose async event queue is `events`: its
    /// async events go to that context.
    pub(crate) fn own(&mut self, obj: EventObject, events: &Arc<AsyncQueue>) {
        self.owners.insert(obj, Arc::downgrade(events));
    }

    /// Forgets `obj` (destroyed): events still queued for it are dropped.
    pub(crate) fn disown(&mut self, obj: EventObject) {
        if let Some(q) = self.owners.remove(&obj).and_then(|w| w.upgrade()) {
            q.retire(|e| e.names(obj));
        }
    }
}

/// Queues `e` on the async queue of the context owning its object; an event for an
/// object no live context owns (destroyed meanwhile) is dropped.
fn route(owners: &HashMap<EventObject, Weak<AsyncQueue>>, e: AsyncEvent) {
    if let Some(q) = owners.get(&e.object()).and_then(Weak::upgrade) {
        q.push(e);
    }
}

pub(crate) const ARM_NONE: u8 = 0;
pub(crate) const ARM_SOLICITED: u8 = 1;
pub(crate) const ARM_NEXT: u8 = 2;

/// The ring shared by the datapath (producer) and the [`Cq`] handle (consumer).
#[derive(Debug)]
pub(crate) struct CqRing {
    pub(crate) id: CqId,
    /// Entries the ring holds (`cqe`); changed only by [`Cq::resize`] under the ring lock.
    pub(crate) cap: AtomicUsize,
    pub(crate) q: Mutex<VecDeque<Completion>>,
    pub(crate) cv: Condvar,
    pub(crate) waiters: AtomicUsize,
    pub(crate) arm: AtomicU8,
    pub(crate) overflowed: AtomicBool,
    pub(crate) channel: Option<Arc<ChannelShared>>,
    /// The async event queue of the context that created the CQ (`IBV_EVENT_CQ_ERR`).
    pub(crate) events: Arc<AsyncQueue>,
    pub(crate) overflows: AtomicU64,
}

/// What a run of pushes into one ring saw, to notify once per run.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PushRun {
    any: bool,
    solicited: bool,
}

/// A completion that wakes a solicited-only arm: IBTA 11.4.2.2 — the next solicited
/// completion or the next unsuccessful one.
fn wakes_solicited(c: &Completion) -> bool {
    // The transport does not (yet) say whether a receive had the SE bit; until it does,
    // only error completions count as solicited (see the crate report).
    c.status != WcStatus::Success
}

/// Completions a new CQ has room for before its storage grows.
const INITIAL_CQ_ROOM: usize = 4096;

impl CqRing {
    pub(crate) fn new(
        id: CqId,
        cap: usize,
        channel: Option<Arc<ChannelShared>>,
        events: Arc<AsyncQueue>,
    ) -> Self {
        CqRing {
            id,
            cap: AtomicUsize::new(cap),
            // Room for the usual backlog; a CQ of millions grows only if they wait.
            q: Mutex::new(VecDeque::with_capacity(cap.min(INITIAL_CQ_ROOM))),
            cv: Condvar::new(),
            waiters: AtomicUsize::new(0),
            arm: AtomicU8::new(ARM_NONE),
            overflowed: AtomicBool::new(false),
            channel,
            events,
            overflows: AtomicU64::new(0),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, VecDeque<Completion>> {
        self.q.lock()
    }

    /// Pushes under the held lock. A full ring drops the completion and, once per
    /// overflow episode, raises `IBV_EVENT_CQ_ERR` (rxe `rxe_cq_post`).
    pub(crate) fn push_locked(
        &self,
        q: &mut VecDeque<Completion>,
        c: Completion,
        run: &mut PushRun,
    ) {
        if q.len() >= self.cap.load(Ordering::Relaxed) {
            self.overflows.fetch_add(1, Ordering::Relaxed);
            if !self.overflowed.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    cq = self.id.0,
                    "completion queue overflow; completions lost"
                );
                self.events.push(AsyncEvent::CqErr(self.id));
            }
            return;
        }
        run.any = true;
        run.solicited |= wakes_solicited(&c);
        q.push_back(c);
    }

    /// Drops the completions of QP `qpn` that the application has not polled.
    pub(crate) fn purge_qp(&self, qpn: u32) {
        self.q.lock().retain(|c| c.qp_num != qpn);
    }

    /// After a run of pushes, with the ring lock released: fire the channel if armed,
    /// wake [`Cq::wait`]ers.
    pub(crate) fn notify(&self, run: PushRun) {
        if !run.any {
            return;
        }
        let arm = self.arm.load(Ordering::Acquire);
        let fire = match arm {
            ARM_NEXT => true,
            ARM_SOLICITED => run.solicited,
            _ => false,
        };
        if fire
            && self
                .arm
                .compare_exchange(arm, ARM_NONE, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            if let Some(ch) = &self.channel {
                ch.fire(self.id);
            }
        }
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }
}

pub(crate) fn pop_into(q: &mut VecDeque<Completion>, out: &mut [Completion]) -> usize {
    let n = out.len().min(q.len());
    for (slot, c) in out.iter_mut().zip(q.drain(..n)) {
        *slot = c;
    }
    n
}
