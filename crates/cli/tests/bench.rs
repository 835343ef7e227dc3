//! `softhca bench --quick`: every kind of row is measured between two processes, with
//! positive numbers, and the JSON and SVG files are written.

use std::process::Command;

fn pos(r: &serde_json::Value, k: &str) -> f64 {
    let v = r[k]
        .as_f64()
        .unwrap_or_else(|| panic!("{k} missing in {r}"));
    assert!(v > 0.0, "{k} = {v} in {r}");
    v
}

#[test]
fn quick_bench_writes_every_row_kind() {
    let dir = std::env::temp_dir().join(format!("softhca-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("bench.json");
    let svg = dir.join("bench.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_softhca"))
        .args(["bench", "--quick", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .env_remove("SOFTHCA_ADDR")
        .env("SOFTHCA_LOG", "off")
        .output()
        .expect("run softhca bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("softhca bandwidth") && stdout.contains("raw UDP GSO+GRO"));

    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["failures"].as_array().unwrap().len(), 0);
    // Memory per idle connected QP was measured (1024 QPs in RTS).
    // The host's own costs, measured before the table.
    assert!(doc["host"]["syscall_us"].as_f64().expect("syscall_us") > 0.0);
    assert!(doc["host"]["icrc_gbps"].as_f64().expect("icrc_gbps") > 0.0);
    let idle = doc["idle_qp_bytes"].as_f64().expect("idle_qp_bytes");
    assert!(idle > 0.0, "{idle}");
    let rows = doc["rows"].as_array().unwrap();
    let of = |kind: &str| -> Vec<&serde_json::Value> {
        let v: Vec<_> = rows.iter().filter(|r| r["kind"] == kind).collect();
        assert!(!v.is_empty(), "no {kind} row in {doc}");
        v
    };
    for kind in [
        "softhca_bw",
        "softhca_msg_rate",
        "tcp_stream",
        "udp_blast",
        "udp_blast_icrc",
    ] {
        for r in of(kind) {
            pos(r, "gbps");
            pos(r, "msgs_per_sec");
            pos(r, "bytes");
            pos(r, "cpu_s_per_gb_sender");
            pos(r, "cpu_s_per_gb_receiver");
        }
    }
    for kind in [
        "softhca_lat",
        "tcp_pingpong",
        "udp_pingpong",
        "udp_pingpong_roce",
    ] {
        for r in of(kind) {
            let p50 = pos(r, "lat_us_p50");
            let p99 = pos(r, "lat_us_p99");
            assert!(p99 >= p50, "{r}");
            pos(r, "messages");
        }
    }
    // Ratios against the baselines measured in the same run.
    for r in of("softhca_bw").into_iter().chain(of("softhca_lat")) {
        pos(r, "vs_tcp");
        pos(r, "vs_raw_udp");
    }
    // The RoCEv2 ceiling: every datagram's ICRC checked, none failed on loopback.
    for r in of("softhca_bw") {
        pos(r, "vs_roce_ceiling");
    }
    for r in of("udp_blast_icrc") {
        assert_eq!(r["icrc_failures"], 0, "{r}");
    }
    // READ data flows server → client, the others client → server; all three ops ran.
    for op in ["send", "write", "read"] {
        assert!(of("softhca_bw").iter().any(|r| r["op"] == op), "no {op} bw");
    }
    assert!(of("softhca_bw").iter().any(|r| r["qps"] == 2));
    // The server of an 8 B SEND ping-pong timed its turnarounds (SOFTHCA_STATS), and
    // each phase took time.
    for r in of("softhca_turnaround") {
        let t = &r["turnaround_p50_us"];
        let user: f64 = ["receive_to_taken", "taken_to_post", "post_to_send"]
            .iter()
            .map(|p| pos(t, p))
            .sum();
        pos(t, "send");
        assert!(t["count"].as_u64().unwrap() > 0, "{r}");
        // The row's p50 is softhca's user-space share: the three phases before the send.
        assert!((pos(r, "lat_us_p50") - user).abs() < 1e-9, "{r}");
    }
    assert!(stdout.contains("softhca turnaround (8 B SEND"), "{stdout}");

    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.contains("<svg") && plot.contains("</svg>"));
    assert!(plot.contains("TCP stream") && plot.contains("raw UDP"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_rejects_bad_duration_in_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_softhca"))
        .args(["bench", "--duration", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("softhca: invalid duration"), "{err}");
}

/// `softhca bench --middleware --quick`: every UCX figure (and the MPI ones with Open
/// MPI installed) measured over softhca and over TCP, with positive values. Skipped
/// without the drop-in library next to softhca, ucx_perftest or UCX's device node.
#[test]
fn quick_middleware_bench_measures_both_transports() {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_softhca"));
    let have = |p: &str| {
        std::env::var_os("PATH")
            .is_some_and(|v| std::env::split_paths(&v).any(|d| d.join(p).is_file()))
    };
    let dropin = exe.with_file_name("libibverbs.so.1");
    let node = std::path::Path::new("/dev/infiniband/uverbs-softhca0");
    if !dropin.exists() || !have("ucx_perftest") || !node.exists() {
        eprintln!(
            "SKIP: needs {} (cargo build --release -p softhca-ibverbs), ucx_perftest \
             (ucx-utils) and {} (see the README)",
            dropin.display(),
            node.display()
        );
        return;
    }
    let json = std::env::temp_dir().join(format!("softhca-mw-{}.json", std::process::id()));
    let out = Command::new(exe)
        .args(["bench", "--middleware", "--quick", "--json"])
        .arg(&json)
        .env_remove("SOFTHCA_ADDR")
        .output()
        .expect("run softhca bench --middleware");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let rows = doc["rows"].as_array().unwrap();
    let want = if have("mpirun") && have("mpicc") {
        7
    } else {
        4
    };
    assert_eq!(rows.len(), want, "{stdout}");
    for r in rows {
        for via in ["softhca", "tcp"] {
            let v = r[via]["values"].as_array().unwrap();
            assert_eq!(v.len(), 1, "{r}");
            assert!(v[0].as_f64().unwrap() > 0.0, "{r}");
        }
        assert!(r["ratio"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(stdout.contains("softhca/TCP") && stdout.contains("UCX tag_bw 64K"));
}
