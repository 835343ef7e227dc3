//! InfiniBand communication management for RoCEv2, wire-compatible with the Linux
//! kernel's `ib_cm` and `rdma_cm` (IBTA Vol 1 chapter 12 and Annex A11).
//!
//! - [`mad`]: the 256-byte CM MAD and its nine messages (REQ, MRA, REJ, REP, RTU, DREQ,
//!   DREP, SIDR_REQ, SIDR_REP): [`mad::parse`] / [`mad::emit`], exact inverses.
//! - [`ip`]: the IP-CM service ID form and the `cma_hdr` at the start of REQ/SIDR_REQ
//!   private data.
//! - [`endpoint`]: a sans-IO CM state machine in the style of quinn-proto. It does no I/O
//!   and reads no clock: the device feeds it MADs received on QP1 with
//!   [`Endpoint::handle_mad`], drives its timers with [`Endpoint::handle_timeout`], and
//!   sends what [`Endpoint::poll_transmit`] returns.
//!
//! Guarantees: no input makes any function here panic (bounds-checked access only, the
//! lints below, property tests), and no unsafe code.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
#![cfg_attr(
    test,
    allow(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic
    )
)]

mod bytes;
pub mod endpoint;
mod error;
pub mod ip;
pub mod mad;

pub use endpoint::{
    AcceptParams, CmEvent, CmId, CmState, ConnectParams, Counters, Endpoint, EndpointConfig, Nanos,
    QpAttrs, SidrReplyParams, SidrRequestParams,
};
pub use error::CmError;
pub use ip::{CmaHdr, PortSpace};
pub use mad::{CmBody, CmMessage, CommId, Gid, MadHeader, RejReason, ServiceId, SidrStatus};
pub use softhca_wire::{Psn, Qpn};
