//! Asynchronous events as a C program sees them: `tests/c/async_events.c`, compiled
//! here against the system's `<infiniband/verbs.h>` and libibverbs (as any program is),
//! then run with our library first on LD_LIBRARY_PATH. It checks SRQ limit, QP access
//! error, CQ error and QP fatal events through `ibv_get_async_event`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn compile(src: &Path) -> Option<PathBuf> {
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("SKIP: libibverbs-dev not installed (apt-get install libibverbs-dev)");
        return None;
    }
    let out = std::env::temp_dir().join(format!("softhca-async-events-{}", std::process::id()));
    let st = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-std=gnu11", "-o"])
        .arg(&out)
        .arg(src)
        .arg("-libverbs")
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling {}", src.display());
    Some(out)
}

#[test]
fn srq_limit_access_error_cq_error_and_qp_fatal_events() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/async_events.c");
    let Some(bin) = compile(&src) else { return };
    let _g = common::serial();
    let out = common::cmd(bin.to_str().expect("utf-8 path"))
        .output()
        .expect("run async_events");
    let _ = std::fs::remove_file(&bin);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for line in [
        "event: SRQ limit reached",
        "write completion: remote access error",
        "event: local access violation work queue error",
        "event: CQ error",
        "event: local work queue catastrophic error",
        "qp state after overrun: 6",
        "all events received",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}
