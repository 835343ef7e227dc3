//! Errors of the memory table, precise enough for the transport to pick the verbs status.

use crate::access::AccessFlags;

/// Why a registration, a lookup or an access to registered memory was refused.
///
/// How the transport maps them (rxe behaviour):
/// - local access (the WR's own SGEs): [`MemError::LocalLength`] is `IBV_WC_LOC_LEN_ERR`;
///   every other access variant is `IBV_WC_LOC_PROT_ERR`.
/// - remote access (RETH / AtomicETH of a request): [`MemError::Misaligned`] is a NAK
///   Invalid Request (rxe `RESPST_ERR_MISALIGNED_ATOMIC`); every other access variant is
///   a NAK Remote Access Error (rxe `RESPST_ERR_RKEY_VIOLATION`), completing on the
///   requester with `IBV_WC_REM_ACCESS_ERR`.
/// - control path (register, dealloc, ...): [`MemError::errno`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// No live memory region has this key (never issued, deregistered, or an lkey used
    /// as an rkey of a region without remote rights).
    #[error("invalid key {key:#010x}")]
    InvalidKey {
        /// The key presented.
        key: u32,
    },
    /// The key's region belongs to another protection domain than the QP's.
    #[error("key {key:#010x} belongs to another protection domain")]
    WrongPd {
        /// The key presented.
        key: u32,
    },
    /// The region does not grant the rights the access needs.
    #[error("key {key:#010x} lacks access {need:?}")]
    AccessDenied {
        /// The key presented.
        key: u32,
        /// The rights the access needed.
        need: AccessFlags,
    },
    /// `[va, va + len)` is not inside the region's `[iova, iova + length)`.
    #[error("range {va:#x}+{len} is outside the region of key {key:#010x}")]
    OutOfBounds {
        /// The key presented.
        key: u32,
        /// First address of the access.
        va: u64,
        /// Length of the access.
        len: u64,
    },
    /// `va + len` runs past the end of the 64-bit address space (the overflow the
    /// kernel's rxe once missed in `mem_check_range`, CVE-2016-8636).
    #[error("range {va:#x}+{len} overflows the address space")]
    Overflow {
        /// First address of the access.
        va: u64,
        /// Length of the access.
        len: u64,
    },
    /// An atomic's address is not 8-byte aligned (IBTA 9.4.5; NAK Invalid Request).
    #[error("atomic address {va:#x} is not 8-byte aligned")]
    Misaligned {
        /// The address presented.
        va: u64,
    },
    /// The scatter/gather list is shorter than the data (`IBV_WC_LOC_LEN_ERR`).
    #[error("scatter/gather list too short: {needed} bytes needed, {available} available")]
    LocalLength {
        /// Bytes the access needed (offset + data length).
        needed: u64,
        /// Total length of the SGEs.
        available: u64,
    },
    /// The protection domain does not exist.
    #[error("invalid protection domain {pd}")]
    InvalidPd {
        /// The handle presented.
        pd: u32,
    },
    /// The protection domain still has memory regions or users (EBUSY).
    #[error("resource busy")]
    Busy,
    /// The table has no free slot for another region (ENOMEM).
    #[error("too many memory regions")]
    NoResources,
    /// A malformed request (EINVAL), with the rule it broke.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
}

impl MemError {
    /// The errno a verbs control call returns for this error (`ibv_reg_mr`,
    /// `ibv_dealloc_pd`, ...): EBUSY, ENOMEM, or EINVAL for everything else.
    pub fn errno(&self) -> i32 {
        const EINVAL: i32 = 22;
        const EBUSY: i32 = 16;
        const ENOMEM: i32 = 12;
        match self {
            MemError::Busy => EBUSY,
            MemError::NoResources => ENOMEM,
            _ => EINVAL,
        }
    }

    /// True for the error that a local access turns into `IBV_WC_LOC_LEN_ERR` (the rest
    /// of the access errors are protection errors).
    pub fn is_length_error(&self) -> bool {
        matches!(self, MemError::LocalLength { .. })
    }

    /// True for the error that a responder answers with a NAK Invalid Request rather than
    /// a NAK Remote Access Error (misaligned atomic, IBTA 9.4.5 / C9-28-like rule, rxe
    /// `RESPST_ERR_MISALIGNED_ATOMIC`).
    pub fn is_invalid_request(&self) -> bool {
        matches!(self, MemError::Misaligned { .. })
    }
}
