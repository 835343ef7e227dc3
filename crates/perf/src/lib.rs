//! perftest-like benchmarks over softhca RC queue pairs, as a library: the `softhca`
//! command parses arguments and prints; everything measured lives here.
//!
//! * [`exchange`]: the TCP connection exchange (parameters, QP data, credits, verdicts).
//! * [`run_test`] (client) and [`serve_test`] (server) run one bandwidth or latency test
//!   over a connected [`exchange::Control`], [`run_bw`] and [`run_lat`] name the two kinds.
//! * [`setup`]: the per-test resources of one side and their RC connection.
//! * [`pattern`]: the data pattern `--verify` checks.
//! * [`blast`]: raw UDP throughput with GSO and GRO, the ceiling for any UDP transport.
//! * [`host`]: what a system call and the ICRC cost on this host.
//!
//! Both ends run the same code, in two processes (`softhca perf --loopback` starts the
//! server as a child) or two threads.

#![cfg(target_os = "linux")]
#![warn(missing_docs)]

pub mod blast;
mod bw;
mod client;
mod error;
pub mod exchange;
pub mod host;
mod lat;
pub mod pattern;
mod progress;
mod result;
mod server;
pub mod setup;

use std::time::Duration;

pub use client::{params, run_bw, run_lat, run_test, TestOptions};
pub use error::{io_msg, PerfError};
pub use exchange::{Control, TestParams, DEFAULT_PORT};
pub use progress::{Progress, ProgressLog};
pub use result::{LatStats, Mode, PerfResult};
pub use server::{serve_test, Served};

/// How long nothing may happen before a side gives up.
pub const STALL: Duration = Duration::from_secs(10);

/// The largest message an RC QP carries (IBTA: a message is at most 2^31 bytes).
pub const MAX_MESSAGE: u64 = 1 << 31;

/// The operation of one test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// SEND / RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// FETCH_AND_ADD.
    Atomic,
}

impl Op {
    /// Wire and JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
            Op::Atomic => "atomic",
        }
    }

    /// The operation named `s` ([`Op::name`]).
    pub fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "send" => Op::Send,
            "write" => Op::Write,
            "read" => Op::Read,
            "atomic" => Op::Atomic,
            _ => return None,
        })
    }
}

/// What a client measured.
pub(crate) struct Outcome {
    /// Messages completed per QP.
    pub counts: Vec<u64>,
    /// Measured wall time.
    pub seconds: f64,
    /// Round-trip samples in ns (latency tests).
    pub samples: Vec<u64>,
}

/// What a server saw.
pub(crate) struct ServerOutcome {
    /// Messages per QP (the client's count).
    pub counts: Vec<u64>,
    /// Verification result on the server side.
    pub verdict: Result<(), String>,
}
