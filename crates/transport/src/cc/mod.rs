//! Congestion control: how much an RC QP may have in flight, and how fast it sends.
//!
//! # Design
//!
//! softhca runs over ordinary IP networks: a 1 GbE link, a container bridge, a VPN, a
//! token bucket on a veth. Those drop when full and mark nothing (no ECN-marking qdisc
//! here), and the peer may be kernel rxe, whose packets must stay bit-exact and which
//! echoes no timestamp. So the sender alone decides, from what it sees itself:
//!
//! - **delay**: the round trip from its own send time of an ACK-requesting packet to
//!   the ACK (or READ response) that covers its PSN (`RttSampler`; Karn: nothing
//!   retransmitted is sampled);
//! - **loss**: a PSN sequence NAK, a gap in READ responses, a retransmit timeout.
//!
//! Nothing sent while a retransmission is under way is sampled: its ACK moves the
//! oldest unacknowledged PSN only once the hole before it is filled.
//!
//! The algorithm (`DelayAimd`) is Swift's (Kumar et al., SIGCOMM 2020; the congestion
//! control of Google's Falcon): additive increase while the delay is under a target,
//! a multiplicative decrease proportional to the excess above it at most once per round
//! trip, and a fixed decrease on loss. What differs, and why:
//!
//! - The target is scaled to the path, not to a fabric's hop count: the least round
//!   trip seen (the base) plus a queueing allowance of a quarter of the base, at least
//!   [`DelayAimdConfig::min_queue_delay`] (2 ms: a software host's scheduling noise, which
//!   a datacenter NIC's timestamps do not have), plus Swift's flow scaling (a larger
//!   target for a smaller window, so flows sharing a queue converge to equal shares).
//! - The delay signal is the least sample of a round trip, not each sample: a
//!   descheduled receiver or a coalesced ACK inflates single samples, the standing
//!   queue inflates all of them (Copa's "standing RTT").
//! - A sample of a packet after which the application had posted nothing more (a
//!   ping-pong's every message) only lowers the base: its ACK may wait on the peer's
//!   host (an ACK held for the application's answer, a descheduled process), and an
//!   application-limited flow cannot build a queue (BBR's app-limited samples; RFC
//!   7661 does not grow a window such a flow does not use). Taken as queueing, the peer's
//!   late answers of an MPI ping-pong cut the window and paced it at their round trip.
//! - Slow start (by what is acknowledged, at most fourfold per round under 256 KiB and
//!   doubling above, paced from the first round trip on) from 16 KiB until
//!   three samples in a row are an eighth of the base (at least 0.5 ms) over it
//!   (HyStart++, RFC 9406, also takes several), or a loss: the target window on a 5 ms
//!   path is 100 times that of a veth. The window doubles while the first late samples
//!   come back, so ending at the target, or at a round's end as the other decisions
//!   do, overflowed a 10 ms path's token bucket (it still overflows a queue of half
//!   the path's window once, as TCP's does). The initial window stays small (TCP's
//!   is 10 segments) because it leaves as one burst: the burst's last packet waits
//!   behind the rest at the bottleneck, and flows started together took that for part
//!   of their base round trip (a 64 KiB initial window left two such flows at 0.2 and
//!   0.8 of the link). For the same reason a QP's first message larger than the window
//!   asks for an ACK on its first packet: the first sample is of a packet with nothing
//!   of its own ahead of it. Additive increase is one packet per millisecond of smoothed
//!   round trip, so a long path regains its window about as fast as a short one.
//! - A loss cuts the window (to the base over the smoothed round trip, what the path
//!   holds without its queue, by at most half) only when the round trip is over the target: a
//!   full queue that drops has one; a lossy link (1 % random loss) does not, and
//!   halving there left a third of the throughput (TCP Veno's rule). It cuts once per
//!   recovery episode: losses found before everything sent at the cut is acknowledged
//!   are the same congestion (NewReno's recovery point, RFC 6582). Go-back-N finds the
//!   holes of one overshoot a round trip apart; each taken as new congestion cut a
//!   10 ms path's window to its least.
//! - The base must be the path's, not the path's plus a queue other flows hold: a flow
//!   that starts while one stands takes it for part of its base, so its target is
//!   higher and it takes the whole link (Vegas' and LEDBAT's latecomer advantage).
//!   As LEDBAT++ does (its "slowdown", draft-irtf-iccrg-ledbat-plus-plus), a flow
//!   probes the base two round trips after its first slow start ends: the window
//!   falls to its least until what was in flight has come back, and the least round
//!   trip of a packet sent from then on may lower the base (the first of them lead the
//!   drained queue, so the window goes back at once: what follows queues behind them).
//!   The flows it displaced have given way by then and send less than the link
//!   together, so the queue drains. A window-based flow whose window is over the
//!   path's bandwidth-delay product keeps a queue by itself until it has shrunk, so a
//!   probe that lowers the base by more than scheduling noise is followed by another
//!   16 round trips on. A probe drains only its own flow's share of the queue,
//!   though, and a delay-based flow beside it keeps its share standing: two flows
//!   started 10 ms apart kept bases of 11 and 277 µs and split a 1 Gb/s link 0.41 /
//!   0.58 for 10 s. So flows also probe on a grid of the wall clock (points a power
//!   of two nanoseconds apart, about 256 round trips: 134 ms to 4.3 s), where every
//!   flow of this host, and of hosts whose clocks agree to within a round trip,
//!   probes at once and the queue drains for all (BBR's ProbeRTT synchronizes its
//!   flows the same way, through the drain each one sees). As every flow holds back
//!   at once there, a grid probe holds back only while the queue drains (its smoothed
//!   round trip over its base, a quarter more), about a millisecond of an idle link per
//!   period; the first probe, the prober's alone, holds back longer, for the queue
//!   other flows may keep (at most a round trip). A base not seen again
//!   for `min_rtt_window` (10 s) is probed the same way and replaced by the probe's
//!   least only if that is over the old target (a longer route): taking the samples
//!   of a queue that other flows keep standing for it would let the base climb at
//!   every expiry (LEDBAT's latency drift).
//!   Swift needs neither (its target is set from the fabric's known base and hop
//!   count, which an arbitrary IP path does not give), nor Copa (its oscillation
//!   empties the queue every few round trips, part of a different window rule).
//! - The window grows only while it is used (RFC 7661; Linux's cwnd validation; a
//!   single-path QP's window and each of a multipath QP's path windows): by
//!   the end of a round the bytes in flight reached it, in slow start half of it. A
//!   sender that was descheduled, CPU-bound or application-limited saw an empty queue
//!   that says nothing of a larger window; grown through such a stretch, the window
//!   overflowed the token bucket as soon as the sender could fill it again. A base
//!   probe keeps its time on every ACK, sampled or not, so that a repair under way
//!   (nothing is sampled then) cannot hold it, and the least window, for long.
//! - Pacing: packets leave at 1.25× (slow start 2×) the window per smoothed round trip
//!   (`Pacer`), with a burst of one GSO send (at most 0.5 ms of the rate), so a window
//!   opening at once does not become one line-rate burst into a shallow token bucket
//!   (SRD and Falcon pace every connection in hardware for the same reason).
//! - A peer on this host (loopback, or the QP's own address) is not controlled: there
//!   is no link, only socket buffers (bounded by the device budget), and its round trip
//!   is process scheduling.
//!
//! A window counts request PSNs at the path MTU; a READ request counts the PSNs of all
//! its responses, so a requester's window bounds the READ data coming back too. A
//! responder has no ACK for its READ responses: `ResponseRate` paces them at a rate
//! that grows while no READ is asked again and falls when most recent READs are asked
//! again for PSNs that had left (a requester's retransmission is the only loss signal it
//! gets from any peer, kernel rxe included; random loss brings back a few READs, a full
//! queue's run of drops most). Responses placed ahead of a hole leave the requester's window (the SACK
//! that READ responses give for free).
//!
//! UC and UD have no ACKs and so no signal: they send at the rate the application
//! posts, as rxe does, unless `EngineConfig::unacked_rate` holds each QP to a rate
//! (the same `Pacer`; a camera stream on a shared link, a UD fan-out).
//!
//! Known limits: the first base probe costs up to a round trip of an emptying path (5
//! ms and a quarter of its own queue's drain), a grid probe a quarter of the queue's
//! drain and 0.5 ms; a probe drains the queue only if the other flows give way
//! (delay-based ones do, buffer-filling TCP does not: then the expired base takes
//! TCP's queue, which keeps the delay-based flow its share); on a 10 ms path one loss
//! costs go-back-N a window of up to 1.5 MB where TCP with SACK resends what was lost,
//! so its rate varies more from run to run; delay-based flows give way to
//! buffer-filling TCP only as far as the target allows.
//!
//! Multipath: a QP whose data uses several paths (`multipath`) has one controller and
//! one pacer per path, the same algorithm fed with that path's round trips and losses;
//! the QP's window and pacer then stand aside (the paths' windows sum), and a path's
//! losses never fail it (only silence does). A single-path QP, and every QP to kernel
//! rxe, uses the QP's controller as described above.
//!
//! Other algorithms (a BBR-like model, DCQCN once ECN marks exist) implement
//! `CongestionControl` and are chosen by [`CcAlgorithm`].

