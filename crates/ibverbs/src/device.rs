//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, the query verbs.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::{null, null_mut};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use softhca::{Config, Context};

use crate::abi::*;
use crate::errno::{debug, Errno};
use crate::ffi::{copy_sized, guard_int, guard_neg, guard_ptr, guard_val, nonnull, nonnull_mut};

/// One listed device. Allocated once per process and never freed: `ibv_device`
/// pointers stay valid after `ibv_free_device_list`, as with rdma-core (which keeps
/// them while any context is open).
#[repr(C)]
pub(crate) struct DeviceBox {
    pub dev: ibv_device,
    /// The configuration this device opens with.
    pub cfg: Config,
    /// Position in the list (`ibv_get_device_index`).
    pub index: c_int,
}

// SAFETY: the raw pointers in `ibv_device` are null and never written after creation.
unsafe impl Send for DeviceBox {}
// SAFETY: as above: read-only after creation.
unsafe impl Sync for DeviceBox {}

fn fill_cstr(dst: &mut [c_char], s: &str) {
    let max = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(max)) {
        *d = b as c_char;
    }
}

/// The devices of this process: one, configured from the environment (`SOFTHCA_*`).
fn devices() -> &'static [DeviceBox] {
    // A Vec built once and never touched again: its elements never move.
    static DEVS: OnceLock<Vec<DeviceBox>> = OnceLock::new();
    DEVS.get_or_init(|| {
        let cfg = match Config::from_env() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("softhca-ibverbs: bad configuration, no device: {e}");
                return Vec::new();
            }
        };
        let mut dev = ibv_device {
            _ops: _ibv_device_ops {
                _dummy1: null_mut(),
                _dummy2: null_mut(),
            },
            node_type: IBV_NODE_CA,
            // Like rxe: RoCE devices report the IB transport.
            transport_type: IBV_TRANSPORT_IB,
            name: [0; 64],
            dev_name: [0; 64],
            dev_path: [0; 256],
            ibdev_path: [0; 256],
        };
        fill_cstr(&mut dev.name, &cfg.name);
        fill_cstr(&mut dev.dev_name, &format!("uverbs-{}", cfg.name));
        fill_cstr(
            &mut dev.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs-{}", cfg.name),
        );
        fill_cstr(
            &mut dev.ibdev_path,
            &format!("/sys/class/infiniband/{}", cfg.name),
        );
        vec![DeviceBox { dev, cfg, index: 0 }]
    })
}

fn device_box(dev: *mut ibv_device) -> Result<&'static DeviceBox, Errno> {
    devices()
        .iter()
        .find(|d| std::ptr::eq(&d.dev, dev))
        .ok_or(Errno::INVAL)
}

/// The objects of one context that async events and completion events name by number.
#[derive(Default)]
pub(crate) struct Registry {
    pub cqs: HashMap<u32, usize>,
    pub qps: HashMap<u32, usize>,
    pub srqs: HashMap<u32, usize>,
}

/// An open device: `verbs_context` (whose last field is the `ibv_context` handed out)
/// followed by the softhca context.
#[repr(C)]
pub(crate) struct CtxBox {
    pub vctx: verbs_context,
    pub ctx: Arc<Context>,
    pub registry: Mutex<Registry>,
    _cmd_fd: CmdFd,
}

/// What `ibv_context::cmd_fd` holds: a real descriptor, so that a program that `dup()`s
/// it to share the context (then calls `ibv_import_device`, which softhca refuses with
/// `EOPNOTSUPP`, as rxe does) gets that answer rather than `EBADF`. There is no kernel
/// command channel behind it: `/dev/null`, closed with the context.
pub(crate) struct CmdFd(OwnedFd);

impl CmdFd {
    fn open() -> Result<CmdFd, Errno> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(Errno::from)?;
        Ok(CmdFd(f.into()))
    }
}

