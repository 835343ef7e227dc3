//! The libibverbs C API this library uses: the exported functions (linked against the
//! system's libibverbs, NEEDED `libibverbs.so.1`), the `static inline` ones compiled from
//! `c/verbs_inline.c`, and softhca's one private verb, looked up at run time.

use std::ffi::{c_char, c_int, c_void};

use crate::abi::*;

#[allow(dead_code)]
extern "C" {
    pub fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device;
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char;
    pub fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context;
    pub fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    pub fn ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid)
        -> c_int;
    pub fn _ibv_query_gid_ex(
        ctx: *mut ibv_context,
        port: u32,
        index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int;
    pub fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd;
    pub fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int)
        -> *mut ibv_mr;
    pub fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel;
    pub fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int;
    pub fn ibv_create_cq(
        ctx: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    pub fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub fn ibv_get_cq_event(
        ch: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        ctx: *mut *mut c_void,
    ) -> c_int;
    pub fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32);
    pub fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    pub fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    pub fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
    pub fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
    pub fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah;
    pub fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int;
    pub fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;

    // c/verbs_inline.c
    pub fn softhca_rdmacm_create_qp_ex(
        ctx: *mut ibv_context,
        attr: *mut ibv_qp_init_attr_ex,
    ) -> *mut ibv_qp;
    pub fn softhca_rdmacm_create_srq_ex(
        ctx: *mut ibv_context,
        attr: *mut ibv_srq_init_attr_ex,
    ) -> *mut ibv_srq;
    pub fn softhca_rdmacm_query_port(
        ctx: *mut ibv_context,
        port: u8,
        attr: *mut ibv_port_attr,
    ) -> c_int;
    pub fn softhca_rdmacm_poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int;
    pub fn softhca_rdmacm_req_notify_cq(cq: *mut ibv_cq, solicited: c_int) -> c_int;
    pub fn softhca_rdmacm_post_recv1(
        qp: *mut ibv_qp,
        wr_id: u64,
        addr: *mut c_void,
        len: u32,
        lkey: u32,
    ) -> c_int;
    #[allow(clippy::too_many_arguments)]
    pub fn softhca_rdmacm_post_ud_send(
        qp: *mut ibv_qp,
        wr_id: u64,
        ah: *mut ibv_ah,
        qpn: u32,
        qkey: u32,
        addr: *mut c_void,
        len: u32,
        lkey: u32,
    ) -> c_int;
}

/// `struct ibv_qp *softhca_create_gsi_qp(struct ibv_pd *, struct ibv_qp_init_attr *)`.
pub type CreateGsiQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;

/// softhca's private verb (version node `SOFTHCA_PRIVATE_1`), looked up when the first CM
/// agent starts so that running against another libibverbs fails with one clear line.
pub fn create_gsi_qp_fn() -> Option<CreateGsiQp> {
    // SAFETY: dlvsym with RTLD_DEFAULT and NUL-terminated names is always safe to call.
    let p = unsafe {
        libc::dlvsym(
            libc::RTLD_DEFAULT,
            c"softhca_create_gsi_qp".as_ptr(),
            c"SOFTHCA_PRIVATE_1".as_ptr(),
        )
    };
    if p.is_null() {
        return None;
    }
    // SAFETY: the symbol softhca's libibverbs exports under SOFTHCA_PRIVATE_1 has exactly
    // this signature.
    Some(unsafe { std::mem::transmute::<*mut c_void, CreateGsiQp>(p) })
}
