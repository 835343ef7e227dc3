//! The exported C functions (mangled here; `build.rs` gives them their C names and symbol
//! versions). Each one is a guard around the implementation in `cma.rs`.
//!
//! # Safety
//! Every function takes pointers from C and trusts the caller as librdmacm's own functions
//! do: an `rdma_cm_id *` must come from `rdma_create_id`/`rdma_create_ep`/an event, a
//! channel from `rdma_create_event_channel`, an event from `rdma_get_cm_event`.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void};

use softhca_cm::RejReason;

use crate::abi::*;
use crate::channel::{ChanRef, Channel};
use crate::cma::{self, read_sockaddr};
use crate::error::{guard_neg, guard_ptr, guard_val, Error, Result};
use crate::id::IdRef;
use crate::verbs::*;

pub use crate::addrinfo::{rdma_freeaddrinfo, rdma_getaddrinfo};
pub use crate::unsupported::*;

fn idref(id: *mut rdma_cm_id) -> Result<IdRef> {
    if id.is_null() {
        return Err(Error::Invalid("NULL rdma_cm_id"));
    }
    Ok(IdRef(id.cast()))
}

pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard_ptr("rdma_create_event_channel", || {
        Ok(Channel::create()?.0.cast())
    })
}

pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    guard_val("rdma_destroy_event_channel", (), || {
        if ch.is_null() {
            return;
        }
        if let Err(e) = cma::destroy_event_channel(ChanRef(ch.cast())) {
            // librdmacm's would close the fd under its ids; refusing keeps them working
            // (the function returns nothing, so the refusal is only visible in debug).
            crate::error::debug(format_args!("rdma_destroy_event_channel: {e}"));
        }
    })
}

