//! Clocks, per-thread CPU time and latency percentiles.

/// Reads clock `id` (0 if the kernel refuses it, which it does not for the two below).
fn clock(id: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; on failure it stays zero.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts
}

/// CLOCK_MONOTONIC in nanoseconds (the camera and host timestamps of the loopback run).
pub fn now_ns() -> u64 {
    let ts = clock(libc::CLOCK_MONOTONIC);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU seconds (user + system) used so far by the calling thread.
///
/// `CLOCK_THREAD_CPUTIME_ID`, not `getrusage(RUSAGE_THREAD)`: the latter reads the
/// scheduler's runtime as of the last tick or context switch, so a millisecond of frame
/// verification right after a wake-up read as nothing and was charged to the receive.
pub fn thread_cpu_s() -> f64 {
    let ts = clock(libc::CLOCK_THREAD_CPUTIME_ID);
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// CPU seconds used by the threads of this process whose name is `comm` (e.g. a
/// softhca datapath thread, `softhca-dp-<device>`): each one's `schedstat` runtime in
/// nanoseconds, or its `stat` user + system time in clock ticks (10 ms) where the kernel
/// keeps no schedstat.
pub fn named_threads_cpu_s(comm: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let want: String = comm.chars().take(15).collect();
    let mut total = 0.0;
    for e in dir.flatten() {
        let Ok(name) = std::fs::read_to_string(e.path().join("comm")) else {
            continue;
        };
        if name.trim_end_matches('\n') != want {
            continue;
        }
        total += task_cpu_s(&e.path());
    }
    total
}

/// CPU seconds of the task whose /proc directory is `task` (see [`named_threads_cpu_s`]).
fn task_cpu_s(task: &std::path::Path) -> f64 {
    let ns = std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
    if let Some(ns) = ns {
        return ns * 1e-9;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Ok(stat) = std::fs::read_to_string(task.join("stat")) else {
        return 0.0;
    };
    let Some(r) = stat.rfind(')') else {
        return 0.0;
    };
    // Fields after the name: state(3) ... utime(14) stime(15), 1-based overall.
    let f: Vec<&str> = stat[r + 1..].split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (get(11) + get(12)) / hz
}

/// The `q` quantile (0..=1) of `v` (sorted in place), nearest rank; 0 when empty.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let idx = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[idx]
}

/// A small seeded PRNG (xorshift64*) for loss decisions: reproducible runs.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator (0 is replaced by a constant).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }
    /// Next uniform value in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.5), 50.0);
        assert_eq!(quantile(&mut v, 0.99), 99.0);
        assert_eq!(quantile(&mut [], 0.5), 0.0);
    }

    #[test]
    fn rng_rate() {
        let mut r = Rng::new(1);
        let n = (0..100_000).filter(|_| r.chance(0.01)).count();
        assert!((800..1200).contains(&n), "{n}");
    }

    #[test]
    fn cpu_time_moves() {
        let a = thread_cpu_s();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_s() >= a);
    }

    /// A few milliseconds of work right after a wake-up show (they read as nothing from
    /// getrusage until the next tick), in this thread's clock and in a named thread's.
    #[test]
    fn cpu_time_counts_work_between_ticks() {
        let spin = |ms: u64| {
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_millis(ms) {
                std::hint::spin_loop();
            }
        };
        let seen = (0..5).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            let a = thread_cpu_s();
            spin(3);
            thread_cpu_s() - a >= 0.001
        });
        assert!(seen, "3 ms of spinning never read as 1 ms of CPU");
        let name = "stats-test-spin";
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                spin(60);
                std::thread::park();
            })
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let cpu = named_threads_cpu_s(name);
        t.thread().unpark();
        t.join().unwrap();
        assert!((0.02..1.0).contains(&cpu), "{cpu}");
    }
}
