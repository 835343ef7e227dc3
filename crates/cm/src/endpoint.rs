//! A sans-IO communication manager endpoint: the connection state machine of IBTA Vol 1
//! 12.9 as the Linux kernel's `drivers/infiniband/core/cm.c` runs it, including the MAD
//! layer's retransmission (`ib_post_send_mad` with `timeout_ms` and `retries`).
//!
//! The endpoint does no I/O and reads no clock. Its user (the device's QP1 service):
//!
//! 1. feeds every CM MAD received on QP1 with [`Endpoint::handle_mad`]`(now, src_ip, tos, mad)`;
//! 2. calls [`Endpoint::handle_timeout`]`(now)` when [`Endpoint::poll_timeout`] has passed;
//! 3. after either, or after any command, drains [`Endpoint::poll_transmit`] (send each MAD
//!    to QP1 of the returned IP) and [`Endpoint::poll_event`].
//!
//! Commands: [`Endpoint::listen`], [`Endpoint::connect`], [`Endpoint::accept`],
//! [`Endpoint::reject`], [`Endpoint::establish`], [`Endpoint::disconnect`],
//! [`Endpoint::destroy`], [`Endpoint::sidr_request`], [`Endpoint::sidr_reply`].
//!
//! A connection's [`CmId`] is its local communication ID. Local IDs are the kernel's
//! scheme (`cm_alloc_id_priv`): a cyclic counter XORed with a per-endpoint random operand,
//! so a restarted process does not reuse the IDs its peers still remember in timewait or
//! in their duplicate-REQ tables.

use std::collections::VecDeque;
use std::net::IpAddr;

use rustc_hash::FxHashMap;
use softhca_wire::{Psn, Qpn};

use crate::mad::{
    self, private_data, CmBody, CmMessage, CommId, Drep, Dreq, Gid, MadHeader, Mra, MsgResponse,
    Rej, RejReason, Rep, Req, ReqPath, Rtu, ServiceId, SidrRep, SidrReq, SidrStatus,
    TransportService, MAD_LEN,
};
use crate::CmError;

/// Virtual time in nanoseconds, supplied by the caller.
pub type Nanos = u64;

const NANOS_PER_MS: u64 = 1_000_000;

/// The kernel's approximation of 4.096 µs × 2^t in milliseconds: `1 << max(t - 8, 0)`
/// (`cm_convert_to_ms`). 4.096 µs × 2^8 ≈ 1.05 ms, so t = 20 gives 4096 ms.
pub fn cm_convert_to_ms(iba_time: u8) -> u64 {
    1u64 << iba_time.min(31).saturating_sub(8)
}

/// The local ACK timeout for a path: 4.096 µs × 2^t ≈ ack_delay + 2 × packet lifetime,
/// rounded as the kernel's `cm_ack_timeout` does (take the larger exponent, add one if the
/// other is within a factor of two).
pub fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut ack = packet_life_time.saturating_add(1);
    if ack >= ca_ack_delay {
        ack = ack.saturating_add(u8::from(ca_ack_delay >= ack - 1));
    } else {
        ack = ca_ack_delay.saturating_add(u8::from(ack >= ca_ack_delay - 1));
    }
    ack.min(31)
}

/// Connection states (kernel `enum ib_cm_state`; IBTA 12.9.6 figures 137-139).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum CmState {
    /// No connection (after a reject, an error or timewait).
    Idle,
    /// REQ sent, waiting for REP.
    ReqSent,
    /// REQ received, waiting for the consumer to accept or reject.
    ReqRcvd,
    /// MRA sent (or armed to send on a duplicate REQ) for a received REQ.
    MraReqSent,
    /// MRA received for the REQ we sent.
    MraReqRcvd,
    /// REP sent, waiting for RTU.
    RepSent,
    /// REP received, waiting for the consumer to send RTU.
    RepRcvd,
    /// MRA sent for a received REP.
    MraRepSent,
    /// MRA received for the REP we sent.
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, waiting for the consumer to disconnect (send DREP).
    DreqRcvd,
    /// Disconnected; the comm ID is held so late messages are recognised.
    Timewait,
    /// SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ received, waiting for the consumer's SIDR_REP.
    SidrReqRcvd,
}

impl CmState {
    /// States a REQ flood can create (bounded by [`EndpointConfig::max_pending`]).
    fn is_pending(self) -> bool {
        matches!(
            self,
            CmState::ReqRcvd | CmState::MraReqSent | CmState::SidrReqRcvd
        )
    }
}

/// A received REQ or SIDR_REQ.
#[derive(Clone, Copy, Debug)]
enum Request {
    Req(Req),
    Sidr(SidrReq),
}

/// A request waiting for a listener (see [`EndpointConfig::no_listener_grace`]).
#[derive(Clone, Copy, Debug)]
struct Unclaimed {
    until: Nanos,
    from: MadFrom,
    tid: u64,
    request: Request,
}

/// Where a received MAD came from: the peer's IP and the IP TOS it came with. An answer
/// that belongs to no connection (a REJ, a DREP, a SIDR_REP) goes back with that TOS, as
/// the kernel's CM answers on an address handle built from the received GRH
/// (`cm_alloc_response_msg`, `ib_init_ah_attr_from_wc`).
#[derive(Debug, Clone, Copy)]
struct MadFrom {
    ip: IpAddr,
    traffic_class: u8,
}

impl Unclaimed {
    fn service_id(&self) -> ServiceId {
        match &self.request {
            Request::Req(r) => r.service_id,
            Request::Sidr(r) => r.service_id,
        }
    }
}

/// A connection (or SIDR request) handle: the local communication ID.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub struct CmId(pub CommId);

/// Endpoint-wide settings.
#[derive(Clone, Copy, Debug)]
pub struct EndpointConfig {
    /// Our CA (node) GUID, sent in REQ and REP and in the ARI of a REJ "timeout".
    pub ca_guid: u64,
    /// Random operand XORed into local comm IDs (kernel `cm.random_id_operand`).
    pub comm_id_operand: u32,
    /// High half of the TIDs of the requests we originate (kernel `mad_agent->hi_tid`).
    pub hi_tid: u32,
    /// At most this many received REQs and SIDR_REQs may wait for the consumer; more are
    /// dropped (counted in [`Counters::req_over_limit`]) so that a flood cannot exhaust
    /// memory. A real peer retransmits and gets in once the backlog drains.
    pub max_pending: usize,
    /// rdma_cm's behaviour on a received REQ or REP: arm an MRA with this service timeout
    /// that is sent only in answer to a duplicate (`ib_send_cm_mra(IB_CM_MRA_FLAG_DELAY |
    /// 24)` in `cma.c`). `None` leaves REQ_RCVD as plain ib_cm does.
    pub delayed_mra_service_timeout: Option<u8>,
    /// Our CA ACK delay exponent, sent as REP TargetAckDelay (rxe: 15).
    pub ca_ack_delay: u8,
    /// How long a REQ or SIDR_REQ for a service ID nobody listens on waits for a
    /// listener before its REJ "invalid service ID" or SIDR_REP "unsupported" (0: at
    /// once, as the kernel answers). Programs that let their peer connect just before
    /// they listen (perftest `-R` after its handshake, Debian's qperf) race with the
    /// peer's request; the kernel's listen takes microseconds, a process on a loaded
    /// host may be descheduled in between for many milliseconds.
    pub no_listener_grace: Nanos,
}

impl EndpointConfig {
    /// Defaults as the kernel and rdma_cm use them; `random` should come from a CSPRNG
    /// (it seeds the comm IDs and TIDs).
    pub fn new(ca_guid: u64, random: u64) -> EndpointConfig {
        EndpointConfig {
            ca_guid,
            comm_id_operand: random as u32,
            hi_tid: (random >> 32) as u32,
            max_pending: 1024,
            delayed_mra_service_timeout: Some(24),
            ca_ack_delay: 15,
            no_listener_grace: 0,
        }
    }
}

