//! The engine's view of a RoCEv2 transport packet: opcodes, the header fields the
//! protocol logic reads and writes, and the codec adapter to the wire layer.
//!
//! The protocol modules only see [`PktHdr`]; turning it into bytes (and back) and the
//! ICRC live behind [`emit`], [`parse`], [`seal`] and [`verify`] so that the wire crate
//! can change representation without touching the state machines.

/// IBTA opcodes (IBTA 9.2 table 38). The high 3 bits select the transport.
pub mod op {
    #![allow(missing_docs)]
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_IMM: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_IMM: u8 = 0x05;
    pub const WRITE_FIRST: u8 = 0x06;
    pub const WRITE_MIDDLE: u8 = 0x07;
    pub const WRITE_LAST: u8 = 0x08;
    pub const WRITE_LAST_IMM: u8 = 0x09;
    pub const WRITE_ONLY: u8 = 0x0a;
    pub const WRITE_ONLY_IMM: u8 = 0x0b;
    pub const READ_REQUEST: u8 = 0x0c;
    pub const READ_RESP_FIRST: u8 = 0x0d;
    pub const READ_RESP_MIDDLE: u8 = 0x0e;
    pub const READ_RESP_LAST: u8 = 0x0f;
    pub const READ_RESP_ONLY: u8 = 0x10;
    pub const ACK: u8 = 0x11;
    pub const ATOMIC_ACK: u8 = 0x12;
    pub const CMP_SWAP: u8 = 0x13;
    pub const FETCH_ADD: u8 = 0x14;
    pub const SEND_LAST_INV: u8 = 0x16;
    pub const SEND_ONLY_INV: u8 = 0x17;
    /// Transport prefixes.
    pub const RC: u8 = 0x00;
    pub const UC: u8 = 0x20;
    pub const UD: u8 = 0x60;
}

/// AETH syndromes (IBTA 9.3.5 table 42/43).
pub mod syndrome {
    #![allow(missing_docs)]
    /// ACK with "invalid credit count" (rxe: AETH_ACK_UNLIMITED): no end-to-end credits.
    pub const ACK: u8 = 0x1f;
    pub const RNR_NAK: u8 = 0x20;
    pub const NAK_PSN_SEQ: u8 = 0x60;
    pub const NAK_INVALID_REQUEST: u8 = 0x61;
    pub const NAK_REMOTE_ACCESS: u8 = 0x62;
    pub const NAK_REMOTE_OP: u8 = 0x63;
    pub const TYPE_MASK: u8 = 0xe0;
    pub const TYPE_ACK: u8 = 0x00;
    pub const TYPE_RNR: u8 = 0x20;
    pub const TYPE_NAK: u8 = 0x60;
}

/// Default partition key (full member) and the rule for accepting a received P_Key:
/// the default partition 0x7fff with either membership bit.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// The P_Key check (IBTA 10.9.3; rxe only knows the default partition).
pub fn pkey_ok(pkey: u16) -> bool {
    pkey & 0x7fff == 0x7fff
}

/// Header fields of one packet, as the protocol engine uses them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PktHdr {
    /// BTH opcode (transport prefix included).
    pub opcode: u8,
    /// Solicited event.
    pub se: bool,
    /// Pad count (filled by emit).
    pub pad: u8,
    /// Partition key.
    pub pkey: u16,
    /// Destination QPN (24 bits).
    pub dqpn: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// PSN (24 bits).
    pub psn: u32,
    /// RETH: virtual address, rkey, DMA length.
    pub reth: Option<(u64, u32, u32)>,
    /// AETH: syndrome, MSN.
    pub aeth: Option<(u8, u32)>,
    /// AtomicETH: va, rkey, swap_add, compare.
    pub atomic: Option<(u64, u32, u64, u64)>,
    /// AtomicAckETH: original remote value.
    pub atomic_ack: Option<u64>,
    /// Immediate data (host order of the BE wire value).
    pub imm: Option<u32>,
    /// IETH: rkey to invalidate.
    pub ieth: Option<u32>,
    /// DETH: Q_Key, source QPN.
    pub deth: Option<(u32, u32)>,
}

