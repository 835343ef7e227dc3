//! Queue pairs and shared receive queues: create/modify/query/destroy, the posting ops
//! (`ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`) and the `ibv_qp_ex` work
//! request builder (`ibv_wr_start` ... `ibv_wr_complete`).

use std::ffi::{c_int, c_void};

use parking_lot::Mutex;
use softhca::{
    AccessFlags, Mtu, Payload, Qp, QpAttr, QpAttrMask, QpCap, QpInit, QpState, QpType, RecvWr,
    SendFlags, SendWr, Sge, SmallVec, Srq, SrqAttr, WrOpcode,
};

use crate::abi::*;
use crate::cq::CqBox;
use crate::device::CtxBox;
use crate::errno::Errno;
use crate::event::{AckLock, Reported};
use crate::ffi::{guard_int, guard_ptr, guard_val, nonnull, nonnull_mut};
use crate::objects::{av_from_c, av_to_c, AhBox, PdBox};

/// The `ibv_qp_ex` builder state between `wr_start` and `wr_complete`/`wr_abort`.
#[derive(Default)]
struct Builder {
    wrs: Vec<SendWr>,
    /// First error seen while building (reported by `wr_complete`).
    err: c_int,
}

/// `ibv_qp_ex` (beginning with `ibv_qp`) + the softhca QP.
#[repr(C)]
pub(crate) struct QpBox {
    pub qpx: ibv_qp_ex,
    pub inner: Qp,
    builder: Mutex<Builder>,
    /// Async events handed out for this QP (destroy waits for their acks).
    pub reported: Reported,
}

impl QpBox {
    /// The QP's `mutex`/`cond` for event acknowledgement.
    pub(crate) fn ack_lock(&self) -> AckLock {
        let q = &self.qpx.qp_base;
        // SAFETY: fields of this live box, zero-initialised at creation.
        unsafe {
            AckLock::new(
                (&raw const q.mutex).cast_mut(),
                (&raw const q.cond).cast_mut(),
            )
        }
    }

    /// # Safety
    /// `qp` must be null or a QP of ours, not destroyed.
    pub(crate) unsafe fn from_ptr<'a>(qp: *const ibv_qp) -> Result<&'a QpBox, Errno> {
        // SAFETY: our QPs are the first field of a repr(C) QpBox (contract).
        unsafe { nonnull(qp as *const QpBox) }
    }
}

fn qp_type(t: u32) -> Result<QpType, Errno> {
    match t {
        2 => Ok(QpType::Rc),
        3 => Ok(QpType::Uc),
        4 => Ok(QpType::Ud),
        // XRC, raw packet, driver QPs.
        _ => Err(Errno::NOTSUP),
    }
}

