//! `softhca bench`: one command that measures softhca on loopback and, in the same run,
//! the baselines it should be judged against (TCP stream, TCP and UDP ping-pong, raw UDP
//! with GSO+GRO), and prints a table, a JSON document and an SVG plot.
//!
//! Every measurement runs between two child processes of this executable: `softhca perf`
//! server and client for softhca, `softhca bench-peer` for the baselines. Each child is
//! reaped with `wait4(2)`, whose rusage is the child's own CPU time, so CPU cost is
//! measured the same way for softhca and for the baselines (whole process, set-up
//! included).

mod middleware;
mod output;
pub mod peer;
mod qp_memory;

use std::io::{IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::args::BenchArgs;
use crate::error::CliError;
use crate::local::{free_device_pair, free_tcp_port, last_json, Finished, Pipe, Proc};
use output::Row;

/// Seconds per measurement by default: 33 points (36 with the drop-in perftest rows) ×
/// (2 s + ~0.3 s set-up) ≈ 80 s.
const DEFAULT_DURATION: f64 = 2.0;
/// Seconds per measurement with `--quick`.
const QUICK_DURATION: f64 = 0.3;
/// Datagram size of the raw UDP measurement: a full RoCE packet at PMTU 4096.
const BLAST_SEGMENT: u64 = 4096;
/// Outstanding SENDs of the message-rate test.
const RATE_TX_DEPTH: u32 = 512;
/// How long a child may take to start listening.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Set-up and tear-down time a measurement may take beyond its duration.
const SLACK: Duration = Duration::from_secs(40);

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Point {
    /// softhca bandwidth.
    Bw {
        op: &'static str,
        size: u64,
        qps: u32,
    },
    /// softhca WRITE bandwidth over `qps` QPs that all use one buffer
    /// (`--shared-buffer`): the many-QP row without its memory footprint.
    BwShared { size: u64, qps: u32 },
    /// softhca ping-pong latency.
    Lat { op: &'static str, size: u64 },
    /// softhca small-message rate (64 B SEND, many outstanding).
    Rate,
    /// An 8 B SEND ping-pong whose server times its turnarounds (`SOFTHCA_STATS`): where
    /// a softhca half round trip's time goes. Apart from the latency rows, whose figures
    /// the timer's clock reads would touch.
    Turnaround,
    /// TCP bulk throughput.
    TcpStream { size: u64 },
    /// TCP echo latency.
    TcpPingpong { size: u64 },
    /// UDP echo latency.
    UdpPingpong { size: u64 },
    /// UDP echo latency through softhca's socket setup, no protocol: the kernel's share
    /// of a softhca ping-pong.
    UdpPingpongRoce { size: u64 },
    /// Raw UDP GSO+GRO throughput; with `icrc`, every datagram sealed with a RoCEv2
    /// ICRC by the sender and checked by the receiver (the RoCEv2 ceiling).
    UdpBlast { icrc: bool },
    /// An unmodified perftest bandwidth test (`prog`) through the drop-in libibverbs.
    Perftest {
        prog: &'static str,
        op: &'static str,
        size: u64,
    },
    /// An unmodified perftest latency test (`prog`) through the drop-in libibverbs.
    PerftestLat {
        prog: &'static str,
        op: &'static str,
        size: u64,
    },
}

impl Point {
    fn label(&self) -> String {
        let sz = output::size_str;
        match *self {
            Point::Bw { op, size, qps } => format!("softhca {op} bw {} x{qps} QP", sz(size)),
            Point::BwShared { size, qps } => {
                format!("softhca write bw {} x{qps} QP, one buffer", sz(size))
            }
            Point::Lat { op, size } => format!("softhca {op} lat {}", sz(size)),
            Point::Rate => "softhca send msg rate 64 B".into(),
            Point::Turnaround => "softhca send turnaround 8 B".into(),
            Point::TcpStream { size } => format!("tcp stream {}", sz(size)),
            Point::TcpPingpong { size } => format!("tcp ping-pong {}", sz(size)),
            Point::UdpPingpong { size } => format!("udp ping-pong {}", sz(size)),
            Point::UdpPingpongRoce { size } => {
                format!("udp ping-pong, softhca's sockets {}", sz(size))
            }
            Point::UdpBlast { icrc: false } => format!("raw udp gso+gro {}", sz(BLAST_SEGMENT)),
            Point::UdpBlast { icrc: true } => format!("raw udp + icrc {}", sz(BLAST_SEGMENT)),
            Point::Perftest { prog, size, .. } | Point::PerftestLat { prog, size, .. } => {
                format!("{prog} {} (drop-in)", sz(size))
            }
        }
    }
}

/// The measurements of a run, in the order the table shows them (`measure_key` orders
/// the measuring).
fn plan(quick: bool) -> Vec<Point> {
    let mut v = Vec::new();
    if quick {
        v.push(Point::TcpStream { size: 65536 });
        v.push(Point::UdpBlast { icrc: false });
        v.push(Point::UdpBlast { icrc: true });
        v.push(Point::TcpPingpong { size: 8 });
        v.push(Point::UdpPingpong { size: 8 });
        v.push(Point::UdpPingpongRoce { size: 8 });
        v.push(Point::Bw {
            op: "send",
            size: 65536,
            qps: 1,
        });
        v.push(Point::Bw {
            op: "write",
            size: 65536,
            qps: 2,
        });
        v.push(Point::Bw {
            op: "read",
            size: 65536,
            qps: 1,
        });
        v.push(Point::Lat {
            op: "send",
            size: 8,
        });
        v.push(Point::Lat {
            op: "write",
            size: 8,
        });
        v.push(Point::Rate);
        v.push(Point::Turnaround);
        return v;
    }
    let sizes = [4096, 65536, 1 << 20];
    for size in sizes {
        v.push(Point::TcpStream { size });
    }
    v.push(Point::UdpBlast { icrc: false });
    v.push(Point::UdpBlast { icrc: true });
    for size in [8, 4096] {
        v.push(Point::TcpPingpong { size });
        v.push(Point::UdpPingpong { size });
    }
    v.push(Point::UdpPingpongRoce { size: 8 });
    for op in ["send", "write", "read"] {
        for qps in [1, 2] {
            for size in sizes {
                v.push(Point::Bw { op, size, qps });
            }
        }
    }
    // Many connections on one device: aggregate against the 1-QP row.
    v.push(Point::Bw {
        op: "write",
        size: 65536,
        qps: qp_memory::IDLE_QPS,
    });
    // The same with one buffer for all QPs: what is left is the cost of the QPs.
    v.push(Point::BwShared {
        size: 65536,
        qps: qp_memory::IDLE_QPS,
    });
    for op in ["send", "write"] {
        for size in [8, 4096] {
            v.push(Point::Lat { op, size });
        }
    }
    v.push(Point::Rate);
    v.push(Point::Turnaround);
    v
}

/// Where point `p` (at `index` in the plan) is measured: the latency rows with the
/// ping-pongs they are compared with, size by size, then the turnaround and the message
/// rate, then the bandwidth rows size by size, each size after its TCP stream (and
/// 64 KiB after the raw UDP stream too).
///
/// Why: the VM's speed drifts within a run (up to 2× over a minute), and a ratio of two
/// rows measured 50 s apart measured that drift as much as softhca. So the rows a
/// target compares are measured next to each other: softhca's 8 B latency just after
/// the UDP ping-pong; SEND 64 KiB just after the TCP and raw UDP streams; WRITE 64 KiB
/// on 1 QP between the 1024-QP WRITEs and the READ it is compared with; each drop-in
/// perftest row just after softhca's own figure for it. The table keeps the plan's
/// order.
fn measure_key(p: &Point, index: usize) -> (u8, u64, u8, usize) {
    let bw_slot = |op: &str, qps: u32| match (op, qps) {
        ("send", 1) => 2,
        ("send", 2) => 4,
        ("write", 1) => 6,
        ("read", 1) => 7,
        ("write", 2) => 9,
        ("read", 2) => 10,
        ("write", _) => 5, // many QPs: just before the 1-QP WRITE
        _ => 11,
    };
    match *p {
        Point::TcpPingpong { size } => (0, size, 0, index),
        Point::UdpPingpong { size } => (0, size, 1, index),
        Point::UdpPingpongRoce { size } => (0, size, 2, index),
        Point::Lat { op, size } => (0, size, if op == "send" { 3 } else { 4 }, index),
        Point::PerftestLat { size, .. } => (0, size, 5, index),
        Point::Turnaround => (1, 0, 0, index),
        Point::Rate => (2, 0, 0, index),
        Point::TcpStream { size } => (3, size, 0, index),
        Point::UdpBlast { .. } => (3, 65536, 1, index),
        Point::Bw { op, size, qps } => (3, size, bw_slot(op, qps), index),
        // After the per-QP-buffer row (plan order), just before the 1-QP WRITE.
        Point::BwShared { size, .. } => (3, size, 5, index),
        Point::Perftest { op, size, .. } => (3, size, if op == "send" { 3 } else { 8 }, index),
    }
}

/// Entry point of `softhca bench`.
pub fn run(a: &BenchArgs) -> Result<(), CliError> {
    let duration = duration_of(a)?;
    // Fail on an unwritable output file now, not after two minutes of measuring.
    for p in [&a.json, &a.plot].into_iter().flatten() {
        check_writable(p)?;
    }
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Usage(format!("cannot find the softhca executable: {e}")))?;
    if a.middleware {
        return middleware::run(a, &exe, duration);
    }
    let (server_ip, client_ip) = free_device_pair()?;
    let mut points = plan(a.quick);
    let mut notes = Vec::new();
    let dropin = if a.quick {
        None
    } else {
        dropin_dir(&exe, &mut notes)
    };
    if dropin.is_some() {
        points.extend(dropin_points());
    }
    let started = Instant::now();
    let host = softhca_perf::host::measure(HOST_BUDGET);
    notes.push(host_note(&host));
    let ctx = Runner {
        exe: &exe,
        dropin: dropin.as_deref(),
        duration,
        server_ip,
        client_ip,
    };
    let (mut rows, mut failures) = ctx.measure_all(&points, started);
    // Memory of idle connections, measured in this process on the server's address
    // (free again: its measurements are over).
    let idle_qp_bytes = match qp_memory::measure(server_ip) {
        Ok(b) => {
            notes.push(format!(
                "idle connected RC QP: {:.1} KiB each (resident growth for {} QPs in RTS with \
                 1-entry rings)",
                b / 1024.0,
                qp_memory::IDLE_QPS
            ));
            Some(b)
        }
        Err(e) => {
            failures.push(format!("idle QP memory: {e}"));
            None
        }
    };
    notes.extend(comparison_notes(&rows));
    output::add_ratios(&mut rows);
    notes.extend(setting_notes(&rows));
    notes.extend(READING_NOTES.iter().map(|n| n.to_string()));
    let report = output::Report {
        duration_per_point: duration,
        quick: a.quick,
        total_seconds: started.elapsed().as_secs_f64(),
        server_addr: server_ip.to_string(),
        client_addr: client_ip.to_string(),
        idle_qp_bytes,
        host,
        rows,
        notes,
        failures,
    };
    write_report(a, &report)?;
    if !report.failures.is_empty() {
        return Err(CliError::Usage(format!(
            "{} of {} measurements failed (listed above)",
            report.failures.len(),
            points.len()
        )));
    }
    Ok(())
}

/// Time spent measuring the host's own costs before the table's measurements.
const HOST_BUDGET: Duration = Duration::from_millis(200);

/// What the host's system call and ICRC cost: the latency rows move with the first, the
/// bandwidth rows' distance from raw UDP with the second.
fn host_note(h: &softhca_perf::host::HostCosts) -> String {
    format!(
        "this host: {}; a system call (getppid) {:.2} us, the ICRC over 64K {:.1} GB/s on one \
         core (the latency rows move with the first, as every send and receive pays it; the \
         bandwidth rows' distance from raw UDP with the second, as each side computes it \
         over every byte)",
        h.cpu.as_deref().unwrap_or("CPU model unknown"),
        h.syscall_us,
        h.icrc_gbps
    )
}

/// The seconds per point: `--duration`, or the quick or full default.
fn duration_of(a: &BenchArgs) -> Result<f64, CliError> {
    Ok(match a.duration {
        Some(d) if !(d > 0.0 && d <= 3600.0) => {
            return Err(CliError::Usage(format!(
                "invalid duration {d} (seconds, above 0)"
            )))
        }
        Some(d) => d,
        None if a.quick => QUICK_DURATION,
        None => DEFAULT_DURATION,
    })
}

/// What the rows say when set side by side: many QPs against one, softhca against TCP's
/// best stream, perftest through the drop-in library against softhca's own figure, and
/// where the server's time goes in a round trip.
fn comparison_notes(rows: &[Row]) -> Vec<String> {
    let mut notes = Vec::new();
    if let (Some(one), Some(many)) = (
        gbps_of(rows, "write", 65536, 1),
        gbps_of(rows, "write", 65536, qp_memory::IDLE_QPS),
    ) {
        notes.push(format!(
            "WRITE 64K over {} QPs: {:.2}x the 1-QP figure (each QP has its own buffer, so \
             the many-QP run works through {} MiB of buffers, beyond the CPU's nearest \
             caches, where the 1-QP run's stay in them)",
            qp_memory::IDLE_QPS,
            many / one,
            (u64::from(qp_memory::IDLE_QPS) * 2 * 65536) >> 20
        ));
    }
    if let (Some(one), Some(shared)) = (
        gbps_of(rows, "write", 65536, 1),
        rows.iter()
            .find(|r| r.kind == "softhca_bw_shared")
            .and_then(|r| r.gbps),
    ) {
        notes.push(format!(
            "WRITE 64K over {} QPs sharing one buffer: {:.2}x the 1-QP figure (the cost of the \
             QPs themselves, without the memory the per-QP buffers stream through)",
            qp_memory::IDLE_QPS,
            shared / one
        ));
    }
    if let Some(note) = roce_ceiling_note(rows) {
        notes.push(note);
    }
    // The /TCP column compares equal message sizes; TCP on loopback can be far from its
    // best at some sizes (64 KiB writes: 14 Gb/s against 59 at 1 MiB with iperf3 on
    // the 6.18 VM), so say what softhca's 64 KiB figures are against TCP's best.
    if let Some(best) = rows
        .iter()
        .filter(|r| r.kind == "tcp_stream")
        .filter_map(|r| Some((r.gbps?, r.size)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
    {
        let against = ["send", "write"]
            .iter()
            .filter_map(|op| {
                Some(format!(
                    "{op} {:.2}x",
                    gbps_of(rows, op, 65536, 1)? / best.0
                ))
            })
            .collect::<Vec<_>>();
        if !against.is_empty() {
            notes.push(format!(
                "TCP's best stream in this run: {:.2} Gb/s with {} writes; softhca 64K (1 QP) \
                 against it: {} (the /TCP column compares the same message size)",
                best.0,
                output::size_str(best.1),
                against.join(", ")
            ));
        }
    }
    notes.extend(perftest_notes(rows));
    if let Some(t) = rows.iter().find_map(|r| r.turnaround_p50_us) {
        notes.push(format!(
            "softhca turnaround (8 B SEND, the server, p50): receive->taken {:.2} us (engine, \
             CQ), taken->post {:.2} us (application), post->send {:.2} us (build, seal): \
             {:.2} us of softhca's own per half round trip; the rest is the kernel's, as in \
             the UDP ping-pong (sendmmsg alone {:.2} us: on loopback it runs the receiver's \
             IP/UDP path too)",
            t.receive_to_taken,
            t.taken_to_post,
            t.post_to_send,
            t.user_space(),
            t.send
        ));
    }
    notes
}

/// Each drop-in perftest row against softhca's own figure for it.
fn perftest_notes(rows: &[Row]) -> Vec<String> {
    let mut notes = Vec::new();
    for r in rows.iter().filter(|r| r.kind == "perftest_bw") {
        if let (Some(theirs), Some(ours)) = (r.gbps, gbps_of(rows, r.op, r.size, 1)) {
            notes.push(format!(
                "unmodified perftest through the drop-in libibverbs: {} {} at {:.2}x softhca \
                 perf's own {} {} figure (perftest posts one WR per call)",
                r.op,
                output::size_str(r.size),
                theirs / ours,
                r.op,
                output::size_str(r.size)
            ));
        }
    }
    for r in rows.iter().filter(|r| r.kind == "perftest_lat") {
        let ours = rows
            .iter()
            .find(|o| o.kind == "softhca_lat" && o.op == r.op && o.size == r.size)
            .and_then(|o| o.lat_us_p50);
        if let (Some(theirs), Some(ours)) = (r.lat_us_p50, ours) {
            notes.push(format!(
                "unmodified {} through the drop-in libibverbs: p50 {theirs:.2} us, {:.2}x \
                 softhca perf's own {} {} latency (it spins on its buffer for the peer's \
                 WRITE, where softhca perf polls a CQ)",
                PERFTEST_LAT.0,
                theirs / ours,
                r.op,
                output::size_str(r.size)
            ));
        }
    }
    notes
}

/// softhca's 64 KiB figures against the RoCEv2 ceiling: raw UDP that seals and checks an
/// ICRC on every datagram, the per-byte work no RoCEv2 stack over UDP sockets avoids
/// (kernel rxe computes it in software too).
fn roce_ceiling_note(rows: &[Row]) -> Option<String> {
    let c = rows.iter().find(|r| r.kind == "udp_blast_icrc")?;
    let raw = rows
        .iter()
        .find(|r| r.kind == "udp_blast")
        .and_then(|r| r.gbps);
    let ceiling = c.gbps?;
    let against = ["send", "write", "read"]
        .iter()
        .filter_map(|op| {
            Some(format!(
                "{op} {:.2}x",
                gbps_of(rows, op, 65536, 1)? / ceiling
            ))
        })
        .collect::<Vec<_>>();
    let failed = match c.icrc_failures {
        Some(0) | None => String::new(),
        Some(n) => format!("; {n} datagrams FAILED their ICRC"),
    };
    Some(format!(
        "RoCEv2 ceiling: raw UDP with a software ICRC sealed by the sender and checked by \
         the receiver on every datagram moved {ceiling:.2} Gb/s ({}){failed}; softhca 64K \
         (1 QP) against it: {}",
        raw.map_or("no raw UDP row".into(), |r| format!(
            "{:.2}x raw UDP",
            ceiling / r
        )),
        if against.is_empty() {
            "no 64K row".into()
        } else {
            against.join(", ")
        }
    ))
}

/// How the softhca devices ran (offloads, polling) and the raw UDP row's caveat.
fn setting_notes(rows: &[Row]) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(r) = rows.iter().find(|r| r.kind.starts_with("softhca")) {
        let on = |v: Option<bool>| match v {
            Some(true) => "on",
            Some(false) => "OFF (refused by the kernel or disabled: slower fallback)",
            None => "unknown",
        };
        notes.push(format!(
            "softhca devices: GSO {}, GRO {}, polling {} (SOFTHCA_POLL)",
            on(r.gso),
            on(r.gro),
            r.poll.as_deref().unwrap_or("unknown")
        ));
    }
    if let Some(b) = rows.iter().find(|r| r.kind == "udp_blast") {
        if let Some(n) = &b.note {
            notes.push(n.clone());
        }
    }
    notes
}

/// How to read the table.
const READING_NOTES: [&str; 3] = [
    "latency = half the round trip (perftest's convention); /TCP and /rawUDP: Gb/s ratio \
     for bandwidth rows, p50 ratio against TCP / UDP ping-pong for latency rows",
    "TCP / UDP ping-pong spin 50 us on an empty socket before sleeping, like softhca's \
     default adaptive polling",
    "CPU s/GB: user+system CPU of the whole sending / receiving process (set-up included) \
     per GB of payload moved; for READ the server sends",
];

/// The table on stdout, and the JSON and SVG files asked for.
fn write_report(a: &BenchArgs, report: &output::Report) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    output::print_table(&mut out, report)?;
    out.flush()?;
    if let Some(p) = &a.json {
        let text = serde_json::to_string_pretty(report)
            .map_err(|e| CliError::Usage(format!("cannot encode JSON: {e}")))?;
        write_file(p, text.as_bytes())?;
    }
    if let Some(p) = &a.plot {
        write_file(p, output::svg(report).as_bytes())?;
    }
    Ok(())
}

/// The perftest bandwidth tests run through the drop-in library, and the op each matches.
const PERFTEST_BW: [(&str, &str); 2] = [("ib_send_bw", "send"), ("ib_write_bw", "write")];
/// The perftest latency test run through the drop-in library: `ib_write_lat`, which
/// spins on the last byte of its buffer (where the peer's WRITE lands) instead of
/// polling a CQ for it, the case a user-space device has to notice by itself.
const PERFTEST_LAT: (&str, &str) = ("ib_write_lat", "write");
/// Iterations of the drop-in latency test per second of `--duration` (perftest's
/// latency tests count iterations; about half a second per second on a 2-core VM).
const PERFTEST_LAT_ITERS_PER_S: f64 = 20_000.0;

/// The drop-in perftest points: 64 KiB SEND and WRITE bandwidth, 8 B WRITE latency.
fn dropin_points() -> Vec<Point> {
    let mut v: Vec<Point> = PERFTEST_BW
        .iter()
        .map(|&(prog, op)| Point::Perftest {
            prog,
            op,
            size: 65536,
        })
        .collect();
    v.push(Point::PerftestLat {
        prog: PERFTEST_LAT.0,
        op: PERFTEST_LAT.1,
        size: 8,
    });
    v
}

/// The directory of the drop-in `libibverbs.so.1` (built next to this executable by
/// `cargo build --release`), when it and perftest are there; otherwise a note says why
/// the perftest rows are left out.
fn dropin_dir(exe: &Path, notes: &mut Vec<String>) -> Option<std::path::PathBuf> {
    let dir = exe.parent()?.to_path_buf();
    if !dir.join("libibverbs.so.1").exists() {
        notes.push(
            "drop-in perftest rows left out: no libibverbs.so.1 next to softhca (cargo build \
             --release -p softhca-ibverbs)"
                .into(),
        );
        return None;
    }
    let on_path = |prog: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
    };
    if let Some((prog, _)) = PERFTEST_BW
        .iter()
        .chain([&PERFTEST_LAT])
        .find(|(prog, _)| !on_path(prog))
    {
        notes.push(format!(
            "drop-in perftest rows left out: {prog} not installed (apt-get install perftest)"
        ));
        return None;
    }
    Some(dir)
}

