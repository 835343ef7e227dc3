//! Asynchronous events as a C program sees them: `tests/c/async_events.c`, compiled
//! here against the system's `<infiniband/verbs.h>` and libibverbs (as any program is),
//! then run with our library first on LD_LIBRARY_PATH. It checks SRQ limit, QP access
//! error, CQ error and QP fatal events through `ibv_get_async_event`.

mod common;

use std::path::PathBuf;

#[test]
fn srq_limit_access_error_cq_error_and_qp_fatal_events() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/async_events.c");
    let Some(bin) = common::compile_c(&src, "async-events") else {
        return;
    };
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
