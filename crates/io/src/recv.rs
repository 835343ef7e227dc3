//! Batched receive: preallocated buffers for `recvmmsg(2)` and GRO segment splitting.

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;

use crate::cmsg::{self, CmsgBuf, RECV_CMSG_LEN};
use crate::sockaddr;

/// What the kernel told us about one received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// Peer address and UDP source port (RoCE: 0xC000 + a hash of the QPN, or anything).
    pub src: SocketAddr,
    /// Local address the datagram was sent to (from `IP_PKTINFO` / `IPV6_PKTINFO`, or the
    /// socket's own address when it is bound to one): which of the device's GIDs the
    /// peer addressed.
    pub dst_ip: Option<IpAddr>,
    /// Bytes in the buffer (all segments when GRO coalesced several).
    pub len: usize,
    /// GRO segment size: every segment but the last has exactly this many bytes.
    /// Equals `len` when the datagram was not coalesced.
    pub stride: usize,
    /// IPv4 TOS / IPv6 traffic class byte (DSCP << 2 | ECN); 0 if unknown (the socket
    /// asks for it only with [`crate::BindOptions::recv_tos`]).
    pub tos: u8,
    /// The datagram was larger than the buffer and was cut (`MSG_TRUNC`); the caller
    /// should drop it (a RoCE packet without its tail fails the ICRC anyway).
    pub truncated: bool,
}

impl Default for RecvMeta {
    fn default() -> Self {
        RecvMeta {
            src: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            dst_ip: None,
            len: 0,
            stride: 0,
            tos: 0,
            truncated: false,
        }
    }
}

/// Receive buffers and `recvmmsg` headers for up to `n_msgs` datagrams, allocated once.
///
/// Each [`crate::RoceSocket::recv`] overwrites the previous contents; read them with
/// [`RecvBatch::get`] or [`RecvBatch::iter`] before receiving again.
pub struct RecvBatch {
    buf_size: usize,
    bufs: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    ctrls: Vec<CmsgBuf<RECV_CMSG_LEN>>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    metas: Vec<RecvMeta>,
    len: usize,
    /// The `recvmmsg` vector is set up (see [`RecvBatch::prime`]).
    primed: bool,
    /// The last receive found the socket empty: the next asks for one datagram only.
    last_empty: bool,
}

// SAFETY: the raw pointers inside `iovs` and `hdrs` only ever point into this batch's own
// heap allocations (`bufs`, `names`, `ctrls`, `iovs`); they are set up by `prime` and handed to the
// kernel only through `&mut self`, and never dereferenced through `&self`. Moving the batch
// to another thread or sharing `&RecvBatch` is therefore as safe as for the Vecs themselves.
unsafe impl Send for RecvBatch {}
// SAFETY: see above; `&self` methods only read `bufs` and `metas`.
unsafe impl Sync for RecvBatch {}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("capacity", &self.capacity())
            .field("buf_size", &self.buf_size)
            .field("len", &self.len)
            .finish()
    }
}

