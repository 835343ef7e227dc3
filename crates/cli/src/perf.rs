//! `softhca perf`: perftest-style bandwidth and latency tests over RC queue pairs.
//!
//! Both ends run the same code whether they are two processes (server
//! `softhca perf write`, client `softhca perf write <server>`) or one command
//! (`--loopback`: the server is started as a child process on a second free loopback
//! address). The tests
//! themselves are `softhca_perf`'s; this module turns arguments into its parameters and
//! prints what it returns.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca::{Config, Context, Mtu};
use softhca_perf::exchange::{Control, TestParams};
use softhca_perf::{Op, TestOptions};

use crate::args::{PerfArgs, PerfOp};
use crate::error::CliError;
use crate::local::{free_device_ips, free_tcp_port, Pipe, Proc};
use crate::progress::ProgressLine;
use crate::report::{print_summary, print_table};

/// Entry point of `softhca perf`.
pub fn run(a: &PerfArgs) -> Result<(), CliError> {
    if let Some(m) = a.mtu {
        if Mtu::from_bytes(m as usize).map(|x| x.bytes()) != Some(m as usize) {
            return Err(CliError::Usage(format!(
                "invalid MTU {m} (256, 512, 1024, 2048 or 4096)"
            )));
        }
    }
    if a.lat && a.qps > 1 {
        return Err(CliError::Usage(
            "latency tests use one QP (drop --qps)".into(),
        ));
    }
    if let Some(d) = a.duration {
        if !(d > 0.0 && d < 1e6) {
            return Err(CliError::Usage(format!("invalid duration {d}")));
        }
    }
    if a.iters == Some(0) {
        return Err(CliError::Usage("--iters must be at least 1".into()));
    }
    if a.loopback {
        if a.server.is_some() {
            return Err(CliError::Usage(
                "--loopback runs both ends; give no server address".into(),
            ));
        }
        return loopback(a);
    }
    match &a.server {
        Some(host) => {
            // Reach the server first: "cannot reach" is the likelier error and the clearer one.
            let (first, server) = Control::connect(host, a.port)?;
            let ctx = Context::open_default().map_err(CliError::verbs("cannot open device"))?;
            let r = client(a, &ctx, host, a.port, server.ip(), Some(first));
            print_counters("client", &ctx);
            r
        }
        None => {
            let ctx = Context::open_default().map_err(CliError::verbs("cannot open device"))?;
            // [::] takes IPv4 and IPv6 clients (Linux sockets are dual-stack unless
            // bindv6only is set); hosts without IPv6 fall back to 0.0.0.0.
            let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), a.port);
            let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), a.port);
            let listener = match TcpListener::bind(v6) {
                Ok(l) => l,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    return Err(CliError::listen(v6)(e))
                }
                Err(_) => TcpListener::bind(addr).map_err(CliError::listen(addr))?,
            };
            if !a.json {
                eprintln!(
                    "softhca perf: {} waiting for a client on TCP port {} (device {}, {})",
                    a.op.name(),
                    a.port,
                    ctx.name(),
                    gid_list(&ctx)
                );
            }
            serve(
                &ctx,
                &listener,
                a.op,
                !a.forever && a.op != PerfOp::All,
                false,
                a.json,
                a.events,
            )
        }
    }
}

