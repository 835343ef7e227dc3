//! The 256-byte CM MAD (IBTA Vol 1 13.4.3 common MAD header, 12.6 message formats) and
//! its nine connection messages, every field at the offsets of IBTA tables 106-120 (the
//! kernel's `include/rdma/ibta_vol1_c12.h` lists the same offsets minus the 24-byte header).
//!
//! [`parse`] never panics and [`emit`] is its exact inverse: every field, including
//! vendor IDs, alternate paths and the unused parts of private data, survives
//! `emit(parse(x))` bit for bit. Reserved bits are ignored on parse (IBTA 12.6: receivers
//! ignore reserved fields) and written as zero on emit, so the round trip is exact for
//! every MAD whose reserved bits are zero, which is every MAD a conforming sender emits.

use softhca_wire::{Psn, Qpn};

use crate::bytes::{array, check_bits, put, u16_at, u24_at, u32_at, u64_at, u8_at};
use crate::CmError;

/// Every MAD is 256 bytes (IBTA 13.4.2).
pub const MAD_LEN: usize = 256;
/// The common MAD header length; CM message fields start here.
pub const MAD_HDR_LEN: usize = 24;
/// `BaseVersion` of every MAD.
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager (IBTA 13.4.4).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version: the kernel registers its agent for version 2 only, so any other is
/// never delivered (`cm_add_one`, `IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;
/// `Method` of every CM message (IBTA 12.6.1: all CM messages are `Send`).
pub const METHOD_SEND: u8 = 0x03;
/// Q_Key of QP1 (IBTA 3.5.3; rxe drops GSI packets with any other).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Private data bytes each message carries (IBTA 12.6, kernel `enum ib_cm_data_size`).
pub mod private_data_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}
/// REJ Additional Rejection Information bytes.
pub const REJ_ARI_LEN: usize = 72;
/// SIDR_REP Additional Information bytes.
pub const SIDR_REP_INFO_LEN: usize = 72;

/// Attribute IDs of the CM messages (IBTA table 104).
#[allow(missing_docs)]
pub mod attr {
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
    pub const LAP: u16 = 0x0019;
    pub const APR: u16 = 0x001A;
}

/// A 32-bit communication ID (IBTA 12.6.2: local/remote CommID; SIDR RequestID).
pub type CommId = u32;
/// A 64-bit service ID (IBTA 12.6.5; Annex A11 for the IP form).
pub type ServiceId = u64;

/// A 128-bit GID as it sits on the wire (RoCEv2: an IPv6 address, IPv4 as `::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The RoCEv2 GID of an IP address (IPv4 mapped as the kernel's `rdma_ip2gid`).
    pub fn from_ip(ip: std::net::IpAddr) -> Gid {
        match ip {
            std::net::IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            std::net::IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address a RoCEv2 GID stands for (IPv4-mapped GIDs give IPv4).
    pub fn to_ip(self) -> std::net::IpAddr {
        let v6 = std::net::Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => std::net::IpAddr::V6(v6),
        }
    }
}

/// The common MAD header fields a CM message carries beyond its attribute ID. Base
/// version, class, class version and method are fixed for CM and checked by [`parse`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct MadHeader {
    /// Status (IBTA 13.4.7); zero in every CM message the kernel sends.
    pub status: u16,
    /// Class-specific word; zero for CM.
    pub class_specific: u16,
    /// Transaction ID: the kernel forms it as `hi_tid << 32 | local_comm_id` and answers
    /// echo the request's (`cm_form_tid`); matching is by comm IDs, not TID.
    pub tid: u64,
    /// Attribute modifier: carries the ECE options with a vendor ID, else zero.
    pub attr_mod: u32,
}

/// Which message a REJ rejects or an MRA acknowledges (IBTA 12.6.7, 12.6.6; kernel
/// `enum cm_msg_response`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MsgResponse {
    /// The REQ.
    Req = 0,
    /// The REP.
    Rep = 1,
    /// Any other message (LAP, or a REJ sent after a REP was received, etc.).
    Other = 2,
}

impl MsgResponse {
    fn from_bits(v: u8, field: &'static str) -> Result<MsgResponse, CmError> {
        match v {
            0 => Ok(MsgResponse::Req),
            1 => Ok(MsgResponse::Rep),
            2 => Ok(MsgResponse::Other),
            _ => Err(CmError::InvalidField {
                field,
                value: u32::from(v),
            }),
        }
    }
}

/// REQ Transport Service Type (2 bits) with the Extended Transport Type selecting XRC
/// (kernel `cm_req_get_qp_type`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TransportService {
    /// Reliable connected.
    Rc = 0,
    /// Unreliable connected.
    Uc = 1,
    /// Reliable datagram.
    Rd = 2,
    /// Value 3: "see Extended Transport Type" (XRC when that is 1).
    Extended = 3,
}

impl TransportService {
    fn from_bits(v: u8) -> TransportService {
        match v & 3 {
            0 => TransportService::Rc,
            1 => TransportService::Uc,
            2 => TransportService::Rd,
            _ => TransportService::Extended,
        }
    }
}

