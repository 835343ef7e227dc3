//! Unmodified UCX (Debian's ucx-utils, libucx0) on softhca: `ucx_info -d` lists the
//! device with UCX's verbs transports, and `ucx_perftest` runs UCP tag bandwidth, put
//! bandwidth, get and tag latency between two processes over `rc_verbs` (with `ud_verbs`
//! as UCX's auxiliary wire-up transport, which a point-to-point transport needs) and over
//! `ud_verbs` alone, 8 B to 4 MiB. The device's counters (`SOFTHCA_STATS`) show that the
//! data went through softhca.

mod common;

use std::time::{Duration, Instant};

fn ready() -> bool {
    common::have("ucx_info") && common::have("ucx_perftest") && common::ucx_device_node()
}

#[test]
fn ucx_info_lists_softhca0_with_verbs_transports() {
    if !ready() {
        return;
    }
    let out = common::cmd("ucx_info")
        .arg("-d")
        .env("SOFTHCA_ADDR", "127.0.5.1")
        .output()
        .expect("run ucx_info");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let md = text
        .split("# Memory domain: ")
        .find(|s| s.starts_with("softhca0"))
        .unwrap_or_else(|| panic!("no softhca0 memory domain:\n{text}"));
    for tl in ["rc_verbs", "ud_verbs"] {
        let part = md
            .split("#      Transport: ")
            .find(|s| s.starts_with(tl))
            .unwrap_or_else(|| panic!("no {tl} on softhca0:\n{md}"));
        assert!(part.contains("Device: softhca0:1"), "{part}");
    }
}

/// One `ucx_perftest` pair on 127.0.5.2 (server) and 127.0.5.3 (client); returns the
/// client's output after checking that both completed and that the packets the client's
/// device sent and received carry at least the test's data.
fn perftest(tls: &str, test: &str, size: u64, iters: u32) -> common::Done {
    let _g = common::serial();
    let port = common::free_port().to_string();
    let env = [
        ("UCX_TLS", tls),
        ("UCX_NET_DEVICES", "softhca0:1"),
        ("SOFTHCA_STATS", "1"),
    ];
    let server = common::cmd("ucx_perftest")
        .envs(env)
        .env("SOFTHCA_ADDR", "127.0.5.2")
        .args(["-p", &port])
        .spawn()
        .expect("spawn server");
    let start = Instant::now();
    while !common::listening(port.parse().unwrap_or(0)) && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (size_s, iters_s) = (size.to_string(), iters.to_string());
    let client = common::cmd("ucx_perftest")
        .envs(env)
        .env("SOFTHCA_ADDR", "127.0.5.3")
        .args(["127.0.0.1", "-p", &port, "-t", test, "-s", &size_s])
        .args(["-n", &iters_s, "-w", "10"])
        .spawn()
        .expect("spawn client");
    let c = common::finish(client, Duration::from_secs(180));
    let s = common::finish(server, Duration::from_secs(30));
    let what = format!("{tls} {test} {size} B");
    assert_eq!(c.status, Some(0), "{what}: client\n{}", c.all());
    assert_eq!(s.status, Some(0), "{what}: server\n{}", s.all());
    // The final line: "Final: <iterations> <overheads, bandwidths, rates>".
    let fin = c
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("Final:"))
        .unwrap_or_else(|| panic!("{what}: no Final line\n{}", c.all()));
    let n: u32 = fin
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert_eq!(n, iters, "{what}: {fin}");
    // At least one packet per message, one per 16 KiB of data (the largest packet one
    // softhca device sends another on loopback), in either direction (a get's data
    // comes back as READ responses or replies).
    let sent: u64 = common::stat_values(&c.stderr, "sent_pkts").iter().sum();
    let rcvd: u64 = common::stat_values(&c.stderr, "rcvd_pkts").iter().sum();
    let want = u64::from(iters) * size.div_ceil(softhca::DEFAULT_JUMBO);
    assert!(
        sent + rcvd >= want,
        "{what}: only {sent} + {rcvd} packets through softhca (want {want})\n{}",
        c.all()
    );
    eprintln!(
        "{what}: {} | softhca packets {sent} sent, {rcvd} received",
        fin.trim()
    );
    c
}

const TESTS: [&str; 4] = ["tag_bw", "ucp_put_bw", "ucp_get", "tag_lat"];
const SIZES: [u64; 3] = [8, 65536, 4 << 20];

fn sweep(tls: &str) {
    for test in TESTS {
        for size in SIZES {
            let iters = if size >= 1 << 20 { 20 } else { 200 };
            perftest(tls, test, size, iters);
        }
    }
}

#[test]
fn ucx_perftest_rc_verbs() {
    if !ready() {
        return;
    }
    sweep("rc_verbs,ud_verbs:aux");
}

#[test]
fn ucx_perftest_ud_verbs() {
    if !ready() {
        return;
    }
    sweep("ud_verbs");
}
