//! A userspace impairment link between two network namespaces, for softhca's fault tests.
//!
//! This kernel has no `netem` qdisc, so impairments are applied by a forwarder we own:
//! each namespace gets a tap device whose file descriptor stays in this process, and two
//! threads (one per direction) move Ethernet frames between the taps, applying seeded
//! loss, delay with jitter (which reorders), duplication and bit corruption. Frames are
//! never rewritten except for the corrupted bit (and, for a corrupted UDP datagram, its
//! checksum — see [`Impairment::corrupt`]), so RoCEv2's ICRC, which covers the
//! addresses, stays valid on every untouched frame.
//!
//! ```no_run
//! use softhca_testbed::*;
//! use std::time::Duration;
//! # fn main() -> Result<(), TestbedError> {
//! let link = Link::up(LinkConfig {
//!     impairment: Impairment { loss: 0.01, delay: Duration::from_millis(1), ..Impairment::NONE },
//!     ..LinkConfig::default()
//! })?;
//! let out = link.command(End::A, "ping").args(["-c1", &link.addr(End::B).to_string()]).output()?;
//! link.set_impairment(Impairment::PARTITION); // drop everything from now on
//! # Ok(()) }
//! ```
//!
//! [`Veth`] is the plain alternative: a veth pair between two namespaces (or both ends in
//! one), for tests that need real interfaces rather than faults.
//!
//! Everything here needs root and iproute2's `ip`; [`check_available`] says whether this
//! host can run it, so tests can skip with a clear message elsewhere.
#![warn(missing_docs)]

pub mod capture;
mod forward;
pub mod mptcp;
pub mod paths;
pub mod shaped;
mod tap;
mod veth;

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

pub use forward::{corrupt_frame, DirectionStats};
pub use paths::{Direction, Fault, PathStats, Paths};
pub use shaped::{QdiscStats, Shape, ShapedLink};
pub use veth::{Veth, VethLayout};

/// Why the link could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// Network namespaces and tap devices need root.
    #[error("needs root (effective uid is {0})")]
    NotRoot(u32),
    /// iproute2's `ip` is not installed or does not run.
    #[error("iproute2 `ip` is missing")]
    NoIp,
    /// An `ip` command failed.
    #[error("`{cmd}` failed: {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A name is too long for an interface (15 bytes) or has odd characters.
    #[error("invalid link name {0:?} (1..=12 of [a-zA-Z0-9_-])")]
    BadName(String),
    /// A system call failed (opening /dev/net/tun, spawning a thread, ...).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What the link does to every frame, in each direction independently.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Impairment {
    /// Probability that a frame is dropped (0.0 ..= 1.0; 1.0 is a partition).
    pub loss: f64,
    /// Fixed one-way delay.
    pub delay: Duration,
    /// Each frame's delay is uniform in `delay ± jitter` (clamped at 0); frames whose
    /// deadlines cross are delivered out of order.
    pub jitter: Duration,
    /// Probability that a frame is delivered twice (the copy gets its own delay).
    pub dup: f64,
    /// Probability that one bit of a frame is flipped. In a UDP datagram the bit is
    /// flipped in the UDP payload and the UDP checksum (if not zero) is recomputed, so
    /// the kernel delivers it and the receiver's ICRC check is what must catch it (as a
    /// bit error behind a NIC that offloads checksums would look).
    pub corrupt: f64,
}

impl Impairment {
    /// A clean link.
    pub const NONE: Impairment = Impairment {
        loss: 0.0,
        delay: Duration::ZERO,
        jitter: Duration::ZERO,
        dup: 0.0,
        corrupt: 0.0,
    };
    /// Every frame dropped.
    pub const PARTITION: Impairment = Impairment {
        loss: 1.0,
        ..Impairment::NONE
    };
}

impl Default for Impairment {
    fn default() -> Impairment {
        Impairment::NONE
    }
}

/// How to build a [`Link`].
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Base name of the namespaces (`<name>-a`, `<name>-b`) and taps (`<name>a`,
    /// `<name>b`). `None`: unique per process and link, so tests can run in parallel.
    pub name: Option<String>,
    /// Initial impairment (change it later with [`Link::set_impairment`]).
    pub impairment: Impairment,
    /// RNG seed; each direction uses its own stream derived from it.
    pub seed: u64,
    /// Interface MTU of both taps. 9000 lets RoCE use a 4096-byte path MTU.
    pub mtu: u32,
    /// Most frames held back for delay per direction; beyond it frames are dropped and
    /// counted in [`DirectionStats::overflow`] (a router queue's tail drop).
    pub queue_limit: usize,
}

