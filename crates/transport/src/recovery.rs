//! Loss recovery: deciding what to retransmit when a loss is detected.
//!
//! RoCEv2 RC uses go-back-N (IBTA 9.7.5.2.x): on a PSN-sequence NAK, a retransmit
//! timeout or a gap in READ responses, the requester resends everything from the first
//! missing PSN. The policy sits behind [`LossRecovery`] so selective acknowledgement can
//! replace it without touching the requester or completer.

/// Why the completer thinks packets were lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LossCause {
    /// PSN sequence error NAK from the responder.
    NakSeq,
    /// Retransmit timer expired.
    Timeout,
    /// A response skipped PSNs (READ response gap, or an ACK beyond a pending READ).
    Gap,
    /// READ responses still missing in front of placed ones when the reorder timer
    /// fired: the READ with the hole is re-requested alone (the ones behind it are
    /// arriving or placed already).
    ReadHole,
    /// The responder fell silent while a retransmission was under way (see
    /// `completer::MAX_QUIET_RESENDS`): resend from the oldest unacknowledged PSN, a READ there
    /// alone.
    Quiet,
}

use softhca_wire::Psn;

use crate::verbs::Nanos;

/// A loss recovery policy.
pub(crate) trait LossRecovery {
    /// Packets from `psn` on are missing: the PSN to resend from, or None to ignore this
    /// signal (e.g. a repeated gap report for a retransmission already under way).
    fn on_loss(&mut self, psn: Psn, cause: LossCause) -> Option<Psn>;
    /// The oldest unacknowledged PSN advanced to `una`.
    fn on_progress(&mut self, una: Psn);
    /// The retransmission under way was lost too: the next signal for its PSN counts.
    fn on_retransmission_lost(&mut self);
    /// A retransmission is under way (until the oldest unacknowledged PSN passes it).
    fn in_progress(&self) -> bool;
}

/// Go-back-N as rxe and IBTA do it.
#[derive(Debug, Default, Clone)]
pub(crate) struct GoBackN {
    /// PSN a retransmission was last started from; repeated gap signals for the same
    /// PSN (the tail of the old flight still arriving) do not restart it.
    pending: Option<Psn>,
}

impl LossRecovery for GoBackN {
    fn on_loss(&mut self, psn: Psn, cause: LossCause) -> Option<Psn> {
        if matches!(cause, LossCause::Gap | LossCause::ReadHole) && self.pending == Some(psn) {
            return None;
        }
        self.pending = Some(psn);
        Some(psn)
    }

    fn on_retransmission_lost(&mut self) {
        self.pending = None;
    }

    fn in_progress(&self) -> bool {
        self.pending.is_some()
    }

    fn on_progress(&mut self, una: Psn) {
        if let Some(p) = self.pending {
            if una.is_after(p) {
                self.pending = None;
            }
        }
    }
}

/// Least time a gap stays open before it is a loss (a veth or a loopback reorders
/// nothing; the wait only has to outlast one scheduling of the peer).
pub(crate) const MIN_REORDER_NS: Nanos = 1_000_000;
/// Most time a gap may stay open when no round trip bounds it (a responder that sends
/// no requests of its own).
const MAX_REORDER_NS: Nanos = 25_000_000;

/// How long a gap in the PSN sequence may stay open before it is a loss: the requester's
/// wait before it asks again for missing READ responses, the responder's before its
/// sequence NAK. RACK's reordering window (RFC 8985 6.2): a quarter of the least round
/// trip (at least [`MIN_REORDER_NS`]), grown when asking again proves needless, at most
/// one round trip. Needless shows as in RFC 8985 with DSACK: the PSN asked for arrives
/// twice, the late first copy and then the resent one; the window then becomes 5/4 of
/// how long that gap stayed open. Why: a path that delays packets by a varying amount (a
/// VM's virtual NIC, a Wi-Fi hop, the testbed's jitter) reorders by up to that
/// variation; a fixed 1 ms took most reorderings of a 10 ms path with 2 ms of jitter for
/// losses, and each needless resend cut the congestion window and the responder's READ
/// rate and spent a transport retry, until the connection failed with RETRY_EXC_ERR.
#[derive(Debug, Default, Clone)]
pub(crate) struct ReorderWindow {
    /// Least round trip seen, ns (0: none yet).
    min_rtt: Nanos,
    /// The longest a gap stayed open before its late packet came, ns.
    extent: Nanos,
    /// The PSN last asked again for, when its gap opened, and when its first copy
    /// arrived after that.
    asked: Option<(Psn, Nanos, Option<Nanos>)>,
    /// Resends found needless.
    pub spurious: u64,
}

impl ReorderWindow {
    /// A round-trip sample.
    pub fn on_rtt(&mut self, rtt: Nanos) {
        if rtt > 0 && (self.min_rtt == 0 || rtt < self.min_rtt) {
            self.min_rtt = rtt;
        }
    }

