//! The RoCEv2 UDP socket: set-up, capability probing and the batched send path.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::cmsg::{self, CmsgBuf, SEND_CMSG_LEN};
use crate::sockaddr::{self, RawAddr};
use crate::{IoError, RecvBatch};

/// The IANA port for RoCEv2 (IBTA Annex A17.2.3).
pub const ROCE_UDP_PORT: u16 = 4791;

/// Messages handed to one `sendmmsg(2)` call. Each entry costs ~130 bytes of stack.
const SEND_BATCH: usize = 64;

/// Socket buffer size we ask for: a few milliseconds of traffic at tens of Gb/s, so a
/// burst of GSO sends or a descheduled datapath thread does not drop packets.
const SOCKET_BUFFER: usize = 16 << 20;

/// The receive buffer is this many times the send buffer: UC and UD have no flow
/// control, and a receiver on the same host that falls behind its sender, for a
/// scheduler slice or by a few percent over a long stream, needs that much room, or
/// whole UC messages are lost (perftest's `ib_send_bw -c UC` then never ends; rxe's
/// queue behind its UDP tunnel socket has no such limit). The kernel charges a buffer
/// only for what is queued in it.
const RECV_BUFFER_FACTOR: usize = 16;

/// Linux `UDP_MAX_SEGMENTS` (include/linux/udp.h): 64 up to 6.8; later kernels raised it
/// to 128, but 64 is accepted everywhere and already fills 64 KiB for RoCE MTUs ≥ 1024.
const MAX_GSO_SEGMENTS: usize = 64;

/// Largest UDP payload in one IP packet: 65535 minus IPv4 (20) and UDP (8) headers. A GSO
/// "super datagram" is built as one IP packet, so it obeys the same limit.
const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Same for IPv6, keeping the IPv6 header inside 64 KiB as well (conservative).
const MAX_UDP_PAYLOAD_V6: usize = 65_487;

/// How long `send` waits for buffer space to finish a Transmit it has already started, so
/// that a GSO-less split is not cut in the middle (which would make the caller resend, and
/// the peer see duplicates of, its first segments).
const FINISH_STARTED_TRANSMIT: Duration = Duration::from_millis(5);

/// What the kernel let us use on this socket, decided when it was bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `UDP_SEGMENT` works: a [`Transmit`] with several segments leaves as one
    /// `sendmsg` and is cut into datagrams by the kernel (or the NIC). Can turn false
    /// later if the kernel rejects a GSO send (`EIO`: a device without checksum offload).
    pub gso: bool,
    /// `UDP_GRO` is on: [`RoceSocket::recv`] may return several datagrams from one peer
    /// coalesced into one buffer (see [`crate::segments`]); receive buffers must be 64 KiB.
    pub gro: bool,
    /// Most segments one GSO send may carry (1 without GSO).
    pub max_gso_segments: usize,
}

/// One datagram, or a run of equal-size datagrams to the same peer, to send.
#[derive(Debug, Clone, Copy)]
pub struct Transmit<'a> {
    /// Peer address and UDP port (4791 for RoCEv2). Must be of the socket's family.
    pub dst: SocketAddr,
    /// Local address to send from (`IP_PKTINFO` / `IPV6_PKTINFO`), needed when the socket
    /// is bound to a wildcard address and the device serves several addresses: the RoCE
    /// GID a QP uses is its source IP. `None` lets the routing table choose.
    pub src_ip: Option<IpAddr>,
    /// The bytes of all segments back to back.
    pub contents: &'a [u8],
    /// When not empty, the bytes are these pieces back to back instead of `contents`
    /// (zero-copy: headers from one buffer, payloads from registered memory; the
    /// kernel gathers them). The memory must stay readable until [`RoceSocket::send`]
    /// returns; if it is not, the kernel refuses the send with EFAULT.
    pub pieces: &'a [libc::iovec],
    /// `Some(n)`: the bytes are several datagrams of `n` bytes each (the last may be
    /// shorter). `None` (or `Some(0)`, or `n >= len`): one datagram.
    pub segment_size: Option<usize>,
    /// The IPv4 TOS / IPv6 traffic class byte (DSCP << 2 | ECN); 0 leaves the socket's.
    pub tos: u8,
}

impl Transmit<'_> {
    /// Bytes to send.
    pub fn byte_len(&self) -> usize {
        if self.pieces.is_empty() {
            self.contents.len()
        } else {
            self.pieces.iter().map(|v| v.iov_len).sum()
        }
    }
}