/// Waits until something listens on TCP `port` (perftest's server says so only on a
/// block-buffered stdout): a LISTEN line in /proc/net/tcp or tcp6.
fn wait_listening(port: u16, timeout: Duration) -> Result<(), CliError> {
    let want = format!(":{port:04X} ");
    let end = Instant::now() + timeout;
    loop {
        let listening = ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f).is_ok_and(|t| {
                t.lines().any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.get(1)
                        .is_some_and(|a| format!("{a} ").ends_with(&want))
                        && cols.get(3) == Some(&"0A")
                })
            })
        });
        if listening {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(CliError::peer(format!(
                "perftest server not listening on TCP port {port} after {} s",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Iterations and average Gb/s from a perftest bandwidth test's output (run with
/// `--report_gbits`): the line after the header "#bytes #iterations BW peak[Gb/sec] BW
/// average[Gb/sec] MsgRate[Mpps]".
fn perftest_bw_result(lines: &[String]) -> Option<(u64, f64)> {
    let line = lines.iter().skip_while(|l| !l.contains("#bytes")).nth(1)?;
    let cols: Vec<&str> = line.split_whitespace().collect();
    let iters = cols.get(1)?.parse().ok()?;
    let gbps = cols.get(3)?.parse().ok()?;
    Some((iters, gbps))
}

/// Iterations, p50 and p99 half round trip in µs from a perftest latency test's output:
/// the line after the header "#bytes #iterations t_min[usec] t_max[usec] t_typical[usec]
/// t_avg[usec] t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec]" (t_typical is
/// the median).
fn perftest_lat_result(lines: &[String]) -> Option<(u64, f64, f64)> {
    let line = lines.iter().skip_while(|l| !l.contains("#bytes")).nth(1)?;
    let cols: Vec<&str> = line.split_whitespace().collect();
    let iters = cols.get(1)?.parse().ok()?;
    let p50 = cols.get(4)?.parse().ok()?;
    let p99 = cols.get(7)?.parse().ok()?;
    Some((iters, p50, p99))
}

/// Gb/s of the softhca bandwidth row for `op`, `size`, `qps`.
fn gbps_of(rows: &[Row], op: &str, size: u64, qps: u32) -> Option<f64> {
    rows.iter()
        .find(|r| r.kind == "softhca_bw" && r.op == op && r.size == size && r.qps == qps)
        .and_then(|r| r.gbps)
}

fn check_writable(p: &Path) -> Result<(), CliError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map(|_| ())
        .map_err(|e| {
            CliError::Usage(format!(
                "cannot write {}: {}",
                p.display(),
                crate::error::io_msg(&e)
            ))
        })
}

fn write_file(p: &Path, bytes: &[u8]) -> Result<(), CliError> {
    std::fs::write(p, bytes).map_err(|e| {
        CliError::Usage(format!(
            "cannot write {}: {}",
            p.display(),
            crate::error::io_msg(&e)
        ))
    })
}

/// What every measurement needs.
struct Runner<'a> {
    exe: &'a Path,
    /// Where the drop-in libibverbs is (perftest rows).
    dropin: Option<&'a Path>,
    duration: f64,
    server_ip: IpAddr,
    client_ip: IpAddr,
}

fn num(v: &serde_json::Value, k: &str) -> f64 {
    v.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0)
}

impl Runner<'_> {
    /// Every point, in an order that puts the rows a target compares next to each other;
    /// the rows come back in the plan's order.
    fn measure_all(&self, points: &[Point], started: Instant) -> (Vec<Row>, Vec<String>) {
        let progress = ProgressLine::start(points.len());
        let mut rows: Vec<(usize, Row)> = Vec::new();
        let mut failures: Vec<String> = Vec::new();
        let mut order: Vec<usize> = (0..points.len()).collect();
        order.sort_by_key(|&i| measure_key(&points[i], i));
        for (k, &i) in order.iter().enumerate() {
            let p = &points[i];
            progress.set(k, &p.label(), started);
            match self.measure(p) {
                Ok(r) => rows.push((i, r)),
                Err(e) => failures.push(format!("{}: {e}", p.label())),
            }
        }
        progress.stop();
        rows.sort_by_key(|(i, _)| *i);
        (rows.into_iter().map(|(_, r)| r).collect(), failures)
    }

    fn measure(&self, p: &Point) -> Result<Row, CliError> {
        match *p {
            Point::Bw { op, size, qps } => self.softhca(op, size, qps, false, None, false),
            Point::BwShared { size, qps } => self.softhca("write", size, qps, false, None, true),
            Point::Lat { op, size } => self.softhca(op, size, 1, true, None, false),
            Point::Rate => self.softhca("send", 64, 1, false, Some(RATE_TX_DEPTH), false),
            Point::Turnaround => self.turnaround(),
            Point::TcpStream { size } => self.peer("tcp-stream", size),
            Point::TcpPingpong { size } => self.peer("tcp-pingpong", size),
            Point::UdpPingpong { size } => self.peer("udp-pingpong", size),
            Point::UdpPingpongRoce { size } => self.peer("udp-pingpong-roce", size),
            Point::UdpBlast { icrc: false } => self.peer("udp-blast", BLAST_SEGMENT),
            Point::UdpBlast { icrc: true } => self.peer("udp-blast-icrc", BLAST_SEGMENT),
            Point::Perftest { prog, op, size } => self.perftest(prog, op, size),
            Point::PerftestLat { prog, op, size } => self.perftest_lat(prog, op, size),
        }
    }

    /// An unmodified perftest bandwidth test, server and client, through the drop-in
    /// library (`LD_LIBRARY_PATH`), on the same device addresses as `softhca perf`.
    fn perftest(&self, prog: &str, op: &'static str, size: u64) -> Result<Row, CliError> {
        // perftest takes whole seconds.
        let secs = self.duration.ceil().max(1.0).to_string();
        let (cf, sf) = self.perftest_pair(prog, &["-D", &secs, "--report_gbits"], size)?;
        let (iters, gbps) = perftest_bw_result(&cf.out)
            .ok_or_else(|| CliError::peer(format!("{prog}: no result line in its output")))?;
        let bytes = iters * size;
        let seconds = if gbps > 0.0 {
            bytes as f64 * 8.0 / (gbps * 1e9)
        } else {
            0.0
        };
        let mut r = Row::new(
            "perftest_bw",
            op,
            size,
            1,
            seconds,
            iters,
            bytes,
            cf.cpu,
            sf.cpu,
        );
        r.set_throughput();
        r.gbps = Some(gbps);
        Ok(r)
    }

    /// An unmodified perftest latency test through the drop-in library, for about
    /// `self.duration` seconds (a count of iterations: perftest's latency tests report
    /// their percentiles only then).
    fn perftest_lat(&self, prog: &str, op: &'static str, size: u64) -> Result<Row, CliError> {
        let iters = ((self.duration * PERFTEST_LAT_ITERS_PER_S) as u64).max(1000);
        let n = iters.to_string();
        let t = Instant::now();
        let (cf, sf) = self.perftest_pair(prog, &["-n", &n], size)?;
        // With set-up: perftest prints no run time for a latency test.
        let seconds = t.elapsed().as_secs_f64();
        let (iters, p50, p99) = perftest_lat_result(&cf.out)
            .ok_or_else(|| CliError::peer(format!("{prog}: no result line in its output")))?;
        let mut r = Row::new(
            "perftest_lat",
            op,
            size,
            1,
            seconds,
            iters,
            iters * size * 2,
            cf.cpu,
            sf.cpu,
        );
        r.lat_us_p50 = Some(p50);
        r.lat_us_p99 = Some(p99);
        Ok(r)
    }

    /// An unmodified perftest program's server and client through the drop-in library,
    /// on the same device addresses as `softhca perf`, with `args` and message `size`.
    fn perftest_pair(
        &self,
        prog: &str,
        args: &[&str],
        size: u64,
    ) -> Result<(Finished, Finished), CliError> {
        let dir = self
            .dropin
            .ok_or_else(|| CliError::peer("no drop-in library".into()))?;
        let port = free_tcp_port()?;
        let cmd = |ip: IpAddr| {
            let mut c = Command::new(prog);
            c.args(["-x", "0", "-s", &size.to_string(), "-p", &port.to_string()])
                .args(args)
                .env("LD_LIBRARY_PATH", dir)
                .env("SOFTHCA_ADDR", ip.to_string());
            c
        };
        let server = Proc::spawn(format!("{prog} server"), cmd(self.server_ip))?;
        wait_listening(port, READY_TIMEOUT)?;
        let mut cc = cmd(self.client_ip);
        cc.arg(self.server_ip.to_string());
        let client = Proc::spawn(format!("{prog} client"), cc)?;
        let cf = client.finish(self.deadline())?;
        let sf = server.finish(Instant::now() + SLACK)?;
        Ok((cf, sf))
    }

    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs_f64(self.duration) + SLACK
    }

    /// `softhca perf` server and client.
    fn softhca(
        &self,
        op: &'static str,
        size: u64,
        qps: u32,
        lat: bool,
        tx_depth: Option<u32>,
        shared_buffer: bool,
    ) -> Result<Row, CliError> {
        let mut args = vec![
            "-s".to_string(),
            size.to_string(),
            "-q".into(),
            qps.to_string(),
        ];
        if lat {
            args.push("--lat".into());
        }
        if let Some(t) = tx_depth {
            args.extend(["-t".into(), t.to_string()]);
        }
        if shared_buffer {
            args.push("--shared-buffer".into());
        }
        let (cf, sf) = self.perf_pair(op, &args, false)?;
        let j = last_json(&cf, "softhca perf client")?;
        let iters = num(&j, "iters") as u64;
        let seconds = num(&j, "seconds");
        let bytes = iters * size;
        // READ moves data from the server (responder) to the client.
        let (cpu_tx, cpu_rx) = if op == "read" {
            (sf.cpu, cf.cpu)
        } else {
            (cf.cpu, sf.cpu)
        };
        let kind = if lat {
            "softhca_lat"
        } else if shared_buffer {
            "softhca_bw_shared"
        } else if tx_depth.is_some() {
            "softhca_msg_rate"
        } else {
            "softhca_bw"
        };
        let mut r = Row::new(kind, op, size, qps, seconds, iters, bytes, cpu_tx, cpu_rx);
        r.gso = j.get("gso").and_then(|x| x.as_bool());
        r.gro = j.get("gro").and_then(|x| x.as_bool());
        r.poll = j.get("poll").and_then(|x| x.as_str()).map(String::from);
        if lat {
            r.lat_us_p50 = j.get("lat_us_p50").and_then(|x| x.as_f64());
            r.lat_us_p99 = j.get("lat_us_p99").and_then(|x| x.as_f64());
        } else {
            r.set_throughput();
        }
        Ok(r)
    }

    /// A `softhca perf` server and client for `op`, the client with `client_args` for
    /// `self.duration` seconds, JSON out; `server_stats`: the server runs with
    /// `SOFTHCA_STATS` (its counters and turnarounds on stderr at close).
    fn perf_pair(
        &self,
        op: &str,
        client_args: &[String],
        server_stats: bool,
    ) -> Result<(Finished, Finished), CliError> {
        let port = free_tcp_port()?.to_string();
        let mut sc = Command::new(self.exe);
        sc.args(["perf", op, "-p", &port])
            .env("SOFTHCA_ADDR", self.server_ip.to_string());
        if server_stats {
            sc.env("SOFTHCA_STATS", "1");
        }
        let mut server = Proc::spawn("softhca perf server", sc)?;
        server.wait_line(Pipe::Err, "waiting for a client", READY_TIMEOUT)?;
        let mut cc = Command::new(self.exe);
        cc.args(["perf", op, &self.server_ip.to_string(), "-p", &port])
            .args(client_args)
            .args(["-D", &self.duration.to_string(), "--json"])
            .env("SOFTHCA_ADDR", self.client_ip.to_string());
        let client = Proc::spawn("softhca perf client", cc)?;
        let cf = client.finish(self.deadline())?;
        let sf = server.finish(Instant::now() + SLACK)?;
        Ok((cf, sf))
    }

    /// [`Point::Turnaround`]: an 8 B SEND ping-pong whose server prints the phases of its
    /// turnarounds when its device closes.
    fn turnaround(&self) -> Result<Row, CliError> {
        let args = ["-s", "8", "--lat"].map(String::from);
        let (cf, sf) = self.perf_pair("send", &args, true)?;
        let t = sf
            .err
            .iter()
            .find_map(|l| output::Turnaround::parse(l))
            .ok_or_else(|| {
                CliError::exchange("softhca perf server", "no turnaround line on stderr")
            })?;
        let j = last_json(&cf, "softhca perf client")?;
        let mut r = Row::new(
            "softhca_turnaround",
            "send",
            8,
            1,
            num(&j, "seconds"),
            t.count,
            0,
            cf.cpu,
            sf.cpu,
        );
        r.lat_us_p50 = Some(t.user_space());
        r.turnaround_p50_us = Some(t);
        Ok(r)
    }

    /// A `softhca bench-peer` baseline.
    fn peer(&self, kind: &'static str, size: u64) -> Result<Row, CliError> {
        let dur = self.duration.to_string();
        let size_s = size.to_string();
        let mut sc = Command::new(self.exe);
        sc.args(["bench-peer", kind, "server", "--bind", "127.0.0.1"])
            .args(["-s", &size_s, "-D", &dur]);
        let mut server = Proc::spawn(format!("{kind} server"), sc)?;
        let line = server.wait_line(Pipe::Out, "READY ", READY_TIMEOUT)?;
        let port: u16 = line
            .trim()
            .strip_prefix("READY ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| CliError::peer(format!("{kind} server said {line:?}")))?;
        let to = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port).to_string();
        let mut cc = Command::new(self.exe);
        cc.args(["bench-peer", kind, "client", "--to", &to])
            .args(["-s", &size_s, "-D", &dur]);
        let client = Proc::spawn(format!("{kind} client"), cc)?;
        let cf = client.finish(self.deadline())?;
        let sf = server.finish(Instant::now() + SLACK)?;
        let cj = last_json(&cf, &format!("{kind} client"))?;
        let sj = last_json(&sf, &format!("{kind} server"))?;
        Ok(match kind {
            "tcp-stream" | "udp-blast" | "udp-blast-icrc" => {
                stream_row(kind, size, [&cj, &sj], [cf.cpu, sf.cpu])
            }
            _ => pingpong_row(kind, size, &cj, [cf.cpu, sf.cpu]),
        })
    }
}