impl RecvBatch {
    /// Buffers for `n_msgs` datagrams of up to `buf_size` bytes each. Use
    /// [`crate::RoceSocket::recv_buf_size`] for `buf_size` (64 KiB when GRO is on).
    pub fn new(n_msgs: usize, buf_size: usize) -> Self {
        // recvmmsg takes at most UIO_MAXIOV (1024) messages per call.
        let n = n_msgs.min(1024);
        RecvBatch {
            buf_size,
            bufs: vec![0; n.saturating_mul(buf_size)],
            // SAFETY: sockaddr_storage is plain data; all-zero is valid.
            names: vec![unsafe { std::mem::zeroed() }; n],
            ctrls: vec![CmsgBuf::zeroed(); n],
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                n
            ],
            // SAFETY: mmsghdr is plain data (null pointers, zero lengths) when zeroed.
            hdrs: vec![unsafe { std::mem::zeroed() }; n],
            metas: vec![RecvMeta::default(); n],
            len: 0,
            primed: false,
            last_empty: false,
        }
    }

    /// Buffers sized for `socket` (see [`crate::RoceSocket::recv_buf_size`]).
    pub fn for_socket(socket: &crate::RoceSocket, n_msgs: usize) -> Self {
        Self::new(n_msgs, socket.recv_buf_size())
    }

    /// Datagrams filled by the last receive.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the last receive filled nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many datagrams one receive can fill.
    pub fn capacity(&self) -> usize {
        self.metas.len()
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Datagram `i` of the last receive: its metadata and bytes.
    ///
    /// # Panics
    /// If `i >= self.len()`, like slice indexing; [`RecvBatch::iter`] cannot.
    pub fn get(&self, i: usize) -> (RecvMeta, &[u8]) {
        assert!(
            i < self.len,
            "RecvBatch::get({i}) with only {} datagrams",
            self.len
        );
        let meta = self.metas[i];
        let start = i * self.buf_size;
        (meta, &self.bufs[start..start + meta.len.min(self.buf_size)])
    }

    /// The datagrams of the last receive, in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = (RecvMeta, &[u8])> + '_ {
        (0..self.len).map(|i| self.get(i))
    }

    /// Points entries `range` of the `recvmmsg` vector at their buffers, with full
    /// lengths. The pointers name the heap storage of this batch's vectors, which never
    /// grow, so they stay valid when the batch moves.
    fn prime(&mut self, range: std::ops::Range<usize>) {
        for i in range {
            // SAFETY (pointer arithmetic): `i * buf_size` is within `bufs` (len n * buf_size).
            let base = unsafe { self.bufs.as_mut_ptr().add(i * self.buf_size) };
            self.iovs[i] = libc::iovec {
                iov_base: base as *mut libc::c_void,
                iov_len: self.buf_size,
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = &mut self.names[i] as *mut libc::sockaddr_storage as *mut libc::c_void;
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = self.ctrls[i].0.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = RECV_CMSG_LEN as _;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
    }

    /// One `recvmmsg` on `fd` into this batch.
    ///
    /// After a receive that found the socket empty, this one asks for a single
    /// datagram. A poller spinning on an idle socket is waiting for one datagram (a
    /// ping-pong's answer), and with a full vector `recvmmsg` goes back to the queue for a
    /// second one before it returns: a failed receive on the latency path (about 0.2 µs
    /// per hop in interleaved runs of `softhca perf send --lat`, near the noise). Under
    /// load the next call asks for the full vector again, so a burst costs one extra
    /// call at most.
    ///
    /// That single datagram is asked for with `recvmsg`, not `recvmmsg` of one: the same
    /// receive, without `recvmmsg`'s vector and timeout handling (8 B ping-pong with
    /// softhca's sockets, interleaved runs: 4.25 → 4.17 µs per hop; `softhca perf send
    /// --lat` 5.76 → 5.66 µs).
    pub(crate) fn recv_from(&mut self, fd: RawFd) -> io::Result<usize> {
        self.len = 0;
        let cap = self.metas.len();
        if cap == 0 {
            return Ok(0);
        }
        if !self.primed {
            self.prime(0..cap);
            self.primed = true;
        }
        let n = if self.last_empty { 1 } else { cap };
        let got = loop {
            let rc = if n == 1 {
                // SAFETY: `hdrs[0].msg_hdr` points at live buffers of the stated sizes owned
                // by `self`, which is mutably borrowed for the whole call.
                let bytes = unsafe { crate::raw::recvmsg(fd, &mut self.hdrs[0].msg_hdr, 0) };
                if bytes >= 0 {
                    // What recvmmsg stores for a message (an empty datagram is one too).
                    self.hdrs[0].msg_len = bytes as libc::c_uint;
                    1
                } else {
                    -1
                }
            } else {
                // SAFETY: `hdrs[..n]` point at live buffers of the stated sizes owned by
                // `self`, which is mutably borrowed for the whole call; a null timeout
                // means none.
                unsafe { crate::raw::recvmmsg(fd, self.hdrs.as_mut_ptr(), n as libc::c_uint, 0) }
            };
            if rc >= 0 {
                break (rc as usize).min(n);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                self.last_empty = true;
                return Err(err);
            }
        };
        self.last_empty = got == 0;
        for i in 0..got {
            self.metas[i] = self.decode(i);
        }
        // Only the entries the kernel filled changed (name and control lengths, flags):
        // an empty poll, the common call of a polling datapath, resets nothing.
        self.prime(0..got);
        self.len = got;
        Ok(got)
    }

    /// Sets the destination address of every datagram of the last receive that did not
    /// carry one (the socket is bound to `ip`, see [`crate::RoceSocket::bind`]).
    pub(crate) fn set_dst_ip(&mut self, ip: IpAddr) {
        for m in &mut self.metas[..self.len] {
            m.dst_ip.get_or_insert(ip);
        }
    }

    fn decode(&self, i: usize) -> RecvMeta {
        let len = (self.hdrs[i].msg_len as usize).min(self.buf_size);
        decode(&self.names[i], &self.ctrls[i], &self.hdrs[i].msg_hdr, len)
    }
}

/// The metadata of a datagram of `len` bytes that `recvmsg` described in `h`, with its
/// source address in `name` and its control messages in `ctrl`.
fn decode(
    name: &libc::sockaddr_storage,
    ctrl: &CmsgBuf<RECV_CMSG_LEN>,
    h: &libc::msghdr,
    len: usize,
) -> RecvMeta {
    let mut meta = RecvMeta {
        src: sockaddr::decode(name, h.msg_namelen).unwrap_or(RecvMeta::default().src),
        len,
        stride: len,
        truncated: h.msg_flags & libc::MSG_TRUNC != 0,
        ..RecvMeta::default()
    };
    for c in cmsg::iter(ctrl, h.msg_controllen as _) {
        match (c.level, c.ty) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                if let Some(p) = c.read::<libc::in_pktinfo>() {
                    meta.dst_ip = Some(sockaddr::dst_from_pktinfo_v4(&p));
                }
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                if let Some(p) = c.read::<libc::in6_pktinfo>() {
                    meta.dst_ip = Some(sockaddr::dst_from_pktinfo_v6(&p));
                }
            }
            // ip(7): IP_TOS arrives as one byte; ipv6(7): IPV6_TCLASS as an int.
            (libc::IPPROTO_IP, libc::IP_TOS) => meta.tos = c.read::<u8>().unwrap_or(0),
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                meta.tos = c.read::<libc::c_int>().unwrap_or(0) as u8
            }
            (libc::SOL_UDP, libc::UDP_GRO) => {
                if let Some(s) = c.read::<libc::c_int>() {
                    if s > 0 {
                        meta.stride = s as usize;
                    }
                }
            }
            _ => {}
        }
    }
    meta
}

