//! softhca: a user-space RDMA host channel adapter speaking RoCEv2 over UDP — the Rust
//! verbs API.
//!
//! A [`Context`] is an open device: one UDP socket per served address (the GID table),
//! the sans-IO transport engine, and a datapath thread that moves packets between them
//! in batches. The objects are the verbs ones: [`Pd`], [`Mr`], [`Cq`], [`CompChannel`],
//! [`Qp`], [`Srq`], [`Ah`]; work requests, completions and attributes are the
//! transport's verbs types, re-exported here.
//!
//! ```no_run
//! use softhca::*;
//! # fn main() -> Result<(), Error> {
//! let ctx = Context::open(&Config::loopback("127.0.0.1".parse().unwrap()))?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(256, None)?;
//! let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq))?;
//! // exchange qp.qpn(), a PSN and ctx.gids()[0] with the peer, then:
//! // qp.connect_rc(psn, &RemoteQp { qpn, psn, gid }, Mtu::M4096, 0)?;
//! # Ok(()) }
//! ```
//!
//! Configuration (addresses, MTU, CPU, port, polling) comes from [`Config`], usually
//! [`Config::from_env`], the one reader of the `SOFTHCA_*` variables ([`ENV_VARS`]);
//! see [`Context::open`] for how addresses are chosen with zero configuration.
#![warn(missing_docs)]

mod addr;
mod attr;
mod config;
mod context;
mod cq;
mod datapath;
mod error;
mod event;
mod mr;
mod pd;
mod placement;
mod publish;
mod qp;
mod ring;
mod snapshot;
mod stats;
mod sys;
mod turnaround;

pub use smallvec::{smallvec, SmallVec};
pub use softhca_transport::verbs::*;
pub use softhca_transport::{CcStats, Counters, MpConfig, MpPathStats, MpState, MpStats};

pub use addr::{interface_addrs, IfAddr};
pub use attr::{
    gid_words, guid_text, AtomicCap, DeviceAttr, DeviceInfo, LinkLayer, PortAttr, PortState,
};
pub use config::{
    Config, CpuPin, Diagnostics, PollMode, DEFAULT_JUMBO, DEFAULT_SOCKBUF, DEFAULT_SPIN_US,
    ENV_VARS, ROCE_UDP_PORT,
};
pub use context::{devices, jumbo_size, Context, MAX_CQE};
pub use cq::{CompChannel, Cq, CqHandleId};
pub use error::Error;
pub use event::AsyncEvent;
pub use mr::{Advice, Mr, Mw, MwBindInfo, RawMr, PAGE_SIZE};
pub use pd::Pd;
pub use placement::Placement;
pub use publish::{read_all, read_snapshot, Publish};
pub use qp::{defaults, Ah, ConnectOptions, Qp, QpInit, RemoteQp, Srq};
pub use snapshot::{DeviceSnapshot, GidSnapshot, QpSnapshot, Snapshot};
pub use softhca_io::IoError;
pub use softhca_transport::mcast::MULTICAST_QPN;
pub use softhca_transport::TransportError;
