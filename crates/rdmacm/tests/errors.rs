//! Error paths from C (`tests/c/errors.c`, built against the system's rdma_cma.h): bad
//! addresses, a port in use, an address that is not a device GID, EAGAIN on an empty
//! non-blocking channel, the unsupported calls; none hangs.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[test]
fn errors_from_c() {
    let Some(_) = common::lib_dir() else { return };
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        eprintln!("SKIP: librdmacm-dev not installed (apt-get install librdmacm-dev)");
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/errors.c");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rdmacm-errors-{}", std::process::id()));
    let st = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling {}", src.display());
    let _g = common::serial();
    let d = common::finish(
        common::cmd("127.0.6.4", exe.to_str().expect("utf-8 path"), &[])
            .spawn()
            .expect("spawn"),
        Duration::from_secs(30),
    );
    assert_eq!(d.status, Some(0), "{}", d.all());
    assert!(d.stdout.contains("ALL OK"), "{}", d.all());
}
