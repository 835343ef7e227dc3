//! When the datapath thread takes the sockets over although the application polls.
//!
//! While an application thread polls a CQ, the datapath thread leaves the sockets to it
//! for a window (`APP_WINDOW_NS`) after each poll: it progresses the datapath itself,
//! with no hand-off between threads. That assumes what the application waits for
//! arrives while it polls. perftest's `ib_write_lat` breaks it: each side spins on the
//! last byte of its buffer, where the peer's RDMA WRITE lands, and polls only its send
//! CQ, right after posting; the peer's WRITE then sat in the socket until the window ran
//! out.
//!
//! The datapath thread sees it happen: it sleeps out a window, no poll came since, and
//! packets were waiting (a *stranding*). After a short burst of them, application polls
//! open no window for a while and the datapath thread serves the sockets, as a NIC would.
//! Not after one: a polling application descheduled for a window (two busy processes on
//! two cores) strands packets too, now and then, and serving costs a polling application
//! latency (the datapath thread wakes for every packet and races its polls). A serve
//! period that follows the previous one closely lasts twice as long (an application that
//! keeps spinning pays one burst per period), up to [`LONGEST`].

use crate::Nanos;

/// Strandings closer together than this make a burst.
const BURST_GAP: Nanos = 20_000_000;
/// Strandings in a burst that start a serve period.
const BURST: u32 = 3;
/// The first serve period.
const FIRST: Nanos = 100_000_000;
/// The longest serve period.
const LONGEST: Nanos = 1_600_000_000;
/// A burst this long after the last period ended starts again at [`FIRST`].
const FORGET_AFTER: Nanos = 1_000_000_000;

/// The datapath thread's record of strandings, and when it serves the sockets.
#[derive(Debug, Default)]
pub(crate) struct Takeover {
    last: Nanos,
    streak: u32,
    hold: Nanos,
    served_until: Nanos,
}

impl Takeover {
    /// A stranding at `now`; returns the end of a serve period that starts now, if one does.
    pub(crate) fn stranded(&mut self, now: Nanos) -> Option<Nanos> {
        if self.streak > 0 && now.saturating_sub(self.last) > BURST_GAP {
            self.streak = 0;
        }
        self.streak += 1;
        self.last = now;
        if self.streak < BURST {
            return None;
        }
        self.streak = 0;
        let recent = self.served_until > 0 && now.saturating_sub(self.served_until) < FORGET_AFTER;
        self.hold = if recent {
            (self.hold * 2).min(LONGEST)
        } else {
            FIRST
        };
        self.served_until = now + self.hold;
        Some(self.served_until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    /// `ib_write_lat`: a stranding every round trip (at most one window each).
    #[test]
    fn a_burst_starts_serving_and_periods_double() {
        let mut p = Takeover::default();
        assert_eq!(p.stranded(0), None);
        assert_eq!(p.stranded(2 * MS), None);
        assert_eq!(p.stranded(4 * MS), Some(4 * MS + FIRST));
        // Serving: no strandings until the period ends; then the application strands
        // again at once, and the next period is twice as long.
        let end = 4 * MS + FIRST;
        assert_eq!(p.stranded(end + 2 * MS), None);
        assert_eq!(p.stranded(end + 4 * MS), None);
        assert_eq!(p.stranded(end + 6 * MS), Some(end + 6 * MS + 2 * FIRST));
        let mut end = end + 6 * MS + 2 * FIRST;
        for _ in 0..10 {
            p.stranded(end + 2 * MS);
            p.stranded(end + 4 * MS);
            let next = p.stranded(end + 6 * MS).expect("a burst");
            assert!(next - (end + 6 * MS) <= LONGEST);
            end = next;
        }
        assert_eq!(p.hold, LONGEST);
    }

    /// A polling application descheduled now and then: strandings far apart.
    #[test]
    fn scattered_strandings_never_serve() {
        let mut p = Takeover::default();
        for i in 0..100 {
            assert_eq!(p.stranded(i * (BURST_GAP + MS)), None);
        }
    }

    /// A burst long after the last period: the period starts short again.
    #[test]
    fn a_late_burst_starts_over() {
        let mut p = Takeover::default();
        for t in [0, MS, 2 * MS] {
            p.stranded(t);
        }
        let end = 2 * MS + FIRST;
        for t in [end + MS, end + 2 * MS, end + 3 * MS] {
            p.stranded(t);
        }
        assert_eq!(p.hold, 2 * FIRST);
        let late = end + 3 * MS + 2 * FIRST + FORGET_AFTER + MS;
        p.stranded(late);
        p.stranded(late + MS);
        assert_eq!(p.stranded(late + 2 * MS), Some(late + 2 * MS + FIRST));
    }
}
