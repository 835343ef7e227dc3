//! Verbs-level types: the values and layouts of rdma-core's `libibverbs/verbs.h`, in Rust.
//!
//! Numeric values of every enum match the C constants so the C ABI layer can cast.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use smallvec::SmallVec;

pub use softhca_memory::{AccessFlags, MemError, MemoryTable, MrKeys, MwBind, MwType, PdId, Sge};
pub use softhca_wire::{Psn, Qpn};

/// Virtual time in nanoseconds. The engine never reads a clock: the caller passes `now`.
pub type Nanos = u64;

/// A 128-bit global identifier. RoCEv2 GIDs are IPv6 addresses or IPv4-mapped IPv6
/// addresses (`::ffff:a.b.c.d`), as rxe fills its GID table from the netdev addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID for an IP address: IPv4 becomes IPv4-mapped IPv6.
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID names (IPv4-mapped GIDs give an IPv4 address).
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// True when this GID is an IPv4-mapped address (RoCEv2 over IPv4).
    pub fn is_ipv4(&self) -> bool {
        matches!(self.to_ip(), IpAddr::V4(_))
    }
}

impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Gid {
        Gid::from_ip(ip)
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(ip))
    }
}

/// Queue pair transport type (`IBV_QPT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpType {
    /// Reliable connected.
    Rc = 2,
    /// Unreliable connected.
    Uc = 3,
    /// Unreliable datagram.
    Ud = 4,
}

impl QpType {
    /// The transport its packets' opcodes name (IBTA 9.2, table 38).
    pub(crate) fn transport(self) -> softhca_wire::Transport {
        match self {
            QpType::Rc => softhca_wire::Transport::Rc,
            QpType::Uc => softhca_wire::Transport::Uc,
            QpType::Ud => softhca_wire::Transport::Ud,
        }
    }
}

/// Queue pair state (`IBV_QPS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum QpState {
    /// Reset: no work is processed, queues are empty.
    #[default]
    Reset = 0,
    /// Initialised: receives may be posted.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drain.
    Sqd = 4,
    /// Send queue error (UC/UD only).
    Sqe = 5,
    /// Error: all work is flushed.
    Err = 6,
}

impl QpState {
    /// The state for an `IBV_QPS_*` value.
    pub fn from_u32(v: u32) -> Option<QpState> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
}

/// Path MTU (`IBV_MTU_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u32)]
pub enum Mtu {
    /// 256 bytes.
    M256 = 1,
    /// 512 bytes.
    M512 = 2,
    /// 1024 bytes.
    #[default]
    M1024 = 3,
    /// 2048 bytes.
    M2048 = 4,
    /// 4096 bytes.
    M4096 = 5,
}

impl Mtu {
    /// The payload size in bytes.
    pub fn bytes(self) -> usize {
        256 << (self as u32 - 1)
    }

    /// The MTU for an `IBV_MTU_*` value.
    pub fn from_u32(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::M256,
            2 => Mtu::M512,
            3 => Mtu::M1024,
            4 => Mtu::M2048,
            5 => Mtu::M4096,
            _ => return None,
        })
    }

    /// The largest IBTA MTU not above `bytes` (None below 256).
    pub fn from_bytes(bytes: usize) -> Option<Mtu> {
        Some(match bytes {
            4096.. => Mtu::M4096,
            2048.. => Mtu::M2048,
            1024.. => Mtu::M1024,
            512.. => Mtu::M512,
            256.. => Mtu::M256,
            _ => return None,
        })
    }
}

bitflags::bitflags! {
    /// `enum ibv_qp_attr_mask`: which fields of [`QpAttr`] a modify applies.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`.
        const STATE = 1 << 0;
        /// `cur_qp_state`.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey`.
        const QKEY = 1 << 6;
        /// `ah_attr`.
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr` etc.
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`.
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
        /// `rate_limit`.
        const RATE_LIMIT = 1 << 25;
    }
}

/// Address vector (`struct ibv_ah_attr` with its GRH), RoCEv2 flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressVector {
    /// Destination GID (the peer's IP address).
    pub dgid: Gid,
    /// Index of the local GID (source address) to use.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP/ECN).
    pub traffic_class: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
    /// Port number (always 1).
    pub port_num: u8,
    /// Destination UDP port; `None` = 4791.
    pub dest_udp_port: Option<u16>,
}

