//! Swift-style delay AIMD (see the module documentation of `cc` for the why).

use super::{CcStats, Congestion, CongestionControl, RttSample};
use crate::verbs::Nanos;

/// Tuning of `DelayAimd`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DelayAimdConfig {
    /// Window a QP starts with, bytes: four 4096-byte packets, which leave at once (no
    /// round trip is known to pace them by). A line-rate start as Swift's fills a
    /// shallow queue before the first round trip is known, and each round trip sampled
    /// then includes that burst.
    pub initial_window: u64,
    /// Least window, packets.
    pub min_window_pkts: u64,
    /// Least queueing delay allowed above the base round trip, ns: a software host's
    /// scheduling noise.
    pub min_queue_delay: Nanos,
    /// The queueing delay allowed above the base, as a fraction of the base.
    pub queue_delay_fraction: f64,
    /// Swift's flow scaling: the most queueing delay added to the target of a flow
    /// with the least window (none at the largest), so that a small flow grows while a
    /// large one sharing its bottleneck shrinks, and they converge to fair shares
    /// faster than AIMD alone makes them.
    pub flow_scaling_range: Nanos,
    /// Swift's β: how hard the window falls per unit of relative excess delay.
    pub beta: f64,
    /// Swift's max_mdf: the most one decrease takes, and what a loss takes.
    pub max_decrease: f64,
    /// Additive increase per round trip, packets.
    pub increase_pkts: f64,
    /// Slow start grows the window fourfold per round while it is under this many
    /// bytes at the round's start, and doubles it after (0: it only doubles). The
    /// initial window is small because it leaves as one burst; from the first round
    /// trip on the window is paced, and a small one can grow faster without a burst:
    /// what TCP's ten-segment initial window (90 KB at a 9000-byte MTU) gains in its
    /// first rounds. Doubling from 16 KiB took two more rounds of a mostly idle 10 ms
    /// path.
    pub early_growth_window: u64,
    /// How long the least round trip stays the base without being seen again, ns;
    /// then a base probe measures it again.
    pub min_rtt_window: Nanos,
    /// The wall clock (ns since the Unix epoch) when the engine's clock read 0: base
    /// probes are also taken at the points of a grid on the wall clock, where every
    /// flow on this host (and on hosts whose clocks agree to a round trip) probes at
    /// once. A probe drains only the prober's own share of a queue; a flow that began
    /// beside another's queue took it for part of its base, and only a probe of both
    /// at once shows it the base (LEDBAT++'s slowdowns, synchronized). Two flows whose
    /// bases were 11 and 277 µs split a 1 Gb/s link 0.41 / 0.58 for 10 s.
    pub wall_clock_at_zero: Nanos,
}

impl Default for DelayAimdConfig {
    fn default() -> Self {
        DelayAimdConfig {
            initial_window: 16 * 1024,
            min_window_pkts: 2,
            min_queue_delay: 2_000_000,
            queue_delay_fraction: 0.25,
            flow_scaling_range: 3_000_000,
            beta: 0.8,
            max_decrease: 0.5,
            increase_pkts: 1.0,
            early_growth_window: 256 * 1024,
            min_rtt_window: 10_000_000_000,
            wall_clock_at_zero: 0,
        }
    }
}

/// Rounds shorter than this are merged (one decision per round trip, and a loopback's
/// round trip of a few microseconds would otherwise decide on single samples).
const MIN_ROUND_NS: Nanos = 100_000;
/// The round trip per which additive increase adds `increase_pkts`.
const AI_RTT_UNIT: Nanos = 1_000_000;
/// The most packets in flight (the protocol's own window, `MAX_UNACKED_PSNS`).
const MAX_WINDOW_PKTS: u64 = 1024;
/// A probe that lowered the base is taken again this many round trips later.
const PROBE_AGAIN_ROUNDS: u64 = 16;
/// The least queueing delay that ends slow start, ns.
const SLOW_START_MIN_EXCESS: Nanos = 500_000;
/// Samples in a row over the slow-start limit that end it.
const SLOW_START_EXIT_SAMPLES: u32 = 3;
/// Probes on the wall-clock grid come about this many round trips apart, at least
/// `GRID_MIN_PERIOD` and at most `GRID_MAX_PERIOD` ns (rounded up to a power of two:
/// 134 ms to 4.3 s).
const GRID_ROUNDS: Nanos = 256;
const GRID_MIN_PERIOD: Nanos = 100_000_000;
const GRID_MAX_PERIOD: Nanos = 4_000_000_000;
/// A base probe holds the least window this many round trips (LEDBAT++'s slowdown:
/// long enough for the queue to drain while the other flows send at most the link's
/// rate, and for a packet sent after it to come back).
const PROBE_ROUNDS: u64 = 2;
/// Slow start's growth per round under `DelayAimdConfig::early_growth_window`.
const EARLY_GROWTH: f64 = 4.0;
/// The first probe comes this many round trips after slow start ends (LEDBAT++'s
/// initial slowdown), once the flows it displaced have given way.
const PROBE_AFTER_SLOW_START_ROUNDS: u64 = 2;

/// A base probe under way: the window held at its least so that the bottleneck's
/// queue drains and the base round trip is seen without it.
#[derive(Debug, Clone, Copy)]
struct Probe {
    start: Nanos,
    /// It lasts at least until then.
    until: Nanos,
    /// The window to go back to.
    restore: f64,
    /// When it goes back: once the queue has drained (`probe_pause`).
    restore_at: Nanos,
    /// The least round trip of a packet sent during the probe.
    min: Nanos,
    /// The base when it began.
    base: Nanos,
    /// The base expired: the probe's least sample replaces it if over `target` (a
    /// longer route is taken); otherwise (the first probe) it may only lower it.
    replace: bool,
    /// The target when it began.
    target: Nanos,
}

