//! What another process reads of a device ([`Snapshot`]): the device as
//! `softhca devinfo -v` shows it, its QPs as `rdma res show qp` lists a kernel device's,
//! and its counters. Published on a socket by `publish`, read by [`crate::read_all`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::attr::DeviceAttr;
use crate::config::{Config, PollMode};
use crate::datapath::DatapathShared;
use crate::publish::Publisher;
use crate::{Gid, Mtu};

/// One GID of a [`DeviceSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidSnapshot {
    /// Its index in the GID table.
    pub index: u32,
    /// The GID as `ibv_devinfo -v` prints it (`0000:…:ffff:7f00:0002`).
    pub gid: String,
    /// The address it stands for.
    pub ip: IpAddr,
}

/// What a device is: the `softhca devinfo -v` view, without the counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// Device name (`hca_id`).
    pub name: String,
    /// Firmware version (the softhca version).
    pub fw_ver: String,
    /// Node GUID as `ibv_devinfo` prints it.
    pub node_guid: String,
    /// System image GUID.
    pub sys_image_guid: String,
    /// Vendor ID.
    pub vendor_id: u32,
    /// Ports (1).
    pub phys_port_cnt: u8,
    /// Port 1's state (`PORT_ACTIVE`).
    pub port_state: String,
    /// Largest MTU, bytes.
    pub max_mtu: u32,
    /// Active MTU, bytes.
    pub active_mtu: u32,
    /// `Ethernet`.
    pub link_layer: String,
    /// The GID table.
    pub gids: Vec<GidSnapshot>,
    /// UDP port.
    pub udp_port: u16,
    /// The interface the device is tied to (`SOFTHCA_NETDEV`).
    pub netdev: Option<String>,
    /// The datapath thread's CPU, when pinned (the one chosen, for `SOFTHCA_CPU=auto`).
    pub cpu: Option<usize>,
    /// Idle policy of the datapath thread (`adaptive:50`, `busy`, `blocking`).
    pub poll: String,
    /// UDP segmentation offload in use.
    pub gso: bool,
    /// UDP receive offload in use.
    pub gro: bool,
}

/// One QP, as `rdma res show qp` lists it, plus the work it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpSnapshot {
    /// QP number.
    pub qpn: u32,
    /// `RC`, `UC` or `UD` (`GSI` for QP 1).
    pub qp_type: String,
    /// `RESET`, `INIT`, `RTR`, `RTS`, `SQD`, `SQE` or `ERR`.
    pub state: String,
    /// Protection domain.
    pub pd: u32,
    /// Peer QP (RC/UC once connected).
    pub dest_qpn: u32,
    /// Peer address (RC/UC once connected).
    pub peer: Option<IpAddr>,
    /// Peer UDP port.
    pub peer_port: Option<u16>,
    /// Path MTU, bytes.
    pub path_mtu: u32,
    /// PSN of the next request (`sq-psn`).
    pub sq_psn: u32,
    /// Oldest unacknowledged request PSN.
    pub una_psn: u32,
    /// PSN the responder expects next (`rq-psn`).
    pub rq_psn: u32,
    /// Send work requests not yet completed.
    pub send_queued: u32,
    /// Receive work requests posted, not yet consumed.
    pub recv_posted: u32,
    /// Request PSNs sent and not acknowledged.
    pub inflight_psns: u32,
    /// READ and atomic requests under way.
    pub rd_atomic_inflight: u32,
    /// The multipath extension, when the QP negotiated it: a summary line, then one
    /// line per path (state, round trip, window, packets, bytes, losses, changes).
    #[serde(default)]
    pub multipath: Vec<String>,
}

