//! `softhca-impair`: two network namespaces joined by an impairment link.
//!
//! `softhca-impair up --loss 0.01 --delay-ms 1 --jitter-ms 1 --dup 0.01 --corrupt 0.001
//! --seed 7` builds namespaces `imp-a` (10.99.0.1) and `imp-b` (10.99.0.2) and forwards
//! between them until interrupted (SIGINT/SIGTERM), then removes them; `softhca-impair
//! down` stops a running `up` of the same name and removes leftovers.

mod mptable;
mod paths_cmd;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use softhca_testbed::{remove_namespaces, End, Impairment, Link, LinkConfig};

/// Two network namespaces joined by a userspace impairment link (no netem needed).
#[derive(Debug, Parser)]
#[command(name = "softhca-impair", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Build the namespaces and forward with impairments until SIGINT/SIGTERM.
    Up(UpArgs),
    /// Stop a running `up` of this name and delete its namespaces.
    Down(NameArg),
    /// The shaped-link table: softhca SEND/WRITE/READ and TCP (iperf3) over tbf at
    /// 1 Gb/s, 100 Mb/s and 1 Gb/s + 5 ms, with shaper drops, then fairness rows.
    Shaped(table::TableArgs),
    /// N parallel paths (veth pairs shaped by tbf) between two namespaces: build them,
    /// cut / restore / slow / make lossy one path while traffic runs, and the
    /// multipath table (softhca multipath, single-path RC and MPTCP side by side).
    Paths(paths_cmd::PathsArgs),
}

#[derive(Debug, Args)]
struct NameArg {
    /// Base name: namespaces are NAME-a and NAME-b.
    #[arg(long, default_value = "imp")]
    name: String,
}

#[derive(Debug, Args)]
struct UpArgs {
    #[command(flatten)]
    name: NameArg,
    /// Loss probability per frame (0..1).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// One-way delay in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// Delay jitter (uniform ±) in milliseconds; reorders frames.
    #[arg(long, default_value_t = 0.0)]
    jitter_ms: f64,
    /// Duplication probability per frame.
    #[arg(long, default_value_t = 0.0)]
    dup: f64,
    /// Probability of one flipped bit per frame.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Interface MTU of both ends.
    #[arg(long, default_value_t = 9000)]
    mtu: u32,
    /// Stop after this many seconds (default: run until interrupted).
    #[arg(long)]
    duration: Option<f64>,
}

fn pidfile(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/softhca-impair-{name}.pid"))
}

fn prob(p: f64, what: &str) -> Result<f64, String> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("--{what} must be in 0..1, got {p}"))
    }
}

fn ms(v: f64, what: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(v / 1000.0).map_err(|_| format!("--{what} must be >= 0"))
}

fn up(a: UpArgs) -> Result<(), String> {
    let imp = Impairment {
        loss: prob(a.loss, "loss")?,
        delay: ms(a.delay_ms, "delay-ms")?,
        jitter: ms(a.jitter_ms, "jitter-ms")?,
        dup: prob(a.dup, "dup")?,
        corrupt: prob(a.corrupt, "corrupt")?,
    };
    // Block SIGINT/SIGTERM before the forwarder threads exist, so they inherit the mask
    // and this thread alone takes the signal (with sigtimedwait below).
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use;
    // pthread_sigmask only reads it.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let link = Link::up(LinkConfig {
        name: Some(a.name.name.clone()),
        impairment: imp,
        seed: a.seed,
        mtu: a.mtu,
        ..LinkConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let _ = std::fs::write(pidfile(link.name()), std::process::id().to_string());
    println!(
        "up: {} = {} <-> {} = {} ({imp:?}, seed {})",
        link.netns(End::A),
        link.addr(End::A),
        link.netns(End::B),
        link.addr(End::B),
        a.seed
    );
    println!(
        "run e.g.: ip netns exec {} softhca perf write {} --verify",
        link.netns(End::A),
        link.addr(End::B)
    );
    let start = Instant::now();
    loop {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        // SAFETY: `set` was initialised above; a null siginfo pointer is allowed.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        if sig > 0
            || a.duration
                .is_some_and(|d| start.elapsed().as_secs_f64() >= d)
        {
            break;
        }
    }
    for (dir, end) in [("a->b", End::A), ("b->a", End::B)] {
        let s = link.stats(end).snapshot();
        let text: Vec<String> = s.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("{dir}: {}", text.join(" "));
    }
    let _ = std::fs::remove_file(pidfile(link.name()));
    drop(link);
    println!("down");
    Ok(())
}

fn down(a: NameArg) -> Result<(), String> {
    let pf = pidfile(&a.name);
    if let Some(pid) = std::fs::read_to_string(&pf)
        .ok()
        .and_then(|s| s.trim().parse::<libc::pid_t>().ok())
    {
        // SAFETY: kill has no memory preconditions; a stale pid only yields ESRCH.
        if unsafe { libc::kill(pid, libc::SIGTERM) } == 0 {
            let start = Instant::now();
            // The running `up` removes its namespaces and pidfile itself.
            // SAFETY: signal 0 only checks whether the process exists.
            while unsafe { libc::kill(pid, 0) } == 0 && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = std::fs::remove_file(&pf);
    }
    remove_namespaces(&a.name);
    println!("down: {}-a {}-b removed", a.name, a.name);
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Cmd::Up(a) => up(a),
        Cmd::Down(a) => down(a),
        Cmd::Shaped(a) => table::run(a),
        Cmd::Paths(a) => paths_cmd::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softhca-impair: {e}");
            ExitCode::FAILURE
        }
    }
}
