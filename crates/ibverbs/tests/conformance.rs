//! Verbs conformance as a C program sees it: `tests/c/conformance.c`, compiled against
//! the system's `<infiniband/verbs.h>` and run with our library first on
//! LD_LIBRARY_PATH. Two opens of one device share it (QPs of the two contexts exchange
//! verified data from their own threads); event fds follow `read(2)` (EAGAIN, EINTR,
//! poll readiness, acks before destroy); attribute checks match the kernel's.

mod common;

use std::path::PathBuf;

#[test]
fn contexts_event_fds_and_attribute_checks_behave_as_rdma_core() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/conformance.c");
    let Some(bin) = common::compile_c(&src, "conformance") else {
        return;
    };
    let _g = common::serial();
    let out = common::cmd(bin.to_str().expect("utf-8 path"))
        .env("SOFTHCA_ADDR", "127.0.7.1")
        .output()
        .expect("run conformance");
    let _ = std::fs::remove_file(&bin);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let oks = text.lines().filter(|l| l.starts_with("ok: ")).count();
    assert_eq!(oks, 11, "{text}");
    assert!(text.contains("all conformance checks passed"), "{text}");
}
