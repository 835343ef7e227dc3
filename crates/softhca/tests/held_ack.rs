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
        // The receiver spins on its CQ (the step that completes the receive holds the
        // ACK), then goes quiet: no post, no blocking wait.
        send_and_spin(&a, &b, round, 64);
        // The sender learns its SEND completed only from that ACK, which must leave
        // before the sender's timer (67 ms) resends the SEND: no retransmission, ever.
        let sc = one(&a.cq);
        assert_eq!(sc.status, WcStatus::Success);
        let timeouts = counter(&a.ctx, "local_ack_timeout_err");
        assert_eq!(
            timeouts, 0,
            "round {round}: the held ACK waited for a retransmission"
        );
    }
}

/// A receiver that moves its QP to ERR the moment its receive completes (rdma_client
/// calls rdma_disconnect right after rdma_get_recv_comp): the ACK its polling step held
/// still leaves, and the sender's SEND completes with success instead of retrying into
/// a dead QP until its retries run out.
#[test]
fn held_ack_leaves_before_the_qp_moves_to_error() {
    let (ca, cb) = (open("127.0.1.77"), open("127.0.1.78"));
    for round in 0..20u64 {
        let (a, b) = (
            side(ca.clone(), QpType::Rc, 4096),
            side(cb.clone(), QpType::Rc, 4096),
        );
        connect(&a, &b);
        send_and_spin(&a, &b, round, 16);
        let err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        b.qp.modify(&err, QpAttrMask::STATE).unwrap();
        let sc = one(&a.cq);
        assert_eq!(
            (sc.wr_id, sc.status),
            (round, WcStatus::Success),
            "round {round}"
        );
    }
    assert!(
        counter(&cb, "dp_tx_held") > 0,
        "no ACK was ever held: the test did not test the hold"
    );
}

/// `a` SENDs `len` bytes to `b`, whose application spins on its CQ until the receive
/// completes (the step that completes it may hold the ACK for an answer).
fn send_and_spin(a: &Side, b: &Side, wr_id: u64, len: u32) {
    b.qp.post_recv(recv_wr(wr_id, b.mr.sge(0, 4096))).unwrap();
    a.qp.post_send(send_wr(wr_id, WrOpcode::Send, a.mr.sge(0, len)))
        .unwrap();
    let mut wc = [Completion::default(); 1];
    let t = Instant::now();
    while b.cq.poll(&mut wc) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "receive never completed"
        );
    }
    assert_eq!((wc[0].wr_id, wc[0].status), (wr_id, WcStatus::Success));
}

/// One end of a ping-pong with its own send and receive CQs (as perftest has).
struct End {
    ctx: std::sync::Arc<Context>,
    _pd: Pd,
    scq: Cq,
    /// None: receives complete on `scq` too.
    own_rcq: Option<Cq>,
    qp: Qp,
    mr: Mr,
}

impl End {
    fn rcq(&self) -> &Cq {
        self.own_rcq.as_ref().unwrap_or(&self.scq)
    }
}

fn end(addr: &str, shared_cq: bool) -> End {
    let ctx = open(addr);
    let pd = ctx.alloc_pd().unwrap();
    let scq = ctx.create_cq(1024, None).unwrap();
    let own_rcq = (!shared_cq).then(|| ctx.create_cq(1024, None).unwrap());
    let qp = pd
        .create_qp(&QpInit {
            recv_cq: own_rcq.as_ref().unwrap_or(&scq),
            ..QpInit::new(QpType::Rc, &scq)
        })
        .unwrap();
    let mr = pd.reg_mr(1 << 16, ALL_ACCESS).unwrap();
    End {
        ctx,
        _pd: pd,
        scq,
        own_rcq,
        qp,
        mr,
    }
}

fn connect_ends(a: &End, b: &End) {
    let mtu = a.ctx.active_mtu().min(b.ctx.active_mtu());
    let remote = |e: &End, psn| RemoteQp {
        qpn: e.qp.qpn(),
        psn,
        gid: e.ctx.gids()[0],
    };
    a.qp.connect_rc(0x10, &remote(b, 0x20), mtu, 0).unwrap();
    b.qp.connect_rc(0x20, &remote(a, 0x10), mtu, 0).unwrap();
}

/// Spins on the receive CQ until a receive completes, taking send completions from the
/// send CQ every few polls (or from the same CQ when there is one); returns the receive.
fn wait_recv(e: &End, sends: &mut u64) -> Completion {
    let mut wc = [Completion::default(); 4];
    let mut got = None;
    let t = Instant::now();
    for spin in 0u64.. {
        let n = e.rcq().poll(&mut wc);
        let mut from_send_cq = 0;
        if spin % 8 == 7 && e.own_rcq.is_some() {
            from_send_cq = e.scq.poll(&mut wc[n..]);
        }
        for c in &wc[..n + from_send_cq] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.opcode == WcOpcode::Recv {
                got = Some(*c);
            } else {
                *sends += 1;
            }
        }
        if let Some(c) = got {
            return c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no receive within 5 s"
        );
    }
    unreachable!()
}

