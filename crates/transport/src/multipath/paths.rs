//! Per-path state: status, round trip, window, probes, counters; and the choice of
//! path for the next packet.

use std::collections::VecDeque;

use crate::cc::{Congestion, CongestionControl, Pacer, RttSample};
use crate::path::Path;
use crate::timers::rtt_update;
use crate::verbs::Nanos;

use super::{MpPathStats, READMIT_MAX_NS};

/// First window of a path, in packets.
const INIT_CWND: u32 = 64;
/// Smallest window.
const MIN_CWND: u32 = 16;
/// Largest window (the QP's own limit is `requester::MAX_UNACKED_PSNS`).
const MAX_CWND: u32 = 1024;
/// How long a probe waits for its answer at least.
const PROBE_TIMEOUT_MIN_NS: Nanos = 5_000_000;
/// First wait before probing a failed path again.
const READMIT_FIRST_NS: Nanos = 1_000_000;
/// Least reorder window of a path (a host's scheduling of one batch).
const REO_MIN_NS: Nanos = 100_000;
/// Largest multiplier of the reorder window.
const REO_MULT_MAX: u32 = 16;
/// Loss recoveries after which a grown reorder window is reset (RFC 8985 7.2).
const REO_RESET_RECOVERIES: u32 = 16;
/// Least silence of a path, past its expected acknowledgement, that makes it suspect
/// (a host's scheduling noise), and its floor on a path of a few microseconds.
const SILENCE_MIN_NS: Nanos = 1_000_000;
const SILENCE_FLOOR_NS: Nanos = 200_000;
/// Most added to a path's silence allowance after silences that were not.
const SILENCE_EXTRA_MAX_NS: Nanos = 8_000_000;
/// Probes whose late answers still count (`PathState::last_probes`).
const RECENT_PROBES: usize = 4;
/// Most send times a path keeps for its silence (a window's worth and more).
const SENT_AT_MAX: usize = 4096;

/// Where a path stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathStatus {
    /// Not yet validated: probed, carries no data.
    Probing,
    /// Carries data.
    Active,
    /// Lost packets or probes: carries no data, probed for readmission.
    Failed,
}

impl PathStatus {
    pub fn name(self) -> &'static str {
        match self {
            PathStatus::Probing => "probing",
            PathStatus::Active => "active",
            PathStatus::Failed => "failed",
        }
    }
}

