//! Protection domains, memory regions, address handles, completion channels.

use std::ffi::{c_int, c_uint, c_void};

use softhca::{AccessFlags, AddressVector, Ah, CompChannel, Gid, Pd, RawMr};

use crate::abi::*;
use crate::device::CtxBox;
use crate::errno::Errno;
use crate::ffi::{guard_int, guard_ptr, nonnull, nonnull_mut};

/// `ibv_pd` + the softhca PD.
#[repr(C)]
pub(crate) struct PdBox {
    pub pd: ibv_pd,
    pub inner: Pd,
}

impl PdBox {
    /// # Safety
    /// `pd` must be null or a PD from our `ibv_alloc_pd`, not deallocated.
    pub(crate) unsafe fn from_ptr<'a>(pd: *const ibv_pd) -> Result<&'a PdBox, Errno> {
        // SAFETY: our PDs are the first field of a repr(C) PdBox (contract).
        unsafe { nonnull(pd as *const PdBox) }
    }
}

pub(crate) unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard_ptr("ibv_alloc_pd", || {
        // SAFETY: a context of ours (verb contract).
        let c = unsafe { CtxBox::from_ctx(ctx)? };
        let inner = c.ctx.alloc_pd()?;
        let b = Box::new(PdBox {
            pd: ibv_pd {
                context: ctx,
                handle: inner.id().0,
            },
            inner,
        });
        Ok(Box::into_raw(b).cast())
    })
}

pub(crate) unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard_int("ibv_dealloc_pd", || {
        if pd.is_null() {
            return Err(Errno::INVAL);
        }
        // SAFETY: a PD of ours, freed once (verb contract). Objects created from it
        // keep the softhca PD alive, so freeing the handle first is harmless.
        drop(unsafe { Box::from_raw(pd as *mut PdBox) });
        Ok(0)
    })
}

/// `ibv_mr` + the registration.
#[repr(C)]
pub(crate) struct MrBox {
    pub mr: ibv_mr,
    pub inner: RawMr,
}

fn access_flags(access: c_uint) -> Result<AccessFlags, Errno> {
    let a = AccessFlags::from_bits(access).ok_or(Errno::INVAL)?;
    // IBTA 10.6.3.1 (and libibverbs): remote write or atomic needs local write.
    if a.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !a.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(Errno::INVAL);
    }
    if a.contains(AccessFlags::ON_DEMAND) {
        // No on-demand paging.
        return Err(Errno::NOTSUP);
    }
    Ok(a)
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_uint) -> *mut ibv_mr {
    guard_ptr("ibv_reg_mr", || {
        // SAFETY: a PD of ours (verb contract).
        let p = unsafe { PdBox::from_ptr(pd)? };
        if addr.is_null() && len > 0 {
            return Err(Errno::INVAL);
        }
        let access = access_flags(access)?;
        // SAFETY: the C caller registers memory it owns and keeps it mapped until
        // ibv_dereg_mr, which is the ibv_reg_mr contract and the one reg_mr_raw asks for.
        let inner = unsafe { p.inner.reg_mr_raw(addr.cast(), len, iova, access)? };
        let b = Box::new(MrBox {
            mr: ibv_mr {
                context: p.pd.context,
                pd,
                addr,
                length: len,
                handle: inner.lkey(),
                lkey: inner.lkey(),
                rkey: inner.rkey(),
            },
            inner,
        });
        Ok(Box::into_raw(b).cast())
    })
}

pub(crate) unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    reg(pd, addr, len, addr as u64, access as c_uint)
}

pub(crate) unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    reg(pd, addr, len, iova, access as c_uint)
}

pub(crate) unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    reg(pd, addr, len, iova, access)
}

pub(crate) unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard_int("ibv_dereg_mr", || {
        if mr.is_null() {
            return Err(Errno::INVAL);
        }
        // SAFETY: an MR of ours (verb contract); deregistering takes it away from the
        // engine under its lock before the memory goes back to the caller, or fails
        // (windows still bound) and leaves it registered, as rxe does.
        unsafe { (*(mr as *mut MrBox)).inner.deregister()? };
        // SAFETY: freed once.
        drop(unsafe { Box::from_raw(mr as *mut MrBox) });
        Ok(0)
    })
}

/// `ibv_ah` + the address vector.
#[repr(C)]
pub(crate) struct AhBox {
    pub ah: ibv_ah,
    pub inner: Ah,
}

impl AhBox {
    /// # Safety
    /// `ah` must be null or an AH of ours, not destroyed.
    pub(crate) unsafe fn from_ptr<'a>(ah: *const ibv_ah) -> Result<&'a AhBox, Errno> {
        // SAFETY: our AHs are the first field of a repr(C) AhBox (contract).
        unsafe { nonnull(ah as *const AhBox) }
    }
}

/// An `ibv_ah_attr` as softhca's address vector. RoCE needs the GRH (the GID is the IP
/// address), so `is_global == 0` is refused, as rxe does.
pub(crate) fn av_from_c(a: &ibv_ah_attr) -> Result<AddressVector, Errno> {
    if a.is_global == 0 {
        return Err(Errno::INVAL);
    }
    Ok(AddressVector {
        dgid: Gid(a.grh.dgid.raw),
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sl: a.sl,
        port_num: a.port_num,
        dest_udp_port: None,
    })
}

/// softhca's address vector as `ibv_ah_attr`.
pub(crate) fn av_to_c(av: &AddressVector) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: av.dgid.0 },
            flow_label: av.flow_label,
            sgid_index: av.sgid_index,
            hop_limit: av.hop_limit,
            traffic_class: av.traffic_class,
        },
        dlid: 0,
        sl: av.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: av.port_num,
    }
}