/// Reasons a REJ carries (IBTA table 109; kernel `enum ib_cm_rej_reason`). Values this
/// enum does not name are kept in [`RejReason::Other`] so they round-trip.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum RejReason {
    /// 1: no QP available.
    NoQp,
    /// 2: no EEC available.
    NoEec,
    /// 3: no resources.
    NoResources,
    /// 4: timeout (the ARI holds the rejecting CA GUID; sent when a REQ times out).
    Timeout,
    /// 5: unsupported request.
    Unsupported,
    /// 6: invalid communication ID.
    InvalidCommId,
    /// 7: invalid communication instance.
    InvalidCommInstance,
    /// 8: invalid service ID: no listener (`cm_match_req`).
    InvalidServiceId,
    /// 9: invalid transport service type.
    InvalidTransportType,
    /// 10: stale connection (`cm_match_req`, duplicate REQ in timewait).
    StaleConn,
    /// 11: RDC does not exist.
    RdcNotExist,
    /// 12: primary remote GID not the receiver's (`cm_req_handler`).
    InvalidGid,
    /// 13: invalid LID.
    InvalidLid,
    /// 14: invalid SL.
    InvalidSl,
    /// 15: invalid traffic class.
    InvalidTrafficClass,
    /// 16: invalid hop limit.
    InvalidHopLimit,
    /// 17: invalid packet rate.
    InvalidPacketRate,
    /// 18: invalid alternate GID.
    InvalidAltGid,
    /// 19: invalid alternate LID.
    InvalidAltLid,
    /// 20: invalid alternate SL.
    InvalidAltSl,
    /// 21: invalid alternate traffic class.
    InvalidAltTrafficClass,
    /// 22: invalid alternate hop limit.
    InvalidAltHopLimit,
    /// 23: invalid alternate packet rate.
    InvalidAltPacketRate,
    /// 24: port CM redirect.
    PortCmRedirect,
    /// 25: port redirect.
    PortRedirect,
    /// 26: invalid path MTU.
    InvalidMtu,
    /// 27: insufficient responder resources.
    InsufficientRespResources,
    /// 28: consumer defined (`rdma_reject`).
    ConsumerDefined,
    /// 29: invalid RNR retry count.
    InvalidRnrRetry,
    /// 30: duplicate local comm ID.
    DuplicateLocalCommId,
    /// 31: invalid class version.
    InvalidClassVersion,
    /// 32: invalid flow label.
    InvalidFlowLabel,
    /// 33: invalid alternate flow label.
    InvalidAltFlowLabel,
    /// 35: vendor option not supported (`rdma_reject_ece`).
    VendorOptionNotSupported,
    /// Any other value.
    Other(u16),
}

impl RejReason {
    /// The reason for a wire value.
    pub fn from_u16(v: u16) -> RejReason {
        use RejReason::*;
        match v {
            1 => NoQp,
            2 => NoEec,
            3 => NoResources,
            4 => Timeout,
            5 => Unsupported,
            6 => InvalidCommId,
            7 => InvalidCommInstance,
            8 => InvalidServiceId,
            9 => InvalidTransportType,
            10 => StaleConn,
            11 => RdcNotExist,
            12 => InvalidGid,
            13 => InvalidLid,
            14 => InvalidSl,
            15 => InvalidTrafficClass,
            16 => InvalidHopLimit,
            17 => InvalidPacketRate,
            18 => InvalidAltGid,
            19 => InvalidAltLid,
            20 => InvalidAltSl,
            21 => InvalidAltTrafficClass,
            22 => InvalidAltHopLimit,
            23 => InvalidAltPacketRate,
            24 => PortCmRedirect,
            25 => PortRedirect,
            26 => InvalidMtu,
            27 => InsufficientRespResources,
            28 => ConsumerDefined,
            29 => InvalidRnrRetry,
            30 => DuplicateLocalCommId,
            31 => InvalidClassVersion,
            32 => InvalidFlowLabel,
            33 => InvalidAltFlowLabel,
            35 => VendorOptionNotSupported,
            n => Other(n),
        }
    }

    /// The wire value.
    pub fn to_u16(self) -> u16 {
        use RejReason::*;
        match self {
            NoQp => 1,
            NoEec => 2,
            NoResources => 3,
            Timeout => 4,
            Unsupported => 5,
            InvalidCommId => 6,
            InvalidCommInstance => 7,
            InvalidServiceId => 8,
            InvalidTransportType => 9,
            StaleConn => 10,
            RdcNotExist => 11,
            InvalidGid => 12,
            InvalidLid => 13,
            InvalidSl => 14,
            InvalidTrafficClass => 15,
            InvalidHopLimit => 16,
            InvalidPacketRate => 17,
            InvalidAltGid => 18,
            InvalidAltLid => 19,
            InvalidAltSl => 20,
            InvalidAltTrafficClass => 21,
            InvalidAltHopLimit => 22,
            InvalidAltPacketRate => 23,
            PortCmRedirect => 24,
            PortRedirect => 25,
            InvalidMtu => 26,
            InsufficientRespResources => 27,
            ConsumerDefined => 28,
            InvalidRnrRetry => 29,
            DuplicateLocalCommId => 30,
            InvalidClassVersion => 31,
            InvalidFlowLabel => 32,
            InvalidAltFlowLabel => 33,
            VendorOptionNotSupported => 35,
            Other(n) => n,
        }
    }
}

/// SIDR_REP status (IBTA table 121; kernel `enum ib_cm_sidr_status`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    Success,
    /// 1: service ID not supported (no listener: `cm_sidr_req_handler`).
    Unsupported,
    /// 2: rejected by the service provider.
    Reject,
    /// 3: no QP available.
    NoQp,
    /// 4: redirect (AddInfo holds ClassPortInfo).
    Redirect,
    /// 5: unsupported class version.
    UnsupportedVersion,
    /// Any other value.
    Other(u8),
}

impl SidrStatus {
    /// The status for a wire value.
    pub fn from_u8(v: u8) -> SidrStatus {
        match v {
            0 => SidrStatus::Success,
            1 => SidrStatus::Unsupported,
            2 => SidrStatus::Reject,
            3 => SidrStatus::NoQp,
            4 => SidrStatus::Redirect,
            5 => SidrStatus::UnsupportedVersion,
            n => SidrStatus::Other(n),
        }
    }

    /// The wire value.
    pub fn to_u8(self) -> u8 {
        match self {
            SidrStatus::Success => 0,
            SidrStatus::Unsupported => 1,
            SidrStatus::Reject => 2,
            SidrStatus::NoQp => 3,
            SidrStatus::Redirect => 4,
            SidrStatus::UnsupportedVersion => 5,
            SidrStatus::Other(n) => n,
        }
    }
}