fn cap_from_c(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn cap_to_c(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// What both `ibv_create_qp` and `create_qp_ex` need.
struct CreateArgs {
    /// The device's GSI QP (QPN 1) rather than a numbered one.
    gsi: bool,
    pd: *mut ibv_pd,
    qp_context: *mut c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: *mut ibv_qp_cap,
    qp_type: u32,
    sq_sig_all: c_int,
}

fn create(a: CreateArgs) -> Result<*mut QpBox, Errno> {
    // SAFETY: C objects of ours (verb contract).
    let (pd, scq, rcq) = unsafe {
        (
            PdBox::from_ptr(a.pd)?,
            CqBox::from_ptr(a.send_cq)?,
            CqBox::from_ptr(a.recv_cq)?,
        )
    };
    let srq = if a.srq.is_null() {
        None
    } else {
        // SAFETY: an SRQ of ours.
        Some(unsafe { SrqBox::from_ptr(a.srq)? })
    };
    // SAFETY: the caller's cap struct (inside its init attributes).
    let cap = unsafe { nonnull_mut(a.cap)? };
    let ty = qp_type(a.qp_type)?;
    let init = QpInit {
        qp_type: ty,
        send_cq: &scq.inner,
        recv_cq: &rcq.inner,
        srq: srq.map(|s| &s.inner),
        cap: cap_from_c(cap),
        sq_sig_all: a.sq_sig_all != 0,
    };
    let inner = if a.gsi {
        pd.inner.create_gsi_qp(&init)?
    } else {
        pd.inner.create_qp(&init)?
    };
    // Providers report the capacities they granted back in init_attr.cap.
    if let Ok((_, ia)) = inner.query() {
        *cap = cap_to_c(&ia.cap);
    }
    let qpn = inner.qpn();
    let ctx = pd.pd.context;
    let b = Box::new(QpBox {
        qpx: ibv_qp_ex {
            qp_base: ibv_qp {
                context: ctx,
                qp_context: a.qp_context,
                pd: a.pd,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                srq: a.srq,
                handle: qpn,
                qp_num: qpn,
                state: QpState::Reset as u32,
                qp_type: a.qp_type,
                mutex: pthread_mutex_t::default(),
                cond: pthread_cond_t::default(),
                events_completed: 0,
            },
            comp_mask: 0,
            wr_id: 0,
            wr_flags: 0,
            wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
            wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
            wr_bind_mw: Some(wr_bind_mw),
            wr_local_inv: Some(wr_local_inv),
            wr_rdma_read: Some(wr_rdma_read),
            wr_rdma_write: Some(wr_rdma_write),
            wr_rdma_write_imm: Some(wr_rdma_write_imm),
            wr_send: Some(wr_send),
            wr_send_imm: Some(wr_send_imm),
            wr_send_inv: Some(wr_send_inv),
            wr_send_tso: Some(wr_send_tso),
            wr_set_ud_addr: Some(wr_set_ud_addr),
            wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
            wr_set_inline_data: Some(wr_set_inline_data),
            wr_set_inline_data_list: Some(wr_set_inline_data_list),
            wr_set_sge: Some(wr_set_sge),
            wr_set_sge_list: Some(wr_set_sge_list),
            wr_start: Some(wr_start),
            wr_complete: Some(wr_complete),
            wr_abort: Some(wr_abort),
            wr_atomic_write: Some(wr_atomic_write),
        },
        inner,
        builder: Mutex::new(Builder::default()),
        reported: Reported::default(),
    });
    let p = Box::into_raw(b);
    // SAFETY: the PD's context is ours and alive.
    if let Ok(c) = unsafe { CtxBox::from_ctx(ctx) } {
        c.registry.lock().qps.insert(qpn, p as usize);
    }
    Ok(p)
}

pub(crate) unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard_ptr("ibv_create_qp", || {
        // SAFETY: the caller's attributes.
        let a = unsafe { nonnull_mut(attr)? };
        create(CreateArgs {
            gsi: false,
            pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: &mut a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        })
        .map(|p| p.cast())
    })
}

/// `verbs_context::create_qp_ex`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    _ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard_ptr("ibv_create_qp_ex", || {
        // SAFETY: the caller's attributes.
        let a = unsafe { nonnull_mut(attr)? };
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return Err(Errno::INVAL);
        }
        if a.comp_mask & !known != 0 {
            // XRC domains, TSO, RSS: not supported.
            return Err(Errno::NOTSUP);
        }
        // rxe takes no create flags (rxe_create_qp: EOPNOTSUPP for any), but zero is
        // accepted, as the kernel does.
        if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return Err(Errno::NOTSUP);
        }
        // Send ops this QP builds with ibv_wr_*: all but TSO and atomic write.
        let supported_ops = 0x3ff;
        if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !supported_ops != 0
        {
            return Err(Errno::NOTSUP);
        }
        let p = create(CreateArgs {
            gsi: false,
            pd: a.pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: &mut a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        })?;
        Ok(p.cast())
    })
}

/// softhca's private verb for its librdmacm: the device's GSI QP (QPN 1, UD), on which
/// CM MADs to and from QP 1 travel (Q_Key 0x80010000), as the kernel's MAD layer owns
/// it for ib_cm. One per device: `EBUSY` if it exists.
pub(crate) unsafe extern "C" fn softhca_create_gsi_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard_ptr("softhca_create_gsi_qp", || {
        // SAFETY: the caller's attributes.
        let a = unsafe { nonnull_mut(attr)? };
        create(CreateArgs {
            gsi: true,
            pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: &mut a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        })
        .map(|p| p.cast())
    })
}

pub(crate) unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // Every QP of ours carries the ibv_qp_ex function table.
    qp.cast()
}