/// What the active side puts in its REQ (kernel `struct ib_cm_req_param` plus the path).
#[derive(Clone, Debug)]
pub struct ConnectParams {
    /// The passive side's IP (where QP1 MADs go).
    pub peer: IpAddr,
    /// Service ID to connect to.
    pub service_id: ServiceId,
    /// Our QPN.
    pub local_qpn: Qpn,
    /// Our starting PSN (the peer's receive PSN).
    pub starting_psn: Psn,
    /// RC or UC.
    pub transport: TransportService,
    /// RDMA read/atomic responder resources we offer.
    pub responder_resources: u8,
    /// RDMA read/atomic initiator depth we want.
    pub initiator_depth: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Path MTU (IBTA encoding).
    pub path_mtu: u8,
    /// P_Key.
    pub pkey: u16,
    /// Our QP uses an SRQ.
    pub srq: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Our GID.
    pub local_gid: Gid,
    /// The peer's GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class (TOS).
    pub traffic_class: u8,
    /// Hop limit (the kernel takes it from the route: 64).
    pub hop_limit: u8,
    /// SL (4 bits).
    pub sl: u8,
    /// Packet lifetime exponent (`CMA_IBOE_PACKET_LIFETIME`: 18 in 6.1, 16 later).
    pub packet_life_time: u8,
    /// How long we wait for the REP, as an exponent (`CMA_CM_RESPONSE_TIMEOUT` 20).
    pub remote_cm_response_timeout: u8,
    /// How long the peer may wait for our RTU (20).
    pub local_cm_response_timeout: u8,
    /// REQ retransmissions (`CMA_MAX_CM_RETRIES` 15).
    pub max_cm_retries: u8,
    /// Private data (up to 92 bytes; for IP-CM a `cma_hdr` then user data).
    pub private_data: Vec<u8>,
}

impl ConnectParams {
    /// An RC REQ between two IPs with the kernel's rdma_cm defaults for RoCE
    /// (`cma_connect_ib`, `cma_resolve_iboe_route`): MTU 1024, hop limit 64, permissive
    /// LIDs, response timeouts 20, 15 CM retries, retry and RNR retry 7.
    pub fn new(
        local_ip: IpAddr,
        peer: IpAddr,
        service_id: ServiceId,
        local_qpn: Qpn,
        starting_psn: Psn,
    ) -> ConnectParams {
        ConnectParams {
            peer,
            service_id,
            local_qpn,
            starting_psn,
            transport: TransportService::Rc,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: 3,
            pkey: 0xffff,
            srq: false,
            flow_control: true,
            local_gid: Gid::from_ip(local_ip),
            remote_gid: Gid::from_ip(peer),
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            packet_life_time: 18,
            remote_cm_response_timeout: 20,
            local_cm_response_timeout: 20,
            max_cm_retries: 15,
            private_data: Vec::new(),
        }
    }
}

/// What the passive side puts in its REP (kernel `struct ib_cm_rep_param`).
#[derive(Clone, Debug)]
pub struct AcceptParams {
    /// Our QPN.
    pub local_qpn: Qpn,
    /// Our starting PSN.
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Our QP uses an SRQ.
    pub srq: bool,
    /// Private data (up to 196 bytes).
    pub private_data: Vec<u8>,
}

impl AcceptParams {
    /// A REP for `local_qpn` starting at `starting_psn`, RNR retry 7, no RDMA read/atomic.
    pub fn new(local_qpn: Qpn, starting_psn: Psn) -> AcceptParams {
        AcceptParams {
            local_qpn,
            starting_psn,
            responder_resources: 0,
            initiator_depth: 0,
            failover_accepted: 0,
            flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            private_data: Vec::new(),
        }
    }
}

/// A SIDR_REQ (kernel `struct ib_cm_sidr_req_param`).
#[derive(Clone, Debug)]
pub struct SidrRequestParams {
    /// Where to send it.
    pub peer: IpAddr,
    /// Service ID to resolve.
    pub service_id: ServiceId,
    /// The path's traffic class (the IP TOS of the SIDR_REQ).
    pub traffic_class: u8,
    /// P_Key.
    pub pkey: u16,
    /// Retransmission interval in ms (rdma_cm: `1 << (20 - 8)` = 4096).
    pub timeout_ms: u64,
    /// Retransmissions (rdma_cm: 15).
    pub max_cm_retries: u8,
    /// Private data (up to 216 bytes).
    pub private_data: Vec<u8>,
}

impl SidrRequestParams {
    /// rdma_cm's defaults (`cma_resolve_ib_udp`).
    pub fn new(peer: IpAddr, service_id: ServiceId) -> SidrRequestParams {
        SidrRequestParams {
            peer,
            service_id,
            traffic_class: 0,
            pkey: 0xffff,
            timeout_ms: 4096,
            max_cm_retries: 15,
            private_data: Vec::new(),
        }
    }
}

/// A SIDR_REP (kernel `struct ib_cm_sidr_rep_param`).
#[derive(Clone, Debug)]
pub struct SidrReplyParams {
    /// Status.
    pub status: SidrStatus,
    /// QPN of the service.
    pub qpn: Qpn,
    /// Q_Key of the service.
    pub qkey: u32,
    /// Private data (up to 136 bytes).
    pub private_data: Vec<u8>,
}

/// What the endpoint reports (kernel `enum ib_cm_event_type`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a listened service arrived; [`Endpoint::accept`] or [`Endpoint::reject`] it.
    ReqReceived {
        /// The new connection.
        id: CmId,
        /// The active side's IP.
        peer: IpAddr,
        /// The REQ.
        req: Box<Req>,
    },
    /// The REP for our REQ arrived; set the QP up, then [`Endpoint::establish`] sends RTU.
    RepReceived {
        /// The connection.
        id: CmId,
        /// The REP.
        rep: Box<Rep>,
    },
    /// The passive side is connected (RTU arrived, or the consumer called
    /// [`Endpoint::establish`] on a first data packet).
    Established {
        /// The connection.
        id: CmId,
    },
    /// The peer rejected the connection.
    Rejected {
        /// The connection.
        id: CmId,
        /// The REJ.
        rej: Box<Rej>,
    },
    /// The peer acknowledged our REQ or REP with an MRA and asked for more time.
    MraReceived {
        /// The connection.
        id: CmId,
        /// The service timeout exponent it asked for.
        service_timeout: u8,
    },
    /// The peer disconnects; [`Endpoint::disconnect`] sends the DREP.
    DreqReceived {
        /// The connection.
        id: CmId,
        /// The DREQ.
        dreq: Box<Dreq>,
    },
    /// The DREP for our DREQ arrived; the connection is in timewait.
    DrepReceived {
        /// The connection.
        id: CmId,
    },
    /// Timewait ended; the connection is gone.
    TimewaitExit {
        /// The connection.
        id: CmId,
    },
    /// A request ran out of retransmissions in `state` (kernel REQ/REP/DREQ/SIDR_REQ
    /// `_ERROR`; rdma_cm reports UNREACHABLE or DISCONNECTED with -ETIMEDOUT).
    Timeout {
        /// The connection.
        id: CmId,
        /// The state that timed out.
        state: CmState,
    },
    /// A SIDR_REQ for a listened service arrived; answer with [`Endpoint::sidr_reply`].
    SidrReqReceived {
        /// The request.
        id: CmId,
        /// The requester's IP.
        peer: IpAddr,
        /// The SIDR_REQ.
        req: Box<SidrReq>,
    },
    /// The SIDR_REP for our SIDR_REQ arrived.
    SidrRepReceived {
        /// The request.
        id: CmId,
        /// The SIDR_REP.
        rep: Box<SidrRep>,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn id(&self) -> CmId {
        match self {
            CmEvent::ReqReceived { id, .. }
            | CmEvent::RepReceived { id, .. }
            | CmEvent::Established { id }
            | CmEvent::Rejected { id, .. }
            | CmEvent::MraReceived { id, .. }
            | CmEvent::DreqReceived { id, .. }
            | CmEvent::DrepReceived { id }
            | CmEvent::TimewaitExit { id }
            | CmEvent::Timeout { id, .. }
            | CmEvent::SidrReqReceived { id, .. }
            | CmEvent::SidrRepReceived { id, .. } => *id,
        }
    }
}

