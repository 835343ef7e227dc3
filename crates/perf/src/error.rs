//! Why a test failed: each error prints as one line (the CLI puts `softhca: ` before it).

use std::io;
use std::net::SocketAddr;

/// Everything that makes a test fail.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Invalid parameters (from the caller or sent by the peer).
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
    /// The server address did not resolve.
    #[error("cannot resolve server address '{0}'")]
    Resolve(String),
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
    /// A work completion with an error status.
    #[error("{op} on QP {qpn:#x} completed with status {status:?} (wr_id {wr_id})")]
    Completion {
        /// Operation.
        op: &'static str,
        /// Local QPN.
        qpn: u32,
        /// Status.
        status: softhca::WcStatus,
        /// Work request id.
        wr_id: u64,
    },
    /// Nothing happened for too long.
    #[error("timed out: {0}")]
    Timeout(String),
    /// Data did not match the pattern.
    #[error("verification failed: {0}")]
    Verify(String),
}

impl PerfError {
    /// Wraps a device error with the name of the call that failed. A literal name costs
    /// nothing until the error happens (this runs on every post of the benchmarks).
    pub fn verbs(
        what: impl Into<std::borrow::Cow<'static, str>>,
    ) -> impl FnOnce(softhca::Error) -> PerfError {
        let what = what.into();
        move |source| PerfError::Verbs { what, source }
    }

    /// A control-channel failure.
    pub fn exchange(peer: impl ToString, msg: impl ToString) -> PerfError {
        PerfError::Exchange {
            peer: peer.to_string(),
            msg: msg.to_string(),
        }
    }
}

/// A short lower-case description of an I/O error ("connection refused", "address in use").
///
/// `io::Error`'s Display gives "Connection refused (os error 111)"; a one-line CLI
/// message reads better without the errno suffix.
pub fn io_msg(e: &io::Error) -> String {
    use io::ErrorKind::*;
    let s = match e.kind() {
        ConnectionRefused => "connection refused",
        ConnectionReset => "connection reset by peer",
        ConnectionAborted => "connection aborted",
        AddrInUse => "address in use",
        AddrNotAvailable => "address not available",
        TimedOut | WouldBlock => "timed out",
        UnexpectedEof => "connection closed by peer",
        BrokenPipe => "connection closed by peer",
        PermissionDenied => "permission denied",
        _ => {
            let full = e.to_string();
            let text = match full.find(" (os error") {
                Some(i) => full[..i].to_string(),
                None => full,
            };
            let mut c = text.chars();
            return match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => "unknown error".into(),
            };
        }
    };
    s.to_string()
}