/// The pieces covering bytes `off..off + len` of `pieces` back to back.
fn sub_pieces(pieces: &[libc::iovec], off: usize, len: usize) -> Box<[libc::iovec]> {
    let mut out = Vec::new();
    let (mut skip, mut left) = (off, len);
    for v in pieces {
        if left == 0 {
            break;
        }
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        let n = (v.iov_len - skip).min(left);
        out.push(libc::iovec {
            iov_base: (v.iov_base as *mut u8).wrapping_add(skip) as *mut libc::c_void,
            iov_len: n,
        });
        left -= n;
        skip = 0;
    }
    out.into_boxed_slice()
}

/// How [`RoceSocket::bind_with`] sets a socket up: the offloads it may try (each is
/// still probed) and its buffer size. The caller decides (softhca from its `Config`);
/// this crate reads no environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindOptions {
    /// Try GSO (`UDP_SEGMENT`).
    pub allow_gso: bool,
    /// Try GRO (`UDP_GRO`).
    pub allow_gro: bool,
    /// Ask for each datagram's TOS / traffic class byte (`IP_RECVTOS` /
    /// `IPV6_RECVTCLASS`, [`RecvMeta::tos`]). Off unless wanted: the kernel then builds,
    /// and we parse, one more cmsg per datagram, and softhca's transport does not use
    /// it.
    ///
    /// [`RecvMeta::tos`]: crate::RecvMeta::tos
    pub recv_tos: bool,
    /// Send buffer bytes, and a quarter of the receive buffer's (clamped to 64 KiB..1
    /// GiB): forced when privileged (`SO_*BUFFORCE`), else as much as
    /// `net.core.*mem_max` allows.
    pub sockbuf: usize,
    /// Send and receive only through this interface (its index; 0: any), as rxe sends
    /// only through its netdev (`rxe_find_route4` routes with `flowi4_oif` = the
    /// netdev) and takes only what arrives on it: `SO_BINDTODEVICE`, or, where the
    /// kernel refuses that without `CAP_NET_RAW` (before Linux 5.7), `IP_UNICAST_IF` /
    /// `IPV6_UNICAST_IF` for the sending side.
    pub bind_ifindex: u32,
}

impl BindOptions {
    /// GSO and GRO allowed, no TOS, 16 MiB buffers.
    pub const DEFAULT: BindOptions = BindOptions {
        allow_gso: true,
        allow_gro: true,
        recv_tos: false,
        sockbuf: SOCKET_BUFFER,
        bind_ifindex: 0,
    };
}

impl Default for BindOptions {
    /// [`BindOptions::DEFAULT`].
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A non-blocking UDP socket carrying RoCEv2, with batched, offloaded send and receive.
///
/// The socket stays unconnected on purpose: for an unconnected socket with DF set Linux
/// writes IPv4 ID 0 on every non-GSO datagram (`ip_select_ident_segs`), a value the RoCE
/// ICRC (which covers the IP ID, IBTA A17.4.1) can predict; a connected socket would use
/// a per-socket counter instead.
#[derive(Debug)]
pub struct RoceSocket {
    socket: Socket,
    local: SocketAddr,
    gso: AtomicBool,
    gro: bool,
    max_gso_segments: usize,
    /// GSO sends that fell back to split datagrams because the kernel refused GSO.
    gso_fallbacks: AtomicU64,
    /// The peer this socket is connected to ([`crate::ConnectedSender`]): transmits to
    /// it go without an address, which spares the kernel a route lookup per send.
    peer: Option<SocketAddr>,
    /// Datagrams (messages: a GSO send is one) the kernel accepted from [`Self::send`].
    messages: AtomicU64,
    /// [`BindOptions::bind_ifindex`].
    bound_ifindex: u32,
}

/// Ties `socket` to interface `ifindex` (see [`BindOptions::bind_ifindex`]).
fn bind_to_interface(socket: &Socket, addr: SocketAddr, ifindex: u32) -> Result<(), IoError> {
    let mut name = [0u8; libc::IF_NAMESIZE];
    // SAFETY: `name` has the IF_NAMESIZE bytes if_indextoname may write.
    let p = unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr() as *mut libc::c_char) };
    if p.is_null() {
        return Err(IoError::Os {
            what: "if_indextoname",
            source: io::Error::last_os_error(),
        });
    }
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    match socket.bind_device(Some(&name[..len])) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            tracing::debug!("SO_BINDTODEVICE refused ({e}); sending through IP_UNICAST_IF");
            let fd = socket.as_raw_fd();
            if addr.is_ipv4() {
                // IP_UNICAST_IF takes the index in network byte order (ip(7)).
                let index = (ifindex as libc::c_int).to_be();
                setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_UNICAST_IF, index)
                    .map_err(os("IP_UNICAST_IF"))
            } else {
                setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_UNICAST_IF, ifindex as _)
                    .map_err(os("IPV6_UNICAST_IF"))
            }
        }
        Err(source) => Err(IoError::Os {
            what: "SO_BINDTODEVICE",
            source,
        }),
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> IoError {
    move |source| IoError::Os { what, source }
}

