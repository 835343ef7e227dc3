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
    /// A SACK still reports a hole two round trips after this side resent it: the
    /// resend is taken for lost and sent again (`Qp::on_held`).
    ResentLost,
}

impl LossCause {
    /// This side's guess, not a signal IBTA 9.7.6.1.3 counts against the retry budget
    /// (a timeout or a NAK): silence during a retransmission, or a responder that goes
    /// on reporting a hole already resent (a repeated report, as rxe starts no new
    /// retry on a repeated NAK). A resend can sit behind milliseconds of queued packets
    /// (a loopback socket's receive buffer), longer than the round trips measured
    /// before; counted, the SACKs of that wait spent the budget while it was queued.
    pub(crate) fn is_guess(self) -> bool {
        matches!(self, LossCause::Quiet | LossCause::ResentLost)
    }
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

/// What a softhca responder holds beyond the oldest unacknowledged PSN (the ranges of
/// its last SACK): selective repeat on one path between two softhca devices that
/// negotiated the extension (never with rxe, whose responder drops what arrives
/// early). A pass over the holes goes back to the first and resends what is not held
/// up to the last PSN held (a later packet arrived, so on one path these were lost)
/// and beyond it what left two round trips ago or earlier (it had the time to be
/// reported), then goes on where sending was: what left since may be in flight, and
/// later SACKs tell. Going back N resent a whole window of which the responder held
/// most. A held packet is executed when the gap before it fills and is never dropped
/// before (only with the QP, in the error state), so not resending it is safe.
#[derive(Debug, Default, Clone)]
pub(crate) struct Held {
    /// Inclusive PSN ranges, in PSN order.
    ranges: Vec<(Psn, Psn)>,
    /// The loss episode these SACKs report ends when the oldest unacknowledged PSN
    /// reaches this (the highest PSN sent as it began: RFC 6582's "recover").
    episode_to: Option<Psn>,
    /// The passes of this episode, in PSN order: the last PSN each resent up to, and
    /// when it began.
    passes: Vec<(Psn, Nanos)>,
    /// The pass under way resends up to this PSN, then sending goes on where it was
    /// (None: no pass; going back N resends everything not held).
    pub pass_to: Option<Psn>,
    /// When new PSNs left: one mark per `MARK_EVERY` PSNs, the last `MAX_MARKS`.
    marks: std::collections::VecDeque<(Psn, Nanos)>,
}

/// PSNs between send-time marks.
const MARK_EVERY: i32 = 16;
/// Send-time marks kept (a 1024-PSN window's worth).
const MAX_MARKS: usize = 64;

impl Held {
    /// A SACK's ranges (all the responder holds, up to the SACK's limit).
    pub fn set(&mut self, ranges: &[(Psn, Psn)]) {
        self.ranges.clear();
        self.ranges.extend_from_slice(ranges);
    }

    /// Forget everything (after a timeout or an RNR NAK: the next pass resends all).
    pub fn clear(&mut self) {
        self.ranges.clear();
        self.episode_to = None;
        self.passes.clear();
        self.pass_to = None;
    }

    /// A new PSN left at `now`.
    pub fn on_new_sent(&mut self, psn: Psn, now: Nanos) {
        if self
            .marks
            .back()
            .is_none_or(|&(p, _)| psn.diff(p) >= MARK_EVERY)
        {
            if self.marks.len() >= MAX_MARKS {
                self.marks.pop_front();
            }
            self.marks.push_back((psn, now));
        }
    }

    /// The first PSN sent at `since` or later (as far as the marks tell): packets
    /// sent before it had the time to arrive and be reported held.
    pub fn sent_since(&self, since: Nanos) -> Option<Psn> {
        self.marks
            .iter()
            .find(|&&(_, at)| at >= since)
            .map(|&(p, _)| p)
    }

    /// The last PSN held, if any.
    pub fn highest(&self) -> Option<Psn> {
        self.ranges.last().map(|&(_, b)| b)
    }

    /// Whether a loss episode is under way with `una` the oldest unacknowledged PSN.
    pub fn in_episode(&self, una: Psn) -> bool {
        self.episode_to.is_some_and(|to| una.is_before(to))
    }

    /// A loss episode begins; `max_sent` is one past the highest PSN sent.
    pub fn begin(&mut self, max_sent: Psn) {
        self.episode_to = Some(max_sent);
        self.passes.clear();
    }

    /// A pass from `from` up to `to` begins at `now` (later passes over the same PSNs
    /// replace earlier ones).
    pub fn start_pass(&mut self, from: Psn, to: Psn, now: Nanos) {
        self.passes.retain(|&(t, _)| t.is_before(from));
        self.passes.push((to, now));
        self.pass_to = Some(to);
    }

    /// The pass under way goes on up to `to` at `now` (a later SACK held more, or
    /// what lies beyond left long ago); one whose record progress removed starts anew.
    pub fn extend_pass(&mut self, to: Psn, now: Nanos) {
        match self.passes.last_mut() {
            Some(last) => last.0 = to,
            None => self.passes.push((to, now)),
        }
        self.pass_to = Some(to);
    }

    /// The last PSN a pass of this episode covered.
    pub fn covered(&self) -> Option<Psn> {
        self.passes.last().map(|&(t, _)| t)
    }

    /// When the pass that resent `psn` began.
    pub fn resent_at(&self, psn: Psn) -> Option<Nanos> {
        self.passes
            .iter()
            .find(|&&(t, _)| !t.is_before(psn))
            .map(|&(_, at)| at)
    }

    /// The oldest unacknowledged PSN moved to `una`: ranges behind it are gone.
    pub fn on_progress(&mut self, una: Psn) {
        self.ranges.retain(|&(_, b)| !b.is_before(una));
        self.passes.retain(|&(t, _)| !t.is_before(una));
    }

