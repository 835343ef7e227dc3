//! Host topology read from /sys, without root: NUMA nodes with their CPUs and SLIT
//! distances, and the network interfaces, GPUs, NVMe controllers and softhca devices
//! placed on the PCI tree, with the distance classes `nvidia-smi topo -m` prints
//! between them ([`Link`]).
//!
//! Everything is read below a root directory (`/` on a live system), so a test can
//! point it at a captured tree. The files read are the ones the kernel documents in
//! `Documentation/ABI/testing/sysfs-bus-pci` and `sysfs-devices-system-cpu`:
//! `class`, `vendor`, `numa_node` and `local_cpulist` of a PCI function,
//! `devices/system/node/node*/{cpulist,distance}`, `devices/system/cpu/online`, and the
//! `device` and `lower_*` links of `/sys/class/net/*`.

mod cpuset;
mod render;
mod sysfs;

use std::path::Path;

pub use cpuset::CpuSet;
pub use render::{render_text, Report, LEGEND};
use sysfs::Sysfs;

/// Why the topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    /// A file that must exist could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file, under the sysfs root.
        path: String,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// A file did not hold what the kernel writes there.
    #[error("{0}")]
    Parse(String),
    /// No such network interface.
    #[error("no network interface {0:?}")]
    NoInterface(String),
}

/// What an endpoint of the matrix is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A network interface.
    Net,
    /// A display or 3D controller (PCI class 0x03).
    Gpu,
    /// An NVMe controller.
    Nvme,
    /// A softhca device, placed where its interface is.
    Softhca,
}

/// One row and column of the matrix.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Endpoint {
    /// Interface, controller or device name (`eth0`, `nvme0`, `GPU0`, `softhca0`).
    pub name: String,
    /// What it is.
    pub kind: Kind,
    /// The PCI function behind it (`0000:06:01.0`), if any.
    pub pci: Option<String>,
    /// The path from the host bridge to that function: `pci0000:04`, then each bridge
    /// and finally the function itself; empty for a virtual interface.
    pub pci_path: Vec<String>,
    /// Its NUMA node: the PCI function's `numa_node`, or the only node of a
    /// single-node machine; `None` when unknown (`-1` on a multi-node machine).
    pub numa: Option<usize>,
    /// CPUs local to it (`local_cpulist` among online CPUs; all online CPUs when the
    /// device says nothing).
    pub cpus: CpuSet,
    /// The interface a softhca device serves, or the parent interface a VLAN, macvlan
    /// or bond leads to.
    pub netdev: Option<String>,
    /// A network interface with no hardware below it (loopback, veth, bridge, dummy).
    pub is_virtual: bool,
}

/// A NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NumaNode {
    /// Node number.
    pub id: usize,
    /// Its CPUs.
    pub cpus: CpuSet,
    /// Its row of the SLIT (`nodeN/distance`), in the order of the online nodes.
    pub distances: Vec<u32>,
}

/// How two endpoints are connected, nearest first, as `nvidia-smi topo -m` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Link {
    /// The same device.
    X,
    /// At most a single PCIe bridge (or one switch) between them.
    Pix,
    /// Several PCIe bridges, not crossing the host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Between host bridges within one NUMA node.
    Node,
    /// Across the SMP interconnect between NUMA nodes.
    Sys,
}

impl Link {
    /// The label in the matrix.
    pub fn label(self) -> &'static str {
        match self {
            Link::X => "X",
            Link::Pix => "PIX",
            Link::Pxb => "PXB",
            Link::Phb => "PHB",
            Link::Node => "NODE",
            Link::Sys => "SYS",
        }
    }
}

/// The host as /sys describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Online CPUs.
    pub cpus: CpuSet,
    /// Online NUMA nodes (one node 0 with every CPU when the kernel has no NUMA).
    pub nodes: Vec<NumaNode>,
    /// Network interfaces (by name), then GPUs and NVMe controllers (by PCI address),
    /// then softhca devices added with [`Topology::add_softhca`].
    pub endpoints: Vec<Endpoint>,
}

impl Topology {
    /// Reads the topology below `root` (`/` on a live system).
    pub fn read(root: &Path) -> Result<Topology, TopoError> {
        let sys = Sysfs::new(root);
        let cpus = sys.online_cpus()?;
        let nodes = sys.numa_nodes(&cpus)?;
        let mut endpoints = Vec::new();
        for name in sys.netdev_names()? {
            match sys.netdev(&name, &cpus, &nodes) {
                Ok(e) => endpoints.push(e),
                // Removed since the directory was listed (a veth of a container that
                // just stopped): not part of the machine any more.
                Err(TopoError::NoInterface(_)) => {}
                Err(e) => return Err(e),
            }
        }
        endpoints.extend(sys.pci_class_endpoints(&cpus, &nodes)?);
        endpoints.extend(sys.nvme_endpoints(&cpus, &nodes)?);
        Ok(Topology {
            cpus,
            nodes,
            endpoints,
        })
    }

    /// Reads only what placing a device on interface `name` needs: the interface's
    /// endpoint (NUMA node, local CPUs) below `root`.
    pub fn netdev(root: &Path, name: &str) -> Result<Endpoint, TopoError> {
        let sys = Sysfs::new(root);
        let cpus = sys.online_cpus()?;
        let nodes = sys.numa_nodes(&cpus)?;
        sys.netdev(name, &cpus, &nodes)
    }

