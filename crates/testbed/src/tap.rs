//! Tap devices: `/dev/net/tun` with `IFF_TAP | IFF_NO_PI`, so a read returns exactly one
//! Ethernet frame and a write injects one. No `IFF_VNET_HDR` and no `TUNSETOFFLOAD`: the
//! kernel segments GSO batches and fills in checksums before a frame reaches us.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Opens (creating) the non-persistent tap `name`; it disappears when the fd is closed.
pub(crate) fn open(name: &str) -> io::Result<OwnedFd> {
    let path = CString::new("/dev/net/tun").map_err(io::Error::other)?;
    // SAFETY: `path` is a valid NUL-terminated string; open has no other preconditions.
    let raw = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a freshly opened descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= ifr.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "tap name too long",
        ));
    }
    for (d, &s) in ifr.ifr_name.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one `ifreq`, which `ifr` is and which lives
    // across the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}
