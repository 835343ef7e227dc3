//! Command-line arguments (clap derive).

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::size::size_arg;
use softhca_perf::DEFAULT_PORT;

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
    /// One-shot benchmark suite on loopback: softhca bandwidth, latency and message rate
    /// against TCP and raw UDP (GSO+GRO) measured in the same run, as a table, JSON and SVG.
    ///
    /// Every measurement runs between two processes (this executable started twice).
    Bench(BenchArgs),
    /// Internal: one end of a `softhca bench` baseline measurement.
    #[command(hide = true)]
    BenchPeer(BenchPeerArgs),
    /// Stream synthetic camera frames to a host receiver on loopback: RC SEND, UC WRITE
    /// with immediate, or GigE Vision GVSP over UDP (`--compare`: all three).
    Stream(StreamArgs),
    /// Distance matrix between NICs, GPUs, NVMe and softhca devices with CPU and NUMA
    /// affinity, like `nvidia-smi topo -m`, read from /sys (no root needed).
    Topo(TopoArgs),
    /// The devices of running processes: QPs (state, peer, PSNs, outstanding work) and
    /// counters, like `rdma res show qp` and `rdma statistic`.
    Stat(StatArgs),
    /// Serve this node's devices, QPs, counters and topology over HTTP: a JSON REST API
    /// under /v1, Prometheus /metrics and /openapi.yaml.
    Agent(AgentArgs),
}

/// `softhca stat`.
#[derive(Debug, Args)]
pub struct StatArgs {
    /// Only this process's devices.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Print the snapshots as JSON (an array).
    #[arg(long)]
    pub json: bool,
    /// Read devices published in DIR (default: SOFTHCA_RUN_DIR, else the usual places).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Vec<std::path::PathBuf>,
}

/// `softhca agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Address to listen on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:9479")]
    pub listen: std::net::SocketAddr,
    /// Read devices published in DIR (default: SOFTHCA_RUN_DIR, else the usual places).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Vec<std::path::PathBuf>,
}

/// `softhca topo`.
#[derive(Debug, Args, Clone)]
pub struct TopoArgs {
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also show virtual interfaces (loopback, veth, bridges) nothing serves.
    #[arg(long)]
    pub all: bool,
    /// Read the sysfs tree below DIR instead of / (a captured tree).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub sysfs_root: std::path::PathBuf,
    /// Place softhca device NAME on interface NETDEV (repeatable); by default the device
    /// the SOFTHCA_* environment opens is placed, unless --sysfs-root is given.
    #[arg(long, value_name = "NAME=NETDEV")]
    pub device: Vec<String>,
}

/// `softhca bench`.
#[derive(Debug, Args, Clone)]
pub struct BenchArgs {
    /// Seconds per measurement (default 2, which keeps the whole run under 2 minutes).
    #[arg(short = 'D', long)]
    pub duration: Option<f64>,
    /// A short run for tests: tiny durations and one point of every kind.
    #[arg(long)]
    pub quick: bool,
    /// Write all results as one JSON document to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,
    /// Write bandwidth against message size as an SVG plot to FILE.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
    /// Instead of the softhca suite: UCX (ucx_perftest) and Open MPI over softhca against
    /// UCX's tcp transport and Open MPI's tcp BTL on the same loopback, side by side
    /// (needs ucx-utils, openmpi-bin, libopenmpi-dev, the drop-in libibverbs and UCX's
    /// device node; the MPI rows are left out without MPI).
    #[arg(long, conflicts_with = "plot")]
    pub middleware: bool,
    /// With --middleware: runs of each figure per transport, alternating.
    #[arg(long, default_value_t = 3, requires = "middleware")]
    pub runs: usize,
}

