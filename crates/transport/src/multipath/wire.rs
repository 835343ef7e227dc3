//! The multipath extension's packets: the negotiation MAD (a vendor-class Get to the
//! peer's QP 1) and the manufacturer-specific RC opcodes (IBTA 9.2: 0xE0–0xFF are left
//! to vendors; hfi1 uses 0xE0–0xE7 the same way) sent only after a positive negotiation.
//! Each extension packet is a BTH, a short body and the ICRC, so tshark decodes it as a
//! RoCE BTH packet with an unknown opcode.

use std::net::{IpAddr, Ipv6Addr};

use softhca_wire::{Bth, Deth, Opcode, Psn, Qpn, BTH_LEN};

/// SACK: cumulative ACK (BTH PSN), MSN, and the PSN ranges held beyond it.
pub(crate) const OP_SACK: u8 = 0xe1;
/// Path probe (validation, keepalive, readmission).
pub(crate) const OP_PROBE: u8 = 0xe2;
/// Answer to a path probe, echoing its nonce.
pub(crate) const OP_PROBE_ACK: u8 = 0xe3;

/// Whether a BTH opcode is one of the extension's (never sent before negotiation).
pub(crate) fn is_mp_opcode(op: u8) -> bool {
    (OP_SACK..=OP_PROBE_ACK).contains(&op)
}

/// The GSI Q_Key (IBTA 9.6.1.1.1): what QP 1 accepts.
pub(crate) const GSI_QKEY: u32 = 0x8001_0000;
/// MAD length (IBTA 13.4.2).
const MAD_LEN: usize = 256;
/// Management class of the negotiation MAD: vendor-specific range 1 (IBTA 13.4.4, no
/// OUI). Linux ib_mad answers a Get of a class nobody registered with status
/// UNSUPPORTED_METHOD_ATTRIB (`generate_unmatched_resp`): a definite "no".
const MAD_CLASS: u8 = 0x0a;
const MAD_CLASS_VERSION: u8 = 1;
const METHOD_GET: u8 = 0x01;
const METHOD_GET_RESP: u8 = 0x81;
/// Attribute ID of the negotiation MAD.
const MAD_ATTR: u16 = 0xff51;
/// Marks a softhca negotiation body.
const MAGIC: [u8; 4] = *b"SHMP";
/// Extension version carried in the negotiation.
pub(crate) const MP_VERSION: u8 = 1;
/// Most addresses one side advertises (fits the MAD's data area with room to spare).
pub(crate) const MAX_ADDRS: usize = 8;
/// Most SACK ranges in one SACK.
pub(crate) const MAX_SACK_RANGES: usize = 32;
/// MAD status: the class/method/attribute is not supported (IBTA table 106).
pub(crate) const STATUS_UNSUPPORTED: u16 = 0x000c;

/// A negotiation MAD: request (Get) or answer (GetResp).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub answer: bool,
    /// MAD status (answers: 0 = yes; any other = no).
    pub status: u16,
    /// The sender's RC or UC QP.
    pub from_qpn: u32,
    /// The receiver's QP (the sender's destination QP).
    pub to_qpn: u32,
    /// Transaction nonce (echoed in the answer).
    pub nonce: u32,
    /// The sender's addresses multipath may use.
    pub addrs: Vec<IpAddr>,
    /// UDP source ports per address pair the sender uses.
    pub sports: u8,
    /// The largest bundle (`softhca_wire::bundle`) the sender receives, bytes; 0: none.
    pub bundle_max: usize,
    /// The largest packet payload the sender's RC QPs send and receive above the path
    /// MTU (`EngineConfig::jumbo_mtu`); 0: none. After the addresses, where an
    /// older softhca left zeros.
    pub packet_max: u32,
}

/// [`Hello::bundle_max`] travels in the body's last reserved byte (an older softhca sent
/// 0 there: no bundles), in units of this many bytes, rounded down.
const BUNDLE_UNIT: usize = 256;

/// Bounds-checked big-endian writer (the crate forbids slice indexing).
struct Put<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Put<'_> {
    fn bytes(&mut self, b: &[u8]) -> Option<()> {
        self.buf
            .get_mut(self.at..self.at + b.len())?
            .copy_from_slice(b);
        self.at += b.len();
        Some(())
    }
}

