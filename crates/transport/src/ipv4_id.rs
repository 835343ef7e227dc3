//! Predicting the IPv4 Identification field of received packets, which their ICRC covers
//! (IBTA A17.4.1 masks only TOS, TTL and the checksum) and a UDP socket does not show.
//!
//! A softhca peer sends bulk from its device socket (unconnected, DF: ID 0, or 0, 1, 2..
//! per GSO segment, which arrive as separate datagrams where the path cuts GSO sends) and
//! small transmits from a socket connected to us, which counts per datagram from a random
//! start (a GSO datagram's segments carry its ID plus their position); Linux rxe numbers
//! packets per destination (`__ip_select_ident`) and sends from 0xC000 + a QPN hash. So
//! per flow (peer IP and UDP source port) the tracker remembers the last ID that matched
//! and tries the IDs around it, and solves for the ID (first contact, or after a jump)
//! when that fails. Per IP alone, every switch between a peer's two sockets would look
//! like a jump of thousands, and a restarted peer's new connected socket (a new port, a
//! new random start) like a corrupted packet until `ID_RESYNC_MISSES` of them had been
//! dropped.

use std::net::SocketAddr;

use rustc_hash::FxHashMap as HashMap;
use softhca_wire::{self as wire, UdpPseudo};

/// How far ahead of the predicted IPv4 ID a solved ID is believed without more evidence.
const ID_RESYNC_WINDOW: u16 = 4096;
/// IDs this far behind the last one are tried at full strength (reordered sends).
const ID_BEHIND: u16 = 8;
/// How far behind the last ID a solved ID is believed: a packet that a path held back
/// behind this many later ones from the same socket (a link with delay jitter reorders
/// milliseconds of traffic, hundreds of datagrams at gigabit rates) still checks. The
/// window ahead and behind together keep a corrupted packet's chance of a believed
/// solution near 2^-20 (see `resync`).
const ID_RESYNC_BEHIND: u16 = 1024;
/// After this many ICRC misses in a row from one peer, any solved ID is believed.
const ID_RESYNC_MISSES: u32 = 16;
/// Bound on remembered peers (memory under a flood of spoofed sources).
const MAX_ID_PEERS: usize = 4096;

/// What checking a packet's ICRC found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdCheck {
    /// The ICRC matched at full strength; `mispredicted` when with another ID than the
    /// one predicted first (IPv6: never).
    Matched {
        /// The predicted ID was not the one.
        mispredicted: bool,
    },
    /// No tried ID matched, but the solved one was believed: the flow's prediction now
    /// starts from it.
    Resynced,
    /// No ID makes the ICRC match (or none that is believed): a corrupted packet.
    Failed,
}

/// One flow's ID state.
#[derive(Debug, Clone, Copy, Default)]
struct PeerIpId {
    last: u16,
    misses: u32,
    /// The last ID that matched was its packet's GSO segment index: the peer numbers its
    /// packets per GSO send, as softhca's device socket does (0 for a plain datagram),
    /// not per packet (rxe) or per datagram (connected sockets).
    per_send: bool,
    /// The ID of segment 0 of the datagram being read: segment `k` has this plus `k`
    /// (GSO numbers segments on from the first one's ID, which is 0 for an unconnected
    /// socket and the counter for a connected one).
    base: u16,
}

impl PeerIpId {
    /// The state after `id` matched (or was solved) on GRO segment `seg`.
    fn matched(id: u16, seg: u16) -> PeerIpId {
        PeerIpId {
            last: id,
            misses: 0,
            per_send: id == seg,
            base: id.wrapping_sub(seg),
        }
    }

    /// The most likely ID, checked first in one pass (a miss costs a failed check and a
    /// CRC combine): within a GSO datagram, its first segment's ID plus the position;
    /// else the peer's next ID when it counts per packet (rxe, a connected socket, or a
    /// device socket's GSO send cut into datagrams on the way), and 0 when it numbers per
    /// send (after a batch that ended at ID 14 the next starts at 0). A counting peer's
    /// GSO datagram took one ID for all its segments (Linux numbers a connected socket's
    /// datagrams): the next datagram follows its first segment.
    fn predict(state: Option<PeerIpId>, seg: u16) -> u16 {
        match state {
            Some(s) if seg > 0 => s.base.wrapping_add(seg),
            _ if seg > 0 => seg,
            Some(s) if s.last != 0 && !s.per_send && s.last != s.base => s.base.wrapping_add(1),
            Some(s) if s.last != 0 && !s.per_send => s.last.wrapping_add(1),
            _ => 0,
        }
    }
}

/// The per-flow IPv4 ID predictions of one device.
#[derive(Debug, Default)]
pub(crate) struct Ipv4IdTracker {
    peers: HashMap<SocketAddr, PeerIpId>,
}

