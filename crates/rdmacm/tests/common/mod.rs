//! Helpers for the tests that run Debian's rdma_cm programs against the built
//! librdmacm.so.1 and libibverbs.so.1: two processes on one host, the server's device on
//! 127.0.6.2 and the client's on 127.0.6.3 (`SOFTHCA_ADDR`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[path = "../../../ibverbs/tests/common/process.rs"]
mod process;
pub use process::{finish, serial, Done};

pub const SERVER: &str = "127.0.6.2";
pub const CLIENT: &str = "127.0.6.3";

/// A built cdylib: in `target/<profile>/deps/` (where `cargo test` leaves it) or one
/// level up (`cargo build`).
fn built_library(file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    let up = deps.parent().unwrap_or(deps);
    let so = deps.join(file);
    if so.exists() {
        so
    } else {
        up.join(file)
    }
}

/// A private directory with `librdmacm.so.1` and `libibverbs.so.1`: the
/// `LD_LIBRARY_PATH` of every program run; `None` (and a SKIP line) when softhca's
/// libibverbs has not been built next to this library.
pub fn lib_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let (cm, verbs) = (built_library("librdmacm.so"), built_library("libibverbs.so"));
        if !cm.exists() || !verbs.exists() {
            eprintln!(
                "SKIP: {} or {} missing (cargo build --release -p softhca-ibverbs -p softhca-rdmacm)",
                cm.display(),
                verbs.display()
            );
            return None;
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("softhca-rdmacm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create lib dir");
        for (so, link) in [(cm, "librdmacm.so.1"), (verbs, "libibverbs.so.1")] {
            let l = dir.join(link);
            let _ = std::fs::remove_file(&l);
            std::os::unix::fs::symlink(so, &l).expect("symlink");
        }
        Some(dir)
    })
    .as_deref()
}

/// Whether `bin` is on PATH; prints why the test is skipped if not.
pub fn have(bin: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false);
    if !found {
        let package = match bin {
            "qperf" => "qperf",
            b if b.starts_with("ib_") => "perftest",
            _ => "rdmacm-utils",
        };
        eprintln!("SKIP: {bin} not installed (apt-get install {package}); test not run");
    }
    found
}

/// A program running on a device with address `addr`, against our libraries.
pub fn cmd(addr: &str, bin: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.args(args).env("SOFTHCA_ADDR", addr);
    with_our_libs(c)
}

/// `c` with our libraries on `LD_LIBRARY_PATH` and its output collected.
pub fn with_our_libs(mut c: Command) -> Command {
    c.env("LD_LIBRARY_PATH", lib_dir().expect("lib dir"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs `server` on 127.0.6.2, waits for it to start, runs `client` on 127.0.6.3 to
/// completion, then waits for the server (or kills it, for daemons, when `server_exits`
/// is false). See [`pair_of`].
pub fn pair(
    server: (&str, &[&str]),
    client: (&str, &[&str]),
    timeout: Duration,
    server_exits: bool,
    retry: bool,
) -> (Done, Done) {
    pair_of(
        || cmd(SERVER, server.0, server.1),
        || cmd(CLIENT, client.0, client.1),
        timeout,
        server_exits,
        retry,
    )
}

/// Starts the server command, waits for it to start, runs the client command to
/// completion, then waits for the server (or kills it, for daemons, when `server_exits`
/// is false). On a loaded machine the server may not listen yet when the client connects
/// (a REJ "invalid service ID"): a client that fails within seconds while the server still
/// runs is started again, up to five times, unless `retry` is false.
pub fn pair_of(
    server: impl Fn() -> Command,
    client: impl Fn() -> Command,
    timeout: Duration,
    server_exits: bool,
    retry: bool,
) -> (Done, Done) {
    let _g = serial();
    let mut s = server().spawn().expect("spawn server");
    std::thread::sleep(Duration::from_millis(1500));
    let mut attempts = 0;
    // What earlier attempts printed goes with the last one's stderr, so that a failure
    // shows why the client was started again.
    let mut earlier = String::new();
    let mut c = loop {
        attempts += 1;
        let start = Instant::now();
        let c = finish(client().spawn().expect("spawn client"), timeout);
        let quick_failure = c.status != Some(0) && start.elapsed() < Duration::from_secs(10);
        let server_running = matches!(s.try_wait(), Ok(None));
        if !(retry && quick_failure && server_running && attempts < 5) {
            break c;
        }
        earlier += &format!("--- attempt {attempts}, started again\n{}", c.all());
        std::thread::sleep(Duration::from_secs(1));
    };
    c.stderr += &earlier;
    let s = finish(
        s,
        if server_exits {
            timeout
        } else {
            Duration::from_millis(500)
        },
    );
    (s, c)
}
