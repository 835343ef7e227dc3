//! Memory windows as a C program uses them: `tests/c/memory_windows.c`, compiled against
//! the system's `<infiniband/verbs.h>` and run on our library. Type 1 (`ibv_bind_mw`)
//! and type 2 (`IBV_WR_BIND_MW`) windows carry RDMA WRITE and READ with data checked,
//! `IBV_WR_LOCAL_INV` and SEND with invalidate revoke them, and a revoked window's rkey
//! gives `IBV_WC_REM_ACCESS_ERR`.

mod common;

use std::path::PathBuf;

#[test]
fn type1_type2_windows_bind_access_and_invalidate() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/memory_windows.c");
    let Some(bin) = common::compile_c(&src, "memory-windows") else {
        return;
    };
    let _g = common::serial();
    let out = common::cmd(bin.to_str().expect("utf-8 path"))
        .env("SOFTHCA_ADDR", "127.0.7.5")
        .output()
        .expect("run memory_windows");
    let _ = std::fs::remove_file(&bin);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let oks = text.lines().filter(|l| l.starts_with("ok: ")).count();
    assert_eq!(oks, 7, "{text}");
    assert!(text.contains("all memory window checks passed"), "{text}");
}
