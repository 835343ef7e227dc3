//! Memory windows (IBTA 10.6.7; rxe `rxe_mw.c`): a remote key granting rights to a
//! part of a memory region, bound and invalidated by work requests.
//!
//! A window takes a slot of the same key space as the regions, so its rkey is as hard to
//! guess as a region's (`tag << 8 | key byte`). Type 1 windows are bound with
//! `ibv_bind_mw` and live in their PD; type 2 windows are bound through a QP with
//! `IBV_WR_BIND_MW` and answer only that QP, until invalidated (LOCAL_INV or a SEND with
//! invalidate). Remote accesses through a window check the window's own rights and
//! bounds, then reach the region's memory.

use crate::access::AccessFlags;
use crate::error::MemError;
use crate::key::MAX_SLOTS;
use crate::table::{Grantee, MemoryTable, PdId, Slot};

/// `enum ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// Bound with `ibv_bind_mw`, in its protection domain.
    Type1,
    /// Bound with `IBV_WR_BIND_MW` to one QP.
    Type2,
}

/// rxe `enum rxe_mw_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MwState {
    /// Type 2 before a bind and after an invalidation.
    Free,
    /// Type 1 always (bound or not); type 2 once bound.
    Valid,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pd: PdId,
    ty: MwType,
    state: MwState,
    rkey: u32,
    /// The region it grants access to (0: none) and the grant.
    mr_lkey: u32,
    addr: u64,
    len: u64,
    access: AccessFlags,
    /// Type 2: the QP it was bound through.
    qpn: u32,
}

/// One bind, as `struct ibv_mw_bind` / `IBV_WR_BIND_MW` carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window's current rkey.
    pub mw_rkey: u32,
    /// The consumer-owned low byte of the rkey after the bind (`ibv_inc_rkey`).
    pub key_byte: u8,
    /// The region (its lkey; 0 with `len == 0` unbinds a type 1 window).
    pub mr_lkey: u32,
    /// First iova of the window, in the region's iova space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Rights the window grants (REMOTE_* only).
    pub access: AccessFlags,
}

/// Rights a window may carry (rxe `RXE_ACCESS_SUPPORTED_MW` without ZERO_BASED, which
/// softhca's windows do not take).
const MW_RIGHTS: AccessFlags = AccessFlags::REMOTE;

impl MemoryTable {
    /// Allocates a memory window in `pd` (`ibv_alloc_mw`); returns its rkey. Type 1
    /// starts valid and unbound, type 2 free (rxe `rxe_alloc_mw`).
    pub fn alloc_mw(&mut self, pd: PdId, ty: MwType) -> Result<u32, MemError> {
        if !self.pds.contains_key(&pd.0) {
            return Err(MemError::InvalidPd { pd: pd.0 });
        }
        let slot = match self.free.pop_front() {
            Some(s) => s,
            None => {
                let s = u32::try_from(self.slots.len()).map_err(|_| MemError::NoResources)?;
                if s >= MAX_SLOTS {
                    return Err(MemError::NoResources);
                }
                self.slots.push(Slot {
                    region: None,
                    window: None,
                    last_byte: None,
                });
                s
            }
        };
        let last = self.slots.get(slot as usize).and_then(|s| s.last_byte);
        let rkey = self.keys.new_key(slot, last);
        let entry = self
            .slots
            .get_mut(slot as usize)
            .ok_or(MemError::NoResources)?;
        entry.window = Some(Window {
            pd,
            ty,
            state: match ty {
                MwType::Type1 => MwState::Valid,
                MwType::Type2 => MwState::Free,
            },
            rkey,
            mr_lkey: 0,
            addr: 0,
            len: 0,
            access: AccessFlags::empty(),
            qpn: 0,
        });
        entry.last_byte = Some(rkey as u8);
        if let Some(p) = self.pds.get_mut(&pd.0) {
            p.mrs += 1;
        }
        Ok(rkey)
    }

    /// Frees a window (`ibv_dealloc_mw`), bound or not: its rkey never resolves again.
    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<(), MemError> {
        let idx = self.keys.slot_of(rkey);
        let w = self.window(rkey)?;
        self.unbind_region(&w);
        if let Some(s) = self.slots.get_mut(idx as usize) {
            s.window = None;
        }
        self.free.push_back(idx);
        if let Some(p) = self.pds.get_mut(&w.pd.0) {
            p.mrs = p.mrs.saturating_sub(1);
        }
        Ok(())
    }