pub(crate) unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard_int("ibv_destroy_qp", || {
        // SAFETY: a QP of ours (verb contract).
        let b = unsafe { QpBox::from_ptr(qp)? };
        // uverbs refuses to destroy a QP still attached to a multicast group.
        if b.inner.in_mcast_group() {
            return Err(Errno::BUSY);
        }
        // SAFETY: `events_completed` is a field of this live QP.
        unsafe {
            b.ack_lock()
                .wait_acked(&[(&raw const b.qpx.qp_base.events_completed, &b.reported)])
        };
        // SAFETY: the context outlives its QPs.
        if let Ok(c) = unsafe { CtxBox::from_ctx(b.qpx.qp_base.context) } {
            c.registry.lock().qps.remove(&b.qpx.qp_base.qp_num);
        }
        // SAFETY: freed once; dropping the softhca QP destroys it in the engine.
        drop(unsafe { Box::from_raw(qp as *mut QpBox) });
        Ok(0)
    })
}

/// `ibv_attach_mcast`: on RoCE the multicast LID plays no part (rxe ignores it).
pub(crate) unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard_int("ibv_attach_mcast", || {
        // SAFETY: a QP of ours and the caller's GID (verb contract).
        let (b, gid) = unsafe { (QpBox::from_ptr(qp)?, nonnull(gid)?) };
        b.inner.attach_mcast(softhca::Gid(gid.raw))?;
        Ok(0)
    })
}

/// `ibv_detach_mcast`.
pub(crate) unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard_int("ibv_detach_mcast", || {
        // SAFETY: a QP of ours and the caller's GID (verb contract).
        let (b, gid) = unsafe { (QpBox::from_ptr(qp)?, nonnull(gid)?) };
        b.inner.detach_mcast(softhca::Gid(gid.raw))?;
        Ok(0)
    })
}

fn state(v: u32) -> Result<QpState, Errno> {
    QpState::from_u32(v).ok_or(Errno::INVAL)
}

/// `ibv_qp_attr` + mask as softhca's, refusing what softhca cannot do (alternate paths,
/// rate limits) and out-of-range values with `EINVAL`.
fn attr_from_c(a: &ibv_qp_attr, mask: c_int) -> Result<(QpAttr, QpAttrMask), Errno> {
    let m = QpAttrMask::from_bits(mask as u32).ok_or(Errno::INVAL)?;
    if m.intersects(QpAttrMask::ALT_PATH | QpAttrMask::PATH_MIG_STATE) {
        return Err(Errno::NOTSUP);
    }
    let mut attr = QpAttr::default();
    if m.contains(QpAttrMask::STATE) {
        attr.qp_state = state(a.qp_state)?;
    }
    if m.contains(QpAttrMask::CUR_STATE) {
        attr.cur_qp_state = state(a.cur_qp_state)?;
    }
    if m.contains(QpAttrMask::PATH_MTU) {
        attr.path_mtu = Mtu::from_u32(a.path_mtu).ok_or(Errno::INVAL)?;
    }
    if m.contains(QpAttrMask::ACCESS_FLAGS) {
        attr.qp_access_flags = AccessFlags::from_bits(a.qp_access_flags).ok_or(Errno::INVAL)?;
    }
    if m.contains(QpAttrMask::AV) {
        attr.ah_attr = av_from_c(&a.ah_attr)?;
    }
    attr.qkey = a.qkey;
    attr.rq_psn = a.rq_psn;
    attr.sq_psn = a.sq_psn;
    attr.dest_qp_num = a.dest_qp_num;
    attr.cap = cap_from_c(&a.cap);
    attr.pkey_index = a.pkey_index;
    attr.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    attr.max_rd_atomic = a.max_rd_atomic;
    attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
    attr.min_rnr_timer = a.min_rnr_timer;
    attr.port_num = a.port_num;
    attr.timeout = a.timeout;
    attr.retry_cnt = a.retry_cnt;
    attr.rnr_retry = a.rnr_retry;
    Ok((attr, m))
}

