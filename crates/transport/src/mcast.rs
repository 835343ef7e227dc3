//! Multicast groups: the UD QPs a packet sent to a multicast GID reaches.
//!
//! As rxe (`rxe_mcast.c`, `rxe_rcv_mcast_pkt`): a QP attaches to a group by its MGID; a
//! packet whose BTH names QP 0xFFFFFF is delivered to every UD QP attached to the group
//! of its destination address (each checked as a plain UD packet: state, Q_Key), the
//! sending QP included when it is attached (no loopback blocking: rxe offers none).

use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

use crate::error::TransportError;
use crate::verbs::Gid;

/// The destination QPN of a multicast packet (IBTA 10.5.2.4, rxe `IB_MULTICAST_QPN`).
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// Groups per device (rxe `RXE_MAX_MCAST_GRP`).
pub const MAX_GROUPS: usize = 8192;
/// QPs per group (rxe `RXE_MAX_MCAST_QP_ATTACH`).
pub const MAX_QP_ATTACH: usize = 56;
/// Attachments per device (rxe `RXE_MAX_TOT_MCAST_QP_ATTACH`).
pub const MAX_TOTAL_ATTACH: usize = 0x70000;

/// Whether `gid` is a multicast GID as the kernel's `rdma_is_multicast_addr` decides
/// (an IPv6 multicast address, or an IPv4-mapped IPv4 multicast address).
pub fn is_multicast(gid: &Gid) -> bool {
    if gid.0[0] == 0xff {
        return true;
    }
    match gid.to_ip() {
        std::net::IpAddr::V4(v4) => v4.is_multicast(),
        std::net::IpAddr::V6(_) => false,
    }
}

/// The QPs attached to a group.
pub(crate) type Members = SmallVec<[u32; 4]>;

/// The device's groups and their members.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    by_gid: HashMap<Gid, Members>,
    total: usize,
}

impl Groups {
    /// Attaches `qpn` to the group of `gid` (creating it). Attaching twice is no error
    /// (uverbs returns 0 for an attachment it already holds); beyond rxe's limits,
    /// ENOMEM as rxe returns.
    pub(crate) fn attach(&mut self, gid: Gid, qpn: u32) -> Result<(), TransportError> {
        if !is_multicast(&gid) {
            return Err(TransportError::InvalidArgument("not a multicast GID"));
        }
        if self.by_gid.get(&gid).is_some_and(|m| m.contains(&qpn)) {
            return Ok(());
        }
        if self.total >= MAX_TOTAL_ATTACH
            || (!self.by_gid.contains_key(&gid) && self.by_gid.len() >= MAX_GROUPS)
        {
            return Err(TransportError::NoMemory);
        }
        let members = self.by_gid.entry(gid).or_default();
        if members.len() >= MAX_QP_ATTACH {
            return Err(TransportError::NoMemory);
        }
        members.push(qpn);
        self.total += 1;
        Ok(())
    }

    /// Detaches `qpn` from the group of `gid`; EINVAL when it is not attached (uverbs).
    /// A group with no member left is gone.
    pub(crate) fn detach(&mut self, gid: Gid, qpn: u32) -> Result<(), TransportError> {
        let members = self
            .by_gid
            .get_mut(&gid)
            .ok_or(TransportError::InvalidArgument(
                "QP not attached to this group",
            ))?;
        let at = members
            .iter()
            .position(|&q| q == qpn)
            .ok_or(TransportError::InvalidArgument(
                "QP not attached to this group",
            ))?;
        members.swap_remove(at);
        self.total -= 1;
        if members.is_empty() {
            self.by_gid.remove(&gid);
        }
        Ok(())
    }

    /// Detaches `qpn` from every group (its QP is destroyed).
    pub(crate) fn forget(&mut self, qpn: u32) {
        let groups: Vec<Gid> = self
            .by_gid
            .iter()
            .filter(|(_, m)| m.contains(&qpn))
            .map(|(g, _)| *g)
            .collect();
        for gid in groups {
            let _ = self.detach(gid, qpn);
        }
    }

    /// Whether `qpn` is attached to any group.
    pub(crate) fn has_member(&self, qpn: u32) -> bool {
        self.by_gid.values().any(|m| m.contains(&qpn))
    }

    /// The members of the group of `gid`, if it has any.
    pub(crate) fn members(&self, gid: &Gid) -> Option<&Members> {
        self.by_gid.get(gid)
    }

    /// The groups with members.
    pub(crate) fn gids(&self) -> impl Iterator<Item = &Gid> {
        self.by_gid.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn group(a: u8) -> Gid {
        Gid::from(Ipv4Addr::new(239, 1, 1, a))
    }

    #[test]
    fn multicast_gids_are_ipv6_multicast_or_mapped_ipv4_multicast() {
        assert!(is_multicast(&group(1)));
        assert!(is_multicast(&Gid([
            0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 1, 1
        ])));
        assert!(!is_multicast(&Gid::from(Ipv4Addr::new(127, 0, 0, 1))));
        assert!(!is_multicast(&Gid::default()));
    }

    #[test]
    fn attach_detach_follow_uverbs_and_rxe() {
        let mut g = Groups::default();
        assert_eq!(
            g.attach(Gid::from(Ipv4Addr::new(10, 0, 0, 1)), 0x11),
            Err(TransportError::InvalidArgument("not a multicast GID"))
        );
        g.attach(group(1), 0x11).unwrap();
        g.attach(group(1), 0x11).unwrap();
        g.attach(group(1), 0x12).unwrap();
        assert_eq!(g.members(&group(1)).unwrap().as_slice(), &[0x11, 0x12]);
        assert!(g.detach(group(2), 0x11).is_err());
        g.detach(group(1), 0x11).unwrap();
        assert!(g.detach(group(1), 0x11).is_err());
        assert!(g.has_member(0x12));
        g.forget(0x12);
        assert!(!g.has_member(0x12));
        assert_eq!(g.gids().count(), 0);
        for q in 0..MAX_QP_ATTACH as u32 {
            g.attach(group(3), 0x100 + q).unwrap();
        }
        assert_eq!(g.attach(group(3), 0x999), Err(TransportError::NoMemory));
    }
}
