//! Event plumbing for a datapath thread: an eventfd doorbell and an epoll wrapper.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::IoError;

/// An `eventfd(2)` doorbell: application threads [`notify`](EventFd::notify) after
/// posting work, the datapath thread sleeps on it in a [`Poller`] and
/// [`drain`](EventFd::drain)s it when woken. Non-blocking and close-on-exec.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Creates a doorbell with count 0.
    pub fn new() -> Result<Self, IoError> {
        // SAFETY: plain syscall; a non-negative return is a new fd we then own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(IoError::last_os("eventfd"));
        }
        // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
        Ok(EventFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Rings the doorbell (adds 1), making the fd readable. Cannot fail in practice: the
    /// only error, `EAGAIN` when the 64-bit counter is saturated, leaves it readable too.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64, as eventfd(2) requires.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            );
        }
    }

    /// Resets the doorbell and returns how many times it was rung since the last drain
    /// (0 if never).
    pub fn drain(&self) -> u64 {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64, as eventfd(2) requires.
        let rc = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                &mut count as *mut u64 as *mut libc::c_void,
                8,
            )
        };
        if rc == 8 {
            count
        } else {
            0
        }
    }

    /// The file descriptor, to register with a [`Poller`] (or hand to C as a completion
    /// channel fd).
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Which readiness a registration waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// Wake when readable (`EPOLLIN`).
    pub readable: bool,
    /// Wake when writable (`EPOLLOUT`), e.g. after `send` returned `WouldBlock`.
    pub writable: bool,
}

impl Interest {
    /// Readable only.
    pub const READABLE: Interest = Interest {
        readable: true,
        writable: false,
    };
    /// Writable only.
    pub const WRITABLE: Interest = Interest {
        readable: false,
        writable: true,
    };
    /// Both.
    pub const BOTH: Interest = Interest {
        readable: true,
        writable: true,
    };

    fn bits(self) -> u32 {
        let mut b = 0;
        if self.readable {
            b |= libc::EPOLLIN as u32;
        }
        if self.writable {
            b |= libc::EPOLLOUT as u32;
        }
        b
    }
}

/// One readiness event from [`Poller::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The token given at registration.
    pub token: u64,
    /// Readable (or hung up, so a read will not block).
    pub readable: bool,
    /// Writable.
    pub writable: bool,
    /// `EPOLLERR`: an error is pending on the fd.
    pub error: bool,
}

/// Space for the events one [`Poller::wait`] can return.
#[derive(Debug)]
pub struct Events {
    buf: Vec<libc::epoll_event>,
    len: usize,
}

impl Events {
    /// Room for `n` events per wait (at least 1).
    pub fn with_capacity(n: usize) -> Self {
        Events {
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; n.clamp(1, 4096)],
            len: 0,
        }
    }

    /// Events from the last wait.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the last wait timed out or was interrupted.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The events from the last wait.
    pub fn iter(&self) -> impl Iterator<Item = Event> + '_ {
        self.buf[..self.len].iter().map(|e| {
            // Copy out of the (packed on x86-64) struct before use.
            let bits = e.events;
            let token = e.u64;
            Event {
                token,
                readable: bits & (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLRDHUP) as u32 != 0,
                writable: bits & libc::EPOLLOUT as u32 != 0,
                error: bits & libc::EPOLLERR as u32 != 0,
            }
        })
    }
}

/// An `epoll(7)` instance, level-triggered: the datapath thread sleeps here on its
/// sockets, doorbells and timers when there is nothing to poll.
#[derive(Debug)]
pub struct Poller {
    fd: OwnedFd,
}

impl Poller {
    /// Creates an epoll instance (close-on-exec).
    pub fn new() -> Result<Self, IoError> {
        // SAFETY: plain syscall; a non-negative return is a new fd we then own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(IoError::last_os("epoll_create1"));
        }
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nobody else.
        Ok(Poller {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ctl(
        &self,
        op: libc::c_int,
        fd: RawFd,
        token: u64,
        interest: Interest,
        what: &'static str,
    ) -> Result<(), IoError> {
        let mut ev = libc::epoll_event {
            events: interest.bits(),
            u64: token,
        };
        // SAFETY: `ev` is a live epoll_event; the kernel validates both fds.
        let rc = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) };
        if rc != 0 {
            return Err(IoError::last_os(what));
        }
        Ok(())
    }

    /// Watches `fd` for readability; `token` comes back in [`Event::token`].
    pub fn add(&self, fd: RawFd, token: u64) -> Result<(), IoError> {
        self.add_with(fd, token, Interest::READABLE)
    }

