//! A link shaped by a token bucket: two namespaces joined by a veth pair (or, with a
//! delay, by the impairment forwarder's taps), `tc qdisc ... tbf` on both ends, as a
//! 1 GbE or slower bottleneck with a tail-dropping queue looks to a sender.

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::{ip, netns_name, remove_namespaces, End, Impairment, Link, LinkConfig, TestbedError};

/// How the link is shaped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Token bucket rate, bits per second, on both ends.
    pub rate: u64,
    /// One-way delay added by the forwarder (zero: a plain veth pair).
    pub delay: Duration,
}

impl Shape {
    /// `1 Gb/s`, `100 Mb/s + 5 ms`.
    pub fn label(&self) -> String {
        let rate = if self.rate >= 1_000_000_000 {
            format!("{} Gb/s", self.rate as f64 / 1e9)
        } else {
            format!("{} Mb/s", self.rate / 1_000_000)
        };
        if self.delay.is_zero() {
            rate
        } else {
            format!("{rate} + {} ms", self.delay.as_millis())
        }
    }
}

/// A token bucket qdisc's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QdiscStats {
    /// Packets it sent.
    pub sent: u64,
    /// Bytes it sent: whole Ethernet frames as the token bucket counts them (`skb->len`
    /// at the qdisc, the 14-byte header included; no preamble, FCS or gap), each
    /// segment's headers counted for a GSO packet.
    pub bytes: u64,
    /// Packets it dropped (queue full).
    pub dropped: u64,
}

/// Two namespaces joined by a shaped link; dropping it deletes them.
pub struct ShapedLink {
    name: String,
    shape: Shape,
    /// The forwarder, when the link has a delay.
    forwarder: Option<Link>,
}

/// A name unique per process and link (`shcc` + pid + counter, at most 12 bytes).
fn unique_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("shcc{}s{n}", std::process::id() % 100_000)
}

impl ShapedLink {
    /// Builds the link (root only: see [`crate::check_available`]).
    pub fn up(shape: Shape) -> Result<ShapedLink, TestbedError> {
        Self::up_named(shape, &unique_name())
    }

    /// Builds the link with namespaces `<name>-a`, `<name>-b` and devices `<name>a`,
    /// `<name>b` (at most 12 bytes of letters, digits, `-` and `_`), so that runs in
    /// parallel keep apart; leftovers of a killed run with the name are removed first.
    pub fn up_named(shape: Shape, name: &str) -> Result<ShapedLink, TestbedError> {
        crate::check_available()?;
        if !crate::valid_name(name) {
            return Err(TestbedError::BadName(name.to_owned()));
        }
        remove_namespaces(name);
        let name = name.to_owned();
        let forwarder = if shape.delay.is_zero() {
            None
        } else {
            Some(Link::up(LinkConfig {
                name: Some(name.clone()),
                impairment: Impairment {
                    delay: shape.delay,
                    ..Impairment::NONE
                },
                ..LinkConfig::default()
            })?)
        };
        let link = ShapedLink {
            name,
            shape,
            forwarder,
        };
        if link.forwarder.is_none() {
            link.veth()?;
        }
        for end in [End::A, End::B] {
            let rate = format!("{}bit", shape.rate);
            let dev = link.dev(end);
            let args = ["qdisc", "add", "dev", &dev, "root", "tbf", "rate", &rate];
            let tail = ["burst", "256kb", "latency", "5ms"];
            link.run(end, "tc", args.iter().chain(tail.iter()))?;
        }
        Ok(link)
    }

    /// The veth pair (addresses as the forwarder's: 10.99.0.1 and .2).
    fn veth(&self) -> Result<(), TestbedError> {
        let (na, nb) = (self.netns(End::A), self.netns(End::B));
        ip(&["netns", "add", &na])?;
        ip(&["netns", "add", &nb])?;
        let (va, vb) = (self.dev(End::A), self.dev(End::B));
        let (aa, ab) = (Ipv4Addr::new(10, 99, 0, 1), Ipv4Addr::new(10, 99, 0, 2));
        crate::veth::veth_pair([(&na, &va, aa), (&nb, &vb, ab)])?;
        // No IPv6 on the link (as the forwarder's taps): router solicitations and MLD
        // reports would pass the token bucket too and blur its byte counts.
        for end in [End::A, End::B] {
            let knob = format!("net.ipv6.conf.{}.disable_ipv6=1", self.dev(end));
            self.run(end, "sysctl", ["-qw", knob.as_str()])?;
        }
        Ok(())
    }

