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
//! # Call order
//!
//! ```
//! use softhca_cm::ip::{service_id, PortSpace};
//! use softhca_cm::*;
//! let (a_ip, b_ip) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
//! let mut a = Endpoint::new(EndpointConfig::new(0xa, 1));
//! let mut b = Endpoint::new(EndpointConfig::new(0xb, 2));
//! let sid = service_id(PortSpace::Tcp, 7174);
//! b.listen(sid).unwrap();
//! let ca = a.connect(0, &ConnectParams::new(a_ip, b_ip, sid, Qpn::new(0x11), Psn::new(1))).unwrap();
//! // The device sends what poll_transmit returns to QP1 of that IP; the peer's device
//! // hands it to handle_mad with the source IP.
//! let req = a.poll_transmit().unwrap().mad;
//! b.handle_mad(0, a_ip, 0, &req);
//! let Some(CmEvent::ReqReceived { id: cb, .. }) = b.poll_event() else { panic!() };
//! b.accept(0, cb, &AcceptParams::new(Qpn::new(0x22), Psn::new(2))).unwrap();
//! let rep = b.poll_transmit().unwrap().mad;
//! a.handle_mad(0, b_ip, 0, &rep);
//! let Some(CmEvent::RepReceived { .. }) = a.poll_event() else { panic!() };
//! // Move the QP to RTR/RTS with a.qp_attrs(ca), then:
//! a.establish(0, ca, &[]).unwrap();
//! let rtu = a.poll_transmit().unwrap().mad;
//! b.handle_mad(0, a_ip, 0, &rtu);
//! assert_eq!(b.poll_event(), Some(CmEvent::Established { id: cb }));
//! assert_eq!(a.state(ca), Some(CmState::Established));
//! // Timers: call handle_timeout(now) once now >= poll_timeout().
//! assert_eq!(b.poll_timeout(), None);
//! ```
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
    Outgoing, QpAttrs, SidrReplyParams, SidrRequestParams,
};
pub use error::CmError;
pub use ip::{CmaHdr, PortSpace};
pub use mad::{CmBody, CmMessage, CommId, Gid, MadHeader, RejReason, ServiceId, SidrStatus};
pub use softhca_wire::{Psn, Qpn};
