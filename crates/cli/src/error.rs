//! The errors the command line reports: each prints as one line after `softhca: `.

use std::io;
use std::net::SocketAddr;

/// Everything that makes `softhca` exit with status 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A size argument that is not `N[K|M|G]`.
    #[error("invalid size '{0}'")]
    InvalidSize(String),
    /// Another invalid argument combination.
    #[error("{0}")]
    Usage(String),
    /// The TCP connection to the server failed.
    #[error("cannot reach softhca server at {addr}: {}", io_msg(.source))]
    Connect {
        /// Server address.
        addr: String,
        /// Why.
        source: io::Error,
    },
    /// The server cannot listen on its TCP port.
    #[error("cannot listen on {addr}: {}", io_msg(.source))]
    Listen {
        /// Listen address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The TCP control connection broke or carried garbage.
    #[error("connection exchange with {peer} failed: {msg}")]
    Exchange {
        /// The other side.
        peer: String,
        /// What went wrong.
        msg: String,
    },
    /// The peer reported an error.
    #[error("peer reported: {0}")]
    Peer(String),
    /// A verbs call failed.
    #[error("{what}: {source}")]
    Verbs {
        /// Which call.
        what: std::borrow::Cow<'static, str>,
        /// The device error.
        source: softhca::Error,
    },
    /// Nothing happened for too long.
    #[error("timed out: {0}")]
    Timeout(String),
    /// Data did not match the pattern.
    #[error("verification failed: {0}")]
    Verify(String),
    /// Writing the output failed.
    #[error("output: {}", io_msg(.0))]
    Output(#[from] io::Error),
    /// A perf test failed (its message as it is).
    #[error(transparent)]
    Perf(#[from] softhca_perf::PerfError),
}

impl CliError {
    /// Wraps a device error with the name of the call that failed. A literal name costs
    /// nothing until the error happens (this runs on every post of the benchmarks).
    pub fn verbs(
        what: impl Into<std::borrow::Cow<'static, str>>,
    ) -> impl FnOnce(softhca::Error) -> CliError {
        let what = what.into();
        move |source| CliError::Verbs { what, source }
    }

    /// A control-channel failure.
    pub fn exchange(peer: impl ToString, msg: impl ToString) -> CliError {
        CliError::Exchange {
            peer: peer.to_string(),
            msg: msg.to_string(),
        }
    }
}

pub use softhca_perf::io_msg;
