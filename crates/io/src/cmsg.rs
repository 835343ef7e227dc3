//! Control-message (ancillary data) encoding and decoding for `sendmsg`/`recvmsg`.
//!
//! We write and read `cmsghdr`s by hand at `CMSG_SPACE`-aligned offsets in an 8-byte
//! aligned buffer; data is accessed with unaligned reads/writes so no reference to a
//! possibly misaligned value is ever made.

use std::mem::size_of;
use std::ptr;

/// A control buffer aligned like `cmsghdr` (8 bytes on 64-bit Linux).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(crate) struct CmsgBuf<const N: usize>(pub(crate) [u8; N]);

impl<const N: usize> CmsgBuf<N> {
    pub(crate) const fn zeroed() -> Self {
        CmsgBuf([0; N])
    }
}

/// Send side: UDP_SEGMENT (u16 data, 24 B with header) + IPV6_PKTINFO (40 B) + IP_TOS /
/// IPV6_TCLASS (int, 24 B) = 88 B.
pub(crate) const SEND_CMSG_LEN: usize = 88;
/// Receive side: IPV6_PKTINFO (40 B) + UDP_GRO (24 B) + IP_TOS / IPV6_TCLASS (24 B) = 88 B,
/// with room for one unexpected message so none is cut off (MSG_CTRUNC).
pub(crate) const RECV_CMSG_LEN: usize = 128;

/// `CMSG_SPACE(len)`.
pub(crate) fn space(len: usize) -> usize {
    // SAFETY: CMSG_SPACE is pure arithmetic.
    unsafe { libc::CMSG_SPACE(len as u32) as usize }
}

/// Appends one control message at byte `offset` of `buf`, returning the offset of the
/// next one, or `None` (nothing written) when it does not fit.
pub(crate) fn push<T: Copy, const N: usize>(
    buf: &mut CmsgBuf<N>,
    offset: usize,
    level: libc::c_int,
    ty: libc::c_int,
    value: T,
) -> Option<usize> {
    let next = offset.checked_add(space(size_of::<T>()))?;
    if next > N || offset & (std::mem::align_of::<libc::cmsghdr>() - 1) != 0 {
        return None;
    }
    // SAFETY: `offset..next` lies inside `buf` (checked above) and `offset` is a multiple of
    // cmsghdr's alignment inside an 8-aligned buffer, so the header write is aligned and in
    // bounds; CMSG_DATA points `CMSG_LEN(0)` bytes after the header, and CMSG_SPACE covers the
    // header plus `size_of::<T>()`, so the unaligned data write stays in bounds too.
    unsafe {
        let hdr = buf.0.as_mut_ptr().add(offset) as *mut libc::cmsghdr;
        ptr::write(
            hdr,
            libc::cmsghdr {
                cmsg_len: libc::CMSG_LEN(size_of::<T>() as u32) as _,
                cmsg_level: level,
                cmsg_type: ty,
            },
        );
        ptr::write_unaligned(libc::CMSG_DATA(hdr) as *mut T, value);
    }
    Some(next)
}

/// One received control message: its level, type and data bytes.
pub(crate) struct Cmsg<'a> {
    pub(crate) level: libc::c_int,
    pub(crate) ty: libc::c_int,
    pub(crate) data: &'a [u8],
}

impl Cmsg<'_> {
    /// Reads the data as a `T` when it is at least that large.
    pub(crate) fn read<T: Copy>(&self) -> Option<T> {
        if self.data.len() < size_of::<T>() {
            return None;
        }
        // SAFETY: length checked above; read_unaligned tolerates any alignment and the
        // callers only use plain-old-data types valid for every bit pattern.
        Some(unsafe { ptr::read_unaligned(self.data.as_ptr() as *const T) })
    }
}

/// Iterates the control messages the kernel wrote into the first `len` bytes of `buf`.
/// Malformed lengths end the iteration instead of reading out of bounds.
pub(crate) fn iter<const N: usize>(buf: &CmsgBuf<N>, len: usize) -> impl Iterator<Item = Cmsg<'_>> {
    let bytes = &buf.0[..len.min(N)];
    let hdr_len = size_of::<libc::cmsghdr>();
    // SAFETY: CMSG_LEN(0) is pure arithmetic (header size rounded to alignment).
    let data_off = unsafe { libc::CMSG_LEN(0) as usize };
    let mut offset = 0usize;
    std::iter::from_fn(move || {
        if offset.checked_add(hdr_len)? > bytes.len() {
            return None;
        }
        // SAFETY: `offset + hdr_len <= bytes.len()` and `offset` is always a multiple of 8 in
        // an 8-aligned buffer (start 0, then advanced by CMSG_SPACE-rounded amounts), so the
        // header read is aligned and in bounds.
        let hdr = unsafe { ptr::read(bytes.as_ptr().add(offset) as *const libc::cmsghdr) };
        let clen = hdr.cmsg_len as usize;
        if clen < data_off || offset.checked_add(clen)? > bytes.len() {
            return None;
        }
        let data = &bytes[offset + data_off..offset + clen];
        let step = space(clen - data_off);
        offset = offset.saturating_add(step);
        Some(Cmsg {
            level: hdr.cmsg_level,
            ty: hdr.cmsg_type,
            data,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_then_iter_round_trips() {
        let mut buf = CmsgBuf::<SEND_CMSG_LEN>::zeroed();
        let o = push(&mut buf, 0, libc::SOL_UDP, libc::UDP_SEGMENT, 1400u16).unwrap();
        assert_eq!(o, 24);
        let pi = libc::in6_pktinfo {
            ipi6_addr: libc::in6_addr { s6_addr: [7; 16] },
            ipi6_ifindex: 3,
        };
        let o = push(&mut buf, o, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, pi).unwrap();
        assert_eq!(o, 64);
        let o = push(
            &mut buf,
            o,
            libc::IPPROTO_IPV6,
            libc::IPV6_TCLASS,
            0x20 as libc::c_int,
        );
        let o = o.unwrap();
        assert_eq!(o, SEND_CMSG_LEN, "all three fill the send buffer");
        assert!(push(&mut buf, o, libc::SOL_UDP, libc::UDP_SEGMENT, 1u16).is_none());
        let got: Vec<_> = iter(&buf, o).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[2].read::<libc::c_int>(), Some(0x20));
        assert_eq!(got[0].read::<u16>(), Some(1400));
        assert_eq!(
            (got[1].level, got[1].ty),
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
        );
        let back: libc::in6_pktinfo = got[1].read().unwrap();
        assert_eq!(back.ipi6_addr.s6_addr, [7; 16]);
        assert_eq!(back.ipi6_ifindex, 3);
    }

    #[test]
    fn iter_stops_on_garbage() {
        let mut buf = CmsgBuf::<32>::zeroed();
        buf.0[0] = 0xff; // cmsg_len far beyond the buffer
        assert_eq!(iter(&buf, 32).count(), 0);
        let buf = CmsgBuf::<32>::zeroed(); // cmsg_len 0 < header
        assert_eq!(iter(&buf, 32).count(), 0);
        assert_eq!(iter(&buf, 0).count(), 0);
    }
}
