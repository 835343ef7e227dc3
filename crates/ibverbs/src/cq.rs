//! Completion queues: `ibv_create_cq`, `ibv_create_cq_ex` (with the start/next/end poll
//! and `read_*` functions), `ibv_poll_cq`, notification and completion channel events.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint, c_void};

use softhca::{Completion, Cq, WcFlags};

use crate::abi::*;
use crate::device::CtxBox;
use crate::errno::Errno;
use crate::event::{AckLock, Reported};
use crate::ffi::{guard_int, guard_neg, guard_ptr, guard_val, nonnull, nonnull_mut};
use crate::objects::ChannelBox;

/// `ibv_cq_ex` (which begins with the `ibv_cq` fields, so one box serves both verbs) +
/// the softhca CQ.
#[repr(C)]
pub(crate) struct CqBox {
    pub cq: ibv_cq_ex,
    pub inner: Cq,
    /// The completion `start_poll`/`next_poll` made current. Only the thread polling the
    /// CQ touches it (the `ibv_cq_ex` polling contract: one poller between start and end).
    cur: UnsafeCell<Completion>,
    /// When `cur` was polled (`read_completion_ts`), nanoseconds of CLOCK_MONOTONIC.
    cur_ts: UnsafeCell<u64>,
    /// The same instant in CLOCK_REALTIME (`read_completion_wallclock_ns`).
    cur_wall: UnsafeCell<u64>,
    /// Completion events and async events handed out for this CQ (destroy waits for
    /// their acks).
    pub comp_reported: Reported,
    pub async_reported: Reported,
}

impl CqBox {
    /// # Safety
    /// `cq` must be null or a CQ of ours, not destroyed.
    pub(crate) unsafe fn from_ptr<'a>(cq: *const ibv_cq) -> Result<&'a CqBox, Errno> {
        // SAFETY: our CQs are the first field of a repr(C) CqBox (contract).
        unsafe { nonnull(cq as *const CqBox) }
    }

    /// The CQ's `mutex`/`cond` for event acknowledgement.
    pub(crate) fn ack_lock(&self) -> AckLock {
        // SAFETY: fields of this live box, zero-initialised at creation.
        unsafe {
            AckLock::new(
                (&raw const self.cq.mutex).cast_mut(),
                (&raw const self.cq.cond).cast_mut(),
            )
        }
    }
}

fn now_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-parameter.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

fn create(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: u32,
    wc_flags: u64,
) -> Result<*mut CqBox, Errno> {
    // SAFETY: a context of ours (verb contract).
    let c = unsafe { CtxBox::from_ctx(ctx)? };
    // rxe_cq_chk_attr: 1 ..= max_cqe; uverbs: a vector below num_comp_vectors.
    if cqe <= 0 || cqe as u32 > softhca::MAX_CQE {
        return Err(Errno::INVAL);
    }
    if comp_vector >= c.vctx.context.num_comp_vectors as u32 {
        return Err(Errno::INVAL);
    }
    if wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        return Err(Errno::NOTSUP);
    }
    let ch = if channel.is_null() {
        None
    } else {
        // SAFETY: a channel of ours (verb contract).
        Some(unsafe { ChannelBox::from_ptr(channel)? })
    };
    let inner = c.ctx.create_cq(cqe as u32, ch.map(|b| &b.inner))?;
    let id = inner.id().0;
    let b = Box::new(CqBox {
        cq: ibv_cq_ex {
            context: ctx,
            channel,
            cq_context,
            handle: id,
            cqe: inner.capacity() as c_int,
            mutex: pthread_mutex_t::default(),
            cond: pthread_cond_t::default(),
            comp_events_completed: 0,
            async_events_completed: 0,
            comp_mask: 0,
            status: 0,
            wr_id: 0,
            start_poll: Some(start_poll),
            next_poll: Some(next_poll),
            end_poll: Some(end_poll),
            read_opcode: Some(read_opcode),
            read_vendor_err: Some(read_vendor_err),
            read_byte_len: Some(read_byte_len),
            read_imm_data: Some(read_imm_data),
            read_qp_num: Some(read_qp_num),
            read_src_qp: Some(read_src_qp),
            read_wc_flags: Some(read_wc_flags),
            read_slid: Some(read_slid),
            read_sl: Some(read_sl),
            read_dlid_path_bits: Some(read_dlid_path_bits),
            read_completion_ts: Some(read_completion_ts),
            read_cvlan: Some(read_cvlan),
            read_flow_tag: Some(read_flow_tag),
            read_tm_info: Some(read_tm_info),
            read_completion_wallclock_ns: Some(read_completion_wallclock_ns),
        },
        inner,
        cur: UnsafeCell::new(Completion::default()),
        cur_ts: UnsafeCell::new(0),
        cur_wall: UnsafeCell::new(0),
        comp_reported: Reported::default(),
        async_reported: Reported::default(),
    });
    let p = Box::into_raw(b);
    c.registry.lock().cqs.insert(id, p as usize);
    if !channel.is_null() {
        // SAFETY: the channel is ours and alive; refcnt is a plain C int only our verbs
        // touch (destroy refuses while it is > 0).
        unsafe { (*channel).refcnt += 1 };
    }
    Ok(p)
}