impl RoceSocket {
    /// Binds a UDP socket on `addr` (port normally [`ROCE_UDP_PORT`]; port 0 picks a free
    /// one, for tests) and sets it up for RoCEv2:
    ///
    /// * non-blocking, close-on-exec, `SO_REUSEADDR` off (two devices must not silently
    ///   share an address), `IPV6_V6ONLY` on for IPv6 (bind `0.0.0.0` separately for IPv4);
    /// * `IP_PKTINFO` / `IPV6_RECVPKTINFO` when bound to a wildcard, so every datagram
    ///   says which local address it was sent to (such a device serves several GIDs);
    ///   bound to one address, that address is the answer and [`RoceSocket::recv`] fills
    ///   it in without a cmsg per datagram;
    /// * `IP_MTU_DISCOVER` / `IPV6_MTU_DISCOVER` = `PMTUDISC_DO`: DF set and never
    ///   fragmented, like rxe (an oversized send fails with `EMSGSIZE`);
    /// * `IP_RECVTOS` / `IPV6_RECVTCLASS` for ECN/DSCP if [`BindOptions::recv_tos`];
    ///   socket buffers of [`BindOptions::sockbuf`];
    /// * GSO (`UDP_SEGMENT`) and GRO (`UDP_GRO`) probed, unless the options forbid them;
    ///   see [`RoceSocket::capabilities`].
    ///
    /// This binds with [`BindOptions::DEFAULT`].
    pub fn bind(addr: SocketAddr) -> Result<Self, IoError> {
        Self::bind_with(addr, BindOptions::DEFAULT)
    }

