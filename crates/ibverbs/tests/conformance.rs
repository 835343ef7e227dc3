//! Verbs conformance as a C program sees it: `tests/c/conformance.c`, compiled against
//! the system's `<infiniband/verbs.h>` and run with our library first on
//! LD_LIBRARY_PATH. Two opens of one device share it (QPs of the two contexts exchange
//! verified data from their own threads); event fds follow `read(2)` (EAGAIN, EINTR,
//! poll readiness, acks before destroy); attribute checks match the kernel's; on-demand
//! paging and `ibv_advise_mr` as rxe offers them; `ibv_rereg_mr` fails as over rxe.

mod common;

#[test]
fn contexts_event_fds_and_attribute_checks_behave_as_rdma_core() {
    common::run_c_checks(
        "conformance",
        "127.0.7.1",
        19,
        "all conformance checks passed",
    );
}