/// A REQ path (primary at MAD offset 76, alternate at 120; IBTA table 106).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ReqPath {
    /// Local port LID (0xFFFF, permissive, when routed as RoCE always is).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (the sender's).
    pub local_gid: Gid,
    /// Remote port GID (the receiver's; the kernel answers REJ 12 if it is not one of its own).
    pub remote_gid: Gid,
    /// Flow label, 20 bits.
    pub flow_label: u32,
    /// Packet rate, 6 bits.
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// SL, 4 bits.
    pub sl: u8,
    /// Subnet local (the kernel sets it when hop limit <= 1).
    pub subnet_local: bool,
    /// Local ACK timeout, 5 bits (kernel `cm_ack_timeout`).
    pub local_ack_timeout: u8,
}

impl ReqPath {
    fn parse(m: &[u8], b: usize) -> Result<ReqPath, CmError> {
        let sl_byte = u8_at(m, b + 42)?;
        Ok(ReqPath {
            local_lid: u16_at(m, b)?,
            remote_lid: u16_at(m, b + 2)?,
            local_gid: Gid(array(m, b + 4)?),
            remote_gid: Gid(array(m, b + 20)?),
            flow_label: u32_at(m, b + 36)? >> 12,
            packet_rate: u8_at(m, b + 39)? & 0x3f,
            traffic_class: u8_at(m, b + 40)?,
            hop_limit: u8_at(m, b + 41)?,
            sl: sl_byte >> 4,
            subnet_local: sl_byte & 0x08 != 0,
            local_ack_timeout: u8_at(m, b + 43)? >> 3,
        })
    }

    fn check(&self) -> Result<(), CmError> {
        check_bits("flow_label", self.flow_label, 20)?;
        check_bits("packet_rate", self.packet_rate.into(), 6)?;
        check_bits("sl", self.sl.into(), 4)?;
        check_bits("local_ack_timeout", self.local_ack_timeout.into(), 5)
    }

    /// Emit at base `b`; `extra43` ORs bits into byte `b + 43` (SAP Supported of the alternate path).
    fn emit(&self, m: &mut [u8], b: usize, extra43: u8) -> Result<(), CmError> {
        self.check()?;
        put(m, b, &self.local_lid.to_be_bytes())?;
        put(m, b + 2, &self.remote_lid.to_be_bytes())?;
        put(m, b + 4, &self.local_gid.0)?;
        put(m, b + 20, &self.remote_gid.0)?;
        // Flow label: top 20 bits of the word; packet rate: low 6 bits of its last byte.
        let word = (self.flow_label << 12) | u32::from(self.packet_rate);
        put(m, b + 36, &word.to_be_bytes())?;
        put(
            m,
            b + 40,
            &[
                self.traffic_class,
                self.hop_limit,
                (self.sl << 4) | (u8::from(self.subnet_local) << 3),
                (self.local_ack_timeout << 3) | extra43,
            ],
        )
    }
}

/// REQ: connection request (IBTA 12.6.5, table 106).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Req {
    /// Local communication ID (the sender's).
    pub local_comm_id: CommId,
    /// Vendor ID (ECE), 24 bits.
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: ServiceId,
    /// Local CA GUID (the sender's node GUID).
    pub local_ca_guid: u64,
    /// Local Q_Key (meaningful for RD only).
    pub local_qkey: u32,
    /// Local QPN.
    pub local_qpn: Qpn,
    /// Responder resources the sender offers (the receiver's initiator depth).
    pub responder_resources: u8,
    /// Local EECN, 24 bits.
    pub local_eecn: u32,
    /// Initiator depth (the receiver's responder resources).
    pub initiator_depth: u8,
    /// Remote EECN, 24 bits.
    pub remote_eecn: u32,
    /// Remote CM response timeout, 5 bits: how long the sender waits for the REP.
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport: TransportService,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (the receiver's SQ PSN).
    pub starting_psn: Psn,
    /// Local CM response timeout, 5 bits: how long the receiver may wait for the RTU.
    pub local_cm_response_timeout: u8,
    /// Retry count, 3 bits.
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU, 4 bits (IBTA encoding 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count, 3 bits.
    pub rnr_retry_count: u8,
    /// Max CM retries, 4 bits.
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type, 3 bits (1 = XRC).
    pub extended_transport: u8,
    /// Primary path.
    pub primary: ReqPath,
    /// Alternate path (all zeros when absent, as the kernel sends it).
    pub alternate: ReqPath,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data (for IP-CM, a `cma_hdr` then up to 56 bytes of user data).
    pub private_data: [u8; private_data_len::REQ],
}

/// MRA: message receipt acknowledgement (IBTA 12.6.6, table 107).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Mra {
    /// Local communication ID (the sender's).
    pub local_comm_id: CommId,
    /// Remote communication ID.
    pub remote_comm_id: CommId,
    /// Which message is acknowledged.
    pub msg_mraed: MsgResponse,
    /// Service timeout, 5 bits: the extra time the sender asks for.
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; private_data_len::MRA],
}

/// REJ: reject (IBTA 12.6.7, table 108).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Rej {
    /// Local communication ID (0 when rejecting a REQ before an ID exists: `cm_format_rej`).
    pub local_comm_id: CommId,
    /// Remote communication ID.
    pub remote_comm_id: CommId,
    /// Which message is rejected.
    pub msg_rejected: MsgResponse,
    /// Rejected info length (bytes of ARI that are valid), 7 bits.
    pub ari_len: u8,
    /// Reason.
    pub reason: RejReason,
    /// Additional rejection information.
    pub ari: [u8; REJ_ARI_LEN],
    /// Private data.
    pub private_data: [u8; private_data_len::REJ],
}

/// REP: reply to a REQ (IBTA 12.6.8, table 110).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Rep {
    /// Local communication ID (the sender's).
    pub local_comm_id: CommId,
    /// Remote communication ID (the REQ's local one).
    pub remote_comm_id: CommId,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN.
    pub local_qpn: Qpn,
    /// Local EECN, 24 bits.
    pub local_eecn: u32,
    /// Starting PSN (the receiver's SQ PSN).
    pub starting_psn: Psn,
    /// Vendor ID (ECE), 24 bits, split over three bytes on the wire (39, 43, 47).
    pub vendor_id: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay, 5 bits.
    pub target_ack_delay: u8,
    /// Failover accepted, 2 bits.
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count, 3 bits.
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; private_data_len::REP],
}

