//! Interop through the drop-in library with the Linux kernel's Soft-RoCE (rdma_rxe):
//! unmodified `ibv_rc_pingpong`, `ib_write_bw` and `ib_read_bw` on kernel rxe in a VM
//! against the same unmodified binaries on softhca (LD_LIBRARY_PATH = our library),
//! in both directions, a memory window case (`tests/c/mw_peer.c`: a type 2 window bound
//! on one side, written, read and invalidated by a SEND with invalidate from the other),
//! and a tshark decode of the traffic with no malformed packet.
//!
//! The VM harness (`../shared/tools/rxe-vm`) needs root and boots under software
//! emulation (about 30-40 s a boot, two boots or more), so this test runs only when asked:
//!
//! ```text
//! SOFTHCA_RXE_VM=1 cargo test --release -p softhca-ibverbs --test rxe_interop -- --nocapture
//! ```

mod common;
#[path = "../../softhca/tests/rxe_vm/mod.rs"]
mod rxe_vm;

use std::path::{Path, PathBuf};
use std::process::Command;

fn harness() -> Option<PathBuf> {
    let p = rxe_vm::harness()?;
    for bin in [
        "ibv_rc_pingpong",
        "ib_write_bw",
        "ib_read_bw",
        "tcpdump",
        "tshark",
    ] {
        if !common::have(bin) {
            return None;
        }
    }
    Some(p)
}

/// Iterations: the VM runs under TCG, so kernel rxe moves a few hundred Mb/s at best.
const PP_ITERS: u32 = 200;
const BW_ITERS: u32 = 300;