/// Delay AIMD state of one QP.
#[derive(Debug, Clone)]
pub(crate) struct DelayAimd {
    cfg: DelayAimdConfig,
    /// The unit of the window's packet counts (additive increase, flow scaling, the
    /// least window): the path MTU.
    mtu: u64,
    /// The largest packet the QP sends (more than `mtu` with larger packets agreed).
    /// `window_used` allows two of them of slack: the window check per packet leaves up
    /// to one packet of the window unused, and a slack counted in `mtu` would leave a
    /// window of larger packets unused, and never growing.
    packet: u64,
    /// Window, bytes (fractional for additive increase).
    cwnd: f64,
    slow_start: bool,
    srtt: Nanos,
    min_rtt: Nanos,
    /// When `min_rtt` was last seen (it expires after `min_rtt_window`).
    min_rtt_at: Nanos,
    /// The current round: when it began and its least sample.
    round_start: Nanos,
    round_min: Nanos,
    /// The window when the round began (slow start at most doubles it per round).
    round_cwnd: f64,
    /// Slow start after a timeout ends here.
    ssthresh: f64,
    /// The last decrease for loss (at most one per round trip).
    last_loss_cut: Option<Nanos>,
    /// A base probe under way.
    probe: Option<Probe>,
    /// When the first base probe is due (set as the first slow start ends).
    probe_at: Option<Nanos>,
    /// When the next probe on the wall-clock grid is due (see `grid_period`).
    grid_at: Option<Nanos>,
    /// The first slow start has ended (its probe is scheduled or done).
    slow_start_ended: bool,
    /// Samples in a row over the target during slow start.
    slow_start_over: u32,
    /// The most bytes in flight after a send in this round and in the one before.
    round_in_flight: u64,
    last_round_in_flight: u64,
    /// The window the path holds at the target, from the last sample that knew
    /// what was in flight with its packet (0: none yet): those bytes made that round
    /// trip, so the target's window is them scaled by the target over it (TCP Vegas's
    /// expected window, with the packet's own in-flight, not the window now).
    path_window: f64,
    /// When slow start last ended.
    slow_start_exit: Option<Nanos>,
    /// The caller reports bytes in flight (`on_sent`); without, the window counts as
    /// used (multipath's per-path controllers, which keep their own packet counts).
    tracks_in_flight: bool,
    stats: CcStats,
}

impl DelayAimd {
    pub fn new(cfg: DelayAimdConfig, mtu: u64) -> Self {
        let mtu = mtu.max(256);
        DelayAimd {
            cwnd: cfg.initial_window.max(mtu) as f64,
            cfg,
            mtu,
            packet: mtu,
            slow_start: true,
            srtt: 0,
            min_rtt: 0,
            min_rtt_at: 0,
            round_start: 0,
            round_min: Nanos::MAX,
            round_cwnd: cfg.initial_window.max(mtu) as f64,
            ssthresh: f64::INFINITY,
            last_loss_cut: None,
            probe: None,
            probe_at: None,
            grid_at: None,
            slow_start_ended: false,
            slow_start_over: 0,
            round_in_flight: 0,
            last_round_in_flight: 0,
            path_window: 0.0,
            slow_start_exit: None,
            tracks_in_flight: false,
            stats: CcStats::default(),
        }
    }

    /// The round trip above which the window shrinks: the base, a queue in proportion
    /// to it, and Swift's flow scaling (α/√cwnd + β, between the least and the largest
    /// window).
    fn target(&self) -> Nanos {
        let q = (self.min_rtt as f64 * self.cfg.queue_delay_fraction) as Nanos;
        let inv = |pkts: f64| 1.0 / pkts.max(1.0).sqrt();
        let (lo, hi) = (self.cfg.min_window_pkts as f64, MAX_WINDOW_PKTS as f64);
        let w = self.cwnd / self.mtu as f64;
        let scale = ((inv(w) - inv(hi)) / (inv(lo) - inv(hi))).clamp(0.0, 1.0);
        let fs = (scale * self.cfg.flow_scaling_range as f64) as Nanos;
        self.min_rtt + q.max(self.cfg.min_queue_delay) + fs
    }

    /// The round trip over which slow start ends: an eighth of the base over it (at
    /// least 0.5 ms of scheduling noise), lower than the target. A window that doubles
    /// per round trip overshoots by what is acknowledged while the first late samples
    /// come back; ending at the target overflowed a 5 ms token bucket on a 10 ms path.
    fn slow_start_limit(&self) -> Nanos {
        self.min_rtt + (self.min_rtt / 8).max(SLOW_START_MIN_EXCESS)
    }

    fn clamp(&mut self) {
        let lo = (self.cfg.min_window_pkts.max(1) * self.mtu) as f64;
        let hi = (MAX_WINDOW_PKTS * self.mtu) as f64;
        self.cwnd = self.cwnd.clamp(lo, hi);
    }

    fn sample(&mut self, now: Nanos, rtt: Nanos) {
        let rtt = rtt.max(1);
        self.srtt = crate::timers::rtt_update(self.srtt, rtt);
        if self.min_rtt == 0 || rtt <= self.min_rtt {
            self.min_rtt = rtt;
            self.min_rtt_at = now;
        }
        self.round_min = self.round_min.min(rtt);
    }

