//! One boot of the kernel-rxe VM harness (`../shared/tools/rxe-vm`), for the interop
//! tests of `softhca` and of `softhca-ibverbs` (which includes this file by path).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The harness, when asked for (`SOFTHCA_RXE_VM` set) and present; None, with a line
/// saying why, otherwise: it needs root and boots under software emulation.
#[allow(dead_code)]
pub fn harness() -> Option<PathBuf> {
    if std::env::var_os("SOFTHCA_RXE_VM").is_none() {
        eprintln!("SKIP: set SOFTHCA_RXE_VM=1 to run the kernel rxe interop test");
        return None;
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/rxe-vm");
    if !p.exists() {
        eprintln!("SKIP: {} not found", p.display());
        return None;
    }
    Some(p)
}

/// Boots the VM with `guest` and `host` commands; returns whether the harness succeeded
/// and its combined output.
///
/// The guest powers itself off after its command: when the harness's init script exits
/// before its own power-off completes, the guest kernel panics ("Attempted to kill
/// init") and the VM only ends at the harness's timeout.
#[allow(dead_code)]
pub fn run(harness: &Path, guest: &str, host: &str) -> (bool, String) {
    run_for(harness, guest, host, 400)
}

/// The guest's first command: wait until rxe0's RoCEv2 GID (index 1, the IPv4-mapped
/// address) is filled in. The kernel fills the GID table from a workqueue after `rdma
/// link add` (roce_gid_mgmt), so on a slow emulated guest the harness's "ready" can come
/// before it, and every `-g 1` server then exits at once ("Failed to query gid").
const GID_WAIT: &str = "g=/sys/class/infiniband/rxe0/ports/1/gids/1; i=0; \
    until grep -q ffff $g 2>/dev/null || [ $i -ge 120 ]; do sleep 1; i=$((i+1)); done; \
    echo \"guest: rxe0 gid 1 = $(cat $g 2>&1) after ${i}s\"";

/// [`run`] with a limit of `timeout_s` seconds for the whole boot.
#[allow(dead_code)]
pub fn run_for(harness: &Path, guest: &str, host: &str, timeout_s: u32) -> (bool, String) {
    let guest = format!("{GID_WAIT}; {guest}; sync; echo o > /proc/sysrq-trigger; sleep 60");
    let out = Command::new(harness)
        .args(["run", "--timeout", &timeout_s.to_string()])
        .args(["--guest", &guest, "--host", host])
        .output()
        .expect("run rxe-vm");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop_job_disk(&text);
    (out.status.success(), text)
}

/// The harness leaves its job directory behind with a 657 MB copy of the VM disk: drop
/// the disk once the output is in (console and guest logs stay for a post-mortem).
/// Without this every interop run kept 2 GB in /tmp, and repeated runs filled the disk.
fn drop_job_disk(text: &str) {
    for line in text.lines() {
        if let Some(dir) = line
            .strip_prefix("---- job dir: ")
            .and_then(|l| l.strip_suffix(" ----"))
        {
            let _ = std::fs::remove_file(Path::new(dir).join("disk.img"));
        }
    }
}