impl Ipv4IdTracker {
    /// Check the ICRC of `p`, a UDP payload from `src` (GRO segment `seg` of its
    /// datagram), whose pseudo-header is `pseudo` but for the IPv4 ID.
    pub fn verify(&mut self, pseudo: &UdpPseudo, src: SocketAddr, seg: u16, p: &[u8]) -> IdCheck {
        if !src.is_ipv4() {
            return match wire::verify_ipv4_any_id(pseudo, p, std::iter::empty()) {
                Some(_) => IdCheck::Matched {
                    mispredicted: false,
                },
                None => IdCheck::Failed,
            };
        }
        let slot = self.peers.get_mut(&src);
        let state = slot.as_deref().copied();
        let predicted = PeerIpId::predict(state, seg);
        let pseudo = pseudo.with_ipv4_id(predicted);
        // rxe takes an ID when it builds a packet, not when it sends it, so an ACK built
        // later can leave first: IDs arrive slightly out of order (seen against kernel
        // 6.1: ACK 0x7d23, then the next SEND First 0x7d22). Look a little behind too.
        let near = state.map(|s| s.last);
        let cands = std::iter::once(seg).chain(near.into_iter().flat_map(|l| {
            // From `l` itself: a counting peer's GSO datagram cut on the way gives the
            // next datagram the ID of its own second segment.
            (0..=32u16)
                .map(move |d| l.wrapping_add(d))
                .chain((1..=ID_BEHIND).map(move |d| l.wrapping_sub(d)))
        }));
        if let Some(id) = wire::verify_ipv4_any_id(&pseudo, p, cands) {
            let matched = PeerIpId::matched(id, seg);
            match slot {
                Some(s) => *s = matched,
                None => self.learn(src, matched),
            }
            return IdCheck::Matched {
                mispredicted: id != predicted,
            };
        }
        self.resync(&pseudo, src, seg, p, state)
    }

    /// [`Ipv4IdTracker::verify`] of a packet in pieces, with the predicted ID only (the
    /// common case, at full strength): `matches` computes the ICRC for a pseudo-header
    /// and compares it with the stored one. False when it does not match: check the
    /// packet joined with `verify`, which tries the other IDs.
    pub fn verify_predicted(
        &mut self,
        pseudo: &UdpPseudo,
        src: SocketAddr,
        seg: u16,
        matches: impl FnOnce(&UdpPseudo) -> bool,
    ) -> bool {
        if !src.is_ipv4() {
            return matches(pseudo);
        }
        let slot = self.peers.get_mut(&src);
        let predicted = PeerIpId::predict(slot.as_deref().copied(), seg);
        if !matches(&pseudo.with_ipv4_id(predicted)) {
            return false;
        }
        let matched = PeerIpId::matched(predicted, seg);
        match slot {
            Some(s) => *s = matched,
            None => self.learn(src, matched),
        }
        true
    }

    /// A peer seen for the first time, kept while there is room (one lookup per packet
    /// for a known peer: it is updated in place).
    fn learn(&mut self, src: SocketAddr, first: PeerIpId) {
        if self.peers.len() < MAX_ID_PEERS {
            self.peers.insert(src, first);
        }
    }