/// The three programs, each in `dir`'s role. `peer` is empty for a server. Each program
/// has its own TCP port, so an attempt of one can never pair with another's server.
///
/// A client retries: the other side's server may not listen yet (both sides start
/// together). A server runs once more if its first run fails: perftest reads its
/// handshake with one `read()` and gives up when the peer's attempt died half-way, and
/// the client's next attempt then needs a fresh server. Stderr joins stdout so that a
/// failure in the guest says why in the log.
fn programs(gid: u32, peer: &str, tag: &str) -> String {
    let dev = if gid == 1 { "-d rxe0" } else { "" };
    let runs = [
        (
            "pp",
            format!("ibv_rc_pingpong -g {gid} -n {PP_ITERS} -s 8192 -p 18515"),
        ),
        (
            "w",
            format!("ib_write_bw -x {gid} {dev} -n {BW_ITERS} --report_gbits -p 18516"),
        ),
        (
            "r",
            format!("ib_read_bw -x {gid} {dev} -n {BW_ITERS} --report_gbits -p 18517"),
        ),
    ];
    runs.iter()
        .map(|(name, cmd)| {
            if peer.is_empty() {
                format!(
                    "ok=1; for i in 1 2; do timeout 90 {cmd} 2>&1 && {{ ok=0; break; }}; \
                     echo {tag}-{name} server attempt $i failed; done; echo {tag}-{name}=$ok"
                )
            } else {
                format!(
                    "ok=1; for i in $(seq 60); do sleep 1; \
                     timeout 90 {cmd} {peer} 2>&1 && {{ ok=0; break; }}; done; echo {tag}-{name}=$ok"
                )
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs one VM boot with the pair of commands, and once more in a fresh VM if not every
/// program passed on both sides: the guest runs under software emulation on a shared
/// host, where a whole boot can stall. The failed boot's output stays in the log; the
/// second boot must pass whole.
fn boot_until_passed(harness: &Path, guest: &str, host: &str) {
    let (_, text) = rxe_vm::run_for(harness, guest, host, 600);
    if not_passed(&text).is_none() {
        println!("{text}");
        return;
    }
    println!("---- first VM boot did not pass on both sides ----\n{text}");
    let (_, text) = rxe_vm::run_for(harness, guest, host, 600);
    println!("{text}");
    if let Some(why) = not_passed(&text) {
        panic!("{why}:\n{text}");
    }
}

/// The memory window peer, built here against the system's verbs.h and carried into the
/// guest inside its command (base64), where Debian's libibverbs and rxe provider run it.
struct MwPeer {
    host_bin: PathBuf,
    unpack: String,
}

fn mw_peer() -> MwPeer {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/mw_peer.c");
    let bin = common::compile_c(&src, "mw-peer").expect("libibverbs-dev is installed");
    let out = Command::new("base64")
        .arg("-w0")
        .arg(&bin)
        .output()
        .expect("run base64");
    assert!(out.status.success());
    let b64 = String::from_utf8(out.stdout).expect("base64 is ASCII");
    MwPeer {
        host_bin: bin,
        unpack: format!("echo {b64} | base64 -d > /tmp/mw_peer && chmod +x /tmp/mw_peer"),
    }
}

const MW_PORT: u16 = 18_700;

/// Why the boot did not pass, if it did not: the window's owner and user report ok, every
/// program exits 0 on both sides, both pingpong ends report every iteration, and both
/// perftest ends print a result row for 65536-byte messages with the iteration count.
fn not_passed(text: &str) -> Option<String> {
    for (line, who) in [("owner: ok", "window owner"), ("user: ok", "window user")] {
        if !text.contains(line) {
            return Some(format!("{who} did not finish"));
        }
    }
    for side in ["host", "guest"] {
        for name in ["pp", "w", "r", "mw"] {
            let line = format!("{side}-{name}=0");
            if !text.contains(&line) {
                return Some(format!("missing {line}"));
            }
        }
    }
    if text.matches(&format!("{PP_ITERS} iters in")).count() < 2 {
        return Some("pingpong iterations on both sides".into());
    }
    let rows = text
        .lines()
        .filter(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            c.len() >= 4 && c[0] == "65536" && c[1] == BW_ITERS.to_string()
        })
        .count();
    (rows < 4).then(|| format!("{rows} of 4 write_bw and read_bw result rows"))
}

#[test]
fn perftest_and_pingpong_with_kernel_rxe_both_ways() {
    let Some(h) = harness() else { return };
    let lib = common::lib_dir().display().to_string();

    let mw = mw_peer();
    let mw_host = mw.host_bin.display();

    // Kernel rxe serves (and owns the window), softhca is the client.
    let guest = format!(
        "{}; {}; timeout 200 /tmp/mw_peer owner 1 {MW_PORT} 2>&1; echo guest-mw=$?",
        programs(1, "", "guest"),
        mw.unpack
    );
    let host = format!(
        "export LD_LIBRARY_PATH={lib}; {}; timeout 200 {mw_host} user 0 10.99.0.2 {MW_PORT}; \
         echo host-mw=$?",
        programs(0, "10.99.0.2", "host")
    );
    boot_until_passed(&h, &guest, &host);

    // softhca serves, kernel rxe is the client; tcpdump records the RoCEv2 traffic on
    // the namespace's side of the link for tshark.
    let pcap = std::env::temp_dir().join(format!("softhca-rxe-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    let guest = format!(
        "{}; {}; timeout 200 /tmp/mw_peer user 1 10.99.0.1 {MW_PORT} 2>&1; echo guest-mw=$?",
        programs(1, "10.99.0.1", "guest"),
        mw.unpack
    );
    let host = format!(
        "export LD_LIBRARY_PATH={lib}; tcpdump -U -i any -w {p} udp port 4791 2>/dev/null & \
         sleep 1; {}; timeout 200 {mw_host} owner 0 {MW_PORT}; echo host-mw=$?; sleep 1; \
         kill %1; wait",
        programs(0, "", "host"),
        p = pcap.display()
    );
    boot_until_passed(&h, &guest, &host);

    let count = |filter: &str| -> usize {
        let out = Command::new("tshark")
            .args(["-r", &pcap.display().to_string(), "-Y", filter])
            .output()
            .expect("run tshark");
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let roce = count("infiniband");
    let bad = count("_ws.malformed || _ws.expert.severity >= error");
    println!("tshark: {roce} RoCEv2 packets, {bad} malformed or error-level");
    // 2 × 300 × 64 KiB at MTU 1024 is over 38,000 data packets alone.
    assert!(roce > 30_000, "tshark decoded {roce} RoCEv2 packets");
    assert_eq!(bad, 0, "malformed packets in {}", pcap.display());
    // The SEND with invalidate crossed the wire as RC SEND_ONLY_WITH_INVALIDATE (0x17).
    assert!(
        count("infiniband.bth.opcode == 23") >= 1,
        "no SEND with invalidate"
    );
    let _ = std::fs::remove_file(&pcap);
    let _ = std::fs::remove_file(&mw.host_bin);
}
