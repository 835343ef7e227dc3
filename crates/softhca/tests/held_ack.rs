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

/// Spins on `cq` until a receive completes; counts the send completions seen meanwhile.
fn wait_recv(cq: &Cq, sends: &mut u64) -> Completion {
    let mut wc = [Completion::default(); 4];
    let t = Instant::now();
    loop {
        let n = cq.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.opcode == WcOpcode::Recv {
                return *c;
            }
            *sends += 1;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no receive within 5 s"
        );
    }
}

/// In a ping-pong each answer arrives with the ACK of the request it answers, as the last
/// segment of one datagram; the polling requester takes the answer's completion first
/// and feeds the ACK at its next step. Every message arrives intact, every send
/// completes, and an ACK left by the last step is fed by the datapath thread once the
/// application stops polling.
#[test]
fn trailing_acks_are_fed_at_the_next_step() {
    const ROUNDS: u64 = 300;
    const LEN: usize = 64;
    let (a, b) = rc_pair("127.0.1.73", "127.0.1.74", 1 << 16);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut sends = 0;
            let mut buf = [0u8; LEN];
            for i in 0..ROUNDS {
                let c = wait_recv(&b.cq, &mut sends);
                assert_eq!((c.wr_id, c.byte_len as usize), (i, LEN));
                b.mr.read(4096, &mut buf).unwrap();
                assert_eq!(buf[..], pattern(LEN, i as u8)[..], "request {i}");
                if i + 1 < ROUNDS {
                    b.qp.post_recv(recv_wr(i + 1, b.mr.sge(4096, 4096)))
                        .unwrap();
                }
                // Echo it.
                b.mr.write(0, &buf).unwrap();
                b.qp.post_send(send_wr(i, WrOpcode::Send, b.mr.sge(0, LEN as u32)))
                    .unwrap();
            }
            while sends < ROUNDS {
                let c = one(&b.cq);
                assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Send));
                sends += 1;
            }
        });
        b.qp.post_recv(recv_wr(0, b.mr.sge(4096, 4096))).unwrap();
        let mut sends = 0;
        let mut buf = [0u8; LEN];
        for i in 0..ROUNDS {
            a.qp.post_recv(recv_wr(i, a.mr.sge(8192, 4096))).unwrap();
            a.mr.write(0, &pattern(LEN, i as u8)).unwrap();
            a.qp.post_send(send_wr(i, WrOpcode::Send, a.mr.sge(0, LEN as u32)))
                .unwrap();
            let c = wait_recv(&a.cq, &mut sends);
            assert_eq!((c.wr_id, c.byte_len as usize), (i, LEN));
            a.mr.read(8192, &mut buf).unwrap();
            assert_eq!(buf[..], pattern(LEN, i as u8)[..], "answer {i}");
        }
        // No more polling here: an ACK the last step left is the datapath thread's to
        // feed, at the end of the polling window (2 ms).
        let t = Instant::now();
        while counter(&a.ctx, "rcvd_pkts") < 2 * ROUNDS {
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "{} of {} packets fed",
                counter(&a.ctx, "rcvd_pkts"),
                2 * ROUNDS
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        while sends < ROUNDS {
            let c = one(&a.cq);
            assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Send));
            sends += 1;
        }
    });
    let deferred = counter(&a.ctx, "dp_rx_acks_deferred");
    assert!(
        deferred >= ROUNDS / 4,
        "only {deferred} of {ROUNDS} answers were taken before their ACK"
    );
    assert_eq!(counter(&a.ctx, "rcvd_pkts"), 2 * ROUNDS);
}
