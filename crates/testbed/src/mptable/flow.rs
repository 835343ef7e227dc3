//! One flow of the multipath table: a softhca `perf` client and server (multipath or
//! single-path RC) or an MPTCP sender and receiver, with faults applied while it runs,
//! and what it measured.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use softhca_testbed::{Direction, End, Fault, PathStats, Paths};

/// Seconds between a flow's progress lines: a line at most this often, so a pause
/// shows to within it. The cut rows' goal is 10 ms; lines 10 ms apart showed
/// pauses of up to 20 ms where none lasted 10.
const PROGRESS_EVERY: &str = "0.001";

/// Which transport a flow uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Transport {
    /// softhca with the multipath extension on (`SOFTHCA_MP=1`).
    Multipath,
    /// softhca plain RC (`SOFTHCA_MP=0`).
    SinglePath,
    /// The kernel's MPTCP.
    Mptcp,
}

impl Transport {
    pub const ALL: [Transport; 3] = [
        Transport::Multipath,
        Transport::SinglePath,
        Transport::Mptcp,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Transport::Multipath => "softhca_mp",
            Transport::SinglePath => "softhca_sp",
            Transport::Mptcp => "mptcp",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Transport::Multipath => "softhca multipath",
            Transport::SinglePath => "softhca single-path RC",
            Transport::Mptcp => "MPTCP",
        }
    }
}

/// What a flow does: bulk 64 KiB WRITEs (a stream for MPTCP) or QD1 4 KiB latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bulk,
    Latency,
}

/// A change applied to the paths while flows run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event {
    Fault(usize, Direction, Fault),
    /// Every path at once.
    FaultAll(Direction, Fault),
    /// Only a counter snapshot.
    Snapshot,
}

/// What the runs share.
pub struct Bed<'a> {
    pub paths: &'a Paths,
    pub softhca: &'a Path,
    pub me: &'a Path,
    pub cc: bool,
    pub ecmp: bool,
    pub sports: u32,
}

/// A started flow.
pub struct Running {
    t: Transport,
    kind: Kind,
    server: Child,
    client: Child,
    client_out: [JoinHandle<String>; 2],
    server_out: [JoinHandle<String>; 2],
    /// When the client was first seen to have exited (Unix seconds).
    exited: Option<f64>,
}

/// What one flow measured.
#[derive(Debug, Clone, Default)]
pub struct FlowResult {
    /// The client (and server) exited cleanly with their result.
    pub ok: bool,
    /// The first error line, if not.
    pub error: Option<String>,
    /// When the client exited (Unix seconds).
    pub exited_at: f64,
    /// The client's (or MPTCP receiver's) JSON result.
    pub json: serde_json::Value,
    /// `progress` samples: Unix seconds, bytes done.
    pub samples: Vec<(f64, u64)>,
    /// The softhca client's device counters.
    pub counters: BTreeMap<String, u64>,
}

fn drain(r: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut r) = r {
            let _ = r.read_to_string(&mut s);
        }
        s
    })
}

fn spawn(mut c: Command) -> Result<(Child, [JoinHandle<String>; 2]), String> {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{c:?}: {e}"))?;
    let out = [drain(child.stdout.take()), drain(child.stderr.take())];
    Ok((child, out))
}

/// Unix time now, in seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

