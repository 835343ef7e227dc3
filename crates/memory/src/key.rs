//! L_Key / R_Key layout and generation.
//!
//! A key is 32 bits: `tag << 8 | key_byte`, the layout rxe uses (`index << 8 | key`,
//! IBTA 10.6.3: the low 8 bits are the consumer-owned "key" part). rxe puts the
//! pool index in the upper 24 bits, so its keys count up with each registration and a
//! peer that sees one rkey can guess its neighbours. softhca instead stores a 24-bit
//! *tag*: the slot index run through a keyed permutation (a 4-round Feistel network on
//! two 12-bit halves whose round keys come from the table's seed). Lookup inverts the
//! permutation, so it stays O(1) with no hash map, while consecutive slots give tags
//! scattered over the whole 24-bit space. The key byte is drawn at random for each
//! registration and differs from the slot's previous one (rxe `rxe_get_next_key`), so a
//! deregistered key never resolves again until its slot is reused with a fresh byte.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Bits of the slot tag (upper part of the key).
pub(crate) const TAG_BITS: u32 = 24;
/// Number of slots the tag space can address.
pub(crate) const MAX_SLOTS: u32 = 1 << TAG_BITS;
const HALF_BITS: u32 = TAG_BITS / 2;
const HALF_MASK: u32 = (1 << HALF_BITS) - 1;
const ROUNDS: usize = 4;

/// Per-table secret and random source for keys.
pub(crate) struct KeySpace {
    round_keys: [u32; ROUNDS],
    rng: StdRng,
    /// The last inversion, `tag << 32 | slot`: a stream of packets names the same few
    /// keys, and the 4 Feistel rounds (8 dependent multiplies) were ~4 % of a 64 B
    /// message's cost. The mapping is a pure function of `round_keys`, so a racing
    /// reader sees either the old or the new pair, both true.
    last: AtomicU64,
}

/// Feistel round function: a 32-bit integer mix of the half and the round key, cut to
/// 12 bits. Any function works for invertibility; a good mix makes tags look random.
#[inline]
fn round(half: u32, key: u32) -> u32 {
    let mut h = (half ^ key).wrapping_mul(0x9e37_79b1);
    h ^= h >> 15;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h & HALF_MASK
}

impl KeySpace {
    /// A key space whose secret and key bytes derive from `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let round_keys = [rng.gen(), rng.gen(), rng.gen(), rng.gen()];
        let mut ks = KeySpace {
            round_keys,
            rng,
            last: AtomicU64::new(0),
        };
        let slot0 = ks.invert(0);
        ks.last = AtomicU64::new(u64::from(slot0));
        ks
    }

    /// The 24-bit tag of a slot (a bijection on `0..MAX_SLOTS`).
    #[inline]
    pub(crate) fn tag_of(&self, slot: u32) -> u32 {
        let mut l = (slot >> HALF_BITS) & HALF_MASK;
        let mut r = slot & HALF_MASK;
        for k in self.round_keys {
            let next = l ^ round(r, k);
            l = r;
            r = next;
        }
        (l << HALF_BITS) | r
    }

    /// The slot a key names (inverse of [`KeySpace::tag_of`] on the key's upper 24 bits).
    #[inline]
    pub(crate) fn slot_of(&self, key: u32) -> u32 {
        let tag = key >> 8;
        let last = self.last.load(Ordering::Relaxed);
        if (last >> 32) as u32 == tag {
            return last as u32;
        }
        let slot = self.invert(tag);
        self.last
            .store(u64::from(tag) << 32 | u64::from(slot), Ordering::Relaxed);
        slot
    }

    fn invert(&self, tag: u32) -> u32 {
        let mut l = (tag >> HALF_BITS) & HALF_MASK;
        let mut r = tag & HALF_MASK;
        for k in self.round_keys.iter().rev() {
            let prev = r ^ round(l, *k);
            r = l;
            l = prev;
        }
        (l << HALF_BITS) | r
    }

    /// A fresh key for `slot`, whose low byte differs from `last_byte`, never 0 (0 is
    /// the rkey of a region without remote rights, as in rxe).
    pub(crate) fn new_key(&mut self, slot: u32, last_byte: Option<u8>) -> u32 {
        let tag = self.tag_of(slot) << 8;
        loop {
            let byte: u8 = self.rng.gen();
            let key = tag | u32::from(byte);
            if Some(byte) != last_byte && key != 0 {
                return key;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_is_a_bijection_on_a_sample() {
        let ks = KeySpace::new(7);
        for slot in (0..MAX_SLOTS).step_by(9973).chain([0, 1, 2, MAX_SLOTS - 1]) {
            let tag = ks.tag_of(slot);
            assert!(tag < MAX_SLOTS);
            assert_eq!(ks.slot_of(tag << 8 | 0xab), slot);
        }
    }

    #[test]
    fn tags_of_neighbours_are_scattered() {
        let ks = KeySpace::new(1);
        let tags: Vec<u32> = (0..64).map(|s| ks.tag_of(s)).collect();
        let sequential = tags
            .windows(2)
            .filter(|w| w[1].wrapping_sub(w[0]) == 1)
            .count();
        assert!(sequential <= 1, "tags {tags:x?}");
        // Different seeds give different permutations.
        let other = KeySpace::new(2);
        assert_ne!(tags, (0..64).map(|s| other.tag_of(s)).collect::<Vec<_>>());
    }

    #[test]
    fn new_key_avoids_last_byte_and_zero() {
        let mut ks = KeySpace::new(3);
        let mut last = None;
        for _ in 0..1000 {
            let k = ks.new_key(5, last);
            assert_ne!(k, 0);
            assert_ne!(Some(k as u8), last);
            assert_eq!(ks.slot_of(k), 5);
            last = Some(k as u8);
        }
    }
}
