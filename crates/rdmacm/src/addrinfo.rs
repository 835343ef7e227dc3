//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` for IP addresses (librdmacm's `addrinfo.c`
//! without AF_IB and the ib_acm service): getaddrinfo(3) turned into an `rdma_addrinfo`.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int};

use crate::abi::*;
use crate::error::{guard_neg, guard_val, Error};

/// The `rdma_addrinfo` and the storage its pointers point into.
#[repr(C)]
struct Rai {
    rai: rdma_addrinfo,
    src: libc::sockaddr_storage,
    dst: libc::sockaddr_storage,
}

pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard_neg("rdma_getaddrinfo", || {
        // SAFETY: the caller's hints, if any.
        let h = unsafe { hints.as_ref() };
        if res.is_null() || (node.is_null() && service.is_null() && h.is_none()) {
            return Err(Error::Invalid(
                "no node, no service and no hints, or NULL result pointer",
            ));
        }
        if node.is_null() && service.is_null() {
            if let Some(h) = h {
                // SAFETY: `res` is non-null, checked above.
                unsafe { *res = from_hints(h) };
                return Ok(0);
            }
        }
        let flags = h.map_or(0, |h| h.ai_flags);
        // SAFETY: all-zero is a valid addrinfo hint.
        let mut ah: libc::addrinfo = unsafe { std::mem::zeroed() };
        ah.ai_family = h.map_or(0, |h| h.ai_family);
        ah.ai_socktype = libc::SOCK_STREAM;
        if flags & RAI_PASSIVE != 0 {
            ah.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST != 0 {
            ah.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: C strings from the caller (or NULL) and valid hint/out pointers.
        let r = unsafe { libc::getaddrinfo(node, service, &ah, &mut ai) };
        if r != 0 {
            // librdmacm returns getaddrinfo's EAI_* code as is.
            return Ok(r);
        }
        // SAFETY: getaddrinfo succeeded: `ai` is a valid list with at least one entry.
        let a = unsafe { &*ai };
        let qp_type = h.map_or(0, |h| h.ai_qp_type);
        let qp_type = if qp_type != 0 {
            qp_type
        } else {
            IBV_QPT_RC as c_int
        };
        let ps = h.map_or(0, |h| h.ai_port_space);
        let ps = if ps != 0 {
            ps
        } else if qp_type == IBV_QPT_UD as c_int {
            0x0111
        } else {
            0x0106
        };
        // SAFETY: all-zero is a valid Rai (NULL pointers, empty storage).
        let mut b: Box<Rai> = Box::new(unsafe { std::mem::zeroed() });
        b.rai.ai_flags = flags;
        b.rai.ai_family = a.ai_family;
        b.rai.ai_qp_type = qp_type;
        b.rai.ai_port_space = ps;
        let len = (a.ai_addrlen as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
        let copy = |dst: &mut libc::sockaddr_storage, src: *const libc::sockaddr, n: usize| {
            // SAFETY: `src` has `n` bytes (getaddrinfo's or the caller's address), `dst` is
            // a sockaddr_storage and n is bounded by its size.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.cast::<u8>(),
                    (dst as *mut libc::sockaddr_storage).cast::<u8>(),
                    n,
                )
            };
        };
        if flags & RAI_PASSIVE != 0 {
            copy(&mut b.src, a.ai_addr, len);
            b.rai.ai_src_len = len as libc::socklen_t;
        } else {
            copy(&mut b.dst, a.ai_addr, len);
            b.rai.ai_dst_len = len as libc::socklen_t;
            if let Some(h) = h.filter(|h| !h.ai_src_addr.is_null() && h.ai_src_len > 0) {
                let n = (h.ai_src_len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
                copy(&mut b.src, h.ai_src_addr, n);
                b.rai.ai_src_len = n as libc::socklen_t;
            }
        }
        // SAFETY: the list getaddrinfo returned.
        unsafe { libc::freeaddrinfo(ai) };
        // SAFETY: `res` is non-null, checked above.
        unsafe { *res = link(b) };
        Ok(0)
    })
}

/// librdmacm's answer without a node and a service: the hints' flags, family, QP type,
/// port space and addresses as they are (libfabric's verbs provider asks this way for an
/// endpoint whose source address it already knows).
fn from_hints(h: &rdma_addrinfo) -> *mut rdma_addrinfo {
    // SAFETY: all-zero is a valid Rai (NULL pointers, empty storage).
    let mut b: Box<Rai> = Box::new(unsafe { std::mem::zeroed() });
    b.rai.ai_flags = h.ai_flags;
    b.rai.ai_family = h.ai_family;
    b.rai.ai_qp_type = h.ai_qp_type;
    b.rai.ai_port_space = h.ai_port_space;
    let cap = std::mem::size_of::<libc::sockaddr_storage>();
    let copy = |dst: &mut libc::sockaddr_storage, src: *const libc::sockaddr, len| {
        if src.is_null() {
            return 0;
        }
        let n = (len as usize).min(cap);
        // SAFETY: the caller's address has its stated length (bounded by the storage);
        // `src` is non-null.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.cast::<u8>(),
                (dst as *mut libc::sockaddr_storage).cast::<u8>(),
                n,
            )
        };
        n as libc::socklen_t
    };
    b.rai.ai_src_len = copy(&mut b.src, h.ai_src_addr, h.ai_src_len);
    b.rai.ai_dst_len = copy(&mut b.dst, h.ai_dst_addr, h.ai_dst_len);
    link(b)
}

/// Leaks `b` as the C result, its address pointers set into its own storage.
fn link(b: Box<Rai>) -> *mut rdma_addrinfo {
    let raw = Box::into_raw(b);
    // SAFETY: our fresh allocation; the pointers point into it.
    unsafe {
        if (*raw).rai.ai_src_len > 0 {
            (*raw).rai.ai_src_addr = (&mut (*raw).src as *mut libc::sockaddr_storage).cast();
        }
        if (*raw).rai.ai_dst_len > 0 {
            (*raw).rai.ai_dst_addr = (&mut (*raw).dst as *mut libc::sockaddr_storage).cast();
        }
    }
    raw.cast()
}

pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard_val("rdma_freeaddrinfo", (), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: every entry came from rdma_getaddrinfo (a Rai box).
            let b = unsafe { Box::from_raw(p.cast::<Rai>()) };
            p = b.rai.ai_next;
        }
    })
}