    /// Watches `fd` for the given readiness.
    pub fn add_with(&self, fd: RawFd, token: u64, interest: Interest) -> Result<(), IoError> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, interest, "epoll_ctl(ADD)")
    }

    /// Changes the token or readiness of a watched `fd` (e.g. add writability while a
    /// send is blocked).
    pub fn modify(&self, fd: RawFd, token: u64, interest: Interest) -> Result<(), IoError> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, interest, "epoll_ctl(MOD)")
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: RawFd) -> Result<(), IoError> {
        self.ctl(
            libc::EPOLL_CTL_DEL,
            fd,
            0,
            Interest::READABLE,
            "epoll_ctl(DEL)",
        )
    }

    /// Waits until a watched fd is ready or `timeout` passes (`None`: forever;
    /// `Some(ZERO)`: just poll). Returns the number of events now in `events`; 0 on
    /// timeout or when interrupted by a signal. The timeout is kept to the microsecond
    /// (`epoll_pwait2`, Linux 5.11): a sender paced at 1 Gb/s waits about 0.5 ms between
    /// GSO sends, and `epoll_wait`'s milliseconds would halve its rate. Older kernels
    /// round it up to 1 ms, never down to a busy 0.
    pub fn wait(&self, events: &mut Events, timeout: Option<Duration>) -> io::Result<usize> {
        events.len = 0;
        let cap = events.buf.len().min(libc::c_int::MAX as usize) as libc::c_int;
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `events.buf` has room for `cap` events; `tsp` is null or points at `ts`,
        // alive for the call; a null signal mask leaves the mask alone.
        let mut rc = unsafe {
            libc::epoll_pwait2(
                self.fd.as_raw_fd(),
                events.buf.as_mut_ptr(),
                cap,
                tsp,
                std::ptr::null(),
            )
        };
        if rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            let ms: libc::c_int = match timeout {
                None => -1,
                Some(d) => {
                    d.as_micros().div_ceil(1000).min(libc::c_int::MAX as u128) as libc::c_int
                }
            };
            // SAFETY: as above.
            rc = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.buf.as_mut_ptr(), cap, ms) };
        }
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(err);
        }
        events.len = (rc as usize).min(events.buf.len());
        Ok(events.len)
    }

    /// The epoll fd itself (it can be nested in another poller or event loop).
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsRawFd for Poller {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn eventfd_counts_and_drains() {
        let e = EventFd::new().unwrap();
        assert_eq!(e.drain(), 0);
        e.notify();
        e.notify();
        e.notify();
        assert_eq!(e.drain(), 3);
        assert_eq!(e.drain(), 0);
    }

    #[test]
    fn poller_wakes_on_doorbell_and_times_out() {
        let p = Poller::new().unwrap();
        let a = EventFd::new().unwrap();
        let b = EventFd::new().unwrap();
        p.add(a.as_raw_fd(), 7).unwrap();
        p.add(b.as_raw_fd(), 9).unwrap();
        let mut ev = Events::with_capacity(8);

        let t0 = Instant::now();
        assert_eq!(
            p.wait(&mut ev, Some(Duration::from_micros(1500))).unwrap(),
            0
        );
        assert!(
            t0.elapsed() >= Duration::from_millis(1),
            "1.5 ms rounds up, not to 0"
        );
        assert!(ev.is_empty());

        b.notify();
        assert_eq!(p.wait(&mut ev, Some(Duration::from_secs(5))).unwrap(), 1);
        let got: Vec<Event> = ev.iter().collect();
        assert_eq!(got[0].token, 9);
        assert!(got[0].readable && !got[0].error);

        // Level-triggered: still ready until drained.
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 1);
        assert_eq!(b.drain(), 1);
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 0);

        // Wake from another thread.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                a.notify();
            });
            assert_eq!(p.wait(&mut ev, None).unwrap(), 1);
        });
        assert_eq!(ev.iter().next().map(|e| e.token), Some(7));

        p.modify(a.as_raw_fd(), 8, Interest::WRITABLE).unwrap();
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 1);
        let e = ev.iter().next().unwrap();
        assert_eq!((e.token, e.writable), (8, true));
        p.delete(a.as_raw_fd()).unwrap();
        p.delete(b.as_raw_fd()).unwrap();
        assert!(p.delete(b.as_raw_fd()).is_err(), "double delete is ENOENT");
        assert_eq!(p.wait(&mut ev, Some(Duration::ZERO)).unwrap(), 0);
    }
}
