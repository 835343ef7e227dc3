//! Conversions between `std::net` addresses and the C socket address structs.

use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A socket address in C layout, big enough for IPv4 and IPv6 (28 bytes instead of
/// `sockaddr_storage`'s 128, which matters for a stack batch of 64 of them).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl RawAddr {
    /// Encodes `addr`, returning the struct and the length to pass as `msg_namelen`.
    pub(crate) fn new(addr: &SocketAddr) -> (Self, libc::socklen_t) {
        match addr {
            SocketAddr::V4(a) => (
                RawAddr {
                    v4: libc::sockaddr_in {
                        sin_family: libc::AF_INET as libc::sa_family_t,
                        sin_port: a.port().to_be(),
                        sin_addr: libc::in_addr {
                            s_addr: u32::from_ne_bytes(a.ip().octets()),
                        },
                        sin_zero: [0; 8],
                    },
                },
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            SocketAddr::V6(a) => (
                RawAddr {
                    v6: libc::sockaddr_in6 {
                        sin6_family: libc::AF_INET6 as libc::sa_family_t,
                        sin6_port: a.port().to_be(),
                        sin6_flowinfo: a.flowinfo(),
                        sin6_addr: libc::in6_addr {
                            s6_addr: a.ip().octets(),
                        },
                        sin6_scope_id: a.scope_id(),
                    },
                },
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }
}

/// Decodes the source address `recvmsg` wrote into `name` (`len` bytes valid).
/// Returns `None` for families other than IPv4/IPv6 or a short length.
pub(crate) fn decode(name: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(name.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and sockaddr_storage is
            // large enough and suitably aligned for it.
            let a =
                unsafe { &*(name as *const libc::sockaddr_storage as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let a =
                unsafe { &*(name as *const libc::sockaddr_storage as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `in_pktinfo` asking the kernel to send from `ip` (`ipi_spec_dst`, see ip(7)).
pub(crate) fn pktinfo_v4(ip: Ipv4Addr) -> libc::in_pktinfo {
    libc::in_pktinfo {
        ipi_ifindex: 0,
        ipi_spec_dst: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        ipi_addr: libc::in_addr { s_addr: 0 },
    }
}

/// `in6_pktinfo` asking the kernel to send from `ip` (ipv6(7)).
pub(crate) fn pktinfo_v6(ip: Ipv6Addr) -> libc::in6_pktinfo {
    libc::in6_pktinfo {
        ipi6_addr: libc::in6_addr {
            s6_addr: ip.octets(),
        },
        ipi6_ifindex: 0,
    }
}

/// The header destination address from a received `IP_PKTINFO`.
pub(crate) fn dst_from_pktinfo_v4(p: &libc::in_pktinfo) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(p.ipi_addr.s_addr.to_ne_bytes()))
}

/// The header destination address from a received `IPV6_PKTINFO`.
pub(crate) fn dst_from_pktinfo_v6(p: &libc::in6_pktinfo) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(p.ipi6_addr.s6_addr))
}
