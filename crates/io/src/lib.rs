//! Batched UDP I/O for RoCEv2 (IBTA Annex A17) on Linux.
//!
//! RoCEv2 rides in UDP datagrams to port 4791. This crate owns the sockets that carry
//! them and nothing about the protocol: it moves datagrams as fast as the kernel allows
//! and tells the caller where each one came from and to which local address it was sent.
//!
//! * [`RoceSocket`]: a non-blocking UDP socket set up like rxe's (DF set, unconnected so
//!   Linux writes IPv4 ID 0 on non-GSO sends), with batched send (`sendmmsg`, GSO through
//!   `UDP_SEGMENT`) and batched receive (`recvmmsg`, GRO through `UDP_GRO`) and per-packet
//!   local address (`IP_PKTINFO` / `IPV6_RECVPKTINFO`). GSO and GRO are probed when the
//!   socket is bound and silently replaced by plain datagrams when the kernel refuses them.
//! * [`ConnectedSender`]: a send-only socket connected to one peer (no route lookup per
//!   send), which knows the IPv4 ID Linux writes on its packets.
//! * [`RecvBatch`]: preallocated receive buffers; [`segments`] splits a GRO datagram back
//!   into the datagrams the peer sent.
//! * [`EventFd`], [`Poller`], [`pin_current_thread`]: what a datapath thread needs to sleep
//!   on its sockets and doorbells and to stay on one CPU.
//! * [`Impair`]: seeded random loss of outgoing packets, for recovery tests on one host.
//!
//! The crate reads no environment: offloads and buffer sizes come in [`BindOptions`].

#![cfg(target_os = "linux")]
#![warn(missing_docs)]

mod affinity;
mod cmsg;
mod connected;
mod error;
mod event;
mod impair;
pub mod raw;
mod recv;
mod sockaddr;
mod socket;

pub use affinity::{allowed_cpus, pin_current_thread, request_nice, request_short_slice};
pub use connected::ConnectedSender;
pub use error::IoError;
pub use event::{Event, EventFd, Events, Interest, Poller};
pub use impair::Impair;
pub use recv::{segments, RecvBatch, RecvMeta, ScatterRecv, Segments};
pub use socket::{BindOptions, Capabilities, RoceSocket, Transmit, ROCE_UDP_PORT};
