//! softhca-stream: a synthetic machine-vision camera streaming frames into a host
//! receiver in three modes, so their cost can be compared on the same frames:
//!
//! - [`Mode::RcSend`]: RC SENDs into receive buffers the host posted (LUCID Atlas10
//!   style): one receive completion per frame.
//! - [`Mode::UcWrite`]: UC RDMA WRITE of the frame into a ring slot, then a zero-length
//!   WRITE-with-immediate carrying the frame id (Holoscan sensor bridge style). Nothing
//!   is retransmitted; incomplete frames are detected by the frame trailer (see
//!   [`frame`]).
//! - [`Mode::Gvsp`]: GigE Vision stream packets over plain UDP (leader / payload /
//!   trailer, extended 64-bit block ids), holes repaired by GVCP PACKETRESEND requests
//!   answered from the camera's retention buffer.
//!
//! [`run_loopback`] runs a camera and a receiver on two threads of one process over two
//! softhca devices on free loopback addresses and returns a [`RunReport`].
#![warn(missing_docs)]

pub mod apart;
pub mod frame;
pub mod gige;
pub mod gvcp;
pub mod gvsp;
mod harness;
pub mod png;
mod rdma;
pub mod ring;
pub mod stats;
mod udp;

pub use frame::{FrameSpec, PixelFormat};
pub use harness::{run_loopback, Live, Mode, RunReport, StreamConfig};
pub use rdma::{FrameSent, RdmaCamera, RdmaReceiver, RingInfo};
pub use ring::{FrameInfo, FrameStatus, Overflow, RxCounters};
pub use udp::{GvspCamera, GvspReceiver};

/// Errors of the stream library.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A verbs call failed.
    #[error("{what}: {source}")]
    Verbs {
        /// What was being done.
        what: String,
        /// The device error.
        #[source]
        source: softhca::Error,
    },
    /// A socket call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A work completion failed.
    #[error("{op} completion failed: {status:?}")]
    Completion {
        /// The operation.
        op: &'static str,
        /// Its status.
        status: softhca::WcStatus,
    },
    /// Bad parameters.
    #[error("{0}")]
    Invalid(String),
    /// Nothing happened for too long.
    #[error("timeout: {0}")]
    Timeout(String),
}

impl StreamError {
    pub(crate) fn verbs(what: impl Into<String>) -> impl FnOnce(softhca::Error) -> StreamError {
        let what = what.into();
        move |source| StreamError::Verbs { what, source }
    }
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StreamError {
        let what = what.into();
        move |source| StreamError::Io { what, source }
    }
}