/// A TCP stream or raw UDP row: the receiver's count over the receiver's time, what
/// actually arrived. `json` and `cpu` are the client's (sender's), then the server's.
fn stream_row(kind: &str, size: u64, json: [&serde_json::Value; 2], cpu: [f64; 2]) -> Row {
    let [cj, sj] = json;
    let blast = kind.starts_with("udp-blast");
    let bytes = num(sj, "bytes") as u64;
    let msgs = if blast {
        num(sj, "datagrams") as u64
    } else {
        bytes / size.max(1)
    };
    let (k, op) = match kind {
        "udp-blast" => ("udp_blast", "udp"),
        "udp-blast-icrc" => ("udp_blast_icrc", "udp"),
        _ => ("tcp_stream", "tcp"),
    };
    let seconds = num(sj, "seconds");
    let mut r = Row::new(k, op, size, 1, seconds, msgs, bytes, cpu[0], cpu[1]);
    r.set_throughput();
    if blast {
        let gso = cj.get("gso").and_then(|x| x.as_bool()).unwrap_or(false);
        let gro = sj.get("gro").and_then(|x| x.as_bool()).unwrap_or(false);
        let sent = num(cj, "bytes");
        let loss = if sent > 0.0 {
            (1.0 - bytes as f64 / sent).max(0.0) * 100.0
        } else {
            0.0
        };
        if k == "udp_blast" {
            r.note = Some(blast_note(gso, gro, loss));
        }
        r.icrc_failures = sj.get("icrc_failures").and_then(|x| x.as_u64());
        r.gso = Some(gso);
        r.gro = Some(gro);
    }
    r
}

