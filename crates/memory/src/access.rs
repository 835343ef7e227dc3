//! Memory access rights, `IBV_ACCESS_*` from rdma-core `libibverbs/verbs.h`.

use crate::error::MemError;

bitflags::bitflags! {
    /// Access rights of a memory region (`enum ibv_access_flags`, same bit values).
    ///
    /// Local read access is always granted (verbs has no flag for it).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the HCA may write the region for local operations
        /// (receive buffers, RDMA READ and atomic results). Required by REMOTE_WRITE and
        /// REMOTE_ATOMIC.
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE into the region.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ from the region.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on the region.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region (stored only).
        const MW_BIND = 1 << 4;
        /// `IBV_ACCESS_ZERO_BASED`: the region's iova starts at 0.
        const ZERO_BASED = 1 << 5;
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging. softhca never pins memory, so every
        /// region is paged on demand; the flag marks those `ibv_advise_mr` may prefetch.
        const ON_DEMAND = 1 << 6;
        /// `IBV_ACCESS_HUGETLB`: accepted and ignored.
        const HUGETLB = 1 << 7;
        /// `IBV_ACCESS_RELAXED_ORDERING` (the first "optional" flag): accepted and ignored.
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl AccessFlags {
    /// `IBV_ACCESS_OPTIONAL_RANGE`: bits 20..=29 are hints a provider may ignore; verbs
    /// requires that registration does not fail because of them.
    pub const OPTIONAL_RANGE: u32 = 0x3ff0_0000;

    /// Any remote right. rxe hands out an rkey only when one of these is granted
    /// (`rxe_mr_init`: `rkey = access & IB_ACCESS_REMOTE ? lkey : 0`).
    pub const REMOTE: AccessFlags = AccessFlags::REMOTE_WRITE
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC);

    /// Rights that let the HCA store into the region; granting any of them means the
    /// registered memory must be writable.
    pub const WRITES: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_ATOMIC);

    /// Check a set of rights for memory registration, as `ib_check_mr_access` does:
    /// unknown non-optional bits are refused, and REMOTE_WRITE or REMOTE_ATOMIC without
    /// LOCAL_WRITE is refused (IBTA 10.6.3.1 / verbs: EINVAL). Returns the flags with the
    /// optional-range bits other than RELAXED_ORDERING removed.
    pub fn validate_for_registration(self) -> Result<AccessFlags, MemError> {
        let raw = self.bits();
        let unknown = raw & !AccessFlags::all().bits() & !Self::OPTIONAL_RANGE;
        if unknown != 0 {
            return Err(MemError::InvalidArgument("unsupported access flag"));
        }
        if self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !self.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(MemError::InvalidArgument(
                "REMOTE_WRITE or REMOTE_ATOMIC requires LOCAL_WRITE",
            ));
        }
        Ok(AccessFlags::from_bits_truncate(raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_values() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::MW_BIND.bits(), 16);
        assert_eq!(AccessFlags::ZERO_BASED.bits(), 32);
        assert_eq!(AccessFlags::ON_DEMAND.bits(), 64);
        assert_eq!(AccessFlags::HUGETLB.bits(), 128);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 1 << 20);
    }

    #[test]
    fn registration_rules() {
        assert!(AccessFlags::REMOTE_WRITE
            .validate_for_registration()
            .is_err());
        assert!(AccessFlags::REMOTE_ATOMIC
            .validate_for_registration()
            .is_err());
        assert_eq!(
            AccessFlags::REMOTE_READ.validate_for_registration(),
            Ok(AccessFlags::REMOTE_READ)
        );
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        assert_eq!(rw.validate_for_registration(), Ok(rw));
        // Optional bits are dropped silently; RELAXED_ORDERING is kept as a known flag.
        let opt = AccessFlags::from_bits_retain(1 << 21) | AccessFlags::RELAXED_ORDERING;
        assert_eq!(
            opt.validate_for_registration(),
            Ok(AccessFlags::RELAXED_ORDERING)
        );
        // Bit 8 (IBV_ACCESS_FLUSH_GLOBAL) is not supported.
        assert_eq!(
            AccessFlags::from_bits_retain(1 << 8).validate_for_registration(),
            Err(MemError::InvalidArgument("unsupported access flag"))
        );
    }
}
