//! Which addresses a device serves, and their MTU: zero configuration for both "two
//! processes on one host" and "two hosts (or namespaces)".
//!
//! Like rxe on a netdev, a device is its addresses + UDP 4791: the GID table lists the
//! served addresses (IPv4-mapped for IPv4), one [`RoceSocket`] per address.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use softhca_io::{IoError, RoceSocket};

use crate::config::Config;
use crate::error::Error;
use crate::Mtu;

/// One address of a local interface, from `getifaddrs(3)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    /// Interface name (`eth0`).
    pub name: String,
    /// The address.
    pub ip: IpAddr,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
    /// `IFF_UP`.
    pub up: bool,
}

/// Every IPv4/IPv6 address of every interface.
pub fn interface_addrs() -> Result<Vec<IfAddr>, Error> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::last_os("getifaddrs"));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points to a sockaddr whose family tells its
        // real type; we read the sockaddr_in/in6 only for the matching family.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        let flags = ifa.ifa_flags;
        out.push(IfAddr {
            name,
            ip,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
            up: flags & libc::IFF_UP as u32 != 0,
        });
    }
    // SAFETY: `head` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// An IPv6 link-local address needs a scope id to bind and to route; RoCE GIDs of that
/// kind are not useful without one, so we do not serve them automatically.
fn is_link_local_v6(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

/// The netdev MTU of an interface (`/sys/class/net/<name>/mtu`).
pub(crate) fn netdev_mtu(name: &str) -> Option<usize> {
    if name.contains('/') || name.starts_with('.') {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The link speed of an interface in Mb/s (`/sys/class/net/<name>/speed`); None when
/// the interface has none to report (`lo`, a dummy) or it is unknown (-1).
pub(crate) fn netdev_speed(name: &str) -> Option<u32> {
    if name.contains('/') || name.starts_with('.') {
        return None;
    }
    let v: i64 = std::fs::read_to_string(format!("/sys/class/net/{name}/speed"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    u32::try_from(v).ok().filter(|&m| m > 0)
}

/// The port's `(active_width, active_speed)` codes for a netdev of `mbps`, as rxe takes
/// them from its netdev (`ib_get_eth_speed` for a driver that reports no lanes): an
/// unknown speed counts as 1 Gb/s, so `lo` is 1X SDR and a 10 Gb/s veth 1X FDR10.
pub(crate) fn ib_rate_for_netdev(mbps: Option<u32>) -> (u8, u8) {
    const W1X: u8 = 1;
    const W4X: u8 = 2;
    const W2X: u8 = 16;
    const SDR: u8 = 1;
    const DDR: u8 = 2;
    const FDR10: u8 = 8;
    const EDR: u8 = 32;
    const HDR: u8 = 64;
    const NDR: u8 = 128;
    let steps = [
        (1_000, (W1X, SDR)),
        (10_000, (W1X, FDR10)),
        (20_000, (W4X, DDR)),
        (25_000, (W1X, EDR)),
        (40_000, (W4X, FDR10)),
        (50_000, (W2X, EDR)),
        (100_000, (W4X, EDR)),
        (200_000, (W4X, HDR)),
    ];
    let mbps = mbps.unwrap_or(1_000);
    steps
        .iter()
        .find(|(upto, _)| mbps <= *upto)
        .map_or((W4X, NDR), |&(_, rate)| rate)
}

/// The port's width and speed: those of GID 0's interface (the first served address,
/// an interface's before a loopback one), as an rxe port's are its netdev's.
pub(crate) fn port_rate(served: &[Served]) -> (u8, u8) {
    let name = served.first().and_then(served_ifname);
    ib_rate_for_netdev(name.as_deref().and_then(netdev_speed))
}

/// The largest bundle (`softhca_wire::bundle`) sent from `s`: a UDP payload that fits
/// one datagram on its interface (DF is set: a larger one would be refused), at most a
/// UDP datagram's; 0 (none) when the interface's MTU is unknown.
pub(crate) fn bundle_limit(s: &Served) -> usize {
    let ip_udp = if s.ip.is_ipv4() { 20 + 8 } else { 40 + 8 };
    served_ifname(s)
        .as_deref()
        .and_then(netdev_mtu)
        .map_or(0, |mtu| mtu.saturating_sub(ip_udp).min(65_507))
}

/// The largest IBTA MTU whose packets fit a netdev MTU (rxe `eth_mtu_int_to_enum`).
pub(crate) fn ib_mtu_for_netdev(netdev_mtu: usize) -> Mtu {
    Mtu::from_u32(softhca_wire::ib_mtu_code_for_netdev(netdev_mtu).into()).unwrap_or(Mtu::M256)
}

/// One served address: its socket and where it lives.
#[derive(Debug)]
pub(crate) struct Served {
    /// The bound socket.
    pub socket: RoceSocket,
    /// The address (the GID).
    pub ip: IpAddr,
    /// The interface it belongs to, when known.
    pub ifname: Option<String>,
    /// True for 127.0.0.0/8 and ::1.
    pub loopback: bool,
}

/// Sockets for multipath's extra UDP source ports (`SOFTHCA_MP_SPORTS` above 1): for
/// each port after the first, one socket per served address, all on one port number
/// the kernel picked for the first address (a port no other address has free is left
/// out). They only send: a path's packets leave from its own source port, which is
/// what ECMP hashes. Returns the ports and their sockets.
pub(crate) fn sport_sockets(
    cfg: &Config,
    served: &[Served],
) -> (Vec<u16>, Vec<(IpAddr, u16, RoceSocket)>) {
    let (mut ports, mut socks) = (Vec::new(), Vec::new());
    if !cfg.multipath.enabled {
        return (ports, socks);
    }
    for _ in 1..cfg.multipath.sports {
        let mut port = 0;
        let mut these = Vec::new();
        for s in served {
            let options = softhca_io::BindOptions {
                bind_ifindex: s.socket.bound_ifindex(),
                ..cfg.into()
            };
            match RoceSocket::bind_with(SocketAddr::new(s.ip, port), options) {
                Ok(sock) => {
                    port = sock.local_addr().port();
                    these.push((s.ip, port, sock));
                }
                Err(e) => {
                    tracing::debug!("multipath source port {port} on {}: {e}", s.ip);
                    these.clear();
                    break;
                }
            }
        }
        if !these.is_empty() {
            ports.push(port);
            socks.extend(these);
        }
    }
    (ports, socks)
}

fn bind(ip: IpAddr, cfg: &Config) -> Result<RoceSocket, IoError> {
    RoceSocket::bind_with(SocketAddr::new(ip, cfg.udp_port), cfg.into())
}

/// A socket of a device given an interface: like rxe on its netdev, it sends only
/// through that interface whatever the routing table prefers (a management network's
/// default route), and takes only what arrives on it.
fn bind_on(ip: IpAddr, cfg: &Config, ifindex: u32) -> Result<RoceSocket, IoError> {
    let options = softhca_io::BindOptions {
        bind_ifindex: ifindex,
        ..cfg.into()
    };
    RoceSocket::bind_with(SocketAddr::new(ip, cfg.udp_port), options)
}

/// The interface a served address is on: its own, or the loopback interface for a
/// loopback address no interface lists (127.0.0.2 is routed to `lo` with only
/// 127.0.0.1/8 assigned); None when not known.
fn served_ifname(s: &Served) -> Option<String> {
    s.ifname
        .clone()
        .or_else(|| s.loopback.then(loopback_ifname))
}

/// The index of the interface a served address is on ([`served_ifname`]); 0 when not
/// known.
pub(crate) fn served_ifindex(s: &Served) -> u32 {
    served_ifname(s).and_then(|n| ifindex(&n)).unwrap_or(0)
}

/// The index of interface `name` (`if_nametoindex(3)`).
fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: passes a NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// Binds the sockets `cfg` asks for, interface addresses first (so GID 0 names a
/// routable address), then the loopback one.
pub(crate) fn bind_served(cfg: &Config) -> Result<Vec<Served>, Error> {
    let ifaddrs = interface_addrs().unwrap_or_default();
    let ifname_of = |ip: &IpAddr| ifaddrs.iter().find(|a| a.ip == *ip).map(|a| a.name.clone());
    let mut out = Vec::new();
    if !cfg.addrs.is_empty() {
        // Exactly these addresses: any failure is the user's to fix, with a clear message.
        for &ip in &cfg.addrs {
            let socket = bind(ip, cfg)?;
            out.push(Served {
                socket,
                ip,
                ifname: ifname_of(&ip),
                loopback: ip.is_loopback(),
            });
        }
        return Ok(sort_interfaces_first(out));
    }
    if let Some(dev) = &cfg.netdev {
        let mine: Vec<&IfAddr> = ifaddrs.iter().filter(|a| &a.name == dev).collect();
        if mine.is_empty() {
            return Err(Error::Config(format!(
                "interface {dev} does not exist or has no IP address (SOFTHCA_NETDEV)"
            )));
        }
        let index = ifindex(dev).ok_or_else(|| {
            Error::Config(format!("interface {dev} does not exist (SOFTHCA_NETDEV)"))
        })?;
        for a in mine.into_iter().filter(|a| !is_link_local_v6(&a.ip)) {
            // Loopback traffic never leaves the host: no interface to keep it on.
            let socket = if a.loopback {
                bind(a.ip, cfg)?
            } else {
                bind_on(a.ip, cfg, index)?
            };
            out.push(Served {
                socket,
                ip: a.ip,
                ifname: Some(a.name.clone()),
                loopback: a.loopback,
            });
        }
        return Ok(sort_interfaces_first(out));
    }
    // Automatic: every usable interface address nobody else serves...
    for a in ifaddrs
        .iter()
        .filter(|a| a.up && !a.loopback && !a.ip.is_loopback() && !is_link_local_v6(&a.ip))
    {
        match bind(a.ip, cfg) {
            Ok(socket) => out.push(Served {
                socket,
                ip: a.ip,
                ifname: Some(a.name.clone()),
                loopback: false,
            }),
            // Another process (another softhca device, or rxe) serves it: leave it to them.
            Err(IoError::AddrInUse(_)) => {}
            // e.g. an IPv6 address still in duplicate address detection.
            Err(e) => tracing::debug!("not serving {}: {e}", a.ip),
        }
    }
    // ...plus the first free loopback address, so processes on one host each get one.
    // A new network namespace has `lo` down, with no 127.0.0.1: its interfaces are
    // served all the same (rxe needs no loopback either).
    match first_free_loopback(cfg) {
        Ok(lo) => out.push(lo),
        Err(Error::Io(IoError::AddrNotAvailable(a))) if !out.is_empty() => {
            tracing::debug!("not serving loopback: {} is not assigned (lo down)", a.ip());
        }
        Err(Error::Io(IoError::AddrNotAvailable(_))) => {
            return Err(Error::Config(
                "no address to serve: no interface is up with an IP address, and 127.0.0.1 \
                 is not assigned (in a new network namespace: ip link set lo up)"
                    .into(),
            ))
        }
        Err(e) => return Err(e),
    }
    Ok(out)
}

/// 127.0.0.1, 127.0.0.2, ... 127.0.0.254: the first one nobody serves on `cfg.udp_port`.
fn first_free_loopback(cfg: &Config) -> Result<Served, Error> {
    for host in 1..=254u8 {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, host));
        match bind(ip, cfg) {
            Ok(socket) => {
                return Ok(Served {
                    socket,
                    ip,
                    ifname: Some(loopback_ifname()),
                    loopback: true,
                })
            }
            Err(IoError::AddrInUse(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Config(format!(
        "no free address for softhca: 127.0.0.1..254 port {} all in use",
        cfg.udp_port
    )))
}

fn loopback_ifname() -> String {
    interface_addrs()
        .ok()
        .and_then(|v| v.into_iter().find(|a| a.loopback).map(|a| a.name))
        .unwrap_or_else(|| "lo".to_string())
}

fn sort_interfaces_first(mut v: Vec<Served>) -> Vec<Served> {
    // Stable: keeps the user's order within each group.
    v.sort_by_key(|s| s.loopback);
    v
}

/// The active MTU: the configured one, capped by every served interface's netdev MTU.
pub(crate) fn active_mtu(cfg_mtu: Mtu, served: &[Served]) -> Mtu {
    served
        .iter()
        .map(|s| served_mtu(cfg_mtu, s))
        .fold(cfg_mtu, Mtu::min)
}

/// The largest path MTU one served address's interface carries: the configured one,
/// capped by its netdev MTU when known.
pub(crate) fn served_mtu(cfg_mtu: Mtu, s: &Served) -> Mtu {
    s.ifname
        .as_deref()
        .and_then(netdev_mtu)
        .map_or(cfg_mtu, |m| ib_mtu_for_netdev(m).min(cfg_mtu))
}

/// The source address the kernel routing table picks to reach `peer` (connecting a
/// throw-away UDP socket sends nothing).
pub(crate) fn route_source(peer: IpAddr) -> Option<IpAddr> {
    let any: SocketAddr = match peer {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect((peer, crate::config::ROCE_UDP_PORT)).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// The address and interface index this host's routing sends to `dst` from.
pub(crate) fn route_interface(dst: IpAddr) -> Option<(IpAddr, u32)> {
    let src = route_source(dst)?;
    let addrs = interface_addrs().ok()?;
    let name = &addrs.iter().find(|a| a.ip == src)?.name;
    Some((src, ifindex(name).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_like_rxe() {
        assert_eq!(ib_mtu_for_netdev(1500), Mtu::M1024);
        assert_eq!(ib_mtu_for_netdev(9000), Mtu::M4096);
        assert_eq!(ib_mtu_for_netdev(65536), Mtu::M4096);
        assert_eq!(ib_mtu_for_netdev(2200), Mtu::M2048);
        assert_eq!(ib_mtu_for_netdev(100), Mtu::M256);
    }

    #[test]
    fn rate_like_rxe() {
        assert_eq!(ib_rate_for_netdev(None), (1, 1));
        assert_eq!(ib_rate_for_netdev(Some(100)), (1, 1));
        assert_eq!(ib_rate_for_netdev(Some(10_000)), (1, 8));
        assert_eq!(ib_rate_for_netdev(Some(25_000)), (1, 32));
        assert_eq!(ib_rate_for_netdev(Some(40_000)), (2, 8));
        assert_eq!(ib_rate_for_netdev(Some(50_000)), (16, 32));
        assert_eq!(ib_rate_for_netdev(Some(100_000)), (2, 32));
        assert_eq!(ib_rate_for_netdev(Some(400_000)), (2, 128));
        // `lo` reports no speed.
        assert_eq!(netdev_speed("lo"), None);
    }

    #[test]
    fn lists_loopback() {
        let v = interface_addrs().unwrap();
        assert!(v
            .iter()
            .any(|a| a.ip == IpAddr::V4(Ipv4Addr::LOCALHOST) && a.loopback));
        assert!(netdev_mtu("lo").unwrap() >= 1500);
    }

    #[test]
    fn route_source_for_loopback() {
        assert_eq!(
            route_source("127.0.0.1".parse().unwrap()),
            Some("127.0.0.1".parse().unwrap())
        );
    }
}
