//! BTH opcodes (IBTA 9.2, table 38) and what each one implies: transport, extension
//! headers (in wire order), payload, and position in a message.
//!
//! The table mirrors rxe's `rxe_opcode[]` (drivers/infiniband/sw/rxe/rxe_opcode.c) for
//! the RC, UC and UD opcodes. RD, XRC, CNP and vendor opcodes are reported as
//! unsupported, as rxe has no RD/XRC QPs and drops them.

use bitflags::bitflags;

use crate::bth::BTH_LEN;
use crate::ext::{
    AETH_LEN, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN, DETH_LEN, IETH_LEN, IMM_DT_LEN, RETH_LEN,
};

/// Transport service of an opcode: its top three bits (IBTA 9.2, table 38).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connection (000).
    Rc,
    /// Unreliable connection (001).
    Uc,
    /// Reliable datagram (010); not supported.
    Rd,
    /// Unreliable datagram (011).
    Ud,
    /// Congestion notification packet (100, RoCEv2 Annex A17.9.3); not supported.
    Cnp,
    /// Extended reliable connection (101); not supported.
    Xrc,
    /// Manufacturer specific (110, 111); not supported.
    Vendor,
}

impl Transport {
    /// The top three opcode bits of this transport (`Vendor` gives 110).
    pub const fn base(self) -> u8 {
        match self {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Rd => 0x40,
            Transport::Ud => 0x60,
            Transport::Cnp => 0x80,
            Transport::Xrc => 0xa0,
            Transport::Vendor => 0xc0,
        }
    }
}

/// Where a packet sits in a message (IBTA 9.2: First, Middle, Last, Only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

impl Position {
    /// The position of a packet that is (or is not) the first and the last of its message.
    #[inline]
    pub const fn from_ends(first: bool, last: bool) -> Position {
        match (first, last) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, true) => Position::Last,
            (false, false) => Position::Middle,
        }
    }
}

bitflags! {
    /// Extension headers an opcode carries. Emit and parse order on the wire is the
    /// declaration order: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH
    /// (rxe `rxe_opcode[].offset`; e.g. RDMA WRITE Only w/ Imm = BTH RETH ImmDt,
    /// UD SEND Only w/ Imm = BTH DETH ImmDt, Atomic ACK = BTH AETH AtomicAckETH).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ExtHeaders: u8 {
        /// Datagram extended transport header (8 bytes).
        const DETH = 1 << 0;
        /// RDMA extended transport header (16 bytes).
        const RETH = 1 << 1;
        /// Atomic extended transport header (28 bytes).
        const ATOMIC_ETH = 1 << 2;
        /// ACK extended transport header (4 bytes).
        const AETH = 1 << 3;
        /// Atomic ACK extended transport header (8 bytes).
        const ATOMIC_ACK_ETH = 1 << 4;
        /// Immediate data (4 bytes).
        const IMM_DT = 1 << 5;
        /// Invalidate extended transport header (4 bytes).
        const IETH = 1 << 6;
    }
}

impl ExtHeaders {
    /// Total bytes of these extension headers.
    pub const fn byte_len(self) -> usize {
        let b = self.bits();
        let mut n = 0;
        if b & Self::DETH.bits() != 0 {
            n += DETH_LEN;
        }
        if b & Self::RETH.bits() != 0 {
            n += RETH_LEN;
        }
        if b & Self::ATOMIC_ETH.bits() != 0 {
            n += ATOMIC_ETH_LEN;
        }
        if b & Self::AETH.bits() != 0 {
            n += AETH_LEN;
        }
        if b & Self::ATOMIC_ACK_ETH.bits() != 0 {
            n += ATOMIC_ACK_ETH_LEN;
        }
        if b & Self::IMM_DT.bits() != 0 {
            n += IMM_DT_LEN;
        }
        if b & Self::IETH.bits() != 0 {
            n += IETH_LEN;
        }
        n
    }
}