    /// Adds `addr` (on the link's /24) to end `end`'s device: a second softhca device
    /// in one namespace needs an address of its own (each binds UDP 4791 on its own).
    pub fn add_addr(&self, end: End, addr: Ipv4Addr) -> Result<(), TestbedError> {
        let a = format!("{addr}/24");
        ip(&[
            "-n",
            &self.netns(end),
            "addr",
            "add",
            &a,
            "dev",
            &self.dev(end),
        ])
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The namespace of `end`.
    pub fn netns(&self, end: End) -> String {
        netns_name(&self.name, end)
    }

    /// The shaped device of `end` (the forwarder's tap, or the veth).
    pub fn dev(&self, end: End) -> String {
        match end {
            End::A => format!("{}a", self.name),
            End::B => format!("{}b", self.name),
        }
    }

    /// The address of `end`.
    pub fn addr(&self, end: End) -> IpAddr {
        IpAddr::V4(match end {
            End::A => Ipv4Addr::new(10, 99, 0, 1),
            End::B => Ipv4Addr::new(10, 99, 0, 2),
        })
    }

    /// `program` to run in the namespace of `end`.
    pub fn command(&self, end: End, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec"])
            .arg(self.netns(end))
            .arg(program.as_ref());
        c
    }

    fn run<I, S>(&self, end: End, program: &str, args: I) -> Result<String, TestbedError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.command(end, program);
        c.args(args).stdin(Stdio::null());
        let out = c.output()?;
        if !out.status.success() {
            return Err(TestbedError::Command {
                cmd: format!("{c:?}"),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The MTU of the shaped device of `end` (9000, so that RoCE's 4096-byte path MTU
    /// fits), from `ip -o link show` (`2: shcc1a@if3: <...> mtu 9000 qdisc tbf ...`).
    pub fn mtu(&self, end: End) -> Result<u64, TestbedError> {
        let dev = self.dev(end);
        let text = self.run(end, "ip", ["-o", "link", "show", "dev", &dev])?;
        let words: Vec<&str> = text.split_whitespace().collect();
        words
            .iter()
            .position(|w| *w == "mtu")
            .and_then(|i| words.get(i + 1))
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| TestbedError::Command {
                cmd: format!("ip -o link show dev {dev}"),
                stderr: format!("no mtu in {text:?}"),
            })
    }

    /// The token bucket counters of `end` (what it sent toward the other end).
    pub fn qdisc(&self, end: End) -> Result<QdiscStats, TestbedError> {
        let dev = self.dev(end);
        let text = self.run(end, "tc", ["-s", "qdisc", "show", "dev", &dev])?;
        Ok(parse_qdisc(&text))
    }
}

/// The first ` Sent <bytes> bytes <pkts> pkt (dropped <n>, ...` of `tc -s qdisc show`.
pub fn parse_qdisc(text: &str) -> QdiscStats {
    let Some(line) = text.lines().find(|l| l.trim_start().starts_with("Sent ")) else {
        return QdiscStats::default();
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let num = |after: &str| {
        words
            .iter()
            .position(|w| *w == after)
            .and_then(|i| words.get(i + 1))
            .and_then(|w| w.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
            .unwrap_or(0)
    };
    let pkts = words
        .iter()
        .position(|w| *w == "pkt")
        .and_then(|i| words.get(i.wrapping_sub(1)))
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    QdiscStats {
        sent: pkts,
        bytes: num("Sent"),
        dropped: num("(dropped"),
    }
}

impl Drop for ShapedLink {
    fn drop(&mut self) {
        // The forwarder removes its own namespaces; a veth goes with its namespaces.
        if self.forwarder.take().is_none() {
            remove_namespaces(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tc_counters() {
        let text = "qdisc tbf 8001: root refcnt 3 rate 1Gbit burst 262125b lat 5ms \n \
                    Sent 1827748156 bytes 446404 pkt (dropped 21, overlimits 154149 requeues 0) \n \
                    backlog 0b 0p requeues 0\n";
        assert_eq!(
            parse_qdisc(text),
            QdiscStats {
                sent: 446404,
                bytes: 1827748156,
                dropped: 21
            }
        );
        assert_eq!(parse_qdisc(""), QdiscStats::default());
    }

    #[test]
    fn labels() {
        let s = Shape {
            rate: 1_000_000_000,
            delay: Duration::from_millis(5),
        };
        assert_eq!(s.label(), "1 Gb/s + 5 ms");
        let s = Shape {
            rate: 100_000_000,
            delay: Duration::ZERO,
        };
        assert_eq!(s.label(), "100 Mb/s");
    }
}
