//! Direct receive (payload received straight into registered memory, ICRC checked
//! there) against receive into buffers (ICRC checked there, then the payload copied into
//! registered memory) under loss, reordering, duplication and corruption: every byte a
//! completed message shows is the message's, and nothing outside the target of a WRITE,
//! a posted receive or a READ is ever written (received into buffers, nothing past the
//! message in its receive buffer either).

mod sim;

use sim::*;
use softhca_transport::*;

/// Bytes around and between the targets; nothing may ever write them.
const SENTINEL: u8 = 0xa5;

fn faulty_net(seed: u64, direct: bool) -> SimNet {
    // First/Middle/Last WRITEs: a WRITE Only (the split form) is never planned.
    let mut net = SimNet::with_config(seed, 2, Mtu::M1024, |c| c.split_rc_writes = false);
    net.direct = direct;
    net.faults = Faults {
        loss: 0.01,
        reorder: 0.02,
        duplicate: 0.01,
        corrupt: 0.03,
        ..Faults::default()
    };
    net
}

fn untouched(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == SENTINEL)
}

/// Runs `case` over eight seeds, direct and into buffers: corrupted packets were
/// dropped, and received directly more than `least` packets were executed where they
/// landed.
fn placed_in_one_pass(case: fn(u64, bool) -> Counters, seed: u64, least: u64) {
    for direct in [true, false] {
        let (mut placed, mut bad) = (0, 0);
        for k in 0..8 {
            let c = case(seed + k, direct);
            placed += c.rx_direct;
            bad += c.drop_bad_icrc;
        }
        if direct {
            assert!(placed > least, "received straight into place: {placed}");
        } else {
            assert_eq!(placed, 0, "received into buffers, yet placed directly");
        }
        assert!(bad > 0, "no corrupted packet reached the receiver");
    }
}

#[test]
fn write_lands_only_in_its_target_and_completes_intact() {
    placed_in_one_pass(
        |seed, direct| one_sided_case(seed, direct, WrOpcode::RdmaWrite),
        100,
        400,
    );
}

#[test]
fn send_lands_only_in_posted_receives_and_completes_intact() {
    placed_in_one_pass(send_case, 200, 200);
}

#[test]
fn read_responses_land_only_in_their_read_and_complete_intact() {
    // Fewer directly: a GRO batch behind an early response is received whole.
    placed_in_one_pass(
        |seed, direct| one_sided_case(seed, direct, WrOpcode::RdmaRead),
        300,
        50,
    );
}

/// WRITEs or READs of 9000 bytes (not a multiple of the MTU: a short Last) under
/// faults, into targets with gaps between them (the responder's memory for a WRITE,
/// the requester's for a READ); the counters of the node the data went to.
fn one_sided_case(seed: u64, direct: bool, op: WrOpcode) -> Counters {
    const MSGS: usize = 48;
    const LEN: usize = 9_000;
    const GAP: usize = 700;
    let mut net = faulty_net(seed, direct);
    let o = RcOpts {
        sq_sig_all: true,
        ..RcOpts::default()
    };
    let (a, _b) = pair(&mut net, QpType::Rc, &o);
    let into = usize::from(op == WrOpcode::RdmaWrite);
    let src = net.reg(1 - into, MSGS * LEN, full_access());
    let dst = net.reg(into, GAP + MSGS * (LEN + GAP), full_access());
    net.fill_random(&src);
    net.mem_mut(&dst).fill(SENTINEL);
    let target = |i: usize| GAP + i * (LEN + GAP);
    for i in 0..MSGS {
        let (local, remote) = if into == 1 {
            (src.sges(i * LEN, LEN), dst.addr + target(i) as u64)
        } else {
            (dst.sges(target(i), LEN), src.addr + (i * LEN) as u64)
        };
        let mut wr = send_wr(i as u64, op, local);
        wr.remote_addr = remote;
        wr.rkey = if into == 1 { dst.rkey } else { src.rkey };
        net.nodes[0].engine.post_send(0, a, wr).unwrap();
    }
    let mut steps = 0u64;
    let all = net.run_until(60_000_000_000, |net| {
        steps += 1;
        let s = net.mem(&src);
        let d = net.mem(&dst);
        // Once the requester has its completion, the target holds the message.
        for c in &net.nodes[0].completions {
            let i = c.1.wr_id as usize;
            assert_eq!(c.1.status, WcStatus::Success);
            assert!(
                d[target(i)..target(i) + LEN] == s[i * LEN..(i + 1) * LEN],
                "{op:?} {i} completed but its target differs (step {steps})"
            );
        }
        assert!(untouched(&d[..GAP]));
        for i in 0..MSGS {
            assert!(
                untouched(&d[target(i) + LEN..target(i) + LEN + GAP]),
                "bytes after {op:?} {i}'s target were written (step {steps})"
            );
        }
        net.nodes[0].completions.len() == MSGS
    });
    assert!(all, "not every {op:?} completed (seed {seed})");
    net.nodes[into].engine.counters().clone()
}

