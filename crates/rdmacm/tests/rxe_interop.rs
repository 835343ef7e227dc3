//! rdma_cm interop with the Linux kernel's rdma_cm over Soft-RoCE (rdma_rxe) in a VM, in
//! one boot: unmodified `rping -C 50 -v`, `ucmatose`, `udaddy` (SIDR) and `ib_write_bw -R` on
//! softhca (LD_LIBRARY_PATH = our libraries) against the same programs on kernel rxe,
//! kernel as server then softhca as server; a connect to a port nobody listens on,
//! rejected with reason 8 by each side; and a peer that is gone before its REP (a
//! stopped softhca process for the kernel, an address nobody answers on for softhca):
//! the connect ends in `RDMA_CM_EVENT_UNREACHABLE` (-110, ETIMEDOUT) after the REQ's
//! retransmissions, 16 sends 6.144 s apart (2 × 2^(18-8) ms packet lifetime +
//! 2^(20-8) ms CM response timeout), 98.3 s, on both.
//!
//! The VM harness (`../shared/tools/rxe-vm`) needs root and boots under software
//! emulation, so this test runs only when asked:
//!
//! ```text
//! SOFTHCA_RXE_VM=1 cargo test --release -p softhca-rdmacm --test rxe_interop -- --nocapture
//! ```
//!
//! `ib_write_bw -R` with the kernel as server runs only with SOFTHCA_RXE_VM_ALL=1 as well
//! (see `kernel_perftest_server`).

mod common;
#[path = "../../softhca/tests/rxe_vm/mod.rs"]
mod rxe_vm;

use std::path::PathBuf;

const HOST: &str = "10.99.0.1";
const GUEST: &str = "10.99.0.2";
/// The stopped softhca server's address, a second one on the namespace's interface.
const STOPPED: &str = "10.99.0.5";

fn harness() -> Option<PathBuf> {
    let p = rxe_vm::harness()?;
    let bins = ["rping", "ucmatose", "udaddy", "ib_write_bw"];
    if common::lib_dir().is_none() || !bins.iter().all(|b| common::have(b)) {
        return None;
    }
    Some(p)
}

/// The servers, one after the other, on `addr`; `tag-<program>=<exit status>` after each.
/// perftest `-R` connects its data QP right after the handshake on its control
/// connection, and a kernel server that is not listening yet (under emulation it often
/// is not) rejects it; the client's own retry then crashes (perftest 4.5-0.17 reuses the
/// ids it destroyed) and leaves the server waiting: it is started again after 120 s
/// (a client under emulation on a nested-virtualisation host took over 40 s from the
/// server's start to its end, and a server stopped in its teardown fails the client).
/// `wbw`: include `ib_write_bw -R` (see [`kernel_perftest_server`]).
fn servers(addr: &str, tag: &str, wbw: bool) -> String {
    let mut s = format!(
        "timeout 150 rping -s -a {addr} -v -C 50; echo {tag}-rping=$?; \
         timeout 90 ucmatose -b {addr} -c 2; echo {tag}-ucmatose=$?; \
         timeout 60 udaddy -b {addr}; echo {tag}-udaddy=$?"
    );
    if wbw {
        let cmd = retried("timeout 120 ib_write_bw -R -n 200", 3);
        s += &format!("; {cmd}; echo {tag}-wbw=$rc");
    }
    s
}

/// Whether the kernel also serves `ib_write_bw -R` to softhca's client: that direction
/// loses perftest's own race under load (the kernel rejects the early data connection at
/// once, perftest's client crashes in its retry and strands the server), so it runs only
/// with SOFTHCA_RXE_VM_ALL=1; softhca's server gives a late listener 1 s, so the other
/// direction always runs.
fn kernel_perftest_server() -> bool {
    std::env::var_os("SOFTHCA_RXE_VM_ALL").is_some()
}

/// `cmd`, tried again every 2 s while it fails (the other side's server may not listen
/// yet: REJ 8 or SIDR "unsupported"; a perftest server under emulation takes many
/// seconds to start), at most `n` times; `$rc` is its last exit status.
fn retried(cmd: &str, n: u32) -> String {
    format!("for i in $(seq {n}); do {cmd}; rc=$?; [ $rc = 0 ] && break; sleep 2; done")
}

/// The clients of [`servers`] on `addr`.
fn clients(addr: &str, tag: &str, wbw: bool) -> String {
    [
        (
            "rping",
            format!("timeout 120 rping -c -a {addr} -v -C 50"),
            60,
        ),
        (
            "ucmatose",
            format!("timeout 60 ucmatose -s {addr} -c 2 -C 10"),
            10,
        ),
        ("udaddy", format!("timeout 60 udaddy -s {addr}"), 10),
        (
            "wbw",
            format!("timeout 90 ib_write_bw -R -n 200 {addr}"),
            30,
        ),
    ]
    .iter()
    .filter(|(name, _, _)| wbw || *name != "wbw")
    .map(|(name, cmd, n)| format!("{}; echo {tag}-{name}=$rc", retried(cmd, *n)))
    .collect::<Vec<_>>()
    .join("; ")
}