/// RTU: ready to use (IBTA 12.6.9, table 111).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Rtu {
    /// Local communication ID.
    pub local_comm_id: CommId,
    /// Remote communication ID.
    pub remote_comm_id: CommId,
    /// Private data.
    pub private_data: [u8; private_data_len::RTU],
}

/// DREQ: disconnection request (IBTA 12.6.10, table 112).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Dreq {
    /// Local communication ID.
    pub local_comm_id: CommId,
    /// Remote communication ID.
    pub remote_comm_id: CommId,
    /// The receiver's QPN (the kernel drops a DREQ whose QPN is not its own: `cm_dreq_handler`).
    pub remote_qpn: Qpn,
    /// Private data.
    pub private_data: [u8; private_data_len::DREQ],
}

/// DREP: disconnection reply (IBTA 12.6.11, table 113).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Drep {
    /// Local communication ID.
    pub local_comm_id: CommId,
    /// Remote communication ID.
    pub remote_comm_id: CommId,
    /// Private data.
    pub private_data: [u8; private_data_len::DREP],
}

/// SIDR_REQ: service ID resolution request (IBTA 12.11.1, table 119).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SidrReq {
    /// Request ID (the sender's comm ID).
    pub request_id: CommId,
    /// P_Key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: ServiceId,
    /// Private data (for IP-CM, a `cma_hdr` then up to 180 bytes of user data).
    pub private_data: [u8; private_data_len::SIDR_REQ],
}

/// SIDR_REP: service ID resolution reply (IBTA 12.11.2, table 120).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SidrRep {
    /// The SIDR_REQ's request ID.
    pub request_id: CommId,
    /// Status.
    pub status: SidrStatus,
    /// Additional information length.
    pub add_info_len: u8,
    /// Vendor ID (ECE), 24 bits: high 16 at offset 30, low 8 at 35.
    pub vendor_id: u32,
    /// QPN of the service.
    pub qpn: Qpn,
    /// Service ID.
    pub service_id: ServiceId,
    /// Q_Key of the service (rdma_cm's UD QPs: 0x01234567).
    pub qkey: u32,
    /// Additional information.
    pub add_info: [u8; SIDR_REP_INFO_LEN],
    /// Private data.
    pub private_data: [u8; private_data_len::SIDR_REP],
}

/// The body of a CM MAD.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CmBody {
    /// REQ.
    Req(Req),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(Rtu),
    /// DREQ.
    Dreq(Dreq),
    /// DREP.
    Drep(Drep),
    /// SIDR_REQ.
    SidrReq(SidrReq),
    /// SIDR_REP.
    SidrRep(SidrRep),
}

impl CmBody {
    /// The attribute ID of this message.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmBody::Req(_) => attr::REQ,
            CmBody::Mra(_) => attr::MRA,
            CmBody::Rej(_) => attr::REJ,
            CmBody::Rep(_) => attr::REP,
            CmBody::Rtu(_) => attr::RTU,
            CmBody::Dreq(_) => attr::DREQ,
            CmBody::Drep(_) => attr::DREP,
            CmBody::SidrReq(_) => attr::SIDR_REQ,
            CmBody::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The message's name as IBTA spells it.
    pub fn name(&self) -> &'static str {
        match self {
            CmBody::Req(_) => "REQ",
            CmBody::Mra(_) => "MRA",
            CmBody::Rej(_) => "REJ",
            CmBody::Rep(_) => "REP",
            CmBody::Rtu(_) => "RTU",
            CmBody::Dreq(_) => "DREQ",
            CmBody::Drep(_) => "DREP",
            CmBody::SidrReq(_) => "SIDR_REQ",
            CmBody::SidrRep(_) => "SIDR_REP",
        }
    }
}

/// A whole CM MAD: header fields plus the typed message.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CmMessage {
    /// Header fields that vary.
    pub hdr: MadHeader,
    /// The message.
    pub body: CmBody,
}

fn pd<const N: usize>(m: &[u8], at: usize) -> Result<[u8; N], CmError> {
    array::<N>(m, at)
}

/// Decode a 256-byte CM MAD. Never panics; any input that is not a CM message of the nine
/// kinds above gives an error.
pub fn parse(m: &[u8]) -> Result<CmMessage, CmError> {
    let (hdr, attr_id) = parse_header(m)?;
    let body = match attr_id {
        attr::REQ => CmBody::Req(parse_req(m)?),
        attr::MRA => CmBody::Mra(parse_mra(m)?),
        attr::REJ => CmBody::Rej(parse_rej(m)?),
        attr::REP => CmBody::Rep(parse_rep(m)?),
        attr::RTU => CmBody::Rtu(Rtu {
            local_comm_id: u32_at(m, 24)?,
            remote_comm_id: u32_at(m, 28)?,
            private_data: pd(m, 32)?,
        }),
        attr::DREQ => CmBody::Dreq(Dreq {
            local_comm_id: u32_at(m, 24)?,
            remote_comm_id: u32_at(m, 28)?,
            remote_qpn: Qpn::new(u24_at(m, 32)?),
            private_data: pd(m, 36)?,
        }),
        attr::DREP => CmBody::Drep(Drep {
            local_comm_id: u32_at(m, 24)?,
            remote_comm_id: u32_at(m, 28)?,
            private_data: pd(m, 32)?,
        }),
        attr::SIDR_REQ => CmBody::SidrReq(SidrReq {
            request_id: u32_at(m, 24)?,
            pkey: u16_at(m, 28)?,
            service_id: u64_at(m, 32)?,
            private_data: pd(m, 40)?,
        }),
        attr::SIDR_REP => CmBody::SidrRep(parse_sidr_rep(m)?),
        other => return Err(CmError::UnsupportedAttr(other)),
    };
    Ok(CmMessage { hdr, body })
}