/// SENDs of various lengths into receive buffers with gaps between them under faults;
/// the responder's counters.
fn send_case(seed: u64, direct: bool) -> Counters {
    const MSGS: usize = 40;
    const BUF: usize = 12_000;
    const GAP: usize = 500;
    let mut net = faulty_net(seed, direct);
    let o = RcOpts {
        sq_sig_all: true,
        ..RcOpts::default()
    };
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    let len = |i: usize| 3_000 + (i * 2_111) % (BUF - 3_000);
    let src = net.reg(0, MSGS * BUF, full_access());
    let dst = net.reg(1, GAP + MSGS * (BUF + GAP), full_access());
    net.fill_random(&src);
    net.mem_mut(&dst).fill(SENTINEL);
    let buf = |i: usize| GAP + i * (BUF + GAP);
    for i in 0..MSGS {
        net.nodes[1]
            .engine
            .post_recv(b, recv_wr(i as u64, dst.sges(buf(i), BUF)))
            .unwrap();
        let wr = send_wr(i as u64, WrOpcode::Send, src.sges(i * BUF, len(i)));
        net.nodes[0].engine.post_send(0, a, wr).unwrap();
    }
    let all = net.run_until(60_000_000_000, |net| {
        let s = net.mem(&src);
        let d = net.mem(&dst);
        for c in &net.nodes[1].completions {
            let i = c.1.wr_id as usize;
            assert_eq!(
                (c.1.status, c.1.byte_len as usize),
                (WcStatus::Success, len(i))
            );
            assert!(
                d[buf(i)..buf(i) + len(i)] == s[i * BUF..i * BUF + len(i)],
                "receive {i} completed but differs"
            );
        }
        assert!(untouched(&d[..GAP]));
        for i in 0..MSGS {
            assert!(
                untouched(&d[buf(i) + BUF..buf(i) + BUF + GAP]),
                "bytes after receive {i}'s buffer were written"
            );
            // Received into buffers, only packets that passed their ICRC are placed,
            // each where it belongs: never past the message (a direct receive may leave
            // the next message's bytes there, see `direct`).
            assert!(
                direct || untouched(&d[buf(i) + len(i)..buf(i) + BUF]),
                "bytes past message {i} in its receive buffer were written"
            );
        }
        net.nodes[1].completions.len() == MSGS && net.nodes[0].completions.len() == MSGS
    });
    assert!(all, "not every SEND completed (seed {seed})");
    net.nodes[1].engine.counters().clone()
}

#[test]
fn sends_of_two_qps_land_only_in_shared_receives_and_complete_intact() {
    for seed in 400..408 {
        srq_case(faulty_net(seed, false), 2_100, 9_000);
    }
    // Received directly, lossless, messages of two packets: a SEND First is never
    // planned into a shared queue (a SEND of the other QP in the same datagram may take
    // its head first); a Last may be, into the rest of the WQE its First took.
    for seed in 7..15 {
        let mut net = SimNet::new(seed, 2, Mtu::M1024);
        net.direct = true;
        srq_case(net, 2_048, 2_048);
    }
}

const SRQ_MSGS: usize = 24;

