//! Memory regions and windows: registration in a protection domain ([`Pd::reg_mr`]),
//! [`Mr`], [`RawMr`], [`Mw`].
//!
//! # The memory contract
//!
//! Registration is a raw (address, length) grant, as with DMA: the engine reaches
//! registered memory only by looking its key up in the MR table, always under the engine
//! lock. [`Mr`] owns its memory (page-aligned, zeroed) and, when dropped, first
//! deregisters under that same lock and only then frees it. So the engine can never
//! touch freed memory: a work request posted earlier that names a dropped MR (its lkey or
//! the peer's rkey) fails its key lookup and completes with a protection error
//! (`LocProtErr` locally, a remote access NAK for the peer) instead.
//!
//! While registered, the memory is shared with the device exactly like DMA memory with
//! a NIC: the datapath thread may write into it at any moment (receives, RDMA WRITEs,
//! READ responses, atomics) and read it (sends, WRITE sources, READ requests from the
//! peer). [`Mr::read`] / [`Mr::write`] copy bytes in and out and are the safe way to look
//! at it; like with hardware, reading a buffer the peer is writing at the same time
//! returns a mix of old and new bytes. Wait for the completion that says the data is
//! there.

use std::alloc::Layout;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::Error;
use crate::pd::Pd;
use crate::{AccessFlags, MrKeys, MwBind, MwType, Sge};

/// Page size MRs are aligned to.
pub const PAGE_SIZE: usize = 4096;

