//! A device's state, readable from outside its process: what `rdma res show qp` and
//! `rdma statistic` give for a kernel device, for `softhca stat` and `softhca agent`.
//!
//! Each open device listens on a Unix socket in a run directory, named
//! `<pid>-<device>.sock`. A reader connects and gets one JSON [`Snapshot`], taken when it
//! connected; the device never reads what the reader sends, so the socket cannot change
//! anything. Why a socket and not a file rewritten every second: nothing is done until
//! someone asks (no timer, no write, nothing on the datapath), every answer is current,
//! and a process that dies leaves nothing that looks alive (a connect to its socket is
//! refused). Taking a snapshot locks the engine once, as long as copying the counters
//! and one line per QP takes.
//!
//! Which run directory: `SOFTHCA_RUN_DIR` ([`Publish`]); by default the first of
//! `/run/softhca`, `$XDG_RUNTIME_DIR/softhca` and `/tmp/softhca-<uid>` this process may
//! write to. Readers look in all of them ([`Publish::dirs`]). A reader learns the
//! publisher's pid from the kernel (`SO_PEERCRED`), not from the name or the answer,
//! so one process cannot pass itself off as another, and the pid is the one the
//! reader's pid namespace knows (an agent on the host, a process in a container).

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::Error;
use crate::snapshot::Snapshot;

/// Where devices publish their state (`SOFTHCA_RUN_DIR`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Publish {
    /// The first writable of `/run/softhca`, `$XDG_RUNTIME_DIR/softhca`,
    /// `/tmp/softhca-<uid>`.
    #[default]
    Auto,
    /// This directory (created if missing).
    Dir(PathBuf),
    /// Nowhere.
    Off,
}

/// How long a reader waits for a snapshot, and a device for a reader to take it.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

impl Publish {
    /// `off`, `none` or `0`: [`Publish::Off`]; `auto`: [`Publish::Auto`]; else a path.
    pub fn parse(v: &str) -> Publish {
        match v.trim() {
            "off" | "none" | "0" => Publish::Off,
            "auto" | "" => Publish::Auto,
            p => Publish::Dir(PathBuf::from(p)),
        }
    }

    /// The directories a reader looks in, in order.
    pub fn dirs(&self) -> Vec<PathBuf> {
        match self {
            Publish::Off => Vec::new(),
            Publish::Dir(p) => vec![p.clone()],
            Publish::Auto => {
                let mut v = vec![PathBuf::from("/run/softhca")];
                if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
                    v.push(Path::new(&x).join("softhca"));
                }
                // SAFETY: getuid has no preconditions and touches no memory.
                v.push(PathBuf::from(format!("/tmp/softhca-{}", unsafe {
                    libc::getuid()
                })));
                v
            }
        }
    }

    /// The directories a reader looks in: [`Publish::dirs`], and for root in
    /// [`Publish::Auto`] also every user's (`/run/user/*/softhca`, `/tmp/softhca-*`).
    pub fn reader_dirs(&self) -> Vec<PathBuf> {
        let mut v = self.dirs();
        // SAFETY: geteuid has no preconditions and touches no memory.
        if *self == Publish::Auto && unsafe { libc::geteuid() } == 0 {
            let under = |dir: &str, prefix: &str, tail: &str| -> Vec<PathBuf> {
                let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                    .map(|e| e.path().join(tail))
                    .collect();
                found.sort();
                found
            };
            for d in under("/run/user", "", "softhca")
                .into_iter()
                .chain(under("/tmp", "softhca-", ""))
            {
                let d = d.components().collect::<PathBuf>();
                if !v.contains(&d) {
                    v.push(d);
                }
            }
        }
        v
    }

    /// The directory this process publishes in: the first of [`Publish::dirs`] that
    /// exists or can be made, is a real directory (not a link) owned by us or by root,
    /// and we may write.
    fn dir(&self) -> Option<PathBuf> {
        self.dirs().into_iter().find(|d| usable_dir(d))
    }
}

fn usable_dir(d: &Path) -> bool {
    // Shared (`/run/softhca`, made by root): readable by all; per-user ones: ours only.
    let mode = if d.starts_with("/run/softhca") {
        0o755
    } else {
        0o700
    };
    if std::fs::symlink_metadata(d).is_err() {
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(d);
    }
    let Ok(m) = std::fs::symlink_metadata(d) else {
        return false;
    };
    // SAFETY: getuid has no preconditions and touches no memory.
    let uid = unsafe { libc::getuid() };
    let Ok(c) = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: passes a NUL-terminated path that outlives the call.
    let writable = unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0;
    m.is_dir() && (m.uid() == uid || m.uid() == 0) && writable
}

/// Makes a device's [`Snapshot`]; `None` once the device is gone.
pub(crate) type Source = Box<dyn Fn() -> Option<Snapshot> + Send>;