// Per-opcode property bits (like rxe's RXE_*_MASK).
const VALID: u16 = 1 << 0;
const PAYLOAD: u16 = 1 << 1;
const START: u16 = 1 << 2;
const MIDDLE: u16 = 1 << 3;
const END: u16 = 1 << 4;
const SEND: u16 = 1 << 5;
const WRITE: u16 = 1 << 6;
const READ_REQ: u16 = 1 << 7;
const READ_RESP: u16 = 1 << 8;
const ATOMIC: u16 = 1 << 9;
const ACK: u16 = 1 << 10;
const ATOMIC_ACK: u16 = 1 << 11;
const REQ: u16 = 1 << 12;
const COMP: u16 = 1 << 13;
const RWR: u16 = 1 << 14;
const RESP: u16 = 1 << 15;

#[derive(Clone, Copy)]
struct OpInfo {
    flags: u16,
    ext: ExtHeaders,
    /// BTH + extension headers.
    header_len: u8,
}

const INVALID: OpInfo = OpInfo {
    flags: 0,
    ext: ExtHeaders::empty(),
    header_len: 0,
};

const fn op(flags: u16, ext: ExtHeaders) -> OpInfo {
    OpInfo {
        flags: flags | VALID,
        ext,
        header_len: (BTH_LEN + ext.byte_len()) as u8,
    }
}

const fn compute(code: u8) -> OpInfo {
    let none = ExtHeaders::empty();
    let imm = ExtHeaders::IMM_DT;
    let reth = ExtHeaders::RETH;
    let aeth = ExtHeaders::AETH;
    let low = code & 0x1f;
    let info = match low {
        0x00 => op(PAYLOAD | REQ | SEND | START | RWR, none),
        0x01 => op(PAYLOAD | REQ | SEND | MIDDLE, none),
        0x02 => op(PAYLOAD | REQ | SEND | END | COMP, none),
        0x03 => op(PAYLOAD | REQ | SEND | END | COMP, imm),
        0x04 => op(PAYLOAD | REQ | SEND | START | END | COMP | RWR, none),
        0x05 => op(PAYLOAD | REQ | SEND | START | END | COMP | RWR, imm),
        0x06 => op(PAYLOAD | REQ | WRITE | START, reth),
        0x07 => op(PAYLOAD | REQ | WRITE | MIDDLE, none),
        0x08 => op(PAYLOAD | REQ | WRITE | END, none),
        0x09 => op(PAYLOAD | REQ | WRITE | END | COMP | RWR, imm),
        0x0a => op(PAYLOAD | REQ | WRITE | START | END, reth),
        0x0b => op(
            PAYLOAD | REQ | WRITE | START | END | COMP | RWR,
            reth.union(imm),
        ),
        0x0c => op(REQ | READ_REQ | START | END, reth),
        0x0d => op(PAYLOAD | RESP | READ_RESP | START, aeth),
        0x0e => op(PAYLOAD | RESP | READ_RESP | MIDDLE, none),
        0x0f => op(PAYLOAD | RESP | READ_RESP | END, aeth),
        0x10 => op(PAYLOAD | RESP | READ_RESP | START | END, aeth),
        0x11 => op(RESP | ACK | START | END, aeth),
        0x12 => op(
            RESP | ATOMIC_ACK | START | END,
            aeth.union(ExtHeaders::ATOMIC_ACK_ETH),
        ),
        0x13 | 0x14 => op(REQ | ATOMIC | START | END, ExtHeaders::ATOMIC_ETH),
        0x16 => op(PAYLOAD | REQ | SEND | END | COMP, ExtHeaders::IETH),
        0x17 => op(
            PAYLOAD | REQ | SEND | START | END | COMP | RWR,
            ExtHeaders::IETH,
        ),
        _ => INVALID,
    };
    match code >> 5 {
        // RC: everything above.
        0 => info,
        // UC: SEND and RDMA WRITE families only (IBTA table 38).
        1 if low <= 0x0b => info,
        // UD: SEND Only (w/ Imm), with a DETH first.
        3 if low == 0x04 || low == 0x05 => op(info.flags, info.ext.union(ExtHeaders::DETH)),
        _ => INVALID,
    }
}

// Evaluated at compile time: an out-of-range index would fail the build, not panic at run time.
#[allow(clippy::indexing_slicing)]
const fn build_table() -> [OpInfo; 256] {
    let mut t = [INVALID; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = compute(i as u8);
        i += 1;
    }
    t
}

