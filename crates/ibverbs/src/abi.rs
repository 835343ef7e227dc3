//! The C structures of rdma-core's `<infiniband/verbs.h>` (rdma-core 44), by hand.
//!
//! Every struct here is checked field by field against the real header at build time
//! (see `build.rs` and the generated `layout_check.rs`): a wrong offset, size or alignment
//! fails the build.
#![allow(non_camel_case_types, missing_docs, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// glibc x86_64 `pthread_mutex_t` (40 bytes): we never lock it, but programs may.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_mutex_t(pub [u8; 40]);
/// glibc x86_64 `pthread_cond_t` (48 bytes).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_cond_t(pub [u8; 48]);

impl Default for pthread_mutex_t {
    /// `PTHREAD_MUTEX_INITIALIZER` is all zero bytes in glibc.
    fn default() -> Self {
        pthread_mutex_t([0; 40])
    }
}
impl Default for pthread_cond_t {
    /// `PTHREAD_COND_INITIALIZER` is all zero bytes in glibc.
    fn default() -> Self {
        pthread_cond_t([0; 48])
    }
}

/// `union ibv_gid`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

pub const IBV_GID_TYPE_IB: u32 = 0;
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `enum ibv_gid_type_sysfs` (driver.h): what `ibv_query_gid_type` reports.
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

pub const IBV_NODE_CA: c_int = 1;
pub const IBV_TRANSPORT_IB: c_int = 0;

#[repr(C)]
pub struct _ibv_device_ops {
    pub _dummy1: *mut c_void,
    pub _dummy2: *mut c_void,
}

#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type AnyFn = *const c_void;