    /// The period of the probe grid: a power of two nanoseconds, about
    /// `GRID_ROUNDS` smoothed round trips (flows sharing a queue share its round trip,
    /// and periods that differ by powers of two still meet at the longer one's points).
    fn grid_period(&self) -> Nanos {
        (GRID_ROUNDS * self.srtt)
            .clamp(GRID_MIN_PERIOD, GRID_MAX_PERIOD)
            .next_power_of_two()
    }

    /// The first point of the probe grid after `now`, on the engine's clock.
    fn next_grid(&self, now: Nanos) -> Nanos {
        let period = self.grid_period();
        let wall = now.saturating_add(self.cfg.wall_clock_at_zero);
        (wall / period + 1) * period - self.cfg.wall_clock_at_zero
    }

    /// Whether a base probe is due: the first, some rounds after the first slow start;
    /// then whenever the base has not been seen again for `min_rtt_window` (taking
    /// the samples of a standing queue for the new base instead, the base would climb
    /// with every expiry: LEDBAT's latency drift).
    fn probe_due(&self, now: Nanos) -> bool {
        self.probe.is_none()
            && !self.slow_start
            && (self.probe_at.is_some_and(|t| now >= t)
                || (self.grid_at.is_some_and(|t| now >= t) && self.window_used())
                || now.saturating_sub(self.min_rtt_at) > self.cfg.min_rtt_window)
    }

    /// The window falls to its least until the queue has drained (see `probe_pause`).
    fn start_probe(&mut self, now: Nanos) {
        let rounds = PROBE_ROUNDS * self.srtt.max(MIN_ROUND_NS);
        let restore_at = now + self.probe_pause(now);
        self.probe = Some(Probe {
            start: now,
            until: (restore_at + self.srtt).min(now + rounds),
            restore: self.cwnd,
            restore_at,
            min: Nanos::MAX,
            base: self.min_rtt,
            replace: now.saturating_sub(self.min_rtt_at) > self.cfg.min_rtt_window,
            target: self.target(),
        });
        self.probe_at = None;
        if self.grid_at.is_some() {
            self.grid_at = Some(self.next_grid(now));
        }
        self.cwnd = 0.0;
        self.clamp();
        self.stats.base_probes += 1;
    }

    /// How long a probe holds the least window. On the wall-clock grid every flow
    /// pauses at once, so the time the standing queue takes to drain (the smoothed round
    /// trip over the base), a quarter more and a margin of scheduling noise will do: a
    /// packet sent after it finds the bottleneck empty wherever it is, as what was sent
    /// before reaches it ahead and has left it by then. Holding instead until the window
    /// came back (a round trip and more) left a 10 ms path idle for 20 ms per probe.
    /// The first probe and one taken again are the prober's alone, and its base may hold
    /// the queue other flows keep (up to their least allowance and flow scaling): it
    /// holds back that much longer, at most for the round trip its window takes to come
    /// back (with the grid's pause, a late starter took 0.98 of the link in simulation).
    fn probe_pause(&self, now: Nanos) -> Nanos {
        let queue = self.srtt.saturating_sub(self.min_rtt);
        let drain = queue + queue / 4 + self.cfg.min_queue_delay / 4;
        if self.probe_at.is_some_and(|t| now >= t) {
            let others = self.cfg.min_queue_delay + self.cfg.flow_scaling_range;
            return (drain + others).min(self.srtt + self.srtt / 4);
        }
        drain
    }

    /// A sample during a probe; at its end the window is restored (paced, so it
    /// does not leave as a burst) and the probe's least sample is the base.
    fn probe_sample(&mut self, now: Nanos, rtt: Option<Nanos>) {
        let Some(mut p) = self.probe else {
            return;
        };
        // Only a packet sent during the probe saw the drained queue.
        if let Some(rtt) = rtt.filter(|&r| r <= now.saturating_sub(p.start)) {
            p.min = p.min.min(rtt.max(1));
        }
        self.probe = Some(p);
        self.restore_after_pause(now);
        // At most twice as long when no packet of its own came back (losses).
        let long = p.until + 2 * (p.until - p.start);
        if now < p.until || (p.min == Nanos::MAX && now < long) {
            return;
        }
        // After a probe that found a base lower by more than scheduling noise, probe
        // again a few rounds on: the flows holding the queue may not have given way
        // fully yet (a window-based flow whose window is over the path's
        // bandwidth-delay product keeps a queue by itself), until the base stays. One
        // that found the base where it was needs no second (a flow alone on its path).
        let noise = self.cfg.min_queue_delay / 4;
        if p.min != Nanos::MAX && p.min + noise < p.base {
            self.probe_at = Some(now + PROBE_AGAIN_ROUNDS * self.srtt.max(MIN_ROUND_NS));
        }
        // An expired base is replaced by a higher one only past the old target: other
        // delay-based flows hold the queue under their targets and do not drain it for
        // the probe, so a least sample under it may be their queue, and taking it
        // raised the base at each expiry (LEDBAT's latency drift). A longer route by
        // less than the allowance keeps the old base: a little less queue, not more.
        let longer_route = p.replace && p.min > p.target;
        if p.min != Nanos::MAX && (longer_route || p.min < self.min_rtt) {
            self.min_rtt = p.min;
        }
        // An expired base is kept for another window even when nothing came back to
        // measure it by. Other probes refresh it only by seeing it (`sample`): the
        // grid's would otherwise keep a base they never saw from ever expiring.
        if p.replace {
            self.min_rtt_at = now;
        }
        self.end_probe(now);
    }