fn attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.cur_qp_state as u32,
        path_mtu: a.path_mtu as u32,
        // IBV_MIG_MIGRATED: no automatic path migration.
        path_mig_state: 2,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.bits(),
        cap: cap_to_c(&a.cap),
        ah_attr: av_to_c(&a.ah_attr),
        alt_ah_attr: ibv_ah_attr::default(),
        pkey_index: a.pkey_index,
        alt_pkey_index: 0,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        rate_limit: 0,
    }
}

pub(crate) unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard_int("ibv_modify_qp", || {
        // SAFETY: a QP of ours and the caller's attributes (verb contract).
        let (b, a) = unsafe { (QpBox::from_ptr(qp)?, nonnull(attr)?) };
        let (attr, m) = attr_from_c(a, mask)?;
        b.inner.modify(&attr, m)?;
        if m.contains(QpAttrMask::STATE) {
            // SAFETY: `state` is a plain C field of our live QP.
            unsafe { (*qp).state = attr.qp_state as u32 };
        }
        Ok(0)
    })
}

pub(crate) unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard_int("ibv_query_qp", || {
        // SAFETY: a QP of ours and the caller's out-parameters (verb contract).
        let (b, out) = unsafe { (QpBox::from_ptr(qp)?, nonnull_mut(attr)?) };
        let (a, ia) = b.inner.query()?;
        *out = attr_to_c(&a);
        // SAFETY: optional out-parameter.
        if let Some(i) = unsafe { init.as_mut() } {
            let base = &b.qpx.qp_base;
            i.qp_context = base.qp_context;
            i.send_cq = base.send_cq;
            i.recv_cq = base.recv_cq;
            i.srq = base.srq;
            i.cap = cap_to_c(&ia.cap);
            i.qp_type = base.qp_type;
            i.sq_sig_all = c_int::from(ia.sq_sig_all);
        }
        // SAFETY: keep the C-visible state current.
        unsafe { (*qp).state = a.qp_state as u32 };
        Ok(0)
    })
}

fn opcode(v: u32) -> Result<WrOpcode, Errno> {
    Ok(match v {
        0 => WrOpcode::RdmaWrite,
        1 => WrOpcode::RdmaWriteWithImm,
        2 => WrOpcode::Send,
        3 => WrOpcode::SendWithImm,
        4 => WrOpcode::RdmaRead,
        5 => WrOpcode::AtomicCmpAndSwp,
        6 => WrOpcode::AtomicFetchAndAdd,
        IBV_WR_LOCAL_INV => WrOpcode::LocalInv,
        IBV_WR_BIND_MW => WrOpcode::BindMw,
        9 => WrOpcode::SendWithInv,
        // TSO, atomic write, driver opcodes.
        _ => return Err(Errno::NOTSUP),
    })
}

/// The C scatter/gather list (`num` entries at `sg`).
///
/// # Safety
/// `sg` must point to `num` valid entries when `num > 0`.
unsafe fn sges<'a>(sg: *const ibv_sge, num: c_int) -> Result<&'a [ibv_sge], Errno> {
    if num < 0 || (num > 0 && sg.is_null()) {
        return Err(Errno::INVAL);
    }
    if num == 0 {
        return Ok(&[]);
    }
    // SAFETY: contract.
    Ok(unsafe { std::slice::from_raw_parts(sg, num as usize) })
}

fn sge_list(s: &[ibv_sge]) -> SmallVec<[Sge; 4]> {
    s.iter()
        .map(|g| Sge {
            addr: g.addr,
            length: g.length,
            lkey: g.lkey,
        })
        .collect()
}

/// `IBV_SEND_INLINE`: the bytes are copied now, from process addresses (lkeys ignored),
/// so the buffer may be reused as soon as the post returns.
///
/// # Safety
/// Every SGE must name `length` readable bytes at `addr` (the inline contract).
unsafe fn inline_copy(s: &[ibv_sge]) -> SmallVec<[u8; 64]> {
    let mut v = SmallVec::new();
    for g in s {
        if g.length > 0 && g.addr != 0 {
            // SAFETY: contract.
            v.extend_from_slice(unsafe {
                std::slice::from_raw_parts(g.addr as usize as *const u8, g.length as usize)
            });
        }
    }
    v
}