impl CtxBox {
    /// The box of an `ibv_context` we created.
    ///
    /// # Safety
    /// `ctx` must be null or a context returned by our `ibv_open_device` and not closed.
    pub(crate) unsafe fn from_ctx<'a>(ctx: *const ibv_context) -> Result<&'a CtxBox, Errno> {
        if ctx.is_null() {
            return Err(Errno::INVAL);
        }
        let off = std::mem::offset_of!(verbs_context, context);
        // SAFETY: our contexts are the `context` field of `CtxBox::vctx`, the first field
        // of a repr(C) CtxBox; stepping back by its offset gives the box.
        Ok(unsafe { &*((ctx as *const u8).sub(off) as *const CtxBox) })
    }

    /// The `ibv_context` pointer handed to C.
    pub(crate) fn ctx_ptr(&self) -> *mut ibv_context {
        &self.vctx.context as *const ibv_context as *mut ibv_context
    }
}

pub(crate) unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard_ptr("ibv_get_device_list", || {
        let devs = devices();
        // calloc'd, NULL-terminated: ibv_free_device_list frees it with free().
        // SAFETY: plain allocation of n+1 pointers.
        let list = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<*mut ibv_device>()) }
            as *mut *mut ibv_device;
        if list.is_null() {
            return Err(Errno::NOMEM);
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: `list` has devs.len()+1 slots.
            unsafe { *list.add(i) = &d.dev as *const ibv_device as *mut ibv_device };
        }
        if !num.is_null() {
            // SAFETY: caller's out-parameter.
            unsafe { *num = devs.len() as c_int };
        }
        Ok(list)
    })
}

pub(crate) unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from ibv_get_device_list (calloc) or is NULL.
    guard_val("ibv_free_device_list", (), || unsafe {
        libc::free(list.cast())
    })
}

pub(crate) unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    guard_val("ibv_get_device_name", null(), || match device_box(dev) {
        Ok(d) => d.dev.name.as_ptr(),
        Err(_) => null(),
    })
}

pub(crate) unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    guard_val("ibv_get_device_index", -1, || {
        device_box(dev).map(|d| d.index).unwrap_or(-1)
    })
}

/// The node GUID softhca derives from a GID (see `softhca::Context`'s device attributes):
/// an EUI-64 with the locally administered bit from the last bytes of GID 0.
fn guid_from_gid(g: &[u8; 16]) -> u64 {
    u64::from_be_bytes([0x02, 0x53, 0x48, g[12], 0xfe, g[13], g[14], g[15]])
}

pub(crate) unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    guard_val("ibv_get_device_guid", 0, || {
        if device_box(dev).is_err() {
            return 0;
        }
        // The addresses a device would serve right now (softhca::devices binds and
        // releases them), as the GUID depends on GID 0.
        match softhca::devices() {
            Ok(v) => v
                .first()
                .and_then(|d| d.gids.first())
                .map(|g| guid_from_gid(&g.0).to_be())
                .unwrap_or(0),
            Err(e) => {
                debug(format_args!("ibv_get_device_guid: {e}"));
                0
            }
        }
    })
}

pub(crate) unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard_ptr("ibv_open_device", || {
        let d = device_box(dev)?;
        let ctx = Context::open(&d.cfg).map_err(|e| {
            // A program cannot say why; make the reason visible once.
            eprintln!("softhca-ibverbs: cannot open {}: {e}", d.cfg.name);
            Errno::from(e)
        })?;
        // The kernel's async fd starts blocking; O_NONBLOCK is the program's choice.
        ctx.set_async_fd_nonblocking(false)?;
        let async_fd = ctx.async_event_fd();
        let cmd_fd = CmdFd::open()?;
        let b = Box::new(CtxBox {
            vctx: new_verbs_context(dev, cmd_fd.0.as_raw_fd(), async_fd),
            ctx,
            registry: Mutex::new(Registry::default()),
            _cmd_fd: cmd_fd,
        });
        Ok(Box::leak(b).ctx_ptr())
    })
}

