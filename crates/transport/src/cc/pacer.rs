//! Pacing: when the next packet of a QP may leave, and the rate of READ responses.

use softhca_wire::Psn;

use crate::verbs::Nanos;

/// Bytes that may leave back to back after a pause: one GSO send, so pacing does not
/// cut batches apart, but at most [`BURST_NS`] of the pacing rate, so a slow path's
/// queue is not filled by one send.
const BURST_BYTES: u64 = 64 * 1024;
const BURST_NS: u64 = 500_000;
const MIN_BURST_BYTES: u64 = 8 * 1024;

/// A token bucket of [`BURST_BYTES`] refilled at the pacing rate.
#[derive(Debug, Default, Clone)]
pub(crate) struct Pacer {
    /// When the bucket is back to zero: a packet may leave while this is not after now.
    next_at: Nanos,
}

impl Pacer {
    /// When the next packet may leave if not now.
    pub fn wait_until(&self, now: Nanos) -> Option<Nanos> {
        (self.next_at > now).then_some(self.next_at)
    }

    /// `bytes` left at `now`, paced at `rate` bytes per second.
    pub fn on_sent(&mut self, now: Nanos, bytes: u64, rate: u64) {
        let rate = rate.max(1);
        let bytes_in_burst_ns = rate.saturating_mul(BURST_NS) / 1_000_000_000;
        let burst_bytes = bytes_in_burst_ns.clamp(MIN_BURST_BYTES, BURST_BYTES);
        let burst = burst_bytes.saturating_mul(1_000_000_000) / rate;
        let cost = bytes.saturating_mul(1_000_000_000) / rate;
        self.next_at = self.next_at.max(now.saturating_sub(burst)) + cost;
    }
}

/// How often [`ResponseRate`] measures its send rate and may grow.
const INTERVAL_NS: Nanos = 1_000_000;
/// How many READs answered [`ResponseRate`] judges its repeats against.
const READS_SEEN: f64 = 32.0;
/// Response PSNs sent past a cut's recovery point after which the point is forgotten:
/// far beyond any episode, well within half the 24-bit PSN space.
const RECOVER_SPAN: i32 = 1 << 22;
/// Least READ response rate, bytes per second (1 Mb/s).
const MIN_RATE: f64 = 125_000.0;

/// A responder's rate for READ responses. Nothing acknowledges them (a requester only
/// asks again for what it missed), so the only signal is a repeated READ request: the
/// rate starts unpaced, falls to 0.7× of what was sent when many READs come back (once
/// per interval) and grows by 1/32 per interval without, an AIMD on rate as a
/// loss-based TCP is on its window.
#[derive(Debug, Default, Clone)]
pub(crate) struct ResponseRate {
    /// Bytes per second; None: not paced (no loss seen).
    rate: Option<f64>,
    /// Measured send rate while busy, bytes per second.
    sent_rate: f64,
    interval_start: Nanos,
    interval_bytes: u64,
    /// READs answered (first or again) and READs asked again, over about the last
    /// [`READS_SEEN`] answered (each answer decays both).
    reads: f64,
    repeats: f64,
    last_sent: Nanos,
    /// Bytes of the last response packet sent.
    last_bytes: u64,
    last_cut: Option<Nanos>,
    /// The last response PSN sent when the rate was last cut: a READ asked again from
    /// a PSN up to it lost its responses before that cut took effect (the same
    /// episode, as NewReno's recovery point, RFC 6582), and cuts nothing more.
    recover: Option<Psn>,
    /// The last response PSN sent.
    sent_psn: Option<Psn>,
    /// Decreases made.
    pub cuts: u64,
    pub pacer: Pacer,
}

impl ResponseRate {
    /// The pacing rate, bytes per second.
    pub fn rate(&self) -> Option<u64> {
        self.rate.map(|r| r as u64)
    }