    /// The window goes back once the queue has drained: the first packets sent then
    /// lead the drained queue and measure the base; what follows them queues behind
    /// and cannot delay them. Held at the least until the samples were back, the path
    /// stood empty for three round trips.
    fn restore_after_pause(&mut self, now: Nanos) {
        if let Some(p) = self
            .probe
            .filter(|p| now >= p.restore_at && self.cwnd < p.restore)
        {
            self.cwnd = p.restore;
            self.clamp();
        }
    }

    fn end_probe(&mut self, now: Nanos) {
        if let Some(p) = self.probe.take() {
            self.cwnd = p.restore;
            self.clamp();
            self.new_round(now);
        }
    }

    /// Slow start ended at `now`: the first time, the first base probe is scheduled.
    fn left_slow_start(&mut self, now: Nanos) {
        if self.slow_start {
            self.slow_start_exit = Some(now);
        }
        self.slow_start = false;
        self.slow_start_over = 0;
        if !self.slow_start_ended {
            self.slow_start_ended = true;
            let wait = PROBE_AFTER_SLOW_START_ROUNDS * self.srtt.max(MIN_ROUND_NS);
            self.probe_at = Some(now + wait);
            self.grid_at = Some(self.next_grid(now + wait));
        }
    }

    /// A sample during slow start: it ends as soon as the queue shows, not at the end
    /// of the round: on a long path the window doubles in the time a round's samples
    /// take to come back, and waiting for the round overshot a 7 ms token bucket queue
    /// fourfold. A few samples in a row, as HyStart++ (RFC 9406) takes several, so that
    /// one late ACK does not end it.
    fn slow_start_sample(&mut self, now: Nanos, rtt: Nanos) {
        self.slow_start_over = if rtt > self.slow_start_limit() {
            self.slow_start_over + 1
        } else {
            0
        };
        if self.slow_start_over >= SLOW_START_EXIT_SAMPLES {
            self.left_slow_start(now);
        }
    }

    /// Once per round trip: grow or shrink by the round's least sample.
    fn end_round(&mut self, now: Nanos) {
        let standing = self.round_min;
        let target = self.target();
        if standing <= target {
            // Slow start grew by what was acknowledged during the round (at most a
            // doubling). Additive increase grows with the smoothed round trip (one
            // packet per millisecond of it; flows sharing a queue share that), so a
            // long path regains its window in about the time a short one does: TCP's
            // one packet per round trip took seconds at 10 ms.
            if !self.slow_start && self.window_used() {
                let rtt_ms = (self.srtt as f64 / AI_RTT_UNIT as f64).max(1.0);
                self.cwnd += self.cfg.increase_pkts * rtt_ms * self.mtu as f64;
            }
        } else {
            self.left_slow_start(now);
            let excess = (standing - target) as f64 / standing as f64;
            let cut = (self.cfg.beta * excess).min(self.cfg.max_decrease);
            self.cwnd *= 1.0 - cut;
            self.stats.delay_decreases += 1;
        }
        self.clamp();
        self.new_round(now);
    }

    /// A round begins at `now` (after a decision, a cut or a probe).
    fn new_round(&mut self, now: Nanos) {
        self.round_start = now;
        self.round_min = Nanos::MAX;
        self.round_cwnd = self.cwnd;
        self.last_round_in_flight = self.round_in_flight;
        self.round_in_flight = 0;
    }

    /// Whether the window was used: bytes in flight reached it (within two packets, what
    /// the window check per packet leaves) in the round ending now; in slow start half of
    /// it since the round before (RFC 7661's "validated" window; Linux's
    /// tcp_is_cwnd_limited takes the same half in slow start). A sender that did not fill
    /// its window (descheduled, CPU-bound, between the application's bursts) learns
    /// nothing from an empty queue about a larger one: grown through a 150 ms stall
    /// on a 10 ms path, the window reached 1.7 times the path's, and the burst after the
    /// stall overflowed its token bucket.
    fn window_used(&self) -> bool {
        if !self.tracks_in_flight {
            return true;
        }
        let slack = 2 * self.packet;
        if self.slow_start {
            let seen = self.round_in_flight.max(self.last_round_in_flight);
            2 * seen + slack >= self.cwnd as u64
        } else {
            self.round_in_flight + slack >= self.cwnd as u64
        }
    }
}

