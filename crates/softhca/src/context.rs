//! The open device: UDP sockets + the transport engine + the datapath thread.

use rustc_hash::FxHashMap as HashMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use softhca_io::{EventFd, RoceSocket};
use softhca_transport::{Engine, EngineConfig};

use crate::addr::{self, Served};
use crate::attr::{AtomicCap, DeviceAttr, DeviceInfo, LinkLayer, PortAttr, PortState};
use crate::config::{Config, PollMode};
use crate::cq::{CompChannel, Cq, CqRing, PushRun};
use crate::datapath::{Progress, APP_WINDOW_NS, INLINE_STEPS};
use crate::error::Error;
use crate::event::{AsyncEvent, AsyncQueue, EventObject};
use crate::mr::Pd;
use crate::turnaround::Turnaround;
use crate::{CqId, Gid, Mtu, Nanos};

/// Largest CQ (rxe `RXE_MAX_CQE`).
pub const MAX_CQE: u32 = (1 << 15) - 1;

/// I/O counters of the datapath, updated once per batch.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub rx_datagrams: AtomicU64,
    pub rx_packets: AtomicU64,
    pub rx_batches: AtomicU64,
    pub rx_gro_datagrams: AtomicU64,
    pub rx_truncated: AtomicU64,
    pub rx_errors: AtomicU64,
    pub tx_transmits: AtomicU64,
    pub tx_batches: AtomicU64,
    pub tx_errors: AtomicU64,
    pub tx_no_socket: AtomicU64,
    /// Packets dropped by fault injection ([`crate::Config::tx_drop_ppm`]).
    pub tx_injected_drops: AtomicU64,
    pub tx_would_block: AtomicU64,
    /// Transmits sent through a socket connected to their peer (see `senders`).
    pub tx_connected: AtomicU64,
    /// Connected sockets set up (each learns its IPv4 ID counter), and failed ones
    /// (not set up, or a send failed: the peer uses the device socket for a while).
    pub tx_connected_opened: AtomicU64,
    pub tx_connected_failed: AtomicU64,
    /// Steps whose packets were held for the polling application's answer.
    pub tx_held: AtomicU64,
    /// Posts whose last transmit was kept back to be filled by the next one.
    pub tx_deferred: AtomicU64,
    /// Steps that left the trailing ACKs of their last datagram for the next step, to
    /// hand the polling application its completion first.
    pub rx_acks_deferred: AtomicU64,
    /// Application polling windows that ended with packets waiting in the sockets, and
    /// periods in which the datapath thread served an application that waits without
    /// polling (see `crate::strand`).
    pub app_strandings: AtomicU64,
    pub app_served: AtomicU64,
    pub loop_iterations: AtomicU64,
    pub sleeps: AtomicU64,
    pub doorbells: AtomicU64,
    pub cq_overflows: AtomicU64,
    pub completions_no_cq: AtomicU64,
}

impl Stats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        if n != 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("io_rx_datagrams", r(&self.rx_datagrams)),
            ("io_rx_packets", r(&self.rx_packets)),
            ("io_rx_batches", r(&self.rx_batches)),
            ("io_rx_gro_datagrams", r(&self.rx_gro_datagrams)),
            ("io_rx_truncated", r(&self.rx_truncated)),
            ("io_rx_errors", r(&self.rx_errors)),
            ("io_tx_transmits", r(&self.tx_transmits)),
            ("io_tx_batches", r(&self.tx_batches)),
            ("io_tx_errors", r(&self.tx_errors)),
            ("io_tx_no_socket", r(&self.tx_no_socket)),
            ("io_tx_injected_drops", r(&self.tx_injected_drops)),
            ("io_tx_would_block", r(&self.tx_would_block)),
            ("io_tx_connected", r(&self.tx_connected)),
            ("io_tx_connected_opened", r(&self.tx_connected_opened)),
            ("io_tx_connected_failed", r(&self.tx_connected_failed)),
            ("dp_tx_held", r(&self.tx_held)),
            ("dp_tx_deferred", r(&self.tx_deferred)),
            ("dp_rx_acks_deferred", r(&self.rx_acks_deferred)),
            ("dp_app_strandings", r(&self.app_strandings)),
            ("dp_app_served", r(&self.app_served)),
            ("dp_loop_iterations", r(&self.loop_iterations)),
            ("dp_sleeps", r(&self.sleeps)),
            ("dp_doorbells", r(&self.doorbells)),
            ("cq_overflows", r(&self.cq_overflows)),
            ("completions_no_cq", r(&self.completions_no_cq)),
        ]
        .into_iter()
    }
}