    /// The endpoint called `name`.
    pub fn endpoint(&self, name: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.name == name)
    }

    /// Adds softhca device `name` serving interface `netdev` (no interface: placed like
    /// a virtual interface).
    pub fn add_softhca(&mut self, name: &str, netdev: Option<&str>) {
        let base = netdev.and_then(|n| self.endpoint(n)).cloned();
        let e = match base {
            Some(b) => Endpoint {
                name: name.to_string(),
                kind: Kind::Softhca,
                netdev: Some(b.name),
                ..b
            },
            None => Endpoint {
                name: name.to_string(),
                kind: Kind::Softhca,
                pci: None,
                pci_path: Vec::new(),
                numa: single_node(&self.nodes),
                cpus: self.cpus.clone(),
                netdev: netdev.map(str::to_string),
                is_virtual: true,
            },
        };
        self.endpoints.push(e);
    }

    /// How `a` and `b` are connected.
    pub fn link(&self, a: &Endpoint, b: &Endpoint) -> Link {
        classify(a, b)
    }
}

/// The node of a single-node machine, where every device is local to it.
fn single_node(nodes: &[NumaNode]) -> Option<usize> {
    match nodes {
        [only] => Some(only.id),
        _ => None,
    }
}

/// The class of the path between two endpoints, from their PCI paths and NUMA nodes.
///
/// Different host bridges: NODE when both are on one NUMA node (or neither node is
/// known), SYS otherwise. The same host bridge: PHB when their paths part at the host
/// bridge itself, else PIX when each is at most one bridge below the bridge where the
/// paths part (two functions behind one bridge, or two downstream ports of one PCIe
/// switch, which `nvidia-smi` also calls PIX), else PXB. An endpoint without a PCI
/// function lives in host memory: NODE or SYS by NUMA node alone. A softhca device and
/// its own interface are one device: X.
pub fn classify(a: &Endpoint, b: &Endpoint) -> Link {
    if a.name == b.name
        || a.netdev.as_deref() == Some(b.name.as_str()) && a.kind == Kind::Softhca
        || b.netdev.as_deref() == Some(a.name.as_str()) && b.kind == Kind::Softhca
    {
        return Link::X;
    }
    let numa_link = || match (a.numa, b.numa) {
        (Some(x), Some(y)) if x != y => Link::Sys,
        (None, Some(_)) | (Some(_), None) => Link::Sys,
        _ => Link::Node,
    };
    let (pa, pb) = (&a.pci_path, &b.pci_path);
    if pa.is_empty() || pb.is_empty() || pa[0] != pb[0] {
        return numa_link();
    }
    let common = pa.iter().zip(pb.iter()).take_while(|(x, y)| x == y).count();
    if common == 1 {
        return Link::Phb;
    }
    // Bridges strictly between the parting bridge and each device.
    let below = |p: &Vec<String>| p.len().saturating_sub(common + 1);
    if below(pa) <= 1 && below(pb) <= 1 {
        Link::Pix
    } else {
        Link::Pxb
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(name: &str, path: &[&str], numa: Option<usize>) -> Endpoint {
        Endpoint {
            name: name.into(),
            kind: Kind::Net,
            pci: path.last().map(|s| s.to_string()),
            pci_path: path.iter().map(|s| s.to_string()).collect(),
            numa,
            cpus: CpuSet::new(),
            netdev: None,
            is_virtual: path.is_empty(),
        }
    }

    #[test]
    fn classes_from_paths() {
        let sw_a = ep(
            "a",
            &["pci0000:00", "00:01.0", "01:00.0", "02:00.0", "03:00.0"],
            Some(0),
        );
        let sw_b = ep(
            "b",
            &["pci0000:00", "00:01.0", "01:00.0", "02:01.0", "04:00.0"],
            Some(0),
        );
        let deep = ep(
            "c",
            &[
                "pci0000:00",
                "00:01.0",
                "01:00.0",
                "02:01.0",
                "04:00.0",
                "05:00.0",
                "06:00.0",
            ],
            Some(0),
        );
        let other_port = ep("d", &["pci0000:00", "00:02.0", "07:00.0"], Some(0));
        let other_root = ep("e", &["pci0000:80", "80:01.0"], Some(0));
        let remote = ep("f", &["pci0000:c0", "c0:01.0"], Some(1));
        let lo = ep("lo", &[], None);
        assert_eq!(classify(&sw_a, &sw_a), Link::X);
        assert_eq!(classify(&sw_a, &sw_b), Link::Pix, "one switch");
        assert_eq!(classify(&sw_a, &deep), Link::Pxb);
        assert_eq!(classify(&sw_a, &other_port), Link::Phb);
        assert_eq!(classify(&sw_a, &other_root), Link::Node);
        assert_eq!(classify(&sw_a, &remote), Link::Sys);
        assert_eq!(classify(&remote, &sw_a), Link::Sys, "symmetric");
        assert_eq!(
            classify(&lo, &sw_a),
            Link::Sys,
            "unknown node against a known one"
        );
        assert_eq!(classify(&lo, &ep("lo2", &[], None)), Link::Node);
    }
}
