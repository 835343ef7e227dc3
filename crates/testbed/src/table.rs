//! `softhca-impair shaped`: the shaped-link table. softhca SEND/WRITE/READ of 64 KiB
//! and TCP (iperf3) over one link shaped by tbf at 1 Gb/s, at 100 Mb/s and at 1 Gb/s
//! with 5 ms of delay each way, with the packets the shaper dropped; then fairness on
//! the 1 Gb/s link: two softhca flows, softhca against TCP, and a flow that starts late.
//!
//! Each throughput row has the goodput (bytes the application moved) and, beside it,
//! what fills the link: the bytes the token bucket sent on the data's side while the
//! flow measured, over the rate. The two differ by the headers of each frame, which
//! differ by protocol (RoCEv2 carries at most 4096 bytes of payload in a frame, TCP at
//! MTU 9000 nearly 9000), so the row has the goodput's ceiling too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use softhca_testbed::{End, Shape, ShapedLink};

mod wire;
use wire::LiveLines;

/// The message size of the softhca rows.
const MSG: u64 = 64 * 1024;

/// Options of `softhca-impair shaped`.
#[derive(Debug, Args)]
pub struct TableArgs {
    /// Seconds per throughput row.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Seconds of the fairness rows (the late starter runs for part of them).
    #[arg(long, default_value_t = 10.0)]
    fair_seconds: f64,
    /// The `softhca` binary (default: next to this one).
    #[arg(long)]
    softhca: Option<PathBuf>,
    /// Run softhca without congestion control (the uncontrolled rows to compare with).
    #[arg(long)]
    no_cc: bool,
    /// Base name of the links' namespaces and devices (at most 10 bytes; each link
    /// adds a digit), so that runs in parallel keep apart (default: unique per run).
    #[arg(long)]
    name: Option<String>,
    /// Only these rows (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    rows: Vec<Rows>,
    /// Also print each throughput row's rate per this many seconds (where a shortfall
    /// is; 0.5 without a value).
    #[arg(long, num_args = 0..=1, default_missing_value = "0.5")]
    intervals: Option<f64>,
}

/// The table's groups of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Rows {
    /// 1 Gb/s.
    #[value(name = "1g")]
    Gbit,
    /// 100 Mb/s.
    #[value(name = "100m")]
    Mbit100,
    /// 1 Gb/s with 5 ms of delay each way.
    #[value(name = "1g5ms")]
    GbitDelay,
    /// The fairness rows on 1 Gb/s.
    #[value(name = "fair")]
    Fair,
}

/// A flow's result: its average, its intervals (start, end, Gb/s) in seconds since
/// the run began, and softhca's path MTU.
#[derive(Debug, Default, Clone)]
struct Outcome {
    gbps: f64,
    intervals: Vec<(f64, f64, f64)>,
    pmtu: Option<u64>,
}

/// A running flow: its server and client processes, when the client started, and the
/// output that tells when it began measuring (softhca's progress lines on the client's
/// stderr, the iperf3 receiver's interval lines on the server's stdout).
struct Flow {
    server: Child,
    client: Child,
    tcp: bool,
    at: f64,
    live: LiveLines,
}

