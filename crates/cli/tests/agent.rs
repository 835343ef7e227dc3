//! `softhca stat` and `softhca agent` against two real processes that moved data: one
//! WRITEs 4 MiB (verified) into the other, then both stay idle with their QPs open.
//! The agent, read with a real HTTP client, must give what the processes themselves
//! count (`Context::counters`, the list `softhca devinfo -v` prints), what
//! `softhca devinfo -v` shows of the same device, what `softhca stat` prints, and PSNs
//! that account for every packet of the traffic; bad requests get JSON 4xx answers.
//!
//! The two processes are this test binary run again (`peer_process`), on loopback
//! addresses of their own.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use softhca::*;

const MSG: usize = 64 * 1024;
const COUNT: usize = 64;
const ADDRS: [&str; 2] = ["127.0.50.21", "127.0.50.22"];
const PSNS: [u32; 2] = [0x10_0000, 0x20_0000];
/// Packets of one WRITE at MTU 4096 (the peers offer no larger packets: `jumbo` 0).
const PKTS_PER_MSG: u32 = (MSG / 4096) as u32;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn line(r: &mut impl BufRead) -> String {
    let mut s = String::new();
    r.read_line(&mut s).expect("read a line");
    s.trim().to_string()
}

/// One side: opens its device (environment: SOFTHCA_ADDR, SOFTHCA_RUN_DIR), prints its
/// QP, reads the peer's, and: side 0 WRITEs, side 1 checks the bytes when told. Then it
/// prints its counters and waits for `exit`.
fn peer_main(side: usize) {
    let cfg = Config {
        poll: PollMode::Blocking,
        // The PSNs counted below are those of 4 KiB packets, whenever the WRITEs start.
        jumbo: 0,
        ..Config::from_env().unwrap()
    };
    let ctx = Context::open(&cfg).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.reg_mr(MSG * COUNT, access).unwrap();
    let hello = json!({"qpn": qp.qpn(), "addr": mr.addr(), "rkey": mr.rkey()});
    println!("{hello}");
    let mut stdin = BufReader::new(std::io::stdin());
    let peer: Value = serde_json::from_str(&line(&mut stdin)).unwrap();
    let remote = RemoteQp {
        qpn: peer["qpn"].as_u64().unwrap() as u32,
        psn: PSNS[1 - side],
        gid: Gid::from_ip(ADDRS[1 - side].parse().unwrap()),
    };
    qp.connect_rc(PSNS[side], &remote, ctx.active_mtu(), 0)
        .unwrap();
    if side == 0 {
        mr.write(0, &pattern(MSG * COUNT)).unwrap();
        for i in 0..COUNT {
            let wr = SendWr {
                wr_id: i as u64,
                opcode: WrOpcode::RdmaWrite,
                flags: SendFlags::SIGNALED,
                payload: Payload::Sges(smallvec![mr.sge(i * MSG, MSG as u32)]),
                remote_addr: peer["addr"].as_u64().unwrap() + (i * MSG) as u64,
                rkey: peer["rkey"].as_u64().unwrap() as u32,
                ..SendWr::default()
            };
            qp.post_send(wr).unwrap();
            let mut wc = [Completion::default(); 1];
            assert_eq!(cq.wait(&mut wc, Duration::from_secs(10)).unwrap(), 1);
            assert_eq!(wc[0].status, WcStatus::Success);
        }
    } else {
        assert_eq!(line(&mut stdin), "check");
        let mut got = vec![0u8; MSG * COUNT];
        mr.read(0, &mut got).unwrap();
        assert!(got == pattern(MSG * COUNT), "WRITEs placed the bytes");
    }
    let counters: serde_json::Map<String, Value> = ctx
        .counters()
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    println!("{}", json!({"done": true, "counters": counters}));
    assert_eq!(line(&mut stdin), "exit");
}

