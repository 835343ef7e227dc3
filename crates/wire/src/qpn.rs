//! Queue pair numbers (IBTA 3.5.4: 24 bits).

use core::fmt;

/// A 24-bit queue pair number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Qpn(u32);

impl Qpn {
    /// Mask of the 24 significant bits.
    pub const MASK: u32 = 0x00ff_ffff;
    /// QP0, the subnet management QP (not used by RoCE; rxe drops packets to it).
    pub const SMI: Qpn = Qpn(0);
    /// QP1, the general services (CM) QP.
    pub const GSI: Qpn = Qpn(1);
    /// Destination QPN 0xFFFFFF: the multicast QPN (IBTA 10.5.2).
    pub const MULTICAST: Qpn = Qpn(Self::MASK);

    /// A QPN from the low 24 bits of `v` (higher bits are dropped).
    #[inline]
    pub const fn new(v: u32) -> Qpn {
        Qpn(v & Self::MASK)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#08x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}
