//! The errors the command line reports: each prints as one line after `softhca: `.

use std::io;
use std::net::SocketAddr;

use softhca_perf::PerfError;

/// Everything that makes `softhca` exit with status 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A size argument that is not `N[K|M|G]`.
    #[error("invalid size '{0}'")]
    InvalidSize(String),
    /// Another invalid argument combination.
    #[error("{0}")]
    Usage(String),
    /// Writing the output failed.
    #[error("output: {}", io_msg(.0))]
    Output(#[from] io::Error),
    /// A test failed, or the bench failed in a way a test can (same wording).
    #[error(transparent)]
    Perf(#[from] PerfError),
}

/// The failures the CLI shares with the tests (`softhca_perf::PerfError`), so that both
/// word them alike.
impl CliError {
    /// Wraps a device error with the name of the call that failed.
    pub fn verbs(
        what: impl Into<std::borrow::Cow<'static, str>>,
    ) -> impl FnOnce(softhca::Error) -> CliError {
        let wrap = PerfError::verbs(what);
        move |source| CliError::Perf(wrap(source))
    }

    /// A control-channel failure.
    pub fn exchange(peer: impl ToString, msg: impl ToString) -> CliError {
        PerfError::exchange(peer, msg).into()
    }

    /// The peer reported an error.
    pub fn peer(msg: String) -> CliError {
        PerfError::Peer(msg).into()
    }

    /// Nothing happened for too long.
    pub fn timeout(msg: String) -> CliError {
        PerfError::Timeout(msg).into()
    }

    /// Data did not match.
    pub fn verify(msg: String) -> CliError {
        PerfError::Verify(msg).into()
    }

    /// Cannot listen on `addr`.
    pub fn listen(addr: SocketAddr) -> impl FnOnce(io::Error) -> CliError {
        move |source| PerfError::Listen { addr, source }.into()
    }
}

pub use softhca_perf::io_msg;
