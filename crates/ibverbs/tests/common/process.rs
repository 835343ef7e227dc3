//! Running the programs under test: their output when they end (or are killed at a
//! timeout), and one program pair at a time per test binary. Shared by the test suites of
//! both drop-in libraries.

use std::io::Read;
use std::process::Child;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Output of a finished process, killed after `timeout` (status `None` then).
pub struct Done {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Done {
    pub fn all(&self) -> String {
        format!(
            "status {:?}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

pub fn finish(mut child: Child, timeout: Duration) -> Done {
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s.code(),
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    Done {
        status,
        stdout,
        stderr,
    }
}

/// One server/client pair at a time per test binary: on a 2-core box parallel pairs of
/// CQ-spinning programs only slow each other down.
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}
