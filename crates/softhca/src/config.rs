//! Device configuration: which addresses to serve, MTU, CPU, UDP port and idle policy.
//!
//! The same environment variables configure the Rust API, the C library and the CLI.
//! [`Config::from_env`] is the only place that reads them (the reporting switches
//! through [`Diagnostics::from_env`], which the C library and the CLI also call before
//! a device exists); [`ENV_VARS`] names each with its meaning, and a test keeps the
//! README's table equal to that list.
//!
//! "Automatic" addresses are described in [`crate::Context::open`].

use std::net::IpAddr;

use crate::error::Error;
use crate::Mtu;

/// What the datapath thread does when there is nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin forever: lowest latency, burns one core.
    Busy,
    /// Spin `spin_us` microseconds after the last activity, yielding the CPU at each turn
    /// to any thread waiting for it (`sched_yield`), then sleep in `epoll_wait` until a
    /// packet, a posted work request (doorbell) or the next timer deadline.
    Adaptive {
        /// How long to keep spinning after the last activity.
        spin_us: u32,
    },
    /// Sleep in `epoll_wait` as soon as there is nothing to do.
    Blocking,
}

impl Default for PollMode {
    /// [`PollMode::auto`].
    fn default() -> Self {
        PollMode::auto()
    }
}

/// Default spin time of [`PollMode::Adaptive`].
pub const DEFAULT_SPIN_US: u32 = 50;

impl PollMode {
    /// The default: `Adaptive { spin_us: 50 }`. Since application threads run the
    /// datapath themselves while they poll (datapath.rs), the datapath thread spins only
    /// for a peer whose application is not polling (e.g. the target of RDMA WRITEs), so
    /// spinning no longer starves anyone on small machines. Measured on a 2-core box
    /// (`softhca perf --loopback`, 64 KiB): WRITE 7.3 Gb/s adaptive vs 4.2 blocking,
    /// READ 8.5 vs 3.0; 8-byte SEND latency p50 17.6 µs either way. (Before inline
    /// progress, adaptive and busy polling were disastrous there: 24 ms p50 busy.)
    pub fn auto() -> PollMode {
        PollMode::Adaptive {
            spin_us: DEFAULT_SPIN_US,
        }
    }

    /// Parses `busy`, `adaptive`, `adaptive:<µs>`, `blocking` or `auto` (case-insensitive).
    pub fn parse(s: &str) -> Result<PollMode, Error> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "busy" | "spin" => Ok(PollMode::Busy),
            "blocking" | "block" | "epoll" => Ok(PollMode::Blocking),
            "adaptive" => Ok(PollMode::Adaptive {
                spin_us: DEFAULT_SPIN_US,
            }),
            "auto" | "" => Ok(PollMode::auto()),
            _ => match s.strip_prefix("adaptive:") {
                Some(us) => us
                    .parse::<u32>()
                    .map(|spin_us| PollMode::Adaptive { spin_us })
                    .map_err(|_| Error::Config(format!("SOFTHCA_POLL: bad spin time {us:?}"))),
                None => Err(Error::Config(format!(
                    "SOFTHCA_POLL: {s:?} is not busy, adaptive, adaptive:<us> or blocking"
                ))),
            },
        }
    }
}

/// Where to pin the datapath thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuPin {
    /// This CPU.
    Cpu(usize),
    /// A CPU this thread may run on (its affinity mask, so a container's cpuset), local
    /// to the served interface's NUMA node when /sys tells it; see
    /// [`crate::Placement`].
    Auto,
}

impl CpuPin {
    /// Parses a CPU number or `auto` (case-insensitive).
    pub fn parse(s: &str) -> Result<CpuPin, Error> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(CpuPin::Auto);
        }
        s.parse()
            .map(CpuPin::Cpu)
            .map_err(|_| Error::Config(format!("SOFTHCA_CPU: {s:?} is not a CPU number or auto")))
    }
}