/// One path of a QP.
#[derive(Debug)]
pub(crate) struct PathState {
    pub path: Path,
    pub status: PathStatus,
    pub srtt: Nanos,
    /// Round-trip variation (RFC 6298).
    pub rttvar: Nanos,
    pub cwnd: u32,
    /// Packets sent on this path and not yet acknowledged or found lost.
    pub inflight: u32,
    /// Sequence number of the next packet sent on this path.
    pub next_seq: u32,
    /// Highest sequence number acknowledged (0: none; numbers start at 1).
    pub acked_seq: u32,
    /// The path's congestion controller (`cc` on): its window and pacing rate replace
    /// `cwnd`, from this path's own round trips and losses.
    pub cc: Option<Box<dyn CongestionControl>>,
    /// Paces this path's requests at its controller's rate.
    pub pacer: Pacer,
    /// Packet size the controller counts in.
    pub mtu: u64,
    /// Sequence number and send time of the packets sent on this path after the newest
    /// one delivered: the oldest is the next this FIFO path should deliver.
    pub sent_at: VecDeque<(u32, Nanos)>,
    /// RACK per path (RFC 8985): the send time and round trip of the packet delivered
    /// last by send time (sent once).
    pub rack_at: Nanos,
    pub rack_rtt: Nanos,
    /// Least round trip of a data packet.
    pub min_rtt: Nanos,
    /// The reorder window in quarters of `min_rtt` (RACK's reo_wnd_mult): grows when a
    /// loss proves spurious, at most once per round trip; reset after
    /// `REO_RESET_RECOVERIES` loss recoveries.
    pub reo_mult: u32,
    pub reo_grown_at: Nanos,
    pub recoveries: u32,
    /// Smoothed spacing of this path's deliveries while it had packets in flight, and
    /// its variation.
    pub ack_gap: Nanos,
    pub ack_gap_var: Nanos,
    /// Silent while others delivered: its packets moved to the other paths, no new
    /// ones until it delivers or answers a probe.
    pub suspect: bool,
    /// When its packets last moved for silence (0: none since): a packet sent before
    /// that and delivered after all shows the silence was not one.
    pub moved_at: Nanos,
    /// Added to the silence allowance after silences that were not.
    pub silence_extra: Nanos,
    /// Found silent with no other path delivering either (left to the retransmit
    /// timer): not judged again before this.
    pub silence_recheck: Nanos,
    /// The window was last cut for a packet sent before this time.
    pub cut_at: Nanos,
    /// Acknowledged packets since the window last grew (congestion avoidance).
    pub acked_since_grow: u32,
    /// The window before the last cut (0: none to undo).
    pub prior_cwnd: u32,
    /// Losses in the current loss round, and when the last one was found.
    pub round_losses: u32,
    pub last_loss_at: Nanos,
    /// Probe outstanding: nonce and when sent.
    pub probe: Option<(u32, Nanos)>,
    /// The last probes sent (nonce, when), answered or not: a late answer is still a
    /// round trip. Several: a path not measured yet is probed again after the least
    /// probe timeout (5 ms), and on a 10 ms path each answer came after the next probe
    /// had replaced the one it answered, so the path failed validation and waited for
    /// readmission's longer intervals.
    pub last_probes: [(u32, Nanos); RECENT_PROBES],
    /// The send time of the newest probe answered: the path carried what was sent then.
    pub probe_answered_sent: Nanos,
    /// Round trips measured from data (then probes, which skip the data queues at the
    /// sender, no longer move the RTT).
    pub data_rtt: bool,
    /// Probes unanswered in a row.
    pub probe_misses: u8,
    /// The send time of a probe that went unanswered while nothing sent as late came
    /// through on any path either: a miss once something does.
    pub probe_unjudged: Option<Nanos>,
    /// When to probe next.
    pub probe_at: Nanos,
    /// Wait before the next readmission probe (doubles).
    pub backoff: Nanos,
    /// The last acknowledgement of a packet sent on this path, or probe answer.
    pub alive_at: Nanos,
    pub pkts: u64,
    pub bytes: u64,
    pub losses: u64,
    /// Packets taken for lost that arrived after all.
    pub spurious: u64,
    pub retransmits: u64,
    /// Times its packets moved for silence.
    pub silences: u64,
    pub state_changes: u64,
    pub probes: u64,
    pub probe_acks: u64,
}

impl PathState {
    pub fn new(path: Path, status: PathStatus, now: Nanos) -> PathState {
        PathState {
            path,
            status,
            srtt: 0,
            rttvar: 0,
            cwnd: INIT_CWND,
            inflight: 0,
            next_seq: 1,
            acked_seq: 0,
            cc: None,
            pacer: Pacer::default(),
            mtu: 4096,
            sent_at: VecDeque::new(),
            rack_at: 0,
            rack_rtt: 0,
            min_rtt: 0,
            reo_mult: 1,
            reo_grown_at: 0,
            recoveries: 0,
            ack_gap: 0,
            ack_gap_var: 0,
            suspect: false,
            moved_at: 0,
            silence_extra: 0,
            silence_recheck: 0,
            cut_at: 0,
            acked_since_grow: 0,
            prior_cwnd: 0,
            round_losses: 0,
            last_loss_at: 0,
            probe: None,
            last_probes: [(0, 0); RECENT_PROBES],
            probe_answered_sent: 0,
            data_rtt: false,
            probe_misses: 0,
            probe_unjudged: None,
            probe_at: now,
            backoff: READMIT_FIRST_NS,
            alive_at: now,
            pkts: 0,
            bytes: 0,
            losses: 0,
            spurious: 0,
            retransmits: 0,
            silences: 0,
            state_changes: 0,
            probes: 0,
            probe_acks: 0,
        }
    }

