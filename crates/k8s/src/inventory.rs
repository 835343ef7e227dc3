//! The advertised device IDs: `<interface>-<n>` shares of each interface, with the
//! interface's NUMA node and link state, and the NUMA packing of preferred allocations.

use std::collections::BTreeMap;
use std::path::Path;

use softhca_topo::Topology;

use crate::api;
use crate::config::{NetdevPool, PluginConfig};
use crate::PluginError;

/// `Healthy` / `Unhealthy` of the API's constants.
pub const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`].
pub const UNHEALTHY: &str = "Unhealthy";

/// One advertised device ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEntry {
    /// `eth0-3`.
    pub id: String,
    /// The interface it is a share of.
    pub pool: NetdevPool,
    /// That interface's NUMA node, when its PCI function tells it (a virtual
    /// interface has none, and then no topology is advertised).
    pub numa: Option<usize>,
}

/// Every device ID the configuration asks for; fails on an interface that does not
/// exist, so a typo is reported at start.
pub fn inventory(cfg: &PluginConfig) -> Result<Vec<DeviceEntry>, PluginError> {
    let mut out = Vec::new();
    for pool in &cfg.netdevs {
        let ep = Topology::netdev(&cfg.sysfs_root, &pool.host)?;
        let numa = if ep.is_virtual { None } else { ep.numa };
        for n in 0..cfg.devices_per_netdev {
            out.push(DeviceEntry {
                id: format!("{}-{n}", pool.host),
                pool: pool.clone(),
                numa,
            });
        }
    }
    Ok(out)
}

/// Whether interface `name` can carry traffic: it exists, is administratively up
/// (`IFF_UP` in `flags`) and its operational state is not down
/// (`Documentation/networking/operstates.rst`; virtual interfaces say `unknown`).
pub fn link_up(sysfs_root: &Path, name: &str) -> bool {
    let dir = sysfs_root.join("sys/class/net").join(name);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_string());
    // A captured tree may lack `flags`: the operational state then decides alone.
    let admin_up = read("flags")
        .ok()
        .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
        .is_none_or(|f| f & libc::IFF_UP as u32 != 0);
    let oper = read("operstate").unwrap_or_default();
    admin_up && !matches!(oper.as_str(), "down" | "lowerlayerdown" | "notpresent" | "")
}

/// The `ListAndWatch` list: every ID with its health and NUMA node.
pub fn device_list(devs: &[DeviceEntry], sysfs_root: &Path) -> Vec<api::Device> {
    let mut up = BTreeMap::new();
    devs.iter()
        .map(|d| {
            let ok = *up
                .entry(d.pool.host.clone())
                .or_insert_with(|| link_up(sysfs_root, &d.pool.host));
            api::Device {
                id: d.id.clone(),
                health: if ok { HEALTHY } else { UNHEALTHY }.to_string(),
                topology: d.numa.map(|n| api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: n as i64 }],
                }),
            }
        })
        .collect()
}

/// `GetPreferredAllocation` for one container: `must` first, then IDs packed on as few
/// NUMA nodes and interfaces as possible. The node of `must` comes first, then the
/// node with the fewest free IDs that still holds all the rest (best fit, keeping
/// larger free blocks for larger requests), then the nodes with the most free IDs;
/// within a node, `must`'s interfaces first, then the interface with the most free IDs.
pub fn preferred(
    devs: &[DeviceEntry],
    available: &[String],
    must: &[String],
    size: usize,
) -> Vec<String> {
    let entry = |id: &String| devs.iter().find(|d| &d.id == id);
    let mut out: Vec<String> = must.to_vec();
    let need = size.saturating_sub(out.len());
    // node -> interface -> free IDs (ordered: `None` sorts before every node).
    let mut free: BTreeMap<Option<usize>, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for id in available.iter().filter(|id| !must.contains(id)) {
        if let Some(d) = entry(id) {
            free.entry(d.numa)
                .or_default()
                .entry(d.pool.host.clone())
                .or_default()
                .push(id.clone());
        }
    }
    let must_nodes: Vec<Option<usize>> = must.iter().filter_map(entry).map(|d| d.numa).collect();
    let must_ifs: Vec<&str> = must
        .iter()
        .filter_map(entry)
        .map(|d| d.pool.host.as_str())
        .collect();
    let count = |n: &Option<usize>| free[n].values().map(Vec::len).sum::<usize>();
    let mut nodes: Vec<Option<usize>> = free.keys().copied().collect();
    nodes.sort_by_key(|n| {
        let c = count(n);
        let rank = if must_nodes.contains(n) {
            0
        } else if c >= need {
            1
        } else {
            2
        };
        (rank, if rank == 1 { c } else { usize::MAX - c })
    });
    for n in nodes {
        let mut ifs: Vec<(&String, &Vec<String>)> = free[&n].iter().collect();
        ifs.sort_by_key(|(name, ids)| (!must_ifs.contains(&name.as_str()), usize::MAX - ids.len()));
        for id in ifs.into_iter().flat_map(|(_, ids)| ids) {
            if out.len() >= size {
                return out;
            }
            out.push(id.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs() -> Vec<DeviceEntry> {
        // eth0: node 0, 2 IDs; eth1: node 1, 3 IDs; eth2: node 1, 1 ID; lo: no node.
        let mut v = Vec::new();
        for (name, numa, n) in [
            ("eth0", Some(0), 2),
            ("eth1", Some(1), 3),
            ("eth2", Some(1), 1),
            ("lo", None, 1),
        ] {
            for i in 0..n {
                v.push(DeviceEntry {
                    id: format!("{name}-{i}"),
                    pool: NetdevPool::parse(name).unwrap(),
                    numa,
                });
            }
        }
        v
    }

    fn ids(v: &[DeviceEntry]) -> Vec<String> {
        v.iter().map(|d| d.id.clone()).collect()
    }

    #[test]
    fn packs_by_numa_node() {
        let d = devs();
        let all = ids(&d);
        // Two fit on node 0 (2 free) and on node 1 (4 free): best fit is node 0.
        assert_eq!(preferred(&d, &all, &[], 2), ["eth0-0", "eth0-1"]);
        // Three fit only on node 1; eth1 has the most.
        assert_eq!(preferred(&d, &all, &[], 3), ["eth1-0", "eth1-1", "eth1-2"]);
        assert_eq!(
            preferred(&d, &all, &[], 4),
            ["eth1-0", "eth1-1", "eth1-2", "eth2-0"]
        );
        // A must-include on node 1 pulls the rest there, its interface first.
        assert_eq!(
            preferred(&d, &all, &["eth2-0".into()], 2),
            ["eth2-0", "eth1-0"]
        );
        assert_eq!(
            preferred(&d, &all, &["eth0-1".into()], 2),
            ["eth0-1", "eth0-0"]
        );
        // More than one node holds: the rest spill to the largest.
        let seven = preferred(&d, &all, &[], 7);
        assert_eq!(seven.len(), 7);
        assert_eq!(&seven[..4], ["eth1-0", "eth1-1", "eth1-2", "eth2-0"]);
        // Only what is available, never more than asked.
        let some = vec!["eth1-2".to_string(), "eth0-0".to_string()];
        assert_eq!(preferred(&d, &some, &[], 1), ["eth0-0"]);
        assert_eq!(preferred(&d, &some, &[], 5).len(), 2);
    }

    #[test]
    fn link_state_from_sysfs() {
        let root = Path::new("/");
        assert!(link_up(root, "lo"), "lo is up");
        assert!(!link_up(root, "no-such-if"));
    }
}
