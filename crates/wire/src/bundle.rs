//! Bundles: several whole RoCEv2 packets in one UDP datagram, a softhca extension used
//! only with a peer that advertised it (never with rxe or any other RoCE peer).
//!
//! Why: on loopback (and any path with a large MTU) a datagram costs the kernel about as
//! much as its bytes: one skb through the IP stack and the loopback device per datagram.
//! Equal-sized packets already share one GSO datagram; packets of different sizes (a
//! 8256-byte SEND is 4096 + 4096 + 64 at MTU 4096, an ACK beside data) each took their
//! own. A bundle takes them all.
//!
//! Layout: a BTH with the manufacturer-specific opcode [`OP_BUNDLE`] (IBTA 9.2 leaves
//! 0xE0–0xFF to vendors), destination QP 0, PSN 0, so tshark shows a RoCE packet with an
//! unknown opcode; then for each packet its length (2 bytes, big-endian) and its bytes,
//! BTH to ICRC. Each packet's ICRC is sealed as if it were sent alone from the bundle's
//! source port with IPv4 ID 0, so the receiver checks it without predicting an ID; the
//! lengths and the bundle's own BTH are covered by the UDP checksum only (a corrupted
//! length misplaces the packets after it, whose ICRCs then fail).

use crate::bytes::array;
use crate::{Bth, Opcode, Psn, Qpn, BTH_LEN, ICRC_LEN};

/// The bundle's opcode, in the vendor range beside softhca's multipath opcodes.
pub const OP_BUNDLE: u8 = 0xe4;
/// Bytes before the first packet.
pub const BUNDLE_HEADER_LEN: usize = BTH_LEN;
/// Bytes before each packet (its length).
pub const BUNDLE_ENTRY_LEN: usize = 2;
/// The smallest packet a bundle carries: a BTH and an ICRC.
const MIN_PACKET: usize = BTH_LEN + ICRC_LEN;

/// The bundle's BTH.
pub fn bundle_header() -> [u8; BUNDLE_HEADER_LEN] {
    let mut h = [0u8; BUNDLE_HEADER_LEN];
    // A BTH always fits its own length.
    let _ = Bth::new(Opcode(OP_BUNDLE), Qpn::new(0), Psn::new(0)).emit(&mut h);
    h
}

/// Whether a UDP payload is a bundle.
pub fn is_bundle(udp_payload: &[u8]) -> bool {
    udp_payload.first() == Some(&OP_BUNDLE)
}

/// The packets of a bundle, in order. Stops at the first entry that does not fit (too
/// short for a packet, or running past the datagram): [`BundlePackets::malformed`] then
/// says so.
pub fn bundle_packets(udp_payload: &[u8]) -> BundlePackets<'_> {
    BundlePackets {
        rest: udp_payload.get(BUNDLE_HEADER_LEN..).unwrap_or(&[]),
        malformed: !is_bundle(udp_payload) || udp_payload.len() < BUNDLE_HEADER_LEN,
    }
}

/// Iterator over a bundle's packets (see [`bundle_packets`]).
#[derive(Debug, Clone)]
pub struct BundlePackets<'a> {
    rest: &'a [u8],
    malformed: bool,
}

impl BundlePackets<'_> {
    /// Whether the bundle had bytes that were not a whole packet.
    pub fn malformed(&self) -> bool {
        self.malformed
    }
}

impl<'a> Iterator for BundlePackets<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.malformed || self.rest.is_empty() {
            return None;
        }
        let Ok(&len) = array::<BUNDLE_ENTRY_LEN>(self.rest, 0, "bundle entry") else {
            self.malformed = true;
            return None;
        };
        let len = usize::from(u16::from_be_bytes(len));
        let end = BUNDLE_ENTRY_LEN + len;
        match self.rest.get(BUNDLE_ENTRY_LEN..end) {
            Some(p) if len >= MIN_PACKET => {
                self.rest = self.rest.get(end..).unwrap_or(&[]);
                Some(p)
            }
            _ => {
                self.malformed = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(packets: &[&[u8]]) -> Vec<u8> {
        let mut b = bundle_header().to_vec();
        for p in packets {
            b.extend_from_slice(&(p.len() as u16).to_be_bytes());
            b.extend_from_slice(p);
        }
        b
    }

    #[test]
    fn packets_come_out_as_they_went_in() {
        let a = [1u8; 16];
        let b = [2u8; 4200];
        let c = [3u8; 64];
        let d = bundle(&[&a, &b, &c]);
        assert!(is_bundle(&d));
        assert_eq!(Bth::parse(&d).unwrap().opcode, Opcode(OP_BUNDLE));
        let mut it = bundle_packets(&d);
        assert_eq!(it.next(), Some(&a[..]));
        assert_eq!(it.next(), Some(&b[..]));
        assert_eq!(it.next(), Some(&c[..]));
        assert_eq!(it.next(), None);
        assert!(!it.malformed());
    }

    #[test]
    fn a_length_past_the_end_or_below_a_packet_stops_it() {
        let a = [1u8; 16];
        let mut d = bundle(&[&a, &a]);
        d.truncate(d.len() - 1);
        let mut it = bundle_packets(&d);
        assert_eq!(it.next(), Some(&a[..]));
        assert_eq!(it.next(), None);
        assert!(it.malformed());
        let short = bundle(&[&[9u8; 8]]);
        let mut it = bundle_packets(&short);
        assert_eq!(it.next(), None);
        assert!(it.malformed());
        let mut odd = bundle(&[&a]);
        odd.push(0);
        let mut it = bundle_packets(&odd);
        assert_eq!(it.next(), Some(&a[..]));
        assert_eq!(it.next(), None);
        assert!(it.malformed());
    }

    #[test]
    fn a_plain_packet_is_not_a_bundle() {
        let mut h = [0u8; BTH_LEN];
        Bth::new(Opcode::RC_SEND_ONLY, Qpn::new(5), Psn::new(1))
            .emit(&mut h)
            .unwrap();
        assert!(!is_bundle(&h));
        assert!(bundle_packets(&h).next().is_none());
        assert!(bundle_packets(&h).malformed());
    }
}