/// On-demand paging as rxe offers it (`rxe_init_device_param` with ODP): every region,
/// as softhca pins none; explicit regions only (no implicit ODP), RC and UD.
fn odp_caps() -> ibv_odp_caps {
    // IBV_ODP_SUPPORT_SEND, _RECV, _WRITE, _READ, _ATOMIC, _SRQ_RECV.
    let (send, recv, write, read, atomic, srq_recv) = (1, 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 5);
    ibv_odp_caps {
        // IBV_ODP_SUPPORT.
        general_caps: 1,
        rc_odp_caps: send | recv | write | read | atomic | srq_recv,
        uc_odp_caps: 0,
        ud_odp_caps: send | recv | srq_recv,
    }
}

fn new_verbs_context(dev: *mut ibv_device, cmd_fd: c_int, async_fd: c_int) -> verbs_context {
    let np = null::<c_void>();
    verbs_context {
        query_port: Some(query_port_ex),
        advise_mr: crate::objects::advise_mr as AnyFn,
        alloc_null_mr: np,
        read_counters: np,
        attach_counters_point_flow: np,
        create_counters: np,
        destroy_counters: np,
        reg_dm_mr: np,
        alloc_dm: np,
        free_dm: np,
        modify_flow_action_esp: np,
        destroy_flow_action: np,
        create_flow_action_esp: np,
        modify_qp_rate_limit: np,
        alloc_parent_domain: np,
        dealloc_td: np,
        alloc_td: np,
        modify_cq: Some(crate::cq::modify_cq),
        post_srq_ops: np,
        destroy_rwq_ind_table: np,
        create_rwq_ind_table: np,
        destroy_wq: np,
        modify_wq: np,
        create_wq: np,
        query_rt_values: np,
        create_cq_ex: Some(crate::cq::create_cq_ex),
        priv_: null_mut(),
        query_device_ex: Some(query_device_ex),
        ibv_destroy_flow: np,
        abi_placeholder2: np,
        ibv_create_flow: np,
        abi_placeholder1: np,
        open_qp: np,
        create_qp_ex: Some(crate::qp::create_qp_ex),
        get_srq_num: Some(crate::qp::get_srq_num),
        create_srq_ex: Some(crate::qp::create_srq_ex),
        open_xrcd: np,
        close_xrcd: np,
        _abi_placeholder3: 0,
        sz: std::mem::size_of::<verbs_context>(),
        context: ibv_context {
            device: dev,
            ops: ibv_context_ops {
                _compat_query_device: np,
                _compat_query_port: np,
                _compat_alloc_pd: np,
                _compat_dealloc_pd: np,
                _compat_reg_mr: np,
                _compat_rereg_mr: np,
                _compat_dereg_mr: np,
                alloc_mw: crate::mw::alloc_mw as AnyFn,
                bind_mw: crate::mw::bind_mw as AnyFn,
                dealloc_mw: crate::mw::dealloc_mw as AnyFn,
                _compat_create_cq: np,
                poll_cq: Some(crate::cq::poll_cq),
                req_notify_cq: Some(crate::cq::req_notify_cq),
                _compat_cq_event: np,
                _compat_resize_cq: np,
                _compat_destroy_cq: np,
                _compat_create_srq: np,
                _compat_modify_srq: np,
                _compat_query_srq: np,
                _compat_destroy_srq: np,
                post_srq_recv: Some(crate::qp::post_srq_recv),
                _compat_create_qp: np,
                _compat_query_qp: np,
                _compat_modify_qp: np,
                _compat_destroy_qp: np,
                post_send: Some(crate::qp::post_send),
                post_recv: Some(crate::qp::post_recv),
                _compat_create_ah: np,
                _compat_destroy_ah: np,
                _compat_attach_mcast: np,
                _compat_detach_mcast: np,
                _compat_async_event: np,
            },
            cmd_fd,
            async_fd,
            num_comp_vectors: 1,
            mutex: pthread_mutex_t::default(),
            abi_compat: VERBS_ABI_IS_EXTENDED,
        },
    }
}

