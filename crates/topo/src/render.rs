//! The matrix as `nvidia-smi topo -m` prints it, and as a serializable report.

use std::fmt::Write;

use crate::{classify, Endpoint, Link, NumaNode, Topology};

/// The legend under the matrix, in `nvidia-smi topo -m`'s words.
pub const LEGEND: &[(&str, &str)] = &[
    ("X", "Self"),
    (
        "SYS",
        "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    ),
    (
        "NODE",
        "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    ),
    (
        "PHB",
        "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    ),
    (
        "PXB",
        "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    ),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
];

/// What `softhca topo --json` prints: the endpoints, the matrix (row `i`, column `j`
/// is the link between endpoints `i` and `j`), the NUMA nodes and the legend.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report<'a> {
    /// Online CPUs.
    pub cpus: String,
    /// Rows and columns.
    pub endpoints: Vec<&'a Endpoint>,
    /// Links, by row then column.
    pub matrix: Vec<Vec<Link>>,
    /// NUMA nodes with SLIT rows.
    pub numa_nodes: &'a [NumaNode],
    /// Label and meaning of each class.
    pub legend: &'a [(&'static str, &'static str)],
}

impl Topology {
    /// The endpoints to show: every one with hardware below it, and virtual interfaces
    /// only when `all` or when a softhca device serves them.
    pub fn shown(&self, all: bool) -> Vec<&Endpoint> {
        let served = |e: &Endpoint| {
            self.endpoints
                .iter()
                .any(|s| s.netdev.as_deref() == Some(e.name.as_str()) && s.name != e.name)
        };
        self.endpoints
            .iter()
            .filter(|e| all || !e.is_virtual || e.kind != crate::Kind::Net || served(e))
            .collect()
    }

    /// The report over [`Topology::shown`] endpoints.
    pub fn report(&self, all: bool) -> Report<'_> {
        let endpoints = self.shown(all);
        let matrix = endpoints
            .iter()
            .map(|a| endpoints.iter().map(|b| classify(a, b)).collect())
            .collect();
        Report {
            cpus: self.cpus.to_string(),
            endpoints,
            matrix,
            numa_nodes: &self.nodes,
            legend: LEGEND,
        }
    }
}

/// The matrix with CPU and NUMA affinity columns, the NUMA distance table and the
/// legend, laid out like `nvidia-smi topo -m`.
pub fn render_text(r: &Report<'_>) -> String {
    let mut s = String::new();
    let w = r
        .endpoints
        .iter()
        .map(|e| e.name.len())
        .max()
        .unwrap_or(0)
        .max(4)
        + 2;
    let _ = write!(s, "{:w$}", "");
    for e in &r.endpoints {
        let _ = write!(s, "{:<w$}", e.name);
    }
    let _ = writeln!(s, "{:<16}{:<16}PCI", "CPU Affinity", "NUMA Affinity");
    for (e, row) in r.endpoints.iter().zip(&r.matrix) {
        let _ = write!(s, "{:<w$}", e.name);
        for l in row {
            let _ = write!(s, "{:<w$}", format!(" {}", l.label()));
        }
        let numa = e.numa.map_or("N/A".to_string(), |n| n.to_string());
        let via = match (&e.pci, &e.netdev) {
            (Some(p), Some(n)) => format!("{p} via {n}"),
            (Some(p), None) => p.clone(),
            (None, Some(n)) => format!("virtual, via {n}"),
            (None, None) => "virtual".to_string(),
        };
        let _ = writeln!(s, "{:<16}{:<16}{via}", e.cpus.to_string(), numa);
    }
    let _ = writeln!(s, "\nNUMA node distances (SLIT):");
    let _ = write!(s, "{:8}", "");
    for n in r.numa_nodes {
        let _ = write!(s, "{:<8}", format!("node{}", n.id));
    }
    let _ = writeln!(s, "CPUs");
    for n in r.numa_nodes {
        let _ = write!(s, "{:<8}", format!("node{}", n.id));
        for d in &n.distances {
            let _ = write!(s, "{d:<8}");
        }
        let _ = writeln!(s, "{}", n.cpus);
    }
    let _ = writeln!(s, "\nLegend:\n");
    for (k, v) in r.legend {
        let _ = writeln!(s, "  {k:<4} = {v}");
    }
    s
}
