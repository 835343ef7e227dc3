//! A plain veth pair (no forwarder, no impairment): the realistic deployment of a
//! softhca device bound to a real interface, for tests of unmodified middleware.
//!
//! Two layouts: [`VethLayout::TwoHosts`] puts each end in its own namespace (two hosts
//! joined by a cable); [`VethLayout::OneHost`] puts both ends in one namespace (two
//! processes on one host, each with a device on its own interface, as libfabric's
//! verbs provider needs a non-loopback interface address per device).

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use crate::{check_available, ip, netns_command, valid_name, End, TestbedError};

/// Where the two ends of a [`Veth`] live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VethLayout {
    /// End `a` in namespace `<name>-a`, end `b` in `<name>-b`.
    TwoHosts,
    /// Both ends in namespace `<name>-a`.
    OneHost,
}

/// A veth pair `<name>a` (10.98.0.1/24) — `<name>b` (10.98.0.2/24), MTU 9000, in fresh
/// namespaces with their loopback up. Dropping it deletes the namespaces (and the pair).
#[derive(Debug)]
pub struct Veth {
    name: String,
    layout: VethLayout,
}

impl Veth {
    /// Creates the namespaces and the pair. Needs root and iproute2.
    pub fn up(name: &str, layout: VethLayout) -> Result<Veth, TestbedError> {
        check_available()?;
        if !valid_name(name) {
            return Err(TestbedError::BadName(name.to_owned()));
        }
        // Leftovers of a killed run with the same name would make `netns add` fail.
        crate::remove_namespaces(name);
        let v = Veth {
            name: name.to_owned(),
            layout,
        };
        // From here on, Drop removes whatever was made if a step fails.
        let (na, nb) = (v.netns(End::A), v.netns(End::B));
        ip(&["netns", "add", &na])?;
        if layout == VethLayout::TwoHosts {
            ip(&["netns", "add", &nb])?;
        }
        let (ia, ib) = (v.ifname(End::A), v.ifname(End::B));
        let (aa, ab) = (Ipv4Addr::new(10, 98, 0, 1), Ipv4Addr::new(10, 98, 0, 2));
        veth_pair([(&na, &ia, aa), (&nb, &ib, ab)])?;
        Ok(v)
    }

    /// The address of end `a` (10.98.0.1) or `b` (10.98.0.2).
    pub fn addr(&self, end: End) -> IpAddr {
        IpAddr::V4(match end {
            End::A => Ipv4Addr::new(10, 98, 0, 1),
            End::B => Ipv4Addr::new(10, 98, 0, 2),
        })
    }

    /// The interface name of `end` (`<name>a`, `<name>b`): what `SOFTHCA_NETDEV` names.
    pub fn ifname(&self, end: End) -> String {
        match end {
            End::A => format!("{}a", self.name),
            End::B => format!("{}b", self.name),
        }
    }

    /// The namespace `end` lives in.
    pub fn netns(&self, end: End) -> String {
        match self.layout {
            VethLayout::TwoHosts => crate::netns_name(&self.name, end),
            VethLayout::OneHost => crate::netns_name(&self.name, End::A),
        }
    }

    /// `ip netns exec <ns of end> <program>`: add arguments and run it.
    pub fn command(&self, end: End, program: impl AsRef<OsStr>) -> Command {
        netns_command(&self.netns(end), program.as_ref())
    }
}

/// A veth pair between two namespaces (or within one): each `(namespace, device,
/// address)` gets its end, MTU 9000 (RoCE's 4096-byte path MTU), the address on a /24,
/// and the namespace's loopback up.
pub(crate) fn veth_pair(ends: [(&str, &str, Ipv4Addr); 2]) -> Result<(), TestbedError> {
    let [(na, da, _), (nb, db, _)] = ends;
    ip(&[
        "-n", na, "link", "add", da, "mtu", "9000", "type", "veth", "peer", "name", db, "mtu",
        "9000", "netns", nb,
    ])?;
    for (ns, dev, addr) in ends {
        ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
        ip(&["-n", ns, "link", "set", dev, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    Ok(())
}

impl Drop for Veth {
    fn drop(&mut self) {
        crate::remove_namespaces(&self.name);
    }
}