mod delay;
mod hooks;
mod pacer;
mod rtt;

pub(crate) use delay::DelayAimd;
pub use delay::DelayAimdConfig;
pub(crate) use hooks::QpCc;
pub(crate) use pacer::{Pacer, ResponseRate};
pub(crate) use rtt::RttSampler;

use crate::verbs::Nanos;

/// Which congestion control RC QPs use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CcAlgorithm {
    /// None: the window is the protocol's (`max 1024 PSNs`) and nothing is paced, as
    /// rxe and a RoCE NIC without DCQCN do.
    Off,
    /// Delay-driven AIMD with pacing ([`DelayAimdConfig`]).
    DelayAimd(DelayAimdConfig),
}

impl CcAlgorithm {
    /// The same algorithm for one path of a multipath QP: at most `queue` of queueing
    /// delay above the base round trip (the least allowance and the most flow scaling
    /// adds both set to it), and a slow start that only doubles (the paths start with
    /// an initial window each, together several times a single path's).
    pub(crate) fn for_path(self, queue: Nanos) -> CcAlgorithm {
        match self {
            CcAlgorithm::Off => CcAlgorithm::Off,
            CcAlgorithm::DelayAimd(c) => CcAlgorithm::DelayAimd(DelayAimdConfig {
                min_queue_delay: queue,
                flow_scaling_range: queue,
                early_growth_window: 0,
                ..c
            }),
        }
    }
}

