//! The container edits of one interface, shared by `Allocate` and the CDI spec
//! (Container Device Interface, `cdiVersion` 0.5.0: github.com/cncf-tags/container-device-interface,
//! SPEC.md), so a runtime given the CDI name makes the same container as the envs and
//! mounts would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::config::PluginConfig;
use crate::PluginError;

/// The environment a container using `container_netdev` gets.
pub fn envs(cfg: &PluginConfig, container_netdev: &str) -> BTreeMap<String, String> {
    [
        ("SOFTHCA_NETDEV", container_netdev.to_string()),
        ("SOFTHCA_CPU", "auto".to_string()),
        (
            "LD_LIBRARY_PATH",
            cfg.container_lib_dir.display().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The spec file for `kind` in `dir`: `softhca.io/rdma` is `softhca.io_rdma.json`.
pub fn spec_path(dir: &Path, kind: &str) -> PathBuf {
    dir.join(format!("{}.json", kind.replace('/', "_")))
}

/// Writes the CDI spec: one device per container interface, named after it.
pub fn write_spec(cfg: &PluginConfig, kind: &str, dir: &Path) -> Result<PathBuf, PluginError> {
    let mut names: Vec<&str> = cfg.netdevs.iter().map(|p| p.container.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let devices: Vec<serde_json::Value> = names
        .iter()
        .map(|n| {
            let env: Vec<String> = envs(cfg, n)
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            json!({
                "name": n,
                "containerEdits": {
                    "env": env,
                    "mounts": [{
                        "hostPath": cfg.lib_dir.display().to_string(),
                        "containerPath": cfg.container_lib_dir.display().to_string(),
                        "options": ["ro", "nosuid", "nodev", "bind"],
                    }],
                },
            })
        })
        .collect();
    let spec = json!({ "cdiVersion": "0.5.0", "kind": kind, "devices": devices });
    std::fs::create_dir_all(dir).map_err(PluginError::io(format!("create {}", dir.display())))?;
    let path = spec_path(dir, kind);
    let text = serde_json::to_vec_pretty(&spec).map_err(|e| PluginError::Serve(e.to_string()))?;
    std::fs::write(&path, text).map_err(PluginError::io(format!("write {}", path.display())))?;
    Ok(path)
}
