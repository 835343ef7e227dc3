//! What softhca cannot do, with the return values libibverbs documents:
//! multicast, XRC, ECE, device/PD/MR import, dma-buf MRs, re-registration, and the
//! provider-private `ibv_cmd_*` / `verbs_*` family (which exists only so that provider
//! libraries such as libmlx5 and libefa, which perftest links directly, load: no provider
//! is ever given a device by this library).

use std::ffi::{c_int, c_void};

use crate::abi::{ibv_mr, ibv_pd};
use crate::errno::{set_errno, Errno};
use crate::ffi::guard_neg;

/// An int verb that is not supported: `EOPNOTSUPP` (also in errno, for callers that
/// look there).
fn notsup_int() -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// A constructor that is not supported: NULL with `errno = EOPNOTSUPP`.
fn notsup_ptr() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// Defines argument-ignoring entry points (the C caller's arguments sit in registers we
/// never read, which the SysV ABI allows).
macro_rules! stubs {
    (int: $($n:ident),* $(,)?) => {
        $(pub(crate) unsafe extern "C" fn $n() -> c_int { notsup_int() })*
    };
    (ptr: $($n:ident),* $(,)?) => {
        $(pub(crate) unsafe extern "C" fn $n() -> *mut c_void { notsup_ptr() })*
    };
    (void: $($n:ident),* $(,)?) => {
        $(pub(crate) unsafe extern "C" fn $n() {})*
    };
}

stubs!(int:
    ibv_set_ece, ibv_query_ece,
    ibv_read_ibdev_sysfs_file, execute_ioctl, verbs_init_cq,
    ibv_cmd_advise_mr, ibv_cmd_alloc_dm, ibv_cmd_alloc_mw, ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast, ibv_cmd_close_xrcd, ibv_cmd_create_ah, ibv_cmd_create_counters,
    ibv_cmd_create_cq, ibv_cmd_create_cq_ex, ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp, ibv_cmd_create_qp, ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2, ibv_cmd_create_rwq_ind_table, ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex, ibv_cmd_create_wq, ibv_cmd_dealloc_mw, ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr, ibv_cmd_destroy_ah, ibv_cmd_destroy_counters, ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow, ibv_cmd_destroy_flow_action, ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table, ibv_cmd_destroy_srq, ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast, ibv_cmd_free_dm, ibv_cmd_get_context, ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp, ibv_cmd_modify_qp, ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq, ibv_cmd_modify_wq, ibv_cmd_open_qp, ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq, ibv_cmd_post_recv, ibv_cmd_post_send, ibv_cmd_post_srq_recv,
    ibv_cmd_query_context, ibv_cmd_query_device_any, ibv_cmd_query_mr, ibv_cmd_query_port,
    ibv_cmd_query_qp, ibv_cmd_query_srq, ibv_cmd_read_counters, ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr, ibv_cmd_reg_mr, ibv_cmd_req_notify_cq, ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);

stubs!(ptr:
    ibv_import_device, ibv_import_pd, ibv_import_mr, ibv_import_dm, ibv_reg_dmabuf_mr,
    _verbs_init_and_alloc_context, verbs_open_device,
);

stubs!(void:
    ibv_unimport_pd, ibv_unimport_mr, ibv_unimport_dm, ibv_register_driver,
    verbs_register_driver_34, verbs_set_ops, verbs_uninit_context, __verbs_log,
    ibv_copy_qp_attr_from_kern, ibv_copy_path_rec_from_kern, ibv_copy_path_rec_to_kern,
);

/// `__ioctl_final_num_attrs`: only used by providers building ioctl commands.
pub(crate) unsafe extern "C" fn __ioctl_final_num_attrs(num: u32, _link: *mut c_void) -> u32 {
    num
}

/// `ibv_rereg_mr` flags (`enum ibv_rereg_mr_flags`).
const REREG_CHANGE_TRANSLATION: c_int = 1;
const REREG_CHANGE_ACCESS: c_int = 4;
const REREG_FLAGS_SUPPORTED: c_int = 7;
/// `IBV_REREG_MR_ERR_CMD`: the provider refused, errno says why (the MR is unchanged).
const REREG_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr`, as libibverbs with the rxe provider, which has no `rereg_mr`:
/// libibverbs' own argument checks fail with `IBV_REREG_MR_ERR_INPUT` (-1) and errno
/// EINVAL; a valid request reaches the missing op (rdma-core `dummy_ops.c`: errno
/// EOPNOTSUPP) and fails with `IBV_REREG_MR_ERR_CMD` (-4). The MR is left as it was.
pub(crate) unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    _pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard_neg("ibv_rereg_mr", || {
        let translation = flags & REREG_CHANGE_TRANSLATION != 0;
        if mr.is_null()
            || flags & !REREG_FLAGS_SUPPORTED != 0
            || (translation && (addr.is_null() || length == 0))
            || (access != 0 && flags & REREG_CHANGE_ACCESS == 0)
        {
            return Err(Errno::INVAL);
        }
        set_errno(libc::EOPNOTSUPP);
        Ok(REREG_ERR_CMD)
    })
}
