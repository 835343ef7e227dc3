//! The node as `/sys` describes it: CPUs, NUMA nodes with their distances, and network
//! interfaces with the NUMA node and CPUs of the PCI device behind them.
//!
//! [`node_topology`] is the one function the API calls, so a fuller description (a
//! distance matrix over NICs, GPUs and NVMe devices) can take its place unchanged.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// A NUMA node.
#[derive(Debug, Clone, Serialize)]
pub struct NumaNode {
    /// Its number.
    pub node: u32,
    /// Its CPUs (`0-3,8`).
    pub cpulist: String,
    /// Its row of the distance table (SLIT: 10 = local).
    pub distances: Vec<u32>,
}

/// A network interface.
#[derive(Debug, Clone, Serialize)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// `up`, `down`, `unknown`, …
    pub operstate: String,
    /// Its MTU.
    pub mtu: Option<u32>,
    /// Its IP addresses.
    pub addresses: Vec<std::net::IpAddr>,
    /// No device behind it (loopback, veth, bridge, …).
    #[serde(rename = "virtual")]
    pub virtual_: bool,
    /// The PCI function behind it, if any (`0000:00:03.0`).
    pub pci: Option<String>,
    /// That device's NUMA node (none when unknown).
    pub numa_node: Option<u32>,
    /// That device's local CPUs.
    pub local_cpulist: Option<String>,
}

/// The node.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    /// Host name.
    pub hostname: String,
    /// Online CPUs (`0-1`).
    pub cpus_online: String,
    /// NUMA nodes.
    pub numa_nodes: Vec<NumaNode>,
    /// Network interfaces, by name.
    pub interfaces: Vec<Interface>,
}

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The node's topology, read from `/sys` (no root needed).
pub fn node_topology() -> Topology {
    topology_under(Path::new("/sys"))
}

fn topology_under(sys: &Path) -> Topology {
    let addrs = softhca::interface_addrs().unwrap_or_default();
    let mut names: Vec<String> = std::fs::read_dir(sys.join("class/net"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let interfaces = names
        .into_iter()
        .map(|name| {
            let dir = sys.join("class/net").join(&name);
            let pci = pci_function(&dir);
            let from_pci = |f: &str| pci.as_ref().and_then(|p| read(p.join(f)));
            Interface {
                operstate: read(dir.join("operstate")).unwrap_or_default(),
                mtu: read(dir.join("mtu")).and_then(|m| m.parse().ok()),
                addresses: addrs
                    .iter()
                    .filter(|a| a.name == name)
                    .map(|a| a.ip)
                    .collect(),
                virtual_: !dir.join("device").exists(),
                numa_node: from_pci("numa_node").and_then(|n| n.parse().ok()),
                local_cpulist: from_pci("local_cpulist"),
                pci: pci.and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned())),
                name,
            }
        })
        .collect();
    Topology {
        hostname: read("/proc/sys/kernel/hostname").unwrap_or_default(),
        cpus_online: read(sys.join("devices/system/cpu/online")).unwrap_or_default(),
        numa_nodes: numa_nodes(sys),
        interfaces,
    }
}

/// The first ancestor of the interface's device that has a `numa_node` (a virtio
/// device's parent is the PCI function).
fn pci_function(netdir: &Path) -> Option<PathBuf> {
    let mut dev = std::fs::canonicalize(netdir.join("device")).ok()?;
    for _ in 0..4 {
        if dev.join("numa_node").exists() {
            return Some(dev);
        }
        dev = dev.parent()?.to_path_buf();
    }
    None
}

fn numa_nodes(sys: &Path) -> Vec<NumaNode> {
    let base = sys.join("devices/system/node");
    let mut nodes: Vec<NumaNode> = std::fs::read_dir(&base)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let node = name.strip_prefix("node")?.parse().ok()?;
            Some(NumaNode {
                node,
                cpulist: read(e.path().join("cpulist")).unwrap_or_default(),
                distances: read(e.path().join("distance"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|d| d.parse().ok())
                    .collect(),
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.node);
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_node() {
        let t = node_topology();
        assert!(!t.cpus_online.is_empty());
        let lo = t.interfaces.iter().find(|i| i.name == "lo").expect("lo");
        assert!(lo.virtual_ && lo.pci.is_none() && lo.numa_node.is_none());
        assert!(lo.addresses.contains(&"127.0.0.1".parse().unwrap()));
        if let Some(n) = t.numa_nodes.first() {
            assert_eq!(n.distances.get(n.node as usize), Some(&10), "SLIT local");
        }
    }
}
