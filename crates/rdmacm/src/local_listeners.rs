//! Wildcard listeners of the other processes on this host, so that a connection to a
//! local address reaches one of them.
//!
//! With the kernel's rdma_cm every process shares the host's devices, and a connection
//! to any local address (127.0.0.1, the host's own) reaches a listener bound to the
//! wildcard in whichever process it is. A softhca device is a process's own, serving
//! the addresses it took when it opened: when a client opens its device before the
//! server does (qperf's server opens one per test, after the client asked for it), the
//! client holds 127.0.0.1 and the server a free loopback address, and the client's REQ
//! to 127.0.0.1 reaches the client itself. So each wildcard listener is written down
//! here (the address its device serves on loopback, its process, its network namespace)
//! and a connection to an address of the connecting process's own device, on a port
//! that process does not listen on, goes to such a listener instead, as on one kernel.
//!
//! One file per listener in a directory private to the user: `<netns>-<ps>-<port>-<pid>`
//! holding the address. A file whose process is gone is ignored (and removed).

use std::net::IpAddr;
use std::path::PathBuf;

/// The directory: `$XDG_RUNTIME_DIR/softhca-rdmacm`, else `/tmp/softhca-rdmacm-<uid>`,
/// made private to the user; None when neither can be made.
fn dir() -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: plain syscall.
    let uid = unsafe { libc::getuid() };
    let mut candidates = Vec::new();
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        candidates.push(PathBuf::from(x).join("softhca-rdmacm"));
    }
    candidates.push(std::env::temp_dir().join(format!("softhca-rdmacm-{uid}")));
    candidates.into_iter().find(|d| {
        let _ = std::fs::DirBuilder::new().mode(0o700).create(d);
        // Another user's directory of that name is not ours to trust.
        std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid)
    })
}

/// This process's network namespace (the inode of `/proc/self/ns/net`): listeners of
/// another namespace are on other addresses.
fn netns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino())
}

fn pid() -> u32 {
    std::process::id()
}

fn alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(p, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

fn name(ns: u64, ps: u16, port: u16, pid: u32) -> String {
    format!("{ns}-{ps}-{port}-{pid}")
}

/// Writes down this process's wildcard listener on (`ps`, `port`), reachable at `ip`.
pub(crate) fn publish(ps: u16, port: u16, ip: IpAddr) {
    let Some(d) = dir() else { return };
    let path = d.join(name(netns(), ps, port, pid()));
    let tmp = d.join(format!(".{}", name(netns(), ps, port, pid())));
    // Written whole then renamed: a reader never sees half an address.
    if std::fs::write(&tmp, ip.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

/// Removes what [`publish`] wrote for (`ps`, `port`).
pub(crate) fn withdraw(ps: u16, port: u16) {
    if let Some(d) = dir() {
        let _ = std::fs::remove_file(d.join(name(netns(), ps, port, pid())));
    }
}

/// The address of another live process's wildcard listener on (`ps`, `port`) in this
/// network namespace, of `ip`'s family.
pub(crate) fn find(ps: u16, port: u16, family_of: IpAddr) -> Option<IpAddr> {
    let d = dir()?;
    let prefix = format!("{}-{ps}-{port}-", netns());
    let mut found = None;
    for e in std::fs::read_dir(&d).ok()?.flatten() {
        let file = e.file_name();
        let Some(owner) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if owner == pid() {
            continue;
        }
        if !alive(owner) {
            let _ = std::fs::remove_file(e.path());
            continue;
        }
        let ip = std::fs::read_to_string(e.path())
            .ok()
            .and_then(|s| s.trim().parse::<IpAddr>().ok());
        if let Some(ip) = ip.filter(|ip| ip.is_ipv4() == family_of.is_ipv4()) {
            found = Some(ip);
            break;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_listener_is_not_found_and_a_dead_ones_file_is_removed() {
        let port = 40_000 + (pid() % 20_000) as u16;
        let ip: IpAddr = "127.0.0.9".parse().unwrap();
        publish(0x106, port, ip);
        assert_eq!(
            find(0x106, port, ip),
            None,
            "our own listener is not another's"
        );
        withdraw(0x106, port);
        // A listener of a process that is gone (pid 0x7fff_fff0 is never live).
        let d = dir().unwrap();
        let stale = d.join(name(netns(), 0x106, port, 0x7fff_fff0));
        std::fs::write(&stale, "127.0.0.9").unwrap();
        assert_eq!(find(0x106, port, ip), None);
        assert!(!stale.exists());
        // A live one (this test's parent process stands in for another process).
        // SAFETY: plain syscall.
        let parent = unsafe { libc::getppid() } as u32;
        let live = d.join(name(netns(), 0x106, port, parent));
        std::fs::write(&live, "127.0.0.9").unwrap();
        assert_eq!(find(0x106, port, ip), Some(ip));
        assert_eq!(find(0x106, port, "::1".parse().unwrap()), None);
        std::fs::remove_file(live).unwrap();
    }
}