    /// [`RoceSocket::bind`] with explicit options.
    pub fn bind_with(addr: SocketAddr, options: BindOptions) -> Result<Self, IoError> {
        let domain = Domain::for_address(addr);
        let socket = Socket::new(
            domain,
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )
        .map_err(os("socket"))?;
        socket
            .set_reuse_address(false)
            .map_err(os("SO_REUSEADDR"))?;
        if addr.is_ipv6() {
            socket.set_only_v6(true).map_err(os("IPV6_V6ONLY"))?;
        }
        if options.bind_ifindex != 0 {
            bind_to_interface(&socket, addr, options.bind_ifindex)?;
        }
        socket
            .bind(&addr.into())
            .map_err(|e| IoError::from_bind(addr, e))?;
        let local = socket
            .local_addr()
            .map_err(os("getsockname"))?
            .as_socket()
            .ok_or(IoError::Os {
                what: "getsockname",
                source: io::Error::from(io::ErrorKind::InvalidData),
            })?;
        let fd = socket.as_raw_fd();
        // Bound to one address, every datagram was sent to it (Linux matches a bound
        // socket's address against the destination, udp4_lib_lookup): no need to ask.
        let wildcard = local.ip().is_unspecified();

        if addr.is_ipv4() {
            if wildcard {
                setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)
                    .map_err(os("IP_PKTINFO"))?;
            }
            setsockopt_int(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )
            .map_err(os("IP_MTU_DISCOVER"))?;
            if options.recv_tos {
                if let Err(e) = setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1) {
                    tracing::debug!("IP_RECVTOS refused ({e}); RecvMeta::tos will be 0");
                }
            }
        } else {
            if wildcard {
                setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)
                    .map_err(os("IPV6_RECVPKTINFO"))?;
            }
            setsockopt_int(
                fd,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )
            .map_err(os("IPV6_MTU_DISCOVER"))?;
            if options.recv_tos {
                if let Err(e) = setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1) {
                    tracing::debug!("IPV6_RECVTCLASS refused ({e}); RecvMeta::tos will be 0");
                }
            }
        }
        Self::grow_buffers(fd, options.sockbuf);

        // GSO: the option exists since Linux 4.18 together with the cmsg we really use.
        // Setting it socket-wide would segment *every* send, so switch it back off and
        // pass the segment size per message instead.
        let gso = options.allow_gso
            && setsockopt_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 1200).is_ok()
            && setsockopt_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok();
        let gro = options.allow_gro && setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        tracing::debug!(%local, gso, gro, "RoCE UDP socket bound");

        Ok(RoceSocket {
            socket,
            local,
            gso: AtomicBool::new(gso),
            gro,
            max_gso_segments: MAX_GSO_SEGMENTS,
            gso_fallbacks: AtomicU64::new(0),
            peer: None,
            messages: AtomicU64::new(0),
            bound_ifindex: options.bind_ifindex,
        })
    }

    /// A receive-only socket for the RoCEv2 packets sent to multicast `group` on `port`,
    /// joined on the interface of each address in `via` (an address and its interface
    /// index) of the group's family, as rxe takes what its netdev's multicast filter
    /// lets in. `SO_REUSEADDR`: Linux hands a multicast datagram to every socket bound
    /// to its group and port, so each device on the host that joined gets its own copy
    /// (the wire's behaviour). Fails when no interface could join.
    pub fn bind_multicast(
        group: IpAddr,
        port: u16,
        via: &[(IpAddr, u32)],
        sockbuf: usize,
    ) -> Result<Self, IoError> {
        let addr = SocketAddr::new(group, port);
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )
        .map_err(os("socket"))?;
        socket.set_reuse_address(true).map_err(os("SO_REUSEADDR"))?;
        if addr.is_ipv6() {
            socket.set_only_v6(true).map_err(os("IPV6_V6ONLY"))?;
        }
        socket
            .bind(&addr.into())
            .map_err(|e| IoError::from_bind(addr, e))?;
        let mut joined = 0;
        let mut last = None;
        for &(ip, ifindex) in via {
            let r = match (group, ip) {
                (IpAddr::V4(g), IpAddr::V4(local)) => socket
                    .join_multicast_v4_n(&g, &socket2::InterfaceIndexOrAddress::Address(local)),
                (IpAddr::V6(g), IpAddr::V6(_)) => socket.join_multicast_v6(&g, ifindex),
                _ => continue,
            };
            match r {
                Ok(()) => joined += 1,
                // Two served addresses on one interface: joined there already.
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => joined += 1,
                Err(e) => last = Some(e),
            }
        }
        if joined == 0 {
            return Err(IoError::Os {
                what: "join multicast group",
                source: last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EADDRNOTAVAIL)),
            });
        }
        Self::grow_buffers(socket.as_raw_fd(), sockbuf);
        tracing::debug!(%addr, joined, "RoCE multicast socket bound");
        Ok(RoceSocket {
            socket,
            local: addr,
            gso: AtomicBool::new(false),
            gro: false,
            max_gso_segments: MAX_GSO_SEGMENTS,
            gso_fallbacks: AtomicU64::new(0),
            peer: None,
            messages: AtomicU64::new(0),
            bound_ifindex: 0,
        })
    }

    /// The interface this socket is bound to ([`BindOptions::bind_ifindex`]; 0: none).
    pub fn bound_ifindex(&self) -> u32 {
        self.bound_ifindex
    }

    /// A send-only socket on `local_ip` (a free port) connected to `peer`, set up like
    /// [`RoceSocket::bind_with`]. See [`crate::ConnectedSender`] for why and for the
    /// IPv4 ID it makes Linux write.
    pub(crate) fn connect_with(
        local_ip: IpAddr,
        peer: SocketAddr,
        options: BindOptions,
    ) -> Result<Self, IoError> {
        let mut s = Self::bind_with(SocketAddr::new(local_ip, 0), options)?;
        s.socket.connect(&peer.into()).map_err(os("connect"))?;
        s.peer = Some(peer);
        Ok(s)
    }

    /// Sends one datagram to `to` (not the connected peer): the ID probe of
    /// [`crate::ConnectedSender`].
    pub(crate) fn send_probe(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.socket.send_to(buf, &to.into())
    }

    /// Asks for large buffers: forced (needs CAP_NET_ADMIN), else capped by sysctl. The
    /// receive buffer is [`RECV_BUFFER_FACTOR`] times the send buffer.
    fn grow_buffers(fd: RawFd, bytes: usize) {
        let size = |b: usize| b.clamp(64 << 10, 1 << 30) as libc::c_int;
        for (force, plain, name, size) in [
            (
                libc::SO_SNDBUFFORCE,
                libc::SO_SNDBUF,
                "SO_SNDBUF",
                size(bytes),
            ),
            (
                libc::SO_RCVBUFFORCE,
                libc::SO_RCVBUF,
                "SO_RCVBUF",
                size(bytes.saturating_mul(RECV_BUFFER_FACTOR)),
            ),
        ] {
            if setsockopt_int(fd, libc::SOL_SOCKET, force, size).is_err() {
                if let Err(e) = setsockopt_int(fd, libc::SOL_SOCKET, plain, size) {
                    tracing::debug!("{name} refused ({e}); keeping the default");
                }
            }
        }
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// What GSO/GRO this socket uses (see [`Capabilities`]).
    pub fn capabilities(&self) -> Capabilities {
        let gso = self.gso.load(Ordering::Relaxed);
        Capabilities {
            gso,
            gro: self.gro,
            max_gso_segments: if gso { self.max_gso_segments } else { 1 },
        }
    }

    /// Segments one GSO message carries for this `segment_size`: a Transmit with more is
    /// cut into several GSO messages of this many segments (1 without GSO), unless the
    /// whole Transmit fits one message (its last segment is short).
    pub fn segments_per_gso_send(&self, segment_size: usize) -> usize {
        if !self.gso.load(Ordering::Relaxed) || segment_size == 0 {
            return 1;
        }
        let max_payload = if self.local.is_ipv4() {
            MAX_UDP_PAYLOAD_V4
        } else {
            MAX_UDP_PAYLOAD_V6
        };
        self.max_gso_segments.min(max_payload / segment_size).max(1)
    }

    /// The IPv4 ID Linux writes on segment `index` (0-based) of a Transmit cut in
    /// `segment_size` segments, all full (a Transmit that fits one GSO message thanks to
    /// a short last segment is not cut, and segment `k` has ID `k`), with the current capabilities: 0 for a plain datagram
    /// (DF set, socket unconnected: `ip_select_ident_segs`), and the segment's position in
    /// its GSO message otherwise (`inet_gso_segment` numbers segments from the first
    /// one's ID, which is 0). IPv6 has no ID; 0 is returned.
    pub fn ipv4_id_of_segment(&self, segment_size: usize, index: usize) -> u16 {
        if self.local.is_ipv6() {
            return 0;
        }
        // < 64, so the cast is exact.
        (index % self.segments_per_gso_send(segment_size)) as u16
    }

    /// Datagrams the kernel accepted from [`RoceSocket::send`] so far (a GSO send counts
    /// once, a Transmit cut into several messages once per message).
    pub fn messages_sent(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }

    /// How many GSO sends had to be split because the kernel refused them (a counter).
    pub fn gso_fallbacks(&self) -> u64 {
        self.gso_fallbacks.load(Ordering::Relaxed)
    }

    /// Receive buffer size a [`RecvBatch`] for this socket needs: 64 KiB with GRO (a
    /// coalesced datagram can be up to a full UDP payload), else 9216 (a jumbo frame; a
    /// RoCE packet at the largest PMTU, 4096, plus headers is ~4.2 KB).
    pub fn recv_buf_size(&self) -> usize {
        if self.gro {
            65_536
        } else {
            9_216
        }
    }

    /// Sets the IPv4 TOS / IPv6 traffic class of outgoing packets (DSCP << 2 | ECN),
    /// e.g. for RoCE lossless-class DSCP marking.
    pub fn set_tos(&self, tos: u8) -> Result<(), IoError> {
        let fd = self.socket.as_raw_fd();
        if self.local.is_ipv4() {
            setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_TOS, tos.into()).map_err(os("IP_TOS"))
        } else {
            setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, tos.into())
                .map_err(os("IPV6_TCLASS"))
        }
    }

    /// The file descriptor, to register with a [`crate::Poller`].
    pub fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// Receives a batch with `recvmmsg(2)` into `batch`'s preallocated buffers and returns
    /// how many datagrams were filled (also [`RecvBatch::len`]). With GRO one "datagram"
    /// may hold several; split it with [`crate::segments`]. Returns
    /// [`io::ErrorKind::WouldBlock`] when nothing is queued.
    pub fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        let n = batch.recv_from(self.socket.as_raw_fd())?;
        let ip = self.local.ip();
        if !ip.is_unspecified() {
            batch.set_dst_ip(ip);
        }
        Ok(n)
    }

    /// Sends a batch with `sendmmsg(2)` and returns how many [`Transmit`]s were sent
    /// completely, in order.
    ///
    /// A multi-segment Transmit leaves as GSO datagrams when [`Capabilities::gso`] holds
    /// (split further if it exceeds 64 segments or 64 KiB), else as separate datagrams.
    ///
    /// Errors follow `sendmmsg`: an error is returned only when not even the first
    /// Transmit could be sent; otherwise the count is returned and the next call reports
    /// the error for the first unsent one. [`io::ErrorKind::WouldBlock`] means the socket
    /// buffer is full (wait for writability with a [`crate::Poller`]). Any other error
    /// concerns `transmits[0]` (e.g. `EMSGSIZE` above the path MTU, `ENETUNREACH`,
    /// `InvalidInput` for a destination of the wrong family): it cannot be sent and the
    /// caller should drop it and go on — for RoCE it is a lost packet.
    ///
    /// A Transmit that was started but could not be finished within a few milliseconds
    /// (possible only when it needs several messages) counts as not sent; resending it
    /// repeats its first segments, which an RC responder treats as duplicate requests.
    ///
    /// IPv4 ID on the wire (measured on Linux 6.18, veth with software segmentation):
    /// a plain datagram from this unconnected DF socket carries ID 0; the segments of one
    /// GSO message carry IDs 0, 1, 2, … in order. See [`RoceSocket::ipv4_id_of_segment`],
    /// which the ICRC (it covers the IP ID) must use. If GSO is switched off at run time,
    /// segments ≥ 1 of a Transmit built for GSO leave with ID 0 and a wrong ICRC: the peer
    /// drops them and the transport retransmits (counted in [`RoceSocket::gso_fallbacks`]).
    pub fn send(&self, transmits: &[Transmit<'_>]) -> io::Result<usize> {
        let mut scratch = SendScratch::new();
        // Cursor: the first Transmit not yet fully sent, and how many of its bytes are out.
        let mut t = 0usize;
        let mut off = 0usize;
        let mut stalled_since: Option<Instant> = None;
        // Transmit we are retrying as plain datagrams after the kernel refused it as GSO.
        let mut plain_retry: Option<usize> = None;
        let fd = self.socket.as_raw_fd();
        while t < transmits.len() {
            let gso = self.gso.load(Ordering::Relaxed);
            let plan = SendPlan {
                peer: self.peer,
                socket_v4: self.local.is_ipv4(),
                gso,
                plain_retry,
                max_segs: self.max_gso_segments,
            };
            let built = match scratch.fill(transmits, t, off, &plan) {
                Ok(n) => n,
                Err(e) => return if t > 0 { Ok(t) } else { Err(e) },
            };
            debug_assert!(built > 0);
            // SAFETY: `fill` just built `built` messages from `transmits`, borrowed here.
            let rc = unsafe { scratch.send(fd, built) };
            if rc > 0 {
                if plain_retry.take().is_some() {
                    // Plain datagrams went where GSO was refused: GSO was the problem.
                    if self.gso.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            "kernel refuses GSO on this path; sending plain datagrams from now on"
                        );
                    }
                }
                let sent = (rc as usize).min(built);
                self.messages.fetch_add(sent as u64, Ordering::Relaxed);
                // SAFETY: `fill` wrote `owner[..built]`, and `sent <= built`.
                let (tt, end) = unsafe { scratch.owner[sent - 1].assume_init() };
                if end >= transmits[tt].byte_len() {
                    t = tt + 1;
                    off = 0;
                } else {
                    t = tt;
                    off = end;
                }
                stalled_since = None;
                continue;
            }
            let err = io::Error::last_os_error();
            let gso_refused = gso && scratch.first_uses_gso;
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) if off > 0 => {
                    // Mid-Transmit: give the kernel a moment to drain the buffer.
                    let started = *stalled_since.get_or_insert_with(Instant::now);
                    let elapsed = started.elapsed();
                    if elapsed >= FINISH_STARTED_TRANSMIT {
                        return if t > 0 { Ok(t) } else { Err(err) };
                    }
                    wait_writable(fd, FINISH_STARTED_TRANSMIT - elapsed);
                }
                // EIO: the device cannot checksum-offload, so it can never do GSO
                // (udp_send_skb): stop using it.
                Some(libc::EIO) if gso_refused => self.gso_off(&err),
                // EINVAL: a segment larger than the device MTU, or a kernel that dislikes
                // the cmsg. Retry this Transmit as plain datagrams: if that works GSO was
                // at fault (and is switched off above); if not (EMSGSIZE) the caller's
                // segment size is, and GSO stays on for everyone else.
                Some(libc::EINVAL) if gso_refused && plain_retry.is_none() => {
                    plain_retry = Some(t);
                    self.gso_fallbacks.fetch_add(1, Ordering::Relaxed);
                }
                _ => return if t > 0 { Ok(t) } else { Err(err) },
            }
        }
        Ok(transmits.len())
    }

    /// GSO refused for good: plain datagrams from now on.
    fn gso_off(&self, err: &io::Error) {
        if self.gso.swap(false, Ordering::Relaxed) {
            tracing::warn!("GSO send refused ({err}); sending plain datagrams from now on");
        }
        self.gso_fallbacks.fetch_add(1, Ordering::Relaxed);
    }
}

