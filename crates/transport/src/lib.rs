//! softhca-transport: the sans-IO RoCEv2 engine (RC, UC, UD queue pairs).
//!
//! The engine takes posted work, received datagrams and the current time, and hands back
//! datagrams to send, the next timer deadline, completions and async events. It never
//! does I/O or reads a clock (the quinn-proto shape), so every protocol path is testable
//! over a simulated network with virtual time.
//!
//! Packets are `softhca-wire`'s: its `Headers`, `Opcode` table and `Psn` are the
//! engine's packet model, with no second copy here.
//!
//! Layout: [`verbs`] (verbs-level types), [`engine`] (QP table, demux, transmit, the
//! `handle_*`/`poll_*` API), `control` (create/modify/query/destroy), `config`,
//! `datagram` (what crosses the edge with a datagram), `ipv4_id` (the IPv4 ID the ICRC
//! covers), `qp` (QP state, state machine), `requester` (segmentation, PSNs),
//! `completer` (ACK/NAK/READ response handling, completions, timers), `responder`
//! (receive side), `recovery` (loss recovery policy), `path` (path choice), `timers`,
//! [`counters`].
#![warn(missing_docs)]
// The panic-free wall of softhca-wire: byte and queue access goes through `get`/`get_mut`
// and fallible steps return, so a malformed packet or a stale index drops a packet and
// never panics the datapath.
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

pub mod bringup;
pub mod cc;
mod completer;
mod config;
mod control;
pub mod counters;
mod datagram;
mod direct;
pub mod engine;
pub mod error;
mod ipv4_id;
pub mod mcast;
pub mod multipath;
mod path;
mod qp;
mod recovery;
mod requester;
mod responder;
mod timers;
pub mod verbs;

pub use cc::{CcAlgorithm, CcStats, DelayAimdConfig};
pub use config::{EngineConfig, JUMBO_UNIT};
pub use counters::Counters;
pub use datagram::{DatagramInfo, TailCrc, Transmit, TxPiece};
pub use direct::DirectPlan;
pub use engine::{Engine, SegmentKind};
pub use error::TransportError;
pub use multipath::{MpConfig, MpPathStats, MpState, MpStats};
pub use softhca_memory::External;
pub use verbs::*;
