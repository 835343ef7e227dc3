//! What softhca's librdmacm does not implement. Every symbol exists (Debian's binaries
//! are linked BIND_NOW, and every rdma-core example pulls `rpoll` in through common.c);
//! each fails with -1 and a clear errno.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_void};

use crate::abi::rdma_cm_id;
use crate::error::{guard_neg, Error};

/// ECE: rxe has none, and neither has softhca (`ibv_query_ece` is EOPNOTSUPP).
pub unsafe extern "C" fn rdma_set_local_ece(_: *mut rdma_cm_id, _: *mut c_void) -> c_int {
    guard_neg("rdma_set_local_ece", || Err(Error::NotSupported("ECE")))
}
pub unsafe extern "C" fn rdma_get_remote_ece(_: *mut rdma_cm_id, _: *mut c_void) -> c_int {
    guard_neg("rdma_get_remote_ece", || Err(Error::NotSupported("ECE")))
}

/// rsockets: not implemented. Arguments are ignored (the x86-64 calling convention lets a
/// callee take fewer than it is given), and -1 in RAX is -1 as `int`, `ssize_t` and `off_t`.
macro_rules! rsocket_stubs {
    ($($name:ident),* $(,)?) => {$(
        pub unsafe extern "C" fn $name() -> isize {
            crate::error::guard_val(stringify!($name), -1, || {
                crate::error::set_errno(libc::ENOSYS);
                -1
            })
        }
    )*};
}

rsocket_stubs!(
    rsocket,
    rbind,
    rlisten,
    raccept,
    rconnect,
    rshutdown,
    rclose,
    rrecv,
    rrecvfrom,
    rrecvmsg,
    rsend,
    rsendto,
    rsendmsg,
    rread,
    rreadv,
    rwrite,
    rwritev,
    rpoll,
    rselect,
    rgetpeername,
    rgetsockname,
    rsetsockopt,
    rgetsockopt,
    rfcntl,
    riomap,
    riounmap,
    riowrite,
);