/// What happened to received and sent MADs (like the kernel's `cm_rx_msgs`,
/// `cm_tx_retries`, `cm_rx_duplicates` sysfs groups, plus the drops).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// MADs handed to `handle_mad`.
    pub rx_mads: u64,
    /// Not a CM MAD of a supported kind, or malformed: dropped.
    pub rx_malformed: u64,
    /// No connection matches the comm IDs: dropped (or answered, for DREQ).
    pub rx_unmatched: u64,
    /// Matched a connection in a state that does not take it: dropped.
    pub rx_unexpected: u64,
    /// Duplicates (REQ, REP, RTU, MRA, DREQ, SIDR_REQ) recognised.
    pub rx_duplicates: u64,
    /// MADs queued for sending, retransmissions included.
    pub tx_mads: u64,
    /// Retransmissions.
    pub tx_retries: u64,
    /// Requests that ran out of retransmissions.
    pub timeouts: u64,
    /// REQs rejected with reason 8 (no listener) and SIDR_REQs answered "unsupported".
    pub req_no_listener: u64,
    /// REQs and REPs rejected as stale connections (reason 10).
    pub req_stale: u64,
    /// REQs and SIDR_REQs dropped because [`EndpointConfig::max_pending`] were waiting.
    pub req_over_limit: u64,
    /// DREQs dropped because their RemoteQPN is not the connection's QPN.
    pub dreq_bad_qpn: u64,
}

/// Attributes for moving the QP through INIT/RTR/RTS (kernel `ib_cm_init_qp_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttrs {
    /// The peer's QPN (RTR dest_qp_num).
    pub remote_qpn: Qpn,
    /// Our receive PSN (RTR rq_psn).
    pub rq_psn: Psn,
    /// Our send PSN (RTS sq_psn).
    pub sq_psn: Psn,
    /// Path MTU (IBTA encoding, taken verbatim from the REQ).
    pub path_mtu: u8,
    /// RTR max_dest_rd_atomic.
    pub responder_resources: u8,
    /// RTS max_rd_atomic.
    pub initiator_depth: u8,
    /// RTS retry count.
    pub retry_count: u8,
    /// RTS RNR retry.
    pub rnr_retry_count: u8,
    /// RTS local ACK timeout exponent.
    pub ack_timeout: u8,
}

#[derive(Clone, Debug)]
struct Retx {
    dst: IpAddr,
    mad: [u8; MAD_LEN],
    deadline: Nanos,
    interval: Nanos,
    retries_left: u8,
}

#[derive(Clone, Debug)]
struct Conn {
    state: CmState,
    peer: IpAddr,
    remote_id: CommId,
    remote_ca_guid: u64,
    service_id: ServiceId,
    tid: u64,
    local_qpn: Qpn,
    remote_qpn: Qpn,
    sq_psn: Psn,
    rq_psn: Psn,
    path_mtu: u8,
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    /// Retransmission interval of our requests (kernel `cm_id_priv->timeout_ms`).
    timeout_ms: u64,
    max_cm_retries: u8,
    /// Path timeout exponent (kernel `av.timeout`): timewait and the RTS ACK timeout.
    av_timeout: u8,
    /// Service timeout of the MRA we send on duplicates.
    service_timeout: u8,
    /// The primary path's traffic class: its MADs leave with it as their IP TOS (the
    /// kernel's CM sends on an address handle made from the path, `cm_init_av_by_path`).
    traffic_class: u8,
    /// Private data of the RTU, DREP or MRA we repeat on duplicates.
    resp_pd: Vec<u8>,
    retx: Option<Retx>,
    timewait_until: Option<Nanos>,
    /// In the duplicate (remote ID, GUID) and stale (remote QPN, GUID) tables.
    in_tables: bool,
    /// The consumer destroyed it in timewait: leave silently.
    destroyed: bool,
}

impl Conn {
    fn new(state: CmState, peer: IpAddr) -> Conn {
        Conn {
            state,
            peer,
            remote_id: 0,
            remote_ca_guid: 0,
            service_id: 0,
            tid: 0,
            local_qpn: Qpn::new(0),
            remote_qpn: Qpn::new(0),
            sq_psn: Psn::new(0),
            rq_psn: Psn::new(0),
            path_mtu: 0,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 0,
            rnr_retry_count: 0,
            timeout_ms: 0,
            max_cm_retries: 0,
            av_timeout: 0,
            service_timeout: 0,
            traffic_class: 0,
            resp_pd: Vec::new(),
            retx: None,
            timewait_until: None,
            in_tables: false,
            destroyed: false,
        }
    }