/// Blocks up to `timeout` until `fd` is writable (used only on the rare stalled path).
fn wait_writable(fd: RawFd, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, 1000) as libc::c_int;
    // SAFETY: one valid pollfd; the result only tells us whether to retry, so it is ignored.
    unsafe {
        crate::raw::poll(&mut pfd, 1, ms);
    }
}

impl AsRawFd for RoceSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl AsFd for RoceSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// How [`SendScratch::fill`] cuts Transmits into messages.
#[derive(Clone, Copy)]
struct SendPlan {
    /// The connected peer: messages to it carry no address.
    peer: Option<SocketAddr>,
    /// The socket (and so every destination) is IPv4.
    socket_v4: bool,
    /// GSO may be used.
    gso: bool,
    /// This Transmit must go as plain datagrams (the kernel refused it as GSO).
    plain_retry: Option<usize>,
    /// Most segments per GSO message.
    max_segs: usize,
}

/// How much of `tr` from `off` goes in one message, and its GSO segment size if it is cut
/// into segments.
fn chunk_of(
    tr: &Transmit<'_>,
    off: usize,
    gso: bool,
    max_payload: usize,
    max_segs: usize,
) -> (usize, Option<usize>) {
    let remaining = tr.byte_len().saturating_sub(off);
    let seg = match tr.segment_size {
        Some(s) if s > 0 && s < remaining => s,
        _ => remaining,
    };
    if !(gso && seg < remaining) {
        return (remaining.min(seg), None);
    }
    // All of it when it fits one GSO message: a short last segment can make 16 segments
    // of 4112 bytes fit where 16 full ones would not (the transport seals packet k with
    // IPv4 ID k, so it must not be cut).
    let chunk = if remaining <= max_payload && remaining.div_ceil(seg) <= max_segs {
        remaining
    } else {
        let segs = max_segs.min(max_payload / seg).max(1);
        remaining.min(segs * seg)
    };
    (chunk, (chunk > seg).then_some(seg))
}

