//! Memory windows as a C program uses them: `tests/c/memory_windows.c`, compiled against
//! the system's `<infiniband/verbs.h>` and run on our library. Type 1 (`ibv_bind_mw`)
//! and type 2 (`IBV_WR_BIND_MW`) windows carry RDMA WRITE and READ with data checked,
//! `IBV_WR_LOCAL_INV` and SEND with invalidate revoke them, and a revoked window's rkey
//! gives `IBV_WC_REM_ACCESS_ERR`.

mod common;

#[test]
fn type1_type2_windows_bind_access_and_invalidate() {
    common::run_c_checks(
        "memory_windows",
        "127.0.7.5",
        7,
        "all memory window checks passed",
    );
}