    /// Binds a window for QP `qpn` of protection domain `qp_pd` (`IBV_WR_BIND_MW`, and
    /// `ibv_bind_mw` for type 1); returns the window's new rkey. Every check of rxe
    /// `rxe_check_bind_mw`, in its order; a refusal is `IBV_WC_MW_BIND_ERR`.
    pub fn bind_mw(&mut self, qp_pd: PdId, qpn: u32, b: MwBind) -> Result<u32, MemError> {
        let bad = MemError::InvalidArgument;
        let w = self.window(b.mw_rkey)?;
        if w.rkey != b.mw_rkey {
            return Err(MemError::InvalidKey { key: b.mw_rkey });
        }
        if b.access.intersects(!MW_RIGHTS) {
            return Err(bad("window access other than remote rights"));
        }
        match w.ty {
            MwType::Type1 if w.state != MwState::Valid => return Err(bad("window not valid")),
            MwType::Type2 if w.state != MwState::Free => {
                return Err(bad("type 2 window still bound: invalidate it first"))
            }
            MwType::Type2 if w.pd != qp_pd => return Err(MemError::WrongPd { key: b.mw_rkey }),
            MwType::Type2 if b.len == 0 => return Err(bad("zero-length type 2 bind")),
            _ => {}
        }
        if b.len > 0 {
            let mr = *self.lookup(b.mr_lkey, false)?;
            if !mr.access.contains(AccessFlags::MW_BIND) {
                return Err(MemError::AccessDenied {
                    key: b.mr_lkey,
                    need: AccessFlags::MW_BIND,
                });
            }
            // IBTA o10-36.2.1: remote write or atomic rights need a locally writable MR.
            if b.access
                .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                && !mr.access.contains(AccessFlags::LOCAL_WRITE)
            {
                return Err(MemError::AccessDenied {
                    key: b.mr_lkey,
                    need: AccessFlags::LOCAL_WRITE,
                });
            }
            mr.translate(b.mr_lkey, b.addr, b.len)?;
        }
        self.unbind_region(&w);
        let rkey = (w.rkey & !0xff) | u32::from(b.key_byte);
        let bound = Window {
            state: MwState::Valid,
            rkey,
            mr_lkey: if b.len > 0 { b.mr_lkey } else { 0 },
            addr: b.addr,
            len: b.len,
            access: b.access,
            qpn,
            ..w
        };
        if b.len > 0 {
            self.region_windows(b.mr_lkey, 1);
        }
        self.put_window(bound);
        Ok(rkey)
    }

    /// Invalidates the window or region named by `key` (LOCAL_INV, or the IETH of a SEND
    /// with invalidate), as rxe `rxe_invalidate_mw`/`rxe_invalidate_mr`: a bound type 2
    /// window becomes free; type 1 windows cannot be invalidated, and neither can
    /// regions registered by `ibv_reg_mr` (only fast-register regions can, which
    /// softhca does not have).
    pub fn invalidate(&mut self, key: u32) -> Result<(), MemError> {
        let bad = MemError::InvalidArgument;
        if self.lookup(key, true).is_ok() || self.lookup(key, false).is_ok() {
            return Err(bad("a registered memory region cannot be invalidated"));
        }
        let w = self.window(key)?;
        if w.rkey != key {
            return Err(MemError::InvalidKey { key });
        }
        match (w.ty, w.state) {
            (MwType::Type1, _) => Err(bad("a type 1 window cannot be invalidated")),
            (MwType::Type2, MwState::Free) => Err(bad("window not bound")),
            (MwType::Type2, MwState::Valid) => {
                self.unbind_region(&w);
                self.put_window(Window {
                    state: MwState::Free,
                    mr_lkey: 0,
                    addr: 0,
                    len: 0,
                    access: AccessFlags::empty(),
                    qpn: 0,
                    ..w
                });
                Ok(())
            }
        }
    }

    /// A remote access through a window (rxe `check_rkey` → `rxe_lookup_mw`): the
    /// window's PD, its QP for type 2, its rights and its own bounds (stricter than rxe,
    /// which checks the region's), then the region's memory.
    pub(crate) fn resolve_window(
        &self,
        who: Grantee,
        key: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<*mut u8, MemError> {
        let w = self.window(key)?;
        if w.rkey != key || w.state != MwState::Valid || w.len == 0 {
            return Err(MemError::InvalidKey { key });
        }
        if w.pd != who.pd {
            return Err(MemError::WrongPd { key });
        }
        if w.ty == MwType::Type2 && who.qpn != Some(w.qpn) {
            return Err(MemError::WrongPd { key });
        }
        if !w.access.contains(need) {
            return Err(MemError::AccessDenied { key, need });
        }
        let off = va
            .checked_sub(w.addr)
            .filter(|&o| o <= w.len && len <= w.len - o)
            .ok_or(MemError::OutOfBounds { key, va, len })?;
        let mr = self.lookup(w.mr_lkey, false)?;
        mr.translate(key, w.addr + off, len)
    }

    /// The window named by `key`'s slot (its rkey may differ in the low byte).
    fn window(&self, key: u32) -> Result<Window, MemError> {
        self.slots
            .get(self.keys.slot_of(key) as usize)
            .and_then(|s| s.window)
            .filter(|w| w.rkey >> 8 == key >> 8)
            .ok_or(MemError::InvalidKey { key })
    }

    fn put_window(&mut self, w: Window) {
        if let Some(s) = self.slots.get_mut(self.keys.slot_of(w.rkey) as usize) {
            s.window = Some(w);
            s.last_byte = Some(w.rkey as u8);
        }
    }

    /// Drops a window's hold on its region (rxe `num_mw--`).
    fn unbind_region(&mut self, w: &Window) {
        if w.len > 0 && w.mr_lkey != 0 {
            self.region_windows(w.mr_lkey, -1);
        }
    }

    fn region_windows(&mut self, lkey: u32, delta: i32) {
        let idx = self.keys.slot_of(lkey) as usize;
        if let Some(r) = self.slots.get_mut(idx).and_then(|s| s.region.as_mut()) {
            r.windows = r.windows.saturating_add_signed(delta);
        }
    }
}