/// Everything behind the one engine lock: the engine and the CQ rings it feeds (so the
/// ring table needs no lock of its own).
pub(crate) struct Core {
    pub engine: Engine,
    pub cqs: HashMap<u32, Arc<CqRing>>,
    /// The async event queue of the context that created each QP and SRQ: events go to
    /// that context only, as the kernel queues them on the creating uverbs file.
    pub owners: HashMap<EventObject, Weak<AsyncQueue>>,
}

// SAFETY: the engine holds raw pointers into registered memory (the MR table). They are
// only dereferenced by engine code running under `Shared::core`'s mutex, and the memory
// stays valid until deregistered under that same mutex (see `crate::mr`), so moving the
// engine between threads is sound. Everything else in `Core` is Send already.
unsafe impl Send for Core {}

/// A completion as the engine hands it out, with the CQ it goes to.
pub(crate) type EngineCompletion = (CqId, softhca_transport::Completion);

/// A run of completions for one CQ: its id, ring, held ring lock and what was pushed.
type RingRun<'a> = (
    CqId,
    &'a Arc<CqRing>,
    parking_lot::MutexGuard<'a, std::collections::VecDeque<crate::Completion>>,
    PushRun,
);

impl Core {
    /// Moves every completion the engine has into its CQ ring and every async event into
    /// the event queue. Called with the engine lock held, once per datapath batch and
    /// after each control/post call. Completions for the same CQ in a row share one ring
    /// lock and one notification.
    pub(crate) fn deliver(&mut self, shared: &Shared) {
        self.deliver_after(shared, &mut Vec::new());
    }

    /// [`Core::deliver`], the completions in `earlier` (taken from the engine before,
    /// see `Progress::after_send`) first, in their order.
    pub(crate) fn deliver_after(&mut self, shared: &Shared, earlier: &mut Vec<EngineCompletion>) {
        if self.deliver_once(shared, earlier) {
            // The flush completions of the QPs just moved to ERR.
            self.deliver(shared);
        }
    }