impl Default for CcAlgorithm {
    fn default() -> Self {
        CcAlgorithm::DelayAimd(DelayAimdConfig::default())
    }
}

/// A congestion signal other than delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Congestion {
    /// A packet was lost (sequence NAK, response gap): the network dropped it.
    Loss,
    /// The retransmit timer fired: nothing came back for a whole timeout.
    Timeout,
}

/// A round trip measured from an ACK (or READ response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RttSample {
    /// From the packet's send to its answer, ns.
    pub rtt: Nanos,
    /// The packet was the last the requester had to send (the application posted
    /// nothing after it yet: a ping-pong's every message). Its ACK may include the
    /// peer's host delay, not the network's: a receiver that holds the ACK for its
    /// application's answer (softhca's datapath does, up to its polling window), a
    /// descheduled peer, a delayed ACK. BBR marks such samples the same way.
    pub app_limited: bool,
    /// Bytes in flight as the packet left, itself included (0: not known).
    pub in_flight: u64,
}

/// What a congestion controller decides for one QP's requests.
pub(crate) trait CongestionControl: std::fmt::Debug + Send {
    /// A round-trip sample and `acked` bytes newly acknowledged, at `now`.
    fn on_ack(&mut self, now: Nanos, acked: u64, rtt: Option<RttSample>);
    /// A packet left with `in_flight` bytes outstanding after it (the window grows
    /// only while it is used: see `DelayAimd`; a controller never told counts its
    /// window as used).
    fn on_sent(&mut self, in_flight: u64);
    /// The QP's packets now carry up to `bytes` (larger packets agreed after the first
    /// messages left at the path MTU).
    fn set_packet_bytes(&mut self, bytes: u64);
    /// A loss or a timeout at `now`.
    fn on_congestion(&mut self, now: Nanos, what: Congestion);
    /// Time has passed: `now`, before the window is asked for. A window held back
    /// for a while (a base probe) goes back on time, not at the next ACK, which may be
    /// a round trip later.
    fn on_time(&mut self, _now: Nanos) {}
    /// When the window held back grows again by itself (`on_time`), if it is held.
    fn wake_at(&self) -> Option<Nanos> {
        None
    }
    /// Bytes allowed in flight.
    fn window(&self) -> u64;
    /// Bytes per second to pace at; None: not paced (no round trip measured yet).
    fn pacing_rate(&self) -> Option<u64>;
    /// Whether the window is still in slow start (asked per packet; `stats` is for
    /// counters).
    fn in_slow_start(&self) -> bool;
    /// The figures `softhca devinfo -v` shows.
    fn stats(&self) -> CcStats;
    /// `stats` with only its counters filled in (asked twice per ACK: the window,
    /// rate and target are not worked out).
    fn counters(&self) -> CcStats;
}

