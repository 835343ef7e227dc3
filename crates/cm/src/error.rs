//! The crate's error type.

use thiserror::Error;

/// What went wrong decoding or encoding a CM MAD or its IP-CM private data, or with an
/// endpoint command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CmError {
    /// The buffer is shorter than the field being read or written.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A MAD must be exactly 256 bytes (IBTA 13.4.2).
    #[error("MAD length {0} is not 256")]
    BadLength(usize),
    /// Base version, management class, class version or method is not the CM's
    /// (1, 0x07, 2, SEND): the kernel's MAD layer would not deliver it to the CM agent.
    #[error("not a CM MAD: {field} = {value:#x}")]
    NotCm {
        /// Header field name.
        field: &'static str,
        /// Value found.
        value: u32,
    },
    /// An attribute ID the CM does not handle here (LAP, APR, ClassPortInfo, unknown).
    #[error("unsupported CM attribute ID {0:#06x}")]
    UnsupportedAttr(u16),
    /// A field holds a value no sender may put there (e.g. MessageRejected 3).
    #[error("invalid {field} = {value}")]
    InvalidField {
        /// Field name.
        field: &'static str,
        /// Value found.
        value: u32,
    },
    /// A value to emit does not fit its field.
    #[error("{field} = {value:#x} does not fit in {bits} bits")]
    FieldRange {
        /// Field name.
        field: &'static str,
        /// Value given.
        value: u32,
        /// Field width.
        bits: u8,
    },
    /// Private data longer than the message carries.
    #[error("private data of {len} bytes exceeds the {max} the message carries")]
    PrivateDataTooLong {
        /// Length given.
        len: usize,
        /// Maximum for this message.
        max: usize,
    },
    /// An endpoint command named a CM ID the endpoint does not know.
    #[error("unknown CM ID {0:#x}")]
    UnknownId(u32),
    /// An endpoint command is not valid in the connection's current state.
    #[error("operation invalid in state {0:?}")]
    InvalidState(crate::endpoint::CmState),
    /// Every local comm ID probed is in use.
    #[error("no free local comm ID")]
    NoCommId,
    /// A listener for this service ID already exists.
    #[error("service ID {0:#018x} is already listened on")]
    AlreadyListening(u64),
}
