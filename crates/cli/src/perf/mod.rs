//! `softhca perf`: perftest-style bandwidth and latency tests over RC queue pairs.
//!
//! Both ends run the same code whether they are two processes (server
//! `softhca perf write`, client `softhca perf write <server>`) or one (`--loopback`:
//! two devices on two free loopback addresses, the server on a thread). The TCP
//! exchange ([`crate::exchange`]) carries parameters, QP data, credits and verdicts.

mod bw;
mod lat;
pub(crate) mod setup;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use softhca::{Config, Context, Mtu};

use crate::args::{PerfArgs, PerfOp};
use crate::error::CliError;
use crate::exchange::{Control, Ctl, TestParams};
use crate::progress::Progress;
use crate::report::{print_summary, print_table, LatStats, Mode, PerfResult};
use setup::{pick_gid, Side};

/// How long nothing may happen before a side gives up.
pub const STALL: Duration = Duration::from_secs(10);

/// Buffer memory a verified bandwidth test may use per QP for its slots.
const VERIFY_BUDGET: u64 = 64 << 20;

/// The operation of one test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// SEND / RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// FETCH_AND_ADD.
    Atomic,
}

impl Op {
    /// Wire and JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
            Op::Atomic => "atomic",
        }
    }

    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "send" => Op::Send,
            "write" => Op::Write,
            "read" => Op::Read,
            "atomic" => Op::Atomic,
            _ => return None,
        })
    }
}

/// What a client measured.
pub struct Outcome {
    /// Messages completed per QP.
    pub counts: Vec<u64>,
    /// Measured wall time.
    pub seconds: f64,
    /// Round-trip samples in ns (latency tests).
    pub samples: Vec<u64>,
}

/// What a server saw.
pub struct ServerOutcome {
    /// Messages per QP (the client's count).
    pub counts: Vec<u64>,
    /// Verification result on the server side.
    pub verdict: Result<(), String>,
}

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
                    return Err(CliError::Listen {
                        addr: v6,
                        source: e,
                    })
                }
                Err(_) => {
                    TcpListener::bind(addr).map_err(|source| CliError::Listen { addr, source })?
                }
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

fn stride(size: u64) -> u64 {
    size.div_ceil(64) * 64
}

/// Test parameters from the arguments.
fn params(a: &PerfArgs, op: Op, lat: bool, ctx: &Context) -> Result<TestParams, CliError> {
    let size = if op == Op::Atomic {
        8
    } else {
        a.size.unwrap_or(if lat { 2 } else { 65536 })
    };
    let iters = match (a.iters, a.duration) {
        (_, Some(_)) => 0,
        (Some(n), None) => n,
        (None, None) => {
            if lat {
                1000
            } else {
                5000
            }
        }
    };
    let slots = if lat {
        2
    } else if a.verify {
        let fit = (VERIFY_BUDGET / stride(size)).max(1);
        u64::from(a.tx_depth).min(fit) as u32
    } else {
        1
    };
    let port = ctx.query_port(1).map_err(CliError::verbs("query_port"))?;
    let active = port.active_mtu.bytes() as u32;
    let mtu = a.mtu.map_or(active, |m| m.min(active));
    Ok(TestParams {
        op: op.name().into(),
        lat,
        size,
        iters,
        duration_ms: a.duration.map_or(0, |d| (d * 1000.0).round() as u64),
        qps: a.qps,
        tx_depth: a.tx_depth,
        mtu,
        verify: a.verify,
        slots,
        shared: a.shared_buffer && !lat,
    })
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
    let mut results = Vec::new();
    let mut out = std::io::stdout().lock();
    for (op, lat) in &list {
        let p = params(a, *op, *lat, ctx)?;
        let mut ctl = match first.take() {
            Some(c) => c,
            None => Control::connect(host, port)?.0,
        };
        let r = client_test(ctx, &mut ctl, &p, *op, a.cq_mod, rdma_peer, a.json)?;
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
            let mtu = [
                ("MTU", format!("{} bytes", p.mtu)),
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
                ..params(a, Op::Send, false, ctx)?
            };
            let _ = ctl.send_request(&quit, &[]);
        }
        if !a.json {
            print_summary(&mut out, &results)?;
        }
    }
    Ok(())
}