/// Two RC QPs of node 0 send `SRQ_MSGS` messages each (`least..=most` bytes, MTU 1024,
/// interleaved) to two QPs of node 1 that share one receive queue; checks that the
/// k-th receive completion of each QP holds that QP's k-th message and nothing outside
/// the posted buffers was written; returns node 1's counters.
fn srq_case(mut net: SimNet, least: usize, most: usize) -> Counters {
    const BUF: usize = 10_000;
    const GAP: usize = 300;
    let o = RcOpts::default();
    let pd = net.nodes[1].pd;
    let attr = SrqAttr {
        max_wr: 2 * SRQ_MSGS as u32,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = net.nodes[1].engine.create_srq(pd, attr).unwrap();
    let mut qps = Vec::new();
    for _ in 0..2 {
        let a = create(&mut net, 0, QpType::Rc, &o, None);
        let b = create(&mut net, 1, QpType::Rc, &o, Some(srq));
        connect_one(&mut net, 0, a, QpType::Rc, 1, b, &o, 10, 20);
        connect_one(&mut net, 1, b, QpType::Rc, 0, a, &o, 20, 10);
        qps.push((a, b));
    }
    let len = |i: usize| least + (i * 1_777) % (most - least + 1);
    let src = net.reg(0, 2 * SRQ_MSGS * BUF, full_access());
    let dst = net.reg(1, GAP + 2 * SRQ_MSGS * (BUF + GAP), full_access());
    net.fill_random(&src);
    net.mem_mut(&dst).fill(SENTINEL);
    let buf = |w: usize| GAP + w * (BUF + GAP);
    for w in 0..2 * SRQ_MSGS {
        let wr = recv_wr(w as u64, dst.sges(buf(w), BUF));
        net.nodes[1].engine.post_srq_recv(srq, wr).unwrap();
    }
    // Message i of QP q is at src[(q * SRQ_MSGS + i) * BUF..], len(i) bytes.
    for i in 0..SRQ_MSGS {
        for (q, &(a, _)) in qps.iter().enumerate() {
            let at = (q * SRQ_MSGS + i) * BUF;
            let wr = send_wr(i as u64, WrOpcode::Send, src.sges(at, len(i)));
            net.nodes[0].engine.post_send(0, a, wr).unwrap();
        }
    }
    let all = net.run_until(60_000_000_000, |net| {
        let (s, d) = (net.mem(&src), net.mem(&dst));
        let mut nth = [0usize; 2];
        for (_, c) in &net.nodes[1].completions {
            let q = qps.iter().position(|&(_, b)| qpn_u32(b) == c.qp_num);
            let q = q.expect("a receive completion of one of the two QPs");
            let (i, w) = (nth[q], c.wr_id as usize);
            nth[q] += 1;
            assert_eq!((c.status, c.byte_len as usize), (WcStatus::Success, len(i)));
            let want = &s[(q * SRQ_MSGS + i) * BUF..][..len(i)];
            assert!(
                d[buf(w)..][..len(i)] == *want,
                "QP {q}'s message {i} differs"
            );
        }
        assert!(untouched(&d[..GAP]));
        for w in 0..2 * SRQ_MSGS {
            let after = &d[buf(w) + BUF..][..GAP];
            assert!(untouched(after), "bytes after receive {w} were written");
        }
        let sent = net.nodes[0].completions.len();
        net.nodes[1].completions.len() == 2 * SRQ_MSGS && sent == 2 * SRQ_MSGS
    });
    assert!(all, "not every SEND completed");
    net.nodes[1].engine.counters().clone()
}

#[test]
fn only_in_order_continuations_are_planned() {
    let mut net = SimNet::with_config(13, 2, Mtu::M1024, |c| c.split_rc_writes = false);
    let (a, b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let src = net.reg(0, 8192, full_access());
    let dst = net.reg(1, 8192, full_access());
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, src.sges(0, 8192));
    wr.remote_addr = dst.addr;
    wr.rkey = dst.rkey;
    net.nodes[0].engine.post_send(0, a, wr).unwrap();
    // The requester's packets, by hand: First, then six Middles and a Last.
    let mut pkts = Vec::new();
    let mut buf = vec![0u8; 65_536];
    let mut from = None;
    while let Some(t) = net.nodes[0].engine.poll_transmit(0, &mut buf) {
        from = Some(std::net::SocketAddr::new(t.src, t.src_port));
        let segs = buf[..t.len].chunks(t.segment_size).enumerate();
        pkts.extend(segs.map(|(k, p)| (k as u16, p.to_vec())));
    }
    assert_eq!(pkts.len(), 8);
    let peer = from.unwrap();
    let us = net.nodes[1].ip;
    let info = |k: u16| DatagramInfo {
        src: peer,
        dst: us,
        segment_index: k,
        tos: 0,
    };
    let eng = &mut net.nodes[1].engine;
    assert_eq!(eng.counters().rcvd_pkts, 0);
    // A WRITE First is never planned: its RETH is not checked before its ICRC.
    assert_eq!(eng.direct_plan(peer.ip(), &pkts[0].1), None);
    eng.handle_datagram(0, &info(pkts[0].0), &pkts[0].1);
    assert_eq!(eng.counters().rcvd_pkts, 1);
    // The Middle at the expected PSN is, into the rest of the WRITE's range but its
    // last byte (programs poll it); the one after it is not, nor is a packet from
    // another address.
    let plan = eng.direct_plan(peer.ip(), &pkts[1].1).expect("planned");
    assert_eq!(
        (plan.dst as u64, plan.room),
        (dst.addr + 1024, 8192 - 1024 - 1)
    );
    assert_eq!(eng.direct_plan(peer.ip(), &pkts[2].1), None);
    assert_eq!(eng.direct_plan(us, &pkts[1].1), None);
    // The Last, at its expected PSN after the Middles, is not planned: it carries the
    // last byte, which lands only once its ICRC is checked.
    for (k, p) in &pkts[1..7] {
        eng.handle_datagram(0, &info(*k), p);
    }
    assert_eq!(eng.counters().rcvd_pkts, 7);
    assert_eq!(eng.direct_plan(peer.ip(), &pkts[7].1), None);
    eng.handle_datagram(0, &info(pkts[7].0), &pkts[7].1);
    assert_eq!(eng.counters().rcvd_pkts, 8);
    let _ = b;
}