    pub fn set_status(&mut self, s: PathStatus, now: Nanos) {
        if self.status != s {
            self.status = s;
            self.state_changes += 1;
            self.sent_at.clear();
            self.suspect = false;
            self.probe_unjudged = None;
            if s == PathStatus::Failed {
                self.backoff = READMIT_FIRST_NS;
                self.probe_at = now + self.backoff;
                self.probe = None;
            }
        }
    }

    /// How long a probe on this path may take before it counts as lost.
    pub fn probe_timeout(&self) -> Nanos {
        (3 * (self.srtt + 4 * self.rttvar)).max(PROBE_TIMEOUT_MIN_NS)
    }

    /// RACK's reorder window on this path (RFC 8985 6.2): a quarter of its least round
    /// trip (at least `REO_MIN_NS`) times `reo_mult`, at most its smoothed round trip.
    /// A path is FIFO, so a packet overtaken on its own path is lost after this short
    /// wait, whatever the other paths' delays.
    pub fn reo_wnd(&self) -> Nanos {
        let quarter = (self.min_rtt / 4).max(REO_MIN_NS);
        (quarter * u64::from(self.reo_mult)).min(self.srtt.max(quarter))
    }

    /// How long past its send time a packet with nothing sent after it on its path
    /// delivered may be before it counts as lost (RACK-TLP's probe timeout, RFC 8985
    /// 7.2): twice the longest round trip expected plus the silence allowance, so that
    /// while other paths deliver, a path that delivers nothing is found silent first
    /// (its packets move once, and a probe asks whether it works); this is for a tail
    /// with no path delivering.
    pub fn tail_wait(&self) -> Nanos {
        2 * self.expect_rtt() + self.silence_allow()
    }

    /// The longest round trip the next delivery on this path should take: the last
    /// one's (RACK's) or the smoothed one, whichever is longer, plus two variations (a
    /// queue that grows, a host's scheduling); 1 ms before a measurement.
    fn expect_rtt(&self) -> Nanos {
        if self.srtt == 0 {
            return 1_000_000;
        }
        self.rack_rtt.max(self.srtt) + 2 * self.rttvar
    }

    /// How long a working path may stay silent past its expected delivery: its
    /// deliveries' spacing plus four variations (with many paths, each gets a burst now
    /// and then), at least two round trips between `SILENCE_FLOOR_NS` and
    /// `SILENCE_MIN_NS`, plus what silences that were not added.
    pub fn silence_allow(&self) -> Nanos {
        let floor = (2 * self.srtt).clamp(SILENCE_FLOOR_NS, SILENCE_MIN_NS);
        (self.ack_gap + 4 * self.ack_gap_var).max(floor) + self.silence_extra
    }

    pub fn on_rtt(&mut self, sample: Nanos) {
        if self.srtt == 0 {
            self.rttvar = sample / 2;
        } else {
            // RFC 6298: rttvar = 3/4 rttvar + 1/4 |srtt - sample|, before srtt moves.
            let dev = self.srtt.abs_diff(sample);
            self.rttvar = self.rttvar - self.rttvar / 4 + dev / 4;
        }
        self.srtt = rtt_update(self.srtt, sample);
    }

    /// A packet sent on this path was acknowledged; `seq` None when it had been sent
    /// more than once (which copy arrived is unknown: no ordering information, Karn),
    /// `rtt` its round trip when it was sent once.
    pub fn on_acked(&mut self, seq: Option<u32>, now: Nanos, rtt: Option<RttSample>) {
        self.inflight = self.inflight.saturating_sub(1);
        if let Some(seq) = seq {
            self.acked_seq = self.acked_seq.max(seq);
        }
        self.alive_at = now;
        self.suspect = false;
        if let Some(ctl) = self.cc.as_mut() {
            ctl.on_ack(now, self.mtu, rtt);
            return;
        }
        if self.cwnd < MAX_CWND {
            // One more packet per acknowledged one until the first cut (slow start),
            // one per window after it.
            self.acked_since_grow += 1;
            if self.cut_at == 0 || self.acked_since_grow >= self.cwnd {
                self.cwnd += 1;
                self.acked_since_grow = 0;
            }
        }
    }