/// Bounds-checked big-endian reader.
struct Get<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Get<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let b = self.buf.get(self.at..self.at + N)?.try_into().ok()?;
        self.at += N;
        Some(b)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_be_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_be_bytes)
    }
}

fn ip16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn from16(b: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(b);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

impl Hello {
    /// The UD packet to the peer's QP 1 carrying this MAD (BTH, DETH, MAD; no ICRC).
    pub fn encode(&self) -> Option<Vec<u8>> {
        let mut pkt = vec![0u8; BTH_LEN + 8 + MAD_LEN];
        let bth = Bth::new(Opcode::UD_SEND_ONLY, Qpn::new(1), Psn::new(0));
        bth.emit(&mut pkt).ok()?;
        let deth = Deth {
            qkey: GSI_QKEY,
            src_qp: Qpn::new(1),
        };
        deth.emit(pkt.get_mut(BTH_LEN..)?).ok()?;
        let mut p = Put {
            buf: pkt.get_mut(BTH_LEN + 8..)?,
            at: 0,
        };
        let method = if self.answer {
            METHOD_GET_RESP
        } else {
            METHOD_GET
        };
        // Common MAD header (IBTA 13.4.3): base version 1, class, class version,
        // method, status, class specific, TID, attribute ID, reserved, modifier.
        p.bytes(&[1, MAD_CLASS, MAD_CLASS_VERSION, method])?;
        p.bytes(&self.status.to_be_bytes())?;
        p.bytes(&[0, 0])?;
        p.bytes(&u64::from(self.nonce).to_be_bytes())?;
        p.bytes(&MAD_ATTR.to_be_bytes())?;
        p.bytes(&[0, 0, 0, 0, 0, 0])?;
        p.bytes(&MAGIC)?;
        let n = self.addrs.len().min(MAX_ADDRS);
        let bundle = (self.bundle_max / BUNDLE_UNIT).min(255) as u8;
        p.bytes(&[MP_VERSION, self.sports, n as u8, bundle])?;
        p.bytes(&self.from_qpn.to_be_bytes())?;
        p.bytes(&self.to_qpn.to_be_bytes())?;
        for a in self.addrs.iter().take(n) {
            p.bytes(&ip16(*a))?;
        }
        p.bytes(&self.packet_max.to_be_bytes())?;
        Some(pkt)
    }

    /// Read a negotiation MAD from the payload of a UD SEND to QP 1; None for any
    /// other MAD (the GSI QP's traffic: CM and the rest).
    pub fn decode(mad: &[u8]) -> Option<Hello> {
        let mut g = Get { buf: mad, at: 0 };
        let [base, class, _cv, method] = g.take::<4>()?;
        if base != 1 || class != MAD_CLASS {
            return None;
        }
        let status = g.u16()?;
        let _class_specific = g.u16()?;
        let tid = u64::from_be_bytes(g.take()?);
        if g.u16()? != MAD_ATTR {
            return None;
        }
        g.take::<6>()?;
        let answer = match method {
            METHOD_GET => false,
            METHOD_GET_RESP => true,
            _ => return None,
        };
        let mut h = Hello {
            answer,
            status,
            from_qpn: 0,
            to_qpn: 0,
            nonce: tid as u32,
            addrs: Vec::new(),
            sports: 1,
            bundle_max: 0,
            packet_max: 0,
        };
        if g.take::<4>()? != MAGIC {
            // A Linux host's "unsupported" answer echoes our request: the body is ours,
            // with the answering side's status; only the status matters then.
            return answer.then_some(h);
        }
        let [_version, sports, n, bundle] = g.take::<4>()?;
        h.sports = sports.max(1);
        h.bundle_max = usize::from(bundle) * BUNDLE_UNIT;
        h.from_qpn = g.u32()? & 0x00ff_ffff;
        h.to_qpn = g.u32()? & 0x00ff_ffff;
        for _ in 0..usize::from(n).min(MAX_ADDRS) {
            h.addrs.push(from16(g.take()?));
        }
        h.packet_max = g.u32().unwrap_or(0);
        Some(h)
    }
}

/// A SACK body: the MSN, then the PSN ranges (first, last, inclusive) the responder
/// holds beyond its cumulative ACK, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Sack {
    pub msn: u32,
    pub ranges: Vec<(Psn, Psn)>,
}