impl CongestionControl for DelayAimd {
    fn on_ack(&mut self, now: Nanos, acked: u64, rtt: Option<RttSample>) {
        if self.slow_start && self.window_used() {
            let g = if self.round_cwnd < self.cfg.early_growth_window as f64 {
                EARLY_GROWTH
            } else {
                2.0
            };
            self.cwnd = (self.cwnd + (g - 1.0) * acked as f64).min(g * self.round_cwnd);
            self.clamp();
            if self.cwnd >= self.ssthresh {
                self.slow_start = false;
            }
        }
        let sample = match rtt {
            Some(RttSample {
                rtt,
                app_limited: true,
                ..
            }) => {
                // An application-limited flow cannot have built the queue its sample
                // would show, and the sample may hold the peer's host delay (see
                // `RttSample`): it may only lower the base. Taken as queueing, a
                // ping-pong whose peer answered late cut its window and paced at a
                // round trip of the peer's scheduling.
                if rtt > 0 && rtt < self.min_rtt {
                    self.min_rtt = rtt;
                    self.min_rtt_at = now;
                }
                None
            }
            Some(s) => {
                if s.in_flight > 0 {
                    let rtt = s.rtt.max(1) as f64;
                    self.path_window = s.in_flight as f64 * self.target() as f64 / rtt;
                }
                Some(s.rtt)
            }
            None => None,
        };
        if let Some(rtt) = sample {
            self.sample(now, rtt);
            if self.slow_start {
                self.slow_start_sample(now, rtt);
            }
        }
        // A probe keeps its time on every ACK, sampled or not: a loss found as it
        // began leaves nothing sampled until the repair is done, and go-back-N at the
        // probe's least window repaired a 2 MB window at 5 Mb/s for 400 ms.
        if self.probe.is_some() {
            self.probe_sample(now, sample);
            return;
        }
        if sample.is_none() {
            return;
        }
        if self.probe_due(now) {
            self.start_probe(now);
            return;
        }
        if now.saturating_sub(self.round_start) >= self.srtt.max(MIN_ROUND_NS) {
            self.end_round(now);
        }
    }

    fn on_congestion(&mut self, now: Nanos, what: Congestion) {
        // A loss with the round trip under the target found no queue: not congestion
        // but a lossy link (a radio hop, a bad cable, the fault tests' 1 %), where
        // halving at each loss left a third of the throughput. A full queue that drops
        // has the round trip far over the target (TCP Veno's distinction, by delay).
        if self.min_rtt > 0 && self.srtt <= self.target() {
            self.stats.random_losses += 1;
            return;
        }
        // The probe drained nothing if the queue overflowed: back to the window it
        // held, which the loss now cuts, and probe again a little later (a base that
        // expired stays due anyway).
        if self.probe.is_some() {
            self.end_probe(now);
            let wait = PROBE_AFTER_SLOW_START_ROUNDS * self.srtt.max(MIN_ROUND_NS);
            self.probe_at = Some(now + wait);
        }
        self.left_slow_start(now);
        match what {
            Congestion::Loss => {
                let recent = self
                    .last_loss_cut
                    .is_some_and(|t| now.saturating_sub(t) < self.srtt.max(MIN_ROUND_NS));
                if recent {
                    return;
                }
                // The window falls to what the path holds without its queue (the base
                // over the smoothed round trip: the queue that overflowed drains, and a
                // long path stays full, as TCP's β of 0.7 keeps it), by at most
                // `max_decrease`. Halving left a 10 ms path below its bandwidth-delay
                // product for a hundred round trips after each loss.
                let drain = self.min_rtt as f64 / self.srtt.max(1) as f64;
                // A loss within two round trips of leaving slow start is its overshoot:
                // a window that doubles per round trip is twice the path's by the time
                // a queue shows, and the drain (0.66 on a 10 ms path with a 5 ms token
                // bucket) left it over the path's, so it overflowed the bucket again
                // while go-back-N repaired the first loss. It falls to the path's window
                // instead.
                let overshoot = self
                    .slow_start_exit
                    .is_some_and(|t| now.saturating_sub(t) < 2 * self.srtt);
                self.cwnd = if overshoot && self.path_window > 0.0 {
                    self.cwnd.min(self.path_window)
                } else {
                    self.cwnd * drain.clamp(1.0 - self.cfg.max_decrease, 1.0)
                };
                self.stats.loss_decreases += 1;
            }
            Congestion::Timeout => {
                // Nothing came back for a whole timeout: start low again (Swift sets
                // the least window on a retransmit timeout), and slow start back to
                // half the window (TCP's ssthresh, RFC 5681).
                self.ssthresh = self.cwnd / 2.0;
                self.cwnd = 0.0;
                self.slow_start = true;
                self.stats.timeouts += 1;
            }
        }
        self.last_loss_cut = Some(now);
        self.clamp();
        // The samples of this round predate the cut.
        self.new_round(now);
    }

    fn on_sent(&mut self, in_flight: u64) {
        self.tracks_in_flight = true;
        self.round_in_flight = self.round_in_flight.max(in_flight);
    }

    fn set_packet_bytes(&mut self, bytes: u64) {
        self.packet = bytes.max(self.mtu);
    }

    fn on_time(&mut self, now: Nanos) {
        self.restore_after_pause(now);
    }

    fn wake_at(&self) -> Option<Nanos> {
        self.probe
            .filter(|p| self.cwnd < p.restore)
            .map(|p| p.restore_at)
    }

    fn window(&self) -> u64 {
        self.cwnd as u64
    }

    fn pacing_rate(&self) -> Option<u64> {
        if self.srtt == 0 {
            return None;
        }
        let gain = if self.slow_start { 2.0 } else { 1.25 };
        Some((gain * self.cwnd * 1e9 / self.srtt as f64) as u64)
    }

    fn in_slow_start(&self) -> bool {
        self.slow_start
    }

    fn stats(&self) -> CcStats {
        CcStats {
            window: self.window(),
            rate: self.pacing_rate().unwrap_or(0),
            srtt: self.srtt,
            min_rtt: self.min_rtt,
            target: if self.min_rtt > 0 { self.target() } else { 0 },
            slow_start: self.slow_start,
            ..self.stats
        }
    }

    fn counters(&self) -> CcStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u64 = 4096;

    /// A sample of a flow with more to send.
    fn busy(rtt: Nanos) -> Option<RttSample> {
        Some(RttSample {
            rtt,
            app_limited: false,
            in_flight: 0,
        })
    }

