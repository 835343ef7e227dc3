//! Helpers shared by the tests that run real rdma-core / perftest binaries against the
//! built library.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod process;
pub use process::{finish, serial, Done};

/// A built cdylib (`libibverbs.so`, `librdmacm.so`): next to the test executable
/// (`target/<profile>/deps/`) or one level up.
fn built_library(file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    for dir in [deps.clone(), deps.parent().unwrap_or(&deps).to_path_buf()] {
        let so = dir.join(file);
        if so.exists() {
            return so;
        }
    }
    panic!("{file} not found next to {}", exe.display());
}

/// A private directory (under the target directory, cargo's scratch space for tests: the
/// links outlive the test process) with `<lib>.so.1` -> each built `<lib>.so`.
fn link_dir(tag: &str, libs: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("softhca-{tag}-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp lib dir");
    for lib in libs {
        let link = dir.join(format!("{lib}.so.1"));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(built_library(&format!("{lib}.so")), &link)
            .expect("symlink the built library");
    }
    dir
}

/// A private directory with `libibverbs.so.1` -> the built library: what goes into
/// `LD_LIBRARY_PATH`.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| link_dir("ibverbs", &["libibverbs"]))
}

/// [`lib_dir`] plus softhca's `librdmacm.so.1` (a dev-dependency, so always built): for
/// programs that connect through rdma_cm, as libfabric's verbs provider does.
pub fn lib_dir_with_rdmacm() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| link_dir("ibverbs-rdmacm", &["libibverbs", "librdmacm"]))
}

/// Whether `bin` is on PATH; prints why the test is skipped if not.
pub fn have(bin: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false);
    if !found {
        let package = match bin {
            "tshark" => "tshark",
            b if b.starts_with("fi_") => "libfabric-bin",
            b if b.starts_with("ib_") && !b.starts_with("ibv_") => "perftest",
            b if b.starts_with("ucx_") => "ucx-utils",
            "mpicc" => "libopenmpi-dev",
            "mpirun" => "openmpi-bin",
            _ => "ibverbs-utils",
        };
        eprintln!("SKIP: {bin} not installed (apt-get install {package}); test not run");
    }
    found
}

/// A command running against our library.
pub fn cmd(bin: &str) -> Command {
    let mut c = Command::new(bin);
    c.env("LD_LIBRARY_PATH", lib_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A TCP port nobody listens on right now (the kernel's choice for an ephemeral bind).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// Whether something listens on TCP `port` (IPv4 or IPv6), from /proc/net/tcp*. Probing
/// with a connection would consume the pingpong server's single accept.
pub fn listening(port: u16) -> bool {
    listening_in("/proc/net", port)
}

/// [`listening`] in the network namespace of process `pid` (its `/proc/<pid>/net`).
pub fn listening_in_netns_of(pid: u32, port: u16) -> bool {
    listening_in(&format!("/proc/{pid}/net"), port)
}

fn listening_in(net: &str, port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("{net}/{f}"))
            .map(|s| {
                s.lines().skip(1).any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.len() > 3
                        && format!("{} ", &cols[1][cols[1].len() - 5..]) == want
                        && cols[3] == "0A"
                })
            })
            .unwrap_or(false)
    })
}

/// Runs `bin args... -p <port>` as server, waits until it listens, then the client with
/// the same arguments plus `127.0.0.1`. Returns (server, client).
pub fn pair(bin: &str, args: &[&str], timeout: Duration) -> (Done, Done) {
    pair_with(&[], bin, args, timeout)
}

/// [`pair`] with the server started under `wrapper` (e.g. valgrind and its options).
pub fn pair_with(wrapper: &[&str], bin: &str, args: &[&str], timeout: Duration) -> (Done, Done) {
    let _g = serial();
    let port = free_port().to_string();
    let mut sargs: Vec<&str> = args.to_vec();
    sargs.extend(["-p", &port]);
    let server = match wrapper.split_first() {
        Some((w, wargs)) => cmd(w).args(wargs).arg(bin).args(&sargs).spawn(),
        None => cmd(bin).args(&sargs).spawn(),
    }
    .expect("spawn server");
    let start = Instant::now();
    while !listening(port.parse().unwrap_or(0)) && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut cargs = sargs.clone();
    cargs.push("127.0.0.1");
    let client = cmd(bin).args(&cargs).spawn().expect("spawn client");
    let c = finish(client, timeout);
    let s = finish(server, timeout);
    (s, c)
}