pub(crate) unsafe extern "C" fn ibv_create_ah(
    pd: *mut ibv_pd,
    attr: *mut ibv_ah_attr,
) -> *mut ibv_ah {
    guard_ptr("ibv_create_ah", || {
        // SAFETY: a PD of ours and the caller's attributes (verb contract).
        let (p, a) = unsafe { (PdBox::from_ptr(pd)?, nonnull(attr)?) };
        let inner = p.inner.create_ah(av_from_c(a)?)?;
        let b = Box::new(AhBox {
            ah: ibv_ah {
                context: p.pd.context,
                pd,
                handle: 0,
            },
            inner,
        });
        Ok(Box::into_raw(b).cast())
    })
}

pub(crate) unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard_int("ibv_destroy_ah", || {
        if ah.is_null() {
            return Err(Errno::INVAL);
        }
        // SAFETY: an AH of ours, freed once (verb contract).
        drop(unsafe { Box::from_raw(ah as *mut AhBox) });
        Ok(0)
    })
}

/// `ibv_init_ah_from_wc`: the reply path of a UD receive. With RoCE the GRH in the first
/// 40 bytes of the receive buffer names the sender (its sgid is our dgid); softhca places
/// it like rxe.
pub(crate) unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    attr: *mut ibv_ah_attr,
) -> c_int {
    guard_int("ibv_init_ah_from_wc", || {
        // SAFETY: a context of ours and the caller's structs (verb contract).
        let (c, w, out) = unsafe { (CtxBox::from_ctx(ctx)?, nonnull(wc)?, nonnull_mut(attr)?) };
        // SAFETY: optional GRH.
        let g = unsafe { grh.as_ref() }.ok_or(Errno::INVAL)?;
        if w.wc_flags & 1 == 0 {
            // No GRH: RoCE cannot address the sender.
            return Err(Errno::INVAL);
        }
        // RoCE v2 over IPv4: the 40-byte GRH buffer holds 20 zero bytes and then the IPv4
        // header (rdma-core's ibv_init_ah_from_wc tells the two apart the same way and
        // maps the IPv4 source into a ::ffff: GID, with the header's TOS and no flow label).
        // SAFETY: the GRH is 40 readable bytes (verb contract).
        let raw: &[u8; 40] = unsafe { &*(g as *const ibv_grh).cast::<[u8; 40]>() };
        let (sgid, flow_label, traffic_class) = if raw[..20] == [0; 20] && raw[20] == 0x45 {
            let mut gid = [0u8; 16];
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12..].copy_from_slice(&raw[32..36]);
            (ibv_gid { raw: gid }, 0, raw[21])
        } else {
            let vtf = u32::from_be(g.version_tclass_flow);
            (g.sgid, vtf & 0xfffff, ((vtf >> 20) & 0xff) as u8)
        };
        let peer = Gid(sgid.raw);
        let sgid_index = c.ctx.gid_index_for(peer.to_ip()).ok_or(Errno::INVAL)?;
        *out = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: sgid,
                flow_label,
                sgid_index,
                hop_limit: 0xff,
                traffic_class,
            },
            dlid: w.slid,
            sl: w.sl,
            src_path_bits: w.dlid_path_bits,
            static_rate: 0,
            is_global: 1,
            port_num: port,
        };
        Ok(0)
    })
}

pub(crate) unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    guard_ptr("ibv_create_ah_from_wc", || {
        // SAFETY: a PD of ours (verb contract).
        let p = unsafe { PdBox::from_ptr(pd)? };
        let mut attr = ibv_ah_attr::default();
        // SAFETY: forwarded caller pointers.
        let rc = unsafe { ibv_init_ah_from_wc(p.pd.context, port, wc, grh, &mut attr) };
        if rc != 0 {
            return Err(Errno(rc));
        }
        // SAFETY: forwarded.
        let ah = unsafe { ibv_create_ah(pd, &mut attr) };
        if ah.is_null() {
            // errno already set by ibv_create_ah.
            return Err(Errno(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL),
            ));
        }
        Ok(ah)
    })
}

/// `ibv_comp_channel` + the softhca channel (its fd is real).
#[repr(C)]
pub(crate) struct ChannelBox {
    pub ch: ibv_comp_channel,
    pub inner: CompChannel,
}

impl ChannelBox {
    /// # Safety
    /// `ch` must be null or a channel of ours, not destroyed.
    pub(crate) unsafe fn from_ptr<'a>(
        ch: *const ibv_comp_channel,
    ) -> Result<&'a ChannelBox, Errno> {
        // SAFETY: our channels are the first field of a repr(C) ChannelBox (contract).
        unsafe { nonnull(ch as *const ChannelBox) }
    }
}

pub(crate) unsafe extern "C" fn ibv_create_comp_channel(
    ctx: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard_ptr("ibv_create_comp_channel", || {
        // SAFETY: a context of ours (verb contract).
        let c = unsafe { CtxBox::from_ctx(ctx)? };
        let inner = c.ctx.create_comp_channel()?;
        // The kernel's channel fd starts blocking; O_NONBLOCK is the program's choice.
        inner.set_nonblocking(false)?;
        let b = Box::new(ChannelBox {
            ch: ibv_comp_channel {
                context: ctx,
                fd: inner.fd(),
                refcnt: 0,
            },
            inner,
        });
        Ok(Box::into_raw(b).cast())
    })
}

pub(crate) unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard_int("ibv_destroy_comp_channel", || {
        // SAFETY: a channel of ours (verb contract).
        let b = unsafe { ChannelBox::from_ptr(ch)? };
        if b.ch.refcnt > 0 {
            // CQs still use it (libibverbs: EBUSY).
            return Err(Errno(libc::EBUSY));
        }
        // SAFETY: freed once.
        drop(unsafe { Box::from_raw(ch as *mut ChannelBox) });
        Ok(0)
    })
}