static TABLE: [OpInfo; 256] = build_table();

/// A BTH opcode byte. Any `u8` is representable; [`Opcode::is_valid`] tells whether this
/// crate (and rxe) implements it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($($(#[$m:meta])* $name:ident = $v:expr;)*) => {
        impl Opcode {
            $($(#[$m])* pub const $name: Opcode = Opcode($v);)*
        }
        /// The IBTA name of an opcode (`"RC_SEND_FIRST"`), or `None` if unsupported.
        const fn opcode_name(v: u8) -> Option<&'static str> {
            match v {
                $($v => Some(stringify!($name)),)*
                _ => None,
            }
        }
    };
}

opcodes! {
    /// RC SEND First.
    RC_SEND_FIRST = 0x00;
    /// RC SEND Middle.
    RC_SEND_MIDDLE = 0x01;
    /// RC SEND Last.
    RC_SEND_LAST = 0x02;
    /// RC SEND Last with Immediate.
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03;
    /// RC SEND Only.
    RC_SEND_ONLY = 0x04;
    /// RC SEND Only with Immediate.
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05;
    /// RC RDMA WRITE First.
    RC_RDMA_WRITE_FIRST = 0x06;
    /// RC RDMA WRITE Middle.
    RC_RDMA_WRITE_MIDDLE = 0x07;
    /// RC RDMA WRITE Last.
    RC_RDMA_WRITE_LAST = 0x08;
    /// RC RDMA WRITE Last with Immediate.
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09;
    /// RC RDMA WRITE Only.
    RC_RDMA_WRITE_ONLY = 0x0a;
    /// RC RDMA WRITE Only with Immediate.
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b;
    /// RC RDMA READ Request.
    RC_RDMA_READ_REQUEST = 0x0c;
    /// RC RDMA READ response First.
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d;
    /// RC RDMA READ response Middle.
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e;
    /// RC RDMA READ response Last.
    RC_RDMA_READ_RESPONSE_LAST = 0x0f;
    /// RC RDMA READ response Only.
    RC_RDMA_READ_RESPONSE_ONLY = 0x10;
    /// RC Acknowledge.
    RC_ACKNOWLEDGE = 0x11;
    /// RC ATOMIC Acknowledge.
    RC_ATOMIC_ACKNOWLEDGE = 0x12;
    /// RC CmpSwap.
    RC_COMPARE_SWAP = 0x13;
    /// RC FetchAdd.
    RC_FETCH_ADD = 0x14;
    /// RC SEND Last with Invalidate.
    RC_SEND_LAST_WITH_INVALIDATE = 0x16;
    /// RC SEND Only with Invalidate.
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17;
    /// UC SEND First.
    UC_SEND_FIRST = 0x20;
    /// UC SEND Middle.
    UC_SEND_MIDDLE = 0x21;
    /// UC SEND Last.
    UC_SEND_LAST = 0x22;
    /// UC SEND Last with Immediate.
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23;
    /// UC SEND Only.
    UC_SEND_ONLY = 0x24;
    /// UC SEND Only with Immediate.
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25;
    /// UC RDMA WRITE First.
    UC_RDMA_WRITE_FIRST = 0x26;
    /// UC RDMA WRITE Middle.
    UC_RDMA_WRITE_MIDDLE = 0x27;
    /// UC RDMA WRITE Last.
    UC_RDMA_WRITE_LAST = 0x28;
    /// UC RDMA WRITE Last with Immediate.
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29;
    /// UC RDMA WRITE Only.
    UC_RDMA_WRITE_ONLY = 0x2a;
    /// UC RDMA WRITE Only with Immediate.
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b;
    /// UD SEND Only.
    UD_SEND_ONLY = 0x64;
    /// UD SEND Only with Immediate.
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65;
}

impl Opcode {
    #[inline]
    fn info(self) -> OpInfo {
        match TABLE.get(usize::from(self.0)) {
            Some(i) => *i,
            None => INVALID,
        }
    }

    #[inline]
    fn has(self, f: u16) -> bool {
        self.info().flags & f != 0
    }

