//! Error paths from C (`tests/c/errors.c`, built against the system's rdma_cma.h): bad
//! addresses, a port in use, an address that is not a device GID, a destination with no
//! route and one routed from an interface that is no RDMA device, EAGAIN on an empty
//! non-blocking channel, the unsupported calls; none hangs. Run on the host and, as root,
//! in a network namespace whose only interface is a veth end with no default route, where
//! the address that is not a GID and the destination with no route both exist for sure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use softhca_testbed::{End, Veth, VethLayout};

/// The device's only GID in both runs.
const GID: &str = "127.0.6.4";

/// errors.c compiled, or `None` with the reason printed.
fn program() -> Option<PathBuf> {
    common::lib_dir()?;
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        eprintln!("SKIP: librdmacm-dev not installed (apt-get install librdmacm-dev)");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/errors.c");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "rdmacm-errors-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let st = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling {}", src.display());
    Some(exe)
}

fn run(c: Command) -> common::Done {
    let _g = common::serial();
    let d = common::finish(
        common::with_our_libs(c).spawn().expect("spawn"),
        Duration::from_secs(30),
    );
    assert_eq!(d.status, Some(0), "{}", d.all());
    assert!(d.stdout.contains("ALL OK"), "{}", d.all());
    d
}

#[test]
fn errors_from_c() {
    let Some(exe) = program() else { return };
    let mut c = Command::new(&exe);
    c.env("SOFTHCA_ADDR", GID);
    run(c);
    let _ = std::fs::remove_file(exe);
}

#[test]
fn errors_from_c_in_a_namespace_with_no_default_route() {
    let Some(exe) = program() else { return };
    let name = format!("cmv{}e", std::process::id() % 100_000);
    let v = match Veth::up(&name, VethLayout::TwoHosts) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("SKIP: no veth pair between network namespaces ({e}); test not run");
            return;
        }
    };
    let mut c = v.command(End::A, &exe);
    c.env("SOFTHCA_ADDR", GID);
    let d = run(c);
    // 10.98.0.1, the veth end's address, is this host's but not the device's; 192.0.2.1
    // has no route at all.
    assert!(d.stdout.contains("non-GID bind: ENODEV"), "{}", d.all());
    assert!(d.stdout.contains("resolve: ENETUNREACH"), "{}", d.all());
    let _ = std::fs::remove_file(exe);
}