    fn run_rounds(c: &mut DelayAimd, from: Nanos, rounds: u64, rtt: Nanos) -> Nanos {
        let mut now = from;
        for _ in 0..rounds {
            now += rtt.max(MIN_ROUND_NS);
            // The whole window sent and acknowledged in the round.
            c.on_sent(c.window());
            c.on_ack(now, c.window(), busy(rtt));
        }
        now
    }

    #[test]
    fn a_window_of_larger_packets_than_it_began_with_grows_when_full() {
        // Made when the first message left in 4096-byte packets; then the peer agreed
        // to 8704. A window filled to its last whole packet is used, whatever the
        // remainder under one packet.
        let jumbo = 8704;
        let mut c = DelayAimd::new(DelayAimdConfig::default(), MTU);
        c.set_packet_bytes(jumbo);
        let mut now = run_rounds(&mut c, 0, 3, 10_000_000);
        c.left_slow_start(now);
        c.cwnd = (91 * jumbo + 8400) as f64;
        c.probe_at = None;
        c.grid_at = None;
        let before = c.window();
        for _ in 0..5 {
            now += 10_000_000;
            let full = c.window() / jumbo * jumbo;
            c.on_sent(full);
            c.on_ack(now, full, busy(10_000_000));
        }
        assert!(
            c.window() > before + 10 * jumbo,
            "{} from {before}",
            c.window()
        );
    }

    #[test]
    fn slow_start_doubles_until_the_delay_passes_the_target() {
        let mut c = DelayAimd::new(DelayAimdConfig::default(), MTU);
        let w0 = c.window();
        let now = run_rounds(&mut c, 0, 3, 200_000);
        assert!(c.window() >= 4 * w0, "{} vs {w0}", c.window());
        assert!(c.stats().slow_start);
        // 200 µs base: the target is 200 + max(2000, 50) µs, plus flow scaling for
        // this window of 32 packets.
        let target = c.stats().target;
        assert!((2_200_000..3_200_000).contains(&target), "{target}");
        let before = c.window();
        // A round whose least sample is 5.6 ms (nothing more acknowledged in it).
        c.on_ack(now + 5_600_000, 0, busy(5_600_000));
        assert!(!c.stats().slow_start);
        // The relative excess times β 0.8.
        let cut = 0.8 * (5_600_000 - target) as f64 / 5_600_000.0;
        let expect = before as f64 * (1.0 - cut);
        assert!((c.window() as f64 - expect).abs() < 2.0, "{}", c.window());
        assert_eq!(c.stats().delay_decreases, 1);
    }

    #[test]
    fn loss_cuts_only_with_a_queue_and_once_per_round() {
        let mut c = DelayAimd::new(DelayAimdConfig::default(), MTU);
        run_rounds(&mut c, 0, 6, 200_000);
        // Under the target: a lossy link, not a full queue.
        let w0 = c.window();
        c.on_congestion(1_000_000, Congestion::Loss);
        assert_eq!(c.window(), w0);
        assert_eq!(c.stats().random_losses, 1);
        // A standing queue far over the target: losses are congestion.
        let now = run_rounds(&mut c, 1_000_000, 20, 20_000_000);
        c.on_congestion(now, Congestion::Loss);
        assert_eq!(c.stats().loss_decreases, 1);
        c.on_congestion(now + 100, Congestion::Loss);
        assert_eq!(
            c.stats().loss_decreases,
            1,
            "a second loss in the same round trip"
        );
        c.on_congestion(now + 200, Congestion::Timeout);
        assert_eq!(c.window(), 2 * MTU);
        assert_eq!(c.stats().loss_decreases, 1);
        assert_eq!(c.stats().timeouts, 1);
    }

    #[test]
    fn the_window_stays_within_its_bounds_and_paces_by_the_round_trip() {
        let mut c = DelayAimd::new(DelayAimdConfig::default(), MTU);
        assert_eq!(c.pacing_rate(), None);
        run_rounds(&mut c, 0, 40, 100_000);
        assert_eq!(c.window(), MAX_WINDOW_PKTS * MTU);
        run_rounds(&mut c, 10_000_000, 100, 50_000_000);
        assert_eq!(c.window(), 2 * MTU);
        assert!(c.pacing_rate().is_some_and(|r| r > 0));
    }

    #[test]
    fn an_application_limited_sample_only_lowers_the_base() {
        let mut c = DelayAimd::new(DelayAimdConfig::default(), MTU);
        let now = run_rounds(&mut c, 0, 6, 200_000);
        let before = c.stats();
        // A ping-pong's message whose ACK the peer held for 30 ms.
        let late = Some(RttSample {
            rtt: 30_000_000,
            app_limited: true,
            in_flight: 0,
        });
        c.on_ack(now + 30_000_000, MTU, late);
        let after = c.stats();
        assert_eq!(after.srtt, before.srtt);
        assert_eq!(after.delay_decreases, 0);
        assert!(after.window >= before.window);
        // One under the base lowers it.
        let fast = Some(RttSample {
            rtt: 150_000,
            app_limited: true,
            in_flight: 0,
        });
        c.on_ack(now + 30_200_000, MTU, fast);
        assert_eq!(c.stats().min_rtt, 150_000);
        assert_eq!(c.stats().srtt, before.srtt);
    }

