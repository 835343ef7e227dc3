//! The open device: UDP sockets + the transport engine + the datapath thread.

use rustc_hash::FxHashMap as HashMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::placement::Placement;
use softhca_io::{EventFd, RoceSocket};
use softhca_transport::{mcast, CcAlgorithm, DelayAimdConfig, Engine, EngineConfig};

use crate::addr::{self, Served};
use crate::attr::{AtomicCap, DeviceAttr, DeviceInfo, LinkLayer, PortAttr, PortState};
use crate::config::{Config, PollMode};
use crate::cq::{CompChannel, Cq};
use crate::datapath::{DatapathShared, DatapathThread, Stepper};
use crate::error::Error;
use crate::event::{AsyncEvent, AsyncQueue};
use crate::pd::Pd;
use crate::publish::Publisher;
use crate::ring::{CqRing, LockedEngine};
use crate::snapshot::{describe, publish, take_snapshot, DeviceSnapshot, Snapshot};
use crate::stats::Stats;
use crate::turnaround::Turnaround;
use crate::{CqId, Gid, Mtu, Nanos};

/// Largest CQ: mlx5's `max_cqe` (rxe's 32767 is too small for libfabric's ofi_rxm, which
/// asks for (tx + rx queue) x 1024 peers; a CQ's storage grows only as completions wait).
pub const MAX_CQE: u32 = (1 << 22) - 1;

/// Open devices, for [`flush_all_at_exit`].
static OPEN_DEVICES: std::sync::Mutex<Vec<std::sync::Weak<DatapathShared>>> =
    std::sync::Mutex::new(Vec::new());
static AT_EXIT: std::sync::Once = std::sync::Once::new();

