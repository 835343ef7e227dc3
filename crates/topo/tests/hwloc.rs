//! hwloc (an independent reader of the same files) places every interface it knows on
//! the same CPUs and NUMA nodes as we do: on this machine and on the captured guests
//! (`HWLOC_FSROOT` points hwloc at a captured tree).

use std::path::Path;
use std::process::Command;

use softhca_topo::{CpuSet, Topology};

/// `hwloc-calc -I <kind> os=<name>` below `root`, as a set; `None` when hwloc does not
/// know the object.
fn hwloc(root: &Path, kind: &str, name: &str) -> Option<CpuSet> {
    let out = Command::new("hwloc-calc")
        .env("HWLOC_FSROOT", root)
        .args(["-I", kind, &format!("os={name}")])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || s.trim().is_empty() || !out.stderr.is_empty() {
        return None;
    }
    Some(s.trim().split(',').map(|c| c.parse().unwrap()).collect())
}

fn compare(root: &Path) -> usize {
    let t = Topology::read(root).unwrap();
    let all_nodes: CpuSet = t.nodes.iter().map(|n| n.id).collect();
    let mut checked = 0;
    for e in t
        .endpoints
        .iter()
        .filter(|e| !e.is_virtual && e.netdev.is_none())
    {
        let Some(pus) = hwloc(root, "pu", &e.name) else {
            continue;
        };
        assert_eq!(pus, e.cpus, "{}: CPUs", e.name);
        let numa = hwloc(root, "numa", &e.name).unwrap();
        // hwloc attaches a device with no node to the smallest object covering its
        // CPUs: every node when it has them all.
        let ours = e
            .numa
            .map_or(all_nodes.clone(), |n| [n].into_iter().collect());
        assert_eq!(numa, ours, "{}: NUMA nodes", e.name);
        checked += 1;
    }
    checked
}

fn have_hwloc() -> bool {
    let ok = Command::new("hwloc-calc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: hwloc-calc not installed (apt-get install hwloc)");
    }
    ok
}

#[test]
fn agrees_with_hwloc_on_the_captured_guest() {
    if !have_hwloc() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qemu-2numa");
    assert_eq!(compare(&root), 7, "eth0..eth6");
}

#[test]
fn agrees_with_hwloc_on_this_machine() {
    if !have_hwloc() {
        return;
    }
    let n = compare(Path::new("/"));
    eprintln!("{n} interfaces compared with hwloc");
}