    /// The last PSN of the held range `psn` is in, if any.
    pub fn holding(&self, psn: Psn) -> Option<Psn> {
        self.ranges
            .iter()
            .find(|&&(a, b)| !psn.is_before(a) && !psn.is_after(b))
            .map(|&(_, b)| b)
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
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
/// twice, the late first copy (within a round trip of the ask) and then the resent one;
/// the window then becomes 5/4 of how long that gap stayed open. Why: a path that delays
/// packets by a varying amount (a VM's virtual NIC, a Wi-Fi hop, the testbed's jitter)
/// reorders by up to that variation; a fixed 1 ms took most reorderings of a 10 ms path
/// with 2 ms of jitter for losses, and each needless resend cut the congestion window
/// and the responder's READ rate and spent a transport retry, until the connection
/// failed with RETRY_EXC_ERR.
#[derive(Debug, Default, Clone)]
pub(crate) struct ReorderWindow {
    /// Least round trip seen, ns (0: none yet).
    min_rtt: Nanos,
    /// The longest a gap stayed open before its late packet came, ns.
    extent: Nanos,
    /// The PSN last asked again for.
    asked: Option<Asked>,
    /// Resends found needless.
    pub spurious: u64,
}

/// A PSN asked for again, and what is known of its copies since.
#[derive(Debug, Clone, Copy)]
struct Asked {
    psn: Psn,
    /// When its gap opened.
    opened_at: Nanos,
    /// When it was asked for.
    asked_at: Nanos,
    /// When its first copy arrived after that.
    first: Option<Nanos>,
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

    /// The gap at `psn`, open since `opened_at`, was taken for a loss at `now`: `psn` is
    /// asked for again.
    pub fn on_asked(&mut self, psn: Psn, opened_at: Nanos, now: Nanos) {
        self.asked = Some(Asked {
            psn,
            opened_at,
            asked_at: now,
            first: None,
        });
    }

    /// A packet with `psn` arrived at `now` (in order, early or a duplicate). Returns
    /// whether it showed the last resend needless.
    pub fn on_packet(&mut self, psn: Psn, now: Nanos) -> bool {
        let Some(asked) = self.asked.as_mut() else {
            return false;
        };
        if asked.psn != psn {
            return false;
        }
        let Some(first) = asked.first else {
            if self.min_rtt > 0 && now.saturating_sub(asked.asked_at) >= self.min_rtt {
                // A round trip after asking, the first copy may be the answer (or that
                // of an earlier ask, a quiet resend's): as Karn's rule does with an
                // ambiguous sample, judge nothing. Taken for the late original, the two
                // answers to a response asked for twice would stretch the window to
                // the time the gap stayed open.
                self.asked = None;
                return false;
            }
            asked.first = Some(now);
            return false;
        };
        self.extent = self.extent.max(first.saturating_sub(asked.opened_at));
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
        w.on_asked(Psn::new(9), 100_000_000, 100_000_000);
        assert!(!w.on_packet(Psn::new(9), 126_000_000));
        assert_eq!(w.wait(), 5_000_000);
        // Asked for twice (a quiet resend, then the gap timer): both copies come a round
        // trip or more after the ask, so either may be an answer: nothing is judged.
        w.on_asked(Psn::new(11), 110_000_000, 150_000_000);
        assert!(!w.on_packet(Psn::new(11), 175_000_000));
        assert!(!w.on_packet(Psn::new(11), 175_000_000));
        assert_eq!((w.spurious, w.wait()), (0, 5_000_000));
        // Reordering: the gap at 7 opened at 200 ms, its first copy came 8 ms later,
        // then the resent one.
        w.on_asked(Psn::new(7), 200_000_000, 200_000_000);
        assert!(!w.on_packet(Psn::new(6), 201_000_000));
        assert!(!w.on_packet(Psn::new(7), 208_000_000));
        assert!(w.on_packet(Psn::new(7), 226_000_000));
        assert_eq!((w.spurious, w.wait()), (1, 10_000_000));
        // At most one round trip.
        w.on_asked(Psn::new(30), 260_000_000, 300_000_000);
        w.on_packet(Psn::new(30), 310_000_000);
        w.on_packet(Psn::new(30), 341_000_000);
        assert_eq!(w.wait(), 20_000_000);
        // Without a round trip: from what was seen, up to MAX_REORDER_NS.
        let mut r = ReorderWindow::default();
        r.on_asked(Psn::new(1), 0, 0);
        r.on_packet(Psn::new(1), 4_000_000);
        r.on_packet(Psn::new(1), 5_000_000);
        assert_eq!(r.wait(), 5_000_000);
        r.on_asked(Psn::new(2), 0, 0);
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
    fn held_ranges_answer_by_psn_and_go_with_progress() {
        let mut h = Held::default();
        let r = |a: u32, b: u32| (Psn::new(a), Psn::new(b));
        h.set(&[r(0xff_fffe, 2), r(10, 12)]);
        assert_eq!(h.holding(Psn::new(0xff_ffff)), Some(Psn::new(2)));
        assert_eq!(h.holding(Psn::new(3)), None);
        assert_eq!(h.holding(Psn::new(12)), Some(Psn::new(12)));
        h.on_progress(Psn::new(5));
        assert_eq!(h.holding(Psn::new(1)), None);
        assert_eq!(h.holding(Psn::new(11)), Some(Psn::new(12)));
        assert!(!h.in_episode(Psn::new(5)));
        h.begin(Psn::new(20));
        assert!(h.in_episode(Psn::new(19)));
        assert!(!h.in_episode(Psn::new(20)));
        h.clear();
        assert!(h.is_empty() && !h.in_episode(Psn::new(5)));
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
