//! Where a ping-pong's time goes on this host: with `SOFTHCA_STATS` set, the device
//! times each *turnaround* (datagrams received → the application takes a completion →
//! it posts → the answer is handed to the kernel) and prints the median and 99th
//! percentile of each phase when it closes.
//!
//! Why: a half round trip of an 8 B SEND is the sender's `sendmmsg` (on loopback it
//! also runs the receiver's whole IP/UDP receive path in the sender's system call), the
//! receiver's discovery of the datagram, and the receiver's own user-space turnaround.
//! Only the last is softhca's. End-to-end latency on a shared machine moves by more
//! than any change to it; the phases time user space alone and show what a change to
//! the datapath did.
//!
//! Off (the default), the hooks are one branch on a `None`. On, each turnaround costs
//! two clock reads more (the completion taken, the send's end).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Nanos;

/// Histogram buckets: 25 ns wide up to [`BUCKETS`] × 25 ns (25.6 µs), the last one
/// open.
const BUCKET_NS: u64 = 25;
const BUCKETS: usize = 1024;

/// The phases of a turnaround, in order.
const PHASES: [&str; 4] = ["receive->taken", "taken->post", "post->send", "send"];

/// A latency histogram that threads add to without a lock.
struct Histogram {
    buckets: Box<[AtomicU64]>,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn add(&self, ns: u64) {
        let b = ((ns / BUCKET_NS) as usize).min(BUCKETS - 1);
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The `q` quantile (0..=1) in ns: the middle of its bucket.
    fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let want = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= want {
                return Some(i as u64 * BUCKET_NS + BUCKET_NS / 2);
            }
        }
        None
    }
}

/// The turnaround timer of one device.
pub(crate) struct Turnaround {
    /// Engine clock of the step that received datagrams, until the next send (0: none).
    received: AtomicU64,
    /// Engine clock at which an application thread took a completion after it.
    taken: AtomicU64,
    phases: [Histogram; 4],
}

impl Turnaround {
    /// A timer (made when `SOFTHCA_STATS` is set, `Config::diagnostics`).
    pub(crate) fn new() -> Box<Turnaround> {
        Box::new(Turnaround {
            received: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            phases: std::array::from_fn(|_| Histogram::new()),
        })
    }

    /// A datapath step received datagrams at `now` (its clock reading after the
    /// receive).
    pub(crate) fn received(&self, now: Nanos) {
        self.received.store(now.max(1), Ordering::Relaxed);
        self.taken.store(0, Ordering::Relaxed);
    }

    /// An application thread took a completion at `now`.
    pub(crate) fn taken(&self, now: Nanos) {
        if self.received.load(Ordering::Relaxed) != 0 && self.taken.load(Ordering::Relaxed) == 0 {
            self.taken.store(now, Ordering::Relaxed);
        }
    }

    /// A post read the clock at `posted`, and its transmits go to the kernel from
    /// `sending` to `sent`. Completes a turnaround if datagrams were received and a
    /// completion taken since the last send.
    pub(crate) fn sent(&self, posted: Nanos, sending: Nanos, sent: Nanos) {
        let received = self.received.swap(0, Ordering::Relaxed);
        let taken = self.taken.swap(0, Ordering::Relaxed);
        if received == 0 || taken == 0 || taken < received || posted < taken {
            return;
        }
        let marks = [received, taken, posted, sending, sent];
        for (h, w) in self.phases.iter().zip(marks.windows(2)) {
            h.add(w[1].saturating_sub(w[0]));
        }
    }

    /// One line for `SOFTHCA_STATS`, or None before any turnaround.
    pub(crate) fn summary(&self) -> Option<String> {
        let n = self.phases[0].count();
        if n == 0 {
            return None;
        }
        let us = |ns: Option<u64>| ns.map_or(0.0, |v| v as f64 / 1000.0);
        let parts: Vec<String> = PHASES
            .iter()
            .zip(&self.phases)
            .map(|(name, h)| {
                format!(
                    "{name} {:.2}/{:.2}",
                    us(h.quantile(0.5)),
                    us(h.quantile(0.99))
                )
            })
            .collect();
        Some(format!("turnarounds={n} p50/p99 us: {}", parts.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer() -> Turnaround {
        Turnaround {
            received: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            phases: std::array::from_fn(|_| Histogram::new()),
        }
    }

    #[test]
    fn phases_of_a_turnaround() {
        let t = timer();
        for i in 0..100u64 {
            let base = 1_000_000 * (i + 1);
            t.received(base);
            t.taken(base + 800);
            t.taken(base + 900); // a second completion does not move the mark
            t.sent(base + 1_000 + i, base + 1_500 + i, base + 5_500 + i);
        }
        assert_eq!(t.phases[0].count(), 100);
        assert_eq!(t.phases[0].quantile(0.5), Some(812));
        // 200 + i for i < 100: the 50th is 249, in the bucket 225..250.
        assert_eq!(t.phases[1].quantile(0.5), Some(237));
        assert_eq!(t.phases[2].quantile(0.5), Some(512));
        assert_eq!(t.phases[3].quantile(0.99), Some(4_012));
        let s = t.summary().unwrap();
        assert!(s.starts_with("turnarounds=100 "), "{s}");
    }

    #[test]
    fn a_send_without_a_receive_and_a_completion_is_not_a_turnaround() {
        let t = timer();
        t.sent(10, 20, 30);
        t.received(100);
        t.sent(110, 120, 130); // nothing taken: the application did not answer
        t.taken(140); // after the send: no receive before it any more
        t.sent(150, 160, 170);
        assert_eq!(t.phases[0].count(), 0);
        assert!(t.summary().is_none());
    }

    #[test]
    fn long_phases_land_in_the_last_bucket() {
        let h = Histogram::new();
        h.add(u64::MAX);
        h.add(10);
        assert_eq!(h.count(), 2);
        assert_eq!(
            h.quantile(1.0),
            Some((BUCKETS as u64 - 1) * BUCKET_NS + BUCKET_NS / 2)
        );
        assert_eq!(h.quantile(0.5), Some(12));
    }
}