/// The MAD header: the fixed fields of a CM MAD are checked, the rest returned with the
/// attribute ID.
fn parse_header(m: &[u8]) -> Result<(MadHeader, u16), CmError> {
    if m.len() != MAD_LEN {
        return Err(CmError::BadLength(m.len()));
    }
    let fixed = [
        ("base_version", 0usize, BASE_VERSION),
        ("mgmt_class", 1, MGMT_CLASS_CM),
        ("class_version", 2, CM_CLASS_VERSION),
        ("method", 3, METHOD_SEND),
    ];
    for (field, at, want) in fixed {
        let got = u8_at(m, at)?;
        if got != want {
            return Err(CmError::NotCm {
                field,
                value: got.into(),
            });
        }
    }
    let hdr = MadHeader {
        status: u16_at(m, 4)?,
        class_specific: u16_at(m, 6)?,
        tid: u64_at(m, 8)?,
        attr_mod: u32_at(m, 20)?,
    };
    Ok((hdr, u16_at(m, 16)?))
}

fn parse_mra(m: &[u8]) -> Result<Mra, CmError> {
    Ok(Mra {
        local_comm_id: u32_at(m, 24)?,
        remote_comm_id: u32_at(m, 28)?,
        msg_mraed: MsgResponse::from_bits(u8_at(m, 32)? >> 6, "msg_mraed")?,
        service_timeout: u8_at(m, 33)? >> 3,
        private_data: pd(m, 34)?,
    })
}

fn parse_rej(m: &[u8]) -> Result<Rej, CmError> {
    Ok(Rej {
        local_comm_id: u32_at(m, 24)?,
        remote_comm_id: u32_at(m, 28)?,
        msg_rejected: MsgResponse::from_bits(u8_at(m, 32)? >> 6, "msg_rejected")?,
        ari_len: u8_at(m, 33)? >> 1,
        reason: RejReason::from_u16(u16_at(m, 34)?),
        ari: pd(m, 36)?,
        private_data: pd(m, 108)?,
    })
}

fn parse_rep(m: &[u8]) -> Result<Rep, CmError> {
    let b50 = u8_at(m, 50)?;
    let b51 = u8_at(m, 51)?;
    Ok(Rep {
        local_comm_id: u32_at(m, 24)?,
        remote_comm_id: u32_at(m, 28)?,
        local_qkey: u32_at(m, 32)?,
        local_qpn: Qpn::new(u24_at(m, 36)?),
        local_eecn: u24_at(m, 40)?,
        starting_psn: Psn::new(u24_at(m, 44)?),
        // The vendor ID's three bytes sit after the QPN, EECN and PSN (IBTA 12.6.8).
        vendor_id: (u32::from(u8_at(m, 39)?) << 16)
            | (u32::from(u8_at(m, 43)?) << 8)
            | u32::from(u8_at(m, 47)?),
        responder_resources: u8_at(m, 48)?,
        initiator_depth: u8_at(m, 49)?,
        target_ack_delay: b50 >> 3,
        failover_accepted: (b50 >> 1) & 3,
        end_to_end_flow_control: b50 & 1 != 0,
        rnr_retry_count: b51 >> 5,
        srq: b51 & 0x10 != 0,
        local_ca_guid: u64_at(m, 52)?,
        private_data: pd(m, 60)?,
    })
}

fn parse_sidr_rep(m: &[u8]) -> Result<SidrRep, CmError> {
    Ok(SidrRep {
        request_id: u32_at(m, 24)?,
        status: SidrStatus::from_u8(u8_at(m, 28)?),
        add_info_len: u8_at(m, 29)?,
        vendor_id: (u32::from(u16_at(m, 30)?) << 8) | u32::from(u8_at(m, 35)?),
        qpn: Qpn::new(u24_at(m, 32)?),
        service_id: u64_at(m, 36)?,
        qkey: u32_at(m, 44)?,
        add_info: pd(m, 48)?,
        private_data: pd(m, 120)?,
    })
}

fn parse_req(m: &[u8]) -> Result<Req, CmError> {
    let b67 = u8_at(m, 67)?;
    let b71 = u8_at(m, 71)?;
    let b74 = u8_at(m, 74)?;
    let b75 = u8_at(m, 75)?;
    Ok(Req {
        local_comm_id: u32_at(m, 24)?,
        vendor_id: u32_at(m, 28)? & 0x00ff_ffff,
        service_id: u64_at(m, 32)?,
        local_ca_guid: u64_at(m, 40)?,
        local_qkey: u32_at(m, 52)?,
        local_qpn: Qpn::new(u24_at(m, 56)?),
        responder_resources: u8_at(m, 59)?,
        local_eecn: u24_at(m, 60)?,
        initiator_depth: u8_at(m, 63)?,
        remote_eecn: u24_at(m, 64)?,
        remote_cm_response_timeout: b67 >> 3,
        transport: TransportService::from_bits(b67 >> 1),
        end_to_end_flow_control: b67 & 1 != 0,
        starting_psn: Psn::new(u24_at(m, 68)?),
        local_cm_response_timeout: b71 >> 3,
        retry_count: b71 & 7,
        pkey: u16_at(m, 72)?,
        path_mtu: b74 >> 4,
        rdc_exists: b74 & 0x08 != 0,
        rnr_retry_count: b74 & 7,
        max_cm_retries: b75 >> 4,
        srq: b75 & 0x08 != 0,
        extended_transport: b75 & 7,
        primary: ReqPath::parse(m, 76)?,
        alternate: ReqPath::parse(m, 120)?,
        sap_supported: u8_at(m, 163)? & 0x04 != 0,
        private_data: pd(m, 164)?,
    })
}