/// A device's published socket; dropping it stops the thread and removes the socket.
pub(crate) struct Publisher {
    path: PathBuf,
    listener: Arc<UnixListener>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Publishes device `name` as `publish` says; `None` (logged) when there is no
    /// usable directory: publishing is a service, never a reason for an open to fail.
    pub(crate) fn start(publish: &Publish, name: &str, source: Source) -> Option<Publisher> {
        let dir = publish.dir()?;
        remove_stale(&dir);
        let (path, listener) = bind_socket(&dir, name)?;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (listener.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("softhca-stat-{name}"))
            .spawn(move || serve(&l, &s, &source))
            .map_err(|e| tracing::debug!("no publication thread: {e}"))
            .ok()?;
        LIVE.lock().push((std::process::id(), path.clone()));
        Some(Publisher {
            path,
            listener,
            stop,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocked accept (it then fails with EINVAL).
        // SAFETY: shuts down a socket we own and keep open; no memory is passed.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
        LIVE.lock().retain(|(_, p)| *p != self.path);
    }
}

/// The sockets of this process's publishers, with the pid that made them, for
/// [`remove_at_exit`].
static LIVE: parking_lot::Mutex<Vec<(u32, PathBuf)>> = parking_lot::Mutex::new(Vec::new());

/// Removes this process's sockets when it exits with devices still open (a program
/// that never closes its device): no reader then has to tell them from live ones.
pub(crate) fn remove_at_exit() {
    // A forked child that exits runs its parent's atexit handlers: the sockets are
    // still the parent's.
    let me = std::process::id();
    if let Some(live) = LIVE.try_lock() {
        for (_, p) in live.iter().filter(|(pid, _)| *pid == me) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `<pid>-<name>.sock` in `dir` (`-2`, `-3`, … for a second device of the same name).
fn bind_socket(dir: &Path, name: &str) -> Option<(PathBuf, UnixListener)> {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let pid = std::process::id();
    for k in 1..100 {
        let file = match k {
            1 => format!("{pid}-{safe}.sock"),
            _ => format!("{pid}-{safe}-{k}.sock"),
        };
        let path = dir.join(file);
        match UnixListener::bind(&path) {
            Ok(l) => {
                let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
                return Some((path, l));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                // A socket left by an earlier process with our pid (pid reuse).
                if UnixStream::connect(&path).is_err() && std::fs::remove_file(&path).is_ok() {
                    if let Ok(l) = UnixListener::bind(&path) {
                        return Some((path, l));
                    }
                }
            }
            Err(e) => {
                tracing::debug!("not publishing {name} in {}: {e}", dir.display());
                return None;
            }
        }
    }
    None
}

/// Removes sockets of ours nobody listens on any more (a process that was killed),
/// once per directory and process.
fn remove_stale(dir: &Path) {
    static DONE: parking_lot::Mutex<Vec<PathBuf>> = parking_lot::Mutex::new(Vec::new());
    let mut done = DONE.lock();
    if done.iter().any(|d| d == dir) {
        return;
    }
    done.push(dir.to_path_buf());
    // SAFETY: getuid has no preconditions and touches no memory.
    let uid = unsafe { libc::getuid() };
    for path in socket_paths(dir) {
        // A process this pid namespace sees alive is left alone (no probe, so it does
        // not take a snapshot for nothing); one it does not see is dead, or lives in
        // another pid namespace: the probe tells which.
        let pid = socket_pid(&path);
        if pid.is_some_and(|p| Path::new("/proc").join(p.to_string()).exists()) {
            continue;
        }
        // A socket made this very moment is refused too, until its owner listens.
        let old = |m: &std::fs::Metadata| {
            m.modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(2))
        };
        let mine = std::fs::symlink_metadata(&path).is_ok_and(|m| m.uid() == uid && old(&m));
        if mine
            && matches!(UnixStream::connect(&path),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Answers each connection with one snapshot until told to stop.
fn serve(listener: &UnixListener, stop: &AtomicBool, source: &Source) {
    loop {
        let conn = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok((conn, _)) = conn else {
            // e.g. out of file descriptors: try again a little later.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let Some(snapshot) = source() else { return };
        let Ok(json) = serde_json::to_vec(&snapshot) else {
            continue;
        };
        send_all(&conn, &json);
    }
}

/// Writes `buf` with `MSG_NOSIGNAL`: a reader that left must not kill a C program that
/// has SIGPIPE at its default (the drop-in library's hosts).
fn send_all(conn: &UnixStream, mut buf: &[u8]) {
    let _ = conn.set_write_timeout(Some(IO_TIMEOUT));
    while !buf.is_empty() {
        // SAFETY: sends from a live buffer of the given length on a socket we own.
        let n = unsafe {
            libc::send(
                conn.as_raw_fd(),
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        match usize::try_from(n) {
            Ok(n) if n > 0 => buf = &buf[n..],
            _ => return,
        }
    }
}

/// The `*.sock` entries of `dir`, sorted.
fn socket_paths(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    v.sort();
    v
}

/// Reads the snapshot the device behind socket `path` publishes, with the publisher's
/// pid from the kernel.
pub fn read_snapshot(path: &Path) -> Result<Snapshot, Error> {
    let os = |what: &'static str| move |source| Error::Os { what, source };
    let mut conn = UnixStream::connect(path).map_err(os("connect to a published device"))?;
    conn.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(os("SO_RCVTIMEO"))?;
    let pid = peer_pid(&conn).map_err(os("SO_PEERCRED"))?;
    let mut buf = Vec::new();
    conn.read_to_end(&mut buf)
        .map_err(os("read a published snapshot"))?;
    let mut s: Snapshot = serde_json::from_slice(&buf).map_err(|e| {
        Error::Config(format!(
            "{}: not a softhca device snapshot ({e})",
            path.display()
        ))
    })?;
    s.pid = pid;
    s.key = socket_key(path).unwrap_or_else(|| s.device.name.clone());
    Ok(s)
}

/// `1234` from `…/1234-softhca0-2.sock`.
fn socket_pid(path: &Path) -> Option<u32> {
    path.file_stem()?.to_str()?.split_once('-')?.0.parse().ok()
}

/// `softhca0-2` from `…/1234-softhca0-2.sock`.
fn socket_key(path: &Path) -> Option<String> {
    let stem = path.file_stem()?.to_str()?;
    let (pid, key) = stem.split_once('-')?;
    pid.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| key.to_string())
}

fn peer_pid(conn: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are live and `len` is `cred`'s exact size.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.pid as u32)
}

/// The snapshots of every device published in `dirs` and in their subdirectories (one
/// level: a directory per pod under a node's run directory), each directory once, by
/// pid then key. Sockets nobody answers on (a process that was killed) are skipped.
pub fn read_all(dirs: &[PathBuf]) -> Vec<Snapshot> {
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut out: Vec<Snapshot> = Vec::new();
    for dir in dirs {
        let subdirs = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path());
        for d in std::iter::once(dir.clone()).chain(subdirs) {
            let Ok(real) = std::fs::canonicalize(&d) else {
                continue;
            };
            if seen.contains(&real) {
                continue;
            }
            seen.push(real.clone());
            out.extend(socket_paths(&real).iter().filter_map(|p| {
                read_snapshot(p)
                    .map_err(|e| tracing::debug!("{}: {e}", p.display()))
                    .ok()
            }));
        }
    }
    out.sort_by(|a, b| (a.pid, &a.key).cmp(&(b.pid, &b.key)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{command_name, DeviceSnapshot};
    use std::collections::BTreeMap;

    #[test]
    fn parse_and_dirs() {
        assert_eq!(Publish::parse("off"), Publish::Off);
        assert_eq!(Publish::parse("auto"), Publish::Auto);
        assert_eq!(Publish::parse("/x/y"), Publish::Dir(PathBuf::from("/x/y")));
        assert!(Publish::Off.dirs().is_empty());
        let auto = Publish::Auto.dirs();
        assert_eq!(auto[0], PathBuf::from("/run/softhca"));
        assert!(auto
            .last()
            .unwrap()
            .to_string_lossy()
            .starts_with("/tmp/softhca-"));
    }

    #[test]
    fn a_reader_gets_the_snapshot_and_the_socket_goes_with_the_publisher() {
        let parent = std::env::temp_dir().join(format!("softhca-publish-{}", std::process::id()));
        let dir = parent.join("pod");
        let source: Source = Box::new(|| {
            Some(Snapshot {
                pid: 0,
                command: command_name(),
                key: String::new(),
                taken_ms: 1,
                device: DeviceSnapshot {
                    name: "t0".into(),
                    fw_ver: "x".into(),
                    node_guid: "g".into(),
                    sys_image_guid: "g".into(),
                    vendor_id: 1,
                    phys_port_cnt: 1,
                    port_state: "PORT_ACTIVE".into(),
                    max_mtu: 4096,
                    active_mtu: 1024,
                    link_layer: "Ethernet".into(),
                    gids: Vec::new(),
                    udp_port: 4791,
                    netdev: None,
                    cpu: None,
                    poll: "busy".into(),
                    gso: true,
                    gro: false,
                },
                qps: Vec::new(),
                counters: BTreeMap::from([("rdma_sends".to_string(), 7)]),
            })
        });
        let p = Publisher::start(&Publish::Dir(dir.clone()), "t0/x", source).unwrap();
        let path = p.path().to_path_buf();
        assert!(path.ends_with(format!("{}-t0_x.sock", std::process::id())));
        let all = read_all(&[dir.clone(), dir.clone()]);
        assert_eq!(all.len(), 1, "one device, the directory read once");
        assert!(
            read_all(std::slice::from_ref(&parent))
                .iter()
                .any(|s| s.pid == std::process::id() && s.key == "t0_x"),
            "found one level down"
        );
        assert_eq!(all[0].pid, std::process::id());
        assert_eq!(all[0].counters["rdma_sends"], 7);
        assert_eq!(all[0].key, "t0_x");
        // A reader that connects and leaves at once harms nothing.
        drop(UnixStream::connect(&path).unwrap());
        assert_eq!(read_snapshot(&path).unwrap().device.active_mtu, 1024);
        drop(p);
        assert!(!path.exists(), "socket removed");
        assert!(read_all(std::slice::from_ref(&dir)).is_empty());
        let _ = std::fs::remove_dir(&dir);
        let _ = std::fs::remove_dir(&parent);
    }
}