    /// A flow that starts while another's queue stands takes it for part of its base;
    /// two round trips after slow start, a probe holds the least window and the round
    /// trip of a packet sent then (the queue drained) lowers the base.
    #[test]
    fn a_base_probe_after_slow_start_sees_the_base_without_the_queue() {
        let mut c = DelayAimd::new(DelayAimdConfig::default(), MTU);
        // Every sample 3 ms: 1 ms of path and 2 ms of another flow's queue.
        let now = run_rounds(&mut c, 0, 8, 3_000_000);
        assert_eq!(c.stats().min_rtt, 3_000_000);
        // The queue grows past the target: slow start ends at the third sample.
        let mut t = now;
        for _ in 0..SLOW_START_EXIT_SAMPLES {
            t += 100_000;
            c.on_ack(t, MTU, busy(6_000_000));
        }
        assert!(!c.stats().slow_start);
        assert_eq!(c.stats().base_probes, 0);
        let before = c.window();
        // Two round trips later, the next sample starts the probe.
        t += 2 * c.stats().srtt;
        c.on_ack(t, MTU, busy(6_000_000));
        assert_eq!(c.stats().base_probes, 1);
        assert_eq!(c.window(), 2 * MTU);
        // A packet sent before the probe says nothing of the drained queue.
        c.on_ack(t + 500_000, MTU, busy(5_000_000));
        assert_eq!(c.stats().min_rtt, 3_000_000);
        // One sent during it, after the queue drained, does; at its end the window
        // is back.
        let srtt = c.stats().srtt;
        c.on_ack(t + 2 * srtt, MTU, busy(1_000_000));
        assert_eq!(c.stats().min_rtt, 1_000_000);
        assert_eq!(c.window(), before);
        assert_eq!(c.stats().base_probes, 1);
        // It lowered the base by more than noise: another probe comes later.
        let t2 = t + 2 * srtt + 17 * c.stats().srtt;
        c.on_ack(t2, MTU, busy(1_000_000));
        assert_eq!(c.stats().base_probes, 2);
    }

    /// A loss right after slow start is its overshoot: the window falls to what the
    /// path holds at the target (the last sample's in-flight scaled by the target over
    /// its round trip), not by the base over the round trip; a later loss drains.
    #[test]
    fn a_slow_start_overshoot_falls_to_the_path_window() {
        let mut c = DelayAimd::new(DelayAimdConfig::default(), MTU);
        // A 10 ms path: slow start doubles the window to 512 packets.
        let mut now = run_rounds(&mut c, 0, 7, 10_000_000);
        assert!(c.stats().slow_start);
        // A queue shows and grows to 5 ms: 460 packets in flight with each sampled
        // packet made 15 ms.
        let queue = |rtt: Nanos| RttSample {
            rtt,
            app_limited: false,
            in_flight: 460 * MTU,
        };
        for _ in 0..SLOW_START_EXIT_SAMPLES {
            now += 100_000;
            c.on_ack(now, MTU, Some(queue(12_000_000)));
        }
        assert!(!c.stats().slow_start);
        for _ in 0..20 {
            now += 100_000;
            c.on_ack(now, MTU, Some(queue(15_000_000)));
        }
        let (before, target) = (c.window(), c.stats().target);
        assert!(before > 500 * MTU, "{before}");
        // The overshoot is lost.
        c.on_congestion(now, Congestion::Loss);
        let path = 460.0 * MTU as f64 * target as f64 / 15_000_000.0;
        assert!(
            (c.window() as f64 - path).abs() < MTU as f64,
            "{}",
            c.window()
        );
        assert_eq!(c.stats().loss_decreases, 1);
        // Much later, with a standing queue: the drain (base over the smoothed round
        // trip) cuts, not the path's window.
        now = run_rounds(&mut c, now, 20, 14_000_000);
        let (w, s) = (c.window() as f64, c.stats());
        assert!(w > 16.0 * MTU as f64, "{w}");
        c.on_congestion(now, Congestion::Loss);
        let drain = s.min_rtt as f64 / s.srtt as f64;
        let expect = w * drain.max(0.5);
        assert!((c.window() as f64 - expect).abs() < 2.0, "{}", c.window());
    }

    /// A probe on the grid holds the least window only while the standing queue
    /// drains (a quarter more and a margin), not for the round trip its window takes to
    /// come back; the first probe after slow start holds it longer, for the queue other
    /// flows may keep.
    #[test]
    fn a_probe_on_the_grid_holds_back_only_while_the_queue_drains() {
        let mut c = DelayAimd::new(DelayAimdConfig::default(), MTU);
        // A 10 ms path with 2 ms of its own queue: slow start ends, the window stays.
        let mut now = run_rounds(&mut c, 0, 8, 10_000_000);
        let rtt = 12_000_000;
        let probe = |c: &mut DelayAimd, now: &mut Nanos| loop {
            *now += 100_000;
            let before = c.stats().base_probes;
            c.on_sent(c.window());
            c.on_ack(*now, MTU, busy(rtt));
            if c.stats().base_probes > before {
                return (*now, c.stats().srtt);
            }
        };
        // ACKs come until the window is back: how long it was held since `start`.
        let held = |c: &mut DelayAimd, now: &mut Nanos, start: Nanos| {
            while c.window() == 2 * MTU {
                *now += 100_000;
                c.on_ack(*now, MTU, busy(rtt));
            }
            *now - start
        };
        // The first holds back longer: its base may hold other flows' queue.
        let (start, srtt) = probe(&mut c, &mut now);
        let first = held(&mut c, &mut now, start);
        let cfg = DelayAimdConfig::default();
        let others = cfg.min_queue_delay + cfg.flow_scaling_range;
        assert!(first >= others, "{first} for srtt {srtt}");
        assert!(
            first <= srtt + srtt / 4 + 100_000,
            "{first} for srtt {srtt}"
        );
        // A probe on the grid: its window goes back on time, with no ACK to say so
        // (the QP's timer asks), once the queue has drained.
        let (start, srtt) = probe(&mut c, &mut now);
        let wake = c.wake_at().expect("held back");
        let queue = srtt - c.stats().min_rtt;
        let most = queue + queue / 4 + DelayAimdConfig::default().min_queue_delay / 4;
        assert!(wake - start <= most, "{} for srtt {srtt}", wake - start);
        assert!(wake - start < srtt / 2, "{} for srtt {srtt}", wake - start);
        c.on_time(wake - 1);
        assert_eq!(c.window(), 2 * MTU);
        c.on_time(wake);
        assert!(c.window() > 2 * MTU);
        assert_eq!(c.wake_at(), None);
    }

