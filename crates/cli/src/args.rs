//! Command-line arguments (clap derive).

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::exchange::DEFAULT_PORT;
use crate::size::size_arg;

/// softhca: a user-space RoCEv2 RDMA device. Device information and perftest-style benchmarks.
#[derive(Debug, Parser)]
#[command(name = "softhca", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the device like ibv_devinfo: GUID, firmware, port state, MTU, GID table.
    Devinfo(DevinfoArgs),
    /// RDMA benchmarks like perftest (ib_send_bw, ib_write_lat, ...).
    ///
    /// Server: `softhca perf write`; client: `softhca perf write <server>`;
    /// both ends in one process: `softhca perf write --loopback`.
    Perf(PerfArgs),
}

/// `softhca devinfo`.
#[derive(Debug, Args)]
pub struct DevinfoArgs {
    /// Also print device attributes and all counters.
    #[arg(short, long)]
    pub verbose: bool,
}

/// The operation a perf test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PerfOp {
    /// SEND / RECV (ib_send_bw, ib_send_lat).
    Send,
    /// RDMA WRITE (ib_write_bw, ib_write_lat).
    Write,
    /// RDMA READ (ib_read_bw, ib_read_lat).
    Read,
    /// Atomic FETCH_AND_ADD (ib_atomic_bw, ib_atomic_lat).
    Atomic,
    /// send, write and read, bandwidth and latency, in one table.
    All,
}

impl PerfOp {
    /// The wire name used in the exchange and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            PerfOp::Send => "send",
            PerfOp::Write => "write",
            PerfOp::Read => "read",
            PerfOp::Atomic => "atomic",
            PerfOp::All => "all",
        }
    }
}

/// `softhca perf`.
#[derive(Debug, Args, Clone)]
pub struct PerfArgs {
    /// send, write, read, atomic or all.
    #[arg(value_enum)]
    pub op: PerfOp,
    /// Server address (client mode). Without it, wait for a client (server mode).
    pub server: Option<String>,
    /// TCP port of the connection exchange.
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Run server and client in this process (two devices on two loopback addresses).
    #[arg(long)]
    pub loopback: bool,
    /// Latency test (ping-pong) instead of bandwidth.
    #[arg(long)]
    pub lat: bool,
    /// Message size: bytes, or with K, M, G (64K, 1M). Default 65536 (bw) / 2 (lat).
    #[arg(short = 's', long, value_parser = size_arg)]
    pub size: Option<u64>,
    /// Messages per QP (default 5000 bw, 1000 lat).
    #[arg(short = 'n', long = "iters", conflicts_with = "duration")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a fixed count.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<f64>,
    /// Number of queue pairs.
    #[arg(short = 'q', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub qps: u32,
    /// Outstanding work requests per QP in bandwidth mode.
    #[arg(short = 't', long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub tx_depth: u32,
    /// Request a completion every N work requests (perftest's cq_mod).
    #[arg(short = 'Q', long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub cq_mod: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (default: the port's active MTU).
    #[arg(short = 'm', long)]
    pub mtu: Option<u32>,
    /// Check every received byte against a per-message pattern.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object per result instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Server: keep serving clients after the first test.
    #[arg(long)]
    pub forever: bool,
}