/// What the raw UDP row measured: the GSO+GRO ceiling, or a fallback.
fn blast_note(gso: bool, gro: bool, loss: f64) -> String {
    let refused = match (gso, gro) {
        (true, true) => {
            return format!(
                "raw UDP: GSO and GRO in use; {loss:.0}% of sent bytes dropped by the \
                 receiving socket"
            )
        }
        (false, false) => "GSO and GRO",
        (false, true) => "GSO",
        (true, false) => "GRO",
    };
    format!(
        "raw UDP: kernel refused {refused}; measured with the fallback (plain datagrams), \
         not the GSO+GRO ceiling"
    )
}

/// A TCP or UDP ping-pong row, from the client's figures.
fn pingpong_row(kind: &str, size: u64, cj: &serde_json::Value, cpu: [f64; 2]) -> Row {
    let iters = num(cj, "iters") as u64;
    let (k, op) = match kind {
        "tcp-pingpong" => ("tcp_pingpong", "tcp"),
        "udp-pingpong-roce" => ("udp_pingpong_roce", "udp"),
        _ => ("udp_pingpong", "udp"),
    };
    let seconds = num(cj, "seconds");
    let bytes = iters * size * 2;
    let mut r = Row::new(k, op, size, 1, seconds, iters, bytes, cpu[0], cpu[1]);
    r.lat_us_p50 = cj.get("lat_us_p50").and_then(|x| x.as_f64());
    r.lat_us_p99 = cj.get("lat_us_p99").and_then(|x| x.as_f64());
    let lost = num(cj, "lost");
    if lost > 0.0 {
        r.note = Some(format!("{lost} datagrams lost (200 ms timeout each)"));
    }
    r
}