/// What the runs share: the link, the binary, when the run began.
struct Bench<'a> {
    link: &'a ShapedLink,
    softhca: &'a Path,
    t0: Instant,
    /// `SOFTHCA_CC` for every softhca process: the table is of congestion control.
    cc: &'static str,
    /// Seconds per interval of a flow's rate.
    interval: f64,
    /// Print each throughput row's intervals.
    show_intervals: bool,
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl Bench<'_> {
    fn spawn(&self, end: End, program: &Path, args: &[String]) -> Result<Child, String> {
        self.link
            .command(end, program)
            .args(args)
            .env("SOFTHCA_LOG", "off")
            .env("SOFTHCA_CC", self.cc)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| err(&program.display().to_string(), e))
    }

    /// softhca serving `addr` in `end`.
    fn spawn_at(&self, end: End, addr: std::net::IpAddr, args: &[String]) -> Result<Child, String> {
        self.link
            .command(end, self.softhca)
            .args(args)
            .env("SOFTHCA_LOG", "off")
            .env("SOFTHCA_CC", self.cc)
            .env("SOFTHCA_ADDR", addr.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| err("softhca", e))
    }

    /// softhca `op` from end A to a server in end B on `port` for `secs`; flow `k` > 0
    /// runs on the extra addresses 10.99.0.(10k+1) and .(10k+2) (see `add_addr`).
    fn softhca(&self, op: &str, k: u16, secs: f64) -> Result<Flow, String> {
        let p = (18515 + k).to_string();
        let (ca, sa) = if k == 0 {
            (self.link.addr(End::A), self.link.addr(End::B))
        } else {
            let base = u8::try_from(10 * k).map_err(|e| err("flow", e))?;
            (
                std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 99, 0, base + 1)),
                std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 99, 0, base + 2)),
            )
        };
        let server = self.spawn_at(End::B, sa, &strings(&["perf", op, "-p", &p]))?;
        std::thread::sleep(Duration::from_millis(300));
        let addr = sa.to_string();
        let d = format!("{secs}");
        let i = format!("{}", self.interval);
        let args = ["perf", op, &addr, "-p", &p, "-D", &d, "--interval", &i];
        let args = [&args[..], &["--progress", "1"]].concat();
        let mut client = self.spawn_at(End::A, ca, &strings(&args))?;
        let at = self.t0.elapsed().as_secs_f64();
        let live = LiveLines::new(client.stderr.take().ok_or("softhca's stderr")?);
        Ok(Flow {
            server,
            client,
            tcp: false,
            at,
            live,
        })
    }

    /// TCP (iperf3, the kernel's default congestion control) from A to B.
    fn tcp(&self, port: u16, secs: f64) -> Result<Flow, String> {
        let iperf = Path::new("iperf3");
        let p = port.to_string();
        // iperf3 takes no interval under 0.1 s.
        let i = format!("{}", self.interval.max(0.1));
        // The receiver's intervals, as they come (in Kbit/s): what arrived, as softhca's
        // intervals count what completed (the sender's count what entered its socket
        // buffer, ahead of the link by up to the buffer).
        let srv = ["-s", "-1", "-p", &p, "-i", &i, "-f", "k", "--forceflush"];
        let mut server = self.spawn(End::B, iperf, &strings(&srv))?;
        std::thread::sleep(Duration::from_millis(300));
        let addr = self.link.addr(End::B).to_string();
        let t = format!("{}", secs.ceil() as u64);
        let args = ["-c", &addr, "-p", &p, "-t", &t, "-i", &i, "--json"];
        let client = self.spawn(End::A, iperf, &strings(&args))?;
        let at = self.t0.elapsed().as_secs_f64();
        let live = LiveLines::new(server.stdout.take().ok_or("iperf3's stdout")?);
        Ok(Flow {
            server,
            client,
            tcp: true,
            at,
            live,
        })
    }
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

impl Flow {
    /// When the flow began measuring: softhca's first progress line; the iperf3
    /// receiver's first intervals, each of which came at most a little after its end
    /// (None if the output says neither within 30 s).
    fn start(&mut self) -> Option<Instant> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut best: Option<Instant> = None;
        let mut seen = 0;
        while let Some((at, line)) = self.live.next(deadline) {
            if !self.tcp {
                if let Some((unix, _)) = wire::progress(&line) {
                    return Some(wire::instant_of(unix));
                }
            } else if let Some((_, end, _)) = wire::iperf_interval(&line) {
                let s = at.checked_sub(Duration::from_secs_f64(end))?;
                best = Some(best.map_or(s, |b| b.min(s)));
                seen += 1;
                if seen == 3 {
                    break;
                }
            }
        }
        best
    }

    /// Waits for both processes and reads the client's result.
    fn finish(mut self) -> Result<Outcome, String> {
        let out = self
            .client
            .wait_with_output()
            .map_err(|e| err("client", e))?;
        if !out.status.success() {
            // A server waits for a client that never came (iperf3 -s -1 forever).
            let _ = self.server.kill();
        }
        let srv = self
            .server
            .wait_with_output()
            .map_err(|e| err("server", e))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let live = self.live.all();
        if !out.status.success() {
            let s = String::from_utf8_lossy(&srv.stderr);
            return Err(format!("client failed: {stdout}{live}\nserver: {s}"));
        }
        let mut o = if self.tcp {
            parse_iperf(&stdout, &live)?
        } else {
            parse_softhca(&stdout, &live)?
        };
        for i in o.intervals.iter_mut() {
            i.0 += self.at;
            i.1 += self.at;
        }
        Ok(o)
    }
}