/// The baseline a `bench-peer` process measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeerKind {
    /// TCP bulk transfer.
    TcpStream,
    /// TCP request/echo round trips.
    TcpPingpong,
    /// UDP datagram/echo round trips.
    UdpPingpong,
    /// UDP round trips through softhca's socket setup: each message leaves as a GSO
    /// pair [message, ACK-sized segment] from a socket connected to the peer, received
    /// with GRO and cmsgs by `recvmmsg`.
    UdpPingpongRoce,
    /// Raw UDP with GSO and GRO (crates/io blast).
    UdpBlast,
    /// The raw UDP blast with a RoCEv2 ICRC sealed by the sender and checked by the
    /// receiver on every datagram.
    UdpBlastIcrc,
}

/// Which end of a baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeerRole {
    /// Listens (TCP) or binds (UDP), prints `READY <port>`, receives or echoes.
    Server,
    /// Connects to `--to` and drives the measurement for `--duration`.
    Client,
}

/// `softhca bench-peer` (hidden; started by `softhca bench`).
#[derive(Debug, Args, Clone)]
pub struct BenchPeerArgs {
    /// What to measure.
    #[arg(value_enum)]
    pub kind: PeerKind,
    /// Which end.
    #[arg(value_enum)]
    pub role: PeerRole,
    /// Server: local IP address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: std::net::IpAddr,
    /// Client: the server's address and port.
    #[arg(long)]
    pub to: Option<std::net::SocketAddr>,
    /// Message (or datagram) size in bytes.
    #[arg(short = 's', long, value_parser = size_arg, default_value = "4096")]
    pub size: u64,
    /// Seconds the client runs.
    #[arg(short = 'D', long, default_value_t = 1.0)]
    pub duration: f64,
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
    /// Run both ends from this command: a server child process and the client, on two
    /// free loopback addresses.
    #[arg(long)]
    pub loopback: bool,
    /// Latency test (ping-pong) instead of bandwidth.
    #[arg(long)]
    pub lat: bool,
    /// Message size: bytes, or with K, M, G (64K, 1M). Default 65536 (bw) / 2 (lat).
    #[arg(short = 's', long, value_parser = size_arg)]
    pub size: Option<u64>,
    /// Messages per QP (default 5000 bw, 1000 lat; `all` runs each test for a second).
    #[arg(short = 'n', long = "iters", conflicts_with = "duration")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a fixed count.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<f64>,
    /// Number of queue pairs (e.g. 1024 connected RC QPs on one device).
    #[arg(short = 'q', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub qps: u32,
    /// Every QP sends from and receives into the same buffer (bandwidth mode; by
    /// default each QP has its own, as in perftest). With many QPs this takes the
    /// memory the buffers stream through out of the comparison with one QP.
    #[arg(long, conflicts_with = "verify")]
    pub shared_buffer: bool,
    /// Bandwidth mode: sleep until a completion comes instead of spinning on the
    /// completion queue (perftest's --use_event). On a host with fewer cores than busy
    /// threads, a spinning application takes turns on the CPU with the datapath and
    /// its peer, and its completions come in bursts.
    #[arg(short = 'e', long)]
    pub events: bool,
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
    /// Client: also print the bandwidth of every interval of this many seconds to stderr
    /// (`interval <start> <end> <Gb/s>`, seconds from the start of the measured part),
    /// as `iperf3 -i` does; with `SOFTHCA_PERF_COUNTERS` set, each followed by the
    /// congestion state of every RC QP (`congestion <qpn> srtt ... window ...`).
    #[arg(long, value_name = "SECONDS")]
    pub interval: Option<f64>,
    /// Client: also print `progress <unix time> <bytes>` to stderr (bytes completed so
    /// far) at most every this many seconds, and at both ends of every longer pause
    /// between completions, so pauses are measured exactly (`softhca-impair paths`).
    #[arg(long, value_name = "SECONDS")]
    pub progress: Option<f64>,
    /// Server: keep serving clients after the first test.
    #[arg(long)]
    pub forever: bool,
}

/// Streaming mode of `softhca stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StreamMode {
    /// RC SEND into receive buffers the host posted.
    RcSend,
    /// UC RDMA WRITE into a host ring + WRITE-with-immediate per frame.
    UcWrite,
    /// GigE Vision stream packets over UDP with packet resend.
    Gvsp,
}

