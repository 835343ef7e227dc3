//! How a running test reports how far it got, without printing anything itself.

use std::time::Instant;

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