pub(crate) unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    guard_int("ibv_close_device", || {
        // SAFETY: C passes a context from ibv_open_device (contract of the verb).
        let b = unsafe { CtxBox::from_ctx(ctx)? };
        // SAFETY: the box was leaked by ibv_open_device and is freed exactly once here.
        drop(unsafe { Box::from_raw(b as *const CtxBox as *mut CtxBox) });
        Ok(0)
    })
}

fn device_attr(ctx: &Context) -> ibv_device_attr {
    let a = ctx.query_device();
    let mut fw = [0 as c_char; 64];
    fill_cstr(&mut fw, &a.fw_ver);
    let i = |v: u32| v.min(i32::MAX as u32) as c_int;
    ibv_device_attr {
        fw_ver: fw,
        node_guid: a.node_guid.to_be(),
        sys_image_guid: a.sys_image_guid.to_be(),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_qp: i(a.max_qp),
        max_qp_wr: i(a.max_qp_wr),
        device_cap_flags: a.device_cap_flags,
        max_sge: i(a.max_sge),
        max_sge_rd: i(a.max_sge_rd),
        max_cq: i(a.max_cq),
        max_cqe: i(a.max_cqe),
        max_mr: i(a.max_mr),
        max_pd: i(a.max_pd),
        max_qp_rd_atom: i(a.max_qp_rd_atom),
        max_ee_rd_atom: i(a.max_ee_rd_atom),
        max_res_rd_atom: i(a.max_res_rd_atom),
        max_qp_init_rd_atom: i(a.max_qp_init_rd_atom),
        max_ee_init_rd_atom: i(a.max_ee_init_rd_atom),
        atomic_cap: a.atomic_cap as c_int,
        max_ee: i(a.max_ee),
        max_rdd: i(a.max_rdd),
        max_mw: i(a.max_mw),
        max_raw_ipv6_qp: i(a.max_raw_ipv6_qp),
        max_raw_ethy_qp: i(a.max_raw_ethy_qp),
        max_mcast_grp: i(a.max_mcast_grp),
        max_mcast_qp_attach: i(a.max_mcast_qp_attach),
        max_total_mcast_qp_attach: i(a.max_total_mcast_qp_attach),
        max_ah: i(a.max_ah),
        max_fmr: i(a.max_fmr),
        max_map_per_fmr: i(a.max_map_per_fmr),
        max_srq: i(a.max_srq),
        max_srq_wr: i(a.max_srq_wr),
        max_srq_sge: i(a.max_srq_sge),
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: a.local_ca_ack_delay,
        phys_port_cnt: a.phys_port_cnt,
    }
}

pub(crate) unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard_int("ibv_query_device", || {
        // SAFETY: a context of ours (verb contract).
        let b = unsafe { CtxBox::from_ctx(ctx)? };
        // SAFETY: caller's out-parameter.
        let out = unsafe { nonnull_mut(attr)? };
        *out = device_attr(&b.ctx);
        Ok(0)
    })
}

/// `verbs_context::query_device_ex`.
pub(crate) unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard_int("ibv_query_device_ex", || {
        // SAFETY: a context of ours (verb contract).
        let b = unsafe { CtxBox::from_ctx(ctx)? };
        // SAFETY: optional input struct.
        if let Some(i) = unsafe { input.as_ref() } {
            if i.comp_mask != 0 {
                return Err(Errno::INVAL);
            }
        }
        if attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
            return Err(Errno::INVAL);
        }
        let ex = ibv_device_attr_ex {
            orig_attr: device_attr(&b.ctx),
            comp_mask: 0,
            odp_caps: odp_caps(),
            // Completion timestamps are CLOCK_MONOTONIC nanoseconds taken when the
            // completion is polled off the ring (the datapath does not stamp them): a
            // 1 GHz "core clock", in kHz.
            completion_timestamp_mask: u64::MAX,
            hca_core_clock: 1_000_000,
            device_cap_flags_ex: u64::from(device_attr(&b.ctx).device_cap_flags),
            tso_caps: ibv_tso_caps::default(),
            rss_caps: ibv_rss_caps::default(),
            max_wq_type_rq: 0,
            packet_pacing_caps: ibv_packet_pacing_caps::default(),
            raw_packet_caps: 0,
            tm_caps: ibv_tm_caps::default(),
            cq_mod_caps: ibv_cq_moderation_caps::default(),
            max_dm_size: 0,
            pci_atomic_caps: ibv_pci_atomic_caps::default(),
            xrc_odp_caps: 0,
            phys_port_cnt_ex: 1,
        };
        // SAFETY: the caller's struct is attr_size bytes.
        unsafe { copy_sized(&ex, attr.cast(), attr_size) };
        Ok(0)
    })
}