/// One datagram at a time with `recvmsg(2)` into the caller's scatter list, after a
/// look at its first bytes with `MSG_PEEK`: for a receiver that decides from a packet's
/// headers where its payload goes (straight into registered memory) before taking it
/// off the socket.
pub struct ScatterRecv {
    name: libc::sockaddr_storage,
    ctrl: CmsgBuf<RECV_CMSG_LEN>,
}

impl std::fmt::Debug for ScatterRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScatterRecv").finish_non_exhaustive()
    }
}

impl Default for ScatterRecv {
    fn default() -> Self {
        ScatterRecv {
            // SAFETY: sockaddr_storage is plain data; all-zero is valid.
            name: unsafe { std::mem::zeroed() },
            ctrl: CmsgBuf::zeroed(),
        }
    }
}

impl ScatterRecv {
    /// Copies the first bytes of the next datagram on `socket` into `head` and leaves
    /// the datagram queued. Its metadata: `len` is the whole datagram's length (all GRO
    /// segments), `stride` its GRO segment size. [`io::ErrorKind::WouldBlock`] when
    /// nothing is queued.
    pub fn peek(&mut self, socket: &crate::RoceSocket, head: &mut [u8]) -> io::Result<RecvMeta> {
        let mut iov = libc::iovec {
            iov_base: head.as_mut_ptr().cast(),
            iov_len: head.len(),
        };
        // SAFETY: the one iovec names `head`, exclusively borrowed for the call.
        unsafe { self.recvmsg(socket, std::slice::from_mut(&mut iov), libc::MSG_PEEK) }
    }