pub(crate) unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard_ptr("ibv_create_cq", || {
        let vector = u32::try_from(comp_vector).map_err(|_| Errno::INVAL)?;
        create(ctx, cqe, cq_context, channel, vector, 0).map(|p| p.cast())
    })
}

/// `verbs_context::create_cq_ex`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard_ptr("ibv_create_cq_ex", || {
        // SAFETY: the caller's attributes.
        let a = unsafe { nonnull(attr)? };
        // IBV_CQ_INIT_ATTR_MASK_FLAGS | _PD are the only known bits; no parent domains.
        if a.comp_mask & !0x3 != 0 || !a.parent_domain.is_null() {
            return Err(Errno::NOTSUP);
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| Errno::INVAL)?;
        create(ctx, cqe, a.cq_context, a.channel, a.comp_vector, a.wc_flags).map(|p| p.cast())
    })
}

pub(crate) unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard_int("ibv_destroy_cq", || {
        // SAFETY: a CQ of ours (verb contract).
        let b = unsafe { CqBox::from_ptr(cq)? };
        // SAFETY: the counters are fields of this live CQ.
        unsafe {
            b.ack_lock().wait_acked(&[
                (&raw const b.cq.comp_events_completed, &b.comp_reported),
                (&raw const b.cq.async_events_completed, &b.async_reported),
            ])
        };
        // SAFETY: the CQ's context outlives it (programs close the device last).
        if let Ok(c) = unsafe { CtxBox::from_ctx(b.cq.context) } {
            c.registry.lock().cqs.remove(&b.cq.handle);
        }
        let ch = b.cq.channel;
        if !ch.is_null() {
            // SAFETY: the channel outlives its CQs (destroy refuses while refcnt > 0).
            unsafe { (*ch).refcnt -= 1 };
        }
        // SAFETY: freed once. QPs that still use the CQ keep the softhca CQ alive.
        drop(unsafe { Box::from_raw(cq as *mut CqBox) });
        Ok(0)
    })
}

pub(crate) unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard_int("ibv_resize_cq", || {
        // SAFETY: a CQ of ours (verb contract).
        let b = unsafe { CqBox::from_ptr(cq)? };
        let cqe = u32::try_from(cqe).map_err(|_| Errno::INVAL)?;
        b.inner.resize(cqe)?;
        // SAFETY: `cqe` is a plain C field of our live CQ, written by the resizing
        // thread (the verb's contract: no concurrent use of the CQ object itself).
        unsafe { (*(cq as *mut CqBox)).cq.cqe = b.inner.capacity() as c_int };
        Ok(0)
    })
}

/// `verbs_context::modify_cq`: no CQ moderation.
pub(crate) unsafe extern "C" fn modify_cq(_cq: *mut ibv_cq, _attr: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// A softhca completion as `struct ibv_wc`.
pub(crate) fn wc_from(c: &Completion) -> ibv_wc {
    let flags = c.wc_flags.bits();
    ibv_wc {
        wr_id: c.wr_id,
        status: c.status as u32,
        opcode: c.opcode as u32,
        vendor_err: c.vendor_err,
        byte_len: c.byte_len,
        imm_data: imm_to_c(c),
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: flags,
        pkey_index: c.pkey_index,
        slid: c.slid,
        sl: c.sl,
        dlid_path_bits: c.dlid_path_bits,
    }
}

/// Immediate data is network order in C (`__be32`); softhca holds the host-order value
/// of the wire bytes. An invalidated rkey is host order in both.
fn imm_to_c(c: &Completion) -> u32 {
    if c.wc_flags.contains(WcFlags::WITH_IMM) {
        c.imm_data.to_be()
    } else {
        c.imm_data
    }
}

/// `ops.poll_cq`: what the inline `ibv_poll_cq` calls.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard_val("ibv_poll_cq", -1, || {
        // SAFETY: a CQ of ours (verb contract).
        let Ok(b) = (unsafe { CqBox::from_ptr(cq) }) else {
            return -1;
        };
        if n < 0 || (wc.is_null() && n > 0) {
            return -1;
        }
        let mut buf = [Completion::default(); 32];
        let mut done = 0usize;
        let want = n as usize;
        while done < want {
            let chunk = (want - done).min(buf.len());
            let got = b.inner.poll(&mut buf[..chunk]);
            for (i, c) in buf[..got].iter().enumerate() {
                // SAFETY: the caller's array holds n >= done+got entries.
                unsafe { *wc.add(done + i) = wc_from(c) };
            }
            done += got;
            if got < chunk {
                break;
            }
        }
        done as c_int
    })
}