    /// A packet sent on this path at `sent_at` was found lost.
    pub fn on_lost(&mut self, sent_at: Nanos, now: Nanos) {
        self.inflight = self.inflight.saturating_sub(1);
        self.losses += 1;
        if now > self.last_loss_at + self.srtt.max(REO_MIN_NS) {
            // A new recovery: after enough of them a grown reorder window starts over.
            self.recoveries += 1;
            if self.recoveries >= REO_RESET_RECOVERIES {
                self.reo_mult = 1;
                self.recoveries = 0;
            }
        }
        if let Some(ctl) = self.cc.as_mut() {
            // The controller tells a full queue (round trip over its target) from a
            // lossy or cut link, and cuts at most once per round trip.
            ctl.on_congestion(now, Congestion::Loss);
            self.last_loss_at = now;
            return;
        }
        if now > self.last_loss_at + self.srtt.max(100_000) {
            self.round_losses = 0;
        }
        self.last_loss_at = now;
        if sent_at < self.cut_at {
            return;
        }
        // A lone loss in a round trip is taken for noise (a lossy link, not a full
        // queue); a second one in the same round trip halves the window, once per
        // round trip (losses of one flight cut it once).
        self.round_losses += 1;
        if self.round_losses >= 2 {
            self.prior_cwnd = self.prior_cwnd.max(self.cwnd);
            self.cwnd = (self.cwnd / 2).max(MIN_CWND);
            self.cut_at = now;
            self.round_losses = 0;
        }
    }

    /// A packet sent at `sent_at`, taken for lost, arrived after all: reordering or a
    /// slow ACK, not a full queue; the window cut is undone (TCP's undo, RFC 3522). If
    /// it was moved for silence, the silence was not one: the allowance grows, once
    /// per silence; else the reorder window grows, once per round trip (RFC 8985 7.2,
    /// where DSACKs show it).
    pub fn on_spurious(&mut self, sent_at: Nanos, now: Nanos) {
        self.spurious += 1;
        self.suspect = false;
        if self.moved_at != 0 && sent_at < self.moved_at {
            self.silence_was_not_one();
        } else if now > self.reo_grown_at + self.srtt.max(REO_MIN_NS) {
            self.reo_mult = (self.reo_mult + 1).min(REO_MULT_MAX);
            self.reo_grown_at = now;
            self.recoveries = 0;
        }
        if self.prior_cwnd > self.cwnd {
            self.cwnd = self.prior_cwnd;
        }
        self.prior_cwnd = 0;
    }

    /// The path's last silence was not one (a packet moved for it arrived after all,
    /// or the path answered a probe sent after it): the allowance grows, once per
    /// silence.
    fn silence_was_not_one(&mut self) {
        let step = self.silence_allow() - self.silence_extra;
        self.silence_extra = (self.silence_extra + step).min(SILENCE_EXTRA_MAX_NS);
        self.moved_at = 0;
    }