/// One test, client side.
fn client_test(
    ctx: &Arc<Context>,
    ctl: &mut Control,
    p: &TestParams,
    op: Op,
    cq_mod: u32,
    rdma_peer: IpAddr,
    quiet: bool,
) -> Result<PerfResult, CliError> {
    let side = Side::create(ctx, p, if p.lat { 2 } else { 1 })?;
    let (gid_index, gid) = pick_gid(ctx, rdma_peer)?;
    if p.lat {
        lat::prepare(&side, op, p)?;
    }
    ctl.send_request(p, &side.infos(gid))?;
    let mtu_bytes = ctl.recv_accept()?;
    let remote = ctl.recv_qps(p.qps)?;
    let mtu = Mtu::from_bytes(mtu_bytes as usize).unwrap_or(Mtu::M1024);
    side.connect(&remote, gid_index, mtu)?;
    let mode = if p.lat { Mode::Lat } else { Mode::Bw };
    let mut progress = Progress::new(format!("{} {}", op.name(), mode.as_str()), quiet);
    let run = if p.lat {
        lat::client(&side, op, p, &remote[0], &mut progress)
    } else {
        bw::client(&side, op, p, cq_mod, &remote, ctl, &mut progress)
    };
    let outcome = match run {
        Ok(o) => o,
        Err(e) => {
            let _ = ctl.send(&Ctl::Error(e.to_string()));
            return Err(e);
        }
    };
    ctl.send(&Ctl::End(outcome.counts.clone()))?;
    let verdict = loop {
        match ctl.recv(Some(STALL * 3))? {
            Some(Ctl::Verdict(ok, msg)) => break (ok, msg),
            Some(Ctl::Credit { .. }) => continue,
            Some(other) => {
                return Err(CliError::exchange(
                    ctl.peer(),
                    format!("unexpected {other:?}"),
                ))
            }
            None => {
                return Err(CliError::Timeout(format!(
                    "no verdict from server {}",
                    ctl.peer()
                )))
            }
        }
    };
    if !verdict.0 {
        return Err(CliError::Verify(format!("server: {}", verdict.1)));
    }
    let mut samples = outcome.samples;
    // perftest reports half the round trip for SEND and WRITE ping-pong, the full
    // round trip for READ and atomics.
    let scale = if matches!(op, Op::Send | Op::Write) {
        0.5
    } else {
        1.0
    };
    let lat = p.lat.then(|| LatStats::from_ns(&mut samples, scale));
    let iters: u64 = outcome.counts.iter().sum();
    Ok(PerfResult {
        op: op.name(),
        mode,
        size: p.size,
        iters,
        qps: p.qps,
        mtu: mtu.bytes() as u32,
        seconds: outcome.seconds,
        lat,
        verified: p.verify.then_some(true),
    })
}