impl Bed<'_> {
    /// A softhca process in `end` with the transport's configuration; `second` selects
    /// the second addresses (a second device in the namespace).
    fn softhca_cmd(&self, t: Transport, end: End, second: bool) -> Command {
        let p = self.paths;
        let addrs: Vec<String> = if self.ecmp {
            let a = if second {
                p.loopback2(end)
            } else {
                p.loopback(end)
            };
            vec![a.to_string()]
        } else {
            (0..p.len())
                .map(|i| {
                    if second {
                        p.addr2(end, i)
                    } else {
                        p.addr(end, i)
                    }
                })
                .map(|a| a.to_string())
                .collect()
        };
        let mut c = p.command(end, self.softhca);
        c.env("SOFTHCA_LOG", "off")
            .env("SOFTHCA_CC", if self.cc { "1" } else { "0" })
            .env("SOFTHCA_ADDR", addrs.join(","))
            .env("SOFTHCA_MP_ADDRS", addrs.join(","))
            .env(
                "SOFTHCA_MP",
                if t == Transport::Multipath { "1" } else { "0" },
            )
            .env("SOFTHCA_PERF_COUNTERS", "1");
        if self.ecmp {
            c.env("SOFTHCA_MP_SPORTS", self.sports.to_string());
        }
        c
    }

    /// Where a client in A reaches B: path 0's address, or B's loopback (ECMP).
    fn target(&self, second: bool) -> String {
        let p = self.paths;
        let a = match (self.ecmp, second) {
            (true, false) => p.loopback(End::B),
            (true, true) => p.loopback2(End::B),
            (false, false) => p.addr(End::B, 0),
            (false, true) => p.addr2(End::B, 0),
        };
        a.to_string()
    }

    /// Starts a flow of `secs` seconds.
    pub fn start(&self, t: Transport, kind: Kind, secs: f64) -> Result<Running, String> {
        let second = kind == Kind::Latency;
        let d = format!("{secs}");
        let (server, client) = if t == Transport::Mptcp {
            let port = if second { "5863" } else { "5862" };
            let (srv, cli) = if second {
                ("mptcp-echo", "mptcp-ping")
            } else {
                ("mptcp-recv", "mptcp-send")
            };
            let mut s = self.paths.command(End::B, self.me);
            s.args(["paths", srv, "--addr", "0.0.0.0", "--port", port]);
            s.args(["--progress", PROGRESS_EVERY]);
            let mut c = self.paths.command(End::A, self.me);
            let to = self.paths.addr(End::B, 0).to_string();
            c.args(["paths", cli, "--addr", &to, "--port", port, "--secs", &d]);
            (s, c)
        } else {
            let port = if second { "18516" } else { "18515" };
            let mut s = self.softhca_cmd(t, End::B, second);
            s.args(["perf", "write", "-p", port]);
            let mut c = self.softhca_cmd(t, End::A, second);
            let to = self.target(second);
            c.args(["perf", "write", &to, "-p", port, "-D", &d, "--json"]);
            match kind {
                // 256 messages (16 MiB) posted ahead, as a TCP sender's autotuned
                // buffer keeps MPTCP's subflows fed: a message completes only once its
                // slowest path has delivered, and 64 (4 MiB) held four 1 Gb/s paths to
                // 1.6 Gb/s by the application's queue, not the transport's window.
                // Both ends sleep while they wait, as MPTCP's do in their system calls:
                // on two cores, two applications spinning beside the two datapath
                // threads were taken off the CPU for up to 16 ms at a time.
                Kind::Bulk => {
                    s.arg("--events");
                    c.args([
                        "-s", "65536", "-t", "256", "-Q", "1", "--verify", "--events",
                    ])
                }
                Kind::Latency => c.args(["--lat", "-s", "4096"]),
            };
            c.args(["--progress", PROGRESS_EVERY]);
            (s, c)
        };
        let (server, server_out) = spawn(server)?;
        // The server listens within a few ms; softhca perf's client also retries.
        std::thread::sleep(Duration::from_millis(300));
        let (client, client_out) = spawn(client)?;
        Ok(Running {
            t,
            kind,
            server,
            client,
            client_out,
            server_out,
            exited: None,
        })
    }

    /// Applies `e`.
    pub fn apply(&self, paths: &mut Paths, e: Event) -> Result<(), String> {
        let r = match e {
            Event::Fault(i, d, f) => paths.set_fault(i, d, f),
            Event::FaultAll(d, f) => (0..paths.len()).try_for_each(|i| paths.set_fault(i, d, f)),
            Event::Snapshot => Ok(()),
        };
        r.map_err(|e| e.to_string())
    }
}