impl Default for LinkConfig {
    fn default() -> LinkConfig {
        LinkConfig {
            name: None,
            impairment: Impairment::NONE,
            seed: 1,
            mtu: 9000,
            queue_limit: 65536,
        }
    }
}

/// One end of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Namespace `<name>-a`, address 10.99.0.1.
    A,
    /// Namespace `<name>-b`, address 10.99.0.2.
    B,
}

/// Shared state between the [`Link`] and its forwarder threads.
pub(crate) struct Shared {
    pub(crate) impairment: Mutex<Impairment>,
    pub(crate) stop: AtomicBool,
    pub(crate) queue_limit: usize,
}

/// Two network namespaces joined by the impairment forwarder. Dropping it stops the
/// forwarder and deletes both namespaces (and with them the taps).
pub struct Link {
    name: String,
    shared: Arc<Shared>,
    stats: [Arc<DirectionStats>; 2],
    threads: Vec<JoinHandle<()>>,
    namespaces_made: bool,
}

/// Says whether this host can build links: root and a working `ip`.
pub fn check_available() -> Result<(), TestbedError> {
    // SAFETY: geteuid has no preconditions and touches no memory.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Err(TestbedError::NotRoot(uid));
    }
    let ok = Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Err(TestbedError::NoIp);
    }
    Ok(())
}

/// Runs `ip ARGS`, returning its stderr as the error.
pub fn ip(args: &[&str]) -> Result<(), TestbedError> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(TestbedError::Command {
            cmd: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Runs `f` on a new thread that entered network namespace `ns` (`ip netns` name):
/// `setns` changes only the calling thread, and the sockets and threads `f` creates stay
/// in that namespace. The thread panics if the namespace cannot be entered.
pub fn spawn_in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path)
            .unwrap_or_else(|e| panic!("open network namespace {path}: {e}"));
        // SAFETY: a valid namespace fd; setns affects only this thread.
        let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
}

fn unique_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("shi{}n{n}", std::process::id() % 100_000)
}