/// Not a test by itself: the body of the two peer processes.
#[test]
#[ignore]
fn peer_process() {
    if let Ok(side) = std::env::var("SOFTHCA_AGENT_TEST_SIDE") {
        peer_main(side.parse().unwrap());
    }
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    fn start(side: usize, run_dir: &Path) -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "peer_process", "--ignored", "--nocapture"])
            .args(["--test-threads", "1", "-q"])
            .env("SOFTHCA_AGENT_TEST_SIDE", side.to_string())
            .env("SOFTHCA_ADDR", ADDRS[side])
            .env("SOFTHCA_RUN_DIR", run_dir)
            .env_remove("SOFTHCA_NETDEV")
            .env_remove("SOFTHCA_PORT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start peer");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Peer {
            child,
            stdin,
            stdout,
        }
    }

    /// The next JSON line it prints (the test harness prints other lines too).
    fn json(&mut self) -> Value {
        loop {
            let l = line(&mut self.stdout);
            assert!(!l.is_empty() || self.child.try_wait().unwrap().is_none());
            if l.starts_with('{') {
                return serde_json::from_str(&l).unwrap();
            }
        }
    }

    fn say(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").unwrap();
    }
}

fn softhca() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softhca"));
    c.env("SOFTHCA_LOG", "off");
    c
}

/// GET `path`: status and body (4xx bodies too).
fn get(base: &str, path: &str) -> (u16, String) {
    let mut resp = ureq::get(&format!("{base}{path}"))
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap())
}

