//! Ethernet, IPv4, IPv6 and UDP headers: enough to read captured RoCEv2 frames, to build
//! them for raw sockets or tests, and to compute the ICRC over a whole IP packet.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::bytes::{array, array_mut};
use crate::icrc::{IpPseudo, UdpPseudo, ICRC_LEN};
use crate::Error;

/// Ethernet II header length (no VLAN tag).
pub const ETHERNET_LEN: usize = 14;
/// IPv4 header length without options.
pub const IPV4_LEN: usize = 20;
/// IPv6 fixed header length.
pub const IPV6_LEN: usize = 40;
/// UDP header length.
pub const UDP_LEN: usize = 8;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType of an IEEE 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// IP protocol number of UDP.
pub const IP_PROTOCOL_UDP: u8 = 17;

/// rxe's `RXE_MAX_HDR_LENGTH`-style overhead: IP + UDP + BTH + the largest extension
/// headers + ICRC must fit around the payload in one netdev MTU (`eth_mtu_int_to_enum`).
const ROCE_OVERHEAD: usize = 80;

/// The largest IBTA path MTU whose packets fit a netdev MTU, as its `IBV_MTU_*` code
/// (1 = 256 … 5 = 4096; 1 when even 256 does not fit), as rxe derives its port MTU
/// and the kernel's rdma_cm a RoCE route's (`iboe_get_mtu`).
pub fn ib_mtu_code_for_netdev(netdev_mtu: usize) -> u8 {
    let payload = netdev_mtu.saturating_sub(ROCE_OVERHEAD).clamp(256, 4096);
    // log2 of a power of two from 256 (code 1) to 4096 (code 5).
    (usize::BITS - 1 - payload.leading_zeros() - 7) as u8
}

/// Ethernet II header (an 802.1Q tag, if any, is skipped on parse and reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetHeader {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// VLAN tag control information, if the frame carried one 802.1Q tag.
    pub vlan_tci: Option<u16>,
    /// EtherType of the payload.
    pub ethertype: u16,
}

impl EthernetHeader {
    /// Parse an Ethernet frame (without FCS): the header and its payload.
    pub fn parse(frame: &[u8]) -> Result<(EthernetHeader, &[u8]), Error> {
        let b: &[u8; ETHERNET_LEN] = array(frame, 0, "Ethernet header")?;
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        let (d, rest) = b.split_at(6);
        let (s, _) = rest.split_at(6);
        dst.copy_from_slice(d);
        src.copy_from_slice(s);
        let mut ethertype = u16::from_be_bytes([b[12], b[13]]);
        let mut at = ETHERNET_LEN;
        let mut vlan_tci = None;
        if ethertype == ETHERTYPE_VLAN {
            let t: &[u8; 4] = array(frame, at, "802.1Q tag")?;
            vlan_tci = Some(u16::from_be_bytes([t[0], t[1]]));
            ethertype = u16::from_be_bytes([t[2], t[3]]);
            at += 4;
        }
        let payload = frame.get(at..).unwrap_or(&[]);
        Ok((
            EthernetHeader {
                dst,
                src,
                vlan_tci,
                ethertype,
            },
            payload,
        ))
    }

    /// Write the header (with its VLAN tag if any); returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let b: &mut [u8; 12] = array_mut(buf, 0, "Ethernet header")?;
        let (d, s) = b.split_at_mut(6);
        d.copy_from_slice(&self.dst);
        s.copy_from_slice(&self.src);
        let mut at = 12;
        if let Some(tci) = self.vlan_tci {
            let [t0, t1] = ETHERTYPE_VLAN.to_be_bytes();
            let [c0, c1] = tci.to_be_bytes();
            *array_mut::<4>(buf, at, "802.1Q tag")? = [t0, t1, c0, c1];
            at += 4;
        }
        *array_mut::<2>(buf, at, "EtherType")? = self.ethertype.to_be_bytes();
        Ok(at + 2)
    }
}

