//! The one place where failures become errno values, and the C-boundary guards.
//!
//! librdmacm's calls return -1 with `errno` set (its `ERR()` macro) or NULL with `errno`
//! set; this library does the same. The workspace builds with `panic = "unwind"`, so every
//! entry point runs in [`std::panic::catch_unwind`]: a panic becomes `EIO`, never an
//! unwind into C.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("address already in use")]
    AddrInUse,
    #[error("address not available on this host")]
    AddrNotAvail,
    #[error("no RDMA device has this address as a GID")]
    NoDevice,
    #[error("not supported by softhca's librdmacm: {0}")]
    NotSupported(&'static str),
    #[error("not implemented by softhca's librdmacm: {0}")]
    NoSys(&'static str),
    #[error("event channel still used by ids")]
    Busy,
    #[error("connection refused")]
    ConnRefused,
    #[error("{what}: errno {errno}")]
    Os { what: &'static str, errno: c_int },
    #[error("no route to the destination (errno {0})")]
    NoRoute(c_int),
    #[error("connection manager: {0}")]
    Cm(#[from] softhca_cm::CmError),
    #[error("event status {0}")]
    Status(c_int),
}

impl Error {
    pub(crate) fn errno(&self) -> c_int {
        match self {
            Error::Invalid(_) | Error::Cm(_) => libc::EINVAL,
            Error::AddrInUse => libc::EADDRINUSE,
            Error::AddrNotAvail => libc::EADDRNOTAVAIL,
            Error::NoDevice => libc::ENODEV,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::NoSys(_) => libc::ENOSYS,
            Error::Busy => libc::EBUSY,
            Error::ConnRefused => libc::ECONNREFUSED,
            Error::Os { errno, .. } | Error::NoRoute(errno) => *errno,
            Error::Status(s) => s.abs(),
        }
    }

    /// The calling thread's `errno` after a failed libc or verbs call.
    pub(crate) fn last_os(what: &'static str) -> Error {
        Error::Os {
            what,
            errno: std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Prints a diagnostic to stderr when `SOFTHCA_RDMACM_DEBUG` is set.
pub(crate) fn debug(args: std::fmt::Arguments<'_>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("SOFTHCA_RDMACM_DEBUG").is_some()) {
        eprintln!("softhca-rdmacm: {args}");
    }
}

fn caught(what: &str) {
    eprintln!("softhca-rdmacm: internal error (panic) in {what}");
}

/// An int call: 0 (or a value) on success, -1 with `errno` on failure.
pub(crate) fn guard_neg(what: &str, f: impl FnOnce() -> Result<c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            debug(format_args!("{what}: {e}"));
            set_errno(e.errno());
            -1
        }
        Err(_) => {
            caught(what);
            set_errno(libc::EIO);
            -1
        }
    }
}

/// A constructor: the object, or NULL with `errno` set.
pub(crate) fn guard_ptr<T>(what: &str, f: impl FnOnce() -> Result<*mut T>) -> *mut T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            debug(format_args!("{what}: {e}"));
            set_errno(e.errno());
            std::ptr::null_mut()
        }
        Err(_) => {
            caught(what);
            set_errno(libc::EIO);
            std::ptr::null_mut()
        }
    }
}

/// A call with a plain return value (`void` calls, getters): `fallback` on panic.
pub(crate) fn guard_val<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            caught(what);
            fallback
        }
    }
}
