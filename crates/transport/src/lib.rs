//! softhca-transport: the sans-IO RoCEv2 engine (RC, UC, UD queue pairs).
//!
//! The engine takes posted work, received datagrams and the current time, and hands back
//! datagrams to send, the next timer deadline, completions and async events. It never
//! does I/O or reads a clock (the quinn-proto shape), so every protocol path is testable
//! over a simulated network with virtual time.
//!
//! Layout: [`verbs`] (verbs-level types), [`engine`] (QP table, demux, API),
//! `qp` (QP state, state machine), `requester` (segmentation, PSNs), `completer`
//! (ACK/NAK/READ response handling, completions, timers), `responder` (receive side),
//! `recovery` (loss recovery policy), `path` (path choice), `timers`, [`counters`].
#![warn(missing_docs)]

mod codec_wire;
mod completer;
pub mod counters;
mod deps;
pub mod engine;
pub mod error;
mod packet;
mod path;
mod qp;
mod recovery;
mod requester;
mod responder;
mod timers;
pub mod verbs;

pub use counters::Counters;
pub use engine::{DatagramInfo, Engine, EngineConfig, TailCrc, Transmit, TxPiece};
pub use error::TransportError;
pub use requester::External;
pub use verbs::*;