/// Every environment variable softhca reads, with its meaning: the single list the
/// README's configuration table is checked against (`tests/env_vars.rs`).
pub const ENV_VARS: &[(&str, &str)] = &[
    ("SOFTHCA_ADDR", "comma-separated addresses to serve"),
    (
        "SOFTHCA_NETDEV",
        "serve this interface's addresses and send and receive only through it",
    ),
    ("SOFTHCA_PORT", "UDP port"),
    (
        "SOFTHCA_MTU",
        "largest path MTU (256, 512, 1024, 2048, 4096)",
    ),
    (
        "SOFTHCA_CPU",
        "pin the datapath thread to this CPU, or `auto`: an allowed CPU near the interface",
    ),
    ("SOFTHCA_POLL", "idle policy of the datapath thread"),
    ("SOFTHCA_GSO", "`0` turns UDP segmentation offload off"),
    ("SOFTHCA_GRO", "`0` turns UDP receive offload off"),
    ("SOFTHCA_NAME", "device name"),
    (
        "SOFTHCA_CONNECTED",
        "send from a socket connected to each peer (`0`: from the device socket only)",
    ),
    (
        "SOFTHCA_BUNDLE",
        "bundle packets of different sizes to a softhca peer into one datagram",
    ),
    (
        "SOFTHCA_JUMBO",
        "largest RC packet payload (SEND, WRITE, READ response) offered to a softhca peer above the MTU of 4096 (a multiple of 512 up to 65024; 0: none), within the interface MTU",
    ),
    (
        "SOFTHCA_WRITE_SPLIT",
        "send a multi-packet RC RDMA WRITE as one WRITE Only per packet",
    ),
    (
        "SOFTHCA_DIRECT_RX",
        "`0` receives every datagram into a buffer first (default: in-order SEND, WRITE and READ response payload straight into registered memory)",
    ),
    ("SOFTHCA_CC", "`0` turns congestion control of RC QPs off"),
    (
        "SOFTHCA_UC_UD_RATE",
        "the most each UC and UD QP sends, bits per second (`100M`, `1G`)",
    ),
    (
        "SOFTHCA_MP",
        "`0` turns the multipath RC extension off (plain RC always); on by default, negotiated per QP, used only with a softhca peer",
    ),
    (
        "SOFTHCA_MP_ADDRS",
        "comma-separated local addresses multipath may use (default: every served address)",
    ),
    (
        "SOFTHCA_MP_SPORTS",
        "UDP source ports per address pair for multipath (ECMP entropy), default 1",
    ),
    (
        "SOFTHCA_TX_DROP",
        "fault injection: drop each outgoing packet with this probability",
    ),
    ("SOFTHCA_SOCKBUF", "UDP send buffer bytes (the receive buffer is sixteen times it)"),
    (
        "SOFTHCA_STATS",
        "print a device's counters and turnaround phases when it closes",
    ),
    (
        "SOFTHCA_IBV_DEBUG",
        "the C library prints why a verb failed",
    ),
    (
        "SOFTHCA_PERF_COUNTERS",
        "`softhca perf` prints each device's non-zero counters",
    ),
    ("SOFTHCA_LOG", "tracing filter of the CLI"),
    (
        "SOFTHCA_RDMACM_DEBUG",
        "the drop-in librdmacm prints why a call failed",
    ),
    (
        "SOFTHCA_RUN_DIR",
        "where devices publish their state for `softhca stat` and `softhca agent` (`off`: nowhere), and softhca-k8s writes k8s-allocations.json",
    ),
];

/// Default of [`Config::sockbuf`]: 16 MiB, room for a burst of 64 KiB GSO sends.
pub const DEFAULT_SOCKBUF: usize = 16 << 20;

/// Switches that make softhca report on itself. Reading them never fails, so they work
/// even when the rest of the configuration does not parse (the C library then still
/// says why a verb failed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics {
    /// `SOFTHCA_STATS`: print a device's non-zero counters to stderr when it closes, and
    /// at process exit for devices still open, with the phases of its turnarounds.
    pub stats: bool,
    /// `SOFTHCA_IBV_DEBUG`: the C library prints each failure before it becomes an errno.
    pub ibv_debug: bool,
    /// `SOFTHCA_PERF_COUNTERS`: `softhca perf` prints each device's non-zero counters.
    pub perf_counters: bool,
    /// `SOFTHCA_LOG`: the CLI's tracing filter (e.g. `softhca=debug`); `None`: no logs.
    pub log: Option<String>,
}