fn gid_list(ctx: &Context) -> String {
    ctx.gids()
        .iter()
        .map(|g| g.to_ip().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The list of (op, latency?) a run covers.
fn tests(op: PerfOp, lat: bool) -> Vec<(Op, bool)> {
    match op {
        PerfOp::All => vec![
            (Op::Send, false),
            (Op::Write, false),
            (Op::Read, false),
            (Op::Send, true),
            (Op::Write, true),
            (Op::Read, true),
        ],
        PerfOp::Send => vec![(Op::Send, lat)],
        PerfOp::Write => vec![(Op::Write, lat)],
        PerfOp::Read => vec![(Op::Read, lat)],
        PerfOp::Atomic => vec![(Op::Atomic, lat)],
    }
}

/// The options every test of the run shares.
fn options(a: &PerfArgs) -> TestOptions {
    TestOptions {
        size: a.size,
        iters: a.iters,
        duration: a
            .duration
            .or_else(|| (a.op == PerfOp::All && a.iters.is_none()).then_some(ALL_SECONDS_PER_TEST)),
        qps: a.qps,
        tx_depth: a.tx_depth,
        mtu: a.mtu,
        verify: a.verify,
        shared_buffer: a.shared_buffer,
        events: a.events,
    }
}

/// The operation a server runs (`None`: any, for `perf all`).
fn allowed(op: PerfOp) -> Option<Op> {
    match op {
        PerfOp::Send => Some(Op::Send),
        PerfOp::Write => Some(Op::Write),
        PerfOp::Read => Some(Op::Read),
        PerfOp::Atomic => Some(Op::Atomic),
        PerfOp::All => None,
    }
}

/// Runs the client side of every test and prints the results.
fn client(
    a: &PerfArgs,
    ctx: &Arc<Context>,
    host: &str,
    port: u16,
    rdma_peer: IpAddr,
    mut first: Option<Control>,
) -> Result<(), CliError> {
    let list = tests(a.op, a.lat);
    let opts = options(a);
    let mut results = Vec::new();
    let mut out = std::io::stdout().lock();
    for (op, lat) in &list {
        let p = softhca_perf::params(&opts, *op, *lat, ctx)?;
        let mut ctl = match first.take() {
            Some(c) => c,
            None => Control::connect(host, port)?.0,
        };
        let mode = if *lat { "lat" } else { "bw" };
        let mut progress = ProgressLine::new(format!("{} {mode}", op.name()), a.json)
            .with_interval(
                a.interval
                    .filter(|s| *s > 0.0)
                    .map(std::time::Duration::from_secs_f64),
            )
            .with_log(
                a.progress
                    .filter(|s| *s > 0.0)
                    .map(std::time::Duration::from_secs_f64),
            )
            .with_congestion(
                softhca::Diagnostics::from_env()
                    .perf_counters
                    .then(|| Arc::clone(ctx)),
            );
        let r = softhca_perf::run_test(ctx, &mut ctl, &p, *op, a.cq_mod, rdma_peer, &mut progress)?;
        if a.json {
            let mut j = r.to_json();
            if let Some(m) = j.as_object_mut() {
                let (gso, gro) = ctx.io_capabilities();
                m.insert("gso".into(), gso.into());
                m.insert("gro".into(), gro.into());
                m.insert("poll".into(), poll_str(ctx).into());
            }
            writeln!(out, "{j}")?;
        } else if a.op != PerfOp::All {
            // The path MTU both ends agreed on: a server that also serves an Ethernet
            // interface offers that interface's (1024 at 1500), whatever this end's is.
            let agreed = if r.mtu < p.mtu {
                format!("{} bytes (the server's port allows no more)", r.mtu)
            } else {
                format!("{} bytes", r.mtu)
            };
            let mtu = [
                ("MTU", agreed),
                ("TX depth", p.tx_depth.to_string()),
                ("Offloads", offloads_str(ctx)),
                ("Polling", poll_str(ctx)),
            ];
            print_table(&mut out, &r, &mtu)?;
        }
        out.flush()?;
        results.push(r);
    }
    if a.op == PerfOp::All {
        // Tell a `perf all` server to stop.
        if let Ok((mut ctl, _)) = Control::connect(host, port) {
            let quit = TestParams {
                op: "quit".into(),
                ..softhca_perf::params(&opts, Op::Send, false, ctx)?
            };
            let _ = ctl.send_request(&quit, &[]);
        }
        if !a.json {
            print_summary(&mut out, &results)?;
        }
    }
    Ok(())
}

/// Serves tests on `listener` (one, or until a client sends `quit` for `perf all`).
fn serve(
    ctx: &Arc<Context>,
    listener: &TcpListener,
    op: PerfOp,
    once: bool,
    quiet: bool,
    json: bool,
    events: bool,
) -> Result<(), CliError> {
    loop {
        let (stream, peer) = listener
            .accept()
            .map_err(|e| CliError::exchange("client", crate::error::io_msg(&e)))?;
        let mut ctl = Control::new(stream, peer.to_string())?;
        let served = softhca_perf::serve_test(ctx, &mut ctl, allowed(op), events);
        if !quiet {
            print_counters("server", ctx);
        }
        match served {
            Ok(None) => return Ok(()),
            Ok(Some(softhca_perf::Served { params: p, counts })) => {
                if !quiet {
                    let n: u64 = counts.iter().sum();
                    let line = format!(
                        "served {} {} for {}: {n} messages of {} bytes on {} QP(s){}",
                        p.op,
                        if p.lat { "lat" } else { "bw" },
                        ctl.peer(),
                        p.size,
                        p.qps,
                        if p.verify {
                            ", every byte verified"
                        } else {
                            ""
                        }
                    );
                    if json {
                        eprintln!("softhca perf: {line}");
                    } else {
                        println!("{line}");
                    }
                }
            }
            Err(e) => {
                let _ = ctl.send(&softhca_perf::exchange::Ctl::Error(e.to_string()));
                return Err(e.into());
            }
        }
        if once {
            return Ok(());
        }
    }
}

/// `--loopback`: the server in a child process (`softhca perf <op>` on its own device),
/// the client here. Two processes, as a user runs them, so the figures are the
/// two-process figures: two devices in one process share its threads' CPU time and
/// scheduling, which put 8 B latencies an order of magnitude above them.
fn loopback(a: &PerfArgs) -> Result<(), CliError> {
    let base = Config::from_env().map_err(CliError::verbs("configuration"))?;
    let port = free_tcp_port()?;
    // SOFTHCA_ADDR=a,b chooses the pair (tests and captures filter on it).
    let (ctx, (server_ip, server)) = match base.addrs[..] {
        [s, c, ..] => (open_on(&base, c)?, (s, start_server(a, s, port)?)),
        _ => {
            // Claim the client's address by opening its device, then try free addresses
            // for the server until one is not taken meanwhile by a concurrent run.
            let ctx = free_device_ips()
                .find_map(|ip| open_on(&base, ip).ok())
                .ok_or_else(|| CliError::Usage("no free loopback address for a device".into()))?;
            let mine = ctx.gids().first().map(|g| g.to_ip());
            let mut last = None;
            let started = free_device_ips()
                .filter(|&ip| Some(ip) != mine)
                .take(SERVER_ATTEMPTS)
                .find_map(|ip| match start_server(a, ip, port) {
                    Ok(s) => Some((ip, s)),
                    Err(e) => {
                        last = Some(e);
                        None
                    }
                });
            let started = started.ok_or_else(|| {
                last.unwrap_or_else(|| CliError::Usage("no free loopback address".into()))
            })?;
            (ctx, started)
        }
    };
    let result = client(a, &ctx, "127.0.0.1", port, server_ip, None);
    // For profiling the datapath: both devices' counters (also after a failure: they
    // say why it failed).
    print_counters("client", &ctx);
    let served = server.finish(Instant::now() + SERVER_EXIT);
    if let Ok(f) = &served {
        for l in f.err.iter().filter(|l| l.starts_with("server:")) {
            eprintln!("{l}");
        }
    }
    result?;
    served.map(|_| ())
}

/// A device of `base`'s configuration on `ip` alone.
fn open_on(base: &Config, ip: IpAddr) -> Result<Arc<Context>, CliError> {
    let cfg = Config {
        addrs: vec![ip],
        ..base.clone()
    };
    Context::open(&cfg).map_err(CliError::verbs("cannot open device"))
}

/// `softhca perf <op>` serving on `ip` and TCP `port` (waiting as `a` says), once it
/// says it is waiting.
fn start_server(a: &PerfArgs, ip: IpAddr, port: u16) -> Result<Proc, CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Usage(format!("cannot find the softhca binary: {e}")))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["perf", a.op.name(), "-p", &port.to_string()])
        .env("SOFTHCA_ADDR", ip.to_string());
    if a.events {
        cmd.arg("--events");
    }
    let mut server = Proc::spawn("softhca perf server", cmd)?;
    server.wait_line(Pipe::Err, "waiting for a client", SERVER_READY)?;
    Ok(server)
}

