//! Send-only UDP sockets connected to one peer, and the IPv4 ID Linux writes on them.
//!
//! Why: `sendmsg` on an unconnected socket looks the route up and builds the flow for
//! every datagram; on a connected socket it reuses the cached route. For an 8 B RC SEND
//! ping-pong on loopback that is 0.37–0.45 µs of each half round trip (measured on Linux
//! 6.18: a C ping-pong 3.37 → 2.96 µs, softhca 5.45 → 4.98 µs).
//!
//! The catch: the RoCE ICRC covers the IPv4 Identification field (IBTA A17.4.1 masks only
//! TOS, TTL and the checksum), so the sender must know the ID before it seals a packet.
//! An unconnected socket with DF set sends ID 0, but a connected one numbers its packets
//! from a per-socket counter that `connect` starts at a random value
//! (`ip_select_ident_segs`: `inet_sk(sk)->inet_id`, advanced by one per datagram: a GSO
//! datagram takes one value when it is built, and its segments, if the kernel cuts it,
//! carry that value plus their position, values the next datagrams take again). A socket's reader never sees the IP header, so
//! [`ConnectedSender::open`] asks for software transmit timestamps for a moment
//! (`SO_TIMESTAMPING`, no privilege needed): without `SOF_TIMESTAMPING_OPT_TSONLY` Linux
//! loops a copy of each sent packet, headers included, back to the socket's error queue.
//! Two probe datagrams go from the connected socket to a throw-away local socket (a
//! connected UDP socket may still send elsewhere, and the counter numbers those too);
//! their copies give two IDs, which must be consecutive. From then on every datagram this
//! socket sends takes the next ID: [`ConnectedSender::next_ipv4_id`] counts the messages
//! the kernel accepted ([`RoceSocket::messages_sent`]), so a GSO send refused and sent
//! again as plain datagrams is counted as what it became. A send that fails leaves the
//! count unsure (the kernel may have numbered the datagram before refusing it): the
//! caller forgets the sender (or calls [`ConnectedSender::relearn`]).
//!
//! The socket's own port is the packets' UDP source port, which RoCEv2 leaves free (rxe
//! uses 0xC000 + a hash of the QPN, A17.2.3 asks only for entropy): responses still go
//! to port 4791 of the device's receiving socket. Nothing is ever received here.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::RawFd;
use std::time::Duration;

use crate::socket::{BindOptions, RoceSocket};
use crate::IoError;

/// How long the looped copy of a probe may take. It goes through the loopback device,
/// which queues the copy during the `sendto` itself: it is there at once, or never (the
/// loopback device is down, as in a fresh network namespace: the probe then vanishes
/// without an error).
const PROBE_TIMEOUT: Duration = Duration::from_millis(2);
/// IPv4 header without options, and UDP header.
const IPV4_HDR: usize = 20;
const UDP_HDR: usize = 8;

/// A [`RoceSocket`] connected to one peer, with the IPv4 ID of its next packet.
#[derive(Debug)]
pub struct ConnectedSender {
    socket: RoceSocket,
    /// The ID of the next datagram when `messages_sent` was `at`.
    id: u16,
    at: u64,
}

impl ConnectedSender {
    /// Binds a socket on `local_ip` (a free port), connects it to `peer` and, for IPv4,
    /// learns the ID counter. Fails when the kernel's counter does not behave as
    /// described in the module documentation (the caller then keeps the unconnected
    /// socket).
    pub fn open(
        local_ip: IpAddr,
        peer: SocketAddr,
        options: BindOptions,
    ) -> Result<ConnectedSender, IoError> {
        let socket = RoceSocket::connect_with(local_ip, peer, options)?;
        let mut s = ConnectedSender {
            socket,
            id: 0,
            at: 0,
        };
        s.relearn()?;
        Ok(s)
    }

    /// The socket, to send with ([`RoceSocket::send`]; transmits to the peer go without
    /// an address).
    pub fn socket(&self) -> &RoceSocket {
        &self.socket
    }

    /// The UDP source port of its packets (the ICRC covers it).
    pub fn source_port(&self) -> u16 {
        self.socket.local_addr().port()
    }