/// A message's control data: the GSO segment size, the source address, then the TOS.
fn control(tr: &Transmit<'_>, gso_seg: Option<usize>) -> (CmsgBuf<SEND_CMSG_LEN>, usize) {
    let mut ctrl = CmsgBuf::<SEND_CMSG_LEN>::zeroed();
    let mut clen = 0usize;
    if let Some(s) = gso_seg {
        // `s <= max_payload < u16::MAX`, so the cast is exact.
        clen =
            cmsg::push(&mut ctrl, clen, libc::SOL_UDP, libc::UDP_SEGMENT, s as u16).unwrap_or(clen);
    }
    let pushed = match tr.src_ip {
        Some(IpAddr::V4(ip)) => {
            let info = sockaddr::pktinfo_v4(ip);
            cmsg::push(&mut ctrl, clen, libc::IPPROTO_IP, libc::IP_PKTINFO, info)
        }
        Some(IpAddr::V6(ip)) => {
            let info = sockaddr::pktinfo_v6(ip);
            cmsg::push(
                &mut ctrl,
                clen,
                libc::IPPROTO_IPV6,
                libc::IPV6_PKTINFO,
                info,
            )
        }
        None => None,
    };
    clen = pushed.unwrap_or(clen);
    if tr.tos != 0 {
        // ip(7) IP_TOS and ipv6(7) IPV6_TCLASS as ancillary data: this datagram only, as
        // rxe sets each packet's IP header from its address vector.
        let (level, ty) = if tr.dst.is_ipv4() {
            (libc::IPPROTO_IP, libc::IP_TOS)
        } else {
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
        };
        let tos = libc::c_int::from(tr.tos);
        clen = cmsg::push(&mut ctrl, clen, level, ty, tos).unwrap_or(clen);
    }
    (ctrl, clen)
}