/// Queue capacities (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
}

/// Completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// Shared receive queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// QP creation attributes (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Transport type.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// Completion queue for send completions.
    pub send_cq: CqId,
    /// Completion queue for receive completions.
    pub recv_cq: CqId,
    /// Shared receive queue, if any.
    pub srq: Option<SrqId>,
    /// Capacities (rounded up/validated at creation).
    pub cap: QpCap,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
}

/// QP attributes (`struct ibv_qp_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// Next state.
    pub qp_state: QpState,
    /// Assumed current state.
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Expected PSN of the next request received.
    pub rq_psn: u32,
    /// PSN of the next request sent.
    pub sq_psn: u32,
    /// Remote QPN (RC/UC).
    pub dest_qp_num: u32,
    /// Remote access rights (`IBV_ACCESS_REMOTE_*`).
    pub qp_access_flags: AccessFlags,
    /// Capacities.
    pub cap: QpCap,
    /// Primary path.
    pub ah_attr: AddressVector,
    /// P_Key index.
    pub pkey_index: u16,
    /// Notify when the SQ drained (SQD).
    pub en_sqd_async_notify: bool,
    /// SQD is draining.
    pub sq_draining: bool,
    /// Outstanding READ/atomic this QP may initiate.
    pub max_rd_atomic: u8,
    /// Responder resources for READ/atomic.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (IBTA table 45).
    pub min_rnr_timer: u8,
    /// Port number.
    pub port_num: u8,
    /// Local ACK timeout: 4.096 µs × 2^timeout (0 = infinite).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
}

impl QpAttr {
    /// Copy the attributes `mask` selects from `new` (`ibv_modify_qp`); PSNs and the
    /// remote QPN are cut to their 24 bits. The state fields, `cap` and `ALT_PATH`
    /// are not copied: the caller checks and applies those.
    pub fn apply(&mut self, new: &QpAttr, mask: QpAttrMask) {
        use QpAttrMask as M;
        let on = |m: QpAttrMask| mask.contains(m);
        if on(M::ACCESS_FLAGS) {
            self.qp_access_flags = new.qp_access_flags;
        }
        if on(M::PKEY_INDEX) {
            self.pkey_index = new.pkey_index;
        }
        if on(M::PORT) {
            self.port_num = new.port_num;
        }
        if on(M::QKEY) {
            self.qkey = new.qkey;
        }
        if on(M::AV) {
            self.ah_attr = new.ah_attr;
        }
        if on(M::PATH_MTU) {
            self.path_mtu = new.path_mtu;
        }
        if on(M::TIMEOUT) {
            self.timeout = new.timeout;
        }
        if on(M::RETRY_CNT) {
            self.retry_cnt = new.retry_cnt;
        }
        if on(M::RNR_RETRY) {
            self.rnr_retry = new.rnr_retry;
        }
        if on(M::RQ_PSN) {
            self.rq_psn = Psn::new(new.rq_psn).value();
        }
        if on(M::SQ_PSN) {
            self.sq_psn = Psn::new(new.sq_psn).value();
        }
        if on(M::MAX_QP_RD_ATOMIC) {
            self.max_rd_atomic = new.max_rd_atomic;
        }
        if on(M::MIN_RNR_TIMER) {
            self.min_rnr_timer = new.min_rnr_timer;
        }
        if on(M::MAX_DEST_RD_ATOMIC) {
            self.max_dest_rd_atomic = new.max_dest_rd_atomic;
        }
        if on(M::DEST_QPN) {
            self.dest_qp_num = Qpn::new(new.dest_qp_num).value();
        }
        if on(M::EN_SQD_ASYNC_NOTIFY) {
            self.en_sqd_async_notify = new.en_sqd_async_notify;
        }
    }
}

/// Send work request opcode (`IBV_WR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WrOpcode {
    /// RDMA WRITE.
    RdmaWrite = 0,
    /// RDMA WRITE with immediate.
    RdmaWriteWithImm = 1,
    /// SEND.
    Send = 2,
    /// SEND with immediate.
    SendWithImm = 3,
    /// RDMA READ.
    RdmaRead = 4,
    /// Atomic compare and swap.
    AtomicCmpAndSwp = 5,
    /// Atomic fetch and add.
    AtomicFetchAndAdd = 6,
    /// Local invalidate.
    LocalInv = 7,
    /// Bind memory window.
    BindMw = 8,
    /// SEND with invalidate.
    SendWithInv = 9,
}