    /// Every opcode this crate supports, in numeric order.
    pub fn all() -> impl Iterator<Item = Opcode> {
        (0..=255u8).map(Opcode).filter(|o| o.is_valid())
    }

    /// The transport service (top three bits).
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            _ => Transport::Vendor,
        }
    }

    /// True for opcodes rxe implements (RC, UC, UD rows of IBTA table 38).
    #[inline]
    pub fn is_valid(self) -> bool {
        self.has(VALID)
    }

    /// IBTA name (`"RC_SEND_FIRST"`), or `None` for unsupported opcodes.
    pub const fn name(self) -> Option<&'static str> {
        opcode_name(self.0)
    }

    /// Bytes of BTH plus extension headers; 0 for unsupported opcodes.
    #[inline]
    pub fn header_len(self) -> usize {
        usize::from(self.info().header_len)
    }

    /// Extension headers this opcode carries (empty for unsupported opcodes).
    #[inline]
    pub fn ext(self) -> ExtHeaders {
        self.info().ext
    }

    /// The packet may carry payload (SEND, WRITE, READ response).
    #[inline]
    pub fn has_payload(self) -> bool {
        self.has(PAYLOAD)
    }

    /// First packet of a multi-packet message (not Only).
    #[inline]
    pub fn is_first(self) -> bool {
        self.info().flags & (START | END) == START
    }

    /// Middle packet.
    #[inline]
    pub fn is_middle(self) -> bool {
        self.has(MIDDLE)
    }

    /// Last packet of a multi-packet message (not Only).
    #[inline]
    pub fn is_last(self) -> bool {
        self.info().flags & (START | END) == END
    }

    /// Single-packet message (Only, READ request, atomics, ACKs).
    #[inline]
    pub fn is_only(self) -> bool {
        self.info().flags & (START | END) == START | END
    }

    /// Starts a message: First or Only (rxe `RXE_START_MASK`).
    #[inline]
    pub fn starts_message(self) -> bool {
        self.has(START)
    }

    /// Ends a message: Last or Only (rxe `RXE_END_MASK`).
    #[inline]
    pub fn ends_message(self) -> bool {
        self.has(END)
    }

    /// Position in the message, `None` for unsupported opcodes.
    pub fn position(self) -> Option<Position> {
        let f = self.info().flags;
        if f & VALID == 0 {
            None
        } else if f & MIDDLE != 0 {
            Some(Position::Middle)
        } else {
            match (f & START != 0, f & END != 0) {
                (true, true) => Some(Position::Only),
                (true, false) => Some(Position::First),
                (false, true) => Some(Position::Last),
                (false, false) => None,
            }
        }
    }

    /// A SEND family opcode (incl. with Immediate / Invalidate).
    #[inline]
    pub fn is_send(self) -> bool {
        self.has(SEND)
    }

    /// An RDMA WRITE family opcode.
    #[inline]
    pub fn is_write(self) -> bool {
        self.has(WRITE)
    }

    /// RDMA READ Request.
    #[inline]
    pub fn is_read_request(self) -> bool {
        self.has(READ_REQ)
    }

    /// RDMA READ response (First/Middle/Last/Only).
    #[inline]
    pub fn is_read_response(self) -> bool {
        self.has(READ_RESP)
    }

    /// CmpSwap or FetchAdd request.
    #[inline]
    pub fn is_atomic(self) -> bool {
        self.has(ATOMIC)
    }

    /// Acknowledge (ACK or NAK; not READ responses, not Atomic ACK).
    #[inline]
    pub fn is_ack(self) -> bool {
        self.has(ACK)
    }

    /// Atomic Acknowledge.
    #[inline]
    pub fn is_atomic_ack(self) -> bool {
        self.has(ATOMIC_ACK)
    }

    /// Sent by a requester (SEND, WRITE, READ request, atomics; rxe `RXE_REQ_MASK`).
    #[inline]
    pub fn is_request(self) -> bool {
        self.has(REQ)
    }

    /// Sent by a responder (ACK, Atomic ACK, READ responses; rxe `RXE_ACK_MASK`).
    #[inline]
    pub fn is_response(self) -> bool {
        self.has(RESP)
    }

    /// Carries immediate data.
    #[inline]
    pub fn has_immediate(self) -> bool {
        self.ext().contains(ExtHeaders::IMM_DT)
    }

    /// Carries an IETH (SEND with Invalidate).
    #[inline]
    pub fn has_invalidate(self) -> bool {
        self.ext().contains(ExtHeaders::IETH)
    }

    /// Completes a receive WR at the responder (rxe `RXE_COMP_MASK`): SEND Last/Only,
    /// RDMA WRITE with Immediate Last/Only.
    #[inline]
    pub fn completes_receive(self) -> bool {
        self.has(COMP)
    }

    /// Consumes a receive WR at the responder (rxe `RXE_RWR_MASK`): SEND First/Only and
    /// RDMA WRITE with Immediate.
    #[inline]
    pub fn consumes_receive(self) -> bool {
        self.has(RWR)
    }

    /// The SEND opcode for `transport` at `pos`; `imm` and `inv` may be set on Last/Only
    /// only, not both, `inv` on RC only; UD has Only only. `None` if no such opcode.
    #[inline]
    pub fn send(transport: Transport, pos: Position, imm: bool, inv: bool) -> Option<Opcode> {
        if imm && inv {
            return None;
        }
        let low = match (pos, imm, inv) {
            (Position::First, false, false) => 0x00,
            (Position::Middle, false, false) => 0x01,
            (Position::Last, false, false) => 0x02,
            (Position::Last, true, false) => 0x03,
            (Position::Only, false, false) => 0x04,
            (Position::Only, true, false) => 0x05,
            (Position::Last, false, true) => 0x16,
            (Position::Only, false, true) => 0x17,
            _ => return None,
        };
        Self::checked(transport, low)
    }

    /// The RDMA WRITE opcode for `transport` at `pos`; `imm` on Last/Only only.
    #[inline]
    pub fn write(transport: Transport, pos: Position, imm: bool) -> Option<Opcode> {
        let low = match (pos, imm) {
            (Position::First, false) => 0x06,
            (Position::Middle, false) => 0x07,
            (Position::Last, false) => 0x08,
            (Position::Last, true) => 0x09,
            (Position::Only, false) => 0x0a,
            (Position::Only, true) => 0x0b,
            _ => return None,
        };
        Self::checked(transport, low)
    }

    /// The RC RDMA READ response opcode at `pos`.
    #[inline]
    pub const fn read_response(pos: Position) -> Opcode {
        match pos {
            Position::First => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            Position::Middle => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Position::Last => Opcode::RC_RDMA_READ_RESPONSE_LAST,
            Position::Only => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        }
    }

    /// This opcode moved to another transport (e.g. RC SEND Only to UC SEND Only), if it
    /// exists there.
    pub fn with_transport(self, transport: Transport) -> Option<Opcode> {
        Self::checked(transport, self.0 & 0x1f)
    }

    #[inline]
    fn checked(transport: Transport, low: u8) -> Option<Opcode> {
        let o = Opcode(transport.base() | low);
        o.is_valid().then_some(o)
    }
}