/// Free addresses tried for the server before giving up.
const SERVER_ATTEMPTS: usize = 8;
/// Seconds each test of `perf all` runs without `-n` or `-D`. It is the demo a newcomer
/// runs first, and perftest's counts (5000 messages of 64 KiB) last a tenth of a second on
/// loopback: the start (connection, cold caches, the first window) set half the figure.
const ALL_SECONDS_PER_TEST: f64 = 1.0;

/// How long a `--loopback` server may take to start, and to exit after the last test.
const SERVER_READY: Duration = Duration::from_secs(10);
const SERVER_EXIT: Duration = Duration::from_secs(10);

/// What the kernel gave this device's sockets, and why not when it did not: a refused
/// offload falls back to one datagram per packet, and the user should know.
fn offloads_str(ctx: &Context) -> String {
    let (gso, gro) = ctx.io_capabilities();
    let cfg = Config::from_env().unwrap_or_default();
    let why = |on: bool, asked: bool, var: &str| -> String {
        if on {
            "on".into()
        } else if !asked {
            format!("off ({var}=0)")
        } else {
            "off (refused by the kernel: one datagram per packet)".into()
        }
    };
    format!(
        "GSO {}, GRO {}",
        why(gso, cfg.gso, "SOFTHCA_GSO"),
        why(gro, cfg.gro, "SOFTHCA_GRO")
    )
}

