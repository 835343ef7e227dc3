//! Codec adapter over `softhca-wire`: [`PktHdr`] to bytes and back, and the ICRC.

use std::net::IpAddr;
use std::ops::Range;

use softhca_wire as wire;

use crate::packet::{pad_count, PktHdr};

/// What the ICRC covers besides the UDP payload (the IP/UDP pseudo-header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcrcInfo {
    /// Source IP.
    pub src: IpAddr,
    /// Destination IP.
    pub dst: IpAddr,
    /// UDP source port.
    pub sport: u16,
    /// UDP destination port.
    pub dport: u16,
    /// IPv4 identification field.
    pub ipv4_id: u16,
}

impl IcrcInfo {
    fn pseudo(&self) -> wire::UdpPseudo {
        let ip = match (self.src, self.dst) {
            // Unconnected UDP sockets with DF: the IPv4 header has DF set.
            (IpAddr::V4(src), IpAddr::V4(dst)) => wire::IpPseudo::V4 {
                src,
                dst,
                id: self.ipv4_id,
                dont_fragment: true,
            },
            (s, d) => wire::IpPseudo::V6 {
                src: v6(s),
                dst: v6(d),
            },
        };
        wire::UdpPseudo {
            ip,
            sport: self.sport,
            dport: self.dport,
        }
    }
}

fn v6(a: IpAddr) -> std::net::Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// Write the headers of `h` for a payload of `payload_len` bytes into `buf`; returns the
/// header length, or None when `buf` is too small or the headers do not fit the opcode.
pub fn emit(buf: &mut [u8], h: &PktHdr, payload_len: usize) -> Option<usize> {
    let mut bth = wire::Bth::new(
        wire::Opcode(h.opcode),
        wire::Qpn::new(h.dqpn),
        wire::Psn::new(h.psn),
    );
    bth.solicited = h.se;
    bth.pad_count = pad_count(payload_len) as u8;
    bth.pkey = h.pkey;
    bth.ack_req = h.ack_req;
    let hdrs = wire::Headers {
        bth,
        reth: h
            .reth
            .map(|(va, rkey, dma_len)| wire::Reth { va, rkey, dma_len }),
        aeth: h.aeth.map(|(syndrome, msn)| wire::Aeth { syndrome, msn }),
        atomic_eth: h
            .atomic
            .map(|(va, rkey, swap_add, compare)| wire::AtomicEth {
                va,
                rkey,
                swap_add,
                compare,
            }),
        atomic_ack_eth: h.atomic_ack.map(|orig| wire::AtomicAckEth { orig }),
        imm_dt: h.imm,
        ieth: h.ieth,
        deth: h.deth.map(|(qkey, src)| wire::Deth {
            qkey,
            src_qp: wire::Qpn::new(src),
        }),
    };
    hdrs.emit(buf).ok()
}

/// Parse a UDP payload: the headers and the payload range (pad and ICRC excluded).
pub fn parse(p: &[u8]) -> Option<(PktHdr, Range<usize>)> {
    let (h, range) = wire::parse(p).ok()?;
    let b = h.bth;
    Some((
        PktHdr {
            opcode: b.opcode.0,
            se: b.solicited,
            pad: b.pad_count,
            pkey: b.pkey,
            dqpn: b.dest_qp.value(),
            ack_req: b.ack_req,
            psn: b.psn.value(),
            reth: h.reth.map(|r| (r.va, r.rkey, r.dma_len)),
            aeth: h.aeth.map(|a| (a.syndrome, a.msn)),
            atomic: h.atomic_eth.map(|a| (a.va, a.rkey, a.swap_add, a.compare)),
            atomic_ack: h.atomic_ack_eth.map(|a| a.orig),
            imm: h.imm_dt,
            ieth: h.ieth,
            deth: h.deth.map(|d| (d.qkey, d.src_qp.value())),
        },
        range,
    ))
}

/// Append the ICRC to `buf[..len]`; returns the new length.
pub fn seal(info: &IcrcInfo, buf: &mut [u8], len: usize) -> Option<usize> {
    wire::seal(&info.pseudo(), buf, len).ok()
}

/// The CRC `crc` extended over `n` (at most 3) zero bytes: a packet's pad after its
/// payload.
pub fn extend_crc_zeros(crc: u32, n: usize) -> u32 {
    wire::crc32_extend(crc, [0u8; 3].get(..n).unwrap_or_default())
}

/// [`seal`], for a packet whose bytes from `tail.at` on (payload, pad) may have been
/// CRC'd as they were copied in (`TailCrc`): then only the headers are hashed. Without
/// `tail`, the whole packet is.
pub fn seal_with_tail(
    info: &IcrcInfo,
    buf: &mut [u8],
    len: usize,
    tail: Option<crate::engine::TailCrc>,
) -> Option<usize> {
    let Some(tail) = tail else {
        return seal(info, buf, len);
    };
    let end = len
        .checked_add(wire::ICRC_LEN)
        .filter(|&e| e <= buf.len())?;
    let head = buf.get(..tail.at.min(len))?;
    let c = wire::icrc_with_tail(&info.pseudo(), head, len - head.len(), tail.crc);
    buf.get_mut(len..end)?.copy_from_slice(&c.to_le_bytes());
    Some(end)
}

/// Seal a packet whose payload is elsewhere: `buf[..head]` holds its headers and
/// `buf[head..len]` its pad; the ICRC over headers, `payload` and pad goes to
/// `buf[len..len + 4]`. Returns `len + 4`.
pub fn seal_pieces(
    info: &IcrcInfo,
    buf: &mut [u8],
    head: usize,
    payload: &[u8],
    len: usize,
) -> Option<usize> {
    let end = len
        .checked_add(wire::ICRC_LEN)
        .filter(|&e| e <= buf.len())?;
    let (hdr, pad) = buf.get(..len)?.split_at(head.min(len));
    let c = wire::icrc_pieces(&info.pseudo(), hdr, &[payload, pad]);
    buf.get_mut(len..end)?.copy_from_slice(&c.to_le_bytes());
    Some(end)
}

/// The IPv4 ID that makes the ICRC of a received UDP payload match, found by solving
/// (see `softhca_wire::solve_ipv4_id`); None for IPv6 or when no ID fits.
pub fn solve_ipv4_id(info: &IcrcInfo, p: &[u8]) -> Option<u16> {
    wire::solve_ipv4_id(&info.pseudo(), p)
}

/// Verify the ICRC of a received UDP payload, trying IPv4 ID 0 and each candidate;
/// returns the ID that matched (0 for IPv6).
pub fn verify(info: &IcrcInfo, p: &[u8], ipv4_ids: impl Iterator<Item = u16>) -> Option<u16> {
    wire::verify_ipv4_any_id(&info.pseudo(), p, ipv4_ids)
}