/// The goodput of `softhca perf` from its progress lines (its bandwidth row,
/// ` 65536  <iters>  <Gb/s>  <Mpps>`, has two decimals), its `interval <start> <end>
/// <Gb/s>` lines and its path MTU.
fn parse_softhca(stdout: &str, stderr: &str) -> Result<Outcome, String> {
    let gbps = wire::progress_gbps(stderr)
        .or_else(|| {
            stdout
                .lines()
                .find(|l| l.trim_start().starts_with("65536 "))
                .and_then(|l| l.split_whitespace().nth(2))
                .and_then(|v| v.parse().ok())
        })
        .ok_or_else(|| format!("no bandwidth in softhca's output: {stdout}"))?;
    let intervals = stderr
        .lines()
        .filter_map(|l| {
            let v: Vec<f64> = l
                .strip_prefix("interval ")?
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            (v.len() == 3).then(|| (v[0], v[1], v[2]))
        })
        .collect();
    Ok(Outcome {
        gbps,
        intervals,
        pmtu: wire::perf_mtu(stdout),
    })
}

/// iperf3's JSON: the received rate; the receiver's intervals from the server's text.
fn parse_iperf(stdout: &str, server: &str) -> Result<Outcome, String> {
    let j: serde_json::Value = serde_json::from_str(stdout).map_err(|e| err("iperf3 JSON", e))?;
    let gbps = j["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or("iperf3 JSON without end.sum_received")?
        / 1e9;
    let intervals = server.lines().filter_map(wire::iperf_interval).collect();
    Ok(Outcome {
        gbps,
        intervals,
        pmtu: None,
    })
}

/// A flow's average rate over `[from, to)` (seconds since the run began), from its
/// intervals.
fn rate_over(o: &Outcome, from: f64, to: f64) -> f64 {
    let mut bits = 0.0;
    for &(a, b, g) in &o.intervals {
        let overlap = b.min(to) - a.max(from);
        if overlap > 0.0 {
            bits += g * overlap;
        }
    }
    bits / (to - from).max(1e-9)
}

/// The shaper's packets sent and dropped, both ends together.
fn shaper(link: &ShapedLink) -> (u64, u64) {
    let s = |e| link.qdisc(e).unwrap_or_default();
    let (a, b) = (s(End::A), s(End::B));
    (a.sent + b.sent, a.dropped + b.dropped)
}

/// The token bucket's bytes sent from `end` over the time from `start` to `secs` after
/// it, as a share of the link's rate; `bytes0` is the count before the flow's client
/// started (what went before `start` is its connection's setup, a few packets).
fn wire_share(link: &ShapedLink, end: End, bytes0: u64, start: Instant, secs: f64) -> Option<f64> {
    let until = start + Duration::from_secs_f64(secs);
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    let t = Instant::now();
    let q = link.qdisc(end).ok()?;
    // `tc` takes a few milliseconds: the counters are of about halfway.
    let t = t + t.elapsed() / 2;
    let bits = q.bytes.checked_sub(bytes0)? as f64 * 8.0;
    Some(bits / (t - start).as_secs_f64() / link.shape().rate as f64)
}

/// The payload of softhca's packets on a link of IP MTU `link_mtu`: the larger size two
/// softhca devices agree on there (`SOFTHCA_JUMBO`), or the path MTU `perf` reported.
fn packet_size(pmtu: Option<u64>, link_mtu: u64) -> u64 {
    let pmtu = pmtu.unwrap_or(4096);
    let offer = softhca::Config::from_env().map_or(softhca::DEFAULT_JUMBO, |c| c.jumbo);
    let udp_room = usize::try_from(link_mtu)
        .unwrap_or(0)
        .saturating_sub(20 + 8);
    match softhca::jumbo_size(udp_room, offer) {
        n if n > 0 && pmtu == 4096 => n,
        _ => pmtu,
    }
}

/// One throughput row: `test`'s goodput as a share of the link, the most it could be
/// at this MTU, and the link's utilization on the data's side while it was measured.
fn throughput_row(b: &Bench<'_>, test: &str, secs: f64, mtu: u64) -> Result<(), String> {
    let rate = b.link.shape().rate as f64 / 1e9;
    // The side the data leaves from: READ responses come from B.
    let side = if test == "read" { End::B } else { End::A };
    let before = shaper(b.link);
    let q0 = b.link.qdisc(side).map_err(|e| err("tc", e))?;
    let mut flow = if test == "tcp" {
        b.tcp(5201, secs)?
    } else {
        b.softhca(test, 0, secs)?
    };
    let wire = flow
        .start()
        .and_then(|s| wire_share(b.link, side, q0.bytes, s, secs));
    let o = flow.finish()?;
    let after = shaper(b.link);
    let q1 = b.link.qdisc(side).map_err(|e| err("tc", e))?;
    let (sent, dropped) = (after.0 - before.0, after.1 - before.1);
    let name = if test == "tcp" {
        "TCP (iperf3)".to_string()
    } else {
        format!("softhca {} 64 KiB", test.to_uppercase())
    };
    let ceiling = wire::goodput_ceiling(test, mtu, packet_size(o.pmtu, mtu), MSG);
    let frame = (q1.bytes - q0.bytes) / (q1.sent - q0.sent).max(1);
    println!(
        "| {} | {name} | {:.3} | {:.3} | {ceiling:.3} | {} | {frame} | {:.3} % |",
        b.link.shape().label(),
        o.gbps,
        o.gbps / rate,
        wire.map_or("-".to_string(), |w| format!("{w:.3}")),
        100.0 * dropped as f64 / (sent + dropped).max(1) as f64
    );
    if b.show_intervals {
        let rates: Vec<String> = o
            .intervals
            .iter()
            .map(|(_, _, g)| format!("{:.2}", g / rate))
            .collect();
        let (per, whose) = if test == "tcp" {
            (b.interval.max(0.1), " (receiver)")
        } else {
            (b.interval, "")
        };
        let first = o.intervals.first().map_or(0.0, |i| i.1 - o.intervals[0].0);
        println!(
            "|   | × link per {per} s{whose}, the first {first:.3} s: {} | | | | | |",
            rates.join(" ")
        );
    }
    Ok(())
}

/// The throughput rows of one link.
fn throughput_rows(b: &Bench<'_>, secs: f64) -> Result<(), String> {
    let mtu = b.link.mtu(End::A).map_err(|e| err("link MTU", e))?;
    for test in ["send", "write", "read", "tcp"] {
        throughput_row(b, test, secs, mtu)?;
    }
    Ok(())
}

/// Two flows started `delay` apart, the first for `secs`: each one's share of the link
/// over the time both ran (from 1 s after the second started), and when the second
/// first reached 0.4 of the link.
fn fairness_row(
    b: &Bench<'_>,
    label: &str,
    second_tcp: bool,
    secs: f64,
    delay: f64,
) -> Result<(), String> {
    let rate = b.link.shape().rate as f64 / 1e9;
    let before = shaper(b.link);
    let f1 = b.softhca("write", 0, secs)?;
    std::thread::sleep(Duration::from_secs_f64(delay));
    let rest = secs - delay;
    let f2 = if second_tcp {
        b.tcp(5201, rest)?
    } else {
        b.softhca("write", 1, rest)?
    };
    let (o1, o2) = (f1.finish()?, f2.finish()?);
    let after = shaper(b.link);
    let start2 = o2.intervals.first().map_or(0.0, |i| i.0);
    let end = o1
        .intervals
        .last()
        .map_or(0.0, |i| i.1)
        .min(o2.intervals.last().map_or(0.0, |i| i.1));
    let (r1, r2) = (
        rate_over(&o1, start2 + 1.0, end),
        rate_over(&o2, start2 + 1.0, end),
    );
    let jain = (r1 + r2).powi(2) / (2.0 * (r1 * r1 + r2 * r2)).max(1e-12);
    let reached = o2
        .intervals
        .iter()
        .find(|i| i.2 >= 0.4 * rate)
        .map_or("never".to_string(), |i| format!("{:.1} s", i.1 - start2));
    let (sent, dropped) = (after.0 - before.0, after.1 - before.1);
    println!(
        "| {} | {label} | {:.3} + {:.3} | {:.2} / {:.2} (Jain {:.3}) | {:.3} % | second flow at 0.4× after {reached} |",
        b.link.shape().label(),
        r1,
        r2,
        r1 / rate,
        r2 / rate,
        jain,
        100.0 * dropped as f64 / (sent + dropped).max(1) as f64
    );
    Ok(())
}

/// The binary `softhca` next to this one.
pub fn default_softhca() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("softhca")))
        .unwrap_or_else(|| PathBuf::from("softhca"))
}

