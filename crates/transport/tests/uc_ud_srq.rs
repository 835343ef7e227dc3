//! UC, UD and SRQ behaviour, and dropping bad input.

mod sim;

use std::net::{IpAddr, SocketAddr};

use sim::*;
use softhca_transport::*;

#[test]
fn uc_loss_drops_only_that_message() {
    let mut net = SimNet::new(1, 2, Mtu::M256);
    let (a, b) = pair(&mut net, QpType::Uc, &RcOpts::default());
    let la = net.reg(0, 4 * 1000, full_access());
    let rb = net.reg(1, 4 * 1000, full_access());
    net.fill_random(&la);
    for i in 0..4 {
        net.nodes[1]
            .engine
            .post_recv(b, recv_wr(100 + i, rb.sges(i as usize * 1000, 1000)))
            .unwrap();
    }
    // Lose the 2nd packet (a MIDDLE) of the second message: it has PSNs +4..+7.
    let victim = (0x00ff_fff0u32 + 5) & 0xff_ffff;
    net.filter = Some(Box::new(move |from, p| {
        from == 0 && u32::from_be_bytes([0, p[9], p[10], p[11]]) == victim
    }));
    for i in 0..4u64 {
        net.nodes[0]
            .engine
            .post_send(
                0,
                a,
                send_wr(i, WrOpcode::Send, la.sges(i as usize * 1000, 1000)),
            )
            .unwrap();
    }
    net.run(1_000_000_000);
    // UC completes sends when they leave.
    let s = net.take_completions(0);
    assert_eq!(
        s.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    // Messages 0, 2, 3 arrive; message 1 is gone and its receive WQE took message 2.
    let r = net.take_completions(1);
    assert_eq!(
        r.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(),
        vec![(100, 1000), (101, 1000), (102, 1000)]
    );
    let (lm, rm) = (net.mem(&la).to_vec(), net.mem(&rb).to_vec());
    assert_eq!(&rm[..1000], &lm[..1000]);
    assert_eq!(&rm[1000..2000], &lm[2000..3000]);
    assert_eq!(&rm[2000..3000], &lm[3000..4000]);
    // No ACKs on UC.
    assert_eq!(net.nodes[1].engine.counters().sent_pkts, 0);
}

#[test]
fn uc_write_with_imm() {
    let mut net = SimNet::new(2, 2, Mtu::M1024);
    let (a, b) = pair(&mut net, QpType::Uc, &RcOpts::default());
    let la = net.reg(0, 5000, full_access());
    let rb = net.reg(1, 5000, full_access());
    net.fill_random(&la);
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(1, Default::default()))
        .unwrap();
    let mut w = send_wr(9, WrOpcode::RdmaWriteWithImm, la.sges(0, 5000));
    w.remote_addr = rb.addr;
    w.rkey = rb.rkey;
    w.imm_data = 77;
    net.nodes[0].engine.post_send(0, a, w).unwrap();
    net.run(1_000_000_000);
    let r = net.take_completions(1);
    assert_eq!(
        (r[0].opcode, r[0].imm_data, r[0].byte_len),
        (WcOpcode::RecvRdmaWithImm, 77, 5000)
    );
    assert!(net.mem(&rb) == net.mem(&la));
}

fn ud_qp(net: &mut SimNet, node: usize, qkey: u32) -> Qpn {
    let q = create(net, node, QpType::Ud, &RcOpts::default(), None);
    net.nodes[node]
        .engine
        .ready_ud(0, q, qkey, 0)
        .expect("INIT, RTR, RTS");
    q
}

