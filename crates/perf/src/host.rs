//! What the host itself costs, apart from any transport: a system call and the ICRC.
//! The bench's ratios move with both from one machine kind to another (a system call
//! costs 0.1 µs on bare metal and over 1 µs in a nested guest with page-table isolation;
//! the CRC folds 64 bytes a step with VPCLMULQDQ and 16 without), so it reports them
//! next to its table.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use serde::Serialize;
use softhca_wire::{self as wire, UdpPseudo};

/// Bytes the ICRC rate is measured over at a time: a 64 KiB message's worth.
const ICRC_BUF: usize = 64 << 10;

/// The measured costs of this host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostCosts {
    /// The CPU's model name (`/proc/cpuinfo`), if known.
    pub cpu: Option<String>,
    /// One cheap system call (`getppid`), in µs: the fixed cost every send and receive
    /// pays.
    pub syscall_us: f64,
    /// The ICRC over 64 KiB on one core, in GB/s (1e9 bytes).
    pub icrc_gbps: f64,
}

/// Measures the host for about `budget` (split between the two figures).
pub fn measure(budget: Duration) -> HostCosts {
    HostCosts {
        cpu: cpu_model(),
        syscall_us: per_call(budget / 2, || {
            // SAFETY: getppid takes no arguments and cannot fail.
            unsafe { libc::getppid() };
        }) * 1e6,
        icrc_gbps: icrc_gbps(budget / 2),
    }
}

/// Seconds per call of `f`, called in batches until `budget` has passed.
fn per_call(budget: Duration, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < budget {
        for _ in 0..256 {
            f();
        }
        calls += 256;
    }
    start.elapsed().as_secs_f64() / calls as f64
}

fn icrc_gbps(budget: Duration) -> f64 {
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let p = UdpPseudo::from_addrs(lo, lo, 0, 4791, 0);
    let buf: Vec<u8> = (0..ICRC_BUF).map(|i| i as u8).collect();
    let mut acc = 0u32;
    let s = per_call(budget, || {
        acc ^= wire::icrc(&p, std::hint::black_box(&buf));
    });
    std::hint::black_box(acc);
    ICRC_BUF as f64 / s / 1e9
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_measured() {
        let h = measure(Duration::from_millis(40));
        assert!(h.syscall_us > 0.0 && h.syscall_us < 1000.0, "{h:?}");
        assert!(h.icrc_gbps > 0.01, "{h:?}");
    }
}
