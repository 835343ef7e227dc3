//! Bounds-checked fixed-size access to byte buffers: the only way the crate reads or writes
//! packet bytes, so no input can make it index out of range.

use crate::Error;

/// `buf[at..at + N]` as an array, or `Error::Truncated` naming `what`.
#[inline]
pub(crate) fn array<'a, const N: usize>(
    buf: &'a [u8],
    at: usize,
    what: &'static str,
) -> Result<&'a [u8; N], Error> {
    at.checked_add(N)
        .and_then(|end| buf.get(at..end))
        .and_then(|s| s.try_into().ok())
        .ok_or(Error::Truncated {
            what,
            need: at.saturating_add(N),
            have: buf.len(),
        })
}

/// `&mut buf[at..at + N]` as an array, or `Error::Truncated` naming `what`.
#[inline]
pub(crate) fn array_mut<'a, const N: usize>(
    buf: &'a mut [u8],
    at: usize,
    what: &'static str,
) -> Result<&'a mut [u8; N], Error> {
    let have = buf.len();
    at.checked_add(N)
        .and_then(|end| buf.get_mut(at..end))
        .and_then(|s| s.try_into().ok())
        .ok_or(Error::Truncated {
            what,
            need: at.saturating_add(N),
            have,
        })
}

/// Big-endian 24-bit value from 3 bytes.
#[inline]
pub(crate) const fn u24(b: [u8; 3]) -> u32 {
    ((b[0] as u32) << 16) | ((b[1] as u32) << 8) | b[2] as u32
}

/// The low 24 bits of `v`, big-endian.
#[inline]
pub(crate) const fn put_u24(v: u32) -> [u8; 3] {
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

/// Error unless `v` fits in `bits` bits.
#[inline]
pub(crate) fn check_bits(field: &'static str, v: u64, bits: u8) -> Result<(), Error> {
    if bits < 64 && v >> bits != 0 {
        Err(Error::FieldRange {
            field,
            value: v,
            bits,
        })
    } else {
        Ok(())
    }
}
