//! `softhca-impair paths`: build N shaped parallel paths between two namespaces, change
//! one path while traffic runs, read the counters, and the multipath table.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use softhca_testbed::paths::parse_rate;
use softhca_testbed::{mptcp, Direction, End, Fault, Paths};

use crate::mptable;

/// `softhca-impair paths ...`.
#[derive(Debug, Args)]
pub struct PathsArgs {
    #[command(subcommand)]
    cmd: PathsCmd,
}

#[derive(Debug, Args)]
struct BedName {
    /// Base name: namespaces NAME-a and NAME-b, devices NAMEa<i> and NAMEb<i>.
    #[arg(long, default_value = "mpb")]
    name: String,
}

#[derive(Debug, Subcommand)]
enum PathsCmd {
    /// Build the paths (they stay until `paths down`).
    Up(UpArgs),
    /// Delete the namespaces.
    Down(BedName),
    /// Black-hole path I silently (nftables drop at the receiving end).
    Cut(FaultArgs),
    /// Deliver path I's packets again (clears a cut or a loss).
    Restore(FaultArgs),
    /// Drop each packet of path I with probability PERCENT / 100.
    Loss(LossArgs),
    /// Set path I's token bucket rate (both ends), e.g. 100mbit.
    Rate(RateArgs),
    /// Every path's rate and counters.
    Stats(BedName),
    /// The side-by-side table: softhca multipath, softhca single-path RC and MPTCP.
    Table(mptable::MpTableArgs),
    /// MPTCP receiver of the table (prints progress lines, then a JSON result).
    #[command(hide = true)]
    MptcpRecv(MptcpArgs),
    /// MPTCP sender of the table.
    #[command(hide = true)]
    MptcpSend(MptcpArgs),
    /// MPTCP echo server of the latency row.
    #[command(hide = true)]
    MptcpEcho(MptcpArgs),
    /// MPTCP 4 KiB ping-pong of the latency row (prints a JSON result).
    #[command(hide = true)]
    MptcpPing(MptcpArgs),
}

#[derive(Debug, Args)]
struct UpArgs {
    #[command(flatten)]
    name: BedName,
    /// Number of paths.
    #[arg(short = 'n', long, default_value_t = 4)]
    paths: usize,
    /// Rate of every path (tbf on both ends).
    #[arg(long, default_value = "1gbit")]
    rate: String,
    /// Rates per path (comma-separated), instead of -n and --rate.
    #[arg(long, value_delimiter = ',')]
    rates: Vec<String>,
}

/// The direction a fault applies to (A sends data to B).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Dir {
    /// A to B: the data direction.
    Ab,
    /// B to A: the ACK direction.
    Ba,
    /// Both.
    Both,
}

impl From<Dir> for Direction {
    fn from(d: Dir) -> Direction {
        match d {
            Dir::Ab => Direction::AToB,
            Dir::Ba => Direction::BToA,
            Dir::Both => Direction::Both,
        }
    }
}

#[derive(Debug, Args)]
struct FaultArgs {
    #[command(flatten)]
    name: BedName,
    /// The path (0-based).
    path: usize,
    /// Which direction.
    #[arg(long, value_enum, default_value = "both")]
    dir: Dir,
}

#[derive(Debug, Args)]
struct LossArgs {
    #[command(flatten)]
    fault: FaultArgs,
    /// Loss in percent.
    percent: f64,
}

#[derive(Debug, Args)]
struct RateArgs {
    #[command(flatten)]
    name: BedName,
    /// The path (0-based).
    path: usize,
    /// The new rate, e.g. 100mbit or 1gbit.
    rate: String,
}

/// Options of the hidden MPTCP helpers.
#[derive(Debug, Args)]
pub struct MptcpArgs {
    /// Address to listen on or connect to.
    #[arg(long)]
    addr: IpAddr,
    /// TCP port.
    #[arg(long)]
    port: u16,
    /// Seconds to send (sender, ping).
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    /// Progress line interval in seconds (receiver).
    #[arg(long, default_value_t = 0.01)]
    progress: f64,
    /// Message size (echo, ping).
    #[arg(long, default_value_t = 4096)]
    size: usize,
}

fn rate(s: &str) -> Result<u64, String> {
    parse_rate(s).ok_or_else(|| format!("{s:?} is not a rate (e.g. 1gbit, 100mbit)"))
}

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

/// Runs `softhca-impair paths ...`.
pub fn run(a: PathsArgs) -> Result<(), String> {
    match a.cmd {
        PathsCmd::Up(u) => up(u),
        PathsCmd::Down(n) => {
            softhca_testbed::remove_namespaces(&n.name);
            println!("down: {}-a {}-b removed", n.name, n.name);
            Ok(())
        }
        PathsCmd::Cut(f) => fault(&f, Fault::Cut),
        PathsCmd::Restore(f) => fault(&f, Fault::Clear),
        PathsCmd::Loss(l) => {
            if !(0.0..=100.0).contains(&l.percent) {
                return Err(format!("loss {} % is not in 0..100", l.percent));
            }
            fault(&l.fault, Fault::Loss(l.percent / 100.0))
        }
        PathsCmd::Rate(r) => {
            let mut p = Paths::attach(&r.name.name).map_err(e)?;
            p.set_rate(r.path, rate(&r.rate)?).map_err(e)?;
            println!("path {}: {}", r.path, r.rate);
            Ok(())
        }
        PathsCmd::Stats(n) => stats(&Paths::attach(&n.name).map_err(e)?),
        PathsCmd::Table(t) => mptable::run(t),
        PathsCmd::MptcpRecv(m) => mptcp_recv(&m),
        PathsCmd::MptcpSend(m) => {
            let s = mptcp::connect(SocketAddr::new(m.addr, m.port)).map_err(e)?;
            let sent = mptcp::send(s, m.secs).map_err(e)?;
            println!("{}", serde_json::json!({ "sent": sent }));
            Ok(())
        }
        PathsCmd::MptcpEcho(m) => {
            let l = mptcp::listen(SocketAddr::new(m.addr, m.port)).map_err(e)?;
            let (s, _) = l.accept().map_err(e)?;
            mptcp::echo(s, m.size).map_err(e)
        }
        PathsCmd::MptcpPing(m) => mptcp_ping(&m),
    }
}