/// Encode `msg` into `out`, every byte of which is written (reserved bits zero). Errors
/// only when a field holds a value wider than its wire field.
pub fn emit(msg: &CmMessage, out: &mut [u8; MAD_LEN]) -> Result<(), CmError> {
    // Check first so a failed emit leaves no half-written MAD.
    check(&msg.body)?;
    out.fill(0);
    let m: &mut [u8] = out;
    put(
        m,
        0,
        &[BASE_VERSION, MGMT_CLASS_CM, CM_CLASS_VERSION, METHOD_SEND],
    )?;
    put(m, 4, &msg.hdr.status.to_be_bytes())?;
    put(m, 6, &msg.hdr.class_specific.to_be_bytes())?;
    put(m, 8, &msg.hdr.tid.to_be_bytes())?;
    put(m, 16, &msg.body.attr_id().to_be_bytes())?;
    put(m, 20, &msg.hdr.attr_mod.to_be_bytes())?;
    match &msg.body {
        CmBody::Req(r) => emit_req(r, m)?,
        CmBody::Mra(r) => {
            put(m, 24, &r.local_comm_id.to_be_bytes())?;
            put(m, 28, &r.remote_comm_id.to_be_bytes())?;
            put(m, 32, &[(r.msg_mraed as u8) << 6, r.service_timeout << 3])?;
            put(m, 34, &r.private_data)?;
        }
        CmBody::Rej(r) => {
            put(m, 24, &r.local_comm_id.to_be_bytes())?;
            put(m, 28, &r.remote_comm_id.to_be_bytes())?;
            put(m, 32, &[(r.msg_rejected as u8) << 6, r.ari_len << 1])?;
            put(m, 34, &r.reason.to_u16().to_be_bytes())?;
            put(m, 36, &r.ari)?;
            put(m, 108, &r.private_data)?;
        }
        CmBody::Rep(r) => {
            put(m, 24, &r.local_comm_id.to_be_bytes())?;
            put(m, 28, &r.remote_comm_id.to_be_bytes())?;
            put(m, 32, &r.local_qkey.to_be_bytes())?;
            let [_, vh, vm, vl] = r.vendor_id.to_be_bytes();
            put(
                m,
                36,
                &((r.local_qpn.value() << 8) | u32::from(vh)).to_be_bytes(),
            )?;
            put(m, 40, &((r.local_eecn << 8) | u32::from(vm)).to_be_bytes())?;
            put(
                m,
                44,
                &((r.starting_psn.value() << 8) | u32::from(vl)).to_be_bytes(),
            )?;
            put(
                m,
                48,
                &[
                    r.responder_resources,
                    r.initiator_depth,
                    (r.target_ack_delay << 3)
                        | (r.failover_accepted << 1)
                        | u8::from(r.end_to_end_flow_control),
                    (r.rnr_retry_count << 5) | (u8::from(r.srq) << 4),
                ],
            )?;
            put(m, 52, &r.local_ca_guid.to_be_bytes())?;
            put(m, 60, &r.private_data)?;
        }
        CmBody::Rtu(r) => {
            put(m, 24, &r.local_comm_id.to_be_bytes())?;
            put(m, 28, &r.remote_comm_id.to_be_bytes())?;
            put(m, 32, &r.private_data)?;
        }
        CmBody::Dreq(r) => {
            put(m, 24, &r.local_comm_id.to_be_bytes())?;
            put(m, 28, &r.remote_comm_id.to_be_bytes())?;
            put(m, 32, &(r.remote_qpn.value() << 8).to_be_bytes())?;
            put(m, 36, &r.private_data)?;
        }
        CmBody::Drep(r) => {
            put(m, 24, &r.local_comm_id.to_be_bytes())?;
            put(m, 28, &r.remote_comm_id.to_be_bytes())?;
            put(m, 32, &r.private_data)?;
        }
        CmBody::SidrReq(r) => {
            put(m, 24, &r.request_id.to_be_bytes())?;
            put(m, 28, &r.pkey.to_be_bytes())?;
            put(m, 32, &r.service_id.to_be_bytes())?;
            put(m, 40, &r.private_data)?;
        }
        CmBody::SidrRep(r) => {
            put(m, 24, &r.request_id.to_be_bytes())?;
            let [_, vh, vm, vl] = r.vendor_id.to_be_bytes();
            put(m, 28, &[r.status.to_u8(), r.add_info_len, vh, vm])?;
            put(m, 32, &((r.qpn.value() << 8) | u32::from(vl)).to_be_bytes())?;
            put(m, 36, &r.service_id.to_be_bytes())?;
            put(m, 44, &r.qkey.to_be_bytes())?;
            put(m, 48, &r.add_info)?;
            put(m, 120, &r.private_data)?;
        }
    }
    Ok(())
}

fn check(body: &CmBody) -> Result<(), CmError> {
    match body {
        CmBody::Req(r) => {
            check_bits("vendor_id", r.vendor_id, 24)?;
            check_bits("local_eecn", r.local_eecn, 24)?;
            check_bits("remote_eecn", r.remote_eecn, 24)?;
            check_bits(
                "remote_cm_response_timeout",
                r.remote_cm_response_timeout.into(),
                5,
            )?;
            check_bits(
                "local_cm_response_timeout",
                r.local_cm_response_timeout.into(),
                5,
            )?;
            check_bits("retry_count", r.retry_count.into(), 3)?;
            check_bits("path_mtu", r.path_mtu.into(), 4)?;
            check_bits("rnr_retry_count", r.rnr_retry_count.into(), 3)?;
            check_bits("max_cm_retries", r.max_cm_retries.into(), 4)?;
            check_bits("extended_transport", r.extended_transport.into(), 3)?;
            r.primary.check()?;
            r.alternate.check()
        }
        CmBody::Mra(r) => check_bits("service_timeout", r.service_timeout.into(), 5),
        CmBody::Rej(r) => check_bits("ari_len", r.ari_len.into(), 7),
        CmBody::Rep(r) => {
            check_bits("local_eecn", r.local_eecn, 24)?;
            check_bits("vendor_id", r.vendor_id, 24)?;
            check_bits("target_ack_delay", r.target_ack_delay.into(), 5)?;
            check_bits("failover_accepted", r.failover_accepted.into(), 2)?;
            check_bits("rnr_retry_count", r.rnr_retry_count.into(), 3)
        }
        CmBody::SidrRep(r) => check_bits("vendor_id", r.vendor_id, 24),
        CmBody::Rtu(_) | CmBody::Dreq(_) | CmBody::Drep(_) | CmBody::SidrReq(_) => Ok(()),
    }
}