    /// Takes the next datagram off `socket` into `iov`, in order (`MSG_TRUNC` in the
    /// metadata if it was longer than all of them together).
    ///
    /// # Safety
    /// Each iovec names memory writable for its length that nothing else reads or
    /// writes during the call.
    pub unsafe fn recv(
        &mut self,
        socket: &crate::RoceSocket,
        iov: &mut [libc::iovec],
    ) -> io::Result<RecvMeta> {
        // SAFETY: our contract.
        unsafe { self.recvmsg(socket, iov, 0) }
    }

    /// # Safety
    /// As [`ScatterRecv::recv`].
    unsafe fn recvmsg(
        &mut self,
        socket: &crate::RoceSocket,
        iov: &mut [libc::iovec],
        flags: libc::c_int,
    ) -> io::Result<RecvMeta> {
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_name = (&mut self.name as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = iov.as_mut_ptr();
        h.msg_iovlen = iov.len() as _;
        h.msg_control = self.ctrl.0.as_mut_ptr().cast();
        h.msg_controllen = RECV_CMSG_LEN as _;
        // MSG_TRUNC: the datagram's real length, also when a peek reads only its start.
        let flags = flags | libc::MSG_TRUNC | libc::MSG_DONTWAIT;
        let n = loop {
            // SAFETY: `h` points at `self.name`, `self.ctrl` and the caller's iovecs (our
            // contract), all live for the call.
            let rc = unsafe { crate::raw::recvmsg(socket.as_raw_fd(), &mut h, flags) };
            if rc >= 0 {
                break rc as usize;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        };
        let mut meta = decode(&self.name, &self.ctrl, &h, n);
        let ip = socket.local_addr().ip();
        if !ip.is_unspecified() {
            meta.dst_ip.get_or_insert(ip);
        }
        Ok(meta)
    }
}

/// Iterator over the datagrams inside one received buffer; see [`segments`].
#[derive(Debug, Clone)]
pub struct Segments<'a> {
    rest: &'a [u8],
    stride: usize,
    empty_pending: bool,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.rest.is_empty() {
            // A zero-length UDP datagram is still one datagram.
            return std::mem::take(&mut self.empty_pending).then_some(&[][..]);
        }
        let n = self.stride.min(self.rest.len());
        let (seg, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(seg)
    }
}

/// Splits a received buffer back into the datagrams the peer sent: chunks of
/// `meta.stride` bytes, the last possibly shorter (Linux GRO only coalesces datagrams
/// of one size, with a shorter one allowed last). Not coalesced: one segment.
pub fn segments<'a>(meta: &RecvMeta, buf: &'a [u8]) -> Segments<'a> {
    let buf = &buf[..meta.len.min(buf.len())];
    Segments {
        rest: buf,
        stride: if meta.stride == 0 {
            buf.len().max(1)
        } else {
            meta.stride
        },
        empty_pending: buf.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(len: usize, stride: usize) -> RecvMeta {
        RecvMeta {
            len,
            stride,
            ..RecvMeta::default()
        }
    }

    #[test]
    fn segments_split_on_stride() {
        let buf: Vec<u8> = (0..10).collect();
        let segs: Vec<&[u8]> = segments(&meta(10, 4), &buf).collect();
        assert_eq!(
            segs,
            vec![&[0, 1, 2, 3][..], &[4, 5, 6, 7][..], &[8, 9][..]]
        );
        let segs: Vec<&[u8]> = segments(&meta(10, 10), &buf).collect();
        assert_eq!(segs, vec![&buf[..]]);
        // stride 0 or beyond len: one segment; len clipped to the buffer.
        assert_eq!(segments(&meta(10, 0), &buf).count(), 1);
        assert_eq!(
            segments(&meta(99, 3), &buf).map(<[u8]>::len).sum::<usize>(),
            10
        );
        let segs: Vec<&[u8]> = segments(&meta(0, 0), &[]).collect();
        assert_eq!(segs, vec![&[][..]]);
    }

    #[test]
    fn empty_batch_is_harmless() {
        let b = RecvBatch::new(0, 100);
        assert_eq!((b.len(), b.capacity(), b.iter().count()), (0, 0, 0));
    }
}
