//! Per-path state: status, round trip, window, probes, counters; and the choice of
//! path for the next packet.

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
    /// Since when a packet sent on this path waits for an acknowledgement with none
    /// come: set by a send with nothing in flight, moved by every acknowledgement of
    /// one of its packets (None: nothing waits).
    pub waiting_since: Option<Nanos>,
    /// The window was last cut for a packet sent before this time.
    pub cut_at: Nanos,
    /// Acknowledged packets since the window last grew (congestion avoidance).
    pub acked_since_grow: u32,
    /// Added to the reorder wait after losses that were not (RACK's reorder window
    /// grows on spurious retransmissions, RFC 8985 6.2); decays as packets are acked.
    pub reo_extra: Nanos,
    /// The window before the last cut (0: none to undo).
    pub prior_cwnd: u32,
    /// Losses in the current loss round, and when the last one was found.
    pub round_losses: u32,
    pub last_loss_at: Nanos,
    /// Probe outstanding: nonce and when sent.
    pub probe: Option<(u32, Nanos)>,
    /// The last probe sent, answered or not: a late answer is still a round trip.
    pub last_probe: (u32, Nanos),
    /// Round trips measured from data (then probes, which skip the data queues at the
    /// sender, no longer move the RTT).
    pub data_rtt: bool,
    /// Probes unanswered in a row.
    pub probe_misses: u8,
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
            waiting_since: None,
            cut_at: 0,
            acked_since_grow: 0,
            reo_extra: 0,
            prior_cwnd: 0,
            round_losses: 0,
            last_loss_at: 0,
            probe: None,
            last_probe: (0, 0),
            data_rtt: false,
            probe_misses: 0,
            probe_at: now,
            backoff: READMIT_FIRST_NS,
            alive_at: now,
            pkts: 0,
            bytes: 0,
            losses: 0,
            spurious: 0,
            retransmits: 0,
            state_changes: 0,
            probes: 0,
            probe_acks: 0,
        }
    }

    pub fn set_status(&mut self, s: PathStatus, now: Nanos) {
        if self.status != s {
            self.status = s;
            self.state_changes += 1;
            self.waiting_since = None;
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

    /// How long past its send time an unacknowledged packet on this path may be, with
    /// later ones acknowledged, before it counts as lost: its smoothed RTT plus the
    /// larger of four variations (queueing that grows), a quarter RTT (RACK's reorder
    /// window) and 100 µs; 1 ms before a measurement. Never less than `floor` (see
    /// [`reorder_floor`]).
    pub fn reorder_wait(&self, floor: Nanos) -> Nanos {
        if self.srtt == 0 {
            return floor.max(1_000_000) + self.reo_extra;
        }
        (self.srtt + (4 * self.rttvar).max(self.srtt / 4).max(100_000)).max(floor) + self.reo_extra
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
        self.waiting_since = (self.inflight > 0).then_some(now);
        self.reo_extra -= self.reo_extra / 256;
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
        if let Some(ctl) = self.cc.as_mut() {
            // The controller tells a full queue (round trip over its target) from a
            // lossy or cut link, and cuts at most once per round trip.
            ctl.on_congestion(now, Congestion::Loss);
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

    /// A packet taken for lost arrived after all: the losses were reordering or a slow
    /// ACK, not a full queue; the window cut they made is undone (TCP's undo, RFC 3522).
    pub fn on_spurious(&mut self) {
        self.spurious += 1;
        let step = (self.srtt / 4).max(100_000);
        self.reo_extra = (self.reo_extra + step).min((4 * self.srtt).max(4_000_000));
        if self.prior_cwnd > self.cwnd {
            self.cwnd = self.prior_cwnd;
        }
        self.prior_cwnd = 0;
    }

    /// A probe answer with this nonce.
    pub fn on_probe_ack(&mut self, nonce: u32, now: Nanos) -> bool {
        let (n, at) = self.last_probe;
        if n != nonce || at == 0 {
            return false;
        }
        if !self.data_rtt {
            // A probe jumps the queue of data at the sender (extension packets leave
            // first), so its round trip stands for the path only until data measures
            // it; but a responder sends no data, and its probe answers wait behind
            // the data it receives: their round trips set how long a probe may take.
            self.on_rtt(now.saturating_sub(at));
        }
        self.last_probe = (0, 0);
        self.alive_at = now;
        self.probe_acks += 1;
        if self.probe.is_none_or(|(p, _)| p != nonce) {
            // Answered after its time: a round trip, not yet a working path again.
            return false;
        }
        self.probe = None;
        self.probe_misses = 0;
        self.backoff = READMIT_FIRST_NS;
        true
    }

    /// After a probe was sent: when the next one is due.
    pub fn probe_sent(&mut self, nonce: u32, now: Nanos, keepalive: Nanos) {
        self.probe = Some((nonce, now));
        self.last_probe = (nonce, now);
        self.probes += 1;
        self.probe_at = match self.status {
            PathStatus::Failed => {
                let at = now + self.backoff;
                self.backoff = (self.backoff * 2).min(READMIT_MAX_NS);
                at
            }
            PathStatus::Probing => now + self.probe_timeout(),
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
        self.status == PathStatus::Active && self.room() && self.paced_until(now).is_none()
    }

    /// A packet of `bytes` left on this path at `now`.
    pub fn on_sent(&mut self, now: Nanos, bytes: u64) {
        // Nothing in flight: the path was idle (or all it had was found lost and it
        // was not chosen since); silence is timed from this packet.
        if self.waiting_since.is_none() || self.inflight == 0 {
            self.waiting_since = Some(now);
        }
        if let Some(rate) = self.cc.as_ref().and_then(|c| c.pacing_rate()) {
            self.pacer.on_sent(now, bytes, rate);
        }
    }

    /// When this path counts as silent: nothing it carried acknowledged for twice its
    /// reorder wait (RACK-TLP's probe timeout, RFC 8985 7.2) since a packet began to
    /// wait. A full queue that drops still lets most packets through, whose
    /// acknowledgements move `waiting_since`; a cut or black hole lets none.
    pub fn silent_at(&self, floor: Nanos) -> Option<Nanos> {
        Some(self.waiting_since? + 2 * self.reorder_wait(floor))
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
            state_changes: self.state_changes,
            probes: self.probes,
            probe_acks: self.probe_acks,
        }
    }
}

/// The least reorder wait of any path: the largest smoothed RTT of the active paths plus
/// a quarter. Why: every path of a QP leaves through the same host queues (socket
/// buffer, qdisc), and a path's own samples may be old or come from probes; a packet
/// is not taken for lost before the slowest working path could have delivered it.
pub(crate) fn reorder_floor(paths: &[PathState]) -> Nanos {
    let m = paths
        .iter()
        .filter(|p| p.status == PathStatus::Active)
        .map(|p| p.srtt)
        .max()
        .unwrap_or(0);
    m + m / 4
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
