//! Packet sequence numbers: 24-bit serial numbers (IBTA 9.7.1).
//!
//! PSNs wrap at 2^24, so they have no total order; two PSNs compare only within half the
//! space (2^23), exactly like rxe's `psn_compare()` which shifts the 24-bit difference
//! into the top of an `s32`.

use core::fmt;

/// A 24-bit packet sequence number. Arithmetic wraps modulo 2^24.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Mask of the 24 significant bits.
    pub const MASK: u32 = 0x00ff_ffff;
    /// Largest PSN.
    pub const MAX: Psn = Psn(Self::MASK);

    /// A PSN from the low 24 bits of `v` (higher bits are dropped).
    #[inline]
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// The next PSN (`self + 1` modulo 2^24).
    #[inline]
    #[must_use]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Signed serial distance `self - other` in [-2^23, 2^23): positive when `self` is
    /// after `other`. Same as rxe `psn_compare(self, other)` (sign of `(a - b) << 8`).
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back: sign-extends bit 23.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// True when `self` comes strictly before `other` within half the PSN space.
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True when `self` comes strictly after `other` within half the PSN space.
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_masks_to_24_bits() {
        assert_eq!(Psn::new(0x1ff_ffff).value(), 0xff_ffff);
        assert_eq!(Psn::new(0x100_0000).value(), 0);
    }

    #[test]
    fn add_and_next_wrap() {
        assert_eq!(Psn::MAX.next(), Psn::new(0));
        assert_eq!(Psn::new(0xff_fffe).add(5), Psn::new(3));
        assert_eq!(Psn::new(2).sub(5), Psn::new(0xff_fffd));
        assert_eq!(Psn::new(7).add(u32::MAX), Psn::new(6));
    }

    #[test]
    fn diff_across_the_wrap() {
        assert_eq!(Psn::new(0).diff(Psn::MAX), 1);
        assert_eq!(Psn::MAX.diff(Psn::new(0)), -1);
        assert_eq!(Psn::new(3).diff(Psn::new(0xff_fffd)), 6);
        assert_eq!(Psn::new(0xff_fffd).diff(Psn::new(3)), -6);
        assert_eq!(Psn::new(100).diff(Psn::new(100)), 0);
        // Half window: 2^23 apart is the most negative distance.
        assert_eq!(Psn::new(0x80_0000).diff(Psn::new(0)), -0x80_0000);
        assert_eq!(Psn::new(0x7f_ffff).diff(Psn::new(0)), 0x7f_ffff);
    }

    #[test]
    fn ordering_within_half_window() {
        assert!(Psn::MAX.is_before(Psn::new(0)));
        assert!(Psn::new(0).is_after(Psn::MAX));
        assert!(!Psn::new(0).is_before(Psn::MAX));
        assert!(Psn::new(0xff_fff0).is_before(Psn::new(0x10)));
        assert!(!Psn::new(5).is_before(Psn::new(5)));
        assert!(Psn::new(0).is_before(Psn::new(0x7f_ffff)));
        assert!(!Psn::new(0).is_before(Psn::new(0x80_0001)));
    }
}