/// Remembers `shared` so that a process that exits without closing its devices still
/// sends the packets held for an answer (`Stepper::step`): the last ACKs of what it
/// received, which the peer needs to complete its sends.
fn flush_at_exit(shared: &Arc<DatapathShared>) {
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
    crate::publish::remove_at_exit();
    let Ok(v) = OPEN_DEVICES.try_lock() else {
        return;
    };
    for shared in v.iter().filter_map(std::sync::Weak::upgrade) {
        // The datapath thread may be in a step (it then sends them itself).
        if let Some(mut p) = shared.stepper.try_lock_for(Duration::from_millis(10)) {
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
fn print_counters(shared: &DatapathShared, when: &str) {
    let Some(core) = shared.engine.try_lock_for(Duration::from_millis(10)) else {
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
    /// Index of the interface the address is on (0: not known).
    ifindex: u32,
}

impl ServedAddr {
    fn of(s: &Served) -> ServedAddr {
        ServedAddr {
            ip: s.ip,
            loopback: s.loopback,
            ifindex: addr::served_ifindex(s),
        }
    }
}

/// The device behind every [`Context`] of it in this process: one UDP socket per served
/// address, the transport engine, and a datapath thread that moves packets between them.
/// It lives while any context (or object created from one) does; the datapath thread
/// stops (and is joined) when the last reference goes.
pub(crate) struct Device {
    shared: Arc<DatapathShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    name: String,
    served: Vec<ServedAddr>,
    gids: Vec<Gid>,
    /// The port's active MTU: what every served interface carries.
    mtu: Mtu,
    /// The port's largest MTU: the configured one (`SOFTHCA_MTU`, 4096 as rxe's by
    /// default); a connected QP whose source GID's interface carries it may use it.
    max_mtu: Mtu,
    /// The port's `(active_width, active_speed)`, from its netdev as rxe's.
    rate: (u8, u8),
    udp_port: u16,
    /// Socket buffer bytes (`Config::sockbuf`), for the multicast group sockets.
    sockbuf: usize,
    caps: (bool, bool),
    attr: DeviceAttr,
    /// What [`Context::snapshot`] says of the device itself.
    desc: DeviceSnapshot,
    /// The socket other processes read this device's state from (see `publish`).
    publisher: Option<Publisher>,
    netdev: Option<String>,
    placement: Option<Placement>,
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

/// Headers around a request packet's payload in its UDP payload, at most: BTH, RETH,
/// immediate data, ICRC (and pad).
const JUMBO_HEADERS: usize = 12 + 16 + 4 + 4 + 4;

/// The packet size above 4096 offered to softhca peers: the configured one, or the
/// largest that fits every served interface's MTU and one receive buffer, if smaller.
fn jumbo_mtu(cfg: &Config, served: &[Served]) -> u64 {
    let room = served
        .iter()
        .map(|s| addr::bundle_limit(s).min(s.socket.recv_buf_size()))
        .min()
        .unwrap_or(0);
    jumbo_size(room, cfg.jumbo)
}

/// The packet payload above 4096 a device offers with `offer` configured (`Config::jumbo`)
/// when a UDP payload of `udp_room` bytes fits its interfaces and receive buffers: the
/// largest multiple of 512 whose packets fit, at most `offer`; 0 when that is not above
/// 4096 (an Ethernet MTU of 1500, an interface whose MTU is unknown).
pub fn jumbo_size(udp_room: usize, offer: u64) -> u64 {
    let room = udp_room.saturating_sub(JUMBO_HEADERS) as u64;
    let unit = softhca_transport::JUMBO_UNIT;
    match (room / unit * unit).min(offer) {
        n if n > 4096 => n,
        _ => 0,
    }
}

/// The engine's configuration for a device serving `served` with these GIDs and MTU.
/// `epoch`: when the engine's clock reads 0, on the wall clock (ns since the Unix epoch).
fn engine_config(
    cfg: &Config,
    served: &[Served],
    gids: &[Gid],
    mtu: Mtu,
    epoch: Nanos,
) -> EngineConfig {
    let max_gso_segments = served
        .iter()
        .map(|s| s.socket.capabilities().max_gso_segments)
        .min()
        .unwrap_or(1)
        .max(1);
    EngineConfig {
        gids: gids.to_vec(),
        udp_port: cfg.udp_port,
        seed: rand::random(),
        max_mtu: mtu,
        gid_mtus: served
            .iter()
            .map(|s| addr::served_mtu(cfg.mtu, s))
            .collect(),
        max_gso_segments,
        // Splitting buys one GSO batch per WRITE; without GSO it buys nothing.
        split_rc_writes: cfg.split_writes && max_gso_segments > 1,
        cc: if cfg.congestion_control {
            CcAlgorithm::DelayAimd(DelayAimdConfig {
                wall_clock_at_zero: epoch,
                ..DelayAimdConfig::default()
            })
        } else {
            CcAlgorithm::Off
        },
        unacked_rate: cfg.uc_ud_rate.map(|bits| (bits / 8).max(1)),
        mp: cfg.multipath.clone(),
        // What one receive buffer holds: a larger datagram would be cut.
        bundle_max: if cfg.bundle {
            served
                .iter()
                .map(|s| s.socket.recv_buf_size())
                .min()
                .unwrap_or(0)
        } else {
            0
        },
        jumbo_mtu: jumbo_mtu(cfg, served),
        ..EngineConfig::default()
    }
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
        max_mcast_grp: mcast::MAX_GROUPS as u32,
        max_mcast_qp_attach: mcast::MAX_QP_ATTACH as u32,
        max_total_mcast_qp_attach: mcast::MAX_TOTAL_ATTACH as u32,
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
    ///   link-local excepted), and the sockets are tied to the interface
    ///   (`SO_BINDTODEVICE`), as rxe sends through its netdev whatever the routing
    ///   table prefers: a data network stays apart from a management one.
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
        let rate = addr::port_rate(&served);
        let gids: Vec<Gid> = served.iter().map(|s| Gid::from_ip(s.ip)).collect();
        let caps = served.iter().fold((true, true), |(gso, gro), s| {
            let c = s.socket.capabilities();
            (gso && c.gso, gro && c.gro)
        });
        let epoch = Instant::now();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as Nanos);
        let mut ecfg = engine_config(cfg, &served, &gids, mtu, wall);
        let (ports, sport_sockets) = addr::sport_sockets(cfg, &served);
        ecfg.mp.ports = ports;
        let attr = device_attr(&ecfg, &gids);
        let served_addrs: Vec<ServedAddr> = served.iter().map(ServedAddr::of).collect();
        let mut engine = Engine::new(ecfg);
        // Every datagram leaves from the socket bound to `udp_port`, so that is its UDP
        // source port; the ICRC covers it, so packets are sealed with it (rxe picks a
        // per-QP source port instead, 0xC000 + hash(QPN); one socket per QP would be
        // needed for that).
        engine.set_source_port(Some(cfg.udp_port));
        // Served interfaces come first: the first one is the device's interface.
        let netdev = served.first().and_then(|s| s.ifname.clone());
        let bundle_limits: Vec<usize> = served
            .iter()
            .map(|s| if cfg.bundle { addr::bundle_limit(s) } else { 0 })
            .collect();
        let sockets: Vec<RoceSocket> = served.into_iter().map(|s| s.socket).collect();
        let stepper = Stepper::new(
            &sockets,
            softhca_io::Impair::loss_ppm(cfg.tx_drop_ppm),
            cfg.connected_senders,
            cfg.sockbuf,
            cfg.direct_rx,
            bundle_limits,
        );
        let shared = Arc::new(DatapathShared {
            engine: Mutex::new(LockedEngine::new(
                engine,
                HashMap::default(),
                HashMap::default(),
            )),
            epoch,
            sockets,
            sport_sockets,
            mcast: Default::default(),
            doorbell: EventFd::new()?,
            sleeping: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stats: Stats::default(),
            poll: cfg.poll,
            stepper: Mutex::new(stepper),
            app_active_until: AtomicU64::new(0),
            serve_until: AtomicU64::new(0),
            deadline: AtomicU64::new(Nanos::MAX),
            thread_wake: AtomicU64::new(Nanos::MAX),
            window_sleep: AtomicBool::new(false),
            turnaround: cfg.diagnostics.stats.then(Turnaround::new),
            print_stats: cfg.diagnostics.stats,
        });
        flush_at_exit(&shared);
        let dp = DatapathThread::new(shared.clone())?;
        let placement = crate::placement::place(cfg.cpu, netdev.as_deref());
        let cpu = placement.as_ref().map(|p| p.cpu);
        let thread = std::thread::Builder::new()
            .name(format!("softhca-dp-{}", cfg.name))
            .spawn(move || dp.run(cpu))
            .map_err(|e| Error::Os {
                what: "spawn datapath thread",
                source: e,
            })?;
        tracing::info!(name = %cfg.name, addrs = ?served_addrs.iter().map(|s| s.ip).collect::<Vec<_>>(),
            ?mtu, port = cfg.udp_port, gso = caps.0, gro = caps.1, "softhca device open");
        let (desc, publisher) = publish(cfg, &shared, describe(cfg, &attr, &gids, mtu, caps, cpu));
        Ok(Arc::new(Device {
            desc,
            publisher,
            shared,
            thread: Mutex::new(Some(thread)),
            name: cfg.name.clone(),
            served: served_addrs,
            gids,
            mtu,
            max_mtu: cfg.mtu,
            rate,
            udp_port: cfg.udp_port,
            sockbuf: cfg.sockbuf,
            caps,
            attr,
            netdev,
            placement,
        }))
    }
}

impl Context {
    /// The device name (`ibv_get_device_name`).
    pub fn name(&self) -> &str {
        &self.dev.name
    }

    /// The interface of the first served address (`lo` for a loopback address).
    pub fn netdev(&self) -> Option<&str> {
        self.dev.netdev.as_deref()
    }

    /// Where the datapath thread is pinned (`SOFTHCA_CPU`), and why.
    pub fn placement(&self) -> Option<&Placement> {
        self.dev.placement.as_ref()
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
            max_mtu: self.dev.max_mtu,
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
            active_width: self.dev.rate.0,
            active_speed: self.dev.rate.1,
            phys_state: 5,
            link_layer: LinkLayer::Ethernet,
        })
    }

    /// The GID table: the served addresses (IPv4-mapped for IPv4), in
    /// [`Context::open`]'s order.
    pub fn gids(&self) -> Vec<Gid> {
        self.dev.gids.clone()
    }

    /// The index of the network interface GID `index` is an address of (0 when it is
    /// not known), as `ibv_query_gid_ex` reports a RoCE GID's netdev (`ndev_ifindex`).
    pub fn gid_ifindex(&self, index: u32) -> u32 {
        self.dev.served.get(index as usize).map_or(0, |s| s.ifindex)
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
            return Err(Error::InvalidArgument("cqe must be 1..=4194303"));
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
        let core = self.dev.shared.engine.lock();
        counters_of(&core, &self.dev.shared, self.dev.caps)
    }

    /// What another process reads of this device ([`crate::read_snapshot`]): the
    /// device, its QPs and its counters, with this process's pid.
    pub fn snapshot(&self) -> Snapshot {
        take_snapshot(&self.dev.shared, &self.dev.desc, self.dev.caps)
    }

    /// The path of the socket this device publishes its state on, if it does
    /// (`SOFTHCA_RUN_DIR`).
    pub fn published_at(&self) -> Option<&std::path::Path> {
        self.dev.publisher.as_ref().map(|p| p.path())
    }

    /// Each RC QP's congestion control figures: round trip, window, rate, congestion
    /// events (QPs that have sent nothing yet have none).
    pub fn congestion(&self) -> Vec<(crate::Qpn, softhca_transport::CcStats)> {
        self.dev.shared.engine.lock().engine.cc_stats()
    }

    /// Each RC QP's multipath extension state: negotiation, and per path its state,
    /// round trip, window, packets, bytes, losses and state changes (QPs that stayed
    /// plain RC have none).
    pub fn multipath(&self) -> Vec<(crate::Qpn, softhca_transport::MpStats)> {
        self.dev.shared.engine.lock().engine.mp_all()
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
    /// produced into the CQ rings / event queue; takes no clock reading (posting a
    /// receive is per message: none at high message rates). Fails with
    /// [`Error::Closed`] once the datapath has stopped.
    pub(crate) fn with_core_untimed<R>(
        &self,
        f: impl FnOnce(&mut LockedEngine) -> R,
    ) -> Result<R, Error> {
        if self.dev.shared.stop.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        let mut core = self.dev.shared.engine.lock();
        let r = f(&mut core);
        core.deliver(&*self.dev.shared);
        Ok(r)
    }

    /// Like [`Context::with_core_untimed`] but also after the datapath stopped: for teardown
    /// (deregistering memory must always happen).
    pub(crate) fn with_core_always<R>(&self, f: impl FnOnce(&mut LockedEngine) -> R) -> R {
        let mut core = self.dev.shared.engine.lock();
        let r = f(&mut core);
        core.deliver(&*self.dev.shared);
        r
    }

    /// [`Context::with_core_always`] while no datapath step runs and no transmit is held:
    /// for taking registered memory away, which a transmit may still point into until
    /// its `sendmmsg` returns (zero-copy send).
    pub(crate) fn with_core_no_transmit<R>(&self, f: impl FnOnce(&mut LockedEngine) -> R) -> R {
        let mut stepper = self.dev.shared.stepper.lock();
        stepper.flush_held(&self.dev.shared);
        let r = self.with_core_always(f);
        drop(stepper);
        r
    }

    /// Opens and closes multicast group sockets to match the groups this device's QPs
    /// are attached to; the datapath picks them up at its next step or sleep.
    pub(crate) fn sync_mcast(&self) -> Result<(), Error> {
        let dev = &self.dev;
        let served = dev.served.iter().map(|s| (s.ip, s.ifindex));
        let on_loopback = dev.served.iter().any(|s| s.ip.is_loopback());
        let open = |g: Gid| {
            let group = g.to_ip();
            let mut via: Vec<(IpAddr, u32)> = served.clone().collect();
            // A device on a loopback address also hears what this host sends to the
            // group along its route (another process's device on that interface): on
            // one host every device hears every other, as behind one switch.
            if on_loopback {
                via.extend(addr::route_interface(group));
            }
            RoceSocket::bind_multicast(group, dev.udp_port, &via, dev.sockbuf)
        };
        let r = dev
            .shared
            .mcast
            .sync(|| dev.shared.engine.lock().engine.mcast_groups(), open);
        // A datapath thread asleep on the old set wakes and takes the new one.
        self.kick();
        Ok(r?)
    }

    /// Tells the datapath there is new work (rings the doorbell if it sleeps).
    pub(crate) fn kick(&self) {
        self.dev.shared.kick();
    }

    /// Runs `post` on the engine and transmits what it made ready (see [`DatapathShared::post`]).
    /// Fails with [`Error::Closed`] once the datapath has stopped.
    pub(crate) fn post<R>(
        &self,
        post: impl FnOnce(&mut LockedEngine, Nanos) -> R,
    ) -> Result<R, Error> {
        if self.dev.shared.stop.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        Ok(self.dev.shared.post(post))
    }

    /// This context's async event queue.
    pub(crate) fn events(&self) -> &Arc<AsyncQueue> {
        &self.events
    }

    pub(crate) fn shared(&self) -> &DatapathShared {
        &self.dev.shared
    }
}

/// [`Context::counters`] from the locked engine.
pub(crate) fn counters_of(
    core: &LockedEngine,
    shared: &DatapathShared,
    caps: (bool, bool),
) -> Vec<(&'static str, u64)> {
    let mut v: Vec<_> = core.engine.counters().iter().collect();
    v.extend(core.engine.resource_gauges());
    v.extend(shared.stats.iter());
    v.push(("io_gso", u64::from(caps.0)));
    v.push(("io_gro", u64::from(caps.1)));
    v
}

impl Drop for Device {
    fn drop(&mut self) {
        // No reader sees a device half closed.
        drop(self.publisher.take());
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
