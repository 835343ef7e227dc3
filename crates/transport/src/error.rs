//! Errors returned by the engine's control and post calls.

use crate::verbs::MemError;

/// Why an engine call failed. [`TransportError::errno`] gives the errno libibverbs returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// A bad argument (EINVAL): illegal transition, wrong mask, bad WR, wrong state.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A queue is full (ENOMEM, as rxe returns for a full work queue).
    #[error("queue full")]
    NoMemory,
    /// A handle that names nothing.
    #[error("no such object")]
    NotFound,
    /// The object is still in use (EBUSY).
    #[error("object busy")]
    Busy,
    /// Not supported (EOPNOTSUPP).
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// A memory table error.
    #[error("memory: {0}")]
    Memory(#[from] MemError),
}

impl TransportError {
    /// The errno value libibverbs callers expect.
    pub fn errno(&self) -> i32 {
        match self {
            TransportError::InvalidArgument(_) => 22, // EINVAL
            TransportError::NoMemory => 12,           // ENOMEM
            TransportError::NotFound => 22,           // EINVAL: a stale handle is a bad argument
            TransportError::Busy => 16,               // EBUSY
            TransportError::NotSupported(_) => 95,    // EOPNOTSUPP
            TransportError::Memory(_) => 22,
        }
    }
}