#[test]
fn ud_send_grh_and_qkey() {
    let mut net = SimNet::new(3, 2, Mtu::M1024);
    let a = ud_qp(&mut net, 0, 0x1111);
    let b = ud_qp(&mut net, 1, 0x2222);
    let la = net.reg(0, 1000, full_access());
    let rb = net.reg(1, 3000, full_access());
    net.fill_random(&la);
    for i in 0..3 {
        net.nodes[1]
            .engine
            .post_recv(b, recv_wr(i, rb.sges(i as usize * 1000, 1000)))
            .unwrap();
    }
    let dest = |qkey| UdDest {
        av: AddressVector {
            dgid: Gid::from_ip("10.0.0.2".parse().unwrap()),
            ..AddressVector::default()
        },
        remote_qpn: qpn_u32(b),
        remote_qkey: qkey,
    };
    // Wrong Q_Key: dropped. Right Q_Key: delivered. High bit set: the QP's own Q_Key
    // (0x1111) is used, which is wrong for the receiver: dropped.
    for (id, qk) in [(1u64, 0x3333u32), (2, 0x2222), (3, 0x8000_0000)] {
        let mut w = send_wr(id, WrOpcode::SendWithImm, la.sges(0, 500));
        w.imm_data = id as u32;
        w.ud = Some(dest(qk));
        net.nodes[0].engine.post_send(0, a, w).unwrap();
    }
    net.run(1_000_000_000);
    assert_eq!(net.take_completions(0).len(), 3);
    assert_eq!(net.nodes[1].engine.counters().drop_bad_qkey, 2);
    let r = net.take_completions(1);
    assert_eq!(r.len(), 1);
    let c = r[0];
    assert_eq!(
        (c.wr_id, c.status, c.byte_len, c.imm_data, c.src_qp),
        (0, WcStatus::Success, 540, 2, qpn_u32(a))
    );
    assert!(c.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    let m = net.mem(&rb);
    // IPv4 RoCEv2: first 20 bytes zero, then the IPv4 header with the source address.
    assert!(m[..20].iter().all(|&x| x == 0));
    assert_eq!(m[20] >> 4, 4);
    assert_eq!(&m[32..36], &[10, 0, 0, 1]);
    assert_eq!(&m[36..40], &[10, 0, 0, 2]);
    assert_eq!(&m[40..540], &net.mem(&la)[..500]);
    // A UD message above the MTU completes in error.
    let mut w = send_wr(4, WrOpcode::Send, la.sges(0, 1000));
    w.ud = Some(dest(0x2222));
    let big = net.reg(0, 5000, full_access());
    w.payload = Payload::Sges(big.sges(0, 5000));
    net.nodes[0].engine.post_send(0, a, w).unwrap();
    net.run(1_000_000_000);
    assert_eq!(net.take_completions(0)[0].status, WcStatus::LocQpOpErr);
}

#[test]
fn srq_limit_event() {
    let mut net = SimNet::new(4, 2, Mtu::M1024);
    let pd = net.nodes[1].pd;
    let srq = net.nodes[1]
        .engine
        .create_srq(
            pd,
            SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let o = RcOpts::default();
    let a = create(&mut net, 0, QpType::Rc, &o, None);
    let b = create(&mut net, 1, QpType::Rc, &o, Some(srq));
    connect_one(&mut net, 0, a, QpType::Rc, 1, b, &o, 1, 2);
    connect_one(&mut net, 1, b, QpType::Rc, 0, a, &o, 2, 1);
    let la = net.reg(0, 100, full_access());
    let rb = net.reg(1, 400, full_access());
    for i in 0..4 {
        net.nodes[1]
            .engine
            .post_srq_recv(srq, recv_wr(i, rb.sges(i as usize * 100, 100)))
            .unwrap();
    }
    assert!(matches!(
        net.nodes[1]
            .engine
            .post_recv(b, recv_wr(9, Default::default())),
        Err(TransportError::InvalidArgument(_))
    ));
    net.nodes[1]
        .engine
        .modify_srq(
            srq,
            SrqAttr {
                srq_limit: 3,
                ..SrqAttr::default()
            },
            SRQ_LIMIT,
        )
        .unwrap();
    assert!(net.nodes[1]
        .engine
        .modify_srq(
            srq,
            SrqAttr {
                srq_limit: 99,
                ..SrqAttr::default()
            },
            SRQ_LIMIT
        )
        .is_err());
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(1, WrOpcode::Send, la.sges(0, 10)))
        .unwrap();
    net.run(1_000_000_000);
    // 3 left: not below the limit yet.
    assert!(!net.nodes[1]
        .events
        .iter()
        .any(|e| matches!(e, AsyncEvent::SrqLimitReached(_))));
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(2, WrOpcode::Send, la.sges(0, 10)))
        .unwrap();
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(3, WrOpcode::Send, la.sges(0, 10)))
        .unwrap();
    net.run(1_000_000_000);
    let n = net.nodes[1]
        .events
        .iter()
        .filter(|e| matches!(e, AsyncEvent::SrqLimitReached(s) if *s == srq))
        .count();
    assert_eq!(n, 1, "fires once, then disarms");
    assert_eq!(net.nodes[1].engine.query_srq(srq).unwrap().srq_limit, 0);
    let r = net.take_completions(1);
    assert_eq!(r.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(
        net.nodes[1].engine.destroy_srq(srq),
        Err(TransportError::Busy)
    );
}