    /// Flows on one host (engines whose clocks began at different times) take their
    /// periodic base probes at the same wall-clock times, on the points of a grid whose
    /// period is a power of two nanoseconds.
    #[test]
    fn flows_with_different_clocks_probe_at_the_same_wall_clock_times() {
        let wall0: Nanos = 1_764_000_000_123_456_789;
        let mut starts = Vec::new();
        for offset in [0, 300_000_000, 777_777_777] {
            let cfg = DelayAimdConfig {
                wall_clock_at_zero: wall0 + offset,
                ..DelayAimdConfig::default()
            };
            let mut c = DelayAimd::new(cfg, MTU);
            // A 1 ms path; then a standing 1 ms queue, under the target: slow start
            // ends, the window stays.
            let mut now = run_rounds(&mut c, 0, 8, 1_000_000);
            let mut probes = Vec::new();
            while now < 4_000_000_000 {
                now += 100_000;
                let before = c.stats().base_probes;
                c.on_sent(c.window());
                c.on_ack(now, MTU, busy(2_000_000));
                if c.stats().base_probes > before {
                    probes.push(now + cfg.wall_clock_at_zero);
                }
            }
            // The first comes two round trips after slow start, the rest on the grid
            // (within the 100 µs between samples).
            let period = (GRID_ROUNDS * 2_000_000).next_power_of_two();
            assert!(probes.len() >= 5, "{probes:?}");
            assert!(
                probes[1..].iter().all(|p| p % period <= 100_000),
                "{probes:?}"
            );
            let points: Vec<Nanos> = probes[1..]
                .iter()
                .filter(|&&p| (wall0 + 1_100_000_000..wall0 + 3_900_000_000).contains(&p))
                .map(|p| p / period)
                .collect();
            starts.push(points);
        }
        assert_eq!(starts[0].len(), 5);
        assert_eq!(starts[0], starts[1]);
        assert_eq!(starts[0], starts[2]);
    }

    /// A base not seen again for `min_rtt_window` is measured again by a probe, not
    /// replaced by the samples of a standing queue (LEDBAT's latency drift), only by
    /// a route longer than the target.
    #[test]
    fn an_expired_base_is_probed_not_taken_from_the_queue() {
        let cfg = DelayAimdConfig::default();
        let mut c = DelayAimd::new(cfg, MTU);
        let mut now = run_rounds(&mut c, 0, 8, 1_000_000);
        // Slow start ends, then the first probe comes and goes at the same base.
        for _ in 0..200 {
            now += 1_000_000;
            c.on_ack(now, MTU, busy(4_000_000));
            if c.stats().base_probes == 1 && c.window() > 2 * MTU {
                break;
            }
            if c.stats().base_probes == 1 {
                c.on_ack(now + 10, MTU, busy(1_000_000));
            }
        }
        assert_eq!(c.stats().base_probes, 1);
        assert_eq!(c.stats().min_rtt, 1_000_000);
        // The first probe found the base where it was: no second one. 10 s of a standing
        // queue (3 ms over the base, other flows hold it): no probe, the base stays.
        let end = now + cfg.min_rtt_window - 3_000_000;
        while now + 3_000_000 < end {
            now += 3_000_000;
            c.on_ack(now, MTU, busy(3_500_000));
        }
        assert_eq!(c.stats().min_rtt, 1_000_000);
        assert_eq!(c.stats().base_probes, 1);
        // Past the window: a probe; the other flows do not drain their queue for it,
        // and its least sample, under the old target, leaves the base where it was.
        now += 10_000_000;
        c.on_ack(now, MTU, busy(3_500_000));
        assert_eq!(c.stats().base_probes, 2);
        assert_eq!(c.window(), 2 * MTU);
        now += 10_000_000;
        c.on_ack(now, MTU, busy(2_100_000));
        assert_eq!(c.stats().min_rtt, 1_000_000, "kept: maybe another's queue");
        assert!(c.window() > 2 * MTU);
        // A route longer by more than the whole allowance: the next expiry's probe
        // sees nothing under 9 ms, and that is the base.
        let end = now + cfg.min_rtt_window + 3_000_000;
        while now < end {
            now += 9_000_000;
            c.on_ack(now, MTU, busy(9_500_000));
        }
        now += 20_000_000;
        c.on_ack(now, MTU, busy(9_000_000));
        assert_eq!(
            c.stats().min_rtt,
            9_000_000,
            "replaced by the probe's least"
        );
    }
}