pub unsafe extern "C" fn rdma_create_id(
    ch: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard_neg("rdma_create_id", || {
        if id.is_null() {
            return Err(Error::Invalid("NULL id out pointer"));
        }
        let r = cma::create_id(ch, context, ps)?;
        // SAFETY: checked non-null.
        unsafe { *id = r.0.cast() };
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_destroy_id", || {
        cma::destroy_id(idref(id)?)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guard_neg("rdma_bind_addr", || {
        // SAFETY: caller's sockaddr.
        let a = unsafe { read_sockaddr(addr)? };
        cma::bind_addr(idref(id)?, a)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard_neg("rdma_resolve_addr", || {
        // SAFETY: caller's sockaddrs.
        let d = unsafe { read_sockaddr(dst)? };
        let s = if src.is_null() {
            None
        } else {
            // SAFETY: as above.
            Some(unsafe { read_sockaddr(src)? })
        };
        cma::resolve_addr(idref(id)?, s, d)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    guard_neg("rdma_join_multicast", || {
        // SAFETY: caller's sockaddr.
        let a = unsafe { read_sockaddr(addr)? };
        cma::join_multicast(idref(id)?, a, false, context)?;
        Ok(0)
    })
}

/// librdmacm's checks: an address, and join flags below `RDMA_MC_JOIN_FLAG_RESERVED`.
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard_neg("rdma_join_multicast_ex", || {
        // SAFETY: the caller's attributes, or NULL.
        let a = unsafe { attr.as_ref() }.ok_or(Error::Invalid("NULL join attributes"))?;
        let flags_given = a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS != 0;
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
            || !flags_given
            || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
        {
            return Err(Error::Invalid("join attributes"));
        }
        // SAFETY: caller's sockaddr.
        let addr = unsafe { read_sockaddr(a.addr)? };
        let send_only = a.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
        cma::join_multicast(idref(id)?, addr, send_only, context)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard_neg("rdma_leave_multicast", || {
        // SAFETY: caller's sockaddr.
        let a = unsafe { read_sockaddr(addr)? };
        cma::leave_multicast(idref(id)?, a)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard_neg("rdma_resolve_route", || {
        cma::resolve_route(idref(id)?)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard_neg("rdma_listen", || {
        cma::listen(idref(id)?)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> c_int {
    guard_neg("rdma_connect", || {
        // SAFETY: caller's parameters.
        unsafe { cma::connect(idref(id)?, p)? };
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> c_int {
    guard_neg("rdma_accept", || {
        // SAFETY: caller's parameters.
        unsafe { cma::accept(idref(id)?, p)? };
        Ok(0)
    })
}

fn private<'a>(p: *const c_void, len: u8) -> &'a [u8] {
    if p.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller passes `len` readable bytes.
        unsafe { std::slice::from_raw_parts(p.cast(), usize::from(len)) }
    }
}

pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, p: *const c_void, len: u8) -> c_int {
    guard_neg("rdma_reject", || {
        cma::reject(idref(id)?, private(p, len), RejReason::ConsumerDefined)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_reject_ece(id: *mut rdma_cm_id, p: *const c_void, len: u8) -> c_int {
    guard_neg("rdma_reject_ece", || {
        // The kernel's rdma_reject with IB_CM_REJ_VENDOR_OPTION_NOT_SUPPORTED.
        cma::reject(
            idref(id)?,
            private(p, len),
            RejReason::VendorOptionNotSupported,
        )?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_disconnect", || {
        cma::disconnect(idref(id)?)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard_neg("rdma_establish", || {
        cma::establish(idref(id)?)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    guard_neg("rdma_notify", || {
        cma::notify(idref(id)?, event)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    ev: *mut *mut rdma_cm_event,
) -> c_int {
    guard_neg("rdma_get_cm_event", || {
        if ch.is_null() || ev.is_null() {
            return Err(Error::Invalid("NULL channel or event pointer"));
        }
        let e = cma::get_event(ChanRef(ch.cast()))?;
        // SAFETY: checked non-null.
        unsafe { *ev = e };
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_ack_cm_event(ev: *mut rdma_cm_event) -> c_int {
    guard_neg("rdma_ack_cm_event", || {
        if ev.is_null() {
            return Err(Error::Invalid("NULL event"));
        }
        cma::ack_event(ev);
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static std::ffi::CStr = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    guard_neg("rdma_set_option", || {
        cma::set_option(idref(id)?, level, name, val, len)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard_neg("rdma_init_qp_attr", || {
        if attr.is_null() || mask.is_null() {
            return Err(Error::Invalid("NULL attr or mask"));
        }
        // SAFETY: checked non-null; the caller's structs.
        let m = cma::init_qp_attr(idref(id)?, unsafe { &mut *attr })?;
        // SAFETY: checked non-null.
        unsafe { *mask = m };
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
) -> c_int {
    guard_neg("rdma_migrate_id", || {
        cma::migrate(idref(id)?, ch)?;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard_val("rdma_get_src_port", 0, || port_of(id, true))
}

pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard_val("rdma_get_dst_port", 0, || port_of(id, false))
}

/// The port of the id's source or destination address, in network order.
fn port_of(id: *mut rdma_cm_id, src: bool) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: the caller's id.
    let c = unsafe { &*id };
    let ss = if src {
        &c.route.addr.src_storage
    } else {
        &c.route.addr.dst_storage
    };
    // SAFETY: a sockaddr_storage read as its family's sockaddr.
    match unsafe { read_sockaddr((ss as *const libc::sockaddr_storage).cast()) } {
        Ok(a) => a.port().to_be(),
        Err(_) => 0,
    }
}

pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard_ptr("rdma_get_devices", || {
        let devs = cma::devices().unwrap_or_default();
        // SAFETY: malloc of (n + 1) pointers, freed by rdma_free_devices.
        let arr = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if arr.is_null() {
            return Err(Error::Os {
                what: "calloc",
                errno: libc::ENOMEM,
            });
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: within the array.
            unsafe { *arr.add(i) = *d };
        }
        if !num.is_null() {
            // SAFETY: checked non-null.
            unsafe { *num = devs.len() as c_int };
        }
        Ok(arr)
    })
}

pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: allocated by rdma_get_devices (calloc).
    guard_val("rdma_free_devices", (), || unsafe {
        libc::free(list.cast())
    })
}

// ------------------------------------------------------------------ QP, CQ, SRQ helpers

/// librdmacm's `ucma_destroy_cqs`.
fn destroy_cqs(c: &mut rdma_cm_id) {
    // SAFETY: the CQs and channels this library created for the id.
    unsafe {
        if !c.recv_cq.is_null() {
            ibv_destroy_cq(c.recv_cq);
            if !c.send_cq.is_null() && c.send_cq != c.recv_cq {
                ibv_destroy_cq(c.send_cq);
                c.send_cq = std::ptr::null_mut();
            }
            c.recv_cq = std::ptr::null_mut();
        }
        if !c.recv_cq_channel.is_null() {
            ibv_destroy_comp_channel(c.recv_cq_channel);
            if !c.send_cq_channel.is_null() && c.send_cq_channel != c.recv_cq_channel {
                ibv_destroy_comp_channel(c.send_cq_channel);
                c.send_cq_channel = std::ptr::null_mut();
            }
            c.recv_cq_channel = std::ptr::null_mut();
        }
    }
}

/// librdmacm's `ucma_create_cqs`: a completion channel and a CQ per direction asked for,
/// with the id as the CQ context.
fn create_cqs(c: &mut rdma_cm_id, send: u32, recv: u32) -> Result<()> {
    let ctx = c.verbs;
    let me = (c as *mut rdma_cm_id).cast::<c_void>();
    let mk = |size: u32, ch: &mut *mut ibv_comp_channel, cq: &mut *mut ibv_cq| -> Result<()> {
        // SAFETY: the id's verbs context.
        *ch = unsafe { ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(Error::last_os("ibv_create_comp_channel"));
        }
        // SAFETY: as above.
        *cq = unsafe { ibv_create_cq(ctx, size as c_int, me, *ch, 0) };
        if cq.is_null() {
            return Err(Error::last_os("ibv_create_cq"));
        }
        Ok(())
    };
    let r = (|| {
        if recv > 0 {
            mk(recv, &mut c.recv_cq_channel, &mut c.recv_cq)?;
        }
        if send > 0 {
            mk(send, &mut c.send_cq_channel, &mut c.send_cq)?;
        }
        Ok(())
    })();
    if r.is_err() {
        destroy_cqs(c);
    }
    r
}

pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard_neg("rdma_create_qp_ex", || {
        let idr = idref(id)?;
        if attr.is_null() {
            return Err(Error::Invalid("NULL attributes"));
        }
        let c = idr.c();
        // SAFETY: checked non-null; the caller's attributes.
        let a = unsafe { &mut *attr };
        if !c.qp.is_null() || c.verbs.is_null() {
            return Err(Error::Invalid("the id has a QP already, or no device yet"));
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            a.comp_mask |= IBV_QP_INIT_ATTR_PD;
            a.pd = c.pd;
        // SAFETY: the caller's PD.
        } else if unsafe { (*a.pd).context } != c.verbs {
            return Err(Error::Invalid("PD of another device"));
        }
        if (!c.recv_cq.is_null() && !a.recv_cq.is_null() && c.recv_cq != a.recv_cq)
            || (!c.send_cq.is_null() && !a.send_cq.is_null() && c.send_cq != a.send_cq)
        {
            return Err(Error::Invalid("CQs differ from the id's"));
        }
        let send = if a.send_cq.is_null() && c.send_cq.is_null() {
            a.cap.max_send_wr
        } else {
            0
        };
        let recv = if a.recv_cq.is_null() && c.recv_cq.is_null() {
            a.cap.max_recv_wr
        } else {
            0
        };
        create_cqs(c, send, recv)?;
        if a.send_cq.is_null() {
            a.send_cq = c.send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = c.recv_cq;
        }
        if !c.srq.is_null() && a.srq.is_null() {
            a.srq = c.srq;
        }
        // SAFETY: valid context and attributes.
        let qp = unsafe { softhca_rdmacm_create_qp_ex(c.verbs, a) };
        if qp.is_null() {
            let e = Error::last_os("ibv_create_qp_ex");
            destroy_cqs(c);
            return Err(e);
        }
        // RC/UC to INIT; UD through INIT/RTR/RTS with RDMA_UDP_QKEY (ucma_init_*_qp).
        let init = || -> Result<()> {
            let states: &[u32] = if c.qp_type == IBV_QPT_UD {
                &[IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS]
            } else {
                &[IBV_QPS_INIT]
            };
            let cm = cma::lock();
            for &s in states {
                let (mut qa, m) = cma::qp_attr_for(&cm, idr, s)?;
                crate::agent::modify(qp, &mut qa, m)?;
            }
            Ok(())
        };
        if let Err(e) = init() {
            // SAFETY: the QP just created.
            unsafe { ibv_destroy_qp(qp) };
            destroy_cqs(c);
            return Err(e);
        }
        // SAFETY: the QP just created.
        c.pd = unsafe { (*qp).pd };
        c.qp = qp;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    a: *mut ibv_qp_init_attr,
) -> c_int {
    guard_neg("rdma_create_qp", || {
        if a.is_null() {
            return Err(Error::Invalid("NULL attributes"));
        }
        let c = idref(id)?.c();
        // SAFETY: all-zero is a valid ibv_qp_init_attr_ex.
        let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: the caller's attributes; ibv_qp_init_attr is a prefix of the _ex struct.
        unsafe {
            std::ptr::copy_nonoverlapping(
                a.cast::<u8>(),
                (&mut ex as *mut ibv_qp_init_attr_ex).cast::<u8>(),
                std::mem::size_of::<ibv_qp_init_attr>(),
            )
        };
        ex.comp_mask = IBV_QP_INIT_ATTR_PD;
        ex.pd = if pd.is_null() { c.pd } else { pd };
        // SAFETY: forwarding to our own entry point.
        let r = unsafe { rdma_create_qp_ex(id, &mut ex) };
        // SAFETY: copy back what libibverbs filled in (caps, CQs), as librdmacm does.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&ex as *const ibv_qp_init_attr_ex).cast::<u8>(),
                a.cast::<u8>(),
                std::mem::size_of::<ibv_qp_init_attr>(),
            )
        };
        if r != 0 {
            return Err(Error::last_os("rdma_create_qp"));
        }
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard_val("rdma_destroy_qp", (), || {
        let Ok(idr) = idref(id) else { return };
        let c = idr.c();
        if !c.qp.is_null() {
            // SAFETY: the id's QP.
            unsafe { ibv_destroy_qp(c.qp) };
        }
        c.qp = std::ptr::null_mut();
        destroy_cqs(c);
    })
}

pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard_neg("rdma_create_srq_ex", || {
        let c = idref(id)?.c();
        if attr.is_null() {
            return Err(Error::Invalid("NULL attributes"));
        }
        // SAFETY: checked non-null.
        let a = unsafe { &mut *attr };
        if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
            return Err(Error::Invalid("no SRQ type"));
        }
        if a.srq_type != IBV_SRQT_BASIC {
            return Err(Error::NotSupported("XRC SRQs"));
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
            a.pd = c.pd;
            a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
        }
        // SAFETY: valid context and attributes.
        let srq = unsafe { softhca_rdmacm_create_srq_ex(c.verbs, a) };
        if srq.is_null() {
            return Err(Error::last_os("ibv_create_srq_ex"));
        }
        if c.pd.is_null() {
            c.pd = a.pd;
        }
        c.srq = srq;
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard_neg("rdma_create_srq", || {
        if attr.is_null() {
            return Err(Error::Invalid("NULL attributes"));
        }
        // SAFETY: checked non-null; the caller's attributes.
        let a = unsafe { &mut *attr };
        let mut ex = ibv_srq_init_attr_ex {
            srq_context: a.srq_context,
            attr: a.attr,
            comp_mask: IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
            srq_type: IBV_SRQT_BASIC,
            pd,
            xrcd: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            tm_cap: Default::default(),
        };
        // SAFETY: forwarding to our own entry point.
        let r = unsafe { rdma_create_srq_ex(id, &mut ex) };
        a.attr = ex.attr;
        if r != 0 {
            return Err(Error::last_os("rdma_create_srq"));
        }
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard_val("rdma_destroy_srq", (), || {
        let Ok(idr) = idref(id) else { return };
        let c = idr.c();
        if !c.srq.is_null() {
            // SAFETY: the id's SRQ.
            unsafe { ibv_destroy_srq(c.srq) };
        }
        c.srq = std::ptr::null_mut();
        destroy_cqs(c);
    })
}

// ------------------------------------------------------------------ endpoints

pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_neg("rdma_create_ep", || {
        if id.is_null() || res.is_null() {
            return Err(Error::Invalid("NULL id or addrinfo"));
        }
        // SAFETY: the caller's addrinfo.
        let r = unsafe { &*res };
        let idr = cma::create_id(std::ptr::null_mut(), std::ptr::null_mut(), r.ai_port_space)?;
        let setup = || -> Result<()> {
            if r.ai_flags & RAI_PASSIVE != 0 {
                // SAFETY: the addrinfo's address.
                cma::bind_addr(idr, unsafe { read_sockaddr(r.ai_src_addr)? })?;
                let c = idr.c();
                if !pd.is_null() {
                    c.pd = pd;
                }
                if !qp_init_attr.is_null() {
                    // SAFETY: the caller's attributes.
                    let mut a = unsafe { *qp_init_attr };
                    a.qp_type = r.ai_qp_type as u32;
                    cma::set_qp_init_attr(idr, a);
                }
                return Ok(());
            }
            let src = if r.ai_src_addr.is_null() {
                None
            } else {
                // SAFETY: the addrinfo's address.
                Some(unsafe { read_sockaddr(r.ai_src_addr)? })
            };
            // SAFETY: the addrinfo's address.
            let dst = unsafe { read_sockaddr(r.ai_dst_addr)? };
            cma::resolve_addr(idr, src, dst)?;
            cma::resolve_route(idr)?;
            if !qp_init_attr.is_null() {
                // SAFETY: the caller's attributes.
                unsafe { (*qp_init_attr).qp_type = r.ai_qp_type as u32 };
                // SAFETY: forwarding to our own entry point.
                if unsafe { rdma_create_qp(idr.0.cast(), pd, qp_init_attr) } != 0 {
                    return Err(Error::last_os("rdma_create_qp"));
                }
            }
            Ok(())
        };
        if let Err(e) = setup() {
            // SAFETY: our own id.
            unsafe { rdma_destroy_ep(idr.0.cast()) };
            return Err(e);
        }
        // SAFETY: checked non-null.
        unsafe { *id = idr.0.cast() };
        Ok(0)
    })
}

pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard_val("rdma_destroy_ep", (), || {
        let Ok(idr) = idref(id) else { return };
        let c = idr.c();
        if !c.qp.is_null() {
            // SAFETY: our own entry point.
            unsafe { rdma_destroy_qp(id) };
        }
        if !c.srq.is_null() {
            // SAFETY: our own entry point.
            unsafe { rdma_destroy_srq(id) };
        }
        let _ = cma::destroy_id(idr);
    })
}

pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard_neg("rdma_get_request", || {
        let l = idref(listen)?;
        if id.is_null() || !cma::is_sync(l) {
            return Err(Error::Invalid(
                "rdma_get_request needs a synchronous listening id",
            ));
        }
        let lc = l.c();
        if !lc.event.is_null() {
            cma::ack_event(lc.event);
            lc.event = std::ptr::null_mut();
        }
        // SAFETY: the channel of a live id.
        let ev = cma::get_event(ChanRef(lc.channel.cast()))?;
        // SAFETY: a valid event.
        let e = unsafe { &*ev };
        if e.status != 0 || e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            lc.event = ev;
            return Err(if e.status != 0 {
                Error::Status(e.status)
            } else {
                Error::Invalid("not a connection request")
            });
        }
        if let Some(mut a) = cma::qp_init_attr_of(l) {
            // SAFETY: forwarding to our own entry point.
            if unsafe { rdma_create_qp(e.id, lc.pd, &mut a) } != 0 {
                lc.event = ev;
                return Err(Error::last_os("rdma_create_qp"));
            }
        }
        // SAFETY: checked non-null; the new id.
        unsafe {
            *id = e.id;
            (*e.id).event = ev;
        }
        Ok(0)
    })
}
