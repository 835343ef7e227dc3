//! A receiver whose polling step held the ACK of what it just completed (for its
//! answer) and then stops polling without posting or blocking: the ACK still leaves,
//! at the end of the application's polling window, long before the sender's
//! retransmission timer.

mod common;

use std::time::{Duration, Instant};

use common::*;
use softhca::*;

#[test]
fn held_ack_leaves_when_the_receiver_stops_polling() {
    let (a, b) = rc_pair("127.0.1.71", "127.0.1.72", 1 << 16);
    for round in 0..20u64 {
        b.qp.post_recv(recv_wr(round, b.mr.sge(0, 4096))).unwrap();
        a.qp.post_send(send_wr(round, WrOpcode::Send, a.mr.sge(0, 64)))
            .unwrap();
        // The receiver spins on its CQ (the step that completes the receive holds the
        // ACK), then goes quiet: no post, no blocking wait.
        let mut wc = [Completion::default(); 1];
        let t = Instant::now();
        while b.cq.poll(&mut wc) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "receive never completed"
            );
        }
        // The sender learns its SEND completed only from that ACK.
        let t = Instant::now();
        let sc = one(&a.cq);
        let took = t.elapsed();
        assert_eq!(sc.status, WcStatus::Success);
        assert!(
            took < Duration::from_millis(20),
            "round {round}: send completion after {took:?} (the held ACK waited for a retransmission)"
        );
    }
}