/// What `ibv_advise_mr` asks for an on-demand region's range (`ibv_advise_mr_advice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`: fault the pages in for reading.
    Prefetch,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`: fault them in writable.
    PrefetchWrite,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: map only pages already present.
    PrefetchNoFault,
}

/// Faults in `at..at + len` with `madvise(how)` (one of the MADV_POPULATE advices).
fn populate(at: *mut u8, len: usize, how: libc::c_int) -> Result<(), Error> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(PAGE_SIZE)
        .max(1);
    let start = at as usize / page * page;
    let end = (at as usize).saturating_add(len);
    // SAFETY: madvise touches no memory of ours: MADV_POPULATE_* faults the process's own
    // pages in, and a range that is not mapped fails with ENOMEM instead of faulting.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, end - start, how) };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        // Before Linux 5.14 (no MADV_POPULATE_*), or a mapping it cannot populate (I/O
        // memory): advice only; the pages fault in at first touch.
        Some(libc::EINVAL) => Ok(()),
        // Not mapped: what rxe's page fault reports.
        Some(libc::ENOMEM) | Some(libc::EFAULT) => Err(Error::Os {
            what: "advise_mr",
            source: std::io::Error::from_raw_os_error(libc::EFAULT),
        }),
        _ => Err(Error::Os {
            what: "advise_mr",
            source: e,
        }),
    }
}

impl Pd {
    /// Allocates `len` bytes of page-aligned, zeroed memory and registers it with
    /// `access` (`ibv_reg_mr` on fresh memory). The [`Mr`] owns the memory; see the
    /// module documentation for what dropping it means for posted work.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr, Error> {
        let size = len
            .max(1)
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or(Error::InvalidArgument("MR length"))?;
        let layout = Layout::from_size_align(size, PAGE_SIZE)
            .map_err(|_| Error::InvalidArgument("MR length"))?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Transport(
                softhca_transport::TransportError::NoMemory,
            ));
        }
        // SAFETY: `ptr..ptr+len` is our own fresh allocation, freed only in Mr::drop after
        // deregistration (or right below if registration fails).
        let keys = match unsafe { self.register(ptr, len, ptr as u64, access) } {
            Ok(k) => k,
            Err(e) => {
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { std::alloc::dealloc(ptr, layout) };
                return Err(e);
            }
        };
        Ok(Mr {
            pd: self.clone(),
            ptr,
            len,
            layout,
            keys,
            access,
        })
    }

    /// Registers memory the caller owns (`ibv_reg_mr` on existing memory), with `iova`
    /// as the address remote peers and SGEs use for its first byte.
    ///
    /// # Safety
    /// `addr .. addr + len` must stay valid for reads and writes (by the datapath thread,
    /// at any time) until the returned [`RawMr`] is dropped, and must not be accessed in
    /// ways that assume nobody else writes it meanwhile (treat it like DMA memory).
    pub unsafe fn reg_mr_raw(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<RawMr, Error> {
        if addr.is_null() && len > 0 {
            return Err(Error::InvalidArgument("MR address is null"));
        }
        // SAFETY: forwarded from this function's contract.
        let keys = unsafe { self.register(addr, len, iova, access)? };
        Ok(RawMr {
            pd: self.clone(),
            addr,
            len,
            iova,
            keys,
            access,
            registered: true,
        })
    }

    /// # Safety
    /// `addr..addr+len` stays valid until deregistered.
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MrKeys, Error> {
        let pd = self.inner.id;
        self.inner
            .ctx
            .with_core_untimed(|core| {
                // SAFETY: forwarded from this function's contract.
                unsafe {
                    core.engine
                        .memory_mut()
                        .register(pd, addr, len, iova, access)
                }
            })?
            .map_err(|e| Error::Transport(e.into()))
    }

    /// `ibv_advise_mr`: prefetches each SGE's range of an on-demand region of this PD
    /// (registered with [`AccessFlags::ON_DEMAND`]), as rxe does for its ODP regions: the
    /// pages are faulted in now, readable ([`Advice::Prefetch`]) or writable
    /// ([`Advice::PrefetchWrite`]), so the datapath's first touch of them takes no page
    /// fault. [`Advice::PrefetchNoFault`] only maps what is present: the process's own
    /// page tables already do. A range that is not mapped fails with EFAULT.
    pub fn advise_mr(&self, advice: Advice, sges: &[Sge]) -> Result<(), Error> {
        if sges.is_empty() {
            return Err(Error::InvalidArgument("advise_mr without an SGE"));
        }
        let pd = self.inner.id;
        let spans = self
            .inner
            .ctx
            .with_core_untimed(|core| {
                let mem = core.engine.memory();
                sges.iter()
                    .map(|s| mem.prefetch_span(pd, s))
                    .collect::<Result<Vec<_>, _>>()
            })?
            .map_err(|e| Error::Transport(e.into()))?;
        let how = match advice {
            Advice::Prefetch => libc::MADV_POPULATE_READ,
            Advice::PrefetchWrite => libc::MADV_POPULATE_WRITE,
            Advice::PrefetchNoFault => return Ok(()),
        };
        spans
            .into_iter()
            .try_for_each(|(at, len)| populate(at, len, how))
    }

    /// Allocates a memory window (`ibv_alloc_mw`): a remote key that grants access to
    /// part of a region once bound, with [`Mw::bind`] (type 1) or a
    /// [`WrOpcode::BindMw`](crate::WrOpcode::BindMw) work request (type 2).
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw, Error> {
        let pd = self.inner.id;
        let rkey = self
            .inner
            .ctx
            .with_core_untimed(|core| core.engine.memory_mut().alloc_mw(pd, ty))?
            .map_err(|e| Error::Transport(e.into()))?;
        Ok(Mw {
            pd: self.clone(),
            ty,
            rkey: AtomicU32::new(rkey),
        })
    }
}

fn deregister(pd: &Pd, lkey: u32) {
    if let Err(e) = try_deregister(pd, lkey) {
        tracing::debug!(lkey, "deregister: {e}");
    }
}

fn try_deregister(pd: &Pd, lkey: u32) -> Result<(), Error> {
    // Under the engine lock, and with no transmit in flight (packets leave with their
    // payload still in registered memory, see `datapath`): after this returns neither
    // the engine nor a `sendmmsg` can reach the memory.
    pd.inner
        .ctx
        .with_core_no_transmit(|core| core.engine.memory_mut().deregister(lkey))
        .map_err(|e| Error::Transport(e.into()))
}

/// A memory region that owns its memory (`ibv_mr` over memory from [`Pd::reg_mr`]).
/// Dropping it deregisters, then frees; see the module documentation.
#[derive(Debug)]
pub struct Mr {
    pd: Pd,
    ptr: *mut u8,
    len: usize,
    layout: Layout,
    keys: MrKeys,
    access: AccessFlags,
}

// SAFETY: the pointer is to heap memory this Mr owns; all access goes through copies
// (`read`/`write`/`fill`) or the engine under its lock, never through references that
// assume exclusivity, so sending or sharing the handle across threads is sound.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// Local key (for [`Sge::lkey`]).
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }

    /// Remote key (to give to the peer).
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }

    /// The I/O virtual address of the first byte (= its address in this process).
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length MR.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Access rights.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The PD it is registered in.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Raw pointer to the memory (for zero-copy use; the DMA rules of the module
    /// documentation apply).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), Error> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument("offset/length beyond the MR")),
        }
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        self.check(offset, out.len())?;
        // SAFETY: in bounds (checked); the memory is ours and alive; a concurrent device
        // write yields mixed bytes, never invalid ones (u8 has no invalid values).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` into the MR at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        self.check(offset, data.len())?;
        // SAFETY: in bounds (checked); the memory is ours and alive.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
        Ok(())
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole MR is ours and alive.
        unsafe { std::ptr::write_bytes(self.ptr, byte, self.len) };
    }

    /// Copies the whole MR out.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        // Cannot fail: the whole range is in bounds.
        let _ = self.read(0, &mut v);
        v
    }

    /// A scatter/gather element for `len` bytes at `offset` (not checked here: the
    /// engine checks it against the MR when the work request runs).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr().wrapping_add(offset as u64),
            length: len,
            lkey: self.keys.lkey,
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        deregister(&self.pd, self.keys.lkey);
        // SAFETY: allocated in `Pd::reg_mr` with `self.layout`; deregistered above under
        // the engine lock, so nothing can reach it any more.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// A registration of caller-owned memory ([`Pd::reg_mr_raw`]). Dropping it deregisters;