    fn deadline(&self) -> Option<Nanos> {
        match (self.retx.as_ref().map(|r| r.deadline), self.timewait_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A MAD to send to QP 1 of `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The peer's IP address (its GID).
    pub dst: IpAddr,
    /// The IP TOS to send it with: its connection's path traffic class, 0 for a MAD that
    /// belongs to none (a REJ or DREP for an unknown connection).
    pub traffic_class: u8,
    /// The MAD.
    pub mad: [u8; MAD_LEN],
}

/// The CM endpoint of one device (one CA GUID).
#[derive(Debug)]
pub struct Endpoint {
    cfg: EndpointConfig,
    next_id: u32,
    conns: FxHashMap<CommId, Conn>,
    listeners: FxHashMap<ServiceId, ()>,
    /// (remote comm ID, remote CA GUID) → local ID: duplicate REQ/REP detection
    /// (kernel `remote_id_table`).
    remote_ids: FxHashMap<(CommId, u64), CommId>,
    /// (remote QPN, remote CA GUID) → local ID: stale connection detection
    /// (kernel `remote_qp_table`).
    remote_qpns: FxHashMap<(u32, u64), CommId>,
    /// (request ID, requester IP) → local ID: duplicate SIDR_REQ detection
    /// (kernel `remote_sidr_table`).
    remote_sidr: FxHashMap<(CommId, IpAddr), CommId>,
    pending: usize,
    /// Requests for a service ID nobody listens on yet, waiting until their deadline
    /// ([`EndpointConfig::no_listener_grace`]; 0 once a listener came).
    unclaimed: Vec<Unclaimed>,
    transmits: VecDeque<Outgoing>,
    events: VecDeque<CmEvent>,
    counters: Counters,
}

impl Endpoint {
    /// A new endpoint.
    pub fn new(cfg: EndpointConfig) -> Endpoint {
        Endpoint {
            cfg,
            next_id: 0,
            conns: FxHashMap::default(),
            listeners: FxHashMap::default(),
            remote_ids: FxHashMap::default(),
            remote_qpns: FxHashMap::default(),
            remote_sidr: FxHashMap::default(),
            pending: 0,
            unclaimed: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// A connection's state, or `None` once it is gone.
    pub fn state(&self, id: CmId) -> Option<CmState> {
        self.conns.get(&id.0).map(|c| c.state)
    }

    /// Number of connections (any state, timewait included).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// QP attributes for a connection past the REQ (kernel `ib_cm_init_qp_attr`: the
    /// passive side sends with the REQ's PSN and receives with its REP's; the active
    /// side the other way round).
    pub fn qp_attrs(&self, id: CmId) -> Option<QpAttrs> {
        let c = self.conns.get(&id.0)?;
        Some(QpAttrs {
            remote_qpn: c.remote_qpn,
            rq_psn: c.rq_psn,
            sq_psn: c.sq_psn,
            path_mtu: c.path_mtu,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            retry_count: c.retry_count,
            rnr_retry_count: c.rnr_retry_count,
            ack_timeout: c.av_timeout,
        })
    }

    /// Next MAD to send, to QP1 with Q_Key [`mad::GSI_QKEY`].
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.transmits.pop_front()
    }

    /// Next event for the consumer.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest time [`Endpoint::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let held = self.unclaimed.iter().map(|u| u.until);
        self.conns
            .values()
            .filter_map(Conn::deadline)
            .chain(held)
            .min()
    }

    // ----------------------------------------------------------------- commands

    /// Accept REQs and SIDR_REQs for `service_id` (exact match, as rdma_cm listens).
    pub fn listen(&mut self, service_id: ServiceId) -> Result<(), CmError> {
        if self.listeners.insert(service_id, ()).is_some() {
            return Err(CmError::AlreadyListening(service_id));
        }
        // Requests that came early are due now: the next handle_timeout hands them over.
        for u in &mut self.unclaimed {
            if u.service_id() == service_id {
                u.until = 0;
            }
        }
        Ok(())
    }

    /// Stop listening; connections already made are unaffected. True if it was listened on.
    pub fn unlisten(&mut self, service_id: ServiceId) -> bool {
        self.listeners.remove(&service_id).is_some()
    }

    /// Send a REQ (kernel `ib_send_cm_req`). Retransmitted every
    /// `2 × conv(packet_life_time) + conv(remote_cm_response_timeout)` ms, up to
    /// `max_cm_retries` times, then [`CmEvent::Timeout`].
    pub fn connect(&mut self, now: Nanos, p: &ConnectParams) -> Result<CmId, CmError> {
        let local_id = self.alloc_id()?;
        let subnet_local = p.hop_limit <= 1;
        // Permissive LIDs when routed, as the kernel does for any RoCE path (hop limit 64).
        let lid = if subnet_local { 0 } else { 0xffff };
        let tid = self.form_tid(local_id);
        let req = Req {
            local_comm_id: local_id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            transport: p.transport,
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: p.retry_count,
            pkey: p.pkey,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport: 0,
            primary: ReqPath {
                local_lid: lid,
                remote_lid: lid,
                local_gid: p.local_gid,
                remote_gid: p.remote_gid,
                flow_label: p.flow_label,
                packet_rate: p.packet_rate,
                traffic_class: p.traffic_class,
                hop_limit: p.hop_limit,
                sl: p.sl,
                subnet_local,
                local_ack_timeout: cm_ack_timeout(self.cfg.ca_ack_delay, p.packet_life_time),
            },
            alternate: ReqPath::default(),
            sap_supported: false,
            private_data: private_data(&p.private_data)?,
        };
        let mad = encode(tid, CmBody::Req(req))?;
        let mut c = Conn::new(CmState::ReqSent, p.peer);
        c.service_id = p.service_id;
        c.tid = tid;
        c.local_qpn = p.local_qpn;
        c.rq_psn = p.starting_psn;
        c.path_mtu = p.path_mtu;
        c.responder_resources = p.responder_resources;
        c.initiator_depth = p.initiator_depth;
        c.retry_count = p.retry_count;
        c.rnr_retry_count = p.rnr_retry_count;
        c.timeout_ms = 2 * cm_convert_to_ms(p.packet_life_time)
            + cm_convert_to_ms(p.remote_cm_response_timeout);
        c.max_cm_retries = p.max_cm_retries;
        c.av_timeout = p.packet_life_time.saturating_add(1);
        c.traffic_class = p.traffic_class;
        self.conns.insert(local_id, c);
        self.send_request(now, local_id, mad);
        Ok(CmId(local_id))
    }

    /// Answer a received REQ with a REP (kernel `ib_send_cm_rep`). Retransmitted every
    /// `conv(REQ.LocalCMResponseTimeout)` ms, up to the REQ's MaxCMRetries, until RTU.
    pub fn accept(&mut self, now: Nanos, id: CmId, p: &AcceptParams) -> Result<(), CmError> {
        let c = self.conn(id)?;
        if !matches!(c.state, CmState::ReqRcvd | CmState::MraReqSent) {
            return Err(CmError::InvalidState(c.state));
        }
        let rep = Rep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            vendor_id: 0,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: self.cfg.ca_ack_delay.min(31),
            failover_accepted: p.failover_accepted,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.cfg.ca_guid,
            private_data: private_data(&p.private_data)?,
        };
        let mad = encode(c.tid, CmBody::Rep(rep))?;
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.local_qpn = p.local_qpn;
            c.rq_psn = p.starting_psn;
            c.initiator_depth = p.initiator_depth;
            c.responder_resources = p.responder_resources;
        }
        self.set_state(id.0, CmState::RepSent);
        self.send_request(now, id.0, mad);
        Ok(())
    }

    /// Reject (kernel `ib_send_cm_rej`): a received REQ or REP, or our own REQ in flight.
    /// The connection goes idle (gone), or to timewait if we had sent a REP.
    pub fn reject(
        &mut self,
        now: Nanos,
        id: CmId,
        reason: RejReason,
        private: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conn(id)?;
        let state = c.state;
        if !matches!(
            state,
            CmState::ReqSent
                | CmState::MraReqRcvd
                | CmState::ReqRcvd
                | CmState::MraReqSent
                | CmState::RepRcvd
                | CmState::MraRepSent
                | CmState::RepSent
                | CmState::MraRepRcvd
        ) {
            return Err(CmError::InvalidState(state));
        }
        let pd = private_data(private)?;
        self.send_rej(id.0, reason, &[], pd);
        if matches!(state, CmState::RepSent | CmState::MraRepRcvd) {
            self.enter_timewait(now, id.0);
        } else {
            self.remove(id.0);
        }
        Ok(())
    }

    /// Move to ESTABLISHED. Active side in REP_RCVD: send the RTU (kernel
    /// `ib_send_cm_rtu`; rdma_cm does it once the QP is in RTS). Passive side in REP_SENT:
    /// the first packet arrived on the QP before the RTU (kernel `ib_cm_notify(COMM_EST)`),
    /// reported as [`CmEvent::Established`].
    pub fn establish(&mut self, now: Nanos, id: CmId, rtu_private: &[u8]) -> Result<(), CmError> {
        let _ = now;
        let c = self.conn(id)?;
        match c.state {
            CmState::RepRcvd | CmState::MraRepSent => {
                let rtu = Rtu {
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_id,
                    private_data: private_data(rtu_private)?,
                };
                let (tid, peer, tc) = (c.tid, c.peer, c.traffic_class);
                let mad = encode(tid, CmBody::Rtu(rtu))?;
                if let Some(c) = self.conns.get_mut(&id.0) {
                    c.resp_pd = rtu_private.to_vec();
                }
                self.set_state(id.0, CmState::Established);
                self.transmit(peer, tc, mad);
                Ok(())
            }
            CmState::RepSent | CmState::MraRepRcvd => {
                self.cancel_retx(id.0);
                self.set_state(id.0, CmState::Established);
                self.events.push_back(CmEvent::Established { id });
                Ok(())
            }
            CmState::Established => Err(CmError::InvalidState(CmState::Established)),
            s => Err(CmError::InvalidState(s)),
        }
    }

    /// Disconnect (rdma_cm `rdma_disconnect`): ESTABLISHED sends a DREQ (retransmitted,
    /// [`CmEvent::DrepReceived`] or [`CmEvent::Timeout`] ends it); DREQ_RCVD sends the DREP
    /// and enters timewait.
    pub fn disconnect(&mut self, now: Nanos, id: CmId, private: &[u8]) -> Result<(), CmError> {
        let c = self.conn(id)?;
        match c.state {
            CmState::Established => {
                let dreq = Dreq {
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_id,
                    remote_qpn: c.remote_qpn,
                    private_data: private_data(private)?,
                };
                let mad = encode(self.form_tid(id.0), CmBody::Dreq(dreq))?;
                self.set_state(id.0, CmState::DreqSent);
                self.send_request(now, id.0, mad);
                Ok(())
            }
            CmState::DreqRcvd => {
                let drep = Drep {
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_id,
                    private_data: private_data(private)?,
                };
                let (tid, peer, tc) = (c.tid, c.peer, c.traffic_class);
                let mad = encode(tid, CmBody::Drep(drep))?;
                if let Some(c) = self.conns.get_mut(&id.0) {
                    c.resp_pd = private.to_vec();
                }
                self.enter_timewait(now, id.0);
                self.transmit(peer, tc, mad);
                Ok(())
            }
            s => Err(CmError::InvalidState(s)),
        }
    }

    /// Destroy a connection as the kernel's `cm_destroy_id` does: REJ a pending REQ (28) or
    /// our own REQ (4, timeout, with our GUID as ARI), DREQ an established connection, DREP
    /// a received DREQ, answer a SIDR_REQ with "reject". No event follows. Unknown IDs are
    /// accepted (the connection may already be gone).
    pub fn destroy(&mut self, now: Nanos, id: CmId) {
        let Some(c) = self.conns.get(&id.0) else {
            return;
        };
        match c.state {
            CmState::ReqSent | CmState::MraReqRcvd => {
                let guid = self.cfg.ca_guid.to_be_bytes();
                self.send_rej(
                    id.0,
                    RejReason::Timeout,
                    &guid,
                    [0; mad::private_data_len::REJ],
                );
                self.remove(id.0);
            }
            CmState::ReqRcvd
            | CmState::MraReqSent
            | CmState::RepSent
            | CmState::MraRepRcvd
            | CmState::RepRcvd
            | CmState::MraRepSent => {
                self.send_rej(
                    id.0,
                    RejReason::ConsumerDefined,
                    &[],
                    [0; mad::private_data_len::REJ],
                );
                self.remove(id.0);
            }
            CmState::Established => {
                // The DREQ's retransmissions run on after destroy, like the kernel's
                // timewait_info outliving the cm_id; the consumer hears nothing more.
                let _ = self.disconnect(now, id, &[]);
                if let Some(c) = self.conns.get_mut(&id.0) {
                    c.destroyed = true;
                }
            }
            CmState::DreqSent => {
                self.cancel_retx(id.0);
                self.enter_timewait(now, id.0);
                if let Some(c) = self.conns.get_mut(&id.0) {
                    c.destroyed = true;
                }
            }
            CmState::DreqRcvd => {
                let _ = self.disconnect(now, id, &[]);
                if let Some(c) = self.conns.get_mut(&id.0) {
                    c.destroyed = true;
                }
            }
            CmState::Timewait => {
                if let Some(c) = self.conns.get_mut(&id.0) {
                    c.destroyed = true;
                }
            }
            CmState::SidrReqRcvd => {
                let p = SidrReplyParams {
                    status: SidrStatus::Reject,
                    qpn: Qpn::new(0),
                    qkey: 0,
                    private_data: Vec::new(),
                };
                let _ = self.sidr_reply(now, id, &p);
            }
            CmState::SidrReqSent | CmState::Idle => self.remove(id.0),
        }
    }

    /// Send a SIDR_REQ (kernel `ib_send_cm_sidr_req`), retransmitted every
    /// `timeout_ms` up to `max_cm_retries` times.
    pub fn sidr_request(&mut self, now: Nanos, p: &SidrRequestParams) -> Result<CmId, CmError> {
        let local_id = self.alloc_id()?;
        let req = SidrReq {
            request_id: local_id,
            pkey: p.pkey,
            service_id: p.service_id,
            private_data: private_data(&p.private_data)?,
        };
        let tid = self.form_tid(local_id);
        let mad = encode(tid, CmBody::SidrReq(req))?;
        let mut c = Conn::new(CmState::SidrReqSent, p.peer);
        c.service_id = p.service_id;
        c.tid = tid;
        c.timeout_ms = p.timeout_ms;
        c.max_cm_retries = p.max_cm_retries;
        c.traffic_class = p.traffic_class;
        self.conns.insert(local_id, c);
        self.send_request(now, local_id, mad);
        Ok(CmId(local_id))
    }

    /// Answer a received SIDR_REQ (kernel `ib_send_cm_sidr_rep`); the request is then gone.
    pub fn sidr_reply(&mut self, now: Nanos, id: CmId, p: &SidrReplyParams) -> Result<(), CmError> {
        let _ = now;
        let c = self.conn(id)?;
        if c.state != CmState::SidrReqRcvd {
            return Err(CmError::InvalidState(c.state));
        }
        let rep = SidrRep {
            request_id: c.remote_id,
            status: p.status,
            add_info_len: 0,
            vendor_id: 0,
            qpn: p.qpn,
            service_id: c.service_id,
            qkey: p.qkey,
            add_info: [0; mad::SIDR_REP_INFO_LEN],
            private_data: private_data(&p.private_data)?,
        };
        let (tid, peer, tc) = (c.tid, c.peer, c.traffic_class);
        let mad = encode(tid, CmBody::SidrRep(rep))?;
        self.transmit(peer, tc, mad);
        self.remove(id.0);
        Ok(())
    }

    // ----------------------------------------------------------------- input

    /// Process a MAD received on QP1 from `src` (the IP the device saw it come from) with
    /// IP TOS `traffic_class` (its GRH's). Bad or unexpected MADs are dropped and counted,
    /// never reported as errors.
    pub fn handle_mad(&mut self, now: Nanos, src: IpAddr, traffic_class: u8, mad_bytes: &[u8]) {
        let from = MadFrom {
            ip: src,
            traffic_class,
        };
        self.counters.rx_mads += 1;
        let msg = match mad::parse(mad_bytes) {
            Ok(m) => m,
            Err(_) => {
                self.counters.rx_malformed += 1;
                return;
            }
        };
        let tid = msg.hdr.tid;
        match msg.body {
            CmBody::Req(r) => self.on_req(now, from, tid, r, true),
            CmBody::Mra(m) => self.on_mra(now, m),
            CmBody::Rej(r) => self.on_rej(now, r),
            CmBody::Rep(r) => self.on_rep(now, from, tid, r),
            CmBody::Rtu(r) => self.on_rtu(r),
            CmBody::Dreq(d) => self.on_dreq(now, from, tid, d),
            CmBody::Drep(d) => self.on_drep(now, d),
            CmBody::SidrReq(r) => self.on_sidr_req(now, from, tid, r, true),
            CmBody::SidrRep(r) => self.on_sidr_rep(r),
        }
    }

    /// Run the timers due at `now`: retransmissions, request timeouts, timewait exits.
    pub fn handle_timeout(&mut self, now: Nanos) {
        let due: Vec<CommId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline().is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.fire(now, id);
        }
        let (due, waiting) = std::mem::take(&mut self.unclaimed)
            .into_iter()
            .partition(|u| u.until <= now);
        self.unclaimed = waiting;
        for u in due {
            match u.request {
                Request::Req(r) => self.on_req(now, u.from, u.tid, r, false),
                Request::Sidr(r) => self.on_sidr_req(now, u.from, u.tid, r, false),
            }
        }
    }

    /// Keeps a request for a service ID nobody listens on until a listener comes or
    /// the grace ends; false when there is no grace or no room (answer it now).
    fn hold(&mut self, now: Nanos, from: MadFrom, tid: u64, request: Request) -> bool {
        if self.cfg.no_listener_grace == 0 || self.unclaimed.len() >= self.cfg.max_pending {
            return false;
        }
        self.unclaimed.push(Unclaimed {
            until: now.saturating_add(self.cfg.no_listener_grace),
            from,
            tid,
            request,
        });
        true
    }

    fn fire(&mut self, now: Nanos, id: CommId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(r) = c.retx.as_mut().filter(|r| r.deadline <= now) {
            if r.retries_left > 0 {
                r.retries_left -= 1;
                r.deadline = now.saturating_add(r.interval);
                let (dst, m, tc) = (r.dst, r.mad, c.traffic_class);
                self.counters.tx_retries += 1;
                self.transmit(dst, tc, m);
            } else {
                c.retx = None;
                let state = c.state;
                self.counters.timeouts += 1;
                self.send_error(now, id, state);
            }
            return;
        }
        if c.timewait_until.is_some_and(|t| t <= now) {
            let destroyed = c.destroyed;
            self.remove(id);
            if !destroyed {
                self.events
                    .push_back(CmEvent::TimewaitExit { id: CmId(id) });
            }
        }
    }

    /// Retransmissions ran out (kernel `cm_process_send_error`).
    fn send_error(&mut self, now: Nanos, id: CommId, state: CmState) {
        let destroyed = self.conns.get(&id).is_some_and(|c| c.destroyed);
        match state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::RepSent
            | CmState::MraRepRcvd
            | CmState::SidrReqSent => self.remove(id),
            CmState::DreqSent => self.enter_timewait(now, id),
            _ => return,
        }
        if !destroyed {
            self.events.push_back(CmEvent::Timeout {
                id: CmId(id),
                state,
            });
        }
    }

    /// REQ (kernel `cm_req_handler`, `cm_match_req`).
    fn on_req(&mut self, now: Nanos, from: MadFrom, tid: u64, req: Req, may_hold: bool) {
        let src = from.ip;
        // Duplicate: this (remote comm ID, CA GUID) already has a connection here.
        if let Some(&local) = self.remote_ids.get(&(req.local_comm_id, req.local_ca_guid)) {
            self.counters.rx_duplicates += 1;
            self.dup_req(local);
            return;
        }
        // Stale: the remote QP still belongs to a live connection here. Reject the new
        // REQ and tear the old connection down.
        if let Some(&old) = self
            .remote_qpns
            .get(&(req.local_qpn.value(), req.local_ca_guid))
        {
            // The kernel's REJ takes its LocalCommID from the REQ's bytes 28-31
            // (`cm_issue_rej` reads CM_REJ_REMOTE_COMM_ID of the received MAD).
            let ids = (req.vendor_id, req.local_comm_id);
            self.reject_stale(now, (from, tid), ids, old, MsgResponse::Req);
            return;
        }
        if !self.listeners.contains_key(&req.service_id) {
            if may_hold && self.hold(now, from, tid, Request::Req(req)) {
                return;
            }
            self.counters.req_no_listener += 1;
            self.issue_rej(
                from,
                tid,
                req.vendor_id,
                req.local_comm_id,
                RejReason::InvalidServiceId,
                MsgResponse::Req,
            );
            return;
        }
        if self.pending >= self.cfg.max_pending {
            self.counters.req_over_limit += 1;
            return;
        }
        let Ok(local) = self.alloc_id() else {
            self.counters.req_over_limit += 1;
            return;
        };
        let mut c = Conn::new(CmState::ReqRcvd, src);
        c.remote_id = req.local_comm_id;
        c.remote_ca_guid = req.local_ca_guid;
        c.service_id = req.service_id;
        c.tid = tid;
        c.remote_qpn = req.local_qpn;
        c.sq_psn = req.starting_psn;
        c.path_mtu = req.path_mtu;
        // The passive side swaps the REQ's resources (`cm_req_handler`).
        c.initiator_depth = req.responder_resources;
        c.responder_resources = req.initiator_depth;
        c.retry_count = req.retry_count;
        c.rnr_retry_count = req.rnr_retry_count;
        c.timeout_ms = cm_convert_to_ms(req.local_cm_response_timeout);
        c.max_cm_retries = req.max_cm_retries;
        // Path lifetime = LocalAckTimeout - 1 (`cm_format_paths_from_req`), av.timeout = + 1.
        c.av_timeout = req.primary.local_ack_timeout.max(1);
        c.traffic_class = req.primary.traffic_class;
        c.in_tables = true;
        self.remote_ids
            .insert((req.local_comm_id, req.local_ca_guid), local);
        self.remote_qpns
            .insert((req.local_qpn.value(), req.local_ca_guid), local);
        self.conns.insert(local, c);
        self.pending += 1;
        if let Some(t) = self.cfg.delayed_mra_service_timeout {
            if let Some(c) = self.conns.get_mut(&local) {
                c.service_timeout = t.min(31);
            }
            self.set_state(local, CmState::MraReqSent);
        }
        self.events.push_back(CmEvent::ReqReceived {
            id: CmId(local),
            peer: src,
            req: Box::new(req),
        });
    }

    /// A duplicate REQ (kernel `cm_dup_req_handler`): MRA if one is armed, REJ stale in
    /// timewait, otherwise nothing (a REP in flight is retransmitted by its own timer).
    fn dup_req(&mut self, local: CommId) {
        let Some(c) = self.conns.get(&local) else {
            return;
        };
        match c.state {
            CmState::MraReqSent => {
                let mra = Mra {
                    local_comm_id: local,
                    remote_comm_id: c.remote_id,
                    msg_mraed: MsgResponse::Req,
                    service_timeout: c.service_timeout,
                    private_data: private_data(&c.resp_pd).unwrap_or([0; 222]),
                };
                let (tid, peer, tc) = (c.tid, c.peer, c.traffic_class);
                if let Ok(m) = encode(tid, CmBody::Mra(mra)) {
                    self.transmit(peer, tc, m);
                }
            }
            CmState::Timewait => {
                self.send_rej(
                    local,
                    RejReason::StaleConn,
                    &[],
                    [0; mad::private_data_len::REJ],
                );
            }
            _ => {}
        }
    }

    /// REP (kernel `cm_rep_handler`, `cm_dup_rep_handler`).
    fn on_rep(&mut self, now: Nanos, from: MadFrom, tid: u64, rep: Rep) {
        let _ = now;
        let fresh = self
            .conns
            .get(&rep.remote_comm_id)
            .is_some_and(|c| c.remote_id == 0 && !c.in_tables);
        if !fresh {
            // A repeat of a REP we already took: answer with the RTU again, or the MRA.
            let Some(c) = self
                .conns
                .get(&rep.remote_comm_id)
                .filter(|c| c.remote_id == rep.local_comm_id)
            else {
                self.counters.rx_unmatched += 1;
                return;
            };
            self.counters.rx_duplicates += 1;
            let (tid, peer, remote, tc) = (c.tid, c.peer, c.remote_id, c.traffic_class);
            let body = match c.state {
                CmState::Established => CmBody::Rtu(Rtu {
                    local_comm_id: rep.remote_comm_id,
                    remote_comm_id: remote,
                    private_data: private_data(&c.resp_pd).unwrap_or([0; 224]),
                }),
                CmState::MraRepSent => CmBody::Mra(Mra {
                    local_comm_id: rep.remote_comm_id,
                    remote_comm_id: remote,
                    msg_mraed: MsgResponse::Rep,
                    service_timeout: c.service_timeout,
                    private_data: private_data(&c.resp_pd).unwrap_or([0; 222]),
                }),
                _ => return,
            };
            if let Ok(m) = encode(tid, body) {
                self.transmit(peer, tc, m);
            }
            return;
        }
        let local = rep.remote_comm_id;
        let state = self.state(CmId(local));
        if !matches!(state, Some(CmState::ReqSent | CmState::MraReqRcvd)) {
            self.counters.rx_unexpected += 1;
            return;
        }
        if self
            .remote_ids
            .contains_key(&(rep.local_comm_id, rep.local_ca_guid))
        {
            self.counters.rx_duplicates += 1;
            return;
        }
        if let Some(&old) = self
            .remote_qpns
            .get(&(rep.local_qpn.value(), rep.local_ca_guid))
        {
            let ids = (rep.remote_comm_id, rep.local_comm_id);
            self.reject_stale(now, (from, tid), ids, old, MsgResponse::Rep);
            return;
        }
        self.remote_ids
            .insert((rep.local_comm_id, rep.local_ca_guid), local);
        self.remote_qpns
            .insert((rep.local_qpn.value(), rep.local_ca_guid), local);
        let ca_ack_delay = rep.target_ack_delay;
        if let Some(c) = self.conns.get_mut(&local) {
            c.in_tables = true;
            c.remote_id = rep.local_comm_id;
            c.remote_ca_guid = rep.local_ca_guid;
            c.remote_qpn = rep.local_qpn;
            c.sq_psn = rep.starting_psn;
            c.initiator_depth = rep.responder_resources;
            c.responder_resources = rep.initiator_depth;
            c.rnr_retry_count = rep.rnr_retry_count;
            c.av_timeout = cm_ack_timeout(ca_ack_delay, c.av_timeout.saturating_sub(1));
        }
        self.cancel_retx(local);
        self.set_state(local, CmState::RepRcvd);
        // rdma_cm arms a delayed MRA for the REP too (`cma_ib_handler`, REP_RECEIVED): a
        // duplicate REP before our RTU is then answered with it.
        if let Some(t) = self.cfg.delayed_mra_service_timeout {
            if let Some(c) = self.conns.get_mut(&local) {
                c.service_timeout = t.min(31);
            }
            self.set_state(local, CmState::MraRepSent);
        }
        self.events.push_back(CmEvent::RepReceived {
            id: CmId(local),
            rep: Box::new(rep),
        });
    }

    /// RTU (kernel `cm_rtu_handler`).
    fn on_rtu(&mut self, rtu: Rtu) {
        let Some(c) = self.matched(rtu.remote_comm_id, rtu.local_comm_id) else {
            return;
        };
        if !matches!(c.state, CmState::RepSent | CmState::MraRepRcvd) {
            self.counters.rx_duplicates += 1;
            return;
        }
        let local = rtu.remote_comm_id;
        self.cancel_retx(local);
        self.set_state(local, CmState::Established);
        self.events
            .push_back(CmEvent::Established { id: CmId(local) });
    }

    /// REJ (kernel `cm_acquire_rejected_id`, `cm_rej_handler`).
    fn on_rej(&mut self, now: Nanos, rej: Rej) {
        let local = if rej.reason == RejReason::Timeout {
            // The ARI carries the rejecting side's CA GUID.
            let guid = rej
                .ari
                .first_chunk::<8>()
                .map_or(0, |g| u64::from_be_bytes(*g));
            self.remote_ids.get(&(rej.local_comm_id, guid)).copied()
        } else if rej.msg_rejected == MsgResponse::Req {
            Some(rej.remote_comm_id).filter(|id| {
                self.conns
                    .get(id)
                    .is_some_and(|c| c.remote_id == 0 && !c.in_tables)
            })
        } else {
            Some(rej.remote_comm_id).filter(|id| {
                self.conns
                    .get(id)
                    .is_some_and(|c| c.remote_id == rej.local_comm_id)
            })
        };
        let Some(local) = local else {
            self.counters.rx_unmatched += 1;
            return;
        };
        let Some(state) = self.state(CmId(local)) else {
            return;
        };
        match state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::RepSent
            | CmState::MraRepRcvd
            | CmState::ReqRcvd
            | CmState::MraReqSent => {
                self.cancel_retx(local);
                if rej.reason == RejReason::StaleConn {
                    self.enter_timewait(now, local);
                } else {
                    self.remove(local);
                }
            }
            CmState::DreqSent | CmState::RepRcvd | CmState::MraRepSent | CmState::Established => {
                self.cancel_retx(local);
                self.enter_timewait(now, local);
            }
            _ => {
                self.counters.rx_unexpected += 1;
                return;
            }
        }
        self.events.push_back(CmEvent::Rejected {
            id: CmId(local),
            rej: Box::new(rej),
        });
    }

    /// MRA (kernel `cm_acquire_mraed_id`, `cm_mra_handler`): the peer needs
    /// `conv(service_timeout)` more; the retransmission timer becomes that plus the path's.
    fn on_mra(&mut self, now: Nanos, mra: Mra) {
        let found = match mra.msg_mraed {
            MsgResponse::Req => self
                .conns
                .get(&mra.remote_comm_id)
                .filter(|c| c.remote_id == 0 && !c.in_tables)
                .map(|_| mra.remote_comm_id),
            _ => self
                .matched(mra.remote_comm_id, mra.local_comm_id)
                .map(|_| mra.remote_comm_id),
        };
        let Some(local) = found else {
            self.counters.rx_unmatched += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&local) else {
            return;
        };
        let next = match (c.state, mra.msg_mraed) {
            (CmState::ReqSent, MsgResponse::Req) => CmState::MraReqRcvd,
            (CmState::RepSent, MsgResponse::Rep) => CmState::MraRepRcvd,
            (CmState::MraReqRcvd | CmState::MraRepRcvd, _) => {
                self.counters.rx_duplicates += 1;
                return;
            }
            _ => {
                self.counters.rx_unexpected += 1;
                return;
            }
        };
        let ms = cm_convert_to_ms(mra.service_timeout) + cm_convert_to_ms(c.av_timeout);
        if let Some(r) = c.retx.as_mut() {
            r.interval = ms * NANOS_PER_MS;
            r.deadline = now.saturating_add(r.interval);
        }
        self.set_state(local, next);
        self.events.push_back(CmEvent::MraReceived {
            id: CmId(local),
            service_timeout: mra.service_timeout,
        });
    }

    /// DREQ (kernel `cm_dreq_handler`).
    fn on_dreq(&mut self, now: Nanos, from: MadFrom, tid: u64, dreq: Dreq) {
        let _ = now;
        let Some(c) = self.matched(dreq.remote_comm_id, dreq.local_comm_id) else {
            // Our side is already gone: answer so the peer stops retransmitting
            // (`cm_issue_drep`).
            self.counters.rx_duplicates += 1;
            let drep = Drep {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: [0; mad::private_data_len::DREP],
            };
            if let Ok(m) = encode(tid, CmBody::Drep(drep)) {
                self.transmit(from.ip, from.traffic_class, m);
            }
            return;
        };
        if c.local_qpn != dreq.remote_qpn {
            self.counters.dreq_bad_qpn += 1;
            return;
        }
        let local = dreq.remote_comm_id;
        match c.state {
            CmState::RepSent | CmState::DreqSent | CmState::Established | CmState::MraRepRcvd => {}
            CmState::Timewait => {
                self.counters.rx_duplicates += 1;
                let drep = Drep {
                    local_comm_id: local,
                    remote_comm_id: c.remote_id,
                    private_data: private_data(&c.resp_pd).unwrap_or([0; 224]),
                };
                let (peer, tc) = (c.peer, c.traffic_class);
                if let Ok(m) = encode(tid, CmBody::Drep(drep)) {
                    self.transmit(peer, tc, m);
                }
                return;
            }
            CmState::DreqRcvd => {
                self.counters.rx_duplicates += 1;
                return;
            }
            _ => {
                self.counters.rx_unexpected += 1;
                return;
            }
        }
        self.cancel_retx(local);
        if let Some(c) = self.conns.get_mut(&local) {
            c.tid = tid;
        }
        self.set_state(local, CmState::DreqRcvd);
        let destroyed = self.conns.get(&local).is_some_and(|c| c.destroyed);
        if destroyed {
            // Destroyed while our DREQ was in flight and the peer's crossed it: just answer.
            let _ = self.disconnect(now, CmId(local), &[]);
            return;
        }
        self.events.push_back(CmEvent::DreqReceived {
            id: CmId(local),
            dreq: Box::new(dreq),
        });
    }

    /// DREP (kernel `cm_drep_handler`).
    fn on_drep(&mut self, now: Nanos, drep: Drep) {
        let Some(c) = self.matched(drep.remote_comm_id, drep.local_comm_id) else {
            return;
        };
        if !matches!(c.state, CmState::DreqSent | CmState::DreqRcvd) {
            self.counters.rx_unexpected += 1;
            return;
        }
        let local = drep.remote_comm_id;
        let destroyed = c.destroyed;
        self.cancel_retx(local);
        self.enter_timewait(now, local);
        if !destroyed {
            self.events
                .push_back(CmEvent::DrepReceived { id: CmId(local) });
        }
    }

    /// SIDR_REQ (kernel `cm_sidr_req_handler`).
    fn on_sidr_req(&mut self, now: Nanos, from: MadFrom, tid: u64, req: SidrReq, may_hold: bool) {
        let src = from.ip;
        if self.remote_sidr.contains_key(&(req.request_id, src)) {
            self.counters.rx_duplicates += 1;
            return;
        }
        let listened = self.listeners.contains_key(&req.service_id);
        if listened && self.pending >= self.cfg.max_pending {
            self.counters.req_over_limit += 1;
            return;
        }
        if !listened && may_hold && self.hold(now, from, tid, Request::Sidr(req)) {
            return;
        }
        if !listened {
            self.counters.req_no_listener += 1;
            let rep = SidrRep {
                request_id: req.request_id,
                status: SidrStatus::Unsupported,
                add_info_len: 0,
                vendor_id: 0,
                qpn: Qpn::new(0),
                service_id: req.service_id,
                qkey: 0,
                add_info: [0; mad::SIDR_REP_INFO_LEN],
                private_data: [0; mad::private_data_len::SIDR_REP],
            };
            if let Ok(m) = encode(tid, CmBody::SidrRep(rep)) {
                self.transmit(src, from.traffic_class, m);
            }
            return;
        }
        let Ok(local) = self.alloc_id() else {
            self.counters.req_over_limit += 1;
            return;
        };
        let mut c = Conn::new(CmState::SidrReqRcvd, src);
        // The SIDR_REP goes back on the request's TOS (`cm_init_av_for_response`).
        c.traffic_class = from.traffic_class;
        c.remote_id = req.request_id;
        c.service_id = req.service_id;
        c.tid = tid;
        self.conns.insert(local, c);
        self.pending += 1;
        self.remote_sidr.insert((req.request_id, src), local);
        self.events.push_back(CmEvent::SidrReqReceived {
            id: CmId(local),
            peer: src,
            req: Box::new(req),
        });
    }

    /// SIDR_REP (kernel `cm_sidr_rep_handler`).
    fn on_sidr_rep(&mut self, rep: SidrRep) {
        let Some(c) = self.conns.get(&rep.request_id) else {
            self.counters.rx_unmatched += 1;
            return;
        };
        if c.state != CmState::SidrReqSent {
            self.counters.rx_unexpected += 1;
            return;
        }
        self.remove(rep.request_id);
        self.events.push_back(CmEvent::SidrRepReceived {
            id: CmId(rep.request_id),
            rep: Box::new(rep),
        });
    }

    // ----------------------------------------------------------------- helpers

    fn conn(&self, id: CmId) -> Result<&Conn, CmError> {
        self.conns.get(&id.0).ok_or(CmError::UnknownId(id.0))
    }

    /// The connection `local` whose remote ID is `remote` (kernel `cm_acquire_id`), or
    /// `None` counted as unmatched.
    fn matched(&mut self, local: CommId, remote: CommId) -> Option<Conn> {
        match self.conns.get(&local).filter(|c| c.remote_id == remote) {
            Some(c) => Some(c.clone()),
            None => {
                self.counters.rx_unmatched += 1;
                None
            }
        }
    }

    fn alloc_id(&mut self) -> Result<CommId, CmError> {
        // At most a few probes: IDs are only busy while their connection lives.
        for _ in 0..1024 {
            let id = self.next_id ^ self.cfg.comm_id_operand;
            self.next_id = self.next_id.wrapping_add(1);
            // 0 means "no comm ID yet" in REJ and in our own lookups.
            if id != 0 && !self.conns.contains_key(&id) {
                return Ok(id);
            }
        }
        Err(CmError::NoCommId)
    }

    fn form_tid(&self, local_id: CommId) -> u64 {
        (u64::from(self.cfg.hi_tid) << 32) | u64::from(local_id)
    }

    fn set_state(&mut self, id: CommId, state: CmState) {
        if let Some(c) = self.conns.get_mut(&id) {
            let was = c.state.is_pending();
            c.state = state;
            match (was, state.is_pending()) {
                (true, false) => self.pending = self.pending.saturating_sub(1),
                (false, true) => self.pending += 1,
                _ => {}
            }
        }
    }

    fn untable(&mut self, id: CommId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.in_tables {
            c.in_tables = false;
            let (rid, qpn, guid) = (c.remote_id, c.remote_qpn.value(), c.remote_ca_guid);
            if self.remote_ids.get(&(rid, guid)) == Some(&id) {
                self.remote_ids.remove(&(rid, guid));
            }
            if self.remote_qpns.get(&(qpn, guid)) == Some(&id) {
                self.remote_qpns.remove(&(qpn, guid));
            }
        }
    }

    fn remove(&mut self, id: CommId) {
        self.untable(id);
        if let Some(c) = self.conns.remove(&id) {
            if c.state.is_pending() {
                self.pending = self.pending.saturating_sub(1);
            }
            if c.state == CmState::SidrReqRcvd {
                self.remote_sidr.remove(&(c.remote_id, c.peer));
            }
        }
    }

    /// Timewait (kernel `cm_enter_timewait`): leave the duplicate and stale tables and hold
    /// the comm ID for `conv(av.timeout)` ms.
    fn enter_timewait(&mut self, now: Nanos, id: CommId) {
        self.untable(id);
        self.set_state(id, CmState::Timewait);
        if let Some(c) = self.conns.get_mut(&id) {
            c.retx = None;
            c.timewait_until =
                Some(now.saturating_add(cm_convert_to_ms(c.av_timeout) * NANOS_PER_MS));
        }
    }

    fn cancel_retx(&mut self, id: CommId) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.retx = None;
        }
    }

    fn transmit(&mut self, dst: IpAddr, traffic_class: u8, mad: [u8; MAD_LEN]) {
        self.counters.tx_mads += 1;
        self.transmits.push_back(Outgoing {
            dst,
            traffic_class,
            mad,
        });
    }

    /// Send a request that expects an answer and arm its retransmission.
    fn send_request(&mut self, now: Nanos, id: CommId, mad: [u8; MAD_LEN]) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let interval = c.timeout_ms.saturating_mul(NANOS_PER_MS);
        c.retx = Some(Retx {
            dst: c.peer,
            mad,
            deadline: now.saturating_add(interval),
            interval,
            retries_left: c.max_cm_retries,
        });
        let (peer, tc) = (c.peer, c.traffic_class);
        self.transmit(peer, tc, mad);
    }

    /// REJ for connection `id` as `cm_format_rej` fills it from the state.
    fn send_rej(
        &mut self,
        id: CommId,
        reason: RejReason,
        ari: &[u8],
        pd: [u8; mad::private_data_len::REJ],
    ) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let (local, msg_rejected) = match c.state {
            // No ID of ours is known to the peer yet.
            CmState::ReqRcvd => (0, MsgResponse::Req),
            CmState::MraReqSent => (id, MsgResponse::Req),
            CmState::RepRcvd | CmState::MraRepSent => (id, MsgResponse::Rep),
            _ => (id, MsgResponse::Other),
        };
        let ari_arr: [u8; mad::REJ_ARI_LEN] = private_data(ari).unwrap_or([0; mad::REJ_ARI_LEN]);
        let rej = Rej {
            local_comm_id: local,
            remote_comm_id: c.remote_id,
            msg_rejected,
            ari_len: ari.len().min(mad::REJ_ARI_LEN) as u8,
            reason,
            ari: ari_arr,
            private_data: pd,
        };
        let (tid, peer, tc) = (c.tid, c.peer, c.traffic_class);
        if let Ok(m) = encode(tid, CmBody::Rej(rej)) {
            self.transmit(peer, tc, m);
        }
    }

    /// A REQ or REP from a remote QP that still has a connection here: REJ it as stale
    /// and tear the old connection down (kernel `cm_req_handler`, `cm_rep_handler`).
    /// `ids` are the REJ's (local, remote) comm IDs; `to` is where the REJ goes.
    fn reject_stale(
        &mut self,
        now: Nanos,
        to: (MadFrom, u64),
        ids: (CommId, CommId),
        old: CommId,
        rejected: MsgResponse,
    ) {
        self.counters.req_stale += 1;
        let (dst, tid) = to;
        self.issue_rej(dst, tid, ids.0, ids.1, RejReason::StaleConn, rejected);
        if self.state(CmId(old)) == Some(CmState::Established) {
            let _ = self.disconnect(now, CmId(old), &[]);
        }
    }

    /// REJ in answer to a MAD with no connection (kernel `cm_issue_rej`).
    fn issue_rej(
        &mut self,
        to: MadFrom,
        tid: u64,
        local: CommId,
        remote: CommId,
        reason: RejReason,
        msg_rejected: MsgResponse,
    ) {
        let rej = Rej {
            local_comm_id: local,
            remote_comm_id: remote,
            msg_rejected,
            ari_len: 0,
            reason,
            ari: [0; mad::REJ_ARI_LEN],
            private_data: [0; mad::private_data_len::REJ],
        };
        if let Ok(m) = encode(tid, CmBody::Rej(rej)) {
            self.transmit(to.ip, to.traffic_class, m);
        }
    }
}

fn encode(tid: u64, body: CmBody) -> Result<[u8; MAD_LEN], CmError> {
    let mut out = [0u8; MAD_LEN];
    mad::emit(
        &CmMessage {
            hdr: MadHeader {
                tid,
                ..MadHeader::default()
            },
            body,
        },
        &mut out,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_timer_arithmetic() {
        assert_eq!(cm_convert_to_ms(0), 1);
        assert_eq!(cm_convert_to_ms(8), 1);
        assert_eq!(cm_convert_to_ms(18), 1024);
        assert_eq!(cm_convert_to_ms(20), 4096);
        assert_eq!(cm_convert_to_ms(24), 65536);
        assert_eq!(cm_convert_to_ms(255), 1 << 23);
        // rxe: ack delay 15, PLT 18: 2^19 dominates and 2^15 adds too little to round up.
        assert_eq!(cm_ack_timeout(15, 18), 19);
        assert_eq!(cm_ack_timeout(15, 14), 16);
        assert_eq!(cm_ack_timeout(20, 10), 20);
        assert_eq!(cm_ack_timeout(20, 18), 21);
        assert_eq!(cm_ack_timeout(0, 255), 31);
    }
}
