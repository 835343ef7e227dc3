//! Per-QP deadlines in one heap with lazy deletion: each QP has at most one live
//! deadline (its retransmit or RNR timer); superseded heap entries are skipped by
//! generation number when they surface.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::verbs::Nanos;

/// The timer heap.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Nanos, u32, u64)>>,
}

impl Timers {
    /// Schedule `(deadline, qpn, generation)`.
    pub fn push(&mut self, at: Nanos, qpn: u32, gen: u64) {
        self.heap.push(Reverse((at, qpn, gen)));
    }

    /// The earliest entry (possibly stale).
    pub fn peek(&self) -> Option<Nanos> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Pop one entry due at or before `now`.
    pub fn pop_due(&mut self, now: Nanos) -> Option<(u32, u64)> {
        match self.heap.peek() {
            Some(Reverse((t, _, _))) if *t <= now => {
                self.heap.pop().map(|Reverse((_, q, g))| (q, g))
            }
            _ => None,
        }
    }
}

/// Local ACK timeout: 4.096 µs × 2^timeout (IBTA 9.7.6.1.3); 0 means infinite.
pub(crate) fn ack_timeout_ns(timeout: u8) -> Option<Nanos> {
    if timeout == 0 {
        None
    } else {
        Some(4096u64 << timeout.min(31))
    }
}

/// RNR NAK timer (IBTA table 45): the 5-bit code to nanoseconds.
pub(crate) fn rnr_timer_ns(code: u8) -> Nanos {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    US.get(usize::from(code & 31)).map_or(0, |us| us * 1000)
}

/// Least wait before a loss is presumed from silence (`completer::quiet_deadline`,
/// `responder` NAK repeats), and the multiple of the measured round trip used above it.
pub(crate) const QUIET_MIN_NS: Nanos = 1_000_000;
const QUIET_RTTS: Nanos = 4;

/// A smoothed round-trip time with a new sample (gain 1/8, as TCP's SRTT, RFC 6298);
/// 0 means no sample yet.
pub(crate) fn rtt_update(srtt: Nanos, sample: Nanos) -> Nanos {
    if srtt == 0 {
        sample.max(1)
    } else {
        srtt - srtt / 8 + sample / 8
    }
}

/// How long silence must last, after `repeats` earlier ones, before it means loss on a
/// path with smoothed round trip `srtt`: None without a measurement (then only the
/// retransmit timeout applies, as IBTA has it).
pub(crate) fn quiet_wait(srtt: Nanos, repeats: u8) -> Option<Nanos> {
    (srtt > 0).then(|| (QUIET_RTTS * srtt).max(QUIET_MIN_NS) << repeats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_pops_due_entries_earliest_first() {
        let mut t = Timers::default();
        t.push(300, 1, 0);
        t.push(100, 2, 5);
        t.push(200, 3, 1);
        assert_eq!(t.peek(), Some(100));
        assert_eq!(t.pop_due(99), None);
        assert_eq!(t.pop_due(250), Some((2, 5)));
        assert_eq!(t.pop_due(250), Some((3, 1)));
        assert_eq!(t.pop_due(250), None);
        assert_eq!(t.peek(), Some(300));
    }

    #[test]
    fn ibta_timer_encodings() {
        assert_eq!(ack_timeout_ns(0), None);
        // Timeout 14: 4.096 us * 2^14 = 67.1 ms.
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
        assert_eq!(ack_timeout_ns(40), ack_timeout_ns(31));
        // IBTA table 45: code 0 is 655.36 ms, code 1 is 0.01 ms, code 31 is 491.52 ms.
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        assert_eq!(rnr_timer_ns(32 + 1), 10_000);
    }

    #[test]
    fn rtt_and_quiet_wait() {
        assert_eq!(rtt_update(0, 800), 800);
        assert_eq!(rtt_update(800, 1600), 900);
        assert_eq!(quiet_wait(0, 0), None);
        assert_eq!(quiet_wait(10, 0), Some(QUIET_MIN_NS));
        assert_eq!(quiet_wait(1_000_000, 1), Some(8_000_000));
    }
}
