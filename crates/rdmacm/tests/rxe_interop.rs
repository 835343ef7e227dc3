//! rdma_cm interop with the Linux kernel's rdma_cm over Soft-RoCE (rdma_rxe) in a VM:
//! unmodified `rping`, `ucmatose`, `udaddy` (SIDR) and `ib_write_bw -R` on softhca
//! (LD_LIBRARY_PATH = our libraries) against the same programs on kernel rxe, both
//! directions.
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

/// The servers, one after the other, on `addr`.
fn servers(addr: &str, tag: &str) -> String {
    format!(
        "timeout 150 rping -s -a {addr} -v -C 10; echo {tag}-rping=$?; \
         timeout 90 ucmatose -b {addr} -c 2; echo {tag}-ucmatose=$?; \
         timeout 60 udaddy -b {addr}; echo {tag}-udaddy=$?; \
         timeout 90 ib_write_bw -R -n 200; echo {tag}-wbw=$?"
    )
}

/// The clients, each a few seconds after the previous server started listening.
fn clients(addr: &str, tag: &str) -> String {
    format!(
        "sleep 10; timeout 120 rping -c -a {addr} -v -C 10; echo {tag}-rping=$?; \
         sleep 4; timeout 60 ucmatose -s {addr} -c 2 -C 10; echo {tag}-ucmatose=$?; \
         sleep 4; timeout 60 udaddy -s {addr}; echo {tag}-udaddy=$?; \
         sleep 5; timeout 90 ib_write_bw -R -n 200 {addr}; echo {tag}-wbw=$?"
    )
}

fn all_passed(t: &str, tag: &str) {
    for p in ["rping", "ucmatose", "udaddy", "wbw"] {
        assert!(t.contains(&format!("{tag}-{p}=0")), "{p} on {tag}: {t}");
    }
    assert!(
        t.contains("server ping data: rdma-ping-9") && t.contains("\nping data: rdma-ping-9"),
        "{t}"
    );
}

#[test]
fn rdma_cm_programs_both_ways_with_kernel_rdma_cm() {
    let Some(vm) = harness() else { return };
    if !["ucmatose", "udaddy", "ib_write_bw"]
        .iter()
        .all(|b| common::have(b))
    {
        return;
    }
    let lib = common::lib_dir().expect("lib dir").display().to_string();
    // softhca connects to the kernel: REQ/RTU and SIDR_REQ from us, REP/SIDR_REP from it.
    let t = run(
        &vm,
        &servers("10.99.0.2", "guest"),
        &format!(
            "export LD_LIBRARY_PATH={lib}; {}",
            clients("10.99.0.2", "host")
        ),
    );
    all_passed(&t, "guest");
    all_passed(&t, "host");
    // The kernel connects to softhca.
    let t = run(
        &vm,
        &clients("10.99.0.1", "guest"),
        &format!(
            "export LD_LIBRARY_PATH={lib}; {}",
            servers("10.99.0.1", "host")
        ),
    );
    all_passed(&t, "guest");
    all_passed(&t, "host");
}