/// Capture the first packet node 0 sends, then feed variants of it to node 1.
#[test]
fn bad_input_is_dropped_and_counted() {
    let mut net = SimNet::new(5, 2, Mtu::M1024);
    let (a, b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 100, full_access());
    let rb = net.reg(1, 100, full_access());
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(1, rb.sges(0, 100)))
        .unwrap();
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(1, WrOpcode::Send, la.sges(0, 10)))
        .unwrap();
    let mut buf = vec![0u8; 65536];
    let t = net.nodes[0].engine.poll_transmit(0, &mut buf).unwrap();
    let good = buf[..t.len].to_vec();
    let info = DatagramInfo {
        src: SocketAddr::new(t.src, t.src_port),
        dst: t.dst.ip(),
        segment_index: 0,
        tos: 0,
    };
    let e = &mut net.nodes[1].engine;
    // Flipped bit: ICRC.
    let mut p = good.clone();
    p[20] ^= 4;
    e.handle_datagram(0, &info, &p);
    assert_eq!(e.counters().drop_bad_icrc, 1);
    // Truncated garbage.
    e.handle_datagram(0, &info, &[1, 2, 3]);
    e.handle_datagram(0, &info, &[]);
    assert_eq!(e.counters().drop_bad_icrc + e.counters().drop_malformed, 3);
    // Wrong peer: same bytes from another address (the ICRC covers the addresses, so
    // re-seal by sending from a third engine would be needed; instead check the rule
    // with a packet that passes the ICRC from the right source but to an unknown QP).
    let wrong = DatagramInfo {
        src: SocketAddr::new(IpAddr::V4("10.0.0.9".parse().unwrap()), t.src_port),
        ..info
    };
    let before = e.counters().drop_bad_icrc;
    e.handle_datagram(0, &wrong, &good);
    assert_eq!(
        e.counters().drop_bad_icrc,
        before + 1,
        "the ICRC covers the source address"
    );
    // Nothing above reached the QP: the real packet still works.
    e.handle_datagram(0, &info, &good);
    assert_eq!(e.counters().rcvd_pkts, 1);
    let r = e.poll_completion().unwrap().1;
    assert_eq!((r.wr_id, r.byte_len), (1, 10));
    // Many random packets never panic.
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for _ in 0..2000 {
        let n = rng.gen_range(0..200);
        let mut p: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        if rng.gen_bool(0.5) && p.len() > 12 {
            p[..12].copy_from_slice(&good[..12]);
        }
        e.handle_datagram(0, &info, &p);
    }
}

#[test]
fn wrong_peer_unknown_qpn_bad_pkey() {
    // Three nodes: node 2 talks to node 1's RC QP, which is connected to node 0.
    let mut net = SimNet::new(6, 3, Mtu::M1024);
    let o = RcOpts::default();
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    let c = create(&mut net, 2, QpType::Rc, &o, None);
    connect_one(&mut net, 2, c, QpType::Rc, 1, b, &o, 0x00ff_fff0, 0x123);
    let lc = net.reg(2, 100, full_access());
    net.nodes[2]
        .engine
        .post_send(0, c, send_wr(1, WrOpcode::Send, lc.sges(0, 10)))
        .unwrap();
    net.step();
    net.step();
    assert!(net.nodes[1].engine.counters().drop_wrong_peer >= 1);
    assert_eq!(net.nodes[1].engine.counters().rcvd_pkts, 0);
    // A QP that does not exist.
    net.nodes[2].engine.destroy_qp(c).unwrap();
    let c2 = create(&mut net, 2, QpType::Rc, &o, None);
    connect_one(&mut net, 2, c2, QpType::Rc, 1, Qpn::new(0x777), &o, 1, 1);
    net.nodes[2]
        .engine
        .post_send(0, c2, send_wr(1, WrOpcode::Send, lc.sges(0, 10)))
        .unwrap();
    net.step();
    net.step();
    assert!(net.nodes[1].engine.counters().drop_unknown_qpn >= 1);
    let _ = a;
}

