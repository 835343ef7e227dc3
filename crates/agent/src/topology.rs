//! The node as `/sys` describes it: CPUs, NUMA nodes with their distances, and network
//! interfaces with the NUMA node and CPUs of the PCI device behind them.
//!
//! The reading is softhca-topo's (the same as `softhca topo`); this adds what an operator
//! asks of an interface besides its place (state, MTU, addresses).

use std::path::Path;

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
    /// What `softhca topo --json --all` prints: the endpoints (interfaces, GPUs, NVMe)
    /// and the `nvidia-smi topo -m` classes between each pair.
    pub matrix: serde_json::Value,
}

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The node's topology, read from `/sys` (no root needed).
pub fn node_topology() -> Result<Topology, String> {
    topology_under(Path::new("/"))
}

fn topology_under(root: &Path) -> Result<Topology, String> {
    let topo = softhca_topo::Topology::read(root).map_err(|e| e.to_string())?;
    let addrs = softhca::interface_addrs().unwrap_or_default();
    let net = root.join("sys/class/net");
    let interfaces = topo
        .endpoints
        .iter()
        .filter(|e| e.kind == softhca_topo::Kind::Net)
        .map(|e| Interface {
            name: e.name.clone(),
            operstate: read(net.join(&e.name).join("operstate")).unwrap_or_default(),
            mtu: read(net.join(&e.name).join("mtu")).and_then(|m| m.parse().ok()),
            addresses: addrs
                .iter()
                .filter(|a| a.name == e.name)
                .map(|a| a.ip)
                .collect(),
            virtual_: e.is_virtual,
            pci: e.pci.clone(),
            numa_node: e.numa.filter(|_| e.pci.is_some()).map(|n| n as u32),
            local_cpulist: e.pci.as_ref().map(|_| e.cpus.to_string()),
        })
        .collect();
    let matrix = serde_json::to_value(topo.report(true)).map_err(|e| e.to_string())?;
    Ok(Topology {
        hostname: read("/proc/sys/kernel/hostname").unwrap_or_default(),
        cpus_online: topo.cpus.to_string(),
        numa_nodes: topo
            .nodes
            .iter()
            .map(|n| NumaNode {
                node: n.id as u32,
                cpulist: n.cpus.to_string(),
                distances: n.distances.clone(),
            })
            .collect(),
        interfaces,
        matrix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_node() {
        let t = node_topology().expect("topology");
        assert!(!t.cpus_online.is_empty());
        let lo = t.interfaces.iter().find(|i| i.name == "lo").expect("lo");
        assert!(lo.virtual_ && lo.pci.is_none() && lo.numa_node.is_none());
        assert!(lo.addresses.contains(&"127.0.0.1".parse().unwrap()));
        if let Some(n) = t.numa_nodes.first() {
            assert_eq!(n.distances.get(n.node as usize), Some(&10), "SLIT local");
        }
    }
}