fn up(u: UpArgs) -> Result<(), String> {
    let rates: Vec<u64> = if u.rates.is_empty() {
        vec![rate(&u.rate)?; u.paths]
    } else {
        u.rates.iter().map(|r| rate(r)).collect::<Result<_, _>>()?
    };
    let mut p = Paths::up(&u.name.name, &rates).map_err(e)?;
    p.keep();
    let (na, nb) = (p.netns(End::A), p.netns(End::B));
    println!("up: {na} and {nb}, {} paths", p.len());
    for i in 0..p.len() {
        println!(
            "  path {i}: {} {} <-> {} {}, {} Mb/s",
            p.dev(End::A, i),
            p.addr(End::A, i),
            p.addr(End::B, i),
            p.dev(End::B, i),
            p.rate(i) / 1_000_000
        );
    }
    let (la, lb) = (p.loopback(End::A), p.loopback(End::B));
    println!("  ECMP (L4 hash over every path): {la} <-> {lb}");
    println!(
        "  TCP ports {}-{} take the unshaped management pair 10.62.255.1 <-> .2",
        softhca_testbed::paths::CONTROL_PORTS.0,
        softhca_testbed::paths::CONTROL_PORTS.1
    );
    println!(
        "run e.g.: ip netns exec {nb} softhca perf write -p 18515 &\n          ip netns exec {na} softhca perf write {} -p 18515 -D 10 --verify --interval 0.5\n          softhca-impair paths cut 1 --name {}",
        p.addr(End::B, 0),
        p.name()
    );
    Ok(())
}

fn fault(f: &FaultArgs, fault: Fault) -> Result<(), String> {
    let p = Paths::attach(&f.name.name).map_err(e)?;
    p.set_fault(f.path, f.dir.into(), fault).map_err(e)?;
    let dir = match f.dir {
        Dir::Ab => "A→B",
        Dir::Ba => "B→A",
        Dir::Both => "both directions",
    };
    let what = match fault {
        Fault::Clear => "delivered".to_string(),
        Fault::Cut => "black-holed".to_string(),
        Fault::Loss(p) => format!("{} % random loss", p * 100.0),
    };
    println!("path {} ({dir}): {what}", f.path);
    Ok(())
}

fn stats(p: &Paths) -> Result<(), String> {
    let s = p.stats().map_err(e)?;
    println!("| path | Mb/s | A→B MB | B→A MB | A→B faulted pkts | B→A faulted pkts | shaper drops A/B |");
    println!("|---|---|---|---|---|---|---|");
    for (i, s) in s.iter().enumerate() {
        println!(
            "| {i} | {} | {:.1} | {:.1} | {} | {} | {}/{} |",
            p.rate(i) / 1_000_000,
            s.ab_bytes as f64 / 1e6,
            s.ba_bytes as f64 / 1e6,
            s.ab_faulted,
            s.ba_faulted,
            s.ab_shaper_drops,
            s.ba_shaper_drops
        );
    }
    Ok(())
}

fn mptcp_recv(m: &MptcpArgs) -> Result<(), String> {
    let l = mptcp::listen(SocketAddr::new(m.addr, m.port)).map_err(e)?;
    let (s, _) = l.accept().map_err(e)?;
    let mut log = softhca_perf::ProgressLog::new(
        std::io::stderr().lock(),
        Duration::from_secs_f64(m.progress),
        Instant::now(),
    );
    let r = mptcp::receive(s, &mut log).map_err(e)?;
    drop(log);
    let gbps = r.bytes as f64 * 8.0 / r.seconds.max(1e-9) / 1e9;
    println!(
        "{}",
        serde_json::json!({
            "bytes": r.bytes, "seconds": r.seconds, "gbps": gbps, "verified": r.verified
        })
    );
    Ok(())
}

fn mptcp_ping(m: &MptcpArgs) -> Result<(), String> {
    let s = mptcp::connect(SocketAddr::new(m.addr, m.port)).map_err(e)?;
    let mut rtts = mptcp::ping(s, m.size, m.secs).map_err(e)?;
    rtts.sort_unstable();
    let pct = |p: f64| {
        let n = rtts.len();
        let i = ((p * n as f64).ceil() as usize).clamp(1, n.max(1)) - 1;
        rtts.get(i).map_or(0.0, |&ns| ns as f64 / 2000.0)
    };
    // Half round trips, as softhca perf --lat (and perftest's write_lat) report.
    println!(
        "{}",
        serde_json::json!({
            "iters": rtts.len(), "lat_us_p50": pct(0.5), "lat_us_p99": pct(0.99),
            "lat_us_p999": pct(0.999)
        })
    );
    Ok(())
}