/// the memory itself stays the caller's.
#[derive(Debug)]
pub struct RawMr {
    pd: Pd,
    addr: *mut u8,
    len: usize,
    iova: u64,
    keys: MrKeys,
    access: AccessFlags,
    /// False once [`RawMr::deregister`] succeeded.
    registered: bool,
}

// SAFETY: only keys and the address are held; the memory is the caller's, under the
// `reg_mr_raw` contract.
unsafe impl Send for RawMr {}
// SAFETY: as above.
unsafe impl Sync for RawMr {}

impl RawMr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }
    /// I/O virtual address of the first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// Process address of the first byte.
    pub fn addr(&self) -> *mut u8 {
        self.addr
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length MR.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Access rights.
    pub fn access(&self) -> AccessFlags {
        self.access
    }
    /// A scatter/gather element at `offset` from the IOVA.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.iova.wrapping_add(offset as u64),
            length: len,
            lkey: self.keys.lkey,
        }
    }
}

impl RawMr {
    /// Deregisters now (`ibv_dereg_mr`), reporting a refusal: a region that memory
    /// windows are bound to stays registered (rxe: `EINVAL`).
    pub fn deregister(&mut self) -> Result<(), Error> {
        if self.registered {
            try_deregister(&self.pd, self.keys.lkey)?;
            self.registered = false;
        }
        Ok(())
    }
}

impl Drop for RawMr {
    fn drop(&mut self) {
        if self.registered {
            deregister(&self.pd, self.keys.lkey);
        }
    }
}

/// What a bind grants (`struct ibv_mw_bind_info`): `len` bytes from iova `addr` of the
/// region `mr_lkey`, with `access` (remote rights).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBindInfo {
    /// The region's lkey; `None` (with `addr` and `len` 0) unbinds.
    pub mr_lkey: Option<u32>,
    /// First iova.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Rights granted.
    pub access: AccessFlags,
}

/// A memory window (`ibv_mw`). Dropping it deallocates it, bound or not.
#[derive(Debug)]
pub struct Mw {
    pd: Pd,
    ty: MwType,
    rkey: AtomicU32,
}

impl Mw {
    /// The window's current rkey (it changes with every bind).
    pub fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }

    /// Type 1 or type 2.
    pub fn mw_type(&self) -> MwType {
        self.ty
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Records the rkey a bind gave the window (`ibv_bind_mw` sets `mw->rkey` as soon as
    /// the bind is posted; with type 2 the application does).
    pub fn set_rkey(&self, rkey: u32) {
        self.rkey.store(rkey, Ordering::Release);
    }

    /// Binds a type 1 window through `qp` (`ibv_bind_mw`): posts a
    /// [`WrOpcode::BindMw`](crate::WrOpcode::BindMw) that completes on `qp`'s send CQ in
    /// order (with `IBV_WC_MW_BIND_ERR` if refused) and returns the new rkey, which the
    /// window takes at once. `mr == None` with `len == 0` unbinds.
    pub fn bind(
        &self,
        qp: &crate::Qp,
        wr_id: u64,
        flags: crate::SendFlags,
        info: &MwBindInfo,
    ) -> Result<u32, Error> {
        if self.ty != MwType::Type1 {
            return Err(Error::InvalidArgument("ibv_bind_mw takes type 1 windows"));
        }
        if info.mr_lkey.is_none() && (info.addr != 0 || info.len != 0) {
            return Err(Error::InvalidArgument("a bind with no MR must be empty"));
        }
        let old = self.rkey();
        let new = (old & !0xff) | u32::from((old as u8).wrapping_add(1));
        qp.post_send(crate::SendWr {
            wr_id,
            opcode: crate::WrOpcode::BindMw,
            flags,
            bind: Some(MwBind {
                mw_rkey: old,
                key_byte: new as u8,
                mr_lkey: info.mr_lkey.unwrap_or(0),
                addr: info.addr,
                len: info.len,
                access: info.access,
            }),
            ..crate::SendWr::default()
        })?;
        self.set_rkey(new);
        Ok(new)
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let rkey = self.rkey();
        let r = self
            .pd
            .inner
            .ctx
            .with_core_always(|core| core.engine.memory_mut().dealloc_mw(rkey));
        if let Err(e) = r {
            tracing::debug!(rkey, "dealloc_mw: {e}");
        }
    }
}