/// The progress line on stderr: redrawn in place on a terminal, one line per measurement
/// otherwise.
struct ProgressLine {
    state: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    total: usize,
    tty: bool,
}

impl ProgressLine {
    fn start(total: usize) -> ProgressLine {
        let tty = std::io::stderr().is_terminal();
        let state = Arc::new(Mutex::new(String::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = tty.then(|| {
            let (state, stop) = (state.clone(), stop.clone());
            let t0 = Instant::now();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let line = state.lock().map(|s| s.clone()).unwrap_or_default();
                    if !line.is_empty() {
                        let e = t0.elapsed().as_secs();
                        let mut err = std::io::stderr().lock();
                        let _ = write!(err, "\r\x1b[K{line} [{}:{:02}]", e / 60, e % 60);
                        let _ = err.flush();
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                let _ = write!(std::io::stderr(), "\r\x1b[K");
            })
        });
        ProgressLine {
            state,
            stop,
            thread,
            total,
            tty,
        }
    }

    fn set(&self, i: usize, label: &str, started: Instant) {
        let left = if i > 0 {
            let per = started.elapsed().as_secs_f64() / i as f64;
            format!(", ~{:.0} s left", per * (self.total - i) as f64)
        } else {
            String::new()
        };
        let line = format!("softhca bench: [{}/{}] {label}{left}", i + 1, self.total);
        if self.tty {
            if let Ok(mut s) = self.state.lock() {
                *s = line;
            }
        } else {
            eprintln!("{line}");
        }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows that targets compare are measured next to each other.
    #[test]
    fn compared_rows_are_measured_together() {
        let mut points = plan(false);
        points.extend(dropin_points());
        let mut order: Vec<usize> = (0..points.len()).collect();
        order.sort_by_key(|&i| measure_key(&points[i], i));
        let labels: Vec<String> = order.iter().map(|&i| points[i].label()).collect();
        let at = |l: &str| labels.iter().position(|x| x == l).expect(l);
        let write1 = at("softhca write bw 64K x1 QP");
        assert_eq!(at("softhca write bw 64K x1024 QP") + 2, write1);
        assert_eq!(at("softhca write bw 64K x1024 QP, one buffer") + 1, write1);
        assert_eq!(at("softhca read bw 64K x1 QP"), write1 + 1);
        assert_eq!(at("ib_write_bw 64K (drop-in)"), write1 + 2);
        assert_eq!(
            at("ib_send_bw 64K (drop-in)"),
            at("softhca send bw 64K x1 QP") + 1
        );
        assert_eq!(
            at("softhca send lat 8 B"),
            at("udp ping-pong, softhca's sockets 8 B") + 1
        );
        assert_eq!(at("udp ping-pong 8 B") + 2, at("softhca send lat 8 B"));
        assert_eq!(
            at("ib_write_lat 8 B (drop-in)"),
            at("softhca write lat 8 B") + 1
        );
        // The TCP and raw UDP streams just before the bandwidth rows they are compared with.
        assert_eq!(at("tcp stream 64K") + 3, at("softhca send bw 64K x1 QP"));
        assert_eq!(at("raw udp gso+gro 4K") + 1, at("raw udp + icrc 4K"));
        assert_eq!(at("raw udp + icrc 4K") + 1, at("softhca send bw 64K x1 QP"));
        assert_eq!(at("tcp stream 4K") + 1, at("softhca send bw 4K x1 QP"));
        assert_eq!(at("tcp stream 1M") + 1, at("softhca send bw 1M x1 QP"));
        assert_eq!(labels.len(), points.len());
    }

    #[test]
    fn perftest_result_line_is_read() {
        let out: Vec<String> = [
            "---------------------------------------------------------------------------------------",
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
            " 65536      117310           0.00               30.75  \t\t   0.058650",
            "---------------------------------------------------------------------------------------",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(perftest_bw_result(&out), Some((117310, 30.75)));
        assert_eq!(perftest_bw_result(&out[..2]), None, "no result line");
        assert_eq!(perftest_bw_result(&out[2..]), None, "no header");
    }

    #[test]
    fn perftest_lat_result_line_is_read() {
        let out: Vec<String> = [
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ",
            " 8       20000          10.01          1561.05      14.73    \t       16.44      \t13.20   \t\t60.69   \t\t242.36 ",
            "---------------------------------------------------------------------------------------",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(perftest_lat_result(&out), Some((20000, 14.73, 60.69)));
        assert_eq!(perftest_lat_result(&out[1..]), None, "no header");
    }

    #[test]
    fn a_listening_port_is_seen() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        wait_listening(port, Duration::from_secs(5)).unwrap();
        drop(l);
        let free = free_tcp_port().unwrap();
        assert!(wait_listening(free, Duration::from_millis(100)).is_err());
    }
}