/// A device's state at one moment, as a reader gets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The publishing process (its pid as the reader's pid namespace knows it, from
    /// `SO_PEERCRED`, once read).
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`).
    pub command: String,
    /// The device's name within its process, once read: its name, or `<name>-2`, … for
    /// a second device of the same name (the socket's name without the pid).
    #[serde(default)]
    pub key: String,
    /// When the snapshot was taken, milliseconds since the Unix epoch.
    pub taken_ms: u64,
    /// The device.
    pub device: DeviceSnapshot,
    /// Its QPs, by QPN.
    pub qps: Vec<QpSnapshot>,
    /// Every counter `softhca devinfo -v` lists, by name.
    pub counters: BTreeMap<String, u64>,
}

/// `/proc/self/comm`: this process's command name.
pub(crate) fn command_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Publishes the device's state as `cfg.publish` says (see `publish`).
pub(crate) fn publish(
    cfg: &Config,
    shared: &Arc<DatapathShared>,
    desc: DeviceSnapshot,
) -> (DeviceSnapshot, Option<Publisher>) {
    let (weak, d, caps) = (Arc::downgrade(shared), desc.clone(), (desc.gso, desc.gro));
    let source = Box::new(move || Some(take_snapshot(&*weak.upgrade()?, &d, caps)));
    let publisher = Publisher::start(&cfg.publish, &cfg.name, source);
    (desc, publisher)
}

/// The device part of a [`Snapshot`], as `softhca devinfo -v` shows it.
pub(crate) fn describe(
    cfg: &Config,
    attr: &DeviceAttr,
    gids: &[Gid],
    mtu: Mtu,
    caps: (bool, bool),
    cpu: Option<usize>,
) -> DeviceSnapshot {
    DeviceSnapshot {
        name: cfg.name.clone(),
        fw_ver: attr.fw_ver.clone(),
        node_guid: crate::attr::guid_text(attr.node_guid),
        sys_image_guid: crate::attr::guid_text(attr.sys_image_guid),
        vendor_id: attr.vendor_id,
        phys_port_cnt: attr.phys_port_cnt,
        port_state: "PORT_ACTIVE".to_string(),
        max_mtu: Mtu::M4096.bytes() as u32,
        active_mtu: mtu.bytes() as u32,
        link_layer: "Ethernet".to_string(),
        gids: (0..)
            .zip(gids)
            .map(|(index, g)| GidSnapshot {
                index,
                gid: crate::attr::gid_words(g),
                ip: g.to_ip(),
            })
            .collect(),
        udp_port: cfg.udp_port,
        netdev: cfg.netdev.clone().filter(|_| cfg.addrs.is_empty()),
        cpu,
        poll: match cfg.poll {
            PollMode::Busy => "busy".to_string(),
            PollMode::Blocking => "blocking".to_string(),
            PollMode::Adaptive { spin_us } => format!("adaptive:{spin_us}"),
        },
        gso: caps.0,
        gro: caps.1,
    }
}

/// The device's state now: one engine lock for the QPs and the counters together.
pub(crate) fn take_snapshot(
    shared: &DatapathShared,
    desc: &DeviceSnapshot,
    caps: (bool, bool),
) -> Snapshot {
    let (qps, mp, counters) = {
        let core = shared.engine.lock();
        (
            core.engine.qp_resources(),
            core.engine.mp_all(),
            crate::context::counters_of(&core, shared, caps),
        )
    };
    let taken_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Snapshot {
        pid: std::process::id(),
        command: command_name(),
        key: desc.name.clone(),
        taken_ms,
        device: desc.clone(),
        qps: qps
            .iter()
            .map(|q| {
                let mut s = qp_snapshot(q);
                if let Some((_, m)) = mp.iter().find(|(n, _)| n.value() == q.qpn) {
                    s.multipath = m
                        .to_string()
                        .lines()
                        .map(|l| l.trim().to_string())
                        .collect();
                }
                s
            })
            .collect(),
        counters: counters
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    }
}

/// One QP in `rdma res show qp`'s words.
fn qp_snapshot(q: &crate::QpResource) -> QpSnapshot {
    let qp_type = match q.qp_type {
        _ if q.qpn == 1 => "GSI",
        crate::QpType::Rc => "RC",
        crate::QpType::Uc => "UC",
        crate::QpType::Ud => "UD",
    };
    QpSnapshot {
        qpn: q.qpn,
        qp_type: qp_type.to_string(),
        state: format!("{:?}", q.state).to_ascii_uppercase(),
        pd: q.pd,
        dest_qpn: q.dest_qpn,
        peer: q.dest.map(|d| d.ip()),
        peer_port: q.dest.map(|d| d.port()),
        path_mtu: q.path_mtu.bytes() as u32,
        sq_psn: q.sq_psn,
        una_psn: q.una_psn,
        rq_psn: q.rq_psn,
        send_queued: q.send_queued,
        recv_posted: q.recv_posted,
        inflight_psns: q.inflight_psns,
        rd_atomic_inflight: q.rd_atomic_inflight,
        multipath: Vec::new(),
    }
}
