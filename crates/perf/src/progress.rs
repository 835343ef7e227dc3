//! How a running test reports how far it got, without printing anything itself.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

/// Told of a test's progress while it runs (the CLI draws a live line on stderr).
pub trait Progress {
    /// The QPs are connected: the measured part starts now.
    fn begin(&mut self, now: Instant);
    /// `done` messages so far of `total` (0: unknown, a timed run), each
    /// `bytes_per_msg` long.
    fn update(&mut self, now: Instant, done: u64, total: u64, bytes_per_msg: u64);
    /// The measured part is over.
    fn finish(&mut self);
}

/// No progress report.
impl Progress for () {
    fn begin(&mut self, _: Instant) {}
    fn update(&mut self, _: Instant, _: u64, _: u64, _: u64) {}
    fn finish(&mut self) {}
}

/// The `progress <unix time> <bytes>` log (`softhca perf --progress`, the MPTCP
/// receiver of `softhca-impair paths table`): at most one line per `every`, plus the
/// last update before any pause longer than `every`, so pauses show exactly.
pub struct ProgressLog<W: Write> {
    out: W,
    every: Duration,
    /// An instant and the wall clock then, to print instants as Unix time.
    origin: (Instant, SystemTime),
    /// When the last line was printed.
    printed: Instant,
    /// The last update: when, bytes done then, and whether it was printed.
    last: (Instant, u64, bool),
}

impl<W: Write> ProgressLog<W> {
    /// A log to `out`; bytes 0 at `now` (printed).
    pub fn new(out: W, every: Duration, now: Instant) -> ProgressLog<W> {
        let mut l = ProgressLog {
            out,
            every,
            origin: (now, SystemTime::now()),
            printed: now,
            last: (now, 0, true),
        };
        l.print(now, 0);
        l
    }

    fn print(&mut self, at: Instant, bytes: u64) {
        let unix = self.origin.1 + at.duration_since(self.origin.0);
        let secs = unix
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let _ = writeln!(self.out, "progress {secs:.6} {bytes}");
        self.printed = at;
    }

    /// `bytes` done at `now`.
    pub fn update(&mut self, now: Instant, bytes: u64) {
        let (t, b, printed) = self.last;
        if !printed && now.duration_since(t) >= self.every {
            self.print(t, b);
        }
        let print_now = now.duration_since(self.printed) >= self.every;
        if print_now {
            self.print(now, bytes);
        }
        self.last = (now, bytes, print_now);
    }

    /// Prints the last update if it was not.
    pub fn finish(&mut self) {
        let (t, b, printed) = self.last;
        if !printed {
            self.print(t, b);
            self.last.2 = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_brackets_pauses() {
        let mut out = Vec::new();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        {
            let mut l = ProgressLog::new(&mut out, ms(10), t0);
            for (t, b) in [(2, 10), (11, 20), (13, 30), (70, 40), (72, 50)] {
                l.update(t0 + ms(t), b);
            }
            l.finish();
        }
        let text = String::from_utf8(out).unwrap();
        let bytes: Vec<&str> = text
            .lines()
            .map(|l| l.split_whitespace().nth(2).unwrap())
            .collect();
        // 0 at the start, 20 at 11 ms, 30 (the last before the pause) and 40 after it,
        // then 50 at the end.
        assert_eq!(bytes, ["0", "20", "30", "40", "50"]);
    }
}
