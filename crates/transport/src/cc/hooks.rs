//! Where a QP's requester, completer and responder tell congestion control what
//! happened, and ask it whether the next packet may leave.

use super::{new_controller, CcAlgorithm, CcStats, Congestion, CongestionControl};
use super::{Pacer, ResponseRate, RttSampler};
use crate::config::EngineConfig;
use crate::qp::{Ctx, Qp};
use crate::recovery::{LossCause, LossRecovery};
use crate::verbs::{Nanos, Psn, QpType};

/// Fewest request packets between ACK requests that [`Qp::cc_ack_every`] asks for.
const MIN_ACK_EVERY: u64 = 16;

/// One QP's congestion state.
#[derive(Debug, Default)]
pub(crate) struct QpCc {
    /// The requester's controller (RC only; made when the first WQE starts, once the
    /// path MTU is known).
    ctl: Option<Box<dyn CongestionControl>>,
    rtt: RttSampler,
    pacer: Pacer,
    /// The requester waits for the pacer until then.
    pace_at: Option<Nanos>,
    /// The requester waits for the window.
    window_blocked: bool,
    /// The last request PSN sent asking for an ACK.
    last_ack_req: Option<Psn>,
    /// The PSN after the highest sent when a loss last cut the window: losses found
    /// before the oldest unacknowledged PSN passes it belong to the same episode
    /// (NewReno's recovery point, RFC 6582 section 3.2).
    recover_to: Option<Psn>,
    window_limited: u64,
    pacing_waits: u64,
    /// The responder's READ response rate.
    resp: ResponseRate,
    /// The responder waits for its READ response pacer until then.
    resp_pace_at: Option<Nanos>,
}

impl Qp {
    /// Whether this QP's sends are congestion controlled: RC, and a peer on another
    /// host. To a peer on this host (a loopback address, or this QP's own address)
    /// there is no link to congest, only socket buffers, which the device budget
    /// bounds; its round trip is the two processes' scheduling, and taking that for
    /// queueing halved 64 KiB WRITE bandwidth on loopback.
    pub(crate) fn cc_on(&self, ctx: &Ctx<'_>) -> bool {
        let dst = self.path.dst.ip();
        self.init.qp_type == QpType::Rc
            && ctx.cfg.cc != CcAlgorithm::Off
            && !dst.is_loopback()
            && dst != self.path.src
    }

    /// Whether the request packet `psn`, which takes the PSNs up to `last`, may leave
    /// now: within the window (at least one packet always may) and the pacer's time.
    pub(crate) fn cc_allows_request(&mut self, ctx: &mut Ctx<'_>, psn: Psn, last: Psn) -> bool {
        if let Some(rate) = self.unacked_rate(ctx.cfg) {
            return self.cc_pace(ctx, rate);
        }
        if !self.cc_on(ctx) {
            return true;
        }
        if self.cc.ctl.is_none() {
            // Counted in packets of the path MTU whatever size was agreed: the same
            // window arithmetic with rxe as with a softhca peer.
            self.cc.ctl = new_controller(ctx.cfg.cc, self.mtu(ctx.cfg));
        }
        let mtu = self.cc_mtu(ctx.cfg);
        let per_path = self.mp_paths_cc();
        let cc = &mut self.cc;
        let Some(ctl) = cc.ctl.as_mut() else {
            return true;
        };
        ctl.set_packet_bytes(mtu);
        ctl.on_time(ctx.now);
        if per_path {
            // Each path's own window and pacer decide (`mp_request_path`); the QP's
            // would hold the sum of the paths to one path's rate.
            cc.window_blocked = false;
            cc.pace_at = None;
            return true;
        }
        let ahead = psn.diff(self.req.una);
        // READ responses placed ahead of a hole have arrived: they are not in flight
        // (what SACK tells TCP; here the requester saw them itself). Without this, one
        // lost response held the whole window until its READ was asked again.
        let arrived = self.req.read_early.len() as u64;
        let span = (u64::from(last.diff(self.req.una).max(0) as u32) + 1).saturating_sub(arrived);
        // A window that shrank under packets already sent may leave none of them
        // asking for an ACK: then one more packet goes (asking for one, as the window
        // is closed), or nothing would come back before the retransmit timeout.
        let ack_coming = cc.last_ack_req.is_some_and(|p| !p.is_before(self.req.una));
        if ahead > 0 && span * mtu > ctl.window() && ack_coming {
            if !cc.window_blocked {
                cc.window_blocked = true;
                cc.window_limited += 1;
                ctx.counters.cc_window_limited += 1;
            }
            return false;
        }
        cc.window_blocked = false;
        // Not paced before the first round trip is measured (rate 0).
        let rate = ctl.pacing_rate().unwrap_or(0);
        let allowed = self.cc_pace(ctx, rate);
        if let Some(ctl) = self.cc.ctl.as_mut().filter(|_| allowed) {
            ctl.on_sent(span * mtu);
        }
        allowed
    }