    /// No likely ID matched: solve for the one that does. Solving the affine CRC system
    /// finds the one ID that fits, at the strength of a 16-bit check (a full scan of all
    /// IDs would be no stronger and 4000x slower). So a solution is taken on first
    /// contact, when it lies a little ahead of the predicted ID (rxe's per-destination
    /// counter also counts the host's other traffic: a corrupted packet lands in that
    /// window with probability 2^-20), or to resync after a run of misses.
    fn resync(
        &mut self,
        pseudo: &UdpPseudo,
        src: SocketAddr,
        seg: u16,
        p: &[u8],
        state: Option<PeerIpId>,
    ) -> IdCheck {
        let mut st = state.unwrap_or_default();
        st.misses = st.misses.saturating_add(1);
        let found = wire::solve_ipv4_id(pseudo, p).filter(|&id| {
            state.is_none()
                || id.wrapping_sub(st.last) <= ID_RESYNC_WINDOW
                || st.last.wrapping_sub(id) <= ID_RESYNC_BEHIND
                || st.misses >= ID_RESYNC_MISSES
        });
        match found {
            // A late packet: the flow's later packets have been checked already, so the
            // prediction stays with them (moved back, it would miss on every one of them
            // until a solve moved it forward again).
            Some(id)
                if state.is_some()
                    && id != st.last
                    && st.last.wrapping_sub(id) <= ID_RESYNC_BEHIND =>
            {
                st.misses = 0;
            }
            Some(id) => st = PeerIpId::matched(id, seg),
            None => {}
        }
        if self.peers.len() < MAX_ID_PEERS || self.peers.contains_key(&src) {
            self.peers.insert(src, st);
        }
        match found {
            Some(_) => IdCheck::Resynced,
            None => IdCheck::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use softhca_wire::{Bth, Headers, Opcode, Psn, Qpn};

    use super::*;

    const PEER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 0xc011);
    const US: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

    fn flow(src: SocketAddr, dst: IpAddr, id: u16) -> UdpPseudo {
        UdpPseudo::from_addrs(src.ip(), dst, src.port(), 4791, id)
    }

    /// A sealed SEND Only from `src` to `dst` with IPv4 ID `id`.
    fn packet(src: SocketAddr, dst: IpAddr, id: u16, psn: u32) -> Vec<u8> {
        let h = Headers::new(Bth::new(
            Opcode::RC_SEND_ONLY,
            Qpn::new(0x11),
            Psn::new(psn),
        ));
        let mut buf = vec![0u8; 64];
        let n = wire::emit_packet(&h, b"payload!", &mut buf).unwrap();
        let n = wire::seal(&flow(src, dst, id), &mut buf, n).unwrap();
        buf.truncate(n);
        buf
    }

    fn check(t: &mut Ipv4IdTracker, id: u16, seg: u16, psn: u32) -> IdCheck {
        t.verify(&flow(PEER, US, 0), PEER, seg, &packet(PEER, US, id, psn))
    }

    const HIT: IdCheck = IdCheck::Matched {
        mispredicted: false,
    };
    const MISS: IdCheck = IdCheck::Matched { mispredicted: true };

    #[test]
    fn unconnected_socket_sends_id_zero() {
        let mut t = Ipv4IdTracker::default();
        for psn in 0..3 {
            assert_eq!(check(&mut t, 0, 0, psn), HIT);
        }
    }

    #[test]
    fn a_counting_peer_is_solved_once_then_predicted() {
        let mut t = Ipv4IdTracker::default();
        // First contact with rxe, whose counter stands anywhere: solved.
        assert_eq!(check(&mut t, 0x7d20, 0, 1), IdCheck::Resynced);
        assert_eq!(check(&mut t, 0x7d21, 0, 2), HIT);
        assert_eq!(check(&mut t, 0x7d22, 0, 3), HIT);
        // Another packet to the same host took an ID: found near the last one.
        assert_eq!(check(&mut t, 0x7d24, 0, 4), MISS);
        // An ACK built before the packet ahead of it (rxe): a little behind.
        assert_eq!(check(&mut t, 0x7d23, 0, 5), MISS);
        assert_eq!(check(&mut t, 0x7d24, 0, 6), HIT);
    }

    #[test]
    fn gso_segments_count_on_from_the_first() {
        let mut t = Ipv4IdTracker::default();
        assert_eq!(check(&mut t, 0x1000, 0, 1), IdCheck::Resynced);
        // A connected socket's GSO datagram: segment k carries its ID plus k.
        for k in 1..4 {
            assert_eq!(check(&mut t, 0x1000 + k, k, 1 + u32::from(k)), HIT);
        }
        // The next datagram follows its first segment's ID.
        assert_eq!(check(&mut t, 0x1001, 0, 9), HIT);
    }

    #[test]
    fn corruption_fails_and_a_far_jump_needs_a_run_of_misses() {
        let mut t = Ipv4IdTracker::default();
        assert_eq!(check(&mut t, 0x100, 0, 1), IdCheck::Resynced);
        let mut bad = packet(PEER, US, 0x101, 2);
        bad[14] ^= 0x40;
        assert_eq!(t.verify(&flow(PEER, US, 0), PEER, 0, &bad), IdCheck::Failed);
        // A peer whose IDs jumped far away (a restart) is believed only after
        // ID_RESYNC_MISSES misses in a row.
        let far = 0x100u16.wrapping_add(ID_RESYNC_WINDOW + 0x1000);
        let mut resynced_at = None;
        for i in 0..ID_RESYNC_MISSES {
            let r = check(&mut t, far.wrapping_add(i as u16), 0, 10 + i);
            if r == IdCheck::Resynced {
                resynced_at = Some(i);
                break;
            }
            assert_eq!(r, IdCheck::Failed);
        }
        assert_eq!(resynced_at, Some(ID_RESYNC_MISSES - 2));
        let next = far.wrapping_add(ID_RESYNC_MISSES as u16 - 1);
        assert_eq!(check(&mut t, next, 0, 99), HIT);
    }

    #[test]
    fn a_packet_held_back_behind_hundreds_checks_and_keeps_the_prediction() {
        let mut t = Ipv4IdTracker::default();
        assert_eq!(check(&mut t, 0x2000, 0, 1), IdCheck::Resynced);
        for i in 1..600u16 {
            assert_eq!(check(&mut t, 0x2000 + i, 0, u32::from(i) + 1), HIT);
        }
        // Held back by the path behind 500 later datagrams of its socket.
        assert_eq!(check(&mut t, 0x2000 + 99, 0, 100), IdCheck::Resynced);
        // The flow's next packet is still predicted.
        assert_eq!(check(&mut t, 0x2000 + 600, 0, 601), HIT);
    }

    #[test]
    fn ipv6_has_no_id() {
        let src = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0xc011);
        let dst = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let mut t = Ipv4IdTracker::default();
        let mut p = packet(src, dst, 0, 1);
        assert_eq!(t.verify(&flow(src, dst, 0), src, 0, &p), HIT);
        p[20] ^= 1;
        assert_eq!(t.verify(&flow(src, dst, 0), src, 0, &p), IdCheck::Failed);
    }
}