fn get_json(base: &str, path: &str) -> Value {
    let (status, body) = get(base, path);
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// The agent, on a port of its choosing; killed on drop.
struct Agent(Child, String);

impl Agent {
    fn start(run_dir: &Path) -> Agent {
        let mut child = softhca()
            .args(["agent", "--listen", "127.0.50.20:0", "--run-dir"])
            .arg(run_dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start agent");
        let first = line(&mut BufReader::new(child.stdout.take().unwrap()));
        let base = first
            .rsplit(' ')
            .next()
            .filter(|u| u.starts_with("http://"))
            .unwrap_or_else(|| panic!("agent said {first:?}"))
            .to_string();
        Agent(child, base)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: signals the child we started, by its pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// `softhca devinfo -v` of the device a process with `addr` serves (on another UDP port,
/// since the process holds 4791): node GUID, GID 0, active MTU and counter names.
fn devinfo(addr: &str) -> (String, String, u64, Vec<String>) {
    let out = softhca()
        .args(["devinfo", "-v"])
        .env("SOFTHCA_ADDR", addr)
        .env("SOFTHCA_PORT", "14791")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "devinfo: {text}");
    let field = |k: &str| {
        let l = text
            .lines()
            .find(|l| l.trim_start().starts_with(k))
            .unwrap();
        l.split_once(':').unwrap().1.trim().to_string()
    };
    let gid0 = field("GID[  0]").split(',').next().unwrap().to_string();
    let mtu = field("active_mtu:")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let names = text
        .lines()
        .skip_while(|l| l.trim() != "counters:")
        .skip(1)
        // The counters are the section's indented lines; the next section is not.
        .take_while(|l| l.starts_with("\t\t"))
        .map(|l| l.split(':').next().unwrap().trim().to_string())
        .collect();
    (field("node_guid:"), gid0, mtu, names)
}

/// The test's run directory, removed on drop (a failed test too).
struct RunDir(PathBuf);

impl RunDir {
    fn new() -> RunDir {
        let d = std::env::temp_dir().join(format!("softhca-agent-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        RunDir(d)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// PSN `a + n` modulo 2^24.
fn psn_add(a: u32, n: u32) -> u64 {
    u64::from(a.wrapping_add(n) & 0xff_ffff)
}

#[test]
fn agent_and_stat_report_what_the_processes_count() {
    let run_dir = RunDir::new();
    let dir = &run_dir.0;
    let mut peers = [Peer::start(0, dir), Peer::start(1, dir)];
    let hellos = [peers[0].json(), peers[1].json()];
    peers[0].say(&hellos[1].to_string());
    peers[1].say(&hellos[0].to_string());
    let own0 = peers[0].json();
    peers[1].say("check");
    let own1 = peers[1].json();
    let pids = [peers[0].child.id(), peers[1].child.id()];
    let agent = Agent::start(dir);
    let base = agent.1.clone();

    check_devices(&base, &pids, &hellos);
    check_counters(&base, &pids, &[&own0, &own1]);
    check_stat(&base, dir, pids[0]);
    check_errors(&base, dir);
    check_spec_routes(&base, pids[0]);
    check_schemas(&base, pids[0]);

    for p in &mut peers {
        p.say("exit");
    }
    for p in &mut peers {
        assert!(p.child.wait().unwrap().success(), "peer failed");
    }
    drop(agent);
}

/// Devices, as `softhca devinfo -v` shows them, and QPs whose PSNs count the traffic.
fn check_devices(base: &str, pids: &[u32; 2], hellos: &[Value; 2]) {
    let devices = get_json(base, "/v1/devices");
    assert_eq!(devices.as_array().unwrap().len(), 2, "{devices}");
    for side in 0..2 {
        let d = devices
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["pid"] == pids[side])
            .unwrap_or_else(|| panic!("no device of pid {}: {devices}", pids[side]));
        let (guid, gid0, mtu, names) = devinfo(ADDRS[side]);
        assert_eq!(d["node_guid"], guid.as_str());
        assert_eq!(d["gids"][0]["gid"], gid0.as_str());
        assert_eq!(d["gids"][0]["ip"], ADDRS[side]);
        assert_eq!(d["active_mtu"], mtu);
        assert_eq!(d["qp_count"], 1);
        let path = format!("/v1/devices/{}/softhca0/counters", pids[side]);
        let counters = get_json(base, &path);
        let mut served: Vec<&String> = counters.as_object().unwrap().keys().collect();
        let mut listed: Vec<&String> = names.iter().collect();
        served.sort();
        listed.sort();
        assert_eq!(served, listed, "the counters devinfo -v lists");
    }
    // The writer's QP: connected to the reader's, every packet of the 4 MiB sent and
    // acknowledged; the reader expects the PSN after the last.
    let sent = (COUNT as u32) * PKTS_PER_MSG;
    let q = get_json(base, &format!("/v1/qps?pid={}", pids[0]));
    let q = &q[0];
    assert_eq!(
        (q["qp_type"].as_str(), q["state"].as_str()),
        (Some("RC"), Some("RTS"))
    );
    assert_eq!(q["dest_qpn"], hellos[1]["qpn"]);
    assert_eq!(q["peer"], ADDRS[1]);
    assert_eq!(q["sq_psn"], psn_add(PSNS[0], sent));
    assert_eq!(q["una_psn"], q["sq_psn"]);
    assert_eq!(
        (q["send_queued"].as_u64(), q["inflight_psns"].as_u64()),
        (Some(0), Some(0))
    );
    let r = get_json(base, &format!("/v1/devices/{}/softhca0/qps", pids[1]));
    assert_eq!(r[0]["rq_psn"], psn_add(PSNS[0], sent));
    assert_eq!(r[0]["dest_qpn"], hellos[0]["qpn"]);
}

/// Counters equal to the processes' own, in JSON and in /metrics.
fn check_counters(base: &str, pids: &[u32; 2], own: &[&Value; 2]) {
    let metrics = get(base, "/metrics");
    assert_eq!(metrics.0, 200);
    for side in 0..2 {
        let path = format!("/v1/devices/{}/softhca0/counters", pids[side]);
        let served = get_json(base, &path);
        for (name, v) in own[side]["counters"].as_object().unwrap() {
            // The datapath thread's loop counters may tick while it sleeps.
            if name.starts_with("dp_") {
                continue;
            }
            assert_eq!(&served[name], v, "side {side} counter {name}");
            if name == "sent_pkts" || name == "rcvd_pkts" {
                let sample = format!("softhca_{name}_total{{pid=\"{}\",", pids[side]);
                let line = metrics
                    .1
                    .lines()
                    .find(|l| l.starts_with(&sample))
                    .unwrap_or_else(|| panic!("no {sample} in /metrics"));
                assert!(line.ends_with(&format!(" {v}")), "{line} vs {v}");
            }
        }
    }
    let sent = u64::from(COUNT as u32 * PKTS_PER_MSG);
    assert!(own[0]["counters"]["sent_pkts"].as_u64().unwrap() >= sent);
    assert!(own[1]["counters"]["rcvd_pkts"].as_u64().unwrap() >= sent);
    assert!(metrics.1.contains("# TYPE softhca_sent_pkts_total counter"));
    assert!(metrics
        .1
        .contains(&format!("softhca_qps{{pid=\"{}\",command=", pids[0])));
}

/// `softhca stat --json` gives the agent's snapshot; the text form names the QP.
fn check_stat(base: &str, dir: &Path, pid: u32) {
    let out = softhca()
        .args(["stat", "--json", "--pid", &pid.to_string(), "--run-dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stat: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut agent = get_json(base, &format!("/v1/devices/{pid}/softhca0"));
    let mut mine = stat[0].clone();
    for s in [&mut agent, &mut mine] {
        let o = s.as_object_mut().unwrap();
        o.remove("taken_ms");
        let c = o["counters"].as_object_mut().unwrap();
        c.retain(|k, _| !k.starts_with("dp_"));
    }
    assert_eq!(mine, agent);
    let text = softhca()
        .args(["stat", "--pid", &pid.to_string(), "--run-dir"])
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("type RC state RTS"), "{text}");
    assert!(text.contains(&format!("peer {}", ADDRS[1])), "{text}");
}

/// 4xx answers are JSON that say what was wrong; the allocation record is verbatim.
fn check_errors(base: &str, dir: &Path) {
    for (path, status, words) in [
        ("/v1/devices/abc/softhca0", 400, "not a process id"),
        (
            "/v1/devices/1/softhca0",
            404,
            "no softhca device published by pid 1",
        ),
        ("/v1/qps?pid=x", 400, "not a process id"),
        (
            "/v1/counters?verbose=1",
            400,
            "unknown query parameter 'verbose'",
        ),
        ("/v1/nothing", 404, "no such resource"),
        ("/v1/allocations", 404, "k8s-allocations.json"),
    ] {
        let (s, body) = get(base, path);
        assert_eq!(s, status, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path}: {body}"));
        assert_eq!(v["status"], status);
        assert!(
            v["error"].as_str().unwrap().contains(words),
            "{path}: {body}"
        );
    }
    let r = ureq::post(&format!("{base}/v1/devices"))
        .config()
        .http_status_as_error(false)
        .build()
        .send_empty()
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    let record = r#"{"allocations":[{"pod":"default/p1","device":"softhca0"}]}"#;
    std::fs::write(dir.join("k8s-allocations.json"), record).unwrap();
    assert_eq!(get(base, "/v1/allocations"), (200, record.to_string()));
}

/// Every path the committed OpenAPI description lists is served (and nothing else
/// under /v1 is): the description and the router agree.
fn check_spec_routes(base: &str, pid: u32) {
    let (s, spec) = get(base, "/openapi.yaml");
    assert_eq!(s, 200);
    assert!(spec.starts_with("openapi: 3"));
    let paths: Vec<&str> = spec
        .lines()
        .filter(|l| l.starts_with("  /") && l.ends_with(':'))
        .map(|l| l.trim().trim_end_matches(':'))
        .collect();
    assert!(paths.len() >= 10, "{paths:?}");
    for p in paths {
        let p = p
            .replace("{pid}", &pid.to_string())
            .replace("{name}", "softhca0");
        let (s, body) = get(base, &p);
        // The allocation record exists by now: every listed route answers 200.
        assert_eq!(s, 200, "{p}: {body}");
    }
    let topo = get_json(base, "/v1/node/topology");
    assert!(topo["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["name"] == "lo" && i["virtual"] == true));
}

/// Every answer is valid under the schema the OpenAPI description gives for its status,
/// checked by an independent validator (Python's openapi-schema-validator; skipped with
/// a message where it is not installed).
fn check_schemas(base: &str, pid: u32) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("tests/support/openapi_check.py"))
        .arg(root.join("../agent/openapi.yaml"))
        .args([base, &pid.to_string(), "softhca0"])
        .output();
    let Ok(out) = out else {
        eprintln!("schema check skipped: no python3");
        return;
    };
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(77) {
        eprintln!("schema check {}", text.trim());
        return;
    }
    assert!(
        out.status.success(),
        "answers against openapi.yaml:\n{text}"
    );
    assert_eq!(text.matches("ok /v1/").count(), 12, "{text}");
}