/// A ping-pong of `rounds` 64 B SENDs, every byte checked both ways; returns the
/// client's count of ACKs left for the next step. When the client stops polling at the
/// end, the datapath thread feeds what its last step left, and every send completes.
fn ping_pong(a: &End, b: &End, rounds: u64) -> u64 {
    const LEN: usize = 64;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut sends = 0;
            let mut buf = [0u8; LEN];
            for i in 0..rounds {
                let c = wait_recv(b, &mut sends);
                assert_eq!((c.wr_id, c.byte_len as usize), (i, LEN));
                b.mr.read(4096, &mut buf).unwrap();
                assert_eq!(buf[..], pattern(LEN, i as u8)[..], "request {i}");
                if i + 1 < rounds {
                    b.qp.post_recv(recv_wr(i + 1, b.mr.sge(4096, 4096)))
                        .unwrap();
                }
                b.mr.write(0, &buf).unwrap();
                b.qp.post_send(send_wr(i, WrOpcode::Send, b.mr.sge(0, LEN as u32)))
                    .unwrap();
            }
            while sends < rounds {
                let c = one(&b.scq);
                assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Send));
                sends += 1;
            }
        });
        b.qp.post_recv(recv_wr(0, b.mr.sge(4096, 4096))).unwrap();
        let mut sends = 0;
        let mut buf = [0u8; LEN];
        for i in 0..rounds {
            a.qp.post_recv(recv_wr(i, a.mr.sge(8192, 4096))).unwrap();
            a.mr.write(0, &pattern(LEN, i as u8)).unwrap();
            a.qp.post_send(send_wr(i, WrOpcode::Send, a.mr.sge(0, LEN as u32)))
                .unwrap();
            let c = wait_recv(a, &mut sends);
            assert_eq!((c.wr_id, c.byte_len as usize), (i, LEN));
            a.mr.read(8192, &mut buf).unwrap();
            assert_eq!(buf[..], pattern(LEN, i as u8)[..], "answer {i}");
        }
        // No more polling here: what the last step left is the datapath thread's to
        // feed, at the end of the polling window.
        let t = Instant::now();
        while counter(&a.ctx, "rcvd_pkts") < 2 * rounds {
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "{} of {} packets fed",
                counter(&a.ctx, "rcvd_pkts"),
                2 * rounds
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        while sends < rounds {
            let c = one(&a.scq);
            assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Send));
            sends += 1;
        }
    });
    // Every request and answer arrived once, unless a timer fired on a loaded machine and
    // the extra packets are retransmissions (or the ACKs of retransmissions).
    let extra = counter(&a.ctx, "rcvd_pkts") - 2 * rounds;
    let retries: u64 = [
        "completer_retry_err",
        "local_ack_timeout_err",
        "quiet_resend",
        "tail_probe",
    ]
    .iter()
    .map(|c| counter(&a.ctx, c) + counter(&b.ctx, c))
    .sum();
    assert!(
        extra == 0 || retries > 0,
        "{extra} packets beyond the {} sent, with no retransmission",
        2 * rounds
    );
    counter(&a.ctx, "dp_rx_acks_deferred")
}

/// Each answer arrives with the ACK of the request it answers, as the last segment of
/// one datagram. A client polling its receive CQ takes the answer first; the ACK, which
/// completes on the send CQ, is fed at its next step. Only when the client is polling as
/// the datagram arrives: a client thread descheduled then (four threads on two cores)
/// leaves it to the datapath thread, so a busy machine gets three tries.
#[test]
fn trailing_acks_wait_when_the_answer_is_what_the_application_polls_for() {
    const ROUNDS: u64 = 300;
    let mut best = 0;
    for _ in 0..3 {
        let (a, b) = (end("127.0.1.73", false), end("127.0.1.74", false));
        connect_ends(&a, &b);
        best = best.max(ping_pong(&a, &b, ROUNDS));
        if best >= ROUNDS / 4 {
            return;
        }
    }
    panic!("at best {best} of {ROUNDS} answers were taken before their ACK");
}

/// With one CQ for sends and receives, the application waits for the send the ACK
/// completes too (ibv_rc_pingpong posts its next message only then): the ACK is fed in
/// the step that brought it.
#[test]
fn trailing_acks_are_fed_at_once_when_they_complete_on_the_polled_cq() {
    let (a, b) = (end("127.0.1.75", true), end("127.0.1.76", true));
    connect_ends(&a, &b);
    assert_eq!(ping_pong(&a, &b, 100), 0);
}