/// Link `i` of the run: `<name><i>`, or unique per process.
fn link_up(a: &TableArgs, i: usize, shape: Shape) -> Result<ShapedLink, String> {
    match &a.name {
        Some(n) => ShapedLink::up_named(shape, &format!("{n}{i}")),
        None => ShapedLink::up(shape),
    }
    .map_err(|e| err("shaped link", e))
}

/// Runs the table (the rows asked for).
pub fn run(a: TableArgs) -> Result<(), String> {
    let want = |r: Rows| a.rows.is_empty() || a.rows.contains(&r);
    let softhca = a.softhca.clone().unwrap_or_else(default_softhca);
    if Command::new("iperf3").arg("-v").output().is_err() {
        return Err("iperf3 is missing (apt-get install iperf3)".into());
    }
    let t0 = Instant::now();
    let cc = if a.no_cc { "0" } else { "1" };
    let ms = Duration::from_millis;
    let shapes = [
        (Rows::Gbit, 1_000_000_000, ms(0)),
        (Rows::Mbit100, 100_000_000, ms(0)),
        (Rows::GbitDelay, 1_000_000_000, ms(5)),
    ];
    println!("goodput: what the application moved (softhca: completed, TCP: received); ceiling: the most goodput there can be in the frames the link carries, at its MTU; on the wire: the bytes tbf sent on the data's side while the flow measured (whole Ethernet frames), over the rate.");
    println!();
    println!("| link (tbf both ends, burst 256 KiB, latency 5 ms) | test | goodput Gb/s | × link | goodput ceiling × link | on the wire × link | mean frame bytes | shaper drops |");
    println!("|---|---|---|---|---|---|---|---|");
    for (i, (rows, rate, delay)) in shapes.into_iter().enumerate() {
        if !want(rows) {
            continue;
        }
        let link = link_up(&a, i, Shape { rate, delay })?;
        let b = Bench {
            link: &link,
            softhca: &softhca,
            t0,
            cc,
            interval: a.intervals.unwrap_or(0.5),
            show_intervals: a.intervals.is_some(),
        };
        throughput_rows(&b, a.seconds)?;
    }
    if !want(Rows::Fair) {
        return Ok(());
    }
    println!();
    println!(
        "| link | flows (WRITE 64 KiB) | Gb/s | share of the link | shaper drops | convergence |"
    );
    println!("|---|---|---|---|---|---|");
    let shape = Shape {
        rate: 1_000_000_000,
        delay: ms(0),
    };
    let link = link_up(&a, shapes.len(), shape)?;
    for (end, last) in [(End::A, 11), (End::B, 12)] {
        link.add_addr(end, std::net::Ipv4Addr::new(10, 99, 0, last))
            .map_err(|e| err("second address", e))?;
    }
    let b = Bench {
        link: &link,
        softhca: &softhca,
        t0,
        cc,
        // The convergence column reads half-second intervals.
        interval: 0.5,
        show_intervals: false,
    };
    let s = a.fair_seconds;
    fairness_row(&b, "two softhca flows", false, s, 0.0)?;
    fairness_row(&b, "softhca + TCP", true, s, 0.0)?;
    fairness_row(
        &b,
        "softhca, then a softhca late starter",
        false,
        s,
        s / 3.0,
    )?;
    Ok(())
}