bitflags::bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for prior READ/atomic to complete.
        const FENCE = 1;
        /// Generate a completion.
        const SIGNALED = 2;
        /// Set the solicited event bit.
        const SOLICITED = 4;
        /// Payload copied at post time.
        const INLINE = 8;
        /// Checksum offload (ignored).
        const IP_CSUM = 16;
    }
}

/// The data of a send WR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Gather list in registered memory (or the local scatter list of a READ / atomic).
    Sges(SmallVec<[Sge; 4]>),
    /// Bytes already copied at post time (`IBV_SEND_INLINE`).
    Inline(SmallVec<[u8; 64]>),
}

impl Default for Payload {
    fn default() -> Self {
        Payload::Sges(SmallVec::new())
    }
}

impl Payload {
    /// Total byte length (saturating).
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sges(s) => s.iter().map(|s| u64::from(s.length)).sum(),
            Payload::Inline(b) => b.len() as u64,
        }
    }

    /// True when the payload carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Destination of a UD send (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdDest {
    /// Address handle contents.
    pub av: AddressVector,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Remote Q_Key (high bit set: use the QP's own Q_Key).
    pub remote_qkey: u32,
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Flags.
    pub flags: SendFlags,
    /// Data.
    pub payload: Payload,
    /// Immediate data (host order of the BE wire value) or the rkey to invalidate.
    pub imm_data: u32,
    /// Remote virtual address (RDMA / atomics).
    pub remote_addr: u64,
    /// Remote key (RDMA / atomics).
    pub rkey: u32,
    /// Compare (CAS) or add (FAA) operand.
    pub compare_add: u64,
    /// Swap operand (CAS).
    pub swap: u64,
    /// Destination for UD.
    pub ud: Option<UdDest>,
    /// The window, region, range and rights of `BindMw`.
    pub bind: Option<MwBind>,
}

impl Default for SendWr {
    fn default() -> Self {
        SendWr {
            wr_id: 0,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            payload: Payload::default(),
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
            bind: None,
        }
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecvWr {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Scatter list.
    pub sg_list: SmallVec<[Sge; 4]>,
}

/// Work completion status (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcStatus {
    /// Success.
    #[default]
    Success = 0,
    /// Local length error (receive buffer too small).
    LocLenErr = 1,
    /// Local QP operation error.
    LocQpOpErr = 2,
    /// Local EE context error.
    LocEecOpErr = 3,
    /// Local protection error (bad lkey).
    LocProtErr = 4,
    /// Flushed (QP in error).
    WrFlushErr = 5,
    /// Memory window bind error.
    MwBindErr = 6,
    /// Bad response.
    BadRespErr = 7,
    /// Local access error.
    LocAccessErr = 8,
    /// Remote invalid request.
    RemInvReqErr = 9,
    /// Remote access error.
    RemAccessErr = 10,
    /// Remote operation error.
    RemOpErr = 11,
    /// Transport retries exceeded.
    RetryExcErr = 12,
    /// RNR retries exceeded.
    RnrRetryExcErr = 13,
    /// Local RDD violation.
    LocRddViolErr = 14,
    /// Remote invalid RD request.
    RemInvRdReqErr = 15,
    /// Remote aborted.
    RemAbortErr = 16,
    /// Invalid EE context number.
    InvEecnErr = 17,
    /// Invalid EE context state.
    InvEecStateErr = 18,
    /// Fatal.
    FatalErr = 19,
    /// Response timeout.
    RespTimeoutErr = 20,
    /// General error.
    GeneralErr = 21,
}

/// Work completion opcode (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcOpcode {
    /// SEND.
    #[default]
    Send = 0,
    /// RDMA WRITE.
    RdmaWrite = 1,
    /// RDMA READ.
    RdmaRead = 2,
    /// Compare and swap.
    CompSwap = 3,
    /// Fetch and add.
    FetchAdd = 4,
    /// Bind MW.
    BindMw = 5,
    /// Local invalidate.
    LocalInv = 6,
    /// A receive.
    Recv = 128,
    /// A receive consumed by RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

bitflags::bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// A GRH occupies the first 40 bytes of the receive buffer.
        const GRH = 1;
        /// `imm_data` valid.
        const WITH_IMM = 2;
        /// IP checksum verified.
        const IP_CSUM_OK = 4;
        /// `imm_data` holds the invalidated rkey.
        const WITH_INV = 8;
    }
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// The WR's identifier.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (valid for successful completions).
    pub opcode: WcOpcode,
    /// Vendor error (0).
    pub vendor_err: u32,
    /// Bytes transferred (receive: bytes placed; READ: bytes read).
    pub byte_len: u32,
    /// Immediate data or invalidated rkey.
    pub imm_data: u32,
    /// Local QPN.
    pub qp_num: u32,
    /// Source QPN (UD receives; the remote QPN for RC/UC receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level; on a UD receive the RoCEv2 L3 header type as mlx5 reports it
    /// (2 IPv4, 1 IPv6).
    pub sl: u8,
    /// DLID path bits (0 on RoCE).
    pub dlid_path_bits: u8,
}

