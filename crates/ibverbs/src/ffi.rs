//! The C boundary: catch every panic, return errno the libibverbs way.
//!
//! The workspace builds with `panic = "unwind"` (and a cdylib cannot override it), so
//! each entry point runs its body in [`std::panic::catch_unwind`]: a panic becomes
//! `EIO` (int verbs) or NULL + `errno = EIO` (constructors), never an unwind into C.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::errno::{debug, set_errno, Errno};

fn caught(what: &str) {
    debug(format_args!("panic caught in {what}"));
}

/// An int-returning verb: 0 on success, a positive errno on failure (libibverbs'
/// convention for `ibv_modify_qp`, `ibv_post_send`, `ibv_dealloc_pd`, ...).
pub(crate) fn guard_int(what: &str, f: impl FnOnce() -> Result<c_int, Errno>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(Errno(e))) => {
            debug(format_args!("{what}: errno {e}"));
            e
        }
        Err(_) => {
            caught(what);
            libc::EIO
        }
    }
}

/// A verb that returns -1 and sets `errno` on failure (`ibv_get_cq_event`,
/// `ibv_get_async_event`, `ibv_query_gid`, ...).
pub(crate) fn guard_neg(what: &str, f: impl FnOnce() -> Result<c_int, Errno>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(Errno(e))) => {
            debug(format_args!("{what}: errno {e}"));
            set_errno(e);
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
pub(crate) fn guard_ptr<T>(what: &str, f: impl FnOnce() -> Result<*mut T, Errno>) -> *mut T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(p)) => p,
        Ok(Err(Errno(e))) => {
            debug(format_args!("{what}: errno {e}"));
            set_errno(e);
            std::ptr::null_mut()
        }
        Err(_) => {
            caught(what);
            set_errno(libc::EIO);
            std::ptr::null_mut()
        }
    }
}

/// A function with a plain return value (getters, `void` verbs): `fallback` on panic.
pub(crate) fn guard_val<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            caught(what);
            fallback
        }
    }
}

/// `p` as a shared reference, or `EINVAL` for NULL.
///
/// # Safety
/// A non-null `p` must point to a live `T` for `'a`.
pub(crate) unsafe fn nonnull<'a, T>(p: *const T) -> Result<&'a T, Errno> {
    // SAFETY: forwarded from this function's contract.
    unsafe { p.as_ref() }.ok_or(Errno::INVAL)
}

/// `p` as a mutable reference, or `EINVAL` for NULL.
///
/// # Safety
/// A non-null `p` must point to a live `T` not otherwise borrowed for `'a`.
pub(crate) unsafe fn nonnull_mut<'a, T>(p: *mut T) -> Result<&'a mut T, Errno> {
    // SAFETY: forwarded from this function's contract.
    unsafe { p.as_mut() }.ok_or(Errno::INVAL)
}

/// Copies `src` into the caller's buffer of `len` bytes at `dst`: the extensible-struct
/// convention (`attr_size`, `port_attr_len`, `entry_size`) where an older caller has a
/// shorter struct. Bytes beyond our struct are zeroed.
///
/// # Safety
/// `dst` must be valid for `len` bytes of writes.
pub(crate) unsafe fn copy_sized<T: Copy>(src: &T, dst: *mut u8, len: usize) {
    let n = len.min(std::mem::size_of::<T>());
    // SAFETY: `src` is `size_of::<T>() >= n` bytes; `dst` is valid for `len >= n` bytes
    // (contract); they do not overlap (`src` is our own value).
    unsafe {
        std::ptr::copy_nonoverlapping(src as *const T as *const u8, dst, n);
        if len > n {
            std::ptr::write_bytes(dst.add(n), 0, len - n);
        }
    }
}
