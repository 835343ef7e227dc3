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

#[cfg(test)]
mod tests {
    use super::*;

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
