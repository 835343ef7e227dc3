//! Memory windows: `ibv_alloc_mw`, `ibv_dealloc_mw`, `ibv_bind_mw` (type 1; the inline
//! verb checks its arguments, then calls `ops.bind_mw`), and the `IBV_WR_BIND_MW` /
//! `ibv_wr_bind_mw` bind information of type 2.

use std::ffi::{c_int, c_uint};

use softhca::{AccessFlags, Mw, MwBind, MwBindInfo, MwType, SendFlags};

use crate::abi::*;
use crate::errno::Errno;
use crate::ffi::{guard_int, guard_ptr, nonnull};
use crate::objects::PdBox;
use crate::qp::QpBox;

/// `ibv_mw` + the softhca window.
#[repr(C)]
pub(crate) struct MwBox {
    pub mw: ibv_mw,
    pub inner: Mw,
}

impl MwBox {
    /// # Safety
    /// `mw` must be null or a window of ours, not deallocated.
    pub(crate) unsafe fn from_ptr<'a>(mw: *const ibv_mw) -> Result<&'a MwBox, Errno> {
        // SAFETY: our windows are the first field of a repr(C) MwBox (contract).
        unsafe { nonnull(mw as *const MwBox) }
    }
}

/// `ops.alloc_mw`.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, ty: c_int) -> *mut ibv_mw {
    guard_ptr("ibv_alloc_mw", || {
        // SAFETY: a PD of ours (verb contract).
        let p = unsafe { PdBox::from_ptr(pd)? };
        let kind = match ty {
            1 => MwType::Type1,
            2 => MwType::Type2,
            _ => return Err(Errno::INVAL),
        };
        let inner = p.inner.alloc_mw(kind)?;
        let b = Box::new(MwBox {
            mw: ibv_mw {
                context: p.pd.context,
                pd,
                rkey: inner.rkey(),
                handle: inner.rkey() >> 8,
                type_: ty as u32,
            },
            inner,
        });
        Ok(Box::into_raw(b).cast())
    })
}

/// `ops.dealloc_mw`: always succeeds for a live window, bound or not (rxe).
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard_int("ibv_dealloc_mw", || {
        // SAFETY: a window of ours (verb contract).
        unsafe { MwBox::from_ptr(mw)? };
        // SAFETY: freed once; dropping the softhca window deallocates it.
        drop(unsafe { Box::from_raw(mw as *mut MwBox) });
        Ok(0)
    })
}

/// The window rights of a bind (`mw_access_flags`): its remote rights. Local rights
/// mean nothing for a window and are accepted and dropped, as rxe stores and never
/// checks them (rdma-core's tests bind with LOCAL_WRITE | REMOTE_WRITE); a zero-based
/// window is refused (rxe refuses it for type 1; softhca has none).
fn window_access(flags: c_uint) -> Result<AccessFlags, Errno> {
    let a = AccessFlags::from_bits(flags).ok_or(Errno::INVAL)?;
    if a.contains(AccessFlags::ZERO_BASED) {
        return Err(Errno::INVAL);
    }
    Ok(a & AccessFlags::REMOTE)
}

/// A bind as the transport takes it, from the C bind information.
pub(crate) fn mw_bind(
    mw_rkey: u32,
    key_byte: u8,
    info: &ibv_mw_bind_info,
) -> Result<MwBind, Errno> {
    let mr_lkey = if info.mr.is_null() {
        0
    } else {
        // SAFETY: an MR of ours named by the caller's bind (verb contract).
        unsafe { (*info.mr).lkey }
    };
    Ok(MwBind {
        mw_rkey,
        key_byte,
        mr_lkey,
        addr: info.addr,
        len: info.length,
        access: window_access(info.mw_access_flags)?,
    })
}

/// `ops.bind_mw` (type 1, after the inline `ibv_bind_mw` checked type, MR and PD):
/// posts the bind on `qp` and gives the window its next rkey (`ibv_inc_rkey`) at once,
/// as rdma-core's rxe provider does.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    guard_int("ibv_bind_mw", || {
        // SAFETY: a QP and window of ours, and the caller's bind (verb contract).
        let (q, w, b) = unsafe { (QpBox::from_ptr(qp)?, MwBox::from_ptr(mw)?, nonnull(bind)?) };
        let info = &b.bind_info;
        let lkey = if info.mr.is_null() {
            None
        } else {
            Some(mw_bind(0, 0, info)?.mr_lkey)
        };
        let rkey = w.inner.bind(
            &q.inner,
            b.wr_id,
            SendFlags::from_bits_truncate(b.send_flags),
            &MwBindInfo {
                mr_lkey: lkey,
                addr: info.addr,
                len: info.length,
                access: window_access(info.mw_access_flags)?,
            },
        )?;
        // SAFETY: `rkey` is a plain field of our live window, written by the binding
        // thread (the verb's contract).
        unsafe { (*mw).rkey = rkey };
        Ok(0)
    })
}