/// Serves tests on `listener` (one, or until a client sends `quit` for `perf all`).
fn serve(
    ctx: &Arc<Context>,
    listener: &TcpListener,
    op: PerfOp,
    once: bool,
    quiet: bool,
    json: bool,
) -> Result<(), CliError> {
    loop {
        let (stream, peer) = listener
            .accept()
            .map_err(|e| CliError::exchange("client", crate::error::io_msg(&e)))?;
        let mut ctl = Control::new(stream, peer.to_string())?;
        let served = serve_one(ctx, &mut ctl, op);
        if !quiet {
            print_counters("server", ctx);
        }
        match served {
            Ok(None) => return Ok(()),
            Ok(Some((p, o))) => {
                if !quiet {
                    let n: u64 = o.counts.iter().sum();
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
                let _ = ctl.send(&Ctl::Error(e.to_string()));
                return Err(e);
            }
        }
        if once {
            return Ok(());
        }
    }
}

/// One test, server side. `None` when the client said `quit`.
fn serve_one(
    ctx: &Arc<Context>,
    ctl: &mut Control,
    allowed: PerfOp,
) -> Result<Option<(TestParams, ServerOutcome)>, CliError> {
    let p = ctl.recv_params()?;
    if p.op == "quit" {
        return Ok(None);
    }
    let op = Op::parse(&p.op)
        .ok_or_else(|| CliError::Usage(format!("client asked for unknown test '{}'", p.op)))?;
    if allowed != PerfOp::All && allowed.name() != op.name() {
        return Err(CliError::Usage(format!(
            "server runs '{}', client asked for '{}'",
            allowed.name(),
            op.name()
        )));
    }
    if p.size == 0
        || p.size > crate::size::MAX_MESSAGE
        || p.qps == 0
        || p.slots == 0
        || p.tx_depth == 0
    {
        return Err(CliError::Usage(
            "client sent invalid test parameters".into(),
        ));
    }
    let max_wr = ctx.query_device().max_qp_wr;
    let rx = if p.lat {
        2
    } else {
        bw::server_rx_depth(op, &p, max_wr)
    };
    let side = Side::create(ctx, &p, rx)?;
    let remote = ctl.recv_qps(p.qps)?;
    let (gid_index, gid) = pick_gid(ctx, remote[0].gid.to_ip())?;
    let own = ctx
        .query_port(1)
        .map_err(CliError::verbs("query_port"))?
        .active_mtu
        .bytes() as u32;
    let mtu_bytes = p.mtu.min(own);
    let mtu = Mtu::from_bytes(mtu_bytes as usize).unwrap_or(Mtu::M256);
    if p.lat {
        lat::prepare(&side, op, &p)?;
    } else {
        bw::server_prepare(&side, op, &p, max_wr)?;
    }
    side.connect(&remote, gid_index, mtu)?;
    ctl.send_accept(mtu.bytes() as u32)?;
    ctl.send_qps(&side.infos(gid))?;
    let o = if p.lat {
        lat::server(&side, op, &p, &remote[0], ctl)?
    } else {
        bw::server(&side, op, &p, ctl)?
    };
    match &o.verdict {
        Ok(()) => ctl.send(&Ctl::Verdict(true, "ok".into()))?,
        Err(m) => {
            ctl.send(&Ctl::Verdict(false, m.clone()))?;
            return Err(CliError::Verify(m.clone()));
        }
    }
    Ok(Some((p, o)))
}

/// Opens two devices on a free pair of loopback addresses (127.0.0.1 and .2 unless
/// another process holds them, then the next free ones), or on the first two addresses
/// of `SOFTHCA_ADDR` when it lists two.
fn open_pair() -> Result<(Arc<Context>, Arc<Context>), CliError> {
    let base = Config::from_env().map_err(CliError::verbs("configuration"))?;
    let open = |ip: IpAddr| -> Result<Option<Arc<Context>>, CliError> {
        let cfg = Config {
            addrs: vec![ip],
            ..base.clone()
        };
        match Context::open(&cfg) {
            Ok(c) => Ok(Some(c)),
            Err(e) if e.errno() == libc::EADDRINUSE => Ok(None),
            Err(e) => Err(CliError::Verbs {
                what: format!("cannot open a device on {ip}").into(),
                source: e,
            }),
        }
    };
    // SOFTHCA_ADDR=a,b chooses the pair (tests and captures filter on it).
    if let [a, b, ..] = base.addrs[..] {
        let server = open(a)?
            .ok_or_else(|| CliError::Usage(format!("{a} is already in use by another device")))?;
        let client = open(b)?
            .ok_or_else(|| CliError::Usage(format!("{b} is already in use by another device")))?;
        return Ok((server, client));
    }
    let mut octet: u8 = 1;
    let mut first: Option<Arc<Context>> = None;
    while octet < 255 {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, octet));
        octet += 1;
        if let Some(c) = open(ip)? {
            match first.take() {
                None => first = Some(c),
                Some(f) => return Ok((f, c)),
            }
        }
    }
    Err(CliError::Usage(
        "no two free loopback addresses for --loopback (UDP port in use on 127.0.0.1-254)".into(),
    ))
}

/// `--loopback`: server on a thread, client here, two devices in one process.
fn loopback(a: &PerfArgs) -> Result<(), CliError> {
    let (server_ctx, client_ctx) = open_pair()?;
    let server_ip = server_ctx
        .gids()
        .first()
        .map(|g| g.to_ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let listener = TcpListener::bind(addr).map_err(|source| CliError::Listen { addr, source })?;
    let port = listener
        .local_addr()
        .map_err(|source| CliError::Listen { addr, source })?
        .port();
    let op = a.op;
    let server_view = server_ctx.clone();
    let server = std::thread::Builder::new()
        .name("perf-server".into())
        .spawn(move || serve(&server_ctx, &listener, op, op != PerfOp::All, true, false))
        .map_err(|e| CliError::Usage(format!("cannot start the server thread: {e}")))?;
    let result = client(a, &client_ctx, "127.0.0.1", port, server_ip, None);
    // For profiling the datapath: both devices' counters (also after a failure: they
    // say why it failed).
    print_counters("client", &client_ctx);
    print_counters("server", &server_view);
    result?;
    match server.join() {
        Ok(r) => r,
        Err(_) => Err(CliError::Usage("the server thread failed".into())),
    }
}

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
}
