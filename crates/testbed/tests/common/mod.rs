//! Shared by the testbed integration tests: finding (or building) the `softhca` binary
//! and running `softhca perf` between the two ends of an impairment link.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use softhca_testbed::{check_available, End, Ends, Link, LinkConfig};

/// A link, or `None` (after printing why) when this host cannot build one.
pub fn link(cfg: LinkConfig) -> Option<Link> {
    if let Err(e) = check_available() {
        eprintln!("skipped: needs root and ip netns ({e})");
        return None;
    }
    Some(Link::up(cfg).expect("build the impairment link"))
}

fn newest_source(root: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    let mut stack: Vec<PathBuf> = ["cli", "softhca", "transport", "io", "wire", "memory"]
        .iter()
        .map(|c| root.join("crates").join(c))
        .collect();
    stack.push(root.join("Cargo.lock"));
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::metadata(&p) else {
            continue;
        };
        if md.is_dir() {
            if p.file_name().is_some_and(|n| n == "tests" || n == "target") {
                continue;
            }
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        } else if let Ok(m) = md.modified() {
            newest = newest.max(m);
        }
    }
    newest
}

/// The `softhca` binary of this build profile: `$SOFTHCA_BIN`, else the one next to this
/// test executable if it is newer than every source file it is built from, else one
/// built now with `cargo build -p softhca-cli` into `<target>/testbed-cli` (a separate
/// target dir, so we never wait on the lock of the `cargo test` that runs us).
pub fn softhca_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("SOFTHCA_BIN") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test>-<hash>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>")
            .to_path_buf();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let fresh_after = newest_source(&root);
        let sibling = profile_dir.join("softhca");
        let is_fresh = |p: &Path| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|m| m >= fresh_after)
        };
        if is_fresh(&sibling) {
            return sibling;
        }
        let target = profile_dir
            .parent()
            .expect("target dir")
            .join("testbed-cli");
        let release = !cfg!(debug_assertions);
        let mut c = Command::new(env!("CARGO"));
        c.current_dir(&root)
            .args(["build", "-q", "-p", "softhca-cli", "--bin", "softhca"])
            .arg("--target-dir")
            .arg(&target);
        if release {
            c.arg("--release");
        }
        let st = c.status().expect("run cargo build -p softhca-cli");
        assert!(st.success(), "cargo build -p softhca-cli failed");
        target
            .join(if release { "release" } else { "debug" })
            .join("softhca")
    })
}

/// `ip netns exec <end> softhca ARGS`, with configuration from the environment cleared so
/// the device picks the link's address by itself.
pub fn softhca(link: &impl Ends, end: End, args: &[&str]) -> Command {
    let mut c = link.command_in(end, softhca_bin().as_os_str());
    c.args(args)
        .env_remove("SOFTHCA_ADDR")
        .env_remove("SOFTHCA_NETDEV")
        .env("SOFTHCA_LOG", "off")
        .stdin(Stdio::null());
    c
}

/// Waits for `child` at most `limit`, killing it after that.
pub fn wait_with_timeout(mut child: Child, limit: Duration) -> (Output, bool) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(_)) = child.try_wait() {
            return (child.wait_with_output().expect("collect output"), false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    (child.wait_with_output().expect("collect output"), true)
}

/// One `softhca perf` result.
#[derive(Debug, Clone)]
pub struct PerfRun {
    pub op: String,
    pub bytes: u64,
    pub seconds: f64,
    pub gbps: f64,
}

/// `softhca perf OP --verify` moving `total` bytes in `size`-byte messages from end A
/// (client) to a server in end B; panics (test failure) on a non-zero exit of either side,
/// a hang (more than `limit`), or a result that is not verified.
pub fn perf(link: &impl Ends, op: &str, total: u64, size: u64, limit: Duration) -> PerfRun {
    perf_env(link, op, total, size, limit, &[])
}

/// [`perf`] with environment variables `env` set on both ends.
pub fn perf_env(
    link: &impl Ends,
    op: &str,
    total: u64,
    size: u64,
    limit: Duration,
    env: &[(&str, &str)],
) -> PerfRun {
    let iters = (total / size).max(1).to_string();
    let size_s = size.to_string();
    let port = "18515";
    let server = softhca(
        link,
        End::B,
        &["perf", op, "-p", port, "-s", &size_s, "-n", &iters],
    )
    .envs(env.iter().copied())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start server");
    let server_addr = link.addr_of(End::B).to_string();
    let start = Instant::now();
    let mut out = None;
    while start.elapsed() < Duration::from_secs(10) {
        let client = softhca(
            link,
            End::A,
            &[
                "perf",
                op,
                &server_addr,
                "-p",
                port,
                "-s",
                &size_s,
                "-n",
                &iters,
                "--verify",
                "--json",
            ],
        )
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start client");
        let (o, hung) = wait_with_timeout(client, limit);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        if !o.status.success() && stderr.contains("cannot reach") && !hung {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert!(!hung, "{op}: client hung for {limit:?}: {stderr}");
        out = Some(o);
        break;
    }
    let out = out.expect("server never listened");
    let (srv, srv_hung) = wait_with_timeout(server, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{op}: client failed: {stdout}\n{}\nserver: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&srv.stderr),
    );
    assert!(
        !srv_hung && srv.status.success(),
        "{op}: server failed: {}",
        String::from_utf8_lossy(&srv.stderr)
    );
    let json: serde_json::Value = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("one JSON result");
    assert_eq!(json["op"], op);
    assert_eq!(json["verified"], true, "{op}: every byte verified");
    let iters: u64 = json["iters"].as_u64().expect("iters");
    assert_eq!(iters, (total / size).max(1), "{op}: all messages moved");
    PerfRun {
        op: op.to_owned(),
        bytes: iters * size,
        seconds: json["seconds"].as_f64().unwrap_or(0.0),
        gbps: json["gbps"].as_f64().unwrap_or(0.0),
    }
}
