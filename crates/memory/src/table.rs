//! The per-device table of protection domains and memory regions, and every access to
//! registered memory (the only raw-pointer code in softhca).

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::access::AccessFlags;
use crate::error::MemError;
use crate::key::{KeySpace, MAX_SLOTS};
use crate::window::Window;

/// A protection domain handle (`ibv_pd`). Local to the device, never on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// The keys of a registered memory region (`ibv_mr.lkey` / `ibv_mr.rkey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MrKeys {
    /// Local key: names the region in the consumer's own SGEs.
    pub lkey: u32,
    /// Remote key: names the region in peers' RETH / AtomicETH. Equal to `lkey` when the
    /// region grants a remote right, 0 otherwise (rxe `rxe_mr_init`).
    pub rkey: u32,
}

/// Who accesses registered memory from the wire: the responder QP's protection domain
/// and number (a type 2 memory window answers only the QP it was bound on). A bare
/// [`PdId`] names no QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grantee {
    /// The QP's protection domain.
    pub pd: PdId,
    /// The QP number, if known.
    pub qpn: Option<u32>,
}

impl From<PdId> for Grantee {
    fn from(pd: PdId) -> Self {
        Grantee { pd, qpn: None }
    }
}

impl From<(PdId, u32)> for Grantee {
    fn from((pd, qpn): (PdId, u32)) -> Self {
        Grantee { pd, qpn: Some(qpn) }
    }
}

/// A scatter/gather element, as `struct ibv_sge`: `length` bytes at iova `addr` of the
/// region named by `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Start address, in the region's iova space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// What [`MemoryTable::query`] reports about a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    /// Its protection domain.
    pub pd: PdId,
    /// Host address of its first byte.
    pub addr: *mut u8,
    /// Length in bytes.
    pub len: usize,
    /// iova of its first byte (what SGEs and RETHs name).
    pub iova: u64,
    /// Rights granted (after registration-time normalisation).
    pub access: AccessFlags,
    /// Local key.
    pub lkey: u32,
    /// Remote key (0 without remote rights).
    pub rkey: u32,
}

/// A remote atomic operation (IBTA 9.4.5), executed on a naturally aligned u64 in host
/// byte order (rxe operates on the native u64; the wire carries operands big-endian and
/// the transport converts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Store `swap` if the current value equals `compare`.
    CompareSwap {
        /// Value to compare with.
        compare: u64,
        /// Value stored on a match.
        swap: u64,
    },
    /// Add `add`, wrapping modulo 2^64.
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

/// New translation for [`MemoryTable::rereg`] (`IBV_REREG_MR_CHANGE_TRANSLATION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// New host address.
    pub addr: *mut u8,
    /// New length.
    pub len: usize,
    /// New iova (ignored, 0, under ZERO_BASED).
    pub iova: u64,
}