    /// The rate a UC or UD QP is held to, if any.
    fn unacked_rate(&self, cfg: &EngineConfig) -> Option<u64> {
        cfg.unacked_rate
            .filter(|_| matches!(self.init.qp_type, QpType::Uc | QpType::Ud))
    }

    /// Whether the pacer, at `rate` (0: not paced), lets the next packet leave now.
    fn cc_pace(&mut self, ctx: &mut Ctx<'_>, rate: u64) -> bool {
        let cc = &mut self.cc;
        if rate > 0 {
            if let Some(t) = cc.pacer.wait_until(ctx.now) {
                if cc.pace_at.is_none() {
                    cc.pacing_waits += 1;
                    ctx.counters.cc_pacing_wait += 1;
                }
                cc.pace_at = Some(t);
                return false;
            }
        }
        cc.pace_at = None;
        true
    }

    /// How many request packets may go without asking for an ACK: half the window,
    /// but not under [`MIN_ACK_EVERY`] (a 64 KiB message then asks once, as without).
    pub(crate) fn cc_ack_every(&self, cfg: &EngineConfig) -> u32 {
        if let Some(w) = self.mp_least_window() {
            return (w / 2).max(MIN_ACK_EVERY as u32);
        }
        match self.cc.ctl.as_ref() {
            Some(ctl) if ctl.in_slow_start() => MIN_ACK_EVERY as u32,
            Some(ctl) => {
                (ctl.window() / self.cc_mtu(cfg) / 2).clamp(MIN_ACK_EVERY, u32::MAX.into()) as u32
            }
            None => u32::MAX,
        }
    }

    /// Whether request packet `psn` of a message whose PSNs end at `last` is the QP's
    /// first, of a message larger than the window: it asks for an ACK, so that the first
    /// round-trip sample is of a packet with nothing of its own burst ahead of it at the
    /// bottleneck (the initial window leaves at once, and its last packet's round trip
    /// holds the whole window's time at the bottleneck).
    pub(crate) fn cc_first_request(&self, cfg: &EngineConfig, psn: Psn, last: Psn) -> bool {
        let span = u64::from(last.diff(psn).max(0) as u32) + 1;
        self.cc.last_ack_req.is_none()
            && self
                .cc
                .ctl
                .as_ref()
                .is_some_and(|ctl| span * self.cc_mtu(cfg) > ctl.window())
    }

    /// Whether request packet `psn`, going on multipath path `path`, is the last one
    /// the window (the path's, with a controller per path) lets go.
    pub(crate) fn cc_window_closes_at(&self, cfg: &EngineConfig, psn: Psn, path: u8) -> bool {
        if let Some(closes) = self.mp_window_closes(path) {
            return closes;
        }
        self.cc.ctl.as_ref().is_some_and(|ctl| {
            let after = u64::from(psn.diff(self.req.una).max(0) as u32) + 2;
            after * self.cc_mtu(cfg) > ctl.window()
        })
    }

    /// A request packet of `bytes` on the wire with PSN `psn` left, `ack_req`: asking
    /// for an ACK (before `req.max_sent` moves past it).
    pub(crate) fn cc_request_sent(
        &mut self,
        cfg: &EngineConfig,
        now: Nanos,
        (psn, bytes, ack_req): (Psn, u64, bool),
    ) {
        if let Some(rate) = self.unacked_rate(cfg) {
            self.cc.pacer.on_sent(now, bytes, rate);
            return;
        }
        let Some(ctl) = self.cc.ctl.as_ref() else {
            return;
        };
        if ack_req {
            self.cc.last_ack_req = Some(psn);
        }
        // A round-trip sample: a first transmission that asks for an ACK (Karn), not
        // while a retransmission is under way: its ACK (or a READ's first response)
        // moves the oldest unacknowledged PSN only once the hole before it is filled,
        // and the repair's round trips inflated the READ samples at 1 % loss tenfold.
        let sample =
            ack_req && !psn.is_before(self.req.max_sent) && !self.req.recovery.in_progress();
        if sample {
            // Nothing posted after this packet (`req.send_idx` moved past it already).
            let app_limited = self.req.send_idx >= self.req.sq.len();
            let span = u64::from(psn.diff(self.req.una).max(0) as u32) + 1;
            let in_flight = span * self.cc_mtu(cfg);
            self.cc.rtt.on_sent(psn, now, app_limited, in_flight);
        }
        if let Some(rate) = ctl.pacing_rate() {
            // A READ request takes what it asks for, but not more than the window: the
            // window lets one READ go whatever its size, and at a base probe's least
            // window and rate a whole 64 KiB READ held the next one back for 80 ms.
            self.cc.pacer.on_sent(now, bytes.min(ctl.window()), rate);
        }
    }

    /// The oldest unacknowledged PSN moved from `before` to `req.una`.
    pub(crate) fn cc_progress(&mut self, ctx: &mut Ctx<'_>, before: Psn) {
        let mtu = self.cc_mtu(ctx.cfg);
        let una = self.req.una;
        let Some(ctl) = self.cc.ctl.as_mut() else {
            return;
        };
        let rtt = self.cc.rtt.on_acked(una, ctx.now);
        let acked = u64::from(una.diff(before).max(0) as u32) * mtu;
        let was = ctl.counters();
        ctl.on_ack(ctx.now, acked, rtt);
        count_cuts(ctx, &was, &ctl.counters());
    }