fn send_wr_from_c(w: &ibv_send_wr) -> Result<SendWr, Errno> {
    let op = opcode(w.opcode)?;
    let flags = SendFlags::from_bits_truncate(w.send_flags);
    // SAFETY: the WR's sg_list has num_sge entries (post contract).
    let list = unsafe { sges(w.sg_list, w.num_sge)? };
    let payload = if flags.contains(SendFlags::INLINE) {
        // SAFETY: inline contract.
        Payload::Inline(unsafe { inline_copy(list) })
    } else {
        Payload::Sges(sge_list(list))
    };
    let mut wr = SendWr {
        wr_id: w.wr_id,
        opcode: op,
        flags,
        payload,
        ..SendWr::default()
    };
    match op {
        WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm => {
            wr.imm_data = u32::from_be(w.imm_data)
        }
        // `invalidate_rkey` shares the place of `imm_data`, in host order.
        WrOpcode::SendWithInv | WrOpcode::LocalInv => wr.imm_data = w.imm_data,
        WrOpcode::BindMw => {
            // SAFETY: the union member IBV_WR_BIND_MW uses (same size as the mirror).
            let b: ibv_send_wr_bind_mw = unsafe { std::mem::transmute_copy(&w.bind_mw) };
            // SAFETY: a window of ours named by the caller's WR (verb contract).
            let mw = unsafe { crate::mw::MwBox::from_ptr(b.mw)? };
            wr.bind = Some(crate::mw::mw_bind(mw.mw.rkey, b.rkey as u8, &b.bind_info)?);
        }
        _ => {}
    }
    match op {
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => {
            // SAFETY: the union member these opcodes use.
            let r = unsafe { w.wr.rdma };
            wr.remote_addr = r.remote_addr;
            wr.rkey = r.rkey;
        }
        WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
            // SAFETY: the union member these opcodes use.
            let a = unsafe { w.wr.atomic };
            wr.remote_addr = a.remote_addr;
            wr.rkey = a.rkey;
            wr.compare_add = a.compare_add;
            wr.swap = a.swap;
        }
        _ => {}
    }
    Ok(wr)
}

/// `ops.post_send`: what the inline `ibv_post_send` calls. Posts the whole list under
/// one engine lock; on failure `*bad` names the first WR not posted.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard_int("ibv_post_send", || {
        // SAFETY: a QP of ours (verb contract).
        let b = unsafe { QpBox::from_ptr(qp)? };
        let ud = b.qpx.qp_base.qp_type == QpType::Ud as u32;
        let mut wrs: SmallVec<[SendWr; 8]> = SmallVec::new();
        let mut ptrs: SmallVec<[*mut ibv_send_wr; 8]> = SmallVec::new();
        let mut cur = wr;
        let mut conv_err = None;
        while !cur.is_null() {
            // SAFETY: a list of the caller's WRs.
            let w = unsafe { &*cur };
            let r = send_wr_from_c(w).and_then(|mut s| {
                if ud {
                    // SAFETY: UD WRs name an AH of ours.
                    let ud = unsafe { w.wr.ud };
                    // SAFETY: an AH of ours.
                    let ah = unsafe { AhBox::from_ptr(ud.ah)? };
                    s.ud = Some(ah.inner.ud_dest(ud.remote_qpn, ud.remote_qkey));
                }
                Ok(s)
            });
            match r {
                Ok(s) => {
                    wrs.push(s);
                    ptrs.push(cur);
                }
                Err(e) => {
                    conv_err = Some((cur, e));
                    break;
                }
            }
            cur = w.next;
        }
        let posted = match b.inner.post_send_batch(wrs) {
            Ok(()) => None,
            Err((i, e)) => Some((ptrs.get(i).copied().unwrap_or(wr), Errno::from(e))),
        };
        match posted.or(conv_err) {
            None => Ok(0),
            Some((p, e)) => {
                if !bad.is_null() {
                    // SAFETY: caller's out-parameter.
                    unsafe { *bad = p };
                }
                Err(e)
            }
        }
    })
}

fn recv_wr_from_c(w: &ibv_recv_wr) -> Result<RecvWr, Errno> {
    // SAFETY: the WR's sg_list has num_sge entries (post contract).
    let list = unsafe { sges(w.sg_list, w.num_sge)? };
    Ok(RecvWr {
        wr_id: w.wr_id,
        sg_list: sge_list(list),
    })
}

