//! Small OS helpers: a counting eventfd for completion channels and async events, and
//! `poll(2)` on one fd.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::error::Error;

/// An `eventfd(2)` in semaphore mode: each [`SemEventFd::post`] makes one
/// [`SemEventFd::try_take`] succeed, and the fd is readable (for poll/epoll/select)
/// exactly while something is left to take. That is the contract of a completion
/// channel fd and of the async event fd: readable while an event is queued.
#[derive(Debug)]
pub(crate) struct SemEventFd {
    fd: OwnedFd,
}

impl SemEventFd {
    pub(crate) fn new() -> Result<Self, Error> {
        // SAFETY: plain syscall; a non-negative return is a new fd we own.
        let fd = unsafe {
            libc::eventfd(
                0,
                libc::EFD_NONBLOCK | libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE,
            )
        };
        if fd < 0 {
            return Err(Error::last_os("eventfd"));
        }
        // SAFETY: `fd` was just returned by eventfd and nobody else owns it.
        Ok(SemEventFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Adds one (the fd becomes readable).
    pub(crate) fn post(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 as eventfd(2) requires. The only
        // failure (EAGAIN at a saturated counter) leaves the fd readable anyway.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Takes one if available (never blocks, even when a C program cleared the fd's
    /// `O_NONBLOCK`: it looks first, so only a racing reader could make it wait).
    pub(crate) fn try_take(&self) -> bool {
        if !matches!(
            poll_readable(self.fd.as_raw_fd(), Some(Duration::ZERO)),
            Ok(true)
        ) {
            return false;
        }
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 as eventfd(2) requires.
        let rc = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        rc == 8
    }

    /// Waits until one can be taken, takes it. `None`: wait forever. Returns false on
    /// timeout.
    pub(crate) fn take(&self, timeout: Option<Duration>) -> Result<bool, Error> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if self.try_take() {
                return Ok(true);
            }
            let left = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Ok(false),
                },
            };
            poll_readable(self.fd.as_raw_fd(), left)?;
        }
    }

    /// Takes one with a plain `read(2)`, in whatever blocking mode the fd's owner set:
    /// `EAGAIN` with `O_NONBLOCK` and nothing to take, `EINTR` when a signal interrupts.
    pub(crate) fn read_one(&self) -> std::io::Result<()> {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 as eventfd(2) requires.
        let rc = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if rc == 8 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Sets or clears `O_NONBLOCK` (rdma-core's event fds start blocking).
    pub(crate) fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        let fd = self.fd.as_raw_fd();
        // SAFETY: fcntl on an fd we own.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let want = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, want) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub(crate) fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// `poll(2)` for readability of one fd; true if readable. Sub-millisecond timeouts round
/// up to 1 ms (never a busy 0). EINTR counts as "not yet".
pub(crate) fn poll_readable(fd: RawFd, timeout: Option<Duration>) -> Result<bool, Error> {
    poll_fd(fd, libc::POLLIN, timeout)
}

/// `poll(2)` for `events` on one fd.
pub(crate) fn poll_fd(
    fd: RawFd,
    events: libc::c_short,
    timeout: Option<Duration>,
) -> Result<bool, Error> {
    let ms: libc::c_int = match timeout {
        None => -1,
        Some(d) => d.as_micros().div_ceil(1000).min(libc::c_int::MAX as u128) as libc::c_int,
    };
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let rc = unsafe { libc::poll(&mut p, 1, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(Error::Os {
            what: "poll",
            source: e,
        });
    }
    Ok(rc > 0 && p.revents != 0)
}

/// Which of `fds` are ready now (`poll(2)` with a zero timeout: the kernel checks each
/// file and registers nothing on its wait queue, unlike an epoll set, whose callback
/// runs for every datagram a socket receives). False if the call failed.
pub(crate) fn ready_now(fds: &mut [libc::pollfd]) -> bool {
    for p in fds.iter_mut() {
        p.revents = 0;
    }
    // SAFETY: `fds` is a live, exclusively borrowed slice of pollfd of the stated length.
    let rc = unsafe { softhca_io::raw::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
    rc >= 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semaphore_counts() {
        let e = SemEventFd::new().unwrap();
        assert!(!e.try_take());
        assert!(!poll_readable(e.as_raw_fd(), Some(Duration::ZERO)).unwrap());
        e.post();
        e.post();
        assert!(poll_readable(e.as_raw_fd(), Some(Duration::ZERO)).unwrap());
        assert!(e.take(Some(Duration::from_millis(1))).unwrap());
        assert!(e.try_take());
        assert!(!e.take(Some(Duration::from_millis(2))).unwrap());
    }
}