/// `ops.req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard_int("ibv_req_notify_cq", || {
        // SAFETY: a CQ of ours (verb contract).
        let b = unsafe { CqBox::from_ptr(cq)? };
        if b.cq.channel.is_null() {
            // Nothing to notify; providers accept the call.
            return Ok(0);
        }
        b.inner.req_notify(solicited_only != 0)?;
        Ok(0)
    })
}

pub(crate) unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard_neg("ibv_get_cq_event", || {
        // SAFETY: a channel of ours and the caller's out-parameters (verb contract).
        let (b, cq_out) = unsafe { (ChannelBox::from_ptr(ch)?, nonnull_mut(cq)?) };
        loop {
            // A read(2) of the channel fd in its own mode: blocks, or EAGAIN / EINTR.
            let id = b.inner.read_event()?;
            // SAFETY: the channel's context is ours and alive.
            let c = unsafe { CtxBox::from_ctx(b.ch.context)? };
            let Some(&p) = c.registry.lock().cqs.get(&id.0) else {
                // The CQ was destroyed after it fired: drop the stale event.
                continue;
            };
            let p = p as *mut CqBox;
            // SAFETY: registered CQs are alive.
            unsafe { (*p).comp_reported.add() };
            *cq_out = p.cast();
            if !cq_context.is_null() {
                // SAFETY: registered CQs are alive; optional out-parameter.
                unsafe { *cq_context = (*p).cq.cq_context };
            }
            return Ok(0);
        }
    })
}

pub(crate) unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: c_uint) {
    guard_val("ibv_ack_cq_events", (), || {
        // SAFETY: a CQ of ours (verb contract).
        if let Ok(b) = unsafe { CqBox::from_ptr(cq) } {
            // SAFETY: the counter is a field of our live CQ, written under its mutex.
            unsafe {
                b.ack_lock()
                    .ack(&raw mut (*(cq as *mut CqBox)).cq.comp_events_completed, n)
            };
            // SAFETY: channel outlives its CQs.
            if let Ok(ch) = unsafe { ChannelBox::from_ptr(b.cq.channel) } {
                ch.inner.ack_events(n);
            }
        }
    })
}

// ---- ibv_cq_ex polling ----

fn cqx<'a>(cq: *mut ibv_cq_ex) -> Option<&'a CqBox> {
    // SAFETY: the ibv_cq_ex function pointers are only reachable through our CQs.
    unsafe { CqBox::from_ptr(cq.cast()).ok() }
}

fn poll_one(cq: *mut ibv_cq_ex) -> c_int {
    let Some(b) = cqx(cq) else {
        return libc::EINVAL;
    };
    let mut one = [Completion::default()];
    if b.inner.poll(&mut one) == 0 {
        return libc::ENOENT;
    }
    // SAFETY: only the polling thread touches `cur` (ibv_cq_ex contract) and the C
    // fields `status`/`wr_id` of its own CQ.
    unsafe {
        *b.cur.get() = one[0];
        *b.cur_ts.get() = now_ns(libc::CLOCK_MONOTONIC);
        *b.cur_wall.get() = now_ns(libc::CLOCK_REALTIME);
        (*cq).status = one[0].status as u32;
        (*cq).wr_id = one[0].wr_id;
    }
    0
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard_val("ibv_start_poll", libc::EIO, || {
        // SAFETY: optional caller attribute.
        if let Some(a) = unsafe { attr.as_ref() } {
            if a.comp_mask != 0 {
                return libc::EINVAL;
            }
        }
        poll_one(cq)
    })
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard_val("ibv_next_poll", libc::EIO, || poll_one(cq))
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

fn cur(cq: *mut ibv_cq_ex) -> Completion {
    match cqx(cq) {
        // SAFETY: read by the polling thread that wrote it.
        Some(b) => unsafe { *b.cur.get() },
        None => Completion::default(),
    }
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).opcode as u32
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).vendor_err
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).byte_len
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    imm_to_c(&cur(cq))
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).qp_num
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).src_qp
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    cur(cq).wc_flags.bits()
}
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    u32::from(cur(cq).slid)
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    cur(cq).sl
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    cur(cq).dlid_path_bits
}
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: read by the polling thread that wrote it.
    cqx(cq).map(|b| unsafe { *b.cur_ts.get() }).unwrap_or(0)
}
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: read by the polling thread that wrote it.
    cqx(cq).map(|b| unsafe { *b.cur_wall.get() }).unwrap_or(0)
}
unsafe extern "C" fn read_cvlan(_cq: *mut ibv_cq_ex) -> u16 {
    0
}
unsafe extern "C" fn read_flow_tag(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_tm_info(_cq: *mut ibv_cq_ex, info: *mut ibv_wc_tm_info) {
    // SAFETY: optional out-parameter.
    if let Some(i) = unsafe { info.as_mut() } {
        i.tag = 0;
        i.priv_ = 0;
    }
}
