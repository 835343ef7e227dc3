//! `<run dir>/k8s-allocations.json`: what each `Allocate` handed out, for the node
//! agent and for operators. The kubelet names no pod in `Allocate`, so a record is keyed
//! by its device IDs; an ID allocated again replaces the record that held it (the pod
//! that had it is gone).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::PluginError;

/// The file name in the run directory.
pub const ALLOCATIONS_FILE: &str = "k8s-allocations.json";

/// One container's allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// When `Allocate` answered, seconds since the Unix epoch.
    pub allocated_at: u64,
    /// The device IDs.
    pub device_ids: Vec<String>,
    /// Their host interfaces.
    pub netdevs: Vec<String>,
    /// Their NUMA nodes (known ones).
    pub numa_nodes: Vec<usize>,
    /// The environment handed to the container.
    pub envs: BTreeMap<String, String>,
    /// CDI device names handed out.
    pub cdi_devices: Vec<String>,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocations {
    /// The resource they were allocated from.
    pub resource_name: String,
    /// Oldest first.
    pub allocations: Vec<Allocation>,
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The file below `run_dir`.
pub fn path(run_dir: &Path) -> PathBuf {
    run_dir.join(ALLOCATIONS_FILE)
}

/// Reads the file; a missing or unreadable one is empty (it is rewritten whole).
pub fn load(run_dir: &Path) -> Allocations {
    std::fs::read(path(run_dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Adds `new` (dropping records that share one of its IDs) and writes the file
/// atomically (a reader never sees half of it).
pub fn add(run_dir: &Path, resource_name: &str, new: Vec<Allocation>) -> Result<(), PluginError> {
    let mut all = load(run_dir);
    all.resource_name = resource_name.to_string();
    for a in new {
        all.allocations
            .retain(|old| !old.device_ids.iter().any(|id| a.device_ids.contains(id)));
        all.allocations.push(a);
    }
    std::fs::create_dir_all(run_dir)
        .map_err(PluginError::io(format!("create {}", run_dir.display())))?;
    let tmp = run_dir.join(format!(".{ALLOCATIONS_FILE}.{}", std::process::id()));
    let text = serde_json::to_vec_pretty(&all).map_err(|e| PluginError::Serve(e.to_string()))?;
    std::fs::write(&tmp, text).map_err(PluginError::io(format!("write {}", tmp.display())))?;
    let dst = path(run_dir);
    std::fs::rename(&tmp, &dst).map_err(PluginError::io(format!("write {}", dst.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(ids: &[&str]) -> Allocation {
        Allocation {
            allocated_at: 1,
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            netdevs: vec!["eth0".into()],
            numa_nodes: vec![0],
            envs: BTreeMap::new(),
            cdi_devices: Vec::new(),
        }
    }

    #[test]
    fn a_reused_id_replaces_its_record() {
        let dir = std::env::temp_dir().join(format!("softhca-k8s-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        add(
            &dir,
            "softhca.io/rdma",
            vec![alloc(&["eth0-0", "eth0-1"]), alloc(&["eth0-2"])],
        )
        .unwrap();
        add(&dir, "softhca.io/rdma", vec![alloc(&["eth0-1"])]).unwrap();
        let got = load(&dir);
        assert_eq!(got.resource_name, "softhca.io/rdma");
        let ids: Vec<_> = got
            .allocations
            .iter()
            .map(|a| a.device_ids.join(","))
            .collect();
        assert_eq!(ids, ["eth0-2", "eth0-1"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
