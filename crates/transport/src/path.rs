//! Path choice: which source address, destination and UDP source port a packet uses.
//!
//! Today a QP has one path, taken from its address vector, with the fixed UDP source
//! port rxe uses (0xC000 + hash of the QPN) so flows hash consistently in ECMP networks.
//! Multipath (several paths per QP, chosen per packet) plugs in here: the requester asks
//! [`Path::for_psn`] for every packet, so a spraying policy only changes this module.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::config::EngineConfig;
use crate::verbs::{AddressVector, Gid, Psn, Qpn};

/// One network path of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Path {
    pub src: IpAddr,
    pub dst: SocketAddr,
    pub sport: u16,
    /// The IPv4 TOS / IPv6 traffic class of its packets: the address vector's GRH
    /// traffic class, as rxe writes it into the IP header (`prepare_ipv4_hdr`).
    pub tos: u8,
}

impl Default for Path {
    fn default() -> Self {
        Path {
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 4791),
            sport: 0xc000,
            tos: 0,
        }
    }
}

impl Path {
    /// Resolve an address vector; None if the source GID index names no GID or the
    /// families differ (IPv4 GID talking to an IPv6 peer).
    pub fn resolve(cfg: &EngineConfig, av: &AddressVector, qpn: u32) -> Option<Path> {
        let sgid: Gid = *cfg.gids.get(usize::from(av.sgid_index))?;
        let (src, dst) = (sgid.to_ip(), av.dgid.to_ip());
        if src.is_ipv4() != dst.is_ipv4() {
            return None;
        }
        Some(Path {
            src,
            dst: SocketAddr::new(dst, av.dest_udp_port.unwrap_or(cfg.udp_port)),
            sport: softhca_wire::rxe_udp_sport(Qpn::new(qpn)),
            tos: av.traffic_class,
        })
    }

    /// The path the packet with this PSN takes (single path: always this one).
    pub fn for_psn(&self, _psn: Psn) -> &Path {
        self
    }
}