    /// A retransmission for `cause` started.
    pub(crate) fn cc_loss(&mut self, ctx: &mut Ctx<'_>, cause: LossCause) {
        self.cc.rtt.clear();
        let what = match cause {
            LossCause::NakSeq | LossCause::Gap | LossCause::ReadHole | LossCause::ResentLost => {
                Congestion::Loss
            }
            LossCause::Timeout => Congestion::Timeout,
            // Our own guess after silence, not a signal from the network.
            LossCause::Quiet => return,
        };
        // One cut per episode: an overshoot drops a run of packets, which go-back-N
        // finds a round trip apart; each taken as new congestion cut the window to its
        // least on a long path, as NewReno does not (RFC 6582).
        let una = self.req.una;
        if what == Congestion::Loss && self.cc.recover_to.is_some_and(|p| una.is_before(p)) {
            return;
        }
        if let Some(ctl) = self.cc.ctl.as_mut() {
            let was = ctl.counters();
            ctl.on_congestion(ctx.now, what);
            let now = ctl.counters();
            if now.loss_decreases > was.loss_decreases || now.timeouts > was.timeouts {
                self.cc.recover_to = Some(self.req.max_sent);
            }
            count_cuts(ctx, &was, &now);
        }
    }

    /// Whether the next READ response may leave now.
    pub(crate) fn cc_allows_response(&mut self, ctx: &Ctx<'_>) -> bool {
        if !self.cc_on(ctx) {
            return true;
        }
        let cc = &mut self.cc;
        match cc.resp.rate().and(cc.resp.pacer.wait_until(ctx.now)) {
            Some(t) => {
                cc.resp_pace_at = Some(t);
                false
            }
            None => {
                cc.resp_pace_at = None;
                true
            }
        }
    }

    /// READ response `psn`, `bytes` on the wire, left; `first`: a READ's first.
    pub(crate) fn cc_response_sent(&mut self, ctx: &Ctx<'_>, psn: Psn, bytes: u64, first: bool) {
        if self.cc_on(ctx) {
            self.cc.resp.on_sent(ctx.now, psn, bytes, first);
        }
    }

    /// The requester asked again for a READ from `psn`: its responses were lost.
    pub(crate) fn cc_read_repeated(&mut self, ctx: &mut Ctx<'_>, psn: Psn) {
        if self.cc_on(ctx) {
            let was = self.cc.resp.cuts;
            self.cc.resp.on_repeat(ctx.now, psn);
            ctx.counters.cc_response_rate_cut += self.cc.resp.cuts - was;
        }
    }

    /// The earliest time a pacer, or a window held back, lets this QP send again, if it
    /// waits for one.
    pub(crate) fn cc_deadline(&self) -> Option<Nanos> {
        let held = self
            .cc
            .ctl
            .as_ref()
            .filter(|_| self.cc.window_blocked)
            .and_then(|ctl| ctl.wake_at());
        [self.cc.pace_at, self.cc.resp_pace_at, held]
            .into_iter()
            .flatten()
            .min()
    }

    /// The timer fired at `now`: pacing waits that are over end (the next plan looks
    /// again), so that a passed time is never a deadline.
    pub(crate) fn cc_on_timer(&mut self, now: Nanos) {
        if let Some(ctl) = self.cc.ctl.as_mut() {
            ctl.on_time(now);
        }
        if self.cc.pace_at.is_some_and(|t| t <= now) {
            self.cc.pace_at = None;
        }
        if self.cc.resp_pace_at.is_some_and(|t| t <= now) {
            self.cc.resp_pace_at = None;
        }
    }

    /// The congestion figures of this QP (None: nothing congestion controlled). A QP
    /// that only answers READs has no controller, but may have a response rate.
    pub(crate) fn cc_stats(&self) -> Option<CcStats> {
        let base = match self.cc.ctl.as_ref() {
            Some(ctl) => ctl.stats(),
            None if self.cc.resp.cuts > 0 => CcStats::default(),
            None => return None,
        };
        Some(CcStats {
            window_limited: self.cc.window_limited,
            pacing_waits: self.cc.pacing_waits,
            response_rate: self.cc.resp.rate().unwrap_or(0),
            response_cuts: self.cc.resp.cuts,
            ..base
        })
    }
}

/// The device counters of what a controller just did.
fn count_cuts(ctx: &mut Ctx<'_>, was: &CcStats, now: &CcStats) {
    let c = &mut *ctx.counters;
    c.cc_delay_decrease += now.delay_decreases.saturating_sub(was.delay_decreases);
    c.cc_loss_decrease += now.loss_decreases.saturating_sub(was.loss_decreases);
    c.cc_timeout += now.timeouts.saturating_sub(was.timeouts);
    c.cc_base_probe += now.base_probes.saturating_sub(was.base_probes);
}