fn emit_req(r: &Req, m: &mut [u8]) -> Result<(), CmError> {
    put(m, 24, &r.local_comm_id.to_be_bytes())?;
    put(m, 28, &r.vendor_id.to_be_bytes())?;
    put(m, 32, &r.service_id.to_be_bytes())?;
    put(m, 40, &r.local_ca_guid.to_be_bytes())?;
    put(m, 52, &r.local_qkey.to_be_bytes())?;
    put(
        m,
        56,
        &((r.local_qpn.value() << 8) | u32::from(r.responder_resources)).to_be_bytes(),
    )?;
    put(
        m,
        60,
        &((r.local_eecn << 8) | u32::from(r.initiator_depth)).to_be_bytes(),
    )?;
    let b67 = (r.remote_cm_response_timeout << 3)
        | ((r.transport as u8) << 1)
        | u8::from(r.end_to_end_flow_control);
    put(
        m,
        64,
        &((r.remote_eecn << 8) | u32::from(b67)).to_be_bytes(),
    )?;
    let b71 = (r.local_cm_response_timeout << 3) | r.retry_count;
    put(
        m,
        68,
        &((r.starting_psn.value() << 8) | u32::from(b71)).to_be_bytes(),
    )?;
    put(m, 72, &r.pkey.to_be_bytes())?;
    put(
        m,
        74,
        &[
            (r.path_mtu << 4) | (u8::from(r.rdc_exists) << 3) | r.rnr_retry_count,
            (r.max_cm_retries << 4) | (u8::from(r.srq) << 3) | r.extended_transport,
        ],
    )?;
    r.primary.emit(m, 76, 0)?;
    r.alternate.emit(m, 120, u8::from(r.sap_supported) << 2)?;
    put(m, 164, &r.private_data)
}