/// RFC 1071 Internet checksum of `data`.
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        if let [a, b] = c {
            sum = sum.wrapping_add(u32::from(u16::from_be_bytes([*a, *b])));
        }
    }
    if let [last] = chunks.remainder() {
        sum = sum.wrapping_add(u32::from(*last) << 8);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// IPv4 header without options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Header {
    /// DSCP and ECN (the former TOS byte).
    pub tos: u8,
    /// Total length (header + payload).
    pub total_len: u16,
    /// Identification.
    pub id: u16,
    /// Flags (3 bits) and fragment offset (13 bits), as on the wire.
    pub flags_frag: u16,
    /// Time to live.
    pub ttl: u8,
    /// Payload protocol.
    pub protocol: u8,
    /// Header checksum as read (recomputed by `emit`).
    pub checksum: u16,
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
}

impl Ipv4Header {
    /// Don't-fragment bit of `flags_frag`.
    pub const DF: u16 = 0x4000;

    /// Parse the header at the start of `packet`; returns it and the payload (bounded by
    /// the total length, so Ethernet padding is dropped). Options and fragments are errors.
    pub fn parse(packet: &[u8]) -> Result<(Ipv4Header, &[u8]), Error> {
        let b: &[u8; IPV4_LEN] = array(packet, 0, "IPv4 header")?;
        if b[0] >> 4 != 4 {
            return Err(Error::UnsupportedIpVersion(b[0] >> 4));
        }
        let ihl = usize::from(b[0] & 0x0f) * 4;
        if ihl != IPV4_LEN {
            return Err(Error::Ipv4Options(ihl));
        }
        let h = Ipv4Header {
            tos: b[1],
            total_len: u16::from_be_bytes([b[2], b[3]]),
            id: u16::from_be_bytes([b[4], b[5]]),
            flags_frag: u16::from_be_bytes([b[6], b[7]]),
            ttl: b[8],
            protocol: b[9],
            checksum: u16::from_be_bytes([b[10], b[11]]),
            src: Ipv4Addr::new(b[12], b[13], b[14], b[15]),
            dst: Ipv4Addr::new(b[16], b[17], b[18], b[19]),
        };
        let total = usize::from(h.total_len);
        if total < IPV4_LEN || total > packet.len() {
            return Err(Error::BadLength {
                field: "IPv4 total",
                value: total,
                expected: packet.len(),
            });
        }
        if h.flags_frag & 0x3fff != 0 {
            return Err(Error::Fragmented(h.flags_frag));
        }
        Ok((h, packet.get(IPV4_LEN..total).unwrap_or(&[])))
    }

    /// Write the header with a freshly computed checksum; returns [`IPV4_LEN`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let b: &mut [u8; IPV4_LEN] = array_mut(buf, 0, "IPv4 header")?;
        let [t0, t1] = self.total_len.to_be_bytes();
        let [i0, i1] = self.id.to_be_bytes();
        let [f0, f1] = self.flags_frag.to_be_bytes();
        let [s0, s1, s2, s3] = self.src.octets();
        let [d0, d1, d2, d3] = self.dst.octets();
        *b = [
            0x45,
            self.tos,
            t0,
            t1,
            i0,
            i1,
            f0,
            f1,
            self.ttl,
            self.protocol,
            0,
            0,
            s0,
            s1,
            s2,
            s3,
            d0,
            d1,
            d2,
            d3,
        ];
        [b[10], b[11]] = internet_checksum(b).to_be_bytes();
        Ok(IPV4_LEN)
    }
}

/// IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Header {
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Payload length.
    pub payload_len: u16,
    /// Next header (17 for RoCEv2; extension headers are not supported).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
}

