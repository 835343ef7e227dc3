//! rdma_cm interop with the Linux kernel's rdma_cm over Soft-RoCE (rdma_rxe) in a VM:
//! unmodified `rping` on softhca (LD_LIBRARY_PATH = our libraries) against `rping` on
//! kernel rxe, both directions: REQ/REP/RTU, DREQ/DREP with the kernel's CM.
//!
//! The VM harness (`../shared/tools/rxe-vm`) needs root and boots under software
//! emulation (30-60 s a boot, two boots), so this test runs only when asked:
//!
//! ```text
//! SOFTHCA_RXE_VM=1 cargo test --release -p softhca-rdmacm --test rxe_interop -- --nocapture
//! ```

mod common;

use std::path::PathBuf;
use std::process::Command;

fn harness() -> Option<PathBuf> {
    if std::env::var_os("SOFTHCA_RXE_VM").is_none() {
        eprintln!("SKIP: set SOFTHCA_RXE_VM=1 to run the kernel rxe interop test");
        return None;
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/rxe-vm");
    if !p.exists() {
        eprintln!("SKIP: {} not found", p.display());
        return None;
    }
    if common::lib_dir().is_none() || !common::have("rping") {
        return None;
    }
    Some(p)
}

fn run(vm: &PathBuf, guest: &str, host: &str) -> String {
    let out = Command::new(vm)
        .args(["run", "--timeout", "300", "--guest", guest, "--host", host])
        .output()
        .expect("run rxe-vm");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "rxe-vm: {text}");
    text
}

#[test]
fn rping_both_ways_with_kernel_rdma_cm() {
    let Some(vm) = harness() else { return };
    let lib = common::lib_dir().expect("lib dir").display().to_string();
    // softhca connects to the kernel.
    let t = run(
        &vm,
        "rping -s -a 10.99.0.2 -v -C 10; echo guest-rc=$?",
        &format!("sleep 10; LD_LIBRARY_PATH={lib} timeout 120 rping -c -a 10.99.0.2 -v -C 10; echo host-rc=$?"),
    );
    assert!(t.contains("host-rc=0") && t.contains("guest-rc=0"), "{t}");
    assert!(
        t.contains("server ping data: rdma-ping-9") && t.contains("\nping data: rdma-ping-9"),
        "{t}"
    );
    // The kernel connects to softhca.
    let t = run(
        &vm,
        "sleep 8; rping -c -a 10.99.0.1 -v -C 10; echo guest-rc=$?",
        &format!(
            "LD_LIBRARY_PATH={lib} timeout 150 rping -s -a 10.99.0.1 -v -C 10; echo host-rc=$?"
        ),
    );
    assert!(t.contains("host-rc=0") && t.contains("guest-rc=0"), "{t}");
    assert!(
        t.contains("server ping data: rdma-ping-9") && t.contains("\nping data: rdma-ping-9"),
        "{t}"
    );
}