impl Diagnostics {
    /// The switches the environment sets (any value, even empty, turns one on).
    pub fn from_env() -> Diagnostics {
        let set = |name: &str| std::env::var_os(name).is_some();
        Diagnostics {
            stats: set("SOFTHCA_STATS"),
            ibv_debug: set("SOFTHCA_IBV_DEBUG"),
            perf_counters: set("SOFTHCA_PERF_COUNTERS"),
            log: std::env::var("SOFTHCA_LOG").ok(),
        }
    }
}

/// How to open a device. Build one with [`Config::from_env`], [`Config::loopback`] or
/// [`Config::default`] and adjust fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Serve exactly these addresses (empty: choose automatically, see
    /// [`crate::Context::open`]).
    pub addrs: Vec<IpAddr>,
    /// Serve the addresses of this interface (ignored when `addrs` is not empty).
    pub netdev: Option<String>,
    /// Largest path MTU; the active MTU is this or less if an interface needs it.
    pub mtu: Mtu,
    /// Pin the datapath thread (`None`: let the scheduler place it).
    pub cpu: Option<CpuPin>,
    /// UDP port to bind and to send to (RoCEv2: 4791).
    pub udp_port: u16,
    /// Idle policy of the datapath thread.
    pub poll: PollMode,
    /// Device name (`ibv_get_device_name`).
    pub name: String,
    /// Fault injection: drop each outgoing packet with this probability, in parts per
    /// million (the packet is counted and never handed to the kernel), so recovery can
    /// be exercised on any host without netem. 0 in normal use.
    pub tx_drop_ppm: u32,
    /// Send each packet of a multi-packet RC RDMA WRITE (no immediate) as a WRITE Only
    /// for its part, so that a whole WRITE leaves in one GSO batch; `false` sends
    /// First/Middle/Last as rxe does. The transport's `EngineConfig::split_rc_writes`
    /// says what the peer sees differently.
    pub split_writes: bool,
    /// Receive the payload of in-order SEND and WRITE packets of a message in progress,
    /// and of READ responses, straight into registered memory (the transport's `direct`
    /// module), instead of into a buffer and then copying it. It turns itself off while
    /// what arrives cannot be planned (small messages, WRITE Only packets).
    pub direct_rx: bool,
    /// Congestion control of RC QPs: a delay-driven window and pacing, decided by the
    /// sender alone (`softhca_transport::cc`); `false` sends as fast as the window
    /// of 1024 PSNs allows, as rxe does.
    pub congestion_control: bool,
    /// The most each UC and UD QP sends, bits per second on the wire; None: as fast as
    /// the application posts, as rxe does. They have no ACKs, so nothing else slows
    /// them down on a slow or shared link.
    pub uc_ud_rate: Option<u64>,
    /// Send each transmit through a UDP socket connected to its peer, one per peer,
    /// which spares the kernel a route lookup per datagram (about 0.4 µs of an 8 B half
    /// round trip, or of a 64 KiB GSO send); see the datapath's `senders` module. Off
    /// under fault injection.
    pub connected_senders: bool,
    /// Bundle packets to a softhca peer that offers it (`SOFTHCA_BUNDLE`): a batch's
    /// packets to one peer leave as few datagrams as the interface MTU allows, however
    /// their sizes differ (`softhca_wire::bundle`); offered and learned through the
    /// multipath negotiation, so rxe and any other peer get plain packets.
    pub bundle: bool,
    /// The largest request packet payload an RC QP offers a softhca peer above the
    /// IBTA's 4096 (a multiple of 512; 0: none), as far as the interfaces' MTU allows
    /// (`EngineConfig::jumbo_mtu`). Negotiated with multipath, so rxe never sees one.
    pub jumbo: u64,
    /// Try UDP segmentation offload (`UDP_SEGMENT`) on the device's sockets; it is
    /// still probed, and off when the kernel refuses it.
    pub gso: bool,
    /// Try UDP receive offload (`UDP_GRO`), probed likewise.
    pub gro: bool,
    /// Send buffer bytes asked of each socket, a quarter of the receive buffer's (forced
    /// when privileged).
    pub sockbuf: usize,
    /// The multipath RC extension (`SOFTHCA_MP`, `SOFTHCA_MP_ADDRS`,
    /// `SOFTHCA_MP_SPORTS`): negotiated per RC QP with a softhca peer, which then
    /// sprays over every usable pair of both sides' addresses (`softhca_transport::
    /// multipath`); any other peer gets plain RC.
    pub multipath: softhca_transport::MpConfig,
    /// Reporting switches ([`Diagnostics`]).
    pub diagnostics: Diagnostics,
    /// Where the device publishes its state for other processes (`SOFTHCA_RUN_DIR`).
    pub publish: crate::publish::Publish,
}