impl Ipv6Header {
    /// Parse the header at the start of `packet`; returns it and the payload (bounded by
    /// the payload length).
    pub fn parse(packet: &[u8]) -> Result<(Ipv6Header, &[u8]), Error> {
        let b: &[u8; IPV6_LEN] = array(packet, 0, "IPv6 header")?;
        if b[0] >> 4 != 6 {
            return Err(Error::UnsupportedIpVersion(b[0] >> 4));
        }
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        let (_, addrs) = b.split_at(8);
        let (s, d) = addrs.split_at(16);
        src.copy_from_slice(s);
        dst.copy_from_slice(d);
        let h = Ipv6Header {
            traffic_class: (b[0] << 4) | (b[1] >> 4),
            flow_label: (u32::from(b[1] & 0x0f) << 16) | (u32::from(b[2]) << 8) | u32::from(b[3]),
            payload_len: u16::from_be_bytes([b[4], b[5]]),
            next_header: b[6],
            hop_limit: b[7],
            src: Ipv6Addr::from(src),
            dst: Ipv6Addr::from(dst),
        };
        let end = IPV6_LEN + usize::from(h.payload_len);
        let payload = packet.get(IPV6_LEN..end).ok_or(Error::BadLength {
            field: "IPv6 payload",
            value: usize::from(h.payload_len),
            expected: packet.len().saturating_sub(IPV6_LEN),
        })?;
        Ok((h, payload))
    }

    /// Write the header; returns [`IPV6_LEN`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let b: &mut [u8; IPV6_LEN] = array_mut(buf, 0, "IPv6 header")?;
        let fl = self.flow_label & 0xf_ffff;
        let [p0, p1] = self.payload_len.to_be_bytes();
        let first = [
            0x60 | (self.traffic_class >> 4),
            (self.traffic_class << 4) | (fl >> 16) as u8,
            (fl >> 8) as u8,
            fl as u8,
            p0,
            p1,
            self.next_header,
            self.hop_limit,
        ];
        let (f, addrs) = b.split_at_mut(8);
        f.copy_from_slice(&first);
        let (s, d) = addrs.split_at_mut(16);
        s.copy_from_slice(&self.src.octets());
        d.copy_from_slice(&self.dst.octets());
        Ok(IPV6_LEN)
    }
}

/// UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpHeader {
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Length (header + payload).
    pub len: u16,
    /// Checksum (rxe sends 0 over IPv4).
    pub checksum: u16,
}

impl UdpHeader {
    /// Parse the header at the start of `datagram`; returns it and the payload (bounded by
    /// the length field).
    pub fn parse(datagram: &[u8]) -> Result<(UdpHeader, &[u8]), Error> {
        let b: &[u8; UDP_LEN] = array(datagram, 0, "UDP header")?;
        let h = UdpHeader {
            sport: u16::from_be_bytes([b[0], b[1]]),
            dport: u16::from_be_bytes([b[2], b[3]]),
            len: u16::from_be_bytes([b[4], b[5]]),
            checksum: u16::from_be_bytes([b[6], b[7]]),
        };
        let len = usize::from(h.len);
        let payload = datagram
            .get(UDP_LEN..len)
            .filter(|_| len >= UDP_LEN)
            .ok_or(Error::BadLength {
                field: "UDP",
                value: len,
                expected: datagram.len(),
            })?;
        Ok((h, payload))
    }

    /// Write the header as given; returns [`UDP_LEN`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let b: &mut [u8; UDP_LEN] = array_mut(buf, 0, "UDP header")?;
        let [s0, s1] = self.sport.to_be_bytes();
        let [d0, d1] = self.dport.to_be_bytes();
        let [l0, l1] = self.len.to_be_bytes();
        let [c0, c1] = self.checksum.to_be_bytes();
        *b = [s0, s1, d0, d1, l0, l1, c0, c1];
        Ok(UDP_LEN)
    }
}

