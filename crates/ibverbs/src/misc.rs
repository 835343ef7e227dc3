//! Pure helpers: the `*_str` functions, rate conversions, fork support, sysfs paths and
//! the kernel-ABI struct copies.

use std::ffi::{c_char, c_int, c_void};

use crate::abi::*;

macro_rules! cstr {
    ($s:literal) => {
        concat!($s, "\0").as_ptr() as *const c_char
    };
}

pub(crate) unsafe extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    match status {
        0 => cstr!("success"),
        1 => cstr!("local length error"),
        2 => cstr!("local QP operation error"),
        3 => cstr!("local EE context operation error"),
        4 => cstr!("local protection error"),
        5 => cstr!("Work Request Flushed Error"),
        6 => cstr!("memory management operation error"),
        7 => cstr!("bad response error"),
        8 => cstr!("local access error"),
        9 => cstr!("remote invalid request error"),
        10 => cstr!("remote access error"),
        11 => cstr!("remote operation error"),
        12 => cstr!("transport retry counter exceeded"),
        13 => cstr!("RNR retry counter exceeded"),
        14 => cstr!("local RDD violation error"),
        15 => cstr!("remote invalid RD request"),
        16 => cstr!("aborted error"),
        17 => cstr!("invalid EE context number"),
        18 => cstr!("invalid EE context state"),
        19 => cstr!("fatal error"),
        20 => cstr!("response timeout error"),
        21 => cstr!("general error"),
        22 => cstr!("TM error"),
        23 => cstr!("TM Rendezvous error"),
        _ => cstr!("unknown"),
    }
}

pub(crate) unsafe extern "C" fn ibv_node_type_str(t: c_int) -> *const c_char {
    match t {
        1 => cstr!("InfiniBand channel adapter"),
        2 => cstr!("InfiniBand switch"),
        3 => cstr!("InfiniBand router"),
        4 => cstr!("iWARP NIC"),
        5 => cstr!("usNIC"),
        6 => cstr!("usNIC UDP"),
        7 => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}

pub(crate) unsafe extern "C" fn ibv_port_state_str(s: u32) -> *const c_char {
    match s {
        0 => cstr!("no state change (NOP)"),
        1 => cstr!("down"),
        2 => cstr!("init"),
        3 => cstr!("armed"),
        4 => cstr!("active"),
        5 => cstr!("active defer"),
        _ => cstr!("unknown"),
    }
}

pub(crate) unsafe extern "C" fn ibv_event_type_str(e: u32) -> *const c_char {
    match e {
        0 => cstr!("CQ error"),
        1 => cstr!("local work queue catastrophic error"),
        2 => cstr!("invalid request local work queue error"),
        3 => cstr!("local access violation work queue error"),
        4 => cstr!("communication established"),
        5 => cstr!("send queue drained"),
        6 => cstr!("path migrated"),
        7 => cstr!("path migration request error"),
        8 => cstr!("local catastrophic error"),
        9 => cstr!("port active"),
        10 => cstr!("port error"),
        11 => cstr!("LID change"),
        12 => cstr!("P_Key change"),
        13 => cstr!("SM change"),
        14 => cstr!("SRQ catastrophic error"),
        15 => cstr!("SRQ limit reached"),
        16 => cstr!("last WQE reached"),
        17 => cstr!("client reregistration"),
        18 => cstr!("GID table change"),
        19 => cstr!("WQ fatal"),
        _ => cstr!("unknown"),
    }
}

/// `enum ibv_rate` → (multiple of 2.5 Gb/s, Mb/s).
const RATES: &[(c_int, c_int, c_int)] = &[
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, -1, 28125),
    (20, -1, 53125),
    (21, -1, 425000),
    (22, -1, 637500),
    (23, -1, 850000),
    (24, -1, 1275000),
];

pub(crate) unsafe extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate)
        .map(|r| r.1)
        .unwrap_or(-1)
}

pub(crate) unsafe extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map(|r| r.0)
        .unwrap_or(0)
}

pub(crate) unsafe extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map(|r| r.2).unwrap_or(0)
}

pub(crate) unsafe extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map(|r| r.0).unwrap_or(0)
}

/// softhca never hands registered memory to a kernel driver, so a child of `fork()`
/// cannot corrupt it: fork support is always on.
pub(crate) unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `IBV_FORK_UNNEEDED` (2): fork is safe without `ibv_fork_init`.
pub(crate) unsafe extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

pub(crate) unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

pub(crate) unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_get_sysfs_path`: `$SYSFS_PATH` without its trailing slashes, as libibverbs
/// reads it (only when not running set-uid), else `/sys`. Read once; the string lives
/// as long as the process, as libibverbs' does.
pub(crate) unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        // SAFETY: getuid and geteuid have no preconditions.
        let same = unsafe { libc::getuid() == libc::geteuid() };
        std::env::var_os("SYSFS_PATH")
            .filter(|_| same)
            .map(|v| {
                let b = std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()).to_vec();
                let end = b.iter().rposition(|&c| c != b'/').map_or(0, |i| i + 1);
                b[..end].to_vec()
            })
            .and_then(|b| std::ffi::CString::new(b).ok())
            .unwrap_or_else(|| std::ffi::CString::from(c"/sys"))
    })
    .as_ptr()
}

/// `struct ib_uverbs_ah_attr` (kernel uAPI) layout.
#[repr(C)]
pub(crate) struct KernAhAttr {
    dgid: [u8; 16],
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
    reserved: u8,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
    reserved2: u8,
}

pub(crate) unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *const KernAhAttr,
) {
    // SAFETY: the caller's structs (librdmacm passes both).
    let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
        return;
    };
    *d = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: s.dgid },
            flow_label: s.flow_label,
            sgid_index: s.sgid_index,
            hop_limit: s.hop_limit,
            traffic_class: s.traffic_class,
        },
        dlid: s.dlid,
        sl: s.sl,
        src_path_bits: s.src_path_bits,
        static_rate: s.static_rate,
        is_global: s.is_global,
        port_num: s.port_num,
    };
}