/// SRQ attributes (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Queue depth.
    pub max_wr: u32,
    /// Scatter entries per WR.
    pub max_sge: u32,
    /// Limit: an event fires when the posted count drops below it (0 = disarmed).
    pub srq_limit: u32,
}

/// `IBV_SRQ_MAX_WR` for [`crate::Engine::modify_srq`].
pub const SRQ_MAX_WR: u32 = 1;
/// `IBV_SRQ_LIMIT` for [`crate::Engine::modify_srq`].
pub const SRQ_LIMIT: u32 = 2;

/// Asynchronous events (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// A QP hit a fatal error.
    QpFatal(Qpn),
    /// Invalid request on the responder (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr(Qpn),
    /// Access violation on the responder (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessErr(Qpn),
    /// First packet received in RTR (`IBV_EVENT_COMM_EST`).
    CommEst(Qpn),
    /// SQD reached with nothing outstanding.
    SqDrained(Qpn),
    /// Last WQE reached on an SRQ-attached QP in ERR.
    QpLastWqeReached(Qpn),
    /// An SRQ fell below its limit.
    SrqLimitReached(SrqId),
    /// SRQ error.
    SrqErr(SrqId),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_attr_apply_copies_only_the_masked_fields() {
        let mut a = QpAttr::default();
        let new = QpAttr {
            qp_state: QpState::Rts,
            rq_psn: 0x1ab_cdef,
            sq_psn: 0x200_0001,
            dest_qp_num: 0xff00_0012,
            timeout: 14,
            qkey: 7,
            ..QpAttr::default()
        };
        a.apply(
            &new,
            QpAttrMask::STATE | QpAttrMask::RQ_PSN | QpAttrMask::DEST_QPN | QpAttrMask::TIMEOUT,
        );
        // The state is the caller's to move; PSNs and the QPN keep their 24 bits.
        assert_eq!(a.qp_state, QpState::Reset);
        assert_eq!(a.rq_psn, 0xab_cdef);
        assert_eq!(a.dest_qp_num, 0x12);
        assert_eq!(a.timeout, 14);
        assert_eq!((a.sq_psn, a.qkey), (0, 0));
        a.apply(&new, QpAttrMask::SQ_PSN);
        assert_eq!(a.sq_psn, 1);
    }
}

/// One QP as seen from outside: what `rdma res show qp` prints for a kernel device
/// (state, peer, PSNs) and the work it holds ([`crate::Engine::qp_resources`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpResource {
    /// The QP number.
    pub qpn: u32,
    /// Its transport.
    pub qp_type: QpType,
    /// Its state.
    pub state: QpState,
    /// Its protection domain.
    pub pd: u32,
    /// The connected peer's QP (RC/UC; 0 before RTR and for UD).
    pub dest_qpn: u32,
    /// The connected peer's address and UDP port (RC/UC once RTR).
    pub dest: Option<std::net::SocketAddr>,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// PSN the next request message starts at (`rdma res`'s `sq-psn`).
    pub sq_psn: u32,
    /// Oldest request PSN not yet acknowledged.
    pub una_psn: u32,
    /// PSN the responder expects next (`rq-psn`).
    pub rq_psn: u32,
    /// Send work requests queued and not yet completed.
    pub send_queued: u32,
    /// Receive work requests posted and not yet consumed (own queue; SRQs apart).
    pub recv_posted: u32,
    /// Request PSNs sent and not yet acknowledged.
    pub inflight_psns: u32,
    /// READ and atomic requests started and not completed.
    pub rd_atomic_inflight: u32,
}