fn port_attr(ctx: &Context, port: u8) -> Result<ibv_port_attr, Errno> {
    let p = ctx.query_port(port)?;
    Ok(ibv_port_attr {
        state: p.state as u32,
        max_mtu: p.max_mtu as u32,
        active_mtu: p.active_mtu as u32,
        gid_tbl_len: p.gid_tbl_len,
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: p.bad_pkey_cntr,
        qkey_viol_cntr: p.qkey_viol_cntr,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: p.sm_sl,
        subnet_timeout: p.subnet_timeout,
        init_type_reply: p.init_type_reply,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: p.link_layer as u8,
        flags: 0,
        port_cap_flags2: 0,
    })
}

/// `verbs_context::query_port`: what the inline `ibv_query_port` calls.
pub(crate) unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    guard_int("ibv_query_port", || {
        // SAFETY: a context of ours (verb contract).
        let b = unsafe { CtxBox::from_ctx(ctx)? };
        if attr.is_null() {
            return Err(Errno::INVAL);
        }
        let a = port_attr(&b.ctx, port)?;
        // SAFETY: the caller's struct is `len` bytes.
        unsafe { copy_sized(&a, attr.cast(), len) };
        Ok(0)
    })
}

/// The exported `ibv_query_port`, called with the pre-`flags` `_compat_ibv_port_attr`
/// by programs built before the extended verb existed.
pub(crate) unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded; the compat struct ends where `flags` begins.
    unsafe { query_port_ex(ctx, port, attr, std::mem::offset_of!(ibv_port_attr, flags)) }
}

fn gid_of(ctx: &Context, port: u32, index: u32) -> Result<ibv_gid, Errno> {
    let port = u8::try_from(port).map_err(|_| Errno::INVAL)?;
    let g = ctx.query_gid(port, index)?;
    Ok(ibv_gid { raw: g.0 })
}

pub(crate) unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard_neg("ibv_query_gid", || {
        // SAFETY: a context of ours (verb contract).
        let b = unsafe { CtxBox::from_ctx(ctx)? };
        // SAFETY: caller's out-parameter.
        let out = unsafe { nonnull_mut(gid)? };
        let index = u32::try_from(index).map_err(|_| Errno::INVAL)?;
        *out = gid_of(&b.ctx, u32::from(port), index)?;
        Ok(0)
    })
}

fn gid_entry(ctx: &Context, port: u32, index: u32) -> Result<ibv_gid_entry, Errno> {
    let gid = gid_of(ctx, port, index)?;
    Ok(ibv_gid_entry {
        gid,
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ctx.gid_ifindex(index),
    })
}

pub(crate) unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard_int("ibv_query_gid_ex", || {
        // SAFETY: a context of ours (verb contract).
        let b = unsafe { CtxBox::from_ctx(ctx)? };
        if entry.is_null() || flags != 0 {
            return Err(Errno::INVAL);
        }
        let e = gid_entry(&b.ctx, port, index).map_err(|_| Errno(libc::ENODATA))?;
        // SAFETY: the caller's entry is entry_size bytes.
        unsafe { copy_sized(&e, entry.cast(), entry_size) };
        Ok(0)
    })
}