/// Walks a receive list, posting each WR with `post`; `*bad` names the failing one.
fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    mut post: impl FnMut(RecvWr) -> Result<(), softhca::Error>,
) -> Result<c_int, Errno> {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: a list of the caller's WRs.
        let w = unsafe { &*cur };
        if let Err(e) = recv_wr_from_c(w).and_then(|r| post(r).map_err(Errno::from)) {
            if !bad.is_null() {
                // SAFETY: caller's out-parameter.
                unsafe { *bad = cur };
            }
            return Err(e);
        }
        cur = w.next;
    }
    Ok(0)
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard_int("ibv_post_recv", || {
        // SAFETY: a QP of ours (verb contract).
        let b = unsafe { QpBox::from_ptr(qp)? };
        post_recv_list(wr, bad, |r| b.inner.post_recv(r))
    })
}

// ---- shared receive queues ----

/// `ibv_srq` + the softhca SRQ.
#[repr(C)]
pub(crate) struct SrqBox {
    pub srq: ibv_srq,
    pub inner: Srq,
    /// Async events handed out for this SRQ (destroy waits for their acks).
    pub reported: Reported,
}

impl SrqBox {
    /// The SRQ's `mutex`/`cond` for event acknowledgement.
    pub(crate) fn ack_lock(&self) -> AckLock {
        let q = &self.srq;
        // SAFETY: fields of this live box, zero-initialised at creation.
        unsafe {
            AckLock::new(
                (&raw const q.mutex).cast_mut(),
                (&raw const q.cond).cast_mut(),
            )
        }
    }

    /// # Safety
    /// `srq` must be null or an SRQ of ours, not destroyed.
    pub(crate) unsafe fn from_ptr<'a>(srq: *const ibv_srq) -> Result<&'a SrqBox, Errno> {
        // SAFETY: our SRQs are the first field of a repr(C) SrqBox (contract).
        unsafe { nonnull(srq as *const SrqBox) }
    }
}

fn srq_create(
    pd: *mut ibv_pd,
    srq_context: *mut c_void,
    attr: &mut ibv_srq_attr,
) -> Result<*mut ibv_srq, Errno> {
    // SAFETY: a PD of ours (verb contract).
    let p = unsafe { PdBox::from_ptr(pd)? };
    let inner = p.inner.create_srq(SrqAttr {
        max_wr: attr.max_wr,
        max_sge: attr.max_sge,
        srq_limit: attr.srq_limit,
    })?;
    if let Ok(a) = inner.query() {
        attr.max_wr = a.max_wr;
        attr.max_sge = a.max_sge;
    }
    let id = inner.id().0;
    let ctx = p.pd.context;
    let b = Box::into_raw(Box::new(SrqBox {
        srq: ibv_srq {
            context: ctx,
            srq_context,
            pd,
            handle: id,
            mutex: pthread_mutex_t::default(),
            cond: pthread_cond_t::default(),
            events_completed: 0,
        },
        inner,
        reported: Reported::default(),
    }));
    // SAFETY: the PD's context is ours and alive.
    if let Ok(c) = unsafe { CtxBox::from_ctx(ctx) } {
        c.registry.lock().srqs.insert(id, b as usize);
    }
    Ok(b.cast())
}

pub(crate) unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard_ptr("ibv_create_srq", || {
        // SAFETY: the caller's attributes.
        let a = unsafe { nonnull_mut(attr)? };
        srq_create(pd, a.srq_context, &mut a.attr)
    })
}

