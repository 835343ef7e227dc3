//! Unmodified Open MPI (Debian's openmpi-bin, libopenmpi-dev) over UCX over softhca:
//! `tests/c/mpi_check.c`, built with `mpicc`, runs a checked ping-pong (8 B to 4 MiB),
//! checked one-sided puts and gets, a checked allreduce and a ring between two ranks
//! with `--mca pml ucx --mca osc ucx` restricted to `rc_verbs` (UCX's `ud_verbs` only
//! for wire-up), then to `ud_verbs` alone, on softhca0. Each rank's device counters
//! (`SOFTHCA_STATS`) must account for the ping-pong's data, so it went over softhca, not
//! TCP or shared memory. The same over `rc_verbs` between two network namespaces (root).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use softhca_testbed::{End, Veth, VethLayout};

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
    let bin = build_mpi_check(addrs[0]);
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
    check(&d, tls);
}

/// `tests/c/mpi_check.c` built with mpicc, as `softhca-mpi-check-<pid>-<tag>`.
fn build_mpi_check(tag: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
    let bin = std::env::temp_dir().join(format!("softhca-mpi-check-{}-{tag}", std::process::id()));
    let st = Command::new("mpicc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run mpicc");
    assert!(st.success(), "mpicc {}", src.display());
    bin
}

/// mpirun exited 0, every part of mpi_check passed, and each rank's device sent the
/// ping-pong's data.
fn check(d: &common::Done, tls: &str) {
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
    // Each rank sends 10 messages of 1 MiB and 10 of 4 MiB: at least one packet per
    // 16 KiB (the largest one softhca device sends another) from each device.
    let want = (10 * (1u64 << 20) + 10 * (4u64 << 20)).div_ceil(softhca::DEFAULT_JUMBO);
    let sent = common::stat_values(&d.stderr, "sent_pkts");
    assert_eq!(sent.len(), 2, "one counters line per rank:\n{}", d.all());
    for s in &sent {
        assert!(*s >= want, "only {s} packets through softhca:\n{}", d.all());
    }
    eprintln!(
        "{tls}:\n{}softhca packets sent per rank: {sent:?}",
        d.stdout
    );
}

/// Two ranks on two hosts: network namespaces joined by a veth pair, each rank's device
/// on its namespace's interface with no softhca configuration. mpirun runs in the first
/// and starts the second's daemon through an rsh agent that enters the other namespace
/// (`--mca plm_rsh_agent`), as ssh would on two machines. Root only (namespaces).
#[test]
fn mpi_over_ucx_rc_verbs_between_namespaces() {
    if !common::have("mpicc") || !common::have("mpirun") || !common::ucx_device_node() {
        return;
    }
    let v = match Veth::up("shmwmpi", VethLayout::TwoHosts) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("SKIP: no veth pair between network namespaces ({e}); test not run");
            return;
        }
    };
    let bin = build_mpi_check("netns");
    let dir = bin.with_extension("d");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (a, b) = (v.addr(End::A), v.addr(End::B));
    let agent = dir.join("agent.sh");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n# Open MPI's rsh launcher runs: <agent> <host> <command>.\n\
             host=$1; shift\ncase $host in\n  {a}) ns={} ;;\n  {b}) ns={} ;;\n  \
             *) echo \"unknown host $host\" >&2; exit 1 ;;\nesac\n\
             exec ip netns exec \"$ns\" sh -c \"$*\"\n",
            v.netns(End::A),
            v.netns(End::B)
        ),
    )
    .expect("write the agent");
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod the agent");
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, format!("{a} slots=1\n{b} slots=1\n")).expect("write hostfile");
    let tls = "rc_verbs,ud_verbs:aux,self";
    let lib = common::lib_dir().display().to_string();
    let _g = common::serial();
    let child = v
        .command(End::A, "mpirun")
        .arg("--hostfile")
        .arg(&hosts)
        .arg("--mca")
        .arg("plm_rsh_agent")
        .arg(&agent)
        .args(["--mca", "plm_rsh_no_tree_spawn", "1", "-np", "2"])
        // Each namespace's daemon binds its rank to core 0 as if alone on its host: here
        // both ranks and their datapath threads then share one core, and every step of
        // the ping-pong waits for a scheduler tick (4 ms at 8 B).
        .args(["--bind-to", "none"])
        .args(["--mca", "pml", "ucx", "--mca", "osc", "ucx"])
        .args([
            "-x",
            &format!("UCX_TLS={tls}"),
            "-x",
            "UCX_NET_DEVICES=softhca0:1",
        ])
        .args([
            "-x",
            &format!("LD_LIBRARY_PATH={lib}"),
            "-x",
            "SOFTHCA_STATS=1",
        ])
        .arg(&bin)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mpirun");
    let d = common::finish(child, Duration::from_secs(300));
    let _ = std::fs::remove_file(&bin);
    let _ = std::fs::remove_dir_all(&dir);
    check(&d, tls);
}
