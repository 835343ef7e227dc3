//! Protection domains, memory regions, address handles, completion channels.

use std::ffi::{c_int, c_uint, c_void};
use std::net::{IpAddr, Ipv4Addr};

use softhca::{AccessFlags, AddressVector, Advice, Ah, CompChannel, Gid, Pd, RawMr, Sge};

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

/// `verbs_context.advise_mr` (`ibv_advise_mr`): prefetch ranges of on-demand regions.
/// Returns 0 or a positive errno, as libibverbs' inline wrapper passes it on. The call
/// is synchronous whether or not `IBV_ADVISE_MR_FLAG_FLUSH` asks for it (rxe queues the
/// unflushed ones as best effort; finishing them at once is within that).
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: c_uint,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    guard_int("ibv_advise_mr", || {
        // SAFETY: a PD of ours (verb contract).
        let p = unsafe { PdBox::from_ptr(pd)? };
        let advice = match advice {
            0 => Advice::Prefetch,
            1 => Advice::PrefetchWrite,
            2 => Advice::PrefetchNoFault,
            _ => return Err(Errno::NOTSUP),
        };
        // IBV_ADVISE_MR_FLAG_FLUSH is the one flag.
        if flags & !1 != 0 || sg_list.is_null() || num_sge == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: the caller's array of `num_sge` SGEs (verb contract).
        let list = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
        let sges: Vec<Sge> = list
            .iter()
            .map(|s| Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect();
        p.inner.advise_mr(advice, &sges)?;
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

/// `ibv_init_ah_from_wc`: the reply path of a UD receive, read from the 40-byte GRH area
/// as rdma-core's `ibv_init_ah_from_wc` does: an IPv6 header (version 6 in the first
/// word), or an IPv4 header in its last 20 bytes (what softhca and rxe place for RoCEv2
/// over IPv4). The packet's source is the destination; the local GID it was sent to
/// gives `sgid_index`; TTL/hop limit and traffic class come from the header.
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
        // SAFETY: `ibv_grh` is 40 plain bytes.
        let raw: [u8; 40] = unsafe { std::mem::transmute_copy(g) };
        let flow = u32::from_be(g.version_tclass_flow);
        let (peer, local, hop_limit, traffic_class) = match grh_version(&raw, flow) {
            Some(4) => {
                let ip = &raw[20..40];
                let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
                let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
                (IpAddr::V4(src), IpAddr::V4(dst), ip[8], ip[1])
            }
            Some(_) => (
                Gid(g.sgid.raw).to_ip(),
                Gid(g.dgid.raw).to_ip(),
                g.hop_limit,
                ((flow >> 20) & 0xff) as u8,
            ),
            None => return Err(Errno(libc::EPROTONOSUPPORT)),
        };
        if local.is_multicast() {
            return Err(Errno::INVAL);
        }
        let gids = c.ctx.gids();
        let sgid_index = gids
            .iter()
            .position(|gid| gid.to_ip() == local)
            .and_then(|i| u8::try_from(i).ok())
            .ok_or(Errno::INVAL)?;
        *out = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid {
                    raw: Gid::from_ip(peer).0,
                },
                flow_label: flow & 0xfffff,
                sgid_index,
                hop_limit,
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

/// rdma-core's `get_grh_header_version`: 6 when the first word says IPv6 and the last 20
/// bytes are not a valid IPv4 header (5-word, right checksum), 4 for such a header,
/// `None` for neither.
fn grh_version(raw: &[u8; 40], flow: u32) -> Option<u8> {
    let ip = &raw[20..40];
    if flow >> 28 != 6 {
        return (ip[0] >> 4 == 4).then_some(4);
    }
    if ip[0] & 0xf != 5 {
        return Some(6);
    }
    let mut sum: u32 = ip
        .chunks(2)
        .enumerate()
        .filter(|&(i, _)| i != 5)
        .map(|(_, c)| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let check = u16::from_be_bytes([ip[10], ip[11]]);
    Some(if !(sum as u16) == check { 4 } else { 6 })
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
