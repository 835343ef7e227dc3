//! The one place where failures become errno values.

use std::ffi::c_int;

/// A positive errno value: what an int-returning verb returns, or what a constructor
/// stores in `errno` before returning NULL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Errno(pub c_int);

impl Errno {
    /// A bad argument (`EINVAL`): NULL pointers, out-of-range attributes.
    pub(crate) const INVAL: Errno = Errno(libc::EINVAL);
    /// Something softhca does not implement (memory windows, XRC, flow steering, ...).
    pub(crate) const NOTSUP: Errno = Errno(libc::EOPNOTSUPP);
    /// Out of memory.
    pub(crate) const NOMEM: Errno = Errno(libc::ENOMEM);
    /// Still in use (`EBUSY`): a QP attached to a multicast group cannot be destroyed.
    pub(crate) const BUSY: Errno = Errno(libc::EBUSY);
}

impl From<softhca::Error> for Errno {
    fn from(e: softhca::Error) -> Errno {
        debug(format_args!("softhca error: {e}"));
        Errno(e.errno())
    }
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Prints a diagnostic to stderr when `SOFTHCA_IBV_DEBUG` is set (the C library has no
/// logger a program would have configured).
pub(crate) fn debug(args: std::fmt::Arguments<'_>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| softhca::Diagnostics::from_env().ibv_debug) {
        eprintln!("softhca-ibverbs: {args}");
    }
}

impl From<std::io::Error> for Errno {
    /// A failed `read(2)` of an event fd keeps its errno (`EAGAIN`, `EINTR`, ...), as
    /// rdma-core's event verbs return it.
    fn from(e: std::io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}