/// `softhca stream`.
#[derive(Debug, Args, Clone)]
pub struct StreamArgs {
    /// Run one end only (default: camera and receiver in this process on loopback).
    #[command(subcommand)]
    pub role: Option<StreamRole>,
    /// rc-send, uc-write or gvsp.
    #[arg(long, value_enum, default_value = "rc-send", global = true)]
    pub mode: StreamMode,
    /// Run the three modes back to back on the same frames and print a table.
    #[arg(long, global = true)]
    pub compare: bool,
    /// Frame width in pixels.
    #[arg(long, default_value_t = 2448, global = true)]
    pub width: u32,
    /// Frame height in rows.
    #[arg(long, default_value_t = 2048, global = true)]
    pub height: u32,
    /// Pixel format: mono8 or bayerrg8.
    #[arg(long, default_value = "mono8", global = true)]
    pub pixel: String,
    /// Frames per second (0: as fast as possible).
    #[arg(long, default_value_t = 0.0, global = true)]
    pub fps: f64,
    /// Frames per mode.
    #[arg(
        short = 'n',
        long,
        default_value_t = 100,
        conflicts_with = "duration",
        global = true
    )]
    pub frames: u64,
    /// Seconds per mode instead of a frame count.
    #[arg(short = 'D', long = "duration", global = true)]
    pub duration: Option<f64>,
    /// Drop packets at the sender with this probability (rc-send: in the camera's
    /// device, recovered by RC; uc-write and gvsp: by the camera).
    #[arg(long, default_value_t = 0.0, global = true)]
    pub loss: f64,
    /// Seed of the loss emulation.
    #[arg(long, default_value_t = 1, global = true)]
    pub seed: u64,
    /// Host ring slots (frame buffers).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=64), global = true)]
    pub ring: u32,
    /// GVSP packet size in bytes (IP header to end).
    #[arg(long, default_value_t = 9000, value_parser = clap::value_parser!(u32).range(576..=65500), global = true)]
    pub packet_size: u32,
    /// The camera does not wait for the host: a slow host drops the oldest frames.
    #[arg(long, global = true)]
    pub no_credits: bool,
    /// Do not check the received frames' pixels.
    #[arg(long, global = true)]
    pub no_verify: bool,
    /// Write the results as JSON to this file.
    #[arg(long, global = true)]
    pub json: Option<std::path::PathBuf>,
    /// Write the first complete frame as PNG.
    #[arg(long, global = true)]
    pub save_frame: Option<std::path::PathBuf>,
}

/// One end of a stream run, or a real GigE Vision camera.
#[derive(Debug, Subcommand, Clone)]
pub enum StreamRole {
    /// The camera end: connect to `softhca stream receive` at ADDR and stream to it.
    Camera {
        /// The receiver's control address, HOST[:PORT] (port 18516 by default).
        #[arg(long)]
        to: String,
        /// Local address to stream from (default: the route towards the receiver).
        #[arg(long)]
        bind: Option<std::net::IpAddr>,
    },
    /// The receiving host: wait for one camera, receive its frames, print the report.
    Receive {
        /// Address to listen on (TCP control) and receive at; its IP is the device's.
        #[arg(long, default_value = "127.0.0.1:18516")]
        listen: std::net::SocketAddr,
    },
    /// Receive GVSP frames from a real GigE Vision camera controlled over GVCP, e.g.
    /// Aravis's `arv-fake-gv-camera-0.8 -i 127.0.0.1`.
    Gige {
        /// The camera's address, HOST[:PORT] (GVCP port 3956 by default).
        #[arg(long, default_value = "127.0.0.1")]
        camera: String,
        /// Set the image size, WIDTHxHEIGHT (default: the camera's current size).
        #[arg(long)]
        size: Option<String>,
        /// Set the GVSP packet size (default: the camera's current one).
        #[arg(long)]
        gvsp_packet_size: Option<u32>,
        /// Set the frame rate where the camera has a frame-period register.
        #[arg(long)]
        rate: Option<f64>,
    },
}