    /// READ response `psn`, `bytes` long, left at `now`; `first`: the first packet of a
    /// READ's responses.
    pub fn on_sent(&mut self, now: Nanos, psn: Psn, bytes: u64, first: bool) {
        let elapsed = now.saturating_sub(self.interval_start);
        if elapsed >= INTERVAL_NS {
            // An interval with a pause of a whole interval in it measured the
            // application's pauses, not the path: a ping-pong's READs then set a rate of a
            // few kB/s that the next cut started from. A pause the pacing itself made
            // (a rate so low that packets leave more than an interval apart) is not one:
            // taken for idle, it kept such a rate from ever growing again.
            let gap = now.saturating_sub(self.last_sent);
            let paced_gap = self
                .rate
                .map_or(0.0, |r| self.last_bytes as f64 * 1e9 / r.max(1.0));
            let idle = gap >= INTERVAL_NS && gap as f64 > 2.0 * paced_gap;
            if !idle {
                let r = self.interval_bytes as f64 * 1e9 / elapsed as f64;
                self.sent_rate = if self.sent_rate == 0.0 {
                    r
                } else {
                    0.75 * self.sent_rate + 0.25 * r
                };
                // 1/32 per interval that passed (several when packets leave further
                // apart than one).
                let intervals = (elapsed / INTERVAL_NS).min(32) as f64;
                if let Some(rate) = self.rate.as_mut() {
                    *rate += (*rate / 32.0).max(MIN_RATE) * intervals;
                }
            }
            self.interval_start = now;
            self.interval_bytes = 0;
        }
        self.interval_bytes += bytes;
        self.last_sent = now;
        self.last_bytes = bytes;
        self.sent_psn = Some(psn);
        // Long past the episode, a 24-bit PSN comparison with its recovery point would
        // turn around (half the PSN space on, every repeat would look like part of it).
        if self.recover.is_some_and(|r| psn.diff(r) >= RECOVER_SPAN) {
            self.recover = None;
        }
        if first {
            let keep = 1.0 - 1.0 / READS_SEEN;
            self.reads = self.reads * keep + 1.0;
            self.repeats *= keep;
        }
        if let Some(rate) = self.rate {
            self.pacer.on_sent(now, bytes, rate as u64);
        }
    }

