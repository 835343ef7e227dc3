//! Wire check: capture a `perf all --loopback` run with tshark and make sure every
//! packet decodes as valid RoCEv2 (InfiniBand BTH over UDP 4791) with the opcodes each
//! test must produce.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The device pair of this test (other tests and processes may use 4791 on other
/// loopback addresses at the same time; the capture filter keeps only ours).
const SERVER: &str = "127.0.0.221";
const CLIENT: &str = "127.0.0.222";

fn have_tshark() -> bool {
    Command::new("tshark")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn perf_all_decodes_as_roce() {
    if !have_tshark() {
        println!("skipped: tshark not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("softhca-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("perf.pcapng");
    let _ = std::fs::remove_file(&file);
    let mut cap = Command::new("tshark")
        .args([
            "-i",
            "lo",
            "-f",
            &format!("udp port 4791 and host {SERVER}"),
            "-w",
        ])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // tshark prints "Capturing on 'Loopback: lo'" once the capture runs.
    let start = Instant::now();
    {
        use std::io::BufRead;
        let mut err = std::io::BufReader::new(cap.stderr.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            if err.read_line(&mut line).unwrap_or(0) == 0 || line.contains("Capturing on") {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "tshark did not start: {line}"
            );
        }
        if !line.contains("Capturing on") {
            let _ = cap.kill();
            let _ = cap.wait();
            println!(
                "skipped: tshark cannot capture on lo here ({})",
                line.trim()
            );
            return;
        }
        // Keep draining tshark's stderr so it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while err.read_line(&mut sink).unwrap_or(0) > 0 {
                sink.clear();
            }
        });
    }
    // "Capturing on" comes slightly before dumpcap's filter is live.
    std::thread::sleep(Duration::from_millis(500));
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
    // Let the last packets reach the capture, then stop tshark with SIGINT so it
    // finishes the file.
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: plain kill(2) on the child we spawned.
    unsafe { libc::kill(cap.id() as i32, libc::SIGINT) };
    let _ = cap.wait();
    assert!(
        out.status.success(),
        "perf all failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let fields = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args([
            "-d",
            "udp.port==4791,infiniband",
            "-T",
            "fields",
            "-e",
            "infiniband.bth.opcode",
        ])
        .output()
        .unwrap();
    assert!(
        fields.status.success(),
        "{}",
        String::from_utf8_lossy(&fields.stderr)
    );
    let opcodes: Vec<u32> = String::from_utf8_lossy(&fields.stdout)
        .lines()
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

    let bad = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args([
            "-d",
            "udp.port==4791,infiniband",
            "-Y",
            "_ws.malformed || _ws.expert.severity >= error",
        ])
        .output()
        .unwrap();
    assert!(
        bad.status.success(),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let bad_out = String::from_utf8_lossy(&bad.stdout);
    if !bad_out.trim().is_empty() {
        let detail = Command::new("tshark")
            .arg("-r")
            .arg(&file)
            .args([
                "-V",
                "-x",
                "-Y",
                "_ws.malformed || _ws.expert.severity >= error",
                "-c",
                "3",
            ])
            .output()
            .unwrap();
        panic!(
            "malformed packets (capture kept at {}):\n{bad_out}\n{}",
            file.display(),
            String::from_utf8_lossy(&detail.stdout)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