    /// One pass of [`Core::deliver_after`]; true when a CQ overrun moved a QP to ERR.
    fn deliver_once(&mut self, shared: &Shared, earlier: &mut Vec<EngineCompletion>) -> bool {
        let Core {
            engine,
            cqs,
            owners,
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
                        Stats::add(&shared.stats.completions_no_cq, 1);
                        continue;
                    }
                }
            }
            if let Some((_, ring, guard, pr)) = run.as_mut() {
                let before = ring.overflows.load(Ordering::Relaxed);
                let qpn = c.qp_num;
                ring.push_locked(guard, c, pr);
                if ring.overflows.load(Ordering::Relaxed) != before {
                    Stats::add(&shared.stats.cq_overflows, 1);
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

    /// Records that `obj` belongs to `ctx`: its async events go to that context.
    pub(crate) fn own(&mut self, obj: EventObject, ctx: &Context) {
        self.owners.insert(obj, Arc::downgrade(&ctx.events));
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

/// State shared by the application-facing handles and the datapath thread.
pub(crate) struct Shared {
    pub core: Mutex<Core>,
    epoch: Instant,
    pub sockets: Vec<RoceSocket>,
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
    pub progress: Mutex<Progress>,
    /// Until when (engine clock) the datapath thread leaves the sockets to the
    /// application threads; 0 when an application is about to block.
    pub app_active_until: AtomicU64,
    /// Until when (engine clock) application polls open no window: the datapath thread
    /// serves the sockets (see [`Shared::app_window`]); written by the datapath thread.
    pub serve_until: AtomicU64,
    /// The engine's next timer (engine clock; `Nanos::MAX`: none), as of the last step.
    pub deadline: AtomicU64,
    /// When the sleeping datapath thread wakes by itself (`Nanos::MAX`: only for I/O).
    pub thread_wake: AtomicU64,
    /// Times each turnaround when `SOFTHCA_STATS` is set (`crate::turnaround`).
    pub turnaround: Option<Box<Turnaround>>,
    /// `SOFTHCA_STATS`: print the counters when the device closes, or at exit.
    pub print_stats: bool,
}

impl Shared {
    /// Nanoseconds since the device was opened: the engine's clock.
    pub(crate) fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// How long an application thread's poll at `now` leaves the sockets to application
    /// threads: [`APP_WINDOW_NS`], or 0 while the application is known to wait for
    /// traffic without polling (see `crate::strand`).
    pub(crate) fn app_window(&self, now: Nanos) -> Nanos {
        if now < self.serve_until.load(Ordering::Relaxed) {
            0
        } else {
            APP_WINDOW_NS
        }
    }

    /// Whether an application thread progressed the datapath within the last window.
    pub(crate) fn app_polls(&self) -> bool {
        self.now() < self.app_active_until.load(Ordering::Relaxed)
    }

    /// Posts with `post` under the engine lock, and transmits what it made ready at once
    /// in the same lock hold (as a NIC starts sending at its doorbell) unless another
    /// thread is in a datapath step: that one then sees `pending`. The datapath thread
    /// is woken only when nobody polls and it may sleep.
    pub(crate) fn post<R>(&self, post: impl FnOnce(&mut Core, Nanos) -> R) -> R {
        if let Some(mut p) = self.progress.try_lock() {
            let (r, more) = p.transmit_with(self, true, post);
            self.after_transmit(p, more);
            return r;
        }
        let r = {
            let mut core = self.core.lock();
            let r = post(&mut core, self.now());
            core.deliver(self);
            r
        };
        self.posted();
        r
    }

    /// Work was posted (see [`Shared::post`]).
    pub(crate) fn posted(&self) {
        self.pending.store(true, Ordering::SeqCst);
        if let Some(mut p) = self.progress.try_lock() {
            let more = p.transmit(self);
            self.after_transmit(p, more);
        } else if !self.app_polls() {
            self.kick();
        }
    }

    /// After a transmit step that filled every buffer (`more`), runs further ones, up to
    /// [`INLINE_STEPS`] in all, then hands what is left to the datapath thread.
    fn after_transmit(&self, mut p: parking_lot::MutexGuard<'_, Progress>, mut more: bool) {
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
    /// application may stop polling at any time and never come back for it).
    fn wake_for_timer(&self) {
        if self.deadline.load(Ordering::Relaxed) < self.thread_wake.load(Ordering::SeqCst) {
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
    /// `Progress::step`).
    pub(crate) fn progress_inline(&self, polled: CqId) -> bool {
        let Some(mut p) = self.progress.try_lock() else {
            self.app_polling();
            return false;
        };
        let mut any = false;
        for _ in 0..INLINE_STEPS {
            let step = p.step(self, false, Some(polled));
            any |= step.active;
            if !step.more_tx {
                break;
            }
            // More to send: the next step must run the engine even with nothing new.
            self.pending.store(true, Ordering::SeqCst);
        }
        drop(p);
        self.wake_for_timer();
        any
    }

    /// Sends packets held for an application's answer now (see `Progress::step`).
    pub(crate) fn flush_held(&self) {
        self.progress.lock().flush_held(self);
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

/// Open devices, for [`flush_all_at_exit`].
static OPEN_DEVICES: std::sync::Mutex<Vec<std::sync::Weak<Shared>>> =
    std::sync::Mutex::new(Vec::new());
static AT_EXIT: std::sync::Once = std::sync::Once::new();

/// Remembers `shared` so that a process that exits without closing its devices still
/// sends the packets held for an answer (`Progress::step`): the last ACKs of what it
/// received, which the peer needs to complete its sends.
fn flush_at_exit(shared: &Arc<Shared>) {
    if let Ok(mut v) = OPEN_DEVICES.lock() {
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(shared));
    }
    AT_EXIT.call_once(|| {
        // SAFETY: registers a function without captured state that only locks, sends
        // and returns; atexit has no other effect.
        let rc = unsafe { libc::atexit(flush_all_at_exit) };
        if rc != 0 {
            tracing::debug!("atexit refused: held ACKs are sent only when devices close");
        }
    });
}

extern "C" fn flush_all_at_exit() {
    let Ok(v) = OPEN_DEVICES.try_lock() else {
        return;
    };
    for shared in v.iter().filter_map(std::sync::Weak::upgrade) {
        // The datapath thread may be in a step (it then sends them itself).
        if let Some(mut p) = shared.progress.try_lock_for(Duration::from_millis(10)) {
            p.flush_held(&shared);
        }
        if shared.print_stats {
            print_counters(&shared, "at exit");
        }
    }
}

/// `SOFTHCA_STATS`: the counters of a device when it closes, or at exit for one still
/// open, for a program we cannot change (perftest exits on a failed completion without
/// closing its device). Non-zero ones only, on one stderr line.
fn print_counters(shared: &Shared, when: &str) {
    let Some(core) = shared.core.try_lock_for(Duration::from_millis(10)) else {
        return;
    };
    let mut line = format!("softhca: counters {when}:");
    let engine = core.engine.counters();
    let all = engine.iter().chain(shared.stats.iter());
    for (name, v) in all.filter(|&(_, v)| v != 0) {
        line.push_str(&format!(" {name}={v}"));
    }
    drop(core);
    eprintln!("{line}");
    if let Some(t) = shared.turnaround.as_ref().and_then(|t| t.summary()) {
        eprintln!("softhca: {t}");
    }
}

/// One served address, as the context remembers it.
#[derive(Debug, Clone)]
struct ServedAddr {
    ip: IpAddr,
    loopback: bool,
}

/// The device behind every [`Context`] of it in this process: one UDP socket per served
/// address, the transport engine, and a datapath thread that moves packets between them.
/// It lives while any context (or object created from one) does; the datapath thread
/// stops (and is joined) when the last reference goes.
pub(crate) struct Device {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    name: String,
    served: Vec<ServedAddr>,
    gids: Vec<Gid>,
    mtu: Mtu,
    udp_port: u16,
    caps: (bool, bool),
    attr: DeviceAttr,
}

/// An open device (`ibv_context`). Every [`Context::open`] of a device this process
/// already has gives a new context on the same device (same GIDs, QPN space and
/// datapath), as every `ibv_open_device` of a card or of rxe does; each context has its
/// own async event queue. Always handled as `Arc<Context>`; every object created from it
/// keeps it alive.
pub struct Context {
    dev: Arc<Device>,
    events: Arc<AsyncQueue>,
}

/// Two opens are of the same device when their whole [`Config`] is the same: a part of
/// the process that asks for other settings (another MTU, fault injection, ...) on the
/// same address gets its own device, or "address in use", as before.
/// The network namespace is part of it too: a thread that moved to another namespace
/// serves other addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeviceKey {
    cfg: Config,
    netns: Option<(u64, u64)>,
}

impl DeviceKey {
    fn of(cfg: &Config) -> DeviceKey {
        use std::os::unix::fs::MetadataExt;
        let netns = std::fs::metadata("/proc/thread-self/ns/net")
            .ok()
            .map(|m| (m.dev(), m.ino()));
        DeviceKey {
            cfg: cfg.clone(),
            netns,
        }
    }
}

/// The devices open in this process: a second open of one shares the first's engine.
static OPEN_BY_KEY: Mutex<Vec<(DeviceKey, Weak<Device>)>> = Mutex::new(Vec::new());

/// The device `cfg` names if this process has it open.
fn open_device(cfg: &Config) -> Option<Arc<Device>> {
    let key = DeviceKey::of(cfg);
    let open = OPEN_BY_KEY.lock();
    open.iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, d)| d.upgrade())
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.dev.name)
            .field(
                "addrs",
                &self.dev.served.iter().map(|s| s.ip).collect::<Vec<_>>(),
            )
            .field("mtu", &self.dev.mtu)
            .field("udp_port", &self.dev.udp_port)
            .finish()
    }
}

fn node_guid(gids: &[Gid]) -> u64 {
    // An EUI-64 with the locally-administered bit, from the last bytes of GID 0 (rxe
    // derives it from the netdev MAC; we have no MAC, the address is as unique).
    let g = gids.first().copied().unwrap_or_default().0;
    u64::from_be_bytes([0x02, 0x53, 0x48, g[12], 0xfe, g[13], g[14], g[15]])
}

fn device_attr(ecfg: &EngineConfig, gids: &[Gid]) -> DeviceAttr {
    let guid = node_guid(gids);
    // Limits from rxe_param.h where the engine has no say.
    DeviceAttr {
        fw_ver: env!("CARGO_PKG_VERSION").to_string(),
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: 0x00ff_ffff,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: 0x1_0000,
        max_qp_wr: ecfg.max_qp_wr,
        // IBV_DEVICE_BAD_PKEY_CNTR | BAD_QKEY_CNTR | SHUTDOWN_PORT | PORT_ACTIVE_EVENT |
        // SYS_IMAGE_GUID | RC_RNR_NAK_GEN | SRQ_RESIZE | MEM_WINDOW | MEM_MGT_EXTENSIONS |
        // MEM_WINDOW_TYPE_2B, as rxe (`RXE_DEVICE_CAP_FLAGS`).
        device_cap_flags: (1 << 0)
            | (1 << 1)
            | (1 << 7)
            | (1 << 9)
            | (1 << 10)
            | (1 << 12)
            | (1 << 13)
            | (1 << 17)
            | (1 << 21)
            | (1 << 24),
        max_sge: ecfg.max_sge,
        max_sge_rd: ecfg.max_sge,
        max_cq: 0x4000,
        max_cqe: MAX_CQE,
        max_mr: 0x4000,
        max_pd: 0x7ffc,
        max_qp_rd_atom: u32::from(ecfg.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: 0x3f000,
        max_qp_init_rd_atom: u32::from(ecfg.max_qp_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: AtomicCap::Hca,
        max_ee: 0,
        max_rdd: 0,
        // Windows and regions share the key space (2^24 slots).
        max_mw: 0x4000,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 0,
        max_mcast_qp_attach: 0,
        max_total_mcast_qp_attach: 0,
        max_ah: 0x7ffc,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: 0x3ffc,
        max_srq_wr: ecfg.max_qp_wr,
        max_srq_sge: ecfg.max_sge,
        max_pkeys: 64,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
    }
}

impl Context {
    /// Opens a device as `cfg` asks: binds one RoCE UDP socket per served address, builds
    /// the engine and starts the datapath thread.
    ///
    /// Served addresses (the GID table, in this order):
    /// * `cfg.addrs` not empty (`SOFTHCA_ADDR`): exactly those; an address not on this
    ///   host fails with "address … is not assigned to any interface on this host", one
    ///   already served by another process with "address … is already in use".
    /// * else `cfg.netdev` (`SOFTHCA_NETDEV`): that interface's addresses (IPv6
    ///   link-local excepted).
    /// * else automatically: every up, non-loopback interface address that no other
    ///   process serves on `cfg.udp_port` yet (another softhca process or rxe got it
    ///   first: skipped), then the first free loopback address among 127.0.0.1 …
    ///   127.0.0.254. So two processes on one host each get their own loopback address
    ///   with no configuration, and hosts or network namespaces talk over their
    ///   interface addresses. GID 0 is the first interface address if there is one.
    ///
    /// Active MTU: `cfg.mtu` capped by the netdev MTU of every served interface, like
    /// rxe's `eth_mtu_int_to_enum` (1500 → 1024; loopback 65536 → 4096).
    ///
    /// A device this process has open already with the same `cfg` (as every
    /// `ibv_open_device` of the C library has: its configuration comes from the
    /// environment) is not opened again: the new context shares it (its GIDs, QPN space
    /// and datapath).
    pub fn open(cfg: &Config) -> Result<Arc<Context>, Error> {
        let key = DeviceKey::of(cfg);
        let mut open = OPEN_BY_KEY.lock();
        open.retain(|(_, d)| d.strong_count() > 0);
        let dev = match open
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, d)| d.upgrade())
        {
            Some(d) => d,
            None => {
                let served = addr::bind_served(cfg)?;
                let d = Device::open(cfg, served)?;
                open.push((key, Arc::downgrade(&d)));
                d
            }
        };
        drop(open);
        Ok(Arc::new(Context {
            dev,
            events: Arc::new(AsyncQueue::new()?),
        }))
    }

    /// Whether `self` and `other` are contexts of the same device.
    pub fn same_device(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.dev, &other.dev)
    }

    /// [`Context::open`] with [`Config::from_env`].
    pub fn open_default() -> Result<Arc<Context>, Error> {
        Self::open(&Config::from_env()?)
    }
}

impl Device {
    fn open(cfg: &Config, served: Vec<Served>) -> Result<Arc<Device>, Error> {
        if served.is_empty() {
            return Err(Error::Config("no address to serve".to_string()));
        }
        let mtu = addr::active_mtu(cfg.mtu, &served);
        let gids: Vec<Gid> = served.iter().map(|s| Gid::from_ip(s.ip)).collect();
        let caps = served.iter().fold((true, true), |(gso, gro), s| {
            let c = s.socket.capabilities();
            (gso && c.gso, gro && c.gro)
        });
        let max_gso_segments = served
            .iter()
            .map(|s| s.socket.capabilities().max_gso_segments)
            .min()
            .unwrap_or(1)
            .max(1);
        let ecfg = EngineConfig {
            gids: gids.clone(),
            udp_port: cfg.udp_port,
            seed: rand::random(),
            max_mtu: mtu,
            max_gso_segments,
            // Splitting buys one GSO batch per WRITE; without GSO it buys nothing.
            split_rc_writes: cfg.split_writes && max_gso_segments > 1,
            ..EngineConfig::default()
        };
        let attr = device_attr(&ecfg, &gids);
        let served_addrs: Vec<ServedAddr> = served
            .iter()
            .map(|s| ServedAddr {
                ip: s.ip,
                loopback: s.loopback,
            })
            .collect();
        let mut engine = Engine::new(ecfg);
        // Every datagram leaves from the socket bound to `udp_port`, so that is its UDP
        // source port; the ICRC covers it, so the engine must seal with it (rxe picks a
        // per-QP source port instead, 0xC000 + hash(QPN); one socket per QP would be
        // needed for that).
        engine.set_source_port(Some(cfg.udp_port));
        // Small packets are sealed once, when their socket is known (`Progress::send`).
        // Not under fault injection: it sends copies, built sealed (`Progress::new`).
        engine.set_late_seal(cfg.tx_drop_ppm == 0);
        let sockets: Vec<RoceSocket> = served.into_iter().map(|s| s.socket).collect();
        let progress = Mutex::new(Progress::new(
            &sockets,
            cfg.tx_drop_ppm,
            cfg.connected_senders,
            cfg.sockbuf,
        ));
        let shared = Arc::new(Shared {
            core: Mutex::new(Core {
                engine,
                cqs: HashMap::default(),
                owners: HashMap::default(),
            }),
            epoch: Instant::now(),
            sockets,
            doorbell: EventFd::new()?,
            sleeping: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stats: Stats::default(),
            poll: cfg.poll,
            progress,
            app_active_until: AtomicU64::new(0),
            serve_until: AtomicU64::new(0),
            deadline: AtomicU64::new(Nanos::MAX),
            thread_wake: AtomicU64::new(Nanos::MAX),
            turnaround: cfg.diagnostics.stats.then(Turnaround::new),
            print_stats: cfg.diagnostics.stats,
        });
        flush_at_exit(&shared);
        let dp = crate::datapath::Datapath::new(shared.clone())?;
        let cpu = cfg.cpu;
        let thread = std::thread::Builder::new()
            .name(format!("softhca-dp-{}", cfg.name))
            .spawn(move || dp.run(cpu))
            .map_err(|e| Error::Os {
                what: "spawn datapath thread",
                source: e,
            })?;
        tracing::info!(name = %cfg.name, addrs = ?served_addrs.iter().map(|s| s.ip).collect::<Vec<_>>(),
            ?mtu, port = cfg.udp_port, gso = caps.0, gro = caps.1, "softhca device open");
        Ok(Arc::new(Device {
            shared,
            thread: Mutex::new(Some(thread)),
            name: cfg.name.clone(),
            served: served_addrs,
            gids,
            mtu,
            udp_port: cfg.udp_port,
            caps,
            attr,
        }))
    }
}

impl Context {
    /// The device name (`ibv_get_device_name`).
    pub fn name(&self) -> &str {
        &self.dev.name
    }

    /// Device attributes (`ibv_query_device`).
    pub fn query_device(&self) -> DeviceAttr {
        self.dev.attr.clone()
    }

    /// Port attributes (`ibv_query_port`); the only port is 1.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, Error> {
        if port != 1 {
            return Err(Error::InvalidArgument("port number (the only port is 1)"));
        }
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::M4096,
            active_mtu: self.dev.mtu,
            gid_tbl_len: self.dev.gids.len() as i32,
            // IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS, as rxe.
            port_cap_flags: (1 << 16) | (1 << 26),
            max_msg_sz: 0x8000_0000,
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
            pkey_tbl_len: 1,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            max_vl_num: 1,
            sm_sl: 0,
            subnet_timeout: 0,
            init_type_reply: 0,
            active_width: 1,
            active_speed: 1,
            phys_state: 5,
            link_layer: LinkLayer::Ethernet,
        })
    }

    /// The GID table: the served addresses (IPv4-mapped for IPv4), in
    /// [`Context::open`]'s order.
    pub fn gids(&self) -> Vec<Gid> {
        self.dev.gids.clone()
    }

    /// The served IP addresses, GID order.
    pub fn addrs(&self) -> Vec<IpAddr> {
        self.dev.served.iter().map(|s| s.ip).collect()
    }

    /// The UDP port this device binds and sends to.
    pub fn udp_port(&self) -> u16 {
        self.dev.udp_port
    }

    /// The active MTU.
    pub fn active_mtu(&self) -> Mtu {
        self.dev.mtu
    }

    /// One GID (`ibv_query_gid`).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid, Error> {
        if port != 1 {
            return Err(Error::InvalidArgument("port number (the only port is 1)"));
        }
        self.dev
            .gids
            .get(index as usize)
            .copied()
            .ok_or(Error::InvalidArgument("GID index"))
    }

    /// The index of the GID to use as source towards `peer`: a loopback peer gets our
    /// loopback GID; otherwise the address the kernel routes from towards the peer if we
    /// serve it; a peer on this very host that we do not serve (another process serves
    /// it) is reached from our loopback GID; else GID 0. `None` only when the table has
    /// no GID of the peer's family.
    ///
    /// Use it to pick the source GID towards a GID the peer *advertised*; the side that
    /// answers must send from the GID it advertised (as with perftest's `-x`), since a
    /// QP accepts packets only from the address it is connected to. On one host, a
    /// client on 127.0.0.2 reaches a server's GID 0 even when that is an interface
    /// address (the kernel routes local addresses over `lo`).
    pub fn gid_index_for(&self, peer: IpAddr) -> Option<u8> {
        let same_family = |ip: &IpAddr| ip.is_ipv4() == peer.is_ipv4();
        let loopback_idx = self
            .dev
            .served
            .iter()
            .position(|s| s.loopback && same_family(&s.ip));
        let idx = if peer.is_loopback() {
            loopback_idx
        } else {
            match addr::route_source(peer) {
                Some(src) => match self.dev.served.iter().position(|s| s.ip == src) {
                    Some(i) => Some(i),
                    // The kernel answers "from itself" only for a local address.
                    None if src == peer => loopback_idx,
                    None => None,
                },
                None => None,
            }
        };
        let idx = idx.or_else(|| self.dev.served.iter().position(|s| same_family(&s.ip)))?;
        u8::try_from(idx).ok()
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Pd, Error> {
        let id = self.with_core_untimed(|core| core.engine.memory_mut().alloc_pd())?;
        Ok(Pd::new(self.clone(), id))
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    pub fn create_comp_channel(self: &Arc<Self>) -> Result<CompChannel, Error> {
        CompChannel::new(self.clone())
    }

    /// Creates a CQ holding `cqe` completions (1 ..= [`MAX_CQE`]), optionally attached
    /// to a completion channel (`ibv_create_cq`).
    pub fn create_cq(
        self: &Arc<Self>,
        cqe: u32,
        channel: Option<&CompChannel>,
    ) -> Result<Cq, Error> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(Error::InvalidArgument("cqe must be 1..=32767"));
        }
        let ch = channel.map(|c| c.inner.clone());
        let ring = self.with_core_untimed(|core| {
            let id = core.engine.create_cq();
            let ring = Arc::new(CqRing::new(id, cqe as usize, ch, self.events.clone()));
            core.cqs.insert(id.0, ring.clone());
            ring
        })?;
        Ok(Cq::new(self.clone(), ring))
    }

    pub(crate) fn destroy_cq(&self, id: CqId) {
        self.with_core_always(|core| {
            core.cqs.remove(&id.0);
            if let Err(e) = core.engine.destroy_cq(id) {
                tracing::debug!(cq = id.0, "destroy_cq: {e}");
            }
        });
    }

    /// Takes the next async event (`ibv_get_async_event`), waiting up to `timeout`
    /// (`None`: forever). `None` on timeout.
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Option<AsyncEvent> {
        self.events.get(timeout)
    }

    /// A file descriptor readable while an async event is queued (`async_fd`).
    pub fn async_event_fd(&self) -> RawFd {
        self.events.fd()
    }

    /// Takes the next async event as rdma-core's `ibv_get_async_event` does, with a
    /// `read(2)` of [`Context::async_event_fd`] in the fd's own blocking mode: `EAGAIN`
    /// (`WouldBlock`) with `O_NONBLOCK` set and nothing queued, `EINTR` (`Interrupted`)
    /// when a signal interrupts the wait.
    pub fn read_async_event(&self) -> std::io::Result<AsyncEvent> {
        self.dev.shared.app_will_block();
        self.events.read()
    }

    /// Sets or clears `O_NONBLOCK` on [`Context::async_event_fd`] (it starts
    /// non-blocking; the C library makes it blocking, as the kernel's).
    pub fn set_async_fd_nonblocking(&self, on: bool) -> Result<(), Error> {
        self.events.set_nonblocking(on).map_err(|source| Error::Os {
            what: "fcntl(async_fd)",
            source,
        })
    }

    /// Transport counters (rxe names), resource gauges (`gauge_*`, see
    /// `Engine::resource_gauges`), then the datapath's I/O counters.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> = {
            let core = self.dev.shared.core.lock();
            let mut v: Vec<_> = core.engine.counters().iter().collect();
            v.extend(core.engine.resource_gauges());
            v
        };
        v.extend(self.dev.shared.stats.iter());
        v.push(("io_gso", u64::from(self.dev.caps.0)));
        v.push(("io_gro", u64::from(self.dev.caps.1)));
        v
    }

    /// Whether the sockets use GSO and GRO (both probed at open).
    pub fn io_capabilities(&self) -> (bool, bool) {
        self.dev.caps
    }

    /// The idle policy of the datapath thread.
    pub fn poll_mode(&self) -> PollMode {
        self.dev.shared.poll
    }

    /// Runs `f` on the engine under its lock, then moves any completions and events it
    /// produced into the CQ rings / event queue. Fails with [`Error::Closed`] once the
    /// datapath has stopped.
    pub(crate) fn with_core<R>(&self, f: impl FnOnce(&mut Core, Nanos) -> R) -> Result<R, Error> {
        self.with_core_untimed(|core| {
            let now = self.dev.shared.now();
            f(core, now)
        })
    }

    /// [`Context::with_core`] for engine calls that take no time (posting a receive
    /// is per message at high message rates: the clock read was 2.5 % of a 64 B run).
    pub(crate) fn with_core_untimed<R>(&self, f: impl FnOnce(&mut Core) -> R) -> Result<R, Error> {
        if self.dev.shared.stop.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        let mut core = self.dev.shared.core.lock();
        let r = f(&mut core);
        core.deliver(&self.dev.shared);
        Ok(r)
    }

    /// Like [`Context::with_core`] but also after the datapath stopped: for teardown
    /// (deregistering memory must always happen).
    pub(crate) fn with_core_always<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        let mut core = self.dev.shared.core.lock();
        let r = f(&mut core);
        core.deliver(&self.dev.shared);
        r
    }

    /// [`Context::with_core_always`] while no datapath step runs and no transmit is held:
    /// for taking registered memory away, which a transmit may still point into until
    /// its `sendmmsg` returns (zero-copy send).
    pub(crate) fn with_core_no_transmit<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        let mut progress = self.dev.shared.progress.lock();
        progress.flush_held(&self.dev.shared);
        let r = self.with_core_always(f);
        drop(progress);
        r
    }

    /// Tells the datapath there is new work (rings the doorbell if it sleeps).
    pub(crate) fn kick(&self) {
        self.dev.shared.kick();
    }

    /// Runs `post` on the engine and transmits what it made ready (see [`Shared::post`]).
    /// Fails with [`Error::Closed`] once the datapath has stopped.
    pub(crate) fn post<R>(&self, post: impl FnOnce(&mut Core, Nanos) -> R) -> Result<R, Error> {
        if self.dev.shared.stop.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        Ok(self.dev.shared.post(post))
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.dev.shared
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shared.flush_held();
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.doorbell.notify();
        if let Some(t) = self.thread.lock().take() {
            if t.join().is_err() {
                tracing::error!(name = %self.name, "datapath thread panicked");
            }
        }
        if self.shared.print_stats {
            print_counters(&self.shared, "at close");
        }
    }
}

/// The device(s) this process would open with [`Config::from_env`]: one, named by
/// `SOFTHCA_NAME`. When the process has it open, its addresses; else they are found by
/// binding (and releasing) the sockets, so they are what an [`Context::open`] right now
/// would serve.
pub fn devices() -> Result<Vec<DeviceInfo>, Error> {
    let cfg = Config::from_env()?;
    if let Some(d) = open_device(&cfg) {
        return Ok(vec![DeviceInfo {
            name: d.name.clone(),
            gids: d.gids.clone(),
            addrs: d.served.iter().map(|s| s.ip).collect(),
            udp_port: d.udp_port,
            active_mtu: d.mtu,
        }]);
    }
    let served = addr::bind_served(&cfg)?;
    let mtu = addr::active_mtu(cfg.mtu, &served);
    let addrs: Vec<IpAddr> = served.iter().map(|s| s.ip).collect();
    Ok(vec![DeviceInfo {
        name: cfg.name.clone(),
        gids: addrs.iter().map(|a| Gid::from_ip(*a)).collect(),
        addrs,
        udp_port: cfg.udp_port,
        active_mtu: mtu,
    }])
}