    /// The requester asked again for a READ at `now`: responses it had been sent were
    /// lost. A link that loses packets at random (1 % loss brings back about 15 % of
    /// 64 KiB READs, of 16 packets each) brings back a few of the READs answered; a full
    /// queue drops runs of packets and brings back most of those answered while it
    /// overflowed: half of the recent ones, and at least two, is taken for congestion.
    /// Counted by READs, not by time: a rate that counted repeats per millisecond cut
    /// itself lower at each cut, as fewer READs per millisecond made any two a burst.
    pub fn on_repeat(&mut self, now: Nanos, psn: Psn) {
        if self.recover.is_some_and(|r| !psn.is_after(r)) {
            return;
        }
        self.repeats += 1.0;
        let congested = self.repeats >= 2.0 && 2.0 * self.repeats >= self.reads;
        if !congested
            || self
                .last_cut
                .is_some_and(|t| now.saturating_sub(t) < INTERVAL_NS)
        {
            return;
        }
        let base = match self.rate {
            Some(r) if self.sent_rate > 0.0 => r.min(self.sent_rate),
            Some(r) => r,
            None if self.sent_rate > 0.0 => self.sent_rate,
            None => return,
        };
        self.rate = Some((0.7 * base).max(MIN_RATE));
        self.last_cut = Some(now);
        self.recover = self.sent_psn;
        self.cuts += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_lets_one_burst_through_then_paces() {
        let mut p = Pacer::default();
        let now = 10_000_000;
        // 1 Gb/s = 125 MB/s: 64 KiB is 524 µs.
        let rate = 125_000_000;
        let mut sent = 0;
        while p.wait_until(now).is_none() {
            p.on_sent(now, 4096, rate);
            sent += 4096;
        }
        // 500 µs of the rate (62.5 kB), and the packet that crossed it.
        assert_eq!(sent, 16 * 4096);
        let t = p.wait_until(now).unwrap();
        assert!(t > now && t <= now + 40_000, "{}", t - now);
    }

    #[test]
    fn response_rate_falls_when_most_reads_come_back_and_grows_without() {
        let mut r = ResponseRate::default();
        // 131 MB/s: a 64 KiB READ every 0.5 ms, in packets of 4 KiB.
        let mut now = 0;
        for i in 0..320u64 {
            now = i * 31_250;
            r.on_sent(now, Psn::new(i as u32), 4096, i % 16 == 0);
        }
        assert_eq!(r.rate(), None);
        // Two of twenty READs asked again (random loss): not congestion.
        r.on_repeat(now + 10_000, Psn::new(16));
        r.on_repeat(now + 20_000, Psn::new(48));
        assert_eq!(r.rate(), None, "two READs back of twenty");
        // A run of drops: most READs come back.
        for k in 0..6 {
            r.on_repeat(now + 30_000 + k * 1000, Psn::new(64 + 16 * k as u32));
        }
        let cut = r.rate().unwrap();
        assert!((85_000_000..95_000_000).contains(&cut), "{cut}");
        r.on_repeat(now + 50_000, Psn::new(300));
        assert_eq!(r.rate(), Some(cut), "once per interval");
        r.on_sent(now + 900_000, Psn::new(320), 1000, false);
        assert!(r.rate().unwrap() > cut);
        assert_eq!(r.cuts, 1);
    }

    #[test]
    fn one_episode_cuts_once_and_a_slow_paced_rate_grows_back() {
        let mut r = ResponseRate::default();
        // 64 KiB READs at 131 MB/s, then every READ sent so far comes back (a path
        // that reorders more than the requester waits for, or a requester that timed
        // out): one cut, not one per interval while the repeats arrive.
        let mut now = 0;
        for i in 0..320u64 {
            now = i * 31_250;
            r.on_sent(now, Psn::new(i as u32), 4096, i % 16 == 0);
        }
        for k in 0..20u64 {
            r.on_repeat(now + k * 2_000_000, Psn::new(16 * k as u32));
        }
        assert_eq!(r.cuts, 1, "one episode");
        // More than half the PSN space past that episode, a repeat counts again: a
        // comparison with the old recovery point would have turned around.
        for i in 0..(1u32 << 23) + 1000 {
            r.on_sent(
                now + 50_000_000 + u64::from(i),
                Psn::new(320 + i),
                4096,
                i % 16 == 0,
            );
        }
        let psn_now = Psn::new(320 + (1 << 23) + 900);
        for k in 0..20u64 {
            r.on_repeat(now + 100_000_000 + k * 2_000_000, psn_now);
        }
        assert_eq!(r.cuts, 2, "a new episode");
        // A rate so low that its packets leave more than an interval apart still grows:
        // that pause is the pacing's own, not an idle application.
        let mut low = ResponseRate {
            rate: Some(200_000.0),
            ..ResponseRate::default()
        };
        let mut t = 0;
        for i in 0..100u32 {
            t += 20_000_000; // 4 KiB per 20 ms: 205 kB/s
            low.on_sent(t, Psn::new(i), 4096, i % 16 == 0);
        }
        assert!(low.rate().unwrap() > 2_000_000, "{:?}", low.rate());
    }

    #[test]
    fn an_idle_responder_measures_only_its_busy_time() {
        let mut r = ResponseRate::default();
        // 1 MiB READs at 819 MB/s every 50 ms (a ping-pong's rendezvous reads).
        for k in 0..10u64 {
            for i in 0..256u64 {
                let psn = Psn::new((k * 256 + i) as u32);
                r.on_sent(k * 50_000_000 + i * 5_000, psn, 4096, i == 0);
            }
        }
        let now = 10 * 50_000_000;
        r.on_sent(now, Psn::new(2560), 4096, true);
        for k in 0..5 {
            r.on_repeat(now + 1000 * k, Psn::new(2048 + 256 * k as u32));
        }
        // Cut from what was sent while sending, not from 1 MiB per 50 ms (21 MB/s).
        let cut = r.rate().unwrap();
        assert!((500_000_000..600_000_000).contains(&cut), "{cut}");
    }
}