/// The datapath's polling mode, as SOFTHCA_POLL spells it.
fn poll_str(ctx: &Context) -> String {
    match ctx.poll_mode() {
        softhca::PollMode::Busy => "busy".into(),
        softhca::PollMode::Blocking => "blocking".into(),
        softhca::PollMode::Adaptive { spin_us } => format!("adaptive:{spin_us}"),
    }
}

/// With SOFTHCA_PERF_COUNTERS set, prints the device's non-zero counters to stderr
/// (for profiling and for diagnosing a failed or slow run).
fn print_counters(who: &str, ctx: &Context) {
    if !softhca::Diagnostics::from_env().perf_counters {
        return;
    }
    let c: Vec<String> = ctx
        .counters()
        .into_iter()
        .filter(|c| c.1 != 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    eprintln!("{who}: {}", c.join(" "));
    for (qpn, cc) in ctx.congestion() {
        eprintln!("{who}: qp {:#x} congestion: {cc}", qpn.value());
    }
    for (qpn, mp) in ctx.multipath() {
        let text = mp.to_string().replace('\n', &format!("\n{who}: "));
        eprintln!("{who}: qp {:#x} {text}", qpn.value());
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    fn opts(args: &[&str]) -> TestOptions {
        let cli = Cli::try_parse_from([&["softhca", "perf"], args].concat()).unwrap();
        let Command::Perf(a) = cli.command else {
            panic!("not a perf command");
        };
        options(&a)
    }

    #[test]
    fn perf_all_runs_each_test_a_second_unless_told_otherwise() {
        let all = opts(&["all", "--loopback"]);
        assert_eq!(
            (all.iters, all.duration),
            (None, Some(ALL_SECONDS_PER_TEST))
        );
        let counted = opts(&["all", "--loopback", "-n", "20"]);
        assert_eq!((counted.iters, counted.duration), (Some(20), None));
        let timed = opts(&["all", "--loopback", "-D", "3"]);
        assert_eq!(timed.duration, Some(3.0));
        // A single test keeps perftest's counts.
        let one = opts(&["write", "--loopback"]);
        assert_eq!((one.iters, one.duration), (None, None));
    }
}
