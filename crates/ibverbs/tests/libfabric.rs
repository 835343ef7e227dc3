//! An unmodified multi-context program: libfabric's `fi_pingpong` over
//! `verbs;ofi_rxd` (Debian's libfabric-bin), whose verbs provider opens the device more
//! than once per process. Server and client are two processes on their own loopback
//! addresses; every size of the default sweep must complete on both sides.

mod common;

use std::time::{Duration, Instant};

#[test]
fn fi_pingpong_rdm_over_verbs_rxd() {
    if !common::have("fi_pingpong") {
        return;
    }
    let _g = common::serial();
    let port = common::free_port().to_string();
    let args = ["-p", "verbs;ofi_rxd", "-e", "rdm", "-I", "50", "-B", &port];
    let server = common::cmd("fi_pingpong")
        .env("SOFTHCA_ADDR", "127.0.8.1")
        .args(args)
        .spawn()
        .expect("spawn server");
    let start = Instant::now();
    while !common::listening(port.parse().unwrap_or(0)) && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = common::cmd("fi_pingpong")
        .env("SOFTHCA_ADDR", "127.0.8.2")
        .args([
            "-p",
            "verbs;ofi_rxd",
            "-e",
            "rdm",
            "-I",
            "50",
            "-P",
            &port,
            "127.0.0.1",
        ])
        .spawn()
        .expect("spawn client");
    let c = common::finish(client, Duration::from_secs(120));
    let s = common::finish(server, Duration::from_secs(120));
    for (who, d) in [("server", &s), ("client", &c)] {
        assert_eq!(d.status, Some(0), "{who}:\n{}", d.all());
        // One result line per size, 64 B to 1 MiB, each with 50 iterations.
        for size in ["64 ", "256 ", "1k ", "4k ", "64k ", "1m "] {
            assert!(
                d.stdout
                    .lines()
                    .any(|l| l.starts_with(size) && l.contains("=50")),
                "{who}: no {size:?} line:\n{}",
                d.all()
            );
        }
    }
}