    /// The IPv4 ID Linux will write on the next datagram (0 for IPv6, which has none).
    /// The segments of a GSO datagram carry it plus their position, should the kernel
    /// cut it on the way; the datagram after it takes the next value all the same.
    pub fn next_ipv4_id(&self) -> u16 {
        if self.socket.local_addr().is_ipv6() {
            return 0;
        }
        // IDs wrap at 16 bits: only the count modulo 2^16 matters.
        let sent = self.socket.messages_sent().wrapping_sub(self.at);
        self.id.wrapping_add((sent & 0xffff) as u16)
    }

    /// Learns the next IPv4 ID again (after a failed send).
    pub fn relearn(&mut self) -> Result<(), IoError> {
        if self.socket.local_addr().is_ipv4() {
            self.id = self.learn()?;
            self.at = self.socket.messages_sent();
        }
        Ok(())
    }

    /// Sends two probes to a local socket and reads the IDs off their looped copies
    /// (IPv4 sockets only).
    fn learn(&self) -> Result<u16, IoError> {
        let local = self.socket.local_addr();
        let fd = self.socket.as_raw_fd();
        let os = |what: &'static str| move |source| IoError::Os { what, source };
        let rx = UdpSocket::bind(SocketAddr::new(local.ip(), 0)).map_err(os("probe bind"))?;
        let to = rx.local_addr().map_err(os("probe getsockname"))?;
        let stamps = libc::SOF_TIMESTAMPING_TX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE;
        set_timestamping(fd, stamps as libc::c_int).map_err(os("SO_TIMESTAMPING"))?;
        let ids = (0..2u8)
            .map(|k| {
                let probe = [b's', b'o', b'f', b't', b'h', b'c', b'a', k];
                self.socket
                    .send_probe(&probe, to)
                    .map_err(os("probe send"))?;
                looped_ipv4_id(fd, &probe)
            })
            .collect::<Result<Vec<u16>, IoError>>();
        // Off again whatever happened: every later send would loop a copy too.
        let off = set_timestamping(fd, 0).map_err(os("SO_TIMESTAMPING"));
        let ids = ids?;
        off?;
        // Each probe took the counter's value and moved it on by one.
        if ids[1] != ids[0].wrapping_add(1) {
            return Err(unexpected(
                "IPv4 IDs of a connected socket are not consecutive",
            ));
        }
        Ok(ids[1].wrapping_add(1))
    }
}

fn set_timestamping(fd: RawFd, flags: libc::c_int) -> std::io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPING,
            &flags as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Waits for the looped copy of `payload` on `fd`'s error queue and returns the ID of
/// its IPv4 header. The copy starts at the link-layer header (Ethernet on loopback),
/// so the IP header is found from the end: payload, UDP header, IPv4 header.
fn looped_ipv4_id(fd: RawFd, payload: &[u8]) -> Result<u16, IoError> {
    let mut pfd = libc::pollfd {
        fd,
        events: 0, // POLLERR is always reported
        revents: 0,
    };
    let ms = PROBE_TIMEOUT.as_millis() as libc::c_int;
    // Not glibc's poll and recvmsg: the probe runs inside a verbs call that sends, with
    // the datapath's locks held, where a thread cancellation must not be acted on (see
    // `raw`).
    // SAFETY: one valid pollfd, count 1.
    if unsafe { crate::raw::poll(&mut pfd, 1, ms) } <= 0 {
        return Err(unexpected("no looped copy of the ID probe"));
    }
    let mut buf = [0u8; 256];
    let mut ctrl = [0u8; 256];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid (empty) value we then fill.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = ctrl.len() as _;
    // SAFETY: `msg` points at `iov`, `buf` and `ctrl`, all live for the call.
    let n = unsafe { crate::raw::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
    let n = usize::try_from(n).map_err(|_| IoError::Os {
        what: "probe error queue",
        source: std::io::Error::last_os_error(),
    })?;
    let copy = &buf[..n.min(buf.len())];
    let ip = copy
        .len()
        .checked_sub(payload.len() + UDP_HDR + IPV4_HDR)
        .ok_or_else(|| unexpected("looped probe too short"))?;
    let hdr = &copy[ip..];
    // Version 4, no options, UDP, and our payload at the end.
    if hdr[0] != 0x45 || hdr[9] != libc::IPPROTO_UDP as u8 || !copy.ends_with(payload) {
        return Err(unexpected("looped probe is not our IPv4 datagram"));
    }
    Ok(u16::from_be_bytes([hdr[4], hdr[5]]))
}

fn unexpected(what: &'static str) -> IoError {
    IoError::Os {
        what,
        source: std::io::Error::from(std::io::ErrorKind::InvalidData),
    }
}
