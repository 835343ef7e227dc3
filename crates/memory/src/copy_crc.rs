//! Copy out of (or into) registered memory and CRC-32 the copied bytes in one pass.
//!
//! Why: an RDMA READ response is copied out of the responder's memory (the application
//! may write it meanwhile, so the ICRC must cover the bytes that leave, not the bytes
//! there now) and then its ICRC is computed over the copy: two passes over every byte,
//! and the copy was 12 % of a READ responder's profile (64 KiB READs, loopback). Folding
//! the CRC over the vector lanes as they are loaded, and storing those same lanes,
//! reads the source once and costs what the CRC alone costs (64 KiB in cache, on this
//! project's AMD EPYC: 1.03 us fused with 512-bit lanes, 2.0 us with 256-bit ones,
//! 1.73 us for `copy_from_slice` and crc32fast).
//! The receiver does not fold the other way: it checks a received payload's ICRC where
//! the socket left it, in cache, before any byte of it is copied into the MR, so a packet
//! that fails never writes there (a fused copy into an MR beyond the caches, with its
//! vector stores, also cost more than the check and a plain copy).
//!
//! The folding is the carry-less multiplication method of Intel's "Fast CRC Computation
//! for Generic Polynomials Using PCLMULQDQ" (Gopal et al., 2009) for the bit-reflected
//! CRC-32 of IEEE 802.3: four accumulators of 512 bits (AVX-512) fold 256 bytes per step
//! with `VPCLMULQDQ`, or four of 256 bits (AVX2) 128 bytes, or, on a CPU with PCLMULQDQ
//! but not VPCLMULQDQ, four of 128 bits 64 bytes (the loop crc32fast runs there, with the
//! loaded lanes stored as well); then their 128-bit lanes fold into one, which is reduced
//! to 32 bits (Barrett). The fold constants are `x^n mod P(x)` bit-reflected and shifted
//! left by one, as that paper defines them; `tests::fold_constants` recomputes them.
//! Without PCLMULQDQ and SSE4.1 (checked at run time once) the copy and crc32fast do it.

/// `dst.len()` bytes from `src` into `dst`; returns the CRC-32 (IEEE 802.3, as zlib and
/// crc32fast compute it, from the initial value 0) of the bytes stored in `dst`.
///
/// # Safety
/// `src..src + dst.len()` must be readable for the duration of the call. Another thread
/// may write it meanwhile (registered memory under an RDMA READ): the CRC is that of
/// the bytes this call read, which are the bytes it stored.
pub(crate) unsafe fn copy_crc32(src: *const u8, dst: &mut [u8]) -> u32 {
    // SAFETY: our contract, passed on.
    unsafe { copy_crc32_from(0, src, dst) }
}

/// [`copy_crc32`] continuing the CRC `crc` of bytes before `src` (as crc32fast's
/// `new_with_initial`): the CRC of those bytes followed by the ones copied.
///
/// # Safety
/// As [`copy_crc32`].
unsafe fn copy_crc32_from(crc: u32, src: *const u8, dst: &mut [u8]) -> u32 {
    // SAFETY: our contract, passed on.
    let (done, crc) = unsafe { fold_prefix(crc, src, dst) };
    let rest = &mut dst[done..];
    // SAFETY: `src + done .. src + len` is readable (our contract); `rest` is exactly
    // that long and is our own exclusive slice, so they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.add(done), rest.as_mut_ptr(), rest.len()) };
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(rest);
    h.finalize()
}

/// Copies and CRCs the longest prefix the vector path takes, continuing `crc`; returns
/// its length and the CRC after it (0 and `crc` without that path).
///
/// # Safety
/// As [`copy_crc32`].
#[cfg(target_arch = "x86_64")]
unsafe fn fold_prefix(crc: u32, src: *const u8, dst: &mut [u8]) -> (usize, u32) {
    if !x86::available() {
        return fold_prefix_128(crc, src, dst);
    }
    let blocks = dst.len() / x86::BLOCK;
    if blocks == 0 {
        return (0, crc);
    }
    // Whole 256-byte blocks with 512-bit lanes where the CPU has them, the rest of the
    // 128-byte blocks with 256-bit ones.
    let wide = if x86::available_512() {
        dst.len() / x86::BLOCK_512
    } else {
        0
    };
    let mut reg = !crc;
    if wide > 0 {
        // SAFETY: the CPU has the features (`available_512`); `src` is readable for
        // `wide * BLOCK_512 <= dst.len()` bytes (our contract) and `dst` writable for as
        // many.
        reg = unsafe { x86::fold_copy_512(reg, dst.as_mut_ptr(), src, wide) };
    }
    let done = wide * x86::BLOCK_512;
    let narrow = (dst.len() - done) / x86::BLOCK;
    if narrow > 0 {
        // SAFETY: the CPU has the features (`available`); `src + done` is readable for
        // `narrow * BLOCK <= dst.len() - done` bytes (our contract) and `dst + done`
        // writable for as many.
        reg = unsafe { x86::fold_copy(reg, dst.as_mut_ptr().add(done), src.add(done), narrow) };
    }
    (done + narrow * x86::BLOCK, !reg)
}