/// Parse an IPv4 or IPv6 packet carrying UDP: the ICRC pseudo-header fields and the UDP
/// payload. Rejects non-UDP, options, fragments and inconsistent lengths.
pub fn parse_ip_udp(ip_packet: &[u8]) -> Result<(UdpPseudo, &[u8]), Error> {
    let version = ip_packet.first().map(|b| b >> 4).ok_or(Error::Truncated {
        what: "IP header",
        need: 1,
        have: 0,
    })?;
    let (ip, datagram, ip_payload_len) = match version {
        4 => {
            let (h, payload) = Ipv4Header::parse(ip_packet)?;
            if h.protocol != IP_PROTOCOL_UDP {
                return Err(Error::NotUdp(h.protocol));
            }
            let ip = IpPseudo::V4 {
                src: h.src,
                dst: h.dst,
                id: h.id,
                dont_fragment: h.flags_frag & Ipv4Header::DF != 0,
            };
            (ip, payload, payload.len())
        }
        6 => {
            let (h, payload) = Ipv6Header::parse(ip_packet)?;
            if h.next_header != IP_PROTOCOL_UDP {
                return Err(Error::NotUdp(h.next_header));
            }
            (
                IpPseudo::V6 {
                    src: h.src,
                    dst: h.dst,
                },
                payload,
                payload.len(),
            )
        }
        v => return Err(Error::UnsupportedIpVersion(v)),
    };
    let (udp, payload) = UdpHeader::parse(datagram)?;
    // The ICRC rebuilds the IP length from the UDP length: they must agree.
    if usize::from(udp.len) != ip_payload_len {
        return Err(Error::BadLength {
            field: "UDP",
            value: udp.len.into(),
            expected: ip_payload_len,
        });
    }
    Ok((
        UdpPseudo {
            ip,
            sport: udp.sport,
            dport: udp.dport,
        },
        payload,
    ))
}

/// The ICRC of a whole IP packet (IP header, UDP header, BTH … pad, ICRC), computed over
/// the packet's own header bytes with the variant fields masked (independent of the
/// pseudo-header rebuild in [`crate::icrc()`]). Compare with the stored trailer.
pub fn icrc_ip_packet(ip_packet: &[u8]) -> Result<u32, Error> {
    // Validate the structure first (UDP, lengths, no options).
    let (pseudo, udp_payload) = parse_ip_udp(ip_packet)?;
    let ip_len = match pseudo.ip {
        IpPseudo::V4 { .. } => IPV4_LEN,
        IpPseudo::V6 { .. } => IPV6_LEN,
    };
    let body_len = udp_payload
        .len()
        .checked_sub(ICRC_LEN)
        .ok_or(Error::Truncated {
            what: "ICRC",
            need: ICRC_LEN,
            have: udp_payload.len(),
        })?;
    let covered = ip_len + UDP_LEN + body_len;
    let mut head = [0u8; IPV6_LEN + UDP_LEN + 12];
    let hl = ip_len + UDP_LEN + body_len.min(12);
    let (h, _) = head.split_at_mut(hl);
    h.copy_from_slice(ip_packet.get(..hl).ok_or(Error::Truncated {
        what: "IP packet",
        need: hl,
        have: ip_packet.len(),
    })?);
    let mask = |b: &mut [u8], i: usize, v: u8| {
        if let Some(x) = b.get_mut(i) {
            *x = v;
        }
    };
    if ip_len == IPV4_LEN {
        for i in [1, 8, 10, 11] {
            mask(h, i, 0xff); // TOS, TTL, header checksum
        }
    } else {
        mask(h, 0, 0x6f); // traffic class high nibble
        for i in [1, 2, 3, 7] {
            mask(h, i, 0xff); // traffic class low nibble + flow label, hop limit
        }
    }
    mask(h, ip_len + 6, 0xff); // UDP checksum
    mask(h, ip_len + 7, 0xff);
    mask(h, ip_len + UDP_LEN + 4, 0xff); // BTH reserved byte
    let mut c = crc32fast::Hasher::new();
    c.update(&[0xff; 8]);
    c.update(h);
    c.update(ip_packet.get(hl..covered).unwrap_or(&[]));
    Ok(c.finalize())
}

/// The ICRC stored in the last 4 bytes of an IP packet's UDP payload.
pub fn stored_icrc_ip_packet(ip_packet: &[u8]) -> Result<u32, Error> {
    let (_, udp_payload) = parse_ip_udp(ip_packet)?;
    let at = udp_payload.len().saturating_sub(ICRC_LEN);
    let t: &[u8; ICRC_LEN] = array(udp_payload, at, "ICRC")?;
    Ok(u32::from_le_bytes(*t))
}