/// One QP's congestion state, for counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CcStats {
    /// The window, bytes.
    pub window: u64,
    /// The pacing rate, bytes per second (0: not paced).
    pub rate: u64,
    /// Smoothed round trip, ns (0: none yet).
    pub srtt: Nanos,
    /// Least round trip seen (the base of the delay target), ns.
    pub min_rtt: Nanos,
    /// The delay above which the window shrinks, ns.
    pub target: Nanos,
    /// Decreases for delay over the target.
    pub delay_decreases: u64,
    /// Decreases for loss.
    pub loss_decreases: u64,
    /// Retransmit timeouts seen.
    pub timeouts: u64,
    /// Base probes: the window held at its least to see the base round trip.
    pub base_probes: u64,
    /// Losses and timeouts with the round trip under the target (no queue: a lossy
    /// link, not congestion), which left the window as it was.
    pub random_losses: u64,
    /// Times sending waited for the window.
    pub window_limited: u64,
    /// Times sending waited for the pacer.
    pub pacing_waits: u64,
    /// Still in slow start.
    pub slow_start: bool,
    /// The responder's READ response rate, bytes per second (0: not paced).
    pub response_rate: u64,
    /// Decreases of the READ response rate (a READ asked again).
    pub response_cuts: u64,
}

impl std::fmt::Display for CcStats {
    /// One line: `srtt 812us min_rtt 73us target 1.07ms window 162 KiB rate 2.08 Gb/s
    /// cuts delay 104 loss 1 timeout 0 waits window 445 pacing 0`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "srtt {}us min_rtt {}us target {}us window {} KiB rate {:.3} Gb/s{} cuts delay {} loss {} timeout {} (not congestion {}) base probes {} waits window {} pacing {}",
            self.srtt / 1000,
            self.min_rtt / 1000,
            self.target / 1000,
            self.window / 1024,
            self.rate as f64 * 8.0 / 1e9,
            if self.slow_start { " (slow start)" } else { "" },
            self.delay_decreases,
            self.loss_decreases,
            self.timeouts,
            self.random_losses,
            self.base_probes,
            self.window_limited,
            self.pacing_waits,
        )?;
        if self.response_cuts > 0 {
            write!(
                f,
                " read responses {:.3} Gb/s cuts {}",
                self.response_rate as f64 * 8.0 / 1e9,
                self.response_cuts
            )?;
        }
        Ok(())
    }
}

/// A new controller for a QP whose packets carry `mtu` bytes.
pub(crate) fn new_controller(alg: CcAlgorithm, mtu: u64) -> Option<Box<dyn CongestionControl>> {
    match alg {
        CcAlgorithm::Off => None,
        CcAlgorithm::DelayAimd(c) => Some(Box::new(DelayAimd::new(c, mtu))),
    }
}