/// [`fold_prefix`] on a CPU without VPCLMULQDQ: whole 64-byte blocks with 128-bit lanes,
/// where it has PCLMULQDQ and SSE4.1.
///
/// # Safety
/// As [`copy_crc32`].
#[cfg(target_arch = "x86_64")]
unsafe fn fold_prefix_128(crc: u32, src: *const u8, dst: &mut [u8]) -> (usize, u32) {
    let blocks = dst.len() / x86::BLOCK_128;
    if blocks == 0 || !x86::available_128() {
        return (0, crc);
    }
    // SAFETY: the CPU has the features (`available_128`); `src` is readable for
    // `blocks * BLOCK_128 <= dst.len()` bytes (our contract) and `dst` writable for as
    // many.
    let reg = unsafe { x86::fold_copy_128(!crc, dst.as_mut_ptr(), src, blocks) };
    (blocks * x86::BLOCK_128, !reg)
}

/// No vector path on this architecture.
///
/// # Safety
/// As [`copy_crc32`].
#[cfg(not(target_arch = "x86_64"))]
unsafe fn fold_prefix(crc: u32, _src: *const u8, _dst: &mut [u8]) -> (usize, u32) {
    (0, crc)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// Bytes folded per step: four 256-bit lanes.
    pub(super) const BLOCK: usize = 128;

    /// Fold constants (see the module comment): the low qword of a lane is multiplied by
    /// `x^(d+32)`, the high one by `x^(d-32)`, `d` the folding distance in bits.
    pub(super) const FOLD_1024: (i64, i64) = (0x1_e88e_f372, 0x1_4a7f_e880);
    pub(super) const FOLD_128: (i64, i64) = (0x1_7519_97d0, 0x0_ccaa_009e);
    /// `x^64`, for the 64 -> 32 bit step.
    pub(super) const FOLD_64: i64 = 0x1_63cd_6124;
    /// Barrett reduction: P'(x) (the polynomial, reflected) and mu = floor(x^64 / P(x)).
    const POLY: i64 = 0x1_db71_0641;
    const MU: i64 = 0x1_f701_1641;

    /// Bytes folded per step of the 512-bit path: four 512-bit lanes.
    pub(super) const BLOCK_512: usize = 256;
    /// Fold constants for the 512-bit path: across a step (2048 bits) and across one
    /// lane (512 bits), to fold the four lanes into one at the end.
    pub(super) const FOLD_2048: (i64, i64) = (0x1_1542_778a, 0x1_322d_1430);
    pub(super) const FOLD_512: (i64, i64) = (0x1_5444_2bd4, 0x1_c6e4_1596);

    /// Whether this CPU folds with 256-bit VPCLMULQDQ. 0 unknown, 1 no, 2 yes.
    static HAVE: AtomicU8 = AtomicU8::new(0);
    /// Whether it folds with 512-bit VPCLMULQDQ as well (AVX-512). As `HAVE`.
    static HAVE_512: AtomicU8 = AtomicU8::new(0);

    pub(super) fn available_512() -> bool {
        match HAVE_512.load(Ordering::Relaxed) {
            2 => true,
            1 => false,
            _ => {
                let yes = available()
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("vpclmulqdq");
                HAVE_512.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
        }
    }

    /// [`fold_copy`] with four 512-bit lanes: copies `blocks * BLOCK_512` bytes from
    /// `src` to `dst` and returns the CRC register (not inverted) after them, starting
    /// from `crc`. Half the folding instructions per byte of the 256-bit path: as fast as
    /// the CRC alone is with AVX-512 (crc32fast's path), where the 256-bit one is not.
    ///
    /// # Safety
    /// The CPU supports AVX-512F and VPCLMULQDQ besides [`fold_copy`]'s features (see
    /// [`available_512`]); `blocks >= 1`; `src` is readable and `dst` writable for
    /// `blocks * BLOCK_512` bytes.
    #[target_feature(enable = "avx512f,avx2,vpclmulqdq,pclmulqdq,sse4.1")]
    pub(super) unsafe fn fold_copy_512(
        crc: u32,
        dst: *mut u8,
        src: *const u8,
        blocks: usize,
    ) -> u32 {
        // SAFETY (the two closures): every offset used below is below
        // `blocks * BLOCK_512`, which the caller guarantees readable at `src` and writable
        // at `dst`; unaligned loads and stores are used.
        let load = |at: usize| unsafe { _mm512_loadu_si512(src.add(at).cast()) };
        let store = |at: usize, v: __m512i| unsafe { _mm512_storeu_si512(dst.add(at).cast(), v) };
        let constants = |(lo, hi): (i64, i64)| _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
        let fold = |acc: __m512i, next: __m512i, k: __m512i| {
            let lo = _mm512_clmulepi64_epi128(acc, k, 0x00);
            let hi = _mm512_clmulepi64_epi128(acc, k, 0x11);
            // lo ^ hi ^ next.
            _mm512_ternarylogic_epi64(lo, hi, next, 0x96)
        };
        let k = constants(FOLD_2048);
        let v = [load(0), load(64), load(128), load(192)];
        for (i, x) in v.iter().enumerate() {
            store(64 * i, *x);
        }
        // The initial register enters as the first 32 bits of the message.
        let seed = _mm512_zextsi128_si512(_mm_cvtsi32_si128(crc as i32));
        let mut acc = [_mm512_xor_si512(v[0], seed), v[1], v[2], v[3]];
        for b in 1..blocks {
            let at = b * BLOCK_512;
            for (i, a) in acc.iter_mut().enumerate() {
                let x = load(at + 64 * i);
                store(at + 64 * i, x);
                *a = fold(*a, x, k);
            }
        }
        // The four lanes fold into one, in message order, then its four 128-bit parts.
        let k512 = constants(FOLD_512);
        let mut x = acc[0];
        for a in &acc[1..] {
            x = fold(x, *a, k512);
        }
        let parts = [
            _mm512_castsi512_si128(x),
            _mm512_extracti32x4_epi32(x, 1),
            _mm512_extracti32x4_epi32(x, 2),
            _mm512_extracti32x4_epi32(x, 3),
        ];
        reduce_128(parts)
    }

    /// Bytes folded per step of the 128-bit path: four 128-bit lanes.
    pub(super) const BLOCK_128: usize = 64;
    /// Whether this CPU folds with 128-bit PCLMULQDQ (and SSE4.1). As `HAVE`.
    static HAVE_128: AtomicU8 = AtomicU8::new(0);

    pub(super) fn available_128() -> bool {
        match HAVE_128.load(Ordering::Relaxed) {
            2 => true,
            1 => false,
            _ => {
                let yes = std::is_x86_feature_detected!("pclmulqdq")
                    && std::is_x86_feature_detected!("sse4.1");
                HAVE_128.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
        }
    }

    /// [`fold_copy`] with four 128-bit lanes: copies `blocks * BLOCK_128` bytes from
    /// `src` to `dst` and returns the CRC register (not inverted) after them, starting
    /// from `crc`.
    ///
    /// # Safety
    /// The CPU supports PCLMULQDQ and SSE4.1 (see [`available_128`]); `blocks >= 1`;
    /// `src` is readable and `dst` writable for `blocks * BLOCK_128` bytes.
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    pub(super) unsafe fn fold_copy_128(
        crc: u32,
        dst: *mut u8,
        src: *const u8,
        blocks: usize,
    ) -> u32 {
        // SAFETY (the two closures): every offset used below is below
        // `blocks * BLOCK_128`, which the caller guarantees readable at `src` and writable
        // at `dst`; unaligned loads and stores are used.
        let load = |at: usize| unsafe { _mm_loadu_si128(src.add(at).cast()) };
        let store = |at: usize, v: __m128i| unsafe { _mm_storeu_si128(dst.add(at).cast(), v) };
        // Four lanes of 128 bits: a step folds across 512 bits.
        let k = _mm_set_epi64x(FOLD_512.1, FOLD_512.0);
        let fold = |acc: __m128i, next: __m128i| {
            let lo = _mm_clmulepi64_si128(acc, k, 0x00);
            let hi = _mm_clmulepi64_si128(acc, k, 0x11);
            _mm_xor_si128(_mm_xor_si128(lo, hi), next)
        };
        let v = [load(0), load(16), load(32), load(48)];
        for (i, x) in v.iter().enumerate() {
            store(16 * i, *x);
        }
        // The initial register enters as the first 32 bits of the message.
        let seed = _mm_cvtsi32_si128(crc as i32);
        let mut acc = [_mm_xor_si128(v[0], seed), v[1], v[2], v[3]];
        for b in 1..blocks {
            let at = b * BLOCK_128;
            for (i, a) in acc.iter_mut().enumerate() {
                let x = load(at + 16 * i);
                store(at + 16 * i, x);
                *a = fold(*a, x);
            }
        }
        reduce_128(acc)
    }

    pub(super) fn available() -> bool {
        match HAVE.load(Ordering::Relaxed) {
            2 => true,
            1 => false,
            _ => {
                let yes = std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("vpclmulqdq")
                    && std::is_x86_feature_detected!("pclmulqdq")
                    && std::is_x86_feature_detected!("sse4.1");
                HAVE.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
        }
    }

    /// Copies `blocks * BLOCK` bytes from `src` to `dst` and returns the CRC register
    /// (not inverted) after them, starting from `crc`.
    ///
    /// # Safety
    /// The CPU supports AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.1 (see [`available`]);
    /// `blocks >= 1`; `src` is readable and `dst` writable for `blocks * BLOCK` bytes.
    #[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.1")]
    pub(super) unsafe fn fold_copy(crc: u32, dst: *mut u8, src: *const u8, blocks: usize) -> u32 {
        // SAFETY (the two closures): every offset used below is below `blocks * BLOCK`,
        // which the caller guarantees readable at `src` and writable at `dst`; unaligned
        // loads and stores are used.
        let load = |at: usize| unsafe { _mm256_loadu_si256(src.add(at).cast()) };
        let store = |at: usize, v: __m256i| unsafe { _mm256_storeu_si256(dst.add(at).cast(), v) };
        let k = _mm256_set_epi64x(FOLD_1024.1, FOLD_1024.0, FOLD_1024.1, FOLD_1024.0);
        let fold = |acc: __m256i, next: __m256i| {
            let lo = _mm256_clmulepi64_epi128(acc, k, 0x00);
            let hi = _mm256_clmulepi64_epi128(acc, k, 0x11);
            _mm256_xor_si256(_mm256_xor_si256(lo, hi), next)
        };
        let v = [load(0), load(32), load(64), load(96)];
        for (i, x) in v.iter().enumerate() {
            store(32 * i, *x);
        }
        // The initial register enters as the first 32 bits of the message.
        let seed = _mm256_zextsi128_si256(_mm_cvtsi32_si128(crc as i32));
        let mut acc = [_mm256_xor_si256(v[0], seed), v[1], v[2], v[3]];
        for b in 1..blocks {
            let at = b * BLOCK;
            for (i, a) in acc.iter_mut().enumerate() {
                let x = load(at + 32 * i);
                store(at + 32 * i, x);
                *a = fold(*a, x);
            }
        }
        // Eight 128-bit lanes, in message order.
        let lanes = |a: __m256i| [_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1)];
        let [a0, a1] = lanes(acc[0]);
        let [b0, b1] = lanes(acc[1]);
        let [c0, c1] = lanes(acc[2]);
        let [d0, d1] = lanes(acc[3]);
        reduce_128([a0, a1, b0, b1, c0, c1, d0, d1])
    }

    /// Folds 128-bit lanes, in message order, into one and reduces it: the CRC register
    /// (not inverted).
    ///
    /// # Safety
    /// The CPU supports PCLMULQDQ and SSE4.1.
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    unsafe fn reduce_128<const N: usize>(lanes: [__m128i; N]) -> u32 {
        let k128 = _mm_set_epi64x(FOLD_128.1, FOLD_128.0);
        let fold128 = |acc: __m128i, next: __m128i| {
            let lo = _mm_clmulepi64_si128(acc, k128, 0x00);
            let hi = _mm_clmulepi64_si128(acc, k128, 0x11);
            _mm_xor_si128(_mm_xor_si128(lo, hi), next)
        };
        let mut x = lanes[0];
        for l in &lanes[1..] {
            x = fold128(x, *l);
        }
        // 128 -> 64 bits (low qword times x^96), then 64 -> 32 (times x^64).
        let t = _mm_clmulepi64_si128(x, k128, 0x10);
        x = _mm_xor_si128(_mm_srli_si128(x, 8), t);
        let low32 = _mm_set_epi32(0, 0, 0, -1);
        let t = _mm_clmulepi64_si128(_mm_and_si128(x, low32), _mm_set_epi64x(0, FOLD_64), 0x00);
        x = _mm_xor_si128(_mm_srli_si128(x, 4), t);
        // Barrett: q = low32(x) * mu, then x ^= low32(q) * P.
        let pm = _mm_set_epi64x(MU, POLY);
        let q = _mm_clmulepi64_si128(_mm_and_si128(x, low32), pm, 0x10);
        let r = _mm_clmulepi64_si128(_mm_and_si128(q, low32), pm, 0x00);
        _mm_extract_epi32(_mm_xor_si128(x, r), 1) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(data: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(data);
        h.finalize()
    }

    /// `(x^n mod P(x))` bit-reflected and shifted left by one, P(x) the CRC-32 polynomial.
    fn fold_constant(n: u32) -> i64 {
        let mut r: u32 = 1;
        for _ in 0..n {
            let top = r & 0x8000_0000 != 0;
            r <<= 1;
            if top {
                r ^= 0x04c1_1db7;
            }
        }
        i64::from(r.reverse_bits()) << 1
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fold_constants() {
        assert_eq!(
            x86::FOLD_1024,
            (fold_constant(1024 + 32), fold_constant(1024 - 32))
        );
        assert_eq!(
            x86::FOLD_128,
            (fold_constant(128 + 32), fold_constant(128 - 32))
        );
        assert_eq!(x86::FOLD_64, fold_constant(64));
        assert_eq!(
            x86::FOLD_2048,
            (fold_constant(2048 + 32), fold_constant(2048 - 32))
        );
        assert_eq!(
            x86::FOLD_512,
            (fold_constant(512 + 32), fold_constant(512 - 32))
        );
    }

    #[test]
    fn copies_and_crcs_every_length_around_the_block() {
        let src: Vec<u8> = (0..1000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..=600 {
            let mut dst = vec![0xa5u8; len];
            // SAFETY: `src` has at least `len` bytes.
            let crc = unsafe { copy_crc32(src.as_ptr(), &mut dst) };
            assert_eq!(dst, src[..len], "copy, len {len}");
            assert_eq!(crc, reference(&src[..len]), "crc, len {len}");
        }
    }

    #[test]
    fn continues_a_crc() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + i / 5) as u8).collect();
        for split in [0, 1, 40, 128, 1000] {
            let (a, b) = data.split_at(split);
            let mut dst = vec![0u8; b.len()];
            // SAFETY: `b` is readable for `dst.len()` bytes.
            let crc = unsafe { copy_crc32_from(reference(a), b.as_ptr(), &mut dst) };
            assert_eq!(dst, b);
            assert_eq!(crc, reference(&data), "split {split}");
        }
    }

    /// The 128-bit path, which runs only on CPUs without VPCLMULQDQ, checked on any CPU
    /// that has PCLMULQDQ: every whole number of blocks up to 40, from unaligned
    /// addresses, continuing a CRC.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_128_bit_path_matches_crc32fast() {
        if !x86::available_128() {
            return;
        }
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 31 + i / 7) as u8).collect();
        for blocks in 1..=40 {
            let len = blocks * x86::BLOCK_128;
            let (before, src) = data[3..].split_at(5);
            let mut dst = vec![0u8; len + 1];
            // SAFETY: the CPU has PCLMULQDQ and SSE4.1; `src` and `dst[1..]` have at least
            // `len` bytes.
            let reg = unsafe {
                x86::fold_copy_128(
                    !reference(before),
                    dst[1..].as_mut_ptr(),
                    src.as_ptr(),
                    blocks,
                )
            };
            assert_eq!(dst[1..], src[..len], "copy, {blocks} blocks");
            assert_eq!(!reg, reference(&data[3..8 + len]), "crc, {blocks} blocks");
        }
    }

    proptest! {
        #[test]
        fn matches_copy_and_crc32fast(data in proptest::collection::vec(any::<u8>(), 0..9000), skew in 0usize..32) {
            // An unaligned source and destination as well.
            let src = &data[skew.min(data.len())..];
            let mut dst = vec![0u8; src.len() + 1];
            // SAFETY: `src` is readable for its length, which is `dst[1..]`'s.
            let crc = unsafe { copy_crc32(src.as_ptr(), &mut dst[1..]) };
            prop_assert_eq!(&dst[1..], src);
            prop_assert_eq!(crc, reference(src));
        }
    }
}