pub(crate) unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard_val("ibv_query_gid_table", -(libc::EIO as isize), || {
        // SAFETY: a context of ours (verb contract).
        let Ok(b) = (unsafe { CtxBox::from_ctx(ctx) }) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || (entries.is_null() && max > 0) || entry_size == 0 {
            return -(libc::EINVAL as isize);
        }
        let n = b.ctx.gids().len();
        if n > max {
            return -(libc::EINVAL as isize);
        }
        for i in 0..n {
            let Ok(e) = gid_entry(&b.ctx, 1, i as u32) else {
                return -(libc::EINVAL as isize);
            };
            // SAFETY: the caller's array holds max >= n entries of entry_size bytes.
            unsafe { copy_sized(&e, (entries as *mut u8).add(i * entry_size), entry_size) };
        }
        n as isize
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34): the sysfs GID type; every softhca GID is
/// RoCE v2.
pub(crate) unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut u32,
) -> c_int {
    guard_neg("ibv_query_gid_type", || {
        // SAFETY: a context of ours (verb contract).
        let b = unsafe { CtxBox::from_ctx(ctx)? };
        // SAFETY: caller's out-parameter.
        let out = unsafe { nonnull_mut(ty)? };
        gid_of(&b.ctx, u32::from(port), index)?;
        *out = IBV_GID_TYPE_SYSFS_ROCE_V2;
        Ok(0)
    })
}

pub(crate) unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard_neg("ibv_query_pkey", || {
        // SAFETY: a context of ours (verb contract).
        let b = unsafe { CtxBox::from_ctx(ctx)? };
        // SAFETY: caller's out-parameter.
        let out = unsafe { nonnull_mut(pkey)? };
        b.ctx.query_port(port)?;
        if index != 0 {
            return Err(Errno::INVAL);
        }
        // The default P_Key, full membership (RoCE: rxe's only entry), network order.
        *out = 0xffffu16.to_be();
        Ok(0)
    })
}

pub(crate) unsafe extern "C" fn ibv_get_pkey_index(
    ctx: *mut ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    guard_neg("ibv_get_pkey_index", || {
        // SAFETY: a context of ours (verb contract).
        let b = unsafe { CtxBox::from_ctx(ctx)? };
        b.ctx.query_port(port)?;
        if u16::from_be(pkey) & 0x7fff == 0x7fff {
            Ok(0)
        } else {
            Err(Errno(libc::ENOENT))
        }
    })
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: reads `dir/file` like rdma-core (trailing
/// newline removed). softhca has no sysfs entries, so this is -1 for our paths.
pub(crate) unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard_val("ibv_read_sysfs_file", -1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            return -1;
        }
        // SAFETY: NUL-terminated strings from the caller.
        let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
        let Ok(data) = std::fs::read(path) else {
            return -1;
        };
        let mut n = data.len().min(size - 1);
        // SAFETY: buf holds `size` bytes; we write n < size plus a NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), n);
            if n > 0 && *buf.add(n - 1) == b'\n' as c_char {
                n -= 1;
            }
            *buf.add(n) = 0;
        }
        n as c_int
    })
}

/// `ibv_resolve_eth_l2_from_gid`: RoCEv2 over UDP sockets needs no MAC; report a
/// locally administered MAC derived from the GID and no VLAN.
pub(crate) unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    ctx: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    guard_int("ibv_resolve_eth_l2_from_gid", || {
        // SAFETY: a context of ours (verb contract).
        unsafe { CtxBox::from_ctx(ctx)? };
        // SAFETY: caller's attribute.
        let a = unsafe { nonnull(attr)? };
        if eth_mac.is_null() {
            return Err(Errno::INVAL);
        }
        let g = a.grh.dgid.raw;
        let mac = [0x02, g[11], g[12], g[13], g[14], g[15]];
        // SAFETY: the caller's buffer is ETHERNET_LL_SIZE (6) bytes.
        unsafe { std::ptr::copy_nonoverlapping(mac.as_ptr(), eth_mac, 6) };
        if !vid.is_null() {
            // SAFETY: optional out-parameter.
            unsafe { *vid = 0xffff };
        }
        Ok(0)
    })
}
