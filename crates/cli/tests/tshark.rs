//! Wire check: capture a `perf all --loopback` run with tshark and make sure every
//! packet decodes as valid RoCEv2 (InfiniBand BTH over UDP 4791) with the opcodes each
//! test must produce.

use std::process::Command;

use softhca_testbed::capture::{fields, problems, Capture};

/// The device pair of this test (other tests and processes may use 4791 on other
/// loopback addresses at the same time; the capture filter keeps only ours).
const SERVER: &str = "127.0.0.221";
const CLIENT: &str = "127.0.0.222";
const DECODE: Option<&str> = Some("udp.port==4791,infiniband");

#[test]
fn perf_all_decodes_as_roce() {
    let dir = std::env::temp_dir().join(format!("softhca-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = match Capture::start(
        "lo",
        &format!("udp port 4791 and host {SERVER}"),
        &dir.join("perf.pcapng"),
    ) {
        Ok(c) => c,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let out = Command::new(env!("CARGO_BIN_EXE_softhca"))
        .args([
            "perf",
            "all",
            "--loopback",
            "-s",
            "8192",
            "-n",
            "20",
            "--verify",
        ])
        .env("SOFTHCA_GSO", "0")
        .env("SOFTHCA_ADDR", format!("{SERVER},{CLIENT}"))
        .output()
        .unwrap();
    let file = cap.stop();
    assert!(
        out.status.success(),
        "perf all failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let opcodes: Vec<u32> = fields(&file, DECODE, "infiniband", &["infiniband.bth.opcode"])
        .iter()
        .filter_map(|l| l.split(',').next()?.trim().parse().ok())
        .collect();
    assert!(
        opcodes.len() > 100,
        "too few RoCE packets captured: {}",
        opcodes.len()
    );
    let has = |op: u32| opcodes.contains(&op);
    // IBTA table 38, RC: SEND_ONLY 4 (or FIRST 0 / MIDDLE 1 / LAST 2), RDMA_WRITE_ONLY 10
    // (or FIRST 6 ...), RDMA_READ_REQUEST 12, RDMA_READ_RESPONSE 13..16, ACK 17.
    assert!(has(4) || has(0), "no SEND in {opcodes:?}");
    assert!(has(10) || has(6) || has(11), "no RDMA WRITE");
    assert!(has(12), "no RDMA READ request");
    assert!((13..=16).any(has), "no RDMA READ response");
    assert!(has(17), "no ACK");

    let bad = problems(&file, DECODE);
    assert!(
        bad.is_empty(),
        "malformed packets (capture kept at {}):\n{bad}",
        file.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