fn valid_name(name: &str) -> bool {
    (1..=12).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

const MAC_A: &str = "02:53:48:43:41:01";
const MAC_B: &str = "02:53:48:43:41:02";

impl Link {
    /// The address of end `a` (10.99.0.1) and `b` (10.99.0.2), on a /24.
    pub fn addr(&self, end: End) -> IpAddr {
        IpAddr::V4(match end {
            End::A => Ipv4Addr::new(10, 99, 0, 1),
            End::B => Ipv4Addr::new(10, 99, 0, 2),
        })
    }

    /// The namespace name of `end`.
    pub fn netns(&self, end: End) -> String {
        netns_name(&self.name, end)
    }

    /// The base name (see [`LinkConfig::name`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates both namespaces and taps and starts the forwarder.
    pub fn up(cfg: LinkConfig) -> Result<Link, TestbedError> {
        check_available()?;
        let name = cfg.name.clone().unwrap_or_else(unique_name);
        if !valid_name(&name) {
            return Err(TestbedError::BadName(name));
        }
        let shared = Arc::new(Shared {
            impairment: Mutex::new(cfg.impairment),
            stop: AtomicBool::new(false),
            queue_limit: cfg.queue_limit.max(1),
        });
        let mut link = Link {
            name,
            shared,
            stats: Default::default(),
            threads: Vec::new(),
            namespaces_made: false,
        };
        // From here on, Drop cleans up whatever was made if a step fails.
        let (na, nb) = (link.netns(End::A), link.netns(End::B));
        ip(&["netns", "add", &na])?;
        link.namespaces_made = true;
        ip(&["netns", "add", &nb])?;
        let (ta, tb) = (format!("{}a", link.name), format!("{}b", link.name));
        let fa = Arc::new(tap::open(&ta)?);
        let fb = Arc::new(tap::open(&tb)?);
        let mtu = cfg.mtu.to_string();
        for (ns, tapn, mac, addr, peer, peer_mac) in [
            (&na, &ta, MAC_A, "10.99.0.1/24", "10.99.0.2", MAC_B),
            (&nb, &tb, MAC_B, "10.99.0.2/24", "10.99.0.1", MAC_A),
        ] {
            ip(&["link", "set", tapn, "netns", ns])?;
            // No IPv6 on the link: router solicitations and MLD reports would only add
            // noise frames to the impaired path (and an fe80 GID the tests never use).
            let _ = Command::new("ip")
                .args(["netns", "exec", ns, "sysctl", "-qw"])
                .arg(format!("net.ipv6.conf.{tapn}.disable_ipv6=1"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            ip(&["-n", ns, "link", "set", tapn, "address", mac, "mtu", &mtu])?;
            ip(&["-n", ns, "addr", "add", addr, "dev", tapn])?;
            ip(&["-n", ns, "link", "set", tapn, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            // Static neighbours: a partition must not also break ARP for the time after.
            ip(&[
                "-n",
                ns,
                "neigh",
                "replace",
                peer,
                "lladdr",
                peer_mac,
                "dev",
                tapn,
                "nud",
                "permanent",
            ])?;
        }
        link.spawn(fa.clone(), fb.clone(), 0, cfg.seed)?;
        link.spawn(fb, fa, 1, cfg.seed)?;
        Ok(link)
    }

    fn spawn(
        &mut self,
        from: Arc<OwnedFd>,
        to: Arc<OwnedFd>,
        dir: usize,
        seed: u64,
    ) -> Result<(), TestbedError> {
        let shared = self.shared.clone();
        let stats = self.stats[dir].clone();
        let seed = seed ^ (dir as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let h = std::thread::Builder::new()
            .name(format!("impair-{}", if dir == 0 { "a2b" } else { "b2a" }))
            .spawn(move || forward::run(&from, &to, &shared, &stats, seed))?;
        self.threads.push(h);
        Ok(())
    }

    /// Changes the impairment of both directions, effective for the next frame read.
    pub fn set_impairment(&self, imp: Impairment) {
        *self.shared.impairment.lock() = imp;
    }

    /// The current impairment.
    pub fn impairment(&self) -> Impairment {
        *self.shared.impairment.lock()
    }

    /// Frame counts of the direction `from` → other end.
    pub fn stats(&self, from: End) -> &DirectionStats {
        match from {
            End::A => &self.stats[0],
            End::B => &self.stats[1],
        }
    }

    /// `ip netns exec <ns of end> <program>`: add arguments and run it.
    pub fn command(&self, end: End, program: impl AsRef<OsStr>) -> Command {
        netns_command(&self.netns(end), program.as_ref())
    }
}

/// Two namespaces joined by some link: where to run a program and each end's address.
pub trait Ends {
    /// `program` to run in the namespace of `end`.
    fn command_in(&self, end: End, program: &OsStr) -> Command;
    /// The address of `end`.
    fn addr_of(&self, end: End) -> IpAddr;
}

impl Ends for Link {
    fn command_in(&self, end: End, program: &OsStr) -> Command {
        self.command(end, program)
    }
    fn addr_of(&self, end: End) -> IpAddr {
        self.addr(end)
    }
}

impl Ends for ShapedLink {
    fn command_in(&self, end: End, program: &OsStr) -> Command {
        self.command(end, program)
    }
    fn addr_of(&self, end: End) -> IpAddr {
        self.addr(end)
    }
}

/// Path 0's addresses: where a single-path client reaches the other end.
impl Ends for Paths {
    fn command_in(&self, end: End, program: &OsStr) -> Command {
        self.command(end, program)
    }
    fn addr_of(&self, end: End) -> IpAddr {
        IpAddr::V4(self.addr(end, 0))
    }
}

/// `ip netns exec <ns> <program>`.
pub(crate) fn netns_command(ns: &str, program: &OsStr) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// The namespace name of `end` of a link named `name`.
pub fn netns_name(name: &str, end: End) -> String {
    match end {
        End::A => format!("{name}-a"),
        End::B => format!("{name}-b"),
    }
}

/// Deletes the namespaces of a link named `name` (what `softhca-impair down` does after
/// its forwarder is gone). Missing namespaces are not an error.
pub fn remove_namespaces(name: &str) {
    for end in [End::A, End::B] {
        let _ = ip(&["netns", "del", &netns_name(name, end)]);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if self.namespaces_made {
            remove_namespaces(&self.name);
        }
    }
}
