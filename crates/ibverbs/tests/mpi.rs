//! Unmodified Open MPI (Debian's openmpi-bin, libopenmpi-dev) over UCX over softhca:
//! `tests/c/mpi_check.c`, built with `mpicc`, runs a checked ping-pong (8 B to 4 MiB),
//! checked one-sided puts and gets, a checked allreduce and a ring between two ranks
//! with `--mca pml ucx --mca osc ucx` restricted to `rc_verbs` (UCX's `ud_verbs` only
//! for wire-up), then to `ud_verbs` alone, on softhca0. Each rank's device counters
//! (`SOFTHCA_STATS`) must account for the ping-pong's data, so it went over softhca, not
//! TCP or shared memory.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[test]
fn mpi_over_ucx_rc_verbs() {
    mpi_check("rc_verbs,ud_verbs:aux,self", ["127.0.5.20", "127.0.5.21"]);
}

#[test]
fn mpi_over_ucx_ud_verbs() {
    mpi_check("ud_verbs,self", ["127.0.5.22", "127.0.5.23"]);
}

fn mpi_check(tls: &str, addrs: [&str; 2]) {
    if !common::have("mpicc") || !common::have("mpirun") || !common::ucx_device_node() {
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
    let bin = std::env::temp_dir().join(format!(
        "softhca-mpi-check-{}-{}",
        std::process::id(),
        addrs[0]
    ));
    let st = Command::new("mpicc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run mpicc");
    assert!(st.success(), "mpicc {}", src.display());
    let _g = common::serial();
    let lib = common::lib_dir().display().to_string();
    // One application context per rank, each with its own loopback address.
    let mut args: Vec<String> = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        if i > 0 {
            args.push(":".into());
        }
        args.extend(
            [
                "-np",
                "1",
                "--mca",
                "pml",
                "ucx",
                "--mca",
                "osc",
                "ucx",
                "-x",
                "UCX_NET_DEVICES=softhca0:1",
                "-x",
                "SOFTHCA_STATS=1",
            ]
            .map(String::from),
        );
        args.extend(["-x".into(), format!("UCX_TLS={tls}")]);
        args.extend(["-x".into(), format!("SOFTHCA_ADDR={addr}")]);
        args.extend(["-x".into(), format!("LD_LIBRARY_PATH={lib}")]);
        args.push(bin.display().to_string());
    }
    let child = common::cmd("mpirun")
        .args(&args)
        // CI runs as root; Open MPI refuses that without these.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .spawn()
        .expect("spawn mpirun");
    let d = common::finish(child, Duration::from_secs(300));
    let _ = std::fs::remove_file(&bin);
    assert_eq!(d.status, Some(0), "{}", d.all());
    for part in [
        "ping-pong        8 B: 100 round trips checked",
        "ping-pong  4194304 B: 10 round trips checked",
        "put/get        8 B: checked",
        "put/get  1048576 B: checked",
        "allreduce 65536 int64 sums checked",
        "ring 100 laps over 2 ranks: token 300 checked",
        "mpi_check: OK",
    ] {
        assert!(d.stdout.contains(part), "no {part:?}:\n{}", d.all());
    }
    // Each rank sends 10 messages of 1 MiB and 10 of 4 MiB: at least 12800 packets of
    // 4 KiB (the loopback MTU) from each device.
    let sent = common::stat_values(&d.stderr, "sent_pkts");
    assert_eq!(sent.len(), 2, "one counters line per rank:\n{}", d.all());
    for s in &sent {
        assert!(
            *s >= 12800,
            "only {s} packets through softhca:\n{}",
            d.all()
        );
    }
    eprintln!(
        "{tls}:\n{}softhca packets sent per rank: {sent:?}",
        d.stdout
    );
}