    /// A packet sent at `sent_at` on this path was delivered at `now` (`once`: sent
    /// once, its round trip known): RACK's reference, the least round trip, the
    /// deliveries' spacing, and the send times of those still expected (the path is
    /// FIFO: those sent before it are delivered or lost).
    pub fn on_delivered(&mut self, sent_at: Nanos, now: Nanos, once: bool) {
        let rtt = now.saturating_sub(sent_at);
        if once && sent_at >= self.rack_at {
            self.rack_at = sent_at;
            self.rack_rtt = rtt;
        }
        if once && (self.min_rtt == 0 || rtt < self.min_rtt) {
            self.min_rtt = rtt;
        }
        // A gap between two deliveries with a packet in flight all along (sent before
        // the previous one) is the path's own spacing, not idleness.
        let busy = self
            .sent_at
            .front()
            .is_some_and(|&(_, at)| at < self.alive_at);
        if once && now > self.alive_at && busy {
            let gap = now - self.alive_at;
            if self.ack_gap == 0 {
                self.ack_gap = gap;
                self.ack_gap_var = gap / 2;
            } else {
                let dev = self.ack_gap.abs_diff(gap);
                self.ack_gap_var = self.ack_gap_var - self.ack_gap_var / 4 + dev / 4;
                self.ack_gap = rtt_update(self.ack_gap, gap);
            }
        }
        while self.sent_at.front().is_some_and(|&(_, at)| at <= sent_at) {
            self.sent_at.pop_front();
        }
    }

    /// The path stopped delivering while others went on: its packets move (`board`
    /// does that), it carries no new ones until it delivers or answers a probe, which
    /// is sent now.
    pub fn on_silent(&mut self, now: Nanos) {
        self.suspect = true;
        self.moved_at = now;
        self.silences += 1;
        self.sent_at.clear();
        if self.probe.is_none() {
            self.probe_at = now;
        }
    }

    /// A probe answer with this nonce.
    pub fn on_probe_ack(&mut self, nonce: u32, now: Nanos) -> bool {
        let Some(sent) = self
            .last_probes
            .iter_mut()
            .find(|(n, at)| *n == nonce && *at != 0)
        else {
            return false;
        };
        let at = sent.1;
        *sent = (0, 0);
        if !self.data_rtt {
            // A probe jumps the queue of data at the sender (extension packets leave
            // first), so its round trip stands for the path only until data measures
            // it; but a responder sends no data, and its probe answers wait behind
            // the data it receives: their round trips set how long a probe may take.
            self.on_rtt(now.saturating_sub(at));
        }
        self.probe_answered_sent = self.probe_answered_sent.max(at);
        if self.suspect && self.moved_at != 0 && at >= self.moved_at {
            // Silent, yet it answers a probe sent since: its packets were late (a
            // queue that grew), not lost. Their copies arrive on other paths, so only
            // this answer can say so.
            self.silence_was_not_one();
        }
        self.alive_at = now;
        self.suspect = false;
        self.probe_acks += 1;
        if self.probe.is_none_or(|(p, _)| p != nonce) {
            // Answered after its time: a round trip, not yet a working path again.
            return false;
        }
        self.probe = None;
        self.probe_misses = 0;
        self.probe_unjudged = None;
        self.backoff = READMIT_FIRST_NS;
        true
    }

    /// A packet on this path waits for news of the path: probe it now, unless a probe
    /// is out already; then returns when that one times out (and another may go).
    pub fn want_probe(&mut self, now: Nanos) -> Option<Nanos> {
        match self.probe {
            None => {
                self.probe_at = self.probe_at.min(now);
                None
            }
            Some((_, at)) => Some(at + self.probe_timeout()),
        }
    }

    /// After a probe was sent: when the next one is due.
    pub fn probe_sent(&mut self, nonce: u32, now: Nanos, keepalive: Nanos) {
        self.probe = Some((nonce, now));
        self.last_probes.rotate_right(1);
        self.last_probes[0] = (nonce, now);
        self.probes += 1;
        self.probe_at = match self.status {
            PathStatus::Failed => {
                let at = now + self.backoff;
                self.backoff = (self.backoff * 2).min(READMIT_MAX_NS);
                at
            }
            PathStatus::Probing => now + self.probe_timeout(),
            // A suspect path is probed again as soon as a probe is missed.
            PathStatus::Active if self.suspect => now,
            PathStatus::Active => now + keepalive,
        };
    }

