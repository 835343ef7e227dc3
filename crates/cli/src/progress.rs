//! The live progress line on stderr (only on a terminal, only for runs past ~2 s).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, SystemTime};

/// Draws `\r`-updated status on stderr.
pub struct ProgressLine {
    enabled: bool,
    start: Instant,
    next: Instant,
    drawn: bool,
    label: String,
    /// Interval reports: their length, when the current one began and the messages
    /// done then.
    interval: Option<(Duration, Instant, u64)>,
    /// The `progress <unix time> <bytes>` log.
    log: Option<ProgressLog>,
}

/// The `progress` lines (see `PerfArgs::progress`): at most one per `every`, plus the
/// last completion before any pause longer than `every`, so pauses show exactly.
struct ProgressLog {
    every: Duration,
    /// An instant and the wall clock then, to print instants as Unix time.
    origin: (Instant, SystemTime),
    /// When the last line was printed.
    printed: Instant,
    /// The last update: when, bytes done then, and whether it was printed.
    last: (Instant, u64, bool),
}

impl ProgressLog {
    fn print(&mut self, at: Instant, bytes: u64) {
        let unix = self.origin.1 + at.duration_since(self.origin.0);
        let secs = unix
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        eprintln!("progress {secs:.6} {bytes}");
        self.printed = at;
    }

    fn update(&mut self, now: Instant, bytes: u64) {
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

    fn finish(&mut self) {
        let (t, b, printed) = self.last;
        if !printed {
            self.print(t, b);
            self.last.2 = true;
        }
    }
}

/// Runs shorter than this never show a progress line.
const QUIET_FOR: Duration = Duration::from_secs(2);
const EVERY: Duration = Duration::from_millis(250);

impl ProgressLine {
    /// A progress line for `label` (hidden unless stderr is a terminal, or `quiet`).
    pub fn new(label: String, quiet: bool) -> ProgressLine {
        let now = Instant::now();
        ProgressLine {
            enabled: !quiet && std::io::stderr().is_terminal(),
            start: now,
            next: now + QUIET_FOR,
            drawn: false,
            label,
            interval: None,
            log: None,
        }
    }

    /// Also prints `progress` lines at most every `every` (see `PerfArgs::progress`).
    pub fn with_log(mut self, every: Option<Duration>) -> ProgressLine {
        let now = Instant::now();
        self.log = every.map(|every| ProgressLog {
            every,
            origin: (now, SystemTime::now()),
            printed: now,
            last: (now, 0, true),
        });
        self
    }

    /// Also prints one line per `every` (see `PerfArgs::interval`).
    pub fn with_interval(mut self, every: Option<Duration>) -> ProgressLine {
        self.interval = every.map(|d| (d, self.start, 0));
        self
    }

    /// Prints the interval that ended, if one did.
    fn report_interval(&mut self, now: Instant, done: u64, bytes_per_msg: u64) {
        let Some((every, from, done_then)) = self.interval else {
            return;
        };
        let secs = now.duration_since(from).as_secs_f64();
        if secs < every.as_secs_f64() {
            return;
        }
        let gbps = (done - done_then) as f64 * bytes_per_msg as f64 * 8.0 / secs / 1e9;
        let t0 = from.duration_since(self.start).as_secs_f64();
        let t1 = now.duration_since(self.start).as_secs_f64();
        self.erase();
        eprintln!("interval {t0:.3} {t1:.3} {gbps:.4}");
        self.interval = Some((every, now, done));
    }

    /// Updates the line with messages done so far (`total` 0 = unknown / duration mode).
    fn draw(&mut self, now: Instant, done: u64, total: u64, bytes_per_msg: u64) {
        if !self.enabled || now < self.next {
            return;
        }
        self.next = now + EVERY;
        let secs = now.duration_since(self.start).as_secs_f64();
        let gbps = done as f64 * bytes_per_msg as f64 * 8.0 / secs / 1e9;
        let of = if total > 0 {
            format!(
                "{done}/{total} ({:.0}%)",
                done as f64 * 100.0 / total as f64
            )
        } else {
            format!("{done}")
        };
        let mut e = std::io::stderr().lock();
        let _ = write!(
            e,
            "\r\x1b[K{}: {of} messages, {gbps:.2} Gb/s, {secs:.1} s",
            self.label
        );
        let _ = e.flush();
        self.drawn = true;
    }

    /// Erases the line.
    fn erase(&mut self) {
        if self.drawn {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
            self.drawn = false;
        }
    }
}

impl softhca_perf::Progress for ProgressLine {
    fn begin(&mut self, now: Instant) {
        self.start = now;
        self.next = now + QUIET_FOR;
        if let Some((every, _, _)) = self.interval {
            self.interval = Some((every, now, 0));
        }
        if let Some(l) = &mut self.log {
            l.print(now, 0);
            l.last = (now, 0, true);
        }
    }

    fn update(&mut self, now: Instant, done: u64, total: u64, bytes_per_msg: u64) {
        self.report_interval(now, done, bytes_per_msg);
        if self.log.is_some() {
            self.erase();
        }
        if let Some(l) = &mut self.log {
            l.update(now, done * bytes_per_msg);
        }
        self.draw(now, done, total, bytes_per_msg);
    }

    fn finish(&mut self) {
        self.erase();
        if let Some(l) = &mut self.log {
            l.finish();
        }
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        self.erase();
    }
}