    /// How long a gap may stay open.
    pub fn wait(&self) -> Nanos {
        let max = if self.min_rtt > 0 {
            self.min_rtt
        } else {
            MAX_REORDER_NS
        };
        (self.min_rtt / 4)
            .max(self.extent + self.extent / 4)
            .clamp(MIN_REORDER_NS, max.max(MIN_REORDER_NS))
    }

    /// The gap at `psn`, open since `opened_at`, was taken for a loss: `psn` is asked
    /// for again.
    pub fn on_asked(&mut self, psn: Psn, opened_at: Nanos) {
        self.asked = Some((psn, opened_at, None));
    }

    /// A packet with `psn` arrived at `now` (in order, early or a duplicate). Returns
    /// whether it showed the last resend needless.
    pub fn on_packet(&mut self, psn: Psn, now: Nanos) -> bool {
        let Some((p, opened_at, first)) = self.asked.as_mut() else {
            return false;
        };
        if *p != psn {
            return false;
        }
        let Some(first) = *first else {
            *first = Some(now);
            return false;
        };
        self.extent = self.extent.max(first.saturating_sub(*opened_at));
        self.asked = None;
        self.spurious += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reorder_window_is_a_quarter_round_trip_and_grows_on_needless_resends() {
        let mut w = ReorderWindow::default();
        assert_eq!(w.wait(), MIN_REORDER_NS, "no round trip yet");
        w.on_rtt(20_000_000);
        w.on_rtt(30_000_000);
        assert_eq!(w.wait(), 5_000_000);
        // A real loss: PSN 9 comes once, the resent copy.
        w.on_asked(Psn::new(9), 100_000_000);
        assert!(!w.on_packet(Psn::new(9), 126_000_000));
        assert_eq!(w.wait(), 5_000_000);
        // Reordering: the gap at 7 opened at 200 ms, its first copy came 8 ms later,
        // then the resent one.
        w.on_asked(Psn::new(7), 200_000_000);
        assert!(!w.on_packet(Psn::new(6), 201_000_000));
        assert!(!w.on_packet(Psn::new(7), 208_000_000));
        assert!(w.on_packet(Psn::new(7), 226_000_000));
        assert_eq!((w.spurious, w.wait()), (1, 10_000_000));
        // At most one round trip.
        w.on_asked(Psn::new(30), 300_000_000);
        w.on_packet(Psn::new(30), 340_000_000);
        w.on_packet(Psn::new(30), 341_000_000);
        assert_eq!(w.wait(), 20_000_000);
        // Without a round trip: from what was seen, up to MAX_REORDER_NS.
        let mut r = ReorderWindow::default();
        r.on_asked(Psn::new(1), 0);
        r.on_packet(Psn::new(1), 4_000_000);
        r.on_packet(Psn::new(1), 5_000_000);
        assert_eq!(r.wait(), 5_000_000);
        r.on_asked(Psn::new(2), 0);
        r.on_packet(Psn::new(2), 90_000_000);
        r.on_packet(Psn::new(2), 91_000_000);
        assert_eq!(r.wait(), MAX_REORDER_NS);
        // A loopback path: the least wait holds.
        let mut l = ReorderWindow::default();
        l.on_rtt(40_000);
        assert_eq!(l.wait(), MIN_REORDER_NS);
    }

    #[test]
    fn go_back_n_ignores_repeated_gaps_until_progress_or_a_lost_resend() {
        let mut r = GoBackN::default();
        let p = Psn::new(100);
        assert!(!r.in_progress());
        assert_eq!(r.on_loss(p, LossCause::Gap), Some(p));
        assert!(r.in_progress());
        // The tail of the old flight reports the same gap again: no second resend.
        assert_eq!(r.on_loss(p, LossCause::Gap), None);
        assert_eq!(r.on_loss(p, LossCause::ReadHole), None);
        // A NAK or a timeout for it always resends.
        assert_eq!(r.on_loss(p, LossCause::NakSeq), Some(p));
        assert_eq!(r.on_loss(p, LossCause::Timeout), Some(p));
        // Progress up to the PSN itself does not end the retransmission; past it does.
        r.on_progress(p);
        assert!(r.in_progress());
        r.on_progress(p.next());
        assert!(!r.in_progress());
        assert_eq!(r.on_loss(p, LossCause::Gap), Some(p));
        r.on_retransmission_lost();
        assert_eq!(r.on_loss(p, LossCause::Gap), Some(p));
    }

    #[test]
    fn progress_compares_across_the_psn_wrap() {
        let mut r = GoBackN::default();
        let p = Psn::MAX;
        assert_eq!(r.on_loss(p, LossCause::Timeout), Some(p));
        r.on_progress(Psn::new(1));
        assert!(!r.in_progress());
    }
}