/// The changes of an `ibv_rereg_mr`: each `Some` is applied, `None` keeps the old value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rereg {
    /// `IBV_REREG_MR_CHANGE_PD`.
    pub pd: Option<PdId>,
    /// `IBV_REREG_MR_CHANGE_ACCESS`.
    pub access: Option<AccessFlags>,
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`.
    pub translation: Option<Translation>,
}

/// A payload left in registered memory for a zero-copy send
/// ([`MemoryTable::gather_in_place`]): its host address and length, and the lkey it was
/// found under. Only this crate makes one; [`MemoryTable::external_payload`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct External {
    /// Host address of the first byte (an address, not a pointer, so that transmit lists
    /// stay `Send`; for the kernel's iovecs).
    pub addr: usize,
    /// Bytes.
    pub len: usize,
    lkey: u32,
}

#[derive(Clone, Copy)]
pub(crate) struct Region {
    pub(crate) pd: PdId,
    addr: *mut u8,
    /// Length in bytes; at most `isize::MAX`.
    pub(crate) len: u64,
    pub(crate) iova: u64,
    pub(crate) access: AccessFlags,
    pub(crate) lkey: u32,
    rkey: u32,
    /// Memory windows bound to the region (rxe `num_mw`): it cannot be deregistered
    /// while any is.
    pub(crate) windows: u32,
}

impl Region {
    /// Host address of `[va, va + len)` after the range checks of rxe `mr_check_range`,
    /// done without ever computing `iova + length` or `va + len` unchecked: the access
    /// must end within the 64-bit space, start at or after `iova`, and
    /// `(va - iova) + len <= length`.
    #[inline]
    pub(crate) fn translate(&self, key: u32, va: u64, len: u64) -> Result<*mut u8, MemError> {
        if len > 0 && va.checked_add(len - 1).is_none() {
            return Err(MemError::Overflow { va, len });
        }
        let off = va
            .checked_sub(self.iova)
            .ok_or(MemError::OutOfBounds { key, va, len })?;
        if off > self.len || len > self.len - off {
            return Err(MemError::OutOfBounds { key, va, len });
        }
        // `off <= self.len <= isize::MAX`, so the cast is lossless and the result stays
        // inside (or one past) the registered block; wrapping_add needs no unsafe.
        Ok(self.addr.wrapping_add(off as usize))
    }

    fn info(&self) -> MrInfo {
        MrInfo {
            pd: self.pd,
            addr: self.addr,
            len: self.len as usize,
            iova: self.iova,
            access: self.access,
            lkey: self.lkey,
            rkey: self.rkey,
        }
    }
}

pub(crate) struct Slot {
    pub(crate) region: Option<Region>,
    /// A memory window, when the slot holds one instead of a region.
    pub(crate) window: Option<Window>,
    /// Key byte of the last region in this slot, so that the next one differs.
    pub(crate) last_byte: Option<u8>,
}

#[derive(Default)]
pub(crate) struct PdEntry {
    /// Memory regions registered in the PD.
    pub(crate) mrs: u32,
    /// Other objects (QPs, SRQs, AHs) holding the PD, counted by [`MemoryTable::hold_pd`].
    users: u32,
}

/// The protection domains and memory regions of one device.
///
/// Lookups by key are O(1) (a slot index recovered from the key, see the `key` module)
/// and no access allocates. Control operations (`register`, `alloc_pd`, ...) take
/// `&mut self`; accesses take `&self`, so the datapath may serve many QPs under a shared
/// borrow or a read lock.
pub struct MemoryTable {
    pub(crate) keys: KeySpace,
    pub(crate) slots: Vec<Slot>,
    /// Free slots, reused oldest first so that a slot's keys age before reuse.
    pub(crate) free: VecDeque<u32>,
    mr_count: usize,
    pub(crate) pds: HashMap<u32, PdEntry>,
    next_pd: u32,
}

// SAFETY: the raw pointers in the table name memory that the registering caller granted
// to the device under `register`'s contract (valid until deregistration, shared with the
// device like DMA memory); the table holds no thread-affine state, so it may move to the
// datapath thread.
unsafe impl Send for MemoryTable {}
// SAFETY: `&self` methods only read the table and copy to/from registered memory, which
// the register contract already declares shared with the device (as with DMA, concurrent
// CPU and device accesses to the same bytes give unspecified contents, never touch
// memory outside the grant); atomics use real atomic instructions.
unsafe impl Sync for MemoryTable {}

impl fmt::Debug for MemoryTable {
    // Manual so that the key secret never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTable")
            .field("pds", &self.pds.len())
            .field("mrs", &self.mr_count)
            .finish_non_exhaustive()
    }
}

impl Default for MemoryTable {
    /// A table keyed from OS entropy (production); tests use [`MemoryTable::new`].
    fn default() -> Self {
        MemoryTable::new(rand::random())
    }
}

impl MemoryTable {
    /// An empty table whose key secret and key bytes derive from `seed`. Devices should
    /// pass a random seed (or use `Default`); tests pass a fixed one.
    pub fn new(seed: u64) -> Self {
        MemoryTable {
            keys: KeySpace::new(seed),
            slots: Vec::new(),
            free: VecDeque::new(),
            mr_count: 0,
            pds: HashMap::default(),
            next_pd: 1,
        }
    }

    /// Allocate a protection domain (`ibv_alloc_pd`). Handles start at 1 and are not
    /// reused while the table lives (wrapping after 2^32 allocations, skipping live ones).
    pub fn alloc_pd(&mut self) -> PdId {
        loop {
            let id = self.next_pd;
            self.next_pd = self.next_pd.wrapping_add(1).max(1);
            if let std::collections::hash_map::Entry::Vacant(e) = self.pds.entry(id) {
                e.insert(PdEntry::default());
                return PdId(id);
            }
        }
    }

    /// Free a protection domain (`ibv_dealloc_pd`): [`MemError::Busy`] while regions or
    /// holders remain, [`MemError::InvalidPd`] if unknown.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), MemError> {
        let e = self
            .pds
            .get(&pd.0)
            .ok_or(MemError::InvalidPd { pd: pd.0 })?;
        if e.mrs != 0 || e.users != 0 {
            return Err(MemError::Busy);
        }
        self.pds.remove(&pd.0);
        Ok(())
    }

    /// Whether `pd` is a live protection domain.
    pub fn pd_exists(&self, pd: PdId) -> bool {
        self.pds.contains_key(&pd.0)
    }

    /// Count one more object (QP, SRQ, AH, MW) using `pd`, so that `dealloc_pd` refuses
    /// with Busy until the matching [`MemoryTable::release_pd`].
    pub fn hold_pd(&mut self, pd: PdId) -> Result<(), MemError> {
        let e = self
            .pds
            .get_mut(&pd.0)
            .ok_or(MemError::InvalidPd { pd: pd.0 })?;
        e.users = e.users.checked_add(1).ok_or(MemError::NoResources)?;
        Ok(())
    }

    /// Undo one [`MemoryTable::hold_pd`].
    pub fn release_pd(&mut self, pd: PdId) -> Result<(), MemError> {
        let e = self
            .pds
            .get_mut(&pd.0)
            .ok_or(MemError::InvalidPd { pd: pd.0 })?;
        e.users = e
            .users
            .checked_sub(1)
            .ok_or(MemError::InvalidArgument("protection domain is not held"))?;
        Ok(())
    }

    /// Validate a registration and build its region (keys not yet set).
    fn make_region(
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Region, MemError> {
        let access = access.validate_for_registration()?;
        if addr.is_null() && len > 0 {
            return Err(MemError::InvalidArgument("null address"));
        }
        if len > isize::MAX as usize || (addr as usize).checked_add(len).is_none() {
            return Err(MemError::InvalidArgument("address + length overflows"));
        }
        // ibv_reg_mr_iova(..., iova = 0, ...) is how verbs asks for a zero-based region.
        let iova = if access.contains(AccessFlags::ZERO_BASED) {
            0
        } else {
            iova
        };
        let len = len as u64;
        // The region's last byte must exist in the 64-bit iova space; a region ending
        // exactly at 2^64 is fine (range checks never compute iova + length).
        if len > 0 && iova.checked_add(len - 1).is_none() {
            return Err(MemError::InvalidArgument("iova + length overflows"));
        }
        Ok(Region {
            pd,
            addr,
            len,
            iova,
            access,
            lkey: 0,
            rkey: 0,
            windows: 0,
        })
    }

    /// Register `[addr, addr + len)` in `pd` with rights `access` (`ibv_reg_mr` /
    /// `ibv_reg_mr_iova`); the region is named by iovas starting at `iova` (pass the
    /// address itself for `ibv_reg_mr`; ZERO_BASED forces 0).
    ///
    /// Refuses: unknown PD (InvalidPd), REMOTE_WRITE / REMOTE_ATOMIC without LOCAL_WRITE
    /// or unknown access bits (InvalidArgument, EINVAL like `ib_check_mr_access`), a null
    /// address, an address or iova range running past the end of the address space, and
    /// more than 2^24 regions (NoResources).
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay valid for reads, and for writes if `access` has any
    /// of LOCAL_WRITE / REMOTE_WRITE / REMOTE_ATOMIC, until `deregister` (or a `rereg`
    /// changing the translation) returns. The device reads and writes it at any time in
    /// between, like DMA: the caller must not hold Rust references to it that assume
    /// exclusive access while the device may touch it.
    pub unsafe fn register(
        &mut self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MrKeys, MemError> {
        if !self.pds.contains_key(&pd.0) {
            return Err(MemError::InvalidPd { pd: pd.0 });
        }
        let mut region = Self::make_region(pd, addr, len, iova, access)?;
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
        let idx = slot as usize;
        let last = self.slots.get(idx).and_then(|s| s.last_byte);
        let lkey = self.keys.new_key(slot, last);
        region.lkey = lkey;
        region.rkey = if region.access.intersects(AccessFlags::REMOTE) {
            lkey
        } else {
            0
        };
        let Some(entry) = self.slots.get_mut(idx) else {
            return Err(MemError::NoResources);
        };
        entry.region = Some(region);
        entry.last_byte = Some(lkey as u8);
        self.mr_count += 1;
        if let Some(p) = self.pds.get_mut(&pd.0) {
            p.mrs += 1;
        }
        Ok(MrKeys {
            lkey,
            rkey: region.rkey,
        })
    }

    /// Deregister the region named by `lkey` (`ibv_dereg_mr`). Afterwards neither its
    /// lkey nor its rkey resolves; when this returns the device no longer touches the
    /// memory (accesses run under `&self`, so none is in flight).
    pub fn deregister(&mut self, lkey: u32) -> Result<(), MemError> {
        let idx = self.keys.slot_of(lkey);
        let slot = self
            .slots
            .get_mut(idx as usize)
            .filter(|s| s.region.is_some_and(|r| r.lkey == lkey && lkey != 0))
            .ok_or(MemError::InvalidKey { key: lkey })?;
        if slot.region.is_some_and(|r| r.windows > 0) {
            // rxe_dereg_mr: EINVAL while windows are bound to it.
            return Err(MemError::InvalidArgument(
                "memory windows are bound to the region",
            ));
        }
        let pd = slot.region.take().map(|r| r.pd);
        self.free.push_back(idx);
        self.mr_count -= 1;
        if let Some(p) = pd.and_then(|pd| self.pds.get_mut(&pd.0)) {
            p.mrs = p.mrs.saturating_sub(1);
        }
        Ok(())
    }

    /// Change a region in place (`ibv_rereg_mr`). Everything is validated before any
    /// change; the lkey is kept (as rxe does) and the rkey follows the new rights.
    ///
    /// # Safety
    /// The region's memory after the change (the new translation, or the old one) must
    /// satisfy [`MemoryTable::register`]'s contract for the new rights (e.g. adding
    /// LOCAL_WRITE requires writable memory).
    pub unsafe fn rereg(&mut self, lkey: u32, change: Rereg) -> Result<MrKeys, MemError> {
        let old = *self.lookup(lkey, false)?;
        let pd = change.pd.unwrap_or(old.pd);
        if !self.pds.contains_key(&pd.0) {
            return Err(MemError::InvalidPd { pd: pd.0 });
        }
        let access = change.access.unwrap_or(old.access);
        let (addr, len, iova) = match change.translation {
            Some(t) => (t.addr, t.len, t.iova),
            None => (old.addr, old.len as usize, old.iova),
        };
        let mut region = Self::make_region(pd, addr, len, iova, access)?;
        region.lkey = lkey;
        region.rkey = if region.access.intersects(AccessFlags::REMOTE) {
            lkey
        } else {
            0
        };
        if pd != old.pd {
            if let Some(p) = self.pds.get_mut(&old.pd.0) {
                p.mrs = p.mrs.saturating_sub(1);
            }
            if let Some(p) = self.pds.get_mut(&pd.0) {
                p.mrs += 1;
            }
        }
        let idx = self.keys.slot_of(lkey) as usize;
        if let Some(s) = self.slots.get_mut(idx) {
            s.region = Some(region);
        }
        Ok(MrKeys {
            lkey,
            rkey: region.rkey,
        })
    }

    /// What the table knows about the region named by `lkey`.
    pub fn query(&self, lkey: u32) -> Option<MrInfo> {
        self.lookup(lkey, false).ok().map(|r| r.info())
    }

    /// Number of registered memory regions.
    pub fn mr_count(&self) -> usize {
        self.mr_count
    }

    /// Number of protection domains.
    pub fn pd_count(&self) -> usize {
        self.pds.len()
    }

    /// Number of regions registered in `pd` (0 for an unknown PD).
    pub fn pd_mr_count(&self, pd: PdId) -> usize {
        self.pds.get(&pd.0).map_or(0, |p| p.mrs as usize)
    }

    /// The live region named by `key`, as an lkey (`remote == false`) or an rkey.
    #[inline]
    pub(crate) fn lookup(&self, key: u32, remote: bool) -> Result<&Region, MemError> {
        let bad = MemError::InvalidKey { key };
        if key == 0 {
            return Err(bad);
        }
        let idx = self.keys.slot_of(key) as usize;
        let region = self
            .slots
            .get(idx)
            .and_then(|s| s.region.as_ref())
            .ok_or(bad)?;
        let expected = if remote { region.rkey } else { region.lkey };
        if expected != key {
            return Err(bad);
        }
        Ok(region)
    }

    /// Every check of rxe `lookup_mr` + `mr_check_range`, in its order: key, PD, rights,
    /// range. Returns the host address of `va`. A remote key may name a memory window
    /// instead (see [`MemoryTable::resolve_window`]).
    #[inline]
    fn resolve(
        &self,
        who: Grantee,
        key: u32,
        remote: bool,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<*mut u8, MemError> {
        let region = match self.lookup(key, remote) {
            Ok(r) => r,
            Err(_) if remote => return self.resolve_window(who, key, va, len, need),
            Err(e) => return Err(e),
        };
        if region.pd != who.pd {
            return Err(MemError::WrongPd { key });
        }
        if !region.access.contains(need) {
            return Err(MemError::AccessDenied { key, need });
        }
        region.translate(key, va, len)
    }

    /// Where an `ibv_advise_mr` prefetch of `sge` lands: the host span of its range in
    /// an on-demand region of `pd`. As rxe's prefetch looks the key up: a local key of
    /// this PD granting LOCAL_WRITE, the range inside the region; and, as mlx5 refuses
    /// a region that is not on-demand, only a region registered with ON_DEMAND.
    pub fn prefetch_span(&self, pd: PdId, sge: &Sge) -> Result<(*mut u8, usize), MemError> {
        let need = AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND;
        let len = u64::from(sge.length);
        let at = self.resolve(pd.into(), sge.lkey, false, sge.addr, len, need)?;
        Ok((at, sge.length as usize))
    }

    /// Brings the first `len` bytes of the scatter list `sges` of `pd` into this CPU's
    /// cache (a prefetch per cache line; nothing is read or written); returns the bytes
    /// covered. An SGE that does not check out ends it quietly: the receive that uses it
    /// reports the error.
    pub fn warm(&self, pd: PdId, sges: &[Sge], len: usize) -> usize {
        let total = Self::sge_total_len(sges).unwrap_or(0);
        let len = len.min(usize::try_from(total).unwrap_or(usize::MAX));
        let mut covered = 0;
        // `walk` checks each SGE as a receive's placement does and stops at the first
        // that fails; what it covered before that is warmed all the same.
        let _ = self.walk(pd, sges, 0, len, AccessFlags::LOCAL_WRITE, |p, _, n| {
            prefetch_lines(p.cast_const(), n);
            covered += n;
        });
        covered
    }

    /// Total byte length of a scatter/gather list (errors only if the sum exceeds u64,
    /// which needs more than 2^32 SGEs).
    pub fn sge_total_len(sges: &[Sge]) -> Result<u64, MemError> {
        sges.iter().try_fold(0u64, |acc, s| {
            acc.checked_add(u64::from(s.length))
                .ok_or(MemError::InvalidArgument("scatter/gather list too long"))
        })
    }

    /// Post-time check of a WR's SGEs: every non-empty SGE must name a live region of
    /// `pd` (by lkey) that covers it whole, and grant LOCAL_WRITE if `need_local_write`
    /// (receive WRs, RDMA READ / atomic destinations). Empty SGEs are skipped, as rxe
    /// `copy_data` never looks them up.
    pub fn validate_sges(
        &self,
        pd: PdId,
        sges: &[Sge],
        need_local_write: bool,
    ) -> Result<(), MemError> {
        let need = if need_local_write {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::empty()
        };
        Self::sge_total_len(sges)?;
        for s in sges.iter().filter(|s| s.length > 0) {
            self.resolve(pd.into(), s.lkey, false, s.addr, u64::from(s.length), need)?;
        }
        Ok(())
    }

    /// Visit the pieces of `[offset, offset + len)` of the SGE concatenation: for each,
    /// `f(host_ptr, position_in_data, bytes)`. Checks the total length first
    /// (LocalLength), then each piece's key, PD, rights and range as it reaches it (only
    /// the bytes actually touched, like rxe `copy_data`). Empty SGEs are skipped unread.
    #[inline]
    fn walk(
        &self,
        pd: PdId,
        sges: &[Sge],
        offset: usize,
        len: usize,
        need: AccessFlags,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), MemError> {
        if len == 0 {
            return Ok(());
        }
        let available = Self::sge_total_len(sges)?;
        let needed = (offset as u64).saturating_add(len as u64);
        if needed > available {
            return Err(MemError::LocalLength { needed, available });
        }
        let mut skip = offset as u64;
        let mut done = 0usize;
        for s in sges {
            if done == len {
                break;
            }
            let sl = u64::from(s.length);
            if skip >= sl {
                skip -= sl;
                continue;
            }
            // `sl - skip <= u32::MAX`, and `len - done` fits usize: min fits both.
            let n = (sl - skip).min((len - done) as u64) as usize;
            let va = s.addr.checked_add(skip).ok_or(MemError::Overflow {
                va: s.addr,
                len: sl,
            })?;
            let p = self.resolve(pd.into(), s.lkey, false, va, n as u64, need)?;
            f(p, done, n);
            done += n;
            skip = 0;
        }
        Ok(())
    }

    /// Copy `dst.len()` bytes starting `offset` bytes into the concatenation of `sges`
    /// (a send WR's gather list) into `dst`. Local reads need no right (verbs). On error
    /// `dst` may be partly written; registered memory is never written.
    pub fn gather(
        &self,
        pd: PdId,
        sges: &[Sge],
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), MemError> {
        let len = dst.len();
        let out = dst.as_mut_ptr();
        self.walk(pd, sges, offset, len, AccessFlags::empty(), |p, pos, n| {
            // SAFETY: `p..p+n` lies in a live region (checked by `resolve`) that the
            // register contract keeps readable; `pos + n <= len` so `out+pos..+n` is
            // inside `dst`. `ptr::copy` tolerates overlap should the caller pass a buffer
            // inside registered memory.
            unsafe { std::ptr::copy(p, out.add(pos), n) };
        })
    }

    /// Where `[offset, offset + len)` of the concatenation of `sges` lives, when it lies
    /// inside one SGE, after the same checks as [`MemoryTable::gather`] (so a send can
    /// hand the kernel registered memory instead of a copy). `Ok(None)` when the range
    /// spans SGEs (copy it with `gather`). Read it with [`MemoryTable::external_payload`].
    pub fn gather_in_place(
        &self,
        pd: PdId,
        sges: &[Sge],
        offset: usize,
        len: usize,
    ) -> Result<Option<External>, MemError> {
        let mut first: Option<(*mut u8, usize)> = None;
        let mut pieces = 0usize;
        self.walk(pd, sges, offset, len, AccessFlags::empty(), |p, _, n| {
            pieces += 1;
            first.get_or_insert((p, n));
        })?;
        let (p, n) = match first {
            Some(f) if pieces == 1 && f.1 == len => f,
            _ => return Ok(None),
        };
        // The SGE `walk` found it in: the first one that ends after `offset`.
        let mut skip = offset as u64;
        let lkey = sges.iter().find_map(|s| {
            let l = u64::from(s.length);
            if skip >= l {
                skip -= l;
                None
            } else {
                Some(s.lkey)
            }
        });
        Ok(lkey.map(|lkey| External {
            addr: p as usize,
            len: n,
            lkey,
        }))
    }

    /// The bytes of a payload [`MemoryTable::gather_in_place`] left in registered memory,
    /// or `InvalidKey` / `OutOfBounds` when its region was deregistered (or re-registered
    /// elsewhere) since. One key lookup, no copy.
    pub fn external_payload(&self, e: &External) -> Result<&[u8], MemError> {
        let region = self.lookup(e.lkey, false)?;
        let out = MemError::OutOfBounds {
            key: e.lkey,
            va: e.addr as u64,
            len: e.len as u64,
        };
        let off = e.addr.checked_sub(region.addr as usize).ok_or(out)?;
        if off as u64 > region.len || e.len as u64 > region.len - off as u64 {
            return Err(out);
        }
        // SAFETY: `addr..addr + len` lies inside a region registered right now (checked
        // above), which `register`'s contract keeps readable until it is deregistered;
        // deregistration takes `&mut self`, so it cannot happen while the returned slice
        // borrows `self`. The application may write the bytes meanwhile only by breaking
        // the verbs contract (a send buffer is the application's again at its
        // completion); the bytes read are then garbage, as a NIC's DMA would read.
        Ok(unsafe { std::slice::from_raw_parts(e.addr as *const u8, e.len) })
    }

    /// Copy `src` into the concatenation of `sges` starting `offset` bytes in (a receive
    /// WR's scatter list, or the local buffer of an RDMA READ / atomic result). Needs
    /// LOCAL_WRITE on every region touched. All pieces are checked before the first byte
    /// is written, so a refused scatter leaves registered memory unchanged.
    pub fn scatter(
        &self,
        pd: PdId,
        sges: &[Sge],
        offset: usize,
        src: &[u8],
    ) -> Result<(), MemError> {
        let len = src.len();
        // With one SGE there is one piece, checked before it is written: the checking
        // pass that keeps a refused multi-SGE scatter from writing anything is not
        // needed (it was a second key lookup per received packet).
        if sges.len() > 1 {
            self.walk(
                pd,
                sges,
                offset,
                len,
                AccessFlags::LOCAL_WRITE,
                |_, _, _| {},
            )?;
        }
        let inp = src.as_ptr();
        self.walk(
            pd,
            sges,
            offset,
            len,
            AccessFlags::LOCAL_WRITE,
            |p, pos, n| {
                let from = inp.wrapping_add(pos);
                // Received straight into place (`scatter_span`): nothing to move.
                if from != p.cast_const() {
                    // SAFETY: `p..p+n` lies in a live region granting LOCAL_WRITE, which
                    // the register contract keeps writable; `pos + n <= len` keeps the
                    // source inside `src`. `ptr::copy` tolerates overlap.
                    unsafe { std::ptr::copy(from, p, n) };
                }
            },
        )
    }

    /// Check a whole remote range up front (the RETH of an RDMA WRITE / READ or the
    /// AtomicETH), as rxe `check_rkey` does on the first packet: `rkey` names a live
    /// region of `pd` granting `need`, and `[va, va + len)` lies inside it.
    ///
    /// A zero-length range is accepted without looking at `rkey` or `va`: rxe skips the
    /// rkey check for 0-byte RDMA WRITE / READ ("a zero-byte op is not required to set
    /// an addr or rkey"). Atomics are always 8 bytes, so they are always checked.
    pub fn check_remote(
        &self,
        who: impl Into<Grantee>,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        if len == 0 {
            return Ok(());
        }
        self.resolve(who.into(), rkey, true, va, len, need)
            .map(|_| ())
    }

    /// Place `src` at iova `va` of the region named by `rkey` (an RDMA WRITE packet's
    /// payload); needs REMOTE_WRITE. Empty `src` is accepted unchecked (see
    /// [`MemoryTable::check_remote`]). A refused write changes nothing.
    pub fn remote_write(
        &self,
        who: impl Into<Grantee>,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> Result<(), MemError> {
        if src.is_empty() {
            return Ok(());
        }
        let p = self.resolve(
            who.into(),
            rkey,
            true,
            va,
            src.len() as u64,
            AccessFlags::REMOTE_WRITE,
        )?;
        // Received straight into place (`remote_write_span`): nothing to move.
        if src.as_ptr() != p.cast_const() {
            // SAFETY: `p..p+len` is inside a live region granting REMOTE_WRITE (so
            // registered writable); `src` is a valid slice of that length.
            unsafe { std::ptr::copy(src.as_ptr(), p, src.len()) };
        }
        Ok(())
    }

    /// Where the rest of an RDMA WRITE in progress lies: the host address of
    /// `[va, va + len)` of the region named by `rkey`, after the checks of
    /// [`MemoryTable::remote_write`] (REMOTE_WRITE, PD, bounds). For a receive that
    /// places payload straight into registered memory (see the datapath's direct
    /// receive); `None` for an empty range.
    pub fn remote_write_span(
        &self,
        who: impl Into<Grantee>,
        rkey: u32,
        va: u64,
        len: u64,
    ) -> Result<Option<*mut u8>, MemError> {
        if len == 0 {
            return Ok(None);
        }
        self.resolve(who.into(), rkey, true, va, len, AccessFlags::REMOTE_WRITE)
            .map(Some)
    }

    /// Where the receive buffer `sges` continues at `offset`: the host address of that
    /// byte and how many bytes of its SGE follow it, after the checks of
    /// [`MemoryTable::scatter`] (lkey, PD, LOCAL_WRITE, bounds). `None` when `offset` is
    /// at or past the end of the list.
    pub fn scatter_span(
        &self,
        pd: PdId,
        sges: &[Sge],
        offset: usize,
    ) -> Result<Option<(*mut u8, usize)>, MemError> {
        let mut skip = offset as u64;
        for s in sges {
            let sl = u64::from(s.length);
            if skip >= sl {
                skip -= sl;
                continue;
            }
            let va = s.addr.checked_add(skip).ok_or(MemError::Overflow {
                va: s.addr,
                len: sl,
            })?;
            let n = sl - skip;
            let p = self.resolve(pd.into(), s.lkey, false, va, n, AccessFlags::LOCAL_WRITE)?;
            return Ok(Some((p, n as usize)));
        }
        Ok(None)
    }

    /// Copy `dst.len()` bytes from iova `va` of the region named by `rkey` (an RDMA READ
    /// response's payload); needs REMOTE_READ. Empty `dst` is accepted unchecked.
    pub fn remote_read(
        &self,
        who: impl Into<Grantee>,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> Result<(), MemError> {
        if dst.is_empty() {
            return Ok(());
        }
        let p = self.remote_readable(who, rkey, va, dst.len())?;
        // SAFETY: `p..p+len` is inside a live region (readable by contract); `dst` is a
        // valid mutable slice of that length.
        unsafe { std::ptr::copy(p, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// [`MemoryTable::remote_read`], also returning the CRC-32 (IEEE 802.3, initial value
    /// 0, as crc32fast) of the bytes copied, computed in the same pass: for a READ
    /// response whose ICRC is sealed later, so that its payload is read once (see
    /// `copy_crc`). Empty `dst` is accepted unchecked (CRC 0).
    pub fn remote_read_crc(
        &self,
        who: impl Into<Grantee>,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> Result<u32, MemError> {
        if dst.is_empty() {
            return Ok(0);
        }
        let p = self.remote_readable(who, rkey, va, dst.len())?;
        // SAFETY: `p..p+len` is inside a live region (readable by the register contract)
        // and `dst`, our own slice of that length, cannot overlap registered memory that
        // the application may write.
        Ok(unsafe { crate::copy_crc::copy_crc32(p, dst) })
    }

    /// The host address of `[va, va + len)` in the region named by `rkey`, checked for
    /// REMOTE_READ (the source of an RDMA READ response).
    fn remote_readable(
        &self,
        who: impl Into<Grantee>,
        rkey: u32,
        va: u64,
        len: usize,
    ) -> Result<*const u8, MemError> {
        self.resolve(
            who.into(),
            rkey,
            true,
            va,
            len as u64,
            AccessFlags::REMOTE_READ,
        )
        .map(|p| p.cast_const())
    }

    /// Execute an 8-byte remote atomic at iova `va` of the region named by `rkey`;
    /// returns the original value. Checks, in rxe's order: key, PD, REMOTE_ATOMIC, range,
    /// then alignment (IBTA 9.4.5: `va` must be 8-byte aligned, else
    /// [`MemError::Misaligned`] and a NAK Invalid Request). The host address must be
    /// aligned too (it differs from `va`'s alignment only with a hand-picked iova).
    ///
    /// The operation is a real atomic instruction (SeqCst) on the host word, so local
    /// CPU users of the same word see a consistent value.
    pub fn remote_atomic(
        &self,
        who: impl Into<Grantee>,
        rkey: u32,
        va: u64,
        op: AtomicOp,
    ) -> Result<u64, MemError> {
        let p = self.resolve(who.into(), rkey, true, va, 8, AccessFlags::REMOTE_ATOMIC)?;
        if va & 7 != 0 || (p as usize) & 7 != 0 {
            return Err(MemError::Misaligned { va });
        }
        // SAFETY: `p` is 8-byte aligned, `p..p+8` lies in a live region granting
        // REMOTE_ATOMIC (registered writable: REMOTE_ATOMIC requires LOCAL_WRITE), valid
        // for the duration of this call by the register contract; all device accesses
        // to a word used atomically go through this atomic path.
        let word = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        let old = match op {
            AtomicOp::CompareSwap { compare, swap } => {
                match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
            AtomicOp::FetchAdd { add } => word.fetch_add(add, Ordering::SeqCst),
        };
        Ok(old)
    }
}

/// A prefetch of every 64-byte line of `[p, p + len)` into the nearest cache.
fn prefetch_lines(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                p.wrapping_add(off).cast::<i8>(),
                std::arch::x86_64::_MM_HINT_T0,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}
