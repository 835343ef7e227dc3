//! The one error type of the public API, and its errno mapping.

use softhca_io::IoError;
use softhca_transport::TransportError;

/// Why a softhca call failed. Messages are one line and name the offending value.
///
/// [`Error::errno`] maps every variant to the errno libibverbs would return, in this one
/// place, so the C ABI layer never has to guess.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The transport engine refused the request (bad state, full queue, bad handle...).
    #[error("{0}")]
    Transport(#[from] TransportError),
    /// Socket or event set-up failed (address in use, not assigned, ...).
    #[error("{0}")]
    Io(#[from] IoError),
    /// The configuration (environment variables or [`crate::Config`]) cannot be served.
    #[error("{0}")]
    Config(String),
    /// The device was closed (its datapath thread stopped).
    #[error("device closed")]
    Closed,
    /// An argument was out of range; the text names which.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A system call outside the socket layer failed (eventfd, poll, getifaddrs).
    #[error("{what}: {source}")]
    Os {
        /// The call that failed.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Error {
    /// The errno value a libibverbs caller expects for this error (positive).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Transport(e) => e.errno(),
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Config(_) => libc::EINVAL,
            Error::Closed => libc::ENODEV,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// An [`Error::Os`] from the current `errno`.
    pub(crate) fn last_os(what: &'static str) -> Error {
        Error::Os {
            what,
            source: std::io::Error::last_os_error(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(Error::InvalidArgument("x").errno(), libc::EINVAL);
        assert_eq!(Error::Closed.errno(), libc::ENODEV);
        assert_eq!(
            Error::Transport(TransportError::NoMemory).errno(),
            libc::ENOMEM
        );
        assert_eq!(Error::Transport(TransportError::Busy).errno(), libc::EBUSY);
        let a = "127.0.0.1:4791".parse().unwrap();
        assert_eq!(Error::Io(IoError::AddrInUse(a)).errno(), libc::EADDRINUSE);
    }
}