/// Per-call stack scratch for one `sendmmsg`: headers, iovecs, addresses and control
/// buffers, left uninitialised except for the entries a call fills (so a one-packet send
/// does not pay for zeroing ~10 KB).
struct SendScratch {
    hdrs: [MaybeUninit<libc::mmsghdr>; SEND_BATCH],
    iovs: [MaybeUninit<libc::iovec>; SEND_BATCH],
    addrs: [MaybeUninit<RawAddr>; SEND_BATCH],
    ctrls: [MaybeUninit<CmsgBuf<SEND_CMSG_LEN>>; SEND_BATCH],
    /// For each message: (Transmit index, end offset of its bytes within that Transmit).
    owner: [MaybeUninit<(usize, usize)>; SEND_BATCH],
    /// Whether the first message carries a UDP_SEGMENT cmsg (errors are about it).
    first_uses_gso: bool,
    /// Piece lists of gathered Transmits cut into several messages.
    sub: Vec<Box<[libc::iovec]>>,
}

impl SendScratch {
    fn new() -> Self {
        SendScratch {
            hdrs: [const { MaybeUninit::uninit() }; SEND_BATCH],
            iovs: [const { MaybeUninit::uninit() }; SEND_BATCH],
            addrs: [const { MaybeUninit::uninit() }; SEND_BATCH],
            ctrls: [const { MaybeUninit::uninit() }; SEND_BATCH],
            owner: [const { MaybeUninit::uninit() }; SEND_BATCH],
            first_uses_gso: false,
            sub: Vec::new(),
        }
    }