/// The RoCEv2 UDP destination port (IBTA Annex A17.2.3).
pub const ROCE_UDP_PORT: u16 = 4791;

impl Default for Config {
    /// Automatic addresses, MTU 4096, no pinning, port 4791, [`PollMode::auto`], `softhca0`.
    fn default() -> Self {
        Config {
            addrs: Vec::new(),
            netdev: None,
            mtu: Mtu::M4096,
            cpu: None,
            udp_port: ROCE_UDP_PORT,
            poll: PollMode::default(),
            name: "softhca0".to_string(),
            tx_drop_ppm: 0,
            split_writes: true,
            direct_rx: true,
            congestion_control: true,
            uc_ud_rate: None,
            connected_senders: true,
            bundle: true,
            jumbo: DEFAULT_JUMBO,
            gso: true,
            gro: true,
            sockbuf: DEFAULT_SOCKBUF,
            multipath: softhca_transport::MpConfig::default(),
            diagnostics: Diagnostics::default(),
            publish: crate::publish::Publish::default(),
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// A switch given as `0` or `1`.
/// `1000000`, `100k`, `100M`, `2.5G`: bits per second, more than zero.
/// The default of [`Config::jumbo`]: on loopback, 64 KiB messages moved fastest in
/// packets of 16 KiB (three to a GSO datagram), ahead of 32 KiB and of 4 KiB.
pub const DEFAULT_JUMBO: u64 = 16384;

/// `SOFTHCA_JUMBO`: 0, or a multiple of 512 from 4608 to 65024 (what a READ request can
/// name, see `softhca_transport::JUMBO_UNIT`).
fn jumbo_bytes(v: &str) -> Result<u64, Error> {
    v.parse::<u64>()
        .ok()
        .filter(|&n| n == 0 || (n.is_multiple_of(512) && (4608..=65024).contains(&n)))
        .ok_or_else(|| {
            Error::Config(format!(
                "SOFTHCA_JUMBO: {v:?} is not 0 or a multiple of 512 from 4608 to 65024"
            ))
        })
}

fn bits_per_second(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, scale) = match v.char_indices().last()? {
        (i, 'k' | 'K') => (&v[..i], 1e3),
        (i, 'm' | 'M') => (&v[..i], 1e6),
        (i, 'g' | 'G') => (&v[..i], 1e9),
        _ => (v, 1.0),
    };
    let bits = num.parse::<f64>().ok()? * scale;
    (bits.is_finite() && bits >= 1.0).then_some(bits as u64)
}

fn zero_or_one(name: &str, v: &str) -> Result<bool, Error> {
    match v {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(Error::Config(format!("{name}: {v:?} is not 0 or 1"))),
    }
}

/// An offload switch: `0`, `off`, `false` or `no` turn it off, anything else leaves it on.
fn not_disabled(v: &str) -> bool {
    !matches!(
        v.to_ascii_lowercase().as_str(),
        "0" | "off" | "false" | "no"
    )
}

/// A comma-separated list of IP addresses.
fn parse_addrs(name: &str, v: &str) -> Result<Vec<IpAddr>, Error> {
    v.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            a.parse::<IpAddr>()
                .map_err(|_| Error::Config(format!("{name}: {a:?} is not an IP address")))
        })
        .collect()
}