/// UD has no ACKs and so no congestion control; `unacked_rate` holds each UC and UD QP
/// to a rate: 1000 sends of 4 KiB posted at once leave at 100 Mb/s, in virtual time.
#[test]
fn ud_sends_keep_to_the_configured_rate() {
    const N: u64 = 1000;
    const RATE: u64 = 12_500_000; // 100 Mb/s
    for limit in [None, Some(RATE)] {
        let mut net = SimNet::with_config(5, 2, Mtu::M4096, |c| c.unacked_rate = limit);
        let a = ud_qp(&mut net, 0, 0x1111);
        let b = ud_qp(&mut net, 1, 0x1111);
        let la = net.reg(0, 4096, full_access());
        let rb = net.reg(1, 4096 + 40, full_access());
        net.fill_random(&la);
        for i in 0..N {
            let wr = recv_wr(i, rb.sges(0, 4096 + 40));
            net.nodes[1].engine.post_recv(b, wr).unwrap();
        }
        for i in 0..N {
            let mut w = send_wr(i, WrOpcode::Send, la.sges(0, 4096));
            w.ud = Some(UdDest {
                av: AddressVector {
                    dgid: Gid::from_ip("10.0.0.2".parse().unwrap()),
                    ..AddressVector::default()
                },
                remote_qpn: qpn_u32(b),
                remote_qkey: 0x1111,
            });
            net.nodes[0].engine.post_send(0, a, w).unwrap();
        }
        let mut got = 0;
        net.run_until(10_000_000_000, |n| n.count_completions(1) >= N as usize);
        for c in net.take_completions(1) {
            assert_eq!((c.status, c.byte_len), (WcStatus::Success, 4096 + 40));
            got += 1;
        }
        assert_eq!(
            got, N,
            "every datagram arrived (no loss in the simulated network)"
        );
        assert_eq!(&net.mem(&rb)[40..], net.mem(&la), "data verified");
        // The payload's rate (the limit counts headers too: a little under it).
        let rate = (N * 4096) as f64 * 1e9 / net.now as f64;
        eprintln!(
            "UD limit {limit:?}: {:.2} MB/s of payload over {} us",
            rate / 1e6,
            net.now / 1000
        );
        match limit {
            Some(r) => assert!((0.9 * r as f64..1.01 * r as f64).contains(&rate), "{rate}"),
            None => assert!(net.now < 1_000_000, "unpaced: {} ns", net.now),
        }
    }
}

/// An SRQ's next receive buffers are warmed for as many bytes as SENDs placed in its
/// receives since the last time, and no more than its receives hold.
#[test]
fn srq_warms_what_its_sends_placed() {
    let mut net = SimNet::new(4, 2, Mtu::M1024);
    let pd = net.nodes[1].pd;
    let attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = net.nodes[1].engine.create_srq(pd, attr).unwrap();
    let o = RcOpts::default();
    let a = create(&mut net, 0, QpType::Rc, &o, None);
    let b = create(&mut net, 1, QpType::Rc, &o, Some(srq));
    connect_one(&mut net, 0, a, QpType::Rc, 1, b, &o, 1, 2);
    connect_one(&mut net, 1, b, QpType::Rc, 0, a, &o, 2, 1);
    let la = net.reg(0, 8192, full_access());
    let rb = net.reg(1, 6 * 8192, full_access());
    for i in 0..6 {
        let wr = recv_wr(i, rb.sges(i as usize * 8192, 8192));
        net.nodes[1].engine.post_srq_recv(srq, wr).unwrap();
    }
    assert_eq!(net.nodes[1].engine.warm_receives(), 0, "nothing placed yet");
    for (i, len) in [(1, 3000), (2, 5000)] {
        let w = send_wr(i, WrOpcode::Send, la.sges(0, len));
        net.nodes[0].engine.post_send(0, a, w).unwrap();
    }
    net.run(1_000_000_000);
    assert_eq!(net.take_completions(1).len(), 2);
    // 8000 bytes placed: the next receive (8192 bytes) covers them.
    assert_eq!(net.nodes[1].engine.warm_receives(), 8000);
    assert_eq!(net.nodes[1].engine.warm_receives(), 0, "once per placement");
    for i in 3..6 {
        let w = send_wr(i, WrOpcode::Send, la.sges(0, 8192));
        net.nodes[0].engine.post_send(0, a, w).unwrap();
    }
    net.run(1_000_000_000);
    // 24576 bytes placed, and one receive (8192 bytes) left to warm.
    assert_eq!(net.nodes[1].engine.warm_receives(), 8192);
}