#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: AnyFn,
    pub _compat_query_port: AnyFn,
    pub _compat_alloc_pd: AnyFn,
    pub _compat_dealloc_pd: AnyFn,
    pub _compat_reg_mr: AnyFn,
    pub _compat_rereg_mr: AnyFn,
    pub _compat_dereg_mr: AnyFn,
    pub alloc_mw: AnyFn,
    pub bind_mw: AnyFn,
    pub dealloc_mw: AnyFn,
    pub _compat_create_cq: AnyFn,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_cq_event: AnyFn,
    pub _compat_resize_cq: AnyFn,
    pub _compat_destroy_cq: AnyFn,
    pub _compat_create_srq: AnyFn,
    pub _compat_modify_srq: AnyFn,
    pub _compat_query_srq: AnyFn,
    pub _compat_destroy_srq: AnyFn,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: AnyFn,
    pub _compat_query_qp: AnyFn,
    pub _compat_modify_qp: AnyFn,
    pub _compat_destroy_qp: AnyFn,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: AnyFn,
    pub _compat_destroy_ah: AnyFn,
    pub _compat_attach_mcast: AnyFn,
    pub _compat_detach_mcast: AnyFn,
    pub _compat_async_event: AnyFn,
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `__VERBS_ABI_IS_EXTENDED`: marks an `ibv_context` embedded in a `verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;
pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
pub type CreateSrqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;
pub type GetSrqNumFn = unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int;
pub type ModifyCqFn = unsafe extern "C" fn(*mut ibv_cq, *mut c_void) -> c_int;

/// `struct verbs_context`: the extended ops "grow up" in front of `context`.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: AnyFn,
    pub alloc_null_mr: AnyFn,
    pub read_counters: AnyFn,
    pub attach_counters_point_flow: AnyFn,
    pub create_counters: AnyFn,
    pub destroy_counters: AnyFn,
    pub reg_dm_mr: AnyFn,
    pub alloc_dm: AnyFn,
    pub free_dm: AnyFn,
    pub modify_flow_action_esp: AnyFn,
    pub destroy_flow_action: AnyFn,
    pub create_flow_action_esp: AnyFn,
    pub modify_qp_rate_limit: AnyFn,
    pub alloc_parent_domain: AnyFn,
    pub dealloc_td: AnyFn,
    pub alloc_td: AnyFn,
    pub modify_cq: Option<ModifyCqFn>,
    pub post_srq_ops: AnyFn,
    pub destroy_rwq_ind_table: AnyFn,
    pub create_rwq_ind_table: AnyFn,
    pub destroy_wq: AnyFn,
    pub modify_wq: AnyFn,
    pub create_wq: AnyFn,
    pub query_rt_values: AnyFn,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: AnyFn,
    pub abi_placeholder2: AnyFn,
    pub ibv_create_flow: AnyFn,
    pub abi_placeholder1: AnyFn,
    pub open_qp: AnyFn,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<GetSrqNumFn>,
    pub create_srq_ex: Option<CreateSrqExFn>,
    pub open_xrcd: AnyFn,
    pub close_xrcd: AnyFn,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tso_caps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_packet_pacing_caps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_cq_moderation_caps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_pci_atomic_caps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: ibv_tso_caps,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    pub raw_packet_caps: u32,
    pub tm_caps: ibv_tm_caps,
    pub cq_mod_caps: ibv_cq_moderation_caps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_element {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub srq: *mut ibv_srq,
    pub wq: *mut c_void,
    pub port_num: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    pub element: ibv_async_element,
    pub event_type: u32,
}

pub const IBV_EVENT_CQ_ERR: u32 = 0;
pub const IBV_EVENT_QP_FATAL: u32 = 1;
pub const IBV_EVENT_QP_REQ_ERR: u32 = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: u32 = 3;
pub const IBV_EVENT_COMM_EST: u32 = 4;
pub const IBV_EVENT_SQ_DRAINED: u32 = 5;
pub const IBV_EVENT_PATH_MIG: u32 = 6;
pub const IBV_EVENT_PATH_MIG_ERR: u32 = 7;
pub const IBV_EVENT_SRQ_ERR: u32 = 14;
pub const IBV_EVENT_SRQ_LIMIT_REACHED: u32 = 15;
pub const IBV_EVENT_QP_LAST_WQE_REACHED: u32 = 16;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_grh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_cap {
    pub max_num_tags: u32,
    pub max_ops: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    pub tm_cap: ibv_tm_cap,
}

pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
pub const IBV_SRQT_BASIC: u32 = 0;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
pub const IBV_QP_INIT_ATTR_MAX_TSO_HEADER: u32 = 1 << 3;
pub const IBV_QP_INIT_ATTR_IND_TABLE: u32 = 1 << 4;
pub const IBV_QP_INIT_ATTR_RX_HASH: u32 = 1 << 5;
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub qp_type: u32,
    /// The `bind_mw` / `tso` union (unused: no memory windows, no TSO).
    pub bind_mw: [u64; 6],
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

pub type QpxFn<A> = Option<A>;

#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u32, *const c_void)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

#[repr(C)]
pub struct ibv_wc_tm_info {
    pub tag: u64,
    pub priv_: u32,
}

type CqxFn<R> = Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> R>;

#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: u32,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: CqxFn<c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: CqxFn<u32>,
    pub read_vendor_err: CqxFn<u32>,
    pub read_byte_len: CqxFn<u32>,
    pub read_imm_data: CqxFn<u32>,
    pub read_qp_num: CqxFn<u32>,
    pub read_src_qp: CqxFn<u32>,
    pub read_wc_flags: CqxFn<c_uint>,
    pub read_slid: CqxFn<u32>,
    pub read_sl: CqxFn<u8>,
    pub read_dlid_path_bits: CqxFn<u8>,
    pub read_completion_ts: CqxFn<u64>,
    pub read_cvlan: CqxFn<u16>,
    pub read_flow_tag: CqxFn<u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info)>,
    pub read_completion_wallclock_ns: CqxFn<u64>,
}

#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

// `enum ibv_wc_flags` / `ibv_create_cq_wc_flags` values we report or accept.
pub const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
pub const IBV_WC_EX_WITH_IMM: u64 = 1 << 1;
pub const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;
pub const IBV_WC_EX_WITH_SRC_QP: u64 = 1 << 3;
pub const IBV_WC_EX_WITH_SLID: u64 = 1 << 4;
pub const IBV_WC_EX_WITH_SL: u64 = 1 << 5;
pub const IBV_WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
/// What `ibv_create_cq_ex` accepts in `wc_flags` (no CVLAN, flow tag or TM info).
pub const SUPPORTED_WC_FLAGS: u64 =
    0x7f | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

// `enum ibv_wc_flags` in a completion.
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;
pub const IBV_WC_WITH_INV: c_uint = 1 << 3;

/// `enum ibv_qp_attr_mask` bits we read.
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_CAP: c_int = 1 << 19;

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    pub type_: u32,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind`.
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// The `bind_mw` member of `ibv_send_wr`'s last union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

pub const IBV_WR_LOCAL_INV: u32 = 7;
pub const IBV_WR_BIND_MW: u32 = 8;