/// Copy `data` into a zeroed private data array of `N` bytes, or an error if it is longer.
pub fn private_data<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    let mut out = [0u8; N];
    let dst = out
        .get_mut(..data.len())
        .ok_or(CmError::PrivateDataTooLong {
            len: data.len(),
            max: N,
        })?;
    dst.copy_from_slice(data);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Req {
        Req {
            local_comm_id: 0x1234_5678,
            vendor_id: 0,
            service_id: 0x0000_0000_0106_1c06,
            local_ca_guid: 0x0200_00ff_fe00_0001,
            local_qkey: 0,
            local_qpn: Qpn::new(0x11),
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport: TransportService::Rc,
            end_to_end_flow_control: true,
            starting_psn: Psn::new(0xabcdef),
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport: 0,
            primary: ReqPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: Gid::from_ip([10, 99, 0, 1].into()),
                remote_gid: Gid::from_ip([10, 99, 0, 2].into()),
                flow_label: 0xabcde,
                packet_rate: 0x3f,
                traffic_class: 0,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: 19,
            },
            alternate: ReqPath::default(),
            sap_supported: false,
            private_data: [0; 92],
        }
    }

    #[test]
    fn req_fields_land_at_ibta_offsets() {
        let msg = CmMessage {
            hdr: MadHeader {
                tid: 0x1122_3344_1234_5678,
                ..Default::default()
            },
            body: CmBody::Req(req()),
        };
        let mut m = [0u8; 256];
        emit(&msg, &mut m).unwrap();
        assert_eq!(&m[..4], &[1, 7, 2, 3]);
        assert_eq!(&m[16..18], &[0, 0x10]);
        assert_eq!(&m[24..28], &[0x12, 0x34, 0x56, 0x78]);
        assert_eq!(&m[32..40], &[0, 0, 0, 0, 1, 6, 0x1c, 0x06]);
        assert_eq!(&m[56..60], &[0, 0, 0x11, 1]);
        // RemoteCMResponseTimeout 20 << 3 | RC << 1 | E2E.
        assert_eq!(m[67], (20 << 3) | 1);
        assert_eq!(&m[68..72], &[0xab, 0xcd, 0xef, (20 << 3) | 7]);
        assert_eq!(&m[72..76], &[0xff, 0xff, 0x37, 0xf0]);
        assert_eq!(&m[88..96], &[0, 0, 0xff, 0xff, 10, 99, 0, 1]);
        assert_eq!(&m[108..112], &[10, 99, 0, 2]);
        // Flow label 0xabcde in the top 20 bits; packet rate 0x3f in the low 6.
        assert_eq!(&m[112..116], &[0xab, 0xcd, 0xe0, 0x3f]);
        assert_eq!(m[117], 64);
        assert_eq!(m[119], 19 << 3);
        assert_eq!(parse(&m).unwrap(), msg);
    }

    #[test]
    fn rep_vendor_id_is_split_over_three_bytes() {
        let rep = Rep {
            local_comm_id: 1,
            remote_comm_id: 2,
            local_qkey: 3,
            local_qpn: Qpn::new(0x123456),
            local_eecn: 0x0789ab,
            starting_psn: Psn::new(0xfedcba),
            vendor_id: 0xa1b2c3,
            responder_resources: 4,
            initiator_depth: 5,
            target_ack_delay: 31,
            failover_accepted: 2,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 0x0102_0304_0506_0708,
            private_data: [0x5a; 196],
        };
        let msg = CmMessage {
            hdr: MadHeader::default(),
            body: CmBody::Rep(rep),
        };
        let mut m = [0u8; 256];
        emit(&msg, &mut m).unwrap();
        assert_eq!(&m[36..40], &[0x12, 0x34, 0x56, 0xa1]);
        assert_eq!(&m[40..44], &[0x07, 0x89, 0xab, 0xb2]);
        assert_eq!(&m[44..48], &[0xfe, 0xdc, 0xba, 0xc3]);
        assert_eq!(&m[48..52], &[4, 5, (31 << 3) | (2 << 1) | 1, 0xf0]);
        assert_eq!(m[60], 0x5a);
        assert_eq!(m[255], 0x5a);
        assert_eq!(parse(&m).unwrap(), msg);
    }

    fn bytes_of(body: CmBody) -> [u8; 256] {
        let mut m = [0u8; 256];
        let msg = CmMessage {
            hdr: MadHeader::default(),
            body,
        };
        emit(&msg, &mut m).unwrap();
        assert_eq!(parse(&m).unwrap(), msg);
        m
    }

    #[test]
    fn other_messages_land_at_ibta_offsets() {
        let m = bytes_of(CmBody::Rej(Rej {
            local_comm_id: 1,
            remote_comm_id: 2,
            msg_rejected: MsgResponse::Rep,
            ari_len: 8,
            reason: RejReason::StaleConn,
            ari: [0x11; 72],
            private_data: [0x22; 148],
        }));
        assert_eq!(&m[16..18], &[0, 0x12]);
        assert_eq!(&m[32..36], &[0x40, 8 << 1, 0, 10]);
        assert_eq!((m[36], m[107], m[108], m[255]), (0x11, 0x11, 0x22, 0x22));

        let m = bytes_of(CmBody::Mra(Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            msg_mraed: MsgResponse::Other,
            service_timeout: 24,
            private_data: [0x33; 222],
        }));
        assert_eq!(&m[32..35], &[0x80, 24 << 3, 0x33]);

        let m = bytes_of(CmBody::Dreq(Dreq {
            local_comm_id: 1,
            remote_comm_id: 2,
            remote_qpn: Qpn::new(0xabcdef),
            private_data: [0x44; 220],
        }));
        assert_eq!(&m[28..37], &[0, 0, 0, 2, 0xab, 0xcd, 0xef, 0, 0x44]);

        let m = bytes_of(CmBody::SidrReq(SidrReq {
            request_id: 7,
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_1c06,
            private_data: [0x55; 216],
        }));
        assert_eq!(
            &m[24..41],
            &[0, 0, 0, 7, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 1, 0x11, 0x1c, 6, 0x55]
        );

        let m = bytes_of(CmBody::SidrRep(SidrRep {
            request_id: 7,
            status: SidrStatus::Reject,
            add_info_len: 3,
            vendor_id: 0xa1b2c3,
            qpn: Qpn::new(0x123456),
            service_id: 9,
            qkey: 0x0123_4567,
            add_info: [0x66; 72],
            private_data: [0x77; 136],
        }));
        assert_eq!(&m[28..36], &[2, 3, 0xa1, 0xb2, 0x12, 0x34, 0x56, 0xc3]);
        assert_eq!(&m[44..49], &[0x01, 0x23, 0x45, 0x67, 0x66]);
        assert_eq!((m[119], m[120]), (0x66, 0x77));
    }

    #[test]
    fn rej_reason_numbers_match_the_kernel() {
        assert_eq!(RejReason::NoQp.to_u16(), 1);
        assert_eq!(RejReason::Timeout.to_u16(), 4);
        assert_eq!(RejReason::InvalidServiceId.to_u16(), 8);
        assert_eq!(RejReason::StaleConn.to_u16(), 10);
        assert_eq!(RejReason::InvalidGid.to_u16(), 12);
        assert_eq!(RejReason::InvalidMtu.to_u16(), 26);
        assert_eq!(RejReason::ConsumerDefined.to_u16(), 28);
        assert_eq!(RejReason::VendorOptionNotSupported.to_u16(), 35);
        for v in 0..=u16::MAX {
            assert_eq!(RejReason::from_u16(v).to_u16(), v);
        }
        assert_eq!(RejReason::from_u16(34), RejReason::Other(34));
    }

    #[test]
    fn header_checks() {
        let mut m = [0u8; 256];
        emit(
            &CmMessage {
                hdr: MadHeader::default(),
                body: CmBody::Rtu(Rtu {
                    local_comm_id: 1,
                    remote_comm_id: 2,
                    private_data: [0; 224],
                }),
            },
            &mut m,
        )
        .unwrap();
        assert!(parse(&m).is_ok());
        assert_eq!(parse(&m[..255]), Err(CmError::BadLength(255)));
        let mut bad = m;
        bad[2] = 1;
        assert!(matches!(
            parse(&bad),
            Err(CmError::NotCm {
                field: "class_version",
                ..
            })
        ));
        let mut bad = m;
        bad[17] = 0x19;
        assert_eq!(parse(&bad), Err(CmError::UnsupportedAttr(0x19)));
        let mut bad = m;
        bad[17] = 0x12;
        bad[32] = 0xc0;
        assert!(matches!(parse(&bad), Err(CmError::InvalidField { .. })));
    }

    #[test]
    fn emit_refuses_out_of_range_fields() {
        let mut r = req();
        r.max_cm_retries = 16;
        let msg = CmMessage {
            hdr: MadHeader::default(),
            body: CmBody::Req(r),
        };
        let mut m = [0xeeu8; 256];
        assert!(matches!(
            emit(&msg, &mut m),
            Err(CmError::FieldRange {
                field: "max_cm_retries",
                ..
            })
        ));
        assert_eq!(m, [0xee; 256], "a failed emit writes nothing");
    }

    #[test]
    fn private_data_helper() {
        let p: [u8; 4] = private_data(&[1, 2]).unwrap();
        assert_eq!(p, [1, 2, 0, 0]);
        assert_eq!(
            private_data::<4>(&[0; 5]),
            Err(CmError::PrivateDataTooLong { len: 5, max: 4 })
        );
    }
}
