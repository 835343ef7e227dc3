//! Two network namespaces joined by a veth pair, with no softhca configuration at all:
//! `softhca perf write 10.x.y.2 --verify` from one namespace to a server in the other must
//! pick the interface addresses by itself (the "two hosts" case of zero configuration),
//! over IPv4 and IPv6. Needs root and iproute2; skipped with a message otherwise.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Namespaces named after this process so parallel runs never collide; removed on drop.
struct Pair {
    a: String,
    b: String,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Pair {
    fn new(tag: &str) -> Option<Pair> {
        Pair::with_lo(tag, true)
    }

    /// `lo_up`: bring each namespace's loopback up (a new namespace has it down, with no
    /// 127.0.0.1).
    fn with_lo(tag: &str, lo_up: bool) -> Option<Pair> {
        // SAFETY: geteuid has no preconditions and touches no memory.
        if unsafe { libc::geteuid() } != 0 || !ip(&["-V"]) {
            eprintln!("skipped: needs root and iproute2 (ip netns)");
            return None;
        }
        let id = std::process::id() % 100_000;
        let p = Pair {
            a: format!("shca{tag}a{id}"),
            b: format!("shca{tag}b{id}"),
        };
        let (va, vb) = (format!("v{tag}a{id}"), format!("v{tag}b{id}"));
        let ok = ip(&["netns", "add", &p.a])
            && ip(&["netns", "add", &p.b])
            && ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])
            && ip(&["link", "set", &va, "netns", &p.a])
            && ip(&["link", "set", &vb, "netns", &p.b])
            && ip(&["-n", &p.a, "addr", "add", "10.77.0.1/24", "dev", &va])
            && ip(&["-n", &p.b, "addr", "add", "10.77.0.2/24", "dev", &vb])
            && ip(&["-n", &p.a, "addr", "add", "fd77::1/64", "dev", &va, "nodad"])
            && ip(&["-n", &p.b, "addr", "add", "fd77::2/64", "dev", &vb, "nodad"])
            && ip(&["-n", &p.a, "link", "set", &va, "up"])
            && ip(&["-n", &p.b, "link", "set", &vb, "up"])
            && (!lo_up
                || ip(&["-n", &p.a, "link", "set", "lo", "up"])
                    && ip(&["-n", &p.b, "link", "set", "lo", "up"]));
        if !ok {
            eprintln!("skipped: could not create network namespaces");
            return None;
        }
        Some(p)
    }

    fn softhca(&self, ns: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_softhca")])
            .args(args)
            .env_remove("SOFTHCA_ADDR")
            .env_remove("SOFTHCA_NETDEV")
            .env("SOFTHCA_LOG", "off");
        c
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it the pair.
        ip(&["netns", "del", &self.a]);
        ip(&["netns", "del", &self.b]);
    }
}

fn wait_with_timeout(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().expect("collect output");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    child.wait_with_output().expect("collect output")
}

/// Server in namespace b, client in namespace a, 200 verified 64 KiB WRITEs.
fn write_between(p: &Pair, server_addr: &str, port: &str) {
    let server = p
        .softhca(
            &p.b,
            &["perf", "write", "-p", port, "-s", "64K", "-n", "200"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    // The client retries until the server listens.
    let mut client_out = None;
    for _ in 0..50 {
        let out = p
            .softhca(
                &p.a,
                &[
                    "perf",
                    "write",
                    server_addr,
                    "-p",
                    port,
                    "-s",
                    "64K",
                    "-n",
                    "200",
                    "--verify",
                    "--json",
                ],
            )
            .output()
            .expect("run client");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() || !stderr.contains("cannot reach") {
            client_out = Some(out);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = client_out.expect("server never listened");
    let server = wait_with_timeout(server, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client failed: {}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("one JSON result");
    assert_eq!(json["op"], "write");
    assert_eq!(json["iters"], 200);
    assert_eq!(json["verified"], true);
    assert!(json["gbps"].as_f64().is_some_and(|g| g > 0.0));
    assert!(
        server.status.success(),
        "server failed: {}",
        String::from_utf8_lossy(&server.stderr)
    );
}

#[test]
fn zero_config_write_between_namespaces_ipv4_and_ipv6() {
    let Some(p) = Pair::new("w") else { return };
    write_between(&p, "10.77.0.2", "18641");
    write_between(&p, "fd77::2", "18642");
    // Each side's GID table lists its interface addresses, found with no configuration.
    let out = p.softhca(&p.a, &["devinfo"]).output().expect("run devinfo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("10.77.0.1"), "GID table: {text}");
    assert!(
        text.contains("fd77::1") || text.contains("fd77:0000"),
        "GID table: {text}"
    );
    // The port's rate is its veth's 10 Gb/s, as rxe reports it: 1X FDR10.
    let out = p
        .softhca(&p.a, &["devinfo", "-v"])
        .output()
        .expect("run devinfo");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    assert_eq!(field("active_width:").as_deref(), Some("1"), "{text}");
    assert_eq!(field("active_speed:").as_deref(), Some("8"), "{text}");
}

/// A new namespace's loopback is down, with no 127.0.0.1 (as `ip netns add` leaves it):
/// the device serves the interface address alone, as rxe would, instead of failing to
/// open for want of a loopback address.
#[test]
fn zero_config_write_between_namespaces_whose_loopback_is_down() {
    let Some(p) = Pair::with_lo("lo", false) else {
        return;
    };
    write_between(&p, "10.77.0.2", "18643");
    let out = p.softhca(&p.a, &["devinfo"]).output().expect("run devinfo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "devinfo: {text}");
    assert!(text.contains("10.77.0.1"), "GID table: {text}");
    assert!(!text.contains("127.0.0."), "GID table: {text}");
}

/// `softhca stream receive` in namespace b, `softhca stream camera --to` in namespace a:
/// each mode's frames cross the veth, the receiver's table and JSON account for all.
#[test]
fn stream_camera_and_receiver_in_two_namespaces() {
    let Some(p) = Pair::new("st") else { return };
    let dir = std::env::temp_dir().join(format!("softhca-netns-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, mode) in ["rc-send", "uc-write", "gvsp"].iter().enumerate() {
        let json = dir.join(format!("{mode}.json"));
        let listen = format!("10.77.0.2:{}", 18600 + i);
        let rx = p
            .softhca(&p.b, &["stream", "receive", "--listen", &listen, "--json"])
            .arg(&json)
            .args(["--ring", "8"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start receiver");
        let mut cam = None;
        for _ in 0..50 {
            let out = p
                .softhca(
                    &p.a,
                    &[
                        "stream", "camera", "--to", &listen, "--mode", mode, "-n", "20", "--width",
                        "640", "--height", "480", "--fps", "200",
                    ],
                )
                .output()
                .expect("run camera");
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            if out.status.success() || !stderr.contains("refused") {
                cam = Some(out);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let cam = cam.expect("receiver never listened");
        let rx = wait_with_timeout(rx, Duration::from_secs(30));
        let (cs, rs) = (
            String::from_utf8_lossy(&cam.stdout),
            String::from_utf8_lossy(&rx.stdout),
        );
        assert!(
            cam.status.success() && rx.status.success(),
            "{mode}: camera: {cs}{}\nreceiver: {rs}{}",
            String::from_utf8_lossy(&cam.stderr),
            String::from_utf8_lossy(&rx.stderr)
        );
        assert!(cs.contains("receiver: 20 complete"), "{mode}: {cs}");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let row = &v["rows"][0];
        assert_eq!(row["mode"], *mode);
        assert_eq!(row["counters"]["complete"], 20, "{row}");
        assert_eq!(row["corrupt"], 0, "{row}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
