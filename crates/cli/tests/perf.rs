//! End-to-end tests of the `softhca` binary: loopback perf runs with verification,
//! latency statistics, devinfo, error messages and a two-process run.
//!
//! Every test uses its own TCP port and device addresses so they can run in parallel.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `softhca` binary. Tests that give a device address use 127.0.0.121-125: the
/// `--loopback` runs of the tests beside them (in parallel) take their devices from
/// 127.0.0.160-254, and one took a fixed .201 first ("address already in use").
fn softhca() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softhca"));
    c.env_remove("SOFTHCA_ADDR")
        .env_remove("SOFTHCA_NETDEV")
        .env("SOFTHCA_LOG", "off");
    c
}

fn run(args: &[&str]) -> Output {
    softhca().args(args).output().expect("run softhca")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The JSON objects a `--json` run printed.
fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "softhca failed: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect()
}

fn loopback_bw_verified(op: &str, extra: &[&str]) {
    let args = [
        "perf",
        op,
        "--loopback",
        "-s",
        "65536",
        "-n",
        "200",
        "--verify",
        "--json",
    ];
    let out = run(&[&args[..], extra].concat());
    let rs = json_lines(&out);
    assert_eq!(rs.len(), 1, "one result expected: {rs:?}");
    let r = &rs[0];
    assert_eq!(r["op"], op);
    assert_eq!(r["mode"], "bw");
    assert_eq!(r["size"], 65536);
    assert_eq!(r["iters"], 200);
    assert_eq!(r["verified"], true);
    assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["mpps"].as_f64().unwrap() > 0.0, "{r}");
}

#[test]
fn loopback_send_bw_verified() {
    loopback_bw_verified("send", &[]);
}

#[test]
fn loopback_write_bw_verified() {
    loopback_bw_verified("write", &[]);
}

#[test]
fn loopback_read_bw_verified() {
    loopback_bw_verified("read", &[]);
}

/// Both ends sleep on their completion queues (`--events`) instead of spinning.
#[test]
fn loopback_bw_verified_with_events() {
    loopback_bw_verified("write", &["--events"]);
    loopback_bw_verified("send", &["-e"]);
}

#[test]
fn loopback_atomic_bw_verified() {
    let out = run(&[
        "perf",
        "atomic",
        "--loopback",
        "-n",
        "300",
        "--verify",
        "--json",
        "--qps",
        "2",
    ]);
    let r = &json_lines(&out)[0];
    assert_eq!(r["op"], "atomic");
    assert_eq!(r["size"], 8);
    assert_eq!(r["iters"], 600);
    assert_eq!(r["verified"], true);
}

#[test]
fn loopback_latency_has_percentiles() {
    for op in ["send", "write", "read"] {
        let out = run(&[
            "perf",
            op,
            "--loopback",
            "--lat",
            "-s",
            "4096",
            "-n",
            "200",
            "--verify",
            "--json",
        ]);
        let r = &json_lines(&out)[0];
        assert_eq!(r["op"], op);
        assert_eq!(r["mode"], "lat");
        assert_eq!(r["iters"], 200);
        assert_eq!(r["verified"], true);
        let p50 = r["lat_us_p50"].as_f64().expect("p50");
        let p99 = r["lat_us_p99"].as_f64().expect("p99");
        assert!(p50 > 0.0 && p99 >= p50, "{r}");
    }
}

#[test]
fn devinfo_verbose_shows_port_and_gid() {
    let out = softhca()
        .args(["devinfo", "-v"])
        .env("SOFTHCA_ADDR", "127.0.0.123")
        .output()
        .unwrap();
    let s = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(s.contains("PORT_ACTIVE (4)"), "{s}");
    assert!(s.contains("link_layer:\t\tEthernet"), "{s}");
    assert!(s.contains("GID[  0]:"), "{s}");
    assert!(
        s.contains("0000:0000:0000:0000:0000:ffff:7f00:007b, RoCE v2, 127.0.0.123"),
        "{s}"
    );
    assert!(s.contains("counters:"), "{s}");
}

/// Exit status 1 and exactly one line on stderr, starting with `softhca: `.
fn one_line_error(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "stdout: {}", text(&out.stdout));
    let err = text(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err:?}");
    assert!(lines[0].starts_with("softhca: "), "{err:?}");
    lines[0].to_string()
}

#[test]
fn bad_size_is_one_line() {
    let out = run(&["perf", "send", "--loopback", "-s", "12Q"]);
    assert_eq!(one_line_error(&out), "softhca: invalid size '12Q'");
}

#[test]
fn closed_port_is_one_line() {
    // A port nobody listens on: bind, learn the number, close.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = softhca()
        .args(["perf", "send", "127.0.0.1", "-p", &port.to_string()])
        .env("SOFTHCA_ADDR", "127.0.0.124")
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert_eq!(
        line,
        format!("softhca: cannot reach softhca server at 127.0.0.1:{port}: connection refused")
    );
}

#[test]
fn port_in_use_is_one_line() {
    let held = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let out = softhca()
        .args(["perf", "write", "-p", &port.to_string()])
        .env("SOFTHCA_ADDR", "127.0.0.125")
        .output()
        .unwrap();
    let line = one_line_error(&out);
    assert!(
        line.contains(&format!("{port}")) && line.contains("address in use"),
        "{line}"
    );
}

#[test]
fn two_processes_write_verified() {
    let port = "18631";
    let mut server = softhca()
        .args(["perf", "write", "-p", port])
        .env("SOFTHCA_ADDR", "127.0.0.121")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the server listens (it says so on stderr).
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(
        line.contains("waiting for a client"),
        "server said {line:?}"
    );
    let client = softhca()
        .args([
            "perf",
            "write",
            "127.0.0.1",
            "-p",
            port,
            "--verify",
            "-s",
            "65536",
            "-n",
            "300",
            "--json",
        ])
        .env("SOFTHCA_ADDR", "127.0.0.122")
        .output()
        .unwrap();
    let rs = json_lines(&client);
    assert_eq!(rs[0]["verified"], true);
    assert_eq!(rs[0]["iters"], 300);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(server.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(status.success(), "server failed: {out}");
    assert!(
        out.contains("served write bw") && out.contains("300 messages") && out.contains("verified"),
        "{out}"
    );
}

/// Without GSO and GRO (here disabled, as when the kernel refuses them) the run falls
/// back to one datagram per packet, still verifies every byte, and says so.
#[test]
fn offload_fallback_is_reported() {
    let out = softhca()
        .args([
            "perf",
            "write",
            "--loopback",
            "-s",
            "65536",
            "-n",
            "100",
            "--verify",
        ])
        .env("SOFTHCA_GSO", "0")
        .env("SOFTHCA_GRO", "0")
        .output()
        .expect("run softhca");
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}\n{}", text(&out.stderr));
    assert!(
        s.contains("Offloads        : GSO off (SOFTHCA_GSO=0), GRO off (SOFTHCA_GRO=0)"),
        "{s}"
    );
    let out = softhca()
        .args([
            "perf",
            "write",
            "--loopback",
            "-s",
            "4096",
            "-n",
            "100",
            "--json",
        ])
        .env("SOFTHCA_GSO", "0")
        .output()
        .expect("run softhca");
    let rs = json_lines(&out);
    assert_eq!(rs[0]["gso"], false, "{rs:?}");
    assert!(rs[0]["poll"].is_string(), "{rs:?}");
}