/// Runs one command to completion.
pub fn run(bin: &str, args: &[&str]) -> Output {
    cmd(bin).args(args).output().expect("run")
}

/// Fewer iterations in debug builds (the whole softhca stack is unoptimised there).
pub fn iters(release: u32) -> String {
    if cfg!(debug_assertions) {
        (release / 10).max(10).to_string()
    } else {
        release.to_string()
    }
}

/// Compiles a C test program against the system's `<infiniband/verbs.h>` and
/// libibverbs, as any program is built; `None` (and a SKIP line) without
/// libibverbs-dev.
pub fn compile_c(src: &Path, name: &str) -> Option<PathBuf> {
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("SKIP: libibverbs-dev not installed (apt-get install libibverbs-dev)");
        return None;
    }
    let out = std::env::temp_dir().join(format!("softhca-{name}-{}", std::process::id()));
    let st = Command::new("cc")
        .args([
            "-O1",
            "-g",
            "-Wall",
            "-Werror",
            "-std=gnu11",
            "-pthread",
            "-o",
        ])
        .arg(&out)
        .arg(src)
        .arg("-libverbs")
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling {}", src.display());
    Some(out)
}

/// The node UCX looks for before it will use a verbs device: `/dev/infiniband/` + the
/// device's `dev_name` must be a character device it can read and write.
pub const UCX_DEVICE_NODE: &str = "/dev/infiniband/uverbs-softhca0";

/// The one setup command the README gives for UCX (root, once per boot).
pub const UCX_SETUP: &str =
    "sudo sh -c 'mkdir -p /dev/infiniband && ln -sfn /dev/null /dev/infiniband/uverbs-softhca0'";

/// Whether UCX will list softhca0 (its device node is there); prints why the test is
/// skipped if not.
pub fn ucx_device_node() -> bool {
    use std::os::unix::fs::FileTypeExt;
    let ok = std::fs::metadata(UCX_DEVICE_NODE)
        .map(|m| m.file_type().is_char_device())
        .unwrap_or(false)
        && std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(UCX_DEVICE_NODE)
            .is_ok();
    if !ok {
        eprintln!("SKIP: {UCX_DEVICE_NODE} missing (UCX skips the device): run {UCX_SETUP}");
    }
    ok
}

/// The values of counter `name` in the `SOFTHCA_STATS` lines of `stderr` (one per
/// device closed or still open at exit). Processes sharing one stderr (mpirun's ranks)
/// can write their lines into each other, so each line is found by its prefix.
pub fn stat_values(stderr: &str, name: &str) -> Vec<u64> {
    let key = format!("{name}=");
    stderr
        .split("softhca: counters")
        .skip(1)
        .map(|rest| {
            let end = [rest.find('\n'), rest.find("softhca:")]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(rest.len());
            rest[..end]
                .split_whitespace()
                .find_map(|w| w.strip_prefix(&key))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

/// Compiles `tests/c/<name>.c`, runs it once on our library with `SOFTHCA_ADDR=addr`, and
/// checks that it exited 0, printed `oks` "ok: ..." lines and its closing `done` line.
/// Returns the output; `None` when libibverbs-dev is missing (SKIP printed).
pub fn run_c_checks(name: &str, addr: &str, oks: usize, done: &str) -> Option<String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let bin = compile_c(&src, &name.replace('_', "-"))?;
    let _g = serial();
    let out = cmd(bin.to_str().expect("utf-8 path"))
        .env("SOFTHCA_ADDR", addr)
        .output()
        .expect("run the C test program");
    let _ = std::fs::remove_file(&bin);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let seen = text.lines().filter(|l| l.starts_with("ok: ")).count();
    assert_eq!(seen, oks, "{text}");
    assert!(text.contains(done), "{text}");
    Some(text)
}
