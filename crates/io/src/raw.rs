//! The system calls of the datapath, made directly rather than through glibc's wrappers.
//!
//! Why: glibc's `recvmsg`, `recvmmsg`, `sendmsg`, `sendmmsg` and `poll` are thread
//! cancellation points. Application threads run them inside verbs calls
//! (`ibv_poll_cq`, `ibv_post_send`) with the datapath's locks held, and rdma-core's
//! verbs are not cancellation points: a cancellation acted on there would unwind
//! through the C ABI (which aborts the process) or leave those locks held. (The
//! wrappers' bookkeeping was also 4 % of the samples of an 8-byte ping-pong's spin,
//! with no latency to gain from it.) `syscall(2)` sets `errno` and returns -1 on failure
//! as the wrappers do.

/// `recvmsg(2)`.
///
/// # Safety
/// As `libc::recvmsg`: `msg` and everything it points to are valid for the call.
pub unsafe fn recvmsg(fd: libc::c_int, msg: *mut libc::msghdr, flags: libc::c_int) -> isize {
    // SAFETY: our contract.
    unsafe { libc::syscall(libc::SYS_recvmsg, fd, msg, flags) as isize }
}

/// `recvmmsg(2)` with no timeout.
///
/// # Safety
/// As `libc::recvmmsg`: `msgs[..vlen]` and everything they point to are valid.
pub unsafe fn recvmmsg(
    fd: libc::c_int,
    msgs: *mut libc::mmsghdr,
    vlen: libc::c_uint,
    flags: libc::c_int,
) -> libc::c_int {
    let none: *mut libc::timespec = std::ptr::null_mut();
    // SAFETY: our contract; a null timeout means none.
    unsafe { libc::syscall(libc::SYS_recvmmsg, fd, msgs, vlen, flags, none) as libc::c_int }
}

/// `sendmsg(2)`.
///
/// # Safety
/// As `libc::sendmsg`.
pub unsafe fn sendmsg(fd: libc::c_int, msg: *const libc::msghdr, flags: libc::c_int) -> isize {
    // SAFETY: our contract.
    unsafe { libc::syscall(libc::SYS_sendmsg, fd, msg, flags) as isize }
}

/// `sendmmsg(2)`.
///
/// # Safety
/// As `libc::sendmmsg`.
pub unsafe fn sendmmsg(
    fd: libc::c_int,
    msgs: *mut libc::mmsghdr,
    vlen: libc::c_uint,
    flags: libc::c_int,
) -> libc::c_int {
    // SAFETY: our contract.
    unsafe { libc::syscall(libc::SYS_sendmmsg, fd, msgs, vlen, flags) as libc::c_int }
}

/// `poll(2)` (through `ppoll`, which every architecture has).
///
/// # Safety
/// As `libc::poll`: `fds[..nfds]` are valid.
pub unsafe fn poll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout_ms: libc::c_int,
) -> libc::c_int {
    let ts = (timeout_ms >= 0).then(|| libc::timespec {
        tv_sec: libc::time_t::from(timeout_ms / 1000),
        tv_nsec: libc::c_long::from(timeout_ms % 1000) * 1_000_000,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    let no_mask: *const libc::sigset_t = std::ptr::null();
    // SAFETY: our contract; `tsp` is null or points at `ts`, alive for the call; a null
    // signal mask leaves the thread's as it is (and the size argument is then unused).
    unsafe { libc::syscall(libc::SYS_ppoll, fds, nfds, tsp, no_mask, 8usize) as libc::c_int }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// A datagram goes out by `sendmsg` and comes back by `recvmsg` and `recvmmsg`, `poll`
    /// sees it, and an empty non-blocking socket fails with EAGAIN through `errno`.
    #[test]
    fn round_trip_and_errno() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        b.set_nonblocking(true).unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        let send = |data: &[u8]| {
            let mut iov = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            // SAFETY: all-zero is a valid empty msghdr; then it names one live iovec.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            // SAFETY: `h` and `iov` are valid for the call.
            unsafe { super::sendmsg(a.as_raw_fd(), &h, 0) }
        };
        let mut buf = [0u8; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: as above.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_iov = &mut iov;
        h.msg_iovlen = 1;
        // SAFETY: `h` names `buf`, exclusively borrowed.
        let rc = unsafe { super::recvmsg(b.as_raw_fd(), &mut h, 0) };
        assert_eq!(rc, -1);
        assert_eq!(
            std::io::Error::last_os_error().kind(),
            std::io::ErrorKind::WouldBlock
        );
        assert_eq!(send(b"hello"), 5);
        let mut p = libc::pollfd {
            fd: b.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { super::poll(&mut p, 1, 1000) }, 1);
        assert_ne!(p.revents & libc::POLLIN, 0);
        // SAFETY: `h` names `buf`, exclusively borrowed.
        assert_eq!(unsafe { super::recvmsg(b.as_raw_fd(), &mut h, 0) }, 5);
        assert_eq!(&buf[..5], b"hello");
        assert_eq!(send(b"again!"), 6);
        // SAFETY: all-zero is a valid mmsghdr; it then carries `h`.
        let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
        m.msg_hdr = h;
        // SAFETY: `m` names `buf` through `iov`, exclusively borrowed.
        assert_eq!(unsafe { super::recvmmsg(b.as_raw_fd(), &mut m, 1, 0) }, 1);
        assert_eq!((m.msg_len, &buf[..6]), (6, &b"again!"[..]));
    }
}