impl core::fmt::Debug for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({:#04x})", self.0),
            None => write!(f, "Opcode({:#04x})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lengths_match_rxe_table() {
        assert_eq!(Opcode::RC_SEND_FIRST.header_len(), 12);
        assert_eq!(Opcode::RC_SEND_LAST_WITH_IMMEDIATE.header_len(), 16);
        assert_eq!(Opcode::RC_RDMA_WRITE_FIRST.header_len(), 28);
        assert_eq!(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.header_len(), 32);
        assert_eq!(Opcode::RC_RDMA_READ_REQUEST.header_len(), 28);
        assert_eq!(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.header_len(), 12);
        assert_eq!(Opcode::RC_RDMA_READ_RESPONSE_ONLY.header_len(), 16);
        assert_eq!(Opcode::RC_ACKNOWLEDGE.header_len(), 16);
        assert_eq!(Opcode::RC_ATOMIC_ACKNOWLEDGE.header_len(), 24);
        assert_eq!(Opcode::RC_COMPARE_SWAP.header_len(), 40);
        assert_eq!(Opcode::RC_SEND_ONLY_WITH_INVALIDATE.header_len(), 16);
        assert_eq!(Opcode::UD_SEND_ONLY.header_len(), 20);
        assert_eq!(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.header_len(), 24);
        assert_eq!(Opcode(0x15).header_len(), 0);
    }

    #[test]
    fn supported_set_is_rc_uc_ud() {
        let all: Vec<u8> = Opcode::all().map(|o| o.0).collect();
        assert_eq!(all.len(), 23 + 12 + 2);
        assert!(!Opcode(0x15).is_valid());
        assert!(!Opcode(0x2c).is_valid(), "UC has no READ");
        assert!(!Opcode(0x40).is_valid(), "RD unsupported");
        assert!(!Opcode(0x60).is_valid(), "UD SEND First does not exist");
        assert!(!Opcode(0x81).is_valid(), "CNP unsupported");
        for o in Opcode::all() {
            assert!(o.name().is_some(), "{o:?}");
            assert!(o.position().is_some(), "{o:?}");
        }
    }

    #[test]
    fn classification() {
        assert!(Opcode::RC_SEND_FIRST.is_first() && !Opcode::RC_SEND_FIRST.is_only());
        assert!(Opcode::RC_SEND_MIDDLE.is_middle());
        assert!(Opcode::RC_SEND_LAST.is_last());
        assert!(Opcode::RC_SEND_ONLY.is_only() && Opcode::RC_SEND_ONLY.starts_message());
        assert!(Opcode::RC_ACKNOWLEDGE.is_ack() && !Opcode::RC_ACKNOWLEDGE.has_payload());
        assert!(Opcode::RC_ATOMIC_ACKNOWLEDGE.is_atomic_ack());
        assert!(!Opcode::RC_ATOMIC_ACKNOWLEDGE.is_ack());
        assert!(Opcode::RC_FETCH_ADD.is_atomic() && Opcode::RC_FETCH_ADD.is_request());
        assert!(Opcode::RC_RDMA_READ_RESPONSE_LAST.is_read_response());
        assert!(Opcode::RC_RDMA_READ_RESPONSE_LAST.is_response());
        assert!(Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE.consumes_receive());
        assert!(!Opcode::UC_RDMA_WRITE_LAST.consumes_receive());
        assert_eq!(Opcode::UD_SEND_ONLY.transport(), Transport::Ud);
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.ext(),
            ExtHeaders::DETH | ExtHeaders::IMM_DT
        );
    }

    #[test]
    fn builders() {
        use Position::*;
        use Transport::*;
        assert_eq!(
            Opcode::send(Rc, First, false, false),
            Some(Opcode::RC_SEND_FIRST)
        );
        assert_eq!(
            Opcode::send(Rc, Last, false, true),
            Some(Opcode::RC_SEND_LAST_WITH_INVALIDATE)
        );
        assert_eq!(
            Opcode::send(Uc, Only, true, false),
            Some(Opcode::UC_SEND_ONLY_WITH_IMMEDIATE)
        );
        assert_eq!(Opcode::send(Uc, Only, false, true), None);
        assert_eq!(
            Opcode::send(Ud, Only, true, false),
            Some(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE)
        );
        assert_eq!(Opcode::send(Ud, First, false, false), None);
        assert_eq!(Opcode::send(Rc, First, true, false), None);
        assert_eq!(
            Opcode::write(Uc, Middle, false),
            Some(Opcode::UC_RDMA_WRITE_MIDDLE)
        );
        assert_eq!(Opcode::write(Ud, Only, false), None);
        assert_eq!(
            Opcode::read_response(Only),
            Opcode::RC_RDMA_READ_RESPONSE_ONLY
        );
        assert_eq!(
            Opcode::RC_SEND_ONLY.with_transport(Ud),
            Some(Opcode::UD_SEND_ONLY)
        );
        assert_eq!(format!("{:?}", Opcode::RC_SEND_LAST), "RC_SEND_LAST(0x02)");
    }

    #[test]
    fn position_from_ends() {
        assert_eq!(Position::from_ends(true, true), Position::Only);
        assert_eq!(Position::from_ends(true, false), Position::First);
        assert_eq!(Position::from_ends(false, true), Position::Last);
        assert_eq!(Position::from_ends(false, false), Position::Middle);
    }
}
