//! rdma-core's example programs (ibverbs-utils), server and client as two processes on
//! this host over softhca: `-g 0` on both sides.

mod common;

use std::time::Duration;

/// Runs a pingpong pair and checks both exit 0 and report their transfer.
fn pingpong(bin: &str, extra: &[&str]) {
    if !common::have(bin) {
        return;
    }
    let n = common::iters(1000);
    let mut args = vec!["-g", "0", "-n", &n];
    args.extend_from_slice(extra);
    let (s, c) = common::pair(bin, &args, Duration::from_secs(60));
    for (who, d) in [("server", &s), ("client", &c)] {
        assert_eq!(d.status, Some(0), "{bin} {args:?} {who}:\n{}", d.all());
        assert!(d.stdout.contains(" bytes in "), "{who}:\n{}", d.all());
        assert!(
            d.stdout.contains(&format!("{n} iters in ")),
            "{who}:\n{}",
            d.all()
        );
        assert!(d.stdout.contains("GID ::ffff:"), "{who}:\n{}", d.all());
    }
}

#[test]
fn rc_pingpong_1_byte() {
    pingpong("ibv_rc_pingpong", &["-s", "1"]);
}

#[test]
fn rc_pingpong_4096() {
    pingpong("ibv_rc_pingpong", &["-s", "4096"]);
}

#[test]
fn rc_pingpong_65536() {
    pingpong("ibv_rc_pingpong", &["-s", "65536"]);
}

#[test]
fn rc_pingpong_new_post_send_api() {
    // -N: ibv_qp_to_qp_ex + ibv_wr_start / ibv_wr_send / ibv_wr_set_sge / ibv_wr_complete.
    pingpong("ibv_rc_pingpong", &["-N", "-s", "4096"]);
}

#[test]
fn rc_pingpong_new_post_send_api_1_byte() {
    pingpong("ibv_rc_pingpong", &["-N", "-s", "1"]);
}

#[test]
fn rc_pingpong_completion_events() {
    // -e: completion channel fd, ibv_req_notify_cq, ibv_get_cq_event, ibv_ack_cq_events.
    pingpong("ibv_rc_pingpong", &["-e", "-s", "4096"]);
}

#[test]
fn rc_pingpong_timestamps_cq_ex() {
    // -t: ibv_create_cq_ex with completion timestamps, start/next/end_poll + read_*.
    pingpong("ibv_rc_pingpong", &["-t", "-s", "1024"]);
}

#[test]
fn rc_pingpong_on_demand_paging_with_prefetch() {
    // -o: buffers registered with IBV_ACCESS_ON_DEMAND (after checking odp_caps); -P:
    // ibv_advise_mr prefetches them first.
    pingpong("ibv_rc_pingpong", &["-o", "-P", "-s", "4096"]);
}

#[test]
fn uc_pingpong() {
    pingpong("ibv_uc_pingpong", &["-s", "4096"]);
}

#[test]
fn ud_pingpong() {
    // UD messages must fit the path MTU: 1024 is the smallest active MTU a softhca
    // device has (an interface with a 1500-byte MTU).
    pingpong("ibv_ud_pingpong", &["-s", "1024"]);
}

#[test]
fn srq_pingpong() {
    pingpong("ibv_srq_pingpong", &["-s", "4096"]);
}