/// Flags describing an opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpInfo {
    /// Carries RETH.
    pub reth: bool,
    /// Carries AETH.
    pub aeth: bool,
    /// Carries AtomicETH.
    pub atomic: bool,
    /// Carries AtomicAckETH.
    pub atomic_ack: bool,
    /// Carries ImmDt.
    pub imm: bool,
    /// Carries IETH.
    pub ieth: bool,
    /// Carries DETH.
    pub deth: bool,
    /// May carry a payload.
    pub payload: bool,
}

/// What an opcode carries; None for opcodes this engine does not know.
pub fn op_info(opcode: u8) -> Option<OpInfo> {
    let tr = opcode & 0xe0;
    let base = opcode & 0x1f;
    let mut i = OpInfo {
        reth: false,
        aeth: false,
        atomic: false,
        atomic_ack: false,
        imm: false,
        ieth: false,
        deth: false,
        payload: false,
    };
    match tr {
        op::RC => {}
        op::UC => {
            if base > op::WRITE_ONLY_IMM {
                return None;
            }
        }
        op::UD => {
            if base != op::SEND_ONLY && base != op::SEND_ONLY_IMM {
                return None;
            }
            i.deth = true;
        }
        _ => return None,
    }
    match base {
        op::SEND_FIRST | op::SEND_MIDDLE | op::SEND_LAST | op::SEND_ONLY => i.payload = true,
        op::SEND_LAST_IMM | op::SEND_ONLY_IMM => {
            i.payload = true;
            i.imm = true;
        }
        op::WRITE_FIRST | op::WRITE_ONLY => {
            i.payload = true;
            i.reth = true;
        }
        op::WRITE_MIDDLE | op::WRITE_LAST => i.payload = true,
        op::WRITE_LAST_IMM => {
            i.payload = true;
            i.imm = true;
        }
        op::WRITE_ONLY_IMM => {
            i.payload = true;
            i.reth = true;
            i.imm = true;
        }
        op::READ_REQUEST => i.reth = true,
        op::READ_RESP_FIRST | op::READ_RESP_LAST | op::READ_RESP_ONLY => {
            i.payload = true;
            i.aeth = true;
        }
        op::READ_RESP_MIDDLE => i.payload = true,
        op::ACK => i.aeth = true,
        op::ATOMIC_ACK => {
            i.aeth = true;
            i.atomic_ack = true;
        }
        op::CMP_SWAP | op::FETCH_ADD => i.atomic = true,
        op::SEND_LAST_INV | op::SEND_ONLY_INV => {
            i.payload = true;
            i.ieth = true;
        }
        _ => return None,
    }
    Some(i)
}

/// Header length (BTH and extension headers) for an opcode.
pub fn header_len(opcode: u8) -> usize {
    let Some(i) = op_info(opcode) else { return 12 };
    12 + if i.deth { 8 } else { 0 }
        + if i.reth { 16 } else { 0 }
        + if i.aeth { 4 } else { 0 }
        + if i.atomic { 28 } else { 0 }
        + if i.atomic_ack { 8 } else { 0 }
        + if i.imm { 4 } else { 0 }
        + if i.ieth { 4 } else { 0 }
}

/// Pad bytes to bring a payload to a 4-byte multiple.
pub fn pad_count(len: usize) -> usize {
    (4 - (len & 3)) & 3
}

/// Length on the wire (UDP payload) of a packet with this opcode and payload length.
pub fn packet_len(opcode: u8, payload: usize) -> usize {
    header_len(opcode) + payload + pad_count(payload) + ICRC_LEN
}

/// ICRC size.
pub const ICRC_LEN: usize = 4;

pub use crate::deps::codec::{
    emit, extend_crc_zeros, parse, seal_pieces, seal_with_tail, solve_ipv4_id, verify, IcrcInfo,
};
