//! Which CPU the datapath thread runs on: `SOFTHCA_CPU=<n>`, or `auto`, which picks
//! one the process may use (so never outside a container's cpuset, which a Kubernetes
//! device plugin cannot know) and, when /sys tells it, local to the served
//! interface's NUMA node.

use std::path::Path;
use std::sync::Mutex;

use softhca_topo::{CpuSet, Topology};

use crate::config::CpuPin;

/// CPUs already given to a datapath thread by `auto` in this process: a second device
/// gets another CPU while one is free.
static TAKEN: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Where a device's datapath thread runs, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The CPU.
    pub cpu: usize,
    /// Chosen by `SOFTHCA_CPU=auto` (else given as a number).
    pub auto: bool,
    /// The CPUs the opening thread was allowed to run on (`sched_getaffinity`).
    pub allowed: CpuSet,
    /// The interface placed near, when the device serves one.
    pub netdev: Option<String>,
    /// That interface's local CPUs, when its place on the PCI tree is known.
    pub local: Option<CpuSet>,
    /// That interface's NUMA node, when known.
    pub numa: Option<usize>,
}

impl std::fmt::Display for Placement {
    /// `3 (auto: allowed 0-3, eth1 local 2-3, NUMA node 1)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.auto {
            return write!(f, "{} (SOFTHCA_CPU)", self.cpu);
        }
        write!(f, "{} (auto: allowed {}", self.cpu, self.allowed)?;
        match (&self.netdev, &self.local) {
            (Some(n), Some(l)) => write!(f, ", {n} local {l}")?,
            (Some(n), None) => write!(f, ", {n} has no NUMA locality")?,
            _ => {}
        }
        if let Some(n) = self.numa {
            write!(f, ", NUMA node {n}")?;
        }
        f.write_str(")")
    }
}

/// The placement `pin` asks for, the device serving `netdev`; `None` when nothing is
/// pinned or `auto` cannot read the affinity mask.
pub(crate) fn place(pin: Option<CpuPin>, netdev: Option<&str>) -> Option<Placement> {
    let allowed: CpuSet = match softhca_io::allowed_cpus() {
        Ok(v) => v.into_iter().collect(),
        Err(e) => {
            tracing::warn!("SOFTHCA_CPU=auto: {e}; not pinning");
            CpuSet::new()
        }
    };
    match pin? {
        CpuPin::Cpu(cpu) => Some(Placement {
            cpu,
            auto: false,
            allowed,
            netdev: netdev.map(str::to_string),
            local: None,
            numa: None,
        }),
        CpuPin::Auto => {
            let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
            let p = place_auto(Path::new("/"), &allowed, netdev, &taken)?;
            taken.push(p.cpu);
            Some(p)
        }
    }
}

/// `auto` below sysfs root `root`: the candidates are `allowed` ∩ the interface's local
/// CPUs, or `allowed` when that is empty or unknown; the highest candidate nobody in
/// this process took, else the highest (CPU 0 carries most of the housekeeping work).
pub(crate) fn place_auto(
    root: &Path,
    allowed: &CpuSet,
    netdev: Option<&str>,
    taken: &[usize],
) -> Option<Placement> {
    let ep = netdev.and_then(|n| Topology::netdev(root, n).ok());
    // A virtual interface (loopback, veth) is local to every CPU: no preference.
    let (local, numa) = match &ep {
        Some(e) if !e.is_virtual => (Some(e.cpus.clone()), e.numa),
        _ => (None, None),
    };
    let near = local
        .as_ref()
        .map(|l| allowed.intersection(l))
        .filter(|c| !c.is_empty());
    let cands = near.as_ref().unwrap_or(allowed);
    let cpu = cands
        .iter()
        .rev()
        .find(|c| !taken.contains(c))
        .or_else(|| cands.iter().next_back())?;
    Some(Placement {
        cpu,
        auto: true,
        allowed: allowed.clone(),
        netdev: netdev.map(str::to_string),
        local,
        numa,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../topo/tests/fixtures/qemu-2numa")
    }

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_list(s).unwrap()
    }

    #[test]
    fn auto_stays_in_the_allowed_set_near_the_interface() {
        // eth3 is on node 1 (CPUs 2-3) of the captured two-node guest.
        let p = |allowed: &str, netdev: &str, taken: &[usize]| {
            place_auto(&guest(), &set(allowed), Some(netdev), taken).map(|p| p.cpu)
        };
        assert_eq!(p("0-3", "eth3", &[]), Some(3));
        assert_eq!(p("0-3", "eth3", &[3]), Some(2), "a second device");
        assert_eq!(p("0-3", "eth3", &[2, 3]), Some(3), "all local ones taken");
        assert_eq!(p("0-2", "eth3", &[]), Some(2), "container cpuset 0-2");
        assert_eq!(p("0-1", "eth3", &[]), Some(1), "no local CPU allowed");
        assert_eq!(p("0-3", "eth2", &[]), Some(1), "eth2 is on node 0");
        assert_eq!(p("1", "eth0", &[]), Some(1), "eth0 has no node");
        assert_eq!(p("0-3", "lo", &[]), Some(3), "virtual: anywhere allowed");
        assert_eq!(
            place_auto(&guest(), &CpuSet::new(), Some("eth3"), &[]),
            None
        );
        let shown = place_auto(&guest(), &set("0-3"), Some("eth3"), &[])
            .unwrap()
            .to_string();
        assert_eq!(shown, "3 (auto: allowed 0-3, eth3 local 2-3, NUMA node 1)");
        let shown = place_auto(&guest(), &set("0-3"), Some("lo"), &[])
            .unwrap()
            .to_string();
        assert_eq!(shown, "3 (auto: allowed 0-3, lo has no NUMA locality)");
    }
}