/// A probe or its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probe {
    pub nonce: u32,
    /// The sender's path index (echoed, so the prober finds its path).
    pub path: u8,
}

/// An extension packet for a connected QP (BTH, body; no ICRC).
pub(crate) fn encode_sack(dqpn: u32, cum: Psn, s: &Sack) -> Option<Vec<u8>> {
    let n = s.ranges.len().min(MAX_SACK_RANGES);
    let mut pkt = vec![0u8; BTH_LEN + 8 + 8 * n];
    Bth::new(Opcode(OP_SACK), Qpn::new(dqpn), cum)
        .emit(&mut pkt)
        .ok()?;
    let mut p = Put {
        buf: pkt.get_mut(BTH_LEN..)?,
        at: 0,
    };
    p.bytes(&(s.msn & 0x00ff_ffff).to_be_bytes())?;
    p.bytes(&(n as u16).to_be_bytes())?;
    p.bytes(&[0, 0])?;
    for (a, b) in s.ranges.iter().take(n) {
        p.bytes(&a.value().to_be_bytes())?;
        p.bytes(&b.value().to_be_bytes())?;
    }
    Some(pkt)
}

/// Read a SACK body (after the BTH, before the ICRC).
pub(crate) fn decode_sack(body: &[u8]) -> Option<Sack> {
    let mut g = Get { buf: body, at: 0 };
    let msn = g.u32()? & 0x00ff_ffff;
    let n = usize::from(g.u16()?).min(MAX_SACK_RANGES);
    g.u16()?;
    let mut ranges = Vec::with_capacity(n);
    for _ in 0..n {
        let a = Psn::new(g.u32()?);
        let b = Psn::new(g.u32()?);
        ranges.push((a, b));
    }
    Some(Sack { msn, ranges })
}

/// A probe (`ack` false) or probe answer to QP `dqpn`.
pub(crate) fn encode_probe(dqpn: u32, ack: bool, p: Probe) -> Option<Vec<u8>> {
    let op = if ack { OP_PROBE_ACK } else { OP_PROBE };
    let mut pkt = vec![0u8; BTH_LEN + 8];
    Bth::new(Opcode(op), Qpn::new(dqpn), Psn::new(0))
        .emit(&mut pkt)
        .ok()?;
    let mut w = Put {
        buf: pkt.get_mut(BTH_LEN..)?,
        at: 0,
    };
    w.bytes(&p.nonce.to_be_bytes())?;
    w.bytes(&[p.path, 0, 0, 0])?;
    Some(pkt)
}

/// Read a probe body.
pub(crate) fn decode_probe(body: &[u8]) -> Option<Probe> {
    let mut g = Get { buf: body, at: 0 };
    let nonce = g.u32()?;
    let path = g.u8()?;
    Some(Probe { nonce, path })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn hello_round_trips_and_ignores_other_mads() {
        let h = Hello {
            answer: false,
            status: 0,
            from_qpn: 0x12345,
            to_qpn: 0x678,
            nonce: 0xdead_beef,
            addrs: vec![
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                "fd00::1".parse().unwrap(),
            ],
            sports: 2,
            bundle_max: 9216,
            packet_max: 16384,
        };
        let pkt = h.encode().unwrap();
        assert_eq!(pkt.len(), 12 + 8 + 256);
        assert_eq!(pkt[0], 0x64);
        assert_eq!(Hello::decode(&pkt[20..]), Some(h));
        let mut cm = pkt.clone();
        cm[21] = 0x07; // the CM class
        assert_eq!(Hello::decode(&cm[20..]), None);
    }

    #[test]
    fn sack_and_probe_round_trip() {
        let s = Sack {
            msn: 7,
            ranges: vec![(Psn::new(5), Psn::new(9)), (Psn::new(12), Psn::new(12))],
        };
        let pkt = encode_sack(0x33, Psn::new(3), &s).unwrap();
        assert_eq!(pkt[0], OP_SACK);
        assert_eq!(decode_sack(&pkt[12..]), Some(s));
        let p = Probe { nonce: 99, path: 3 };
        let pkt = encode_probe(0x33, true, p).unwrap();
        assert_eq!(pkt[0], OP_PROBE_ACK);
        assert_eq!(decode_probe(&pkt[12..]), Some(p));
    }
}