/// `verbs_context::create_srq_ex`: basic SRQs only (no XRC or tag matching).
pub(crate) unsafe extern "C" fn create_srq_ex(
    _ctx: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard_ptr("ibv_create_srq_ex", || {
        // SAFETY: the caller's attributes.
        let a = unsafe { nonnull_mut(attr)? };
        if a.comp_mask & !(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD) != 0 {
            return Err(Errno::NOTSUP);
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != IBV_SRQT_BASIC {
            return Err(Errno::NOTSUP);
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 {
            return Err(Errno::INVAL);
        }
        srq_create(a.pd, a.srq_context, &mut a.attr)
    })
}

pub(crate) unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard_int("ibv_modify_srq", || {
        // SAFETY: an SRQ of ours and the caller's attributes (verb contract).
        let (b, a) = unsafe { (SrqBox::from_ptr(srq)?, nonnull(attr)?) };
        if mask & !3 != 0 {
            return Err(Errno::INVAL);
        }
        b.inner.modify(
            SrqAttr {
                max_wr: a.max_wr,
                max_sge: a.max_sge,
                srq_limit: a.srq_limit,
            },
            mask as u32,
        )?;
        Ok(0)
    })
}

pub(crate) unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard_int("ibv_query_srq", || {
        // SAFETY: an SRQ of ours and the caller's out-parameter (verb contract).
        let (b, out) = unsafe { (SrqBox::from_ptr(srq)?, nonnull_mut(attr)?) };
        let a = b.inner.query()?;
        *out = ibv_srq_attr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        Ok(0)
    })
}

pub(crate) unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard_int("ibv_destroy_srq", || {
        // SAFETY: an SRQ of ours (verb contract).
        let b = unsafe { SrqBox::from_ptr(srq)? };
        // SAFETY: `events_completed` is a field of this live SRQ.
        unsafe {
            b.ack_lock()
                .wait_acked(&[(&raw const b.srq.events_completed, &b.reported)])
        };
        // SAFETY: the context outlives its SRQs.
        if let Ok(c) = unsafe { CtxBox::from_ctx(b.srq.context) } {
            c.registry.lock().srqs.remove(&b.srq.handle);
        }
        // SAFETY: freed once; QPs attached keep the softhca SRQ alive.
        drop(unsafe { Box::from_raw(srq as *mut SrqBox) });
        Ok(0)
    })
}

/// `ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard_int("ibv_post_srq_recv", || {
        // SAFETY: an SRQ of ours (verb contract).
        let b = unsafe { SrqBox::from_ptr(srq)? };
        post_recv_list(wr, bad, |r| b.inner.post_recv(r))
    })
}

/// `verbs_context::get_srq_num`: only XRC SRQs have a number.
pub(crate) unsafe extern "C" fn get_srq_num(_srq: *mut ibv_srq, _num: *mut u32) -> c_int {
    libc::EOPNOTSUPP
}

// ---- ibv_qp_ex work request builder ----

fn with_builder(qp: *mut ibv_qp_ex, f: impl FnOnce(&QpBox, &mut Builder)) {
    guard_val("ibv_wr_*", (), || {
        // SAFETY: the ibv_wr_* pointers are only reachable through our QPs.
        if let Ok(b) = unsafe { QpBox::from_ptr(qp.cast()) } {
            let mut g = b.builder.lock();
            f(b, &mut g);
        }
    })
}

/// Starts a new WR with the QP's current `wr_id` / `wr_flags`.
fn begin(qp: *mut ibv_qp_ex, op: WrOpcode, f: impl FnOnce(&mut SendWr)) {
    with_builder(qp, |b, g| {
        let mut wr = SendWr {
            wr_id: b.qpx.wr_id,
            opcode: op,
            flags: SendFlags::from_bits_truncate(b.qpx.wr_flags),
            ..SendWr::default()
        };
        f(&mut wr);
        g.wrs.push(wr);
    })
}

/// Applies `f` to the WR being built (the last one started).
fn last(qp: *mut ibv_qp_ex, f: impl FnOnce(&QpBox, &mut SendWr) -> Result<(), Errno>) {
    with_builder(qp, |b, g| {
        let r = match g.wrs.last_mut() {
            Some(w) => f(b, w),
            None => Err(Errno::INVAL),
        };
        if let Err(Errno(e)) = r {
            if g.err == 0 {
                g.err = e;
            }
        }
    })
}

