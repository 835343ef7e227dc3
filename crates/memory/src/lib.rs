//! softhca-memory: protection domains, memory regions, L_Keys / R_Keys, access rights,
//! and checked access to registered memory.
//!
//! This is the only crate of softhca that dereferences registered memory: other crates
//! hold its addresses only to hand them to the kernel, as the iovecs of a zero-copy send
//! (see [`External`]). A memory registration is a raw `(address, length)` grant, as with
//! DMA ([`MemoryTable::register`] is `unsafe` and states the contract); every later
//! access names the memory by key and iova, and is checked against the key's region —
//! its protection domain, its rights and its bounds, with checked arithmetic — before a
//! byte moves. Semantics follow Linux rxe (`rxe_mr.c`, `rxe_resp.c` `check_rkey`) and
//! the verbs rules of rdma-core `libibverbs/verbs.h`; see [`MemError`] for how each
//! refusal maps to a work completion status or a NAK.
//!
//! Per-packet calls ([`MemoryTable::remote_write`], [`MemoryTable::scatter`], ...) are
//! O(1) per SGE and never allocate.

#![warn(missing_docs)]

mod access;
mod copy_crc;
mod error;
mod key;
mod table;
mod window;

pub use access::AccessFlags;
pub use error::MemError;
pub use table::{
    AtomicOp, External, Grantee, MemoryTable, MrInfo, MrKeys, PdId, Rereg, Sge, Translation,
};
pub use window::{MwBind, MwType};
