//! RoCEv2 on the wire (IBTA Annex A17), exactly as Linux Soft-RoCE (rxe) puts it there:
//! base and extension transport headers, the opcode table, parse and emit of a whole
//! RoCE UDP payload, the ICRC, the UDP source port choice, and the Ethernet/IP/UDP
//! headers needed to read captured frames.
//!
//! Guarantees: no input makes any function here panic (all byte access goes through
//! bounds-checked helpers; fuzzed by `fuzz/` target `parse_packet`), and nothing on the
//! parse/emit/ICRC path allocates.
//!
//! ```
//! use softhca_wire::*;
//! let mut h = Headers::new(Bth::new(Opcode::RC_SEND_ONLY, Qpn::new(0x123), Psn::new(7)));
//! h.bth.ack_req = true;
//! let flow = UdpPseudo {
//!     ip: IpPseudo::V4 { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(), id: 0, dont_fragment: true },
//!     sport: rxe_udp_sport(Qpn::new(0x11)),
//!     dport: ROCE_V2_UDP_PORT,
//! };
//! let mut buf = [0u8; 64];
//! let n = emit_packet(&h, b"hello", &mut buf).unwrap();
//! let n = seal(&flow, &mut buf, n).unwrap();
//! assert!(verify(&flow, &buf[..n]));
//! let (parsed, payload) = parse(&buf[..n]).unwrap();
//! assert_eq!(&buf[payload], b"hello");
//! assert_eq!(parsed.bth.psn, Psn::new(7));
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
#![cfg_attr(
    test,
    allow(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic
    )
)]

mod bth;
mod bundle;
mod bytes;
mod error;
mod ext;
mod headers;
mod icrc;
mod ip;
mod opcode;
mod psn;
mod qpn;
mod sport;

pub use bth::{pkey_ok, Bth, BTH_LEN, DEFAULT_PKEY};
pub use bundle::{
    bundle_header, bundle_packets, is_bundle, BundlePackets, BUNDLE_ENTRY_LEN, BUNDLE_HEADER_LEN,
    OP_BUNDLE,
};
pub use error::Error;
pub use ext::{
    Aeth, AethKind, AtomicAckEth, AtomicEth, Deth, NakCode, Reth, AETH_LEN, ATOMIC_ACK_ETH_LEN,
    ATOMIC_ETH_LEN, DETH_LEN, IETH_LEN, IMM_DT_LEN, RETH_LEN,
};
pub use headers::{emit_packet, pad_count, parse, Headers, Packet};
pub use icrc::{
    crc32_combine, crc32_extend, icrc, icrc_pieces, icrc_with_tail, seal, seal_pieces, seal_tail,
    solve_ipv4_id, verify, verify_ipv4_any_id, IpPseudo, UdpPseudo, ICRC_LEN,
};
pub use ip::{
    ib_mtu_code_for_netdev, icrc_ip_packet, internet_checksum, parse_ip_udp, stored_icrc_ip_packet,
    EthernetHeader, Ipv4Header, Ipv6Header, UdpHeader, ETHERNET_LEN, ETHERTYPE_IPV4,
    ETHERTYPE_IPV6, ETHERTYPE_VLAN, IPV4_LEN, IPV6_LEN, IP_PROTOCOL_UDP, UDP_LEN,
};
pub use opcode::{ExtHeaders, Opcode, Position, Transport};
pub use psn::Psn;
pub use qpn::Qpn;
pub use sport::{
    hash_32, rdma_calc_flow_label, rdma_flow_label_to_udp_sport, rdma_udp_sport, rxe_udp_sport,
    ROCE_V2_SPORT_BASE, ROCE_V2_UDP_PORT,
};