/// Waits for `c` at most until `deadline`, then kills it; returns when it exited.
fn wait_until(c: &mut Child, deadline: Instant) -> (bool, f64) {
    loop {
        if let Ok(Some(_)) = c.try_wait() {
            return (true, unix_now());
        }
        if Instant::now() >= deadline {
            let _ = c.kill();
            let _ = c.wait();
            return (false, unix_now());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The first line of `text` that is not progress or counters.
fn first_error(text: &str) -> Option<String> {
    text.lines()
        .find(|l| {
            !(l.trim().is_empty()
                || l.starts_with("progress ")
                || l.starts_with("interval ")
                || l.starts_with("client: "))
        })
        .map(|l| l.trim().to_string())
}

impl Running {
    /// Notes the time the client exited, if it did (faults are applied meanwhile).
    fn poll(&mut self) {
        if self.exited.is_none() && matches!(self.client.try_wait(), Ok(Some(_))) {
            self.exited = Some(unix_now());
        }
    }

    /// Waits for the flow (killing it after `limit`) and collects what it measured.
    pub fn finish(mut self, limit: Duration) -> FlowResult {
        let deadline = Instant::now() + limit;
        let (client_done, waited) = wait_until(&mut self.client, deadline);
        let exited_at = self.exited.unwrap_or(waited);
        let client_ok = client_done && self.client.wait().is_ok_and(|s| s.success());
        // A server whose client died waits for nothing: give it a moment, then stop it.
        let (server_done, _) =
            wait_until(&mut self.server, Instant::now() + Duration::from_secs(3));
        let server_ok = server_done && self.server.wait().is_ok_and(|s| s.success());
        let [co, ce] = self.client_out;
        let [so, se] = self.server_out;
        let (co, ce) = (co.join().unwrap_or_default(), ce.join().unwrap_or_default());
        let (so, se) = (so.join().unwrap_or_default(), se.join().unwrap_or_default());
        let mptcp_bulk = self.t == Transport::Mptcp && self.kind == Kind::Bulk;
        let (result_out, progress_err) = if mptcp_bulk { (&so, &se) } else { (&co, &ce) };
        let json = result_out
            .lines()
            .find(|l| l.starts_with('{'))
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(serde_json::Value::Null);
        let error = if !client_done {
            Some(format!("client hung: killed after {} s", limit.as_secs()))
        } else if !client_ok {
            Some(first_error(&ce).unwrap_or_else(|| "client failed".into()))
        } else if !server_ok {
            Some(first_error(&se).unwrap_or_else(|| "server failed".into()))
        } else {
            None
        };
        FlowResult {
            ok: error.is_none() && !json.is_null(),
            error,
            exited_at,
            json,
            samples: parse_progress(progress_err),
            counters: parse_counters(&ce),
        }
    }
}

/// `progress <unix> <bytes>` lines.
pub fn parse_progress(text: &str) -> Vec<(f64, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("progress ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// The `client: name=value ...` line of `SOFTHCA_PERF_COUNTERS=1`.
fn parse_counters(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("client: "))
        .filter(|l| !l.contains("congestion"))
        .flat_map(|l| l.split_whitespace())
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// A flow with events at offsets (seconds after the client started) and the path
/// counters at each event and at the end.
pub struct Timeline {
    pub flow: FlowResult,
    /// (Unix time, the event) once applied.
    pub events: Vec<(f64, Event)>,
    /// Path counters right after each event (and once before the first, and at the end).
    pub stats: Vec<(f64, Vec<PathStats>)>,
    /// CPU seconds of every process the flows ran (user + system).
    pub cpu: f64,
}

/// Child processes' CPU seconds so far (those waited for).
pub fn children_cpu() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn stats_now(paths: &Paths) -> Vec<PathStats> {
    paths.stats().unwrap_or_default()
}

/// Runs flow `t` for `secs` with `events`, plus a latency flow beside it if `with_lat`.
pub fn run(
    bed: &Bed<'_>,
    paths: &mut Paths,
    t: Transport,
    secs: f64,
    events: &[(f64, Event)],
    with_lat: bool,
) -> Result<(Timeline, Option<FlowResult>), String> {
    let cpu0 = children_cpu();
    let mut stats = vec![(unix_now(), stats_now(paths))];
    let mut flow = bed.start(t, Kind::Bulk, secs)?;
    let t0 = Instant::now();
    let lat = if with_lat {
        std::thread::sleep(Duration::from_millis(500));
        Some(bed.start(t, Kind::Latency, (secs - 1.5).max(1.0))?)
    } else {
        None
    };
    let mut applied = Vec::new();
    for &(at, e) in events {
        let when = t0 + Duration::from_secs_f64(at);
        while Instant::now() < when {
            flow.poll();
            std::thread::sleep(Duration::from_millis(1));
        }
        bed.apply(paths, e)?;
        // From here on the rule is in place in both namespaces (applying takes ~10 ms).
        applied.push((unix_now(), e));
        stats.push((unix_now(), stats_now(paths)));
    }
    let limit = Duration::from_secs_f64(secs + 30.0);
    let lat = lat.map(|l| l.finish(limit));
    let flow = flow.finish(limit);
    stats.push((unix_now(), stats_now(paths)));
    Ok((
        Timeline {
            flow,
            events: applied,
            stats,
            cpu: children_cpu() - cpu0,
        },
        lat,
    ))
}