    /// The window in packets: the controller's, or the loss-driven `cwnd` without one.
    pub fn window(&self) -> u32 {
        match self.cc.as_ref() {
            Some(ctl) => (ctl.window() / self.mtu.max(1)).clamp(1, MAX_CWND.into()) as u32,
            None => self.cwnd,
        }
    }

    pub fn room(&self) -> bool {
        self.inflight < self.window()
    }

    /// When this path's pacer lets its next packet leave, if not now.
    pub fn paced_until(&self, now: Nanos) -> Option<Nanos> {
        let rate = self.cc.as_ref()?.pacing_rate()?;
        if rate == 0 {
            return None;
        }
        self.pacer.wait_until(now)
    }

    /// Whether a new packet may go on this path now: active, window and pacer allow.
    pub fn sendable(&self, now: Nanos) -> bool {
        self.status == PathStatus::Active
            && !self.suspect
            && self.room()
            && self.paced_until(now).is_none()
    }

    /// A packet of `bytes` left on this path at `now` as its `seq`-th.
    /// `expect`: its delivery is expected within the path's round trip (not a READ or
    /// atomic request, see `board::Sent::rd_atomic`), so its lateness is silence.
    pub fn on_sent(&mut self, seq: u32, now: Nanos, bytes: u64, expect: bool) {
        if expect {
            if self.sent_at.len() >= SENT_AT_MAX {
                self.sent_at.pop_front();
            }
            self.sent_at.push_back((seq, now));
        }
        if let Some(rate) = self.cc.as_ref().and_then(|c| c.pacing_rate()) {
            self.pacer.on_sent(now, bytes, rate);
        }
    }

    /// When this active path counts as silent: the next packet it should deliver (the
    /// oldest sent after the newest delivered) is `silence_allow` past its expected
    /// round trip and past the last delivery. A full queue that drops still delivers
    /// most packets; a cut or black hole delivers none.
    pub fn silent_at(&self) -> Option<Nanos> {
        // Packets found lost by time still count: a dead path that keeps being chosen
        // would otherwise never be found silent, only lose every packet it carries.
        if self.status != PathStatus::Active || self.suspect {
            return None;
        }
        let &(_, at) = self.sent_at.front()?;
        let t = (at + self.expect_rtt()).max(self.alive_at) + self.silence_allow();
        Some(t.max(self.silence_recheck))
    }

    pub fn stats(&self) -> MpPathStats {
        MpPathStats {
            src: self.path.src,
            dst: self.path.dst,
            sport: self.path.sport,
            state: self.status.name(),
            srtt_ns: self.srtt,
            cwnd: self.window(),
            rate: self.cc.as_ref().and_then(|c| c.pacing_rate()).unwrap_or(0),
            inflight: self.inflight,
            pkts: self.pkts,
            bytes: self.bytes,
            losses: self.losses,
            spurious: self.spurious,
            retransmits: self.retransmits,
            silences: self.silences,
            state_changes: self.state_changes,
            probes: self.probes,
            probe_acks: self.probe_acks,
        }
    }
}

/// The active path with room in its window and its pacer and the lowest round trip
/// (unmeasured counts as the slowest), other than `avoid` when another qualifies.
pub(crate) fn best(paths: &[PathState], avoid: Option<usize>, now: Nanos) -> Option<usize> {
    let key = |p: &PathState| (if p.srtt == 0 { Nanos::MAX } else { p.srtt }, p.inflight);
    let pick = |skip: Option<usize>| {
        paths
            .iter()
            .enumerate()
            .filter(|(i, p)| p.sendable(now) && Some(*i) != skip)
            .min_by_key(|(_, p)| key(p))
            .map(|(i, _)| i)
    };
    pick(avoid).or_else(|| pick(None))
}

/// The earliest time a pacer lets an active path with room send again.
pub(crate) fn paced_until(paths: &[PathState], now: Nanos) -> Option<Nanos> {
    paths
        .iter()
        .filter(|p| p.status == PathStatus::Active && p.room())
        .filter_map(|p| p.paced_until(now))
        .min()
}