/// The device's sockets as [`Config`] asks for them.
impl From<&Config> for softhca_io::BindOptions {
    fn from(cfg: &Config) -> Self {
        softhca_io::BindOptions {
            allow_gso: cfg.gso,
            allow_gro: cfg.gro,
            // The GRH of a UD receive carries the packet's TOS, as rxe's does.
            recv_tos: true,
            sockbuf: cfg.sockbuf,
            bind_ifindex: 0,
        }
    }
}

impl Config {
    /// The configuration the environment asks for (see [`ENV_VARS`]).
    pub fn from_env() -> Result<Config, Error> {
        Self::from_env_with(Config::default())
    }

    /// `defaults` with what the environment sets on top: for a program whose defaults
    /// differ from a device's (e.g. blocking poll) but that still obeys `SOFTHCA_*`.
    pub fn from_env_with(defaults: Config) -> Result<Config, Error> {
        let mut cfg = defaults;
        if let Some(v) = env("SOFTHCA_ADDR") {
            cfg.addrs.extend(parse_addrs("SOFTHCA_ADDR", &v)?);
        }
        if let Some(v) = env("SOFTHCA_NETDEV") {
            cfg.netdev = Some(v);
        }
        if let Some(v) = env("SOFTHCA_MTU") {
            cfg.mtu = v
                .parse::<usize>()
                .ok()
                .and_then(|b| Mtu::from_bytes(b).filter(|m| m.bytes() == b))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "SOFTHCA_MTU: {v:?} is not 256, 512, 1024, 2048 or 4096"
                    ))
                })?;
        }
        if let Some(v) = env("SOFTHCA_CPU") {
            cfg.cpu = Some(CpuPin::parse(&v)?);
        }
        if let Some(v) = env("SOFTHCA_PORT") {
            cfg.udp_port =
                v.parse().ok().filter(|p| *p != 0).ok_or_else(|| {
                    Error::Config(format!("SOFTHCA_PORT: {v:?} is not a UDP port"))
                })?;
        }
        // Set but empty means `auto`, as `PollMode::parse` reads it.
        if let Ok(v) = std::env::var("SOFTHCA_POLL") {
            cfg.poll = PollMode::parse(&v)?;
        }
        if let Some(v) = env("SOFTHCA_NAME") {
            cfg.name = v;
        }
        if let Some(v) = env("SOFTHCA_TX_DROP") {
            let p = v
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..1.0).contains(p))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "SOFTHCA_TX_DROP: {v:?} is not a probability in [0, 1)"
                    ))
                })?;
            cfg.tx_drop_ppm = (p * 1e6).round() as u32;
        }
        // The on/off switches: 0 or 1.
        for (name, switch) in [
            ("SOFTHCA_CC", &mut cfg.congestion_control),
            ("SOFTHCA_WRITE_SPLIT", &mut cfg.split_writes),
            ("SOFTHCA_DIRECT_RX", &mut cfg.direct_rx),
            ("SOFTHCA_CONNECTED", &mut cfg.connected_senders),
            ("SOFTHCA_BUNDLE", &mut cfg.bundle),
            ("SOFTHCA_MP", &mut cfg.multipath.enabled),
        ] {
            if let Some(v) = env(name) {
                *switch = zero_or_one(name, &v)?;
            }
        }
        if let Some(v) = env("SOFTHCA_JUMBO") {
            cfg.jumbo = jumbo_bytes(&v)?;
        }
        if let Some(v) = env("SOFTHCA_UC_UD_RATE") {
            cfg.uc_ud_rate = Some(bits_per_second(&v).ok_or_else(|| {
                Error::Config(format!(
                    "SOFTHCA_UC_UD_RATE: {v:?} is not a rate in bits per second (100M, 1G)"
                ))
            })?);
        }
        if let Some(v) = env("SOFTHCA_GSO") {
            cfg.gso = not_disabled(&v);
        }
        if let Some(v) = env("SOFTHCA_GRO") {
            cfg.gro = not_disabled(&v);
        }
        // A value that is not a byte count keeps the default, as it always has.
        if let Some(n) = env("SOFTHCA_SOCKBUF").and_then(|v| v.parse::<usize>().ok()) {
            cfg.sockbuf = n;
        }
        if let Some(v) = env("SOFTHCA_MP_ADDRS") {
            cfg.multipath.addrs = parse_addrs("SOFTHCA_MP_ADDRS", &v)?;
        }
        if let Some(v) = env("SOFTHCA_MP_SPORTS") {
            cfg.multipath.sports = v
                .parse::<u8>()
                .ok()
                .filter(|n| (1..=16).contains(n))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "SOFTHCA_MP_SPORTS: {v:?} is not a count from 1 to 16"
                    ))
                })?;
        }
        if let Some(v) = env("SOFTHCA_RUN_DIR") {
            cfg.publish = crate::publish::Publish::parse(&v);
        }
        cfg.diagnostics = Diagnostics::from_env();
        Ok(cfg)
    }

    /// A device serving exactly `addr` (e.g. `127.0.0.2`), everything else default.
    pub fn loopback(addr: IpAddr) -> Config {
        Config {
            addrs: vec![addr],
            ..Config::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumbo_sizes_are_multiples_of_512_a_read_can_name() {
        for ok in [0, 4608, 8704, 16384, 65024] {
            assert_eq!(jumbo_bytes(&ok.to_string()).unwrap(), ok);
        }
        for bad in ["4096", "5000", "65536", "16k", "-1"] {
            assert!(jumbo_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_in_bits_per_second() {
        assert_eq!(bits_per_second("100M"), Some(100_000_000));
        assert_eq!(bits_per_second("2.5G"), Some(2_500_000_000));
        assert_eq!(bits_per_second("64k"), Some(64_000));
        assert_eq!(bits_per_second("1000"), Some(1000));
        assert_eq!(bits_per_second("0"), None);
        assert_eq!(bits_per_second("fast"), None);
        assert_eq!(bits_per_second("G"), None);
    }

    #[test]
    fn poll_mode_parse() {
        assert_eq!(PollMode::parse("busy").unwrap(), PollMode::Busy);
        assert_eq!(PollMode::parse("Blocking").unwrap(), PollMode::Blocking);
        assert_eq!(
            PollMode::parse("adaptive").unwrap(),
            PollMode::Adaptive { spin_us: 50 }
        );
        assert_eq!(
            PollMode::parse("adaptive:7").unwrap(),
            PollMode::Adaptive { spin_us: 7 }
        );
        assert!(PollMode::parse("sometimes").is_err());
    }

    #[test]
    fn offload_switches_and_bind_options() {
        for off in ["0", "off", "FALSE", "no"] {
            assert!(!not_disabled(off), "{off}");
        }
        for on in ["1", "on", "yes", "2"] {
            assert!(not_disabled(on), "{on}");
        }
        let cfg = Config {
            gso: false,
            sockbuf: 1 << 20,
            ..Config::default()
        };
        let b = softhca_io::BindOptions::from(&cfg);
        assert_eq!(
            (b.allow_gso, b.allow_gro, b.recv_tos, b.sockbuf),
            (false, true, true, 1 << 20)
        );
        assert_eq!(Config::default().sockbuf, DEFAULT_SOCKBUF);
    }

    #[test]
    fn cpu_pin_parse() {
        assert_eq!(CpuPin::parse("3").unwrap(), CpuPin::Cpu(3));
        assert_eq!(CpuPin::parse(" Auto ").unwrap(), CpuPin::Auto);
        assert!(CpuPin::parse("near").is_err());
        assert!(CpuPin::parse("-1").is_err());
    }

    #[test]
    fn loopback_config() {
        let c = Config::loopback("127.0.0.9".parse().unwrap());
        assert_eq!(c.addrs.len(), 1);
        assert_eq!(c.udp_port, 4791);
        assert_eq!(c.mtu, Mtu::M4096);
    }
}