/// A connect to port 7999 of `addr`, where nothing listens; `tag-rej=<exit status>`.
fn rejected(addr: &str, tag: &str) -> String {
    format!("timeout 60 ucmatose -s {addr} -p 7999; echo {tag}-rej=$?")
}

/// A connect that nobody answers; `tag-gone=<exit status> <seconds>`.
fn unanswered(addr: &str, port: u16, tag: &str) -> String {
    format!(
        "t0=$(date +%s); timeout 200 ucmatose -s {addr} -p {port}; \
         echo {tag}-gone=$? $(( $(date +%s) - t0 ))"
    )
}

fn all_passed(t: &str, tag: &str, wbw: bool) {
    for p in ["rping", "ucmatose", "udaddy", "wbw"]
        .into_iter()
        .filter(|p| wbw || *p != "wbw")
    {
        assert!(t.contains(&format!("{tag}-{p}=0")), "{p} on {tag}: {t}");
    }
}

/// `tag-gone=<status> <seconds>`: UNREACHABLE (ucmatose exits with the event's status,
/// -110 as a byte: 146) after the REQ's 16 sends, 98.3 s, give or take the emulation.
fn gave_up_in_time(t: &str, tag: &str) {
    let line = t
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{tag}-gone=")))
        .unwrap_or_else(|| panic!("no {tag}-gone line: {t}"));
    let (status, secs) = line.split_once(' ').expect("status and seconds");
    let secs: u64 = secs.trim().parse().expect("seconds");
    assert_eq!(
        status, "146",
        "{tag}: exit status {status} (UNREACHABLE -110): {t}"
    );
    assert!(
        (90..=130).contains(&secs),
        "{tag}: gave up after {secs} s: {t}"
    );
}

#[test]
fn rdma_cm_programs_both_ways_with_kernel_rdma_cm() {
    let Some(vm) = harness() else { return };
    let lib = common::lib_dir().expect("lib dir").display().to_string();
    // Kernel servers for softhca clients, then softhca servers for kernel clients. A
    // REJ test runs while the other side has a device up (softhca's exists only while
    // a program uses it). Last, each side connects to a peer that is gone: the kernel to
    // a stopped softhca server (on a second address of the namespace, so that the
    // other host program's device can have 10.99.0.1), softhca to 10.99.0.3, where no
    // host answers.
    let guest = format!(
        "{gs}; sleep 6; {grej}; {gc}; sleep 6; {ggone}",
        gs = servers(GUEST, "guest-srv", kernel_perftest_server()),
        grej = rejected(HOST, "guest"),
        gc = clients(HOST, "guest-cli", true),
        ggone = unanswered(STOPPED, 7480, "guest"),
    );
    let host = format!(
        "export LD_LIBRARY_PATH={lib}; sleep 5; {hc}; {hrej}; {hs}; \
         ip addr replace {STOPPED}/24 dev tap0; \
         SOFTHCA_ADDR={STOPPED} ucmatose -b {STOPPED} -p 7480 >/dev/null 2>&1 & stopped=$!; \
         sleep 2; kill -STOP $stopped; {hgone}; kill -KILL $stopped",
        hc = clients(GUEST, "host-cli", kernel_perftest_server()),
        hrej = rejected(GUEST, "host"),
        hs = servers(HOST, "host-srv", true),
        hgone = unanswered("10.99.0.3", 7481, "host"),
    );
    let start = std::time::Instant::now();
    let (ok, t) = rxe_vm::run_for(&vm, &guest, &host, 900);
    println!(
        "{t}\nrxe_interop: one boot, {} s",
        start.elapsed().as_secs()
    );
    assert!(ok, "rxe-vm: {t}");
    for tag in ["guest-srv", "host-cli"] {
        all_passed(&t, tag, kernel_perftest_server());
    }
    for tag in ["host-srv", "guest-cli"] {
        all_passed(&t, tag, true);
    }
    // Each side's rping client and server saw the last ping.
    assert!(
        t.matches("server ping data: rdma-ping-49").count() >= 2,
        "{t}"
    );
    assert!(t.matches("\nping data: rdma-ping-49").count() >= 2, "{t}");
    // The kernel's REJ and ours: reason 8, which ucmatose reports and exits with.
    for tag in ["guest", "host"] {
        assert!(t.contains(&format!("{tag}-rej=8")), "{tag} REJ: {t}");
    }
    assert!(
        t.matches("RDMA_CM_EVENT_REJECTED, error: 8").count() >= 2,
        "{t}"
    );
    gave_up_in_time(&t, "guest");
    gave_up_in_time(&t, "host");
}
