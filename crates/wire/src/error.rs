//! The one error type of the crate: every parse or emit failure says what and with which value.

/// Why a packet could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the structure being read or written.
    #[error("buffer too short for {what}: need {need} bytes, have {have}")]
    Truncated {
        /// Which structure did not fit.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The BTH opcode is reserved, or one rxe does not implement (RD, XRC, CNP, vendor).
    #[error("unsupported BTH opcode {0:#04x}")]
    UnsupportedOpcode(u8),
    /// BTH TVer is not 0 (IBTA 9.2: receivers drop other header versions; rxe `hdr_check`).
    #[error("unsupported BTH transport header version {0}")]
    BadTver(u8),
    /// The pad count and ICRC do not fit after the headers.
    #[error("pad count {pad} does not fit: {room} bytes between headers and ICRC")]
    BadPad {
        /// BTH PadCnt.
        pad: u8,
        /// Bytes between the end of the headers and the ICRC.
        room: usize,
    },
    /// Headers plus payload plus pad is not a multiple of 4 bytes (IBTA 9.2, PadCnt).
    #[error("packet length {len} (headers + payload + pad) is not a multiple of 4")]
    Misaligned {
        /// Length without the ICRC.
        len: usize,
    },
    /// An opcode that carries no payload (ACK, READ request, atomics) came with payload bytes.
    #[error("opcode {opcode:#04x} carries no payload but {len} payload bytes follow")]
    UnexpectedPayload {
        /// BTH opcode.
        opcode: u8,
        /// Payload length found.
        len: usize,
    },
    /// An extension header is present in `Headers` but the opcode has none, or missing but required.
    #[error("opcode {opcode:#04x}: extension header {header} {problem}")]
    HeaderMismatch {
        /// BTH opcode.
        opcode: u8,
        /// Name of the header (e.g. "RETH").
        header: &'static str,
        /// "missing" or "not allowed".
        problem: &'static str,
    },
    /// A field holds a value wider than its wire width.
    #[error("field {field} = {value:#x} does not fit in {bits} bits")]
    FieldRange {
        /// Field name.
        field: &'static str,
        /// Offending value.
        value: u64,
        /// Wire width.
        bits: u8,
    },
    /// Ethernet type is neither IPv4 nor IPv6.
    #[error("unsupported ethertype {0:#06x}")]
    UnsupportedEthertype(u16),
    /// The IP version nibble is neither 4 nor 6, or does not match the ethertype.
    #[error("unsupported IP version {0}")]
    UnsupportedIpVersion(u8),
    /// IPv4 options present: the RoCEv2 ICRC (rxe) assumes a 20-byte IPv4 header.
    #[error("IPv4 header length {0} bytes: options are not supported by RoCEv2")]
    Ipv4Options(usize),
    /// The IP packet is a fragment; RoCEv2 packets are never fragmented.
    #[error("IPv4 fragment (flags/offset {0:#06x})")]
    Fragmented(u16),
    /// The IP next header / protocol is not UDP (IPv6 extension headers are not supported).
    #[error("IP protocol {0} is not UDP")]
    NotUdp(u8),
    /// A length field disagrees with the other length fields or with the buffer.
    #[error("{field} length {value} inconsistent with {expected}")]
    BadLength {
        /// Which length field.
        field: &'static str,
        /// The value found.
        value: usize,
        /// The value the other fields imply.
        expected: usize,
    },
    /// The UDP destination port is not 4791 (IBTA A17.2.2).
    #[error("UDP destination port {0} is not RoCEv2 (4791)")]
    NotRoce(u16),
}
