//! `softhca topo` on this machine and on the captured two-node guest, and
//! `SOFTHCA_CPU=auto` under `taskset` as `softhca devinfo -v` reports it.

use std::path::PathBuf;
use std::process::{Command, Output};

fn softhca() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softhca"));
    c.env_remove("SOFTHCA_ADDR")
        .env_remove("SOFTHCA_NETDEV")
        .env_remove("SOFTHCA_CPU")
        .env("SOFTHCA_LOG", "off");
    c
}

fn ok(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn guest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../topo/tests/fixtures/qemu-2numa")
}

#[test]
fn topo_json_of_the_captured_guest() {
    let out = softhca()
        .args([
            "topo",
            "--json",
            "--device",
            "softhca0=eth3",
            "--sysfs-root",
        ])
        .arg(guest())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(out)).unwrap();
    let eps = v["endpoints"].as_array().unwrap();
    let names: Vec<&str> = eps.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert!(
        !names.contains(&"lo"),
        "virtual interfaces hidden: {names:?}"
    );
    let i = names.iter().position(|n| *n == "softhca0").unwrap();
    let g = names.iter().position(|n| *n == "GPU0").unwrap();
    assert_eq!(eps[i]["kind"], "softhca");
    assert_eq!(eps[i]["netdev"], "eth3");
    assert_eq!(eps[i]["numa"], 1);
    assert_eq!(v["matrix"][i][g], "PIX");
}

#[test]
fn topo_table_here_places_the_device() {
    let out = softhca()
        .args(["topo", "--all"])
        .env("SOFTHCA_ADDR", "127.0.40.4")
        .output()
        .unwrap();
    let text = ok(out);
    assert!(
        text.contains("CPU Affinity") && text.contains("NUMA Affinity"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("softhca0 "))
        .expect(&text);
    assert!(row.contains(" X "), "{row}");
    assert!(
        text.contains("Legend:") && text.contains("PIX  = "),
        "{text}"
    );
}

#[test]
fn topo_bad_arguments_are_one_line() {
    let out = softhca()
        .args(["topo", "--sysfs-root", "/nonexistent"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("softhca: topology: cannot read"), "{err}");
    let out = softhca()
        .args(["topo", "--device", "x=eth9", "--sysfs-root"])
        .arg(guest())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "softhca: --device x=eth9: no interface eth9"
    );
}

#[test]
fn auto_cpu_under_taskset() {
    if Command::new("taskset").arg("--version").output().is_err() {
        eprintln!("skipped: no taskset");
        return;
    }
    let cpu = softhca_io::allowed_cpus()
        .unwrap()
        .into_iter()
        .next_back()
        .unwrap();
    let out = Command::new("taskset")
        .args(["-c", &cpu.to_string()])
        .arg(env!("CARGO_BIN_EXE_softhca"))
        .args(["devinfo", "-v"])
        .env("SOFTHCA_CPU", "auto")
        .env("SOFTHCA_NETDEV", "lo")
        .env("SOFTHCA_LOG", "off")
        .output()
        .unwrap();
    let text = ok(out);
    let line = text
        .lines()
        .find(|l| l.contains("datapath_cpu:"))
        .expect(&text);
    assert_eq!(
        line.split_once(':').unwrap().1.trim(),
        format!("{cpu} (auto: allowed {cpu}, lo has no NUMA locality)")
    );
}

/// `SOFTHCA_CPU=auto` in a real two-node machine: the QEMU guest the fixture comes
/// from, booted again with this softhca binary (opt-in, about 2-3 minutes of software
/// emulation: `SOFTHCA_QEMU_NUMA=1`; needs qemu-system-x86, busybox and a kernel in
/// /boot). The re-captured tree also gives the committed fixture's matrix.
#[test]
fn auto_cpu_in_the_two_node_guest() {
    if std::env::var_os("SOFTHCA_QEMU_NUMA").is_none() {
        eprintln!("skipped: opt-in, set SOFTHCA_QEMU_NUMA=1 (boots a QEMU guest)");
        return;
    }
    let out_dir = std::env::temp_dir().join(format!("shed-topo-{}", std::process::id()));
    let out = Command::new("bash")
        .arg(guest().join("../../capture-qemu.sh"))
        .arg(&out_dir)
        .arg(env!("CARGO_BIN_EXE_softhca"))
        .output()
        .unwrap();
    let text = ok(out);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("mask ")).collect();
    assert_eq!(
        lines,
        [
            "mask 0xf eth3: 3 (auto: allowed 0-3, eth3 local 2-3, NUMA node 1)",
            "mask 0x7 eth3: 2 (auto: allowed 0-2, eth3 local 2-3, NUMA node 1)",
            "mask 0x3 eth3: 1 (auto: allowed 0-1, eth3 local 2-3, NUMA node 1)",
            "mask 0xf eth2: 1 (auto: allowed 0-3, eth2 local 0-1, NUMA node 0)",
        ],
        "{text}"
    );
    let json = |root: &std::path::Path| {
        let out = softhca()
            .args(["topo", "--json", "--all", "--sysfs-root"])
            .arg(root)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&ok(out)).unwrap();
        (v["matrix"].clone(), v["numa_nodes"].clone())
    };
    assert_eq!(json(&out_dir), json(&guest()));
    let _ = std::fs::remove_dir_all(&out_dir);
}
