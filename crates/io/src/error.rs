//! Error type for socket set-up and the event plumbing.

use std::io;
use std::net::SocketAddr;

/// What went wrong while setting up I/O. Hot-path calls ([`crate::RoceSocket::send`],
/// [`crate::RoceSocket::recv`], [`crate::Poller::wait`]) return plain [`io::Error`]s
/// instead, because their callers branch on [`io::ErrorKind::WouldBlock`].
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// Binding the UDP socket failed for a reason other than the two below.
    #[error("cannot bind UDP socket to {addr}: {source}")]
    Bind {
        /// The address we tried to bind.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// `EADDRINUSE`: another socket (another device, or rxe itself) holds the address.
    #[error("address {0} is already in use")]
    AddrInUse(SocketAddr),
    /// `EADDRNOTAVAIL`: the IP address is not configured on this host.
    #[error("address {} is not assigned to any interface on this host", .0.ip())]
    AddrNotAvailable(SocketAddr),
    /// Any other system call failure; `what` names the call or option.
    #[error("{what}: {source}")]
    Os {
        /// The system call or socket option that failed.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

impl IoError {
    /// The errno behind this error, when there is one (for the C ABI's errno mapping).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            IoError::Bind { source, .. } | IoError::Os { source, .. } => source.raw_os_error(),
            IoError::AddrInUse(_) => Some(libc::EADDRINUSE),
            IoError::AddrNotAvailable(_) => Some(libc::EADDRNOTAVAIL),
        }
    }

    /// Builds an [`IoError::Os`] from the current `errno`.
    pub(crate) fn last_os(what: &'static str) -> Self {
        IoError::Os {
            what,
            source: io::Error::last_os_error(),
        }
    }

    /// Maps a `bind(2)` failure to the variant a user can act on.
    pub(crate) fn from_bind(addr: SocketAddr, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::EADDRINUSE) => IoError::AddrInUse(addr),
            Some(libc::EADDRNOTAVAIL) => IoError::AddrNotAvailable(addr),
            _ => IoError::Bind { addr, source },
        }
    }
}