    /// Sends the first `built` messages: `sendmmsg`'s count, or -1 with errno set. One
    /// message (a ping-pong step) goes with `sendmsg`, which skips `sendmmsg`'s vector
    /// handling: 0.03–0.07 µs per hop of an 8 B `softhca perf send --lat`.
    ///
    /// # Safety
    /// `fill` built at least `built` messages, and the Transmits it was given are alive and
    /// unmoved.
    unsafe fn send(&mut self, fd: RawFd, built: usize) -> isize {
        // SAFETY: `hdrs[..built]` were initialised by `fill`, and every pointer in them
        // points into `self` (addresses, iovecs, control buffers) or into the Transmits
        // (payload, piece lists), alive by the contract. The memory the pieces name is
        // the caller's to keep readable; the kernel only reads it and fails with EFAULT
        // where it is not mapped.
        unsafe {
            if built == 1 {
                let hdr = &(*self.hdrs[0].as_ptr()).msg_hdr;
                match crate::raw::sendmsg(fd, hdr, 0) {
                    bytes if bytes >= 0 => 1,
                    _ => -1,
                }
            } else {
                let hdrs = self.hdrs.as_mut_ptr() as *mut libc::mmsghdr;
                crate::raw::sendmmsg(fd, hdrs, built as libc::c_uint, 0) as isize
            }
        }
    }

    /// Builds up to SEND_BATCH messages starting at byte `off` of `transmits[t]`. Returns
    /// how many, or an error if `transmits[t]` itself is unsendable (wrong family).
    fn fill(
        &mut self,
        transmits: &[Transmit<'_>],
        mut t: usize,
        mut off: usize,
        plan: &SendPlan,
    ) -> io::Result<usize> {
        let SendPlan {
            peer,
            socket_v4,
            gso,
            plain_retry,
            max_segs,
        } = *plan;
        let max_payload = if socket_v4 {
            MAX_UDP_PAYLOAD_V4
        } else {
            MAX_UDP_PAYLOAD_V6
        };
        let mut n = 0usize;
        self.first_uses_gso = false;
        self.sub.clear();
        while n < SEND_BATCH && t < transmits.len() {
            let tr = &transmits[t];
            let family_ok = tr.dst.is_ipv4() == socket_v4
                && !matches!(tr.src_ip, Some(ip) if ip.is_ipv4() != socket_v4);
            if !family_ok {
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "transmit address family differs from the socket's",
                    ));
                }
                break;
            }
            let len = tr.byte_len();
            let use_gso = gso && plain_retry != Some(t);
            let (chunk, gso_seg) = chunk_of(tr, off, use_gso, max_payload, max_segs);
            let (ctrl, clen) = control(tr, gso_seg);
            let (addr, addr_len) = RawAddr::new(&tr.dst);
            self.addrs[n].write(addr);
            self.ctrls[n].write(ctrl);
            let (iov_ptr, iov_len) = self.iov(n, tr, off, chunk);
            // SAFETY: msghdr is plain data; all-zero is a valid (empty) value we then fill.
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            if peer != Some(tr.dst) {
                hdr.msg_name = self.addrs[n].as_mut_ptr() as *mut libc::c_void;
                hdr.msg_namelen = addr_len;
            }
            hdr.msg_iov = iov_ptr;
            hdr.msg_iovlen = iov_len as _;
            if clen > 0 {
                hdr.msg_control = self.ctrls[n].as_mut_ptr() as *mut libc::c_void;
                hdr.msg_controllen = clen as _;
            }
            self.hdrs[n].write(libc::mmsghdr {
                msg_hdr: hdr,
                msg_len: 0,
            });
            if n == 0 {
                self.first_uses_gso = gso_seg.is_some();
            }
            off += chunk;
            self.owner[n].write((t, off));
            n += 1;
            if off >= len {
                t += 1;
                off = 0;
            }
        }
        Ok(n)
    }

    /// The iovecs of message `n`: `chunk` bytes of `tr` from `off`.
    fn iov(
        &mut self,
        n: usize,
        tr: &Transmit<'_>,
        off: usize,
        chunk: usize,
    ) -> (*mut libc::iovec, usize) {
        if tr.pieces.is_empty() {
            let payload = tr.contents.get(off..off + chunk).unwrap_or(&[]);
            self.iovs[n].write(libc::iovec {
                iov_base: payload.as_ptr() as *mut libc::c_void,
                iov_len: payload.len(),
            });
            (self.iovs[n].as_mut_ptr(), 1)
        } else if off == 0 && chunk == tr.byte_len() {
            // The whole Transmit in one message: the kernel gathers its pieces.
            (tr.pieces.as_ptr() as *mut libc::iovec, tr.pieces.len())
        } else {
            // Cut (no GSO, too many segments): the pieces of this chunk. Rare.
            let sub = sub_pieces(tr.pieces, off, chunk);
            let ptr = sub.as_ptr() as *mut libc::iovec;
            let k = sub.len();
            self.sub.push(sub); // a Box: its slice does not move with the Vec
            (ptr, k)
        }
    }
}
