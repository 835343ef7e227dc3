//! Device and port attributes, named like `struct ibv_device_attr` / `struct ibv_port_attr`.

use std::net::IpAddr;

use crate::{Gid, Mtu};

/// `enum ibv_atomic_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum AtomicCap {
    /// No atomics.
    None = 0,
    /// Atomic with respect to this HCA only (what a software HCA can promise, like rxe).
    #[default]
    Hca = 1,
    /// Atomic with respect to everything.
    Glob = 2,
}

/// Device attributes (`struct ibv_device_attr`), with rxe's limits where the engine
/// does not set its own.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID (EUI-64 derived from the first served address, as rxe derives it from
    /// the MAC).
    pub node_guid: u64,
    /// System image GUID (= node GUID).
    pub sys_image_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Supported page sizes (bit mask).
    pub page_size_cap: u64,
    /// IEEE vendor id (rxe: 0xFFFFFF).
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Largest number of QPs.
    pub max_qp: u32,
    /// Largest work queue depth.
    pub max_qp_wr: u32,
    /// `IBV_DEVICE_*` capability flags.
    pub device_cap_flags: u32,
    /// Scatter/gather entries per WR.
    pub max_sge: u32,
    /// Scatter/gather entries per RDMA READ.
    pub max_sge_rd: u32,
    /// Largest number of CQs.
    pub max_cq: u32,
    /// Largest CQ.
    pub max_cqe: u32,
    /// Largest number of MRs.
    pub max_mr: u32,
    /// Largest number of PDs.
    pub max_pd: u32,
    /// Outstanding READ/atomic per QP as responder.
    pub max_qp_rd_atom: u32,
    /// EE contexts (0: no RD).
    pub max_ee_rd_atom: u32,
    /// Responder resources in total.
    pub max_res_rd_atom: u32,
    /// Outstanding READ/atomic per QP as requester.
    pub max_qp_init_rd_atom: u32,
    /// EE (0).
    pub max_ee_init_rd_atom: u32,
    /// Atomic guarantees.
    pub atomic_cap: AtomicCap,
    /// EE contexts (0).
    pub max_ee: u32,
    /// RDDs (0).
    pub max_rdd: u32,
    /// Memory windows.
    pub max_mw: u32,
    /// Raw IPv6 QPs (0).
    pub max_raw_ipv6_qp: u32,
    /// Raw Ethertype QPs (0).
    pub max_raw_ethy_qp: u32,
    /// Multicast groups (0: not supported).
    pub max_mcast_grp: u32,
    /// QPs per multicast group.
    pub max_mcast_qp_attach: u32,
    /// QPs attached to multicast groups in total.
    pub max_total_mcast_qp_attach: u32,
    /// Address handles.
    pub max_ah: u32,
    /// FMRs (0).
    pub max_fmr: u32,
    /// Maps per FMR (0).
    pub max_map_per_fmr: u32,
    /// SRQs.
    pub max_srq: u32,
    /// SRQ depth.
    pub max_srq_wr: u32,
    /// SRQ scatter entries.
    pub max_srq_sge: u32,
    /// P_Key table size.
    pub max_pkeys: u16,
    /// Local CA ACK delay (IBTA 4.096 µs × 2^n).
    pub local_ca_ack_delay: u8,
    /// Physical ports (1).
    pub phys_port_cnt: u8,
}

/// `enum ibv_port_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum PortState {
    /// No state change.
    Nop = 0,
    /// Down.
    Down = 1,
    /// Initialising.
    Init = 2,
    /// Armed.
    Armed = 3,
    /// Active: the only state a softhca port is ever in.
    #[default]
    Active = 4,
    /// Active, deferred.
    ActiveDefer = 5,
}

/// `IBV_LINK_LAYER_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum LinkLayer {
    /// Unspecified.
    Unspecified = 0,
    /// InfiniBand.
    InfiniBand = 1,
    /// Ethernet (RoCE): what softhca reports.
    #[default]
    Ethernet = 2,
}

/// Port attributes (`struct ibv_port_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use (netdev-derived, see [`crate::Context::open`]).
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: i32,
    /// `IBV_PORT_*` capability flags.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// SM LID (0 on RoCE).
    pub sm_lid: u16,
    /// LMC (0).
    pub lmc: u8,
    /// Virtual lanes.
    pub max_vl_num: u8,
    /// SM SL.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Active width (IB encoding; 1 = 1x).
    pub active_width: u8,
    /// Active speed (IB encoding).
    pub active_speed: u8,
    /// Physical state (5 = LinkUp).
    pub phys_state: u8,
    /// Link layer: Ethernet.
    pub link_layer: LinkLayer,
}

/// A device this process can open, as [`crate::devices`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Served addresses, GID order.
    pub addrs: Vec<IpAddr>,
    /// The GID table.
    pub gids: Vec<Gid>,
    /// UDP port.
    pub udp_port: u16,
    /// Active MTU.
    pub active_mtu: Mtu,
}

/// A GUID as `ibv_devinfo` prints it: four groups of four hex digits.
pub fn guid_text(v: u64) -> String {
    let b = v.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// A GID in the colon form `ibv_devinfo -v` prints (`0000:…:ffff:7f00:0002`).
pub fn gid_words(g: &crate::Gid) -> String {
    let words: Vec<String> =
        g.0.chunks(2)
            .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
            .collect();
    words.join(":")
}
