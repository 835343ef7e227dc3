//! Bounds-checked access to the 256-byte MAD and to private data: the only way this crate
//! reads or writes message bytes, so no input can make it index out of range.

use crate::CmError;

/// `buf[at..at + N]` as an array, or `CmError::Truncated`.
#[inline]
pub(crate) fn array<const N: usize>(buf: &[u8], at: usize) -> Result<[u8; N], CmError> {
    at.checked_add(N)
        .and_then(|end| buf.get(at..end))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(CmError::Truncated {
            need: at.saturating_add(N),
            have: buf.len(),
        })
}

/// Copy `src` into `buf[at..at + src.len()]`, or `CmError::Truncated`.
#[inline]
pub(crate) fn put(buf: &mut [u8], at: usize, src: &[u8]) -> Result<(), CmError> {
    let have = buf.len();
    let dst = at
        .checked_add(src.len())
        .and_then(|end| buf.get_mut(at..end))
        .ok_or(CmError::Truncated {
            need: at.saturating_add(src.len()),
            have,
        })?;
    dst.copy_from_slice(src);
    Ok(())
}

#[inline]
pub(crate) fn u8_at(buf: &[u8], at: usize) -> Result<u8, CmError> {
    Ok(array::<1>(buf, at)?[0])
}

#[inline]
pub(crate) fn u16_at(buf: &[u8], at: usize) -> Result<u16, CmError> {
    Ok(u16::from_be_bytes(array(buf, at)?))
}

#[inline]
pub(crate) fn u32_at(buf: &[u8], at: usize) -> Result<u32, CmError> {
    Ok(u32::from_be_bytes(array(buf, at)?))
}

#[inline]
pub(crate) fn u64_at(buf: &[u8], at: usize) -> Result<u64, CmError> {
    Ok(u64::from_be_bytes(array(buf, at)?))
}

/// The top 24 bits of the big-endian word at `at` (IBTA's `FIELD32_LOC(off, 24)`: QPN, PSN, EECN).
#[inline]
pub(crate) fn u24_at(buf: &[u8], at: usize) -> Result<u32, CmError> {
    Ok(u32_at(buf, at)? >> 8)
}

/// Error unless `v` fits in `bits` bits.
#[inline]
pub(crate) fn check_bits(field: &'static str, v: u32, bits: u8) -> Result<(), CmError> {
    if bits < 32 && v >> bits != 0 {
        Err(CmError::FieldRange {
            field,
            value: v,
            bits,
        })
    } else {
        Ok(())
    }
}