fn fail(qp: *mut ibv_qp_ex, e: Errno) {
    with_builder(qp, |_, g| {
        if g.err == 0 {
            g.err = e.0;
        }
    })
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    with_builder(qp, |_, g| {
        g.wrs.clear();
        g.err = 0;
    })
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    guard_val("ibv_wr_complete", libc::EIO, || {
        // SAFETY: reachable only through our QPs.
        let Ok(b) = (unsafe { QpBox::from_ptr(qp.cast()) }) else {
            return libc::EINVAL;
        };
        let (wrs, err) = {
            let mut g = b.builder.lock();
            (std::mem::take(&mut g.wrs), std::mem::take(&mut g.err))
        };
        if err != 0 {
            return err;
        }
        match b.inner.post_send_batch(wrs) {
            Ok(()) => 0,
            Err((_, e)) => Errno::from(e).0,
        }
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with_builder(qp, |_, g| {
        g.wrs.clear();
        g.err = 0;
    })
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    begin(qp, WrOpcode::Send, |_| {})
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    begin(qp, WrOpcode::SendWithImm, |w| {
        w.imm_data = u32::from_be(imm)
    })
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    begin(qp, WrOpcode::SendWithInv, |w| w.imm_data = rkey)
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(qp, WrOpcode::RdmaWrite, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
    })
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    begin(qp, WrOpcode::RdmaWriteWithImm, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.imm_data = u32::from_be(imm);
    })
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    begin(qp, WrOpcode::RdmaRead, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
    })
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(qp, WrOpcode::AtomicCmpAndSwp, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.compare_add = compare;
        w.swap = swap;
    })
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    begin(qp, WrOpcode::AtomicFetchAndAdd, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.compare_add = add;
    })
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut c_void,
    rkey: u32,
    info: *const c_void,
) {
    // SAFETY: a window of ours and the caller's bind information (verb contract).
    let bind = unsafe { crate::mw::MwBox::from_ptr(mw.cast()) }.and_then(|w| {
        // SAFETY: as above.
        let i = unsafe { nonnull(info as *const ibv_mw_bind_info)? };
        crate::mw::mw_bind(w.mw.rkey, rkey as u8, i)
    });
    match bind {
        Ok(b) => begin(qp, WrOpcode::BindMw, |w| w.bind = Some(b)),
        Err(e) => fail(qp, e),
    }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    begin(qp, WrOpcode::LocalInv, |w| w.imm_data = rkey)
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _h: *mut c_void, _hs: u16, _mss: u16) {
    fail(qp, Errno::NOTSUP)
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _srqn: u32) {
    fail(qp, Errno::NOTSUP)
}

unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _v: *const c_void,
) {
    fail(qp, Errno::NOTSUP)
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    last(qp, |_, w| {
        // SAFETY: an AH of ours.
        let a = unsafe { AhBox::from_ptr(ah)? };
        w.ud = Some(a.inner.ud_dest(qpn, qkey));
        Ok(())
    })
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last(qp, |_, w| {
        w.payload = Payload::Sges(SmallVec::from_slice(&[Sge { addr, length, lkey }]));
        Ok(())
    })
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    last(qp, |_, w| {
        let n = c_int::try_from(n).map_err(|_| Errno::INVAL)?;
        // SAFETY: the caller's list of n SGEs.
        let s = unsafe { sges(list, n)? };
        w.payload = Payload::Sges(sge_list(s));
        Ok(())
    })
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    last(qp, |_, w| {
        let mut v = SmallVec::new();
        if length > 0 {
            if addr.is_null() {
                return Err(Errno::INVAL);
            }
            // SAFETY: the caller's buffer of `length` bytes, copied now (inline).
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, length) });
        }
        w.payload = Payload::Inline(v);
        Ok(())
    })
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    n: usize,
    bufs: *const ibv_data_buf,
) {
    last(qp, |_, w| {
        if n > 0 && bufs.is_null() {
            return Err(Errno::INVAL);
        }
        let mut v = SmallVec::new();
        for i in 0..n {
            // SAFETY: the caller's array of n buffers.
            let b = unsafe { &*bufs.add(i) };
            if b.length > 0 {
                if b.addr.is_null() {
                    return Err(Errno::INVAL);
                }
                // SAFETY: the caller's buffer, copied now (inline).
                v.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(b.addr as *const u8, b.length)
                });
            }
        }
        w.payload = Payload::Inline(v);
        Ok(())
    })
}

/// `ibv_query_qp_data_in_order`: 0 = no in-order guarantee is promised beyond IBTA's.
pub(crate) unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: u32,
    _flags: u32,
) -> c_int {
    0
}
