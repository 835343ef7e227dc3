//! Wire check: capture a `perf all --loopback` run with tshark and make sure every
//! packet decodes as valid RoCEv2 (InfiniBand BTH over UDP 4791) with the opcodes each
//! test must produce.

use std::process::Command;

use softhca_testbed::capture::{fields, problems, Capture};

/// The device pairs of these tests, (server, client) (other tests and processes may use
/// 4791 on other loopback addresses at the same time; the capture filter keeps only ours).
const PLAIN: (&str, &str) = ("127.0.0.221", "127.0.0.222");
const BUNDLES: (&str, &str) = ("127.0.0.223", "127.0.0.224");
const DECODE: Option<&str> = Some("udp.port==4791,infiniband");

/// A capture of `perf all --loopback` between the devices `(server, client)` (bundles
/// on or off): the BTH opcodes of its RoCE packets, and tshark's problems with them; None
/// when no capture can be taken here.
fn capture_perf_all(
    name: &str,
    (server, client): (&str, &str),
    bundle: bool,
) -> Option<(Vec<u32>, String)> {
    let dir = std::env::temp_dir().join(format!("softhca-tshark-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = match Capture::start(
        "lo",
        &format!("udp port 4791 and host {server}"),
        &dir.join("perf.pcapng"),
    ) {
        Ok(c) => c,
        Err(why) => {
            println!("skipped: {why}");
            return None;
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
        .env("SOFTHCA_BUNDLE", if bundle { "1" } else { "0" })
        .env("SOFTHCA_ADDR", format!("{server},{client}"))
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
    let bad = problems(&file, DECODE);
    if bad.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        return Some((opcodes, bad));
    }
    Some((
        opcodes,
        format!("{bad}\n(capture kept at {})", file.display()),
    ))
}

/// Every packet, one per datagram (no GSO, no bundles), decodes as RoCE with the opcode
/// each test must produce.
#[test]
fn perf_all_decodes_as_roce() {
    let Some((opcodes, bad)) = capture_perf_all("plain", PLAIN, false) else {
        return;
    };
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
    assert!(!has(0xe4), "a bundle with SOFTHCA_BUNDLE=0");
    assert!(bad.is_empty(), "malformed packets: {bad}");
}

/// softhca's bundles (several packets in one datagram, between two softhca devices)
/// still decode as RoCE: a BTH with a vendor opcode (0xE4), nothing malformed.
#[test]
fn bundles_decode_as_roce_bth() {
    let Some((opcodes, bad)) = capture_perf_all("bundles", BUNDLES, true) else {
        return;
    };
    assert!(opcodes.contains(&0xe4), "no bundle in {opcodes:?}");
    assert!(bad.is_empty(), "malformed packets: {bad}");
}
