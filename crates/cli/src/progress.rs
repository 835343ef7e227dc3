//! The live progress line on stderr (only on a terminal, only for runs past ~2 s).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca::Context;

use softhca_perf::ProgressLog;

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
    /// The `progress <unix time> <bytes>` log (see `PerfArgs::progress`).
    log: Option<(Duration, Option<ProgressLog<std::io::Stderr>>)>,
    /// The device whose QPs' congestion state follows each interval line (see
    /// [`ProgressLine::with_congestion`]).
    congestion: Option<Arc<Context>>,
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
            congestion: None,
        }
    }

    /// Also prints, after each interval line, one `congestion <qpn> <state>` line per
    /// RC QP of `ctx` (round trip, window, rate, cuts): how a controller moved during a
    /// run, where the totals at its end hide a window that stopped growing.
    pub fn with_congestion(mut self, ctx: Option<Arc<Context>>) -> ProgressLine {
        self.congestion = ctx;
        self
    }

    /// Also prints `progress` lines at most every `every` (see `PerfArgs::progress`),
    /// from the start of the measured part.
    pub fn with_log(mut self, every: Option<Duration>) -> ProgressLine {
        self.log = every.map(|every| (every, None));
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
        for (qpn, cc) in self.congestion.iter().flat_map(|c| c.congestion()) {
            eprintln!("congestion {:#x} {cc}", qpn.value());
        }
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
        if let Some((every, log)) = &mut self.log {
            *log = Some(ProgressLog::new(std::io::stderr(), *every, now));
        }
    }

    fn update(&mut self, now: Instant, done: u64, total: u64, bytes_per_msg: u64) {
        self.report_interval(now, done, bytes_per_msg);
        if self.log.is_some() {
            self.erase();
        }
        if let Some((_, Some(l))) = &mut self.log {
            l.update(now, done * bytes_per_msg);
        }
        self.draw(now, done, total, bytes_per_msg);
    }

    fn finish(&mut self) {
        self.erase();
        if let Some((_, Some(l))) = &mut self.log {
            l.finish();
        }
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        self.erase();
    }
}
