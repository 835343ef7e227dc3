//! RC end to end over the simulated network: SEND/RECV, WRITE (with imm), READ,
//! atomics, inline, scatter/gather, large messages.

mod sim;

use sim::*;
use softhca_transport::*;
use std::net::IpAddr;

#[test]
fn send_recv_with_imm_and_sgl() {
    let mut net = SimNet::new(1, 2, Mtu::M1024);
    let o = RcOpts::default();
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    let src = net.reg(0, 10_000, full_access());
    let dst = net.reg(1, 10_000, full_access());
    net.fill_random(&src);
    // Scatter into two pieces on the receiver.
    let mut sg = dst.sges(0, 3000);
    sg.push(dst.sge(5000, 5000));
    net.nodes[1].engine.post_recv(b, recv_wr(7, sg)).unwrap();
    let mut wr = send_wr(1, WrOpcode::SendWithImm, src.sges(0, 7000));
    wr.imm_data = 0xdead_beef;
    net.nodes[0].engine.post_send(0, a, wr).unwrap();
    net.run(1_000_000_000);
    let s = net.take_completions(0);
    let r = net.take_completions(1);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].wr_id, s[0].status, s[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, WcStatus::Success);
    assert_eq!(r[0].opcode, WcOpcode::Recv);
    assert_eq!(r[0].byte_len, 7000);
    assert_eq!(r[0].imm_data, 0xdead_beef);
    assert!(r[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(r[0].src_qp, qpn_u32(a));
    let (sm, dm) = (net.mem(&src).to_vec(), net.mem(&dst).to_vec());
    assert_eq!(&dm[..3000], &sm[..3000]);
    assert_eq!(&dm[5000..9000], &sm[3000..7000]);
    assert!(dm[3000..5000].iter().all(|&x| x == 0));
}

#[test]
fn zero_byte_send_and_inline() {
    let mut net = SimNet::new(2, 2, Mtu::M256);
    let (a, b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let dst = net.reg(1, 100, full_access());
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(1, dst.sges(0, 100)))
        .unwrap();
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(2, dst.sges(50, 50)))
        .unwrap();
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(10, WrOpcode::Send, Default::default()))
        .unwrap();
    let inline = SendWr {
        wr_id: 11,
        opcode: WrOpcode::Send,
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        payload: Payload::Inline(smallvec::SmallVec::from_slice(b"hello inline")),
        ..SendWr::default()
    };
    net.nodes[0].engine.post_send(0, a, inline).unwrap();
    net.run(1_000_000_000);
    let r = net.take_completions(1);
    assert_eq!(
        r.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(),
        vec![(1, 0), (2, 12)]
    );
    assert_eq!(&net.mem(&dst)[50..62], b"hello inline");
    let s = net.take_completions(0);
    assert_eq!(
        s.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(10, WcStatus::Success), (11, WcStatus::Success)]
    );
}

#[test]
fn write_read_atomics() {
    let mut net = SimNet::new(3, 2, Mtu::M4096);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 200_000, full_access());
    let rb = net.reg(1, 200_000, full_access());
    net.fill_random(&la);
    // WRITE 100 KB to the remote, then READ it back into the second half locally.
    let mut w = send_wr(1, WrOpcode::RdmaWrite, la.sges(0, 100_000));
    w.remote_addr = rb.addr;
    w.rkey = rb.rkey;
    net.nodes[0].engine.post_send(0, a, w).unwrap();
    let mut r = send_wr(2, WrOpcode::RdmaRead, la.sges(100_000, 100_000));
    r.remote_addr = rb.addr;
    r.rkey = rb.rkey;
    net.nodes[0].engine.post_send(0, a, r).unwrap();
    // Atomics on a counter at rb[199_992].
    net.mem_mut(&rb)[199_992..].copy_from_slice(&5u64.to_ne_bytes());
    let mut f = send_wr(3, WrOpcode::AtomicFetchAndAdd, la.sges(0, 8));
    f.remote_addr = rb.addr + 199_992;
    f.rkey = rb.rkey;
    f.compare_add = 10;
    f.flags |= SendFlags::FENCE;
    net.nodes[0].engine.post_send(0, a, f).unwrap();
    let mut c = send_wr(4, WrOpcode::AtomicCmpAndSwp, la.sges(8, 8));
    c.remote_addr = rb.addr + 199_992;
    c.rkey = rb.rkey;
    c.compare_add = 15;
    c.swap = 99;
    net.nodes[0].engine.post_send(0, a, c).unwrap();
    net.run(1_000_000_000);
    let s = net.take_completions(0);
    assert_eq!(
        s.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite),
            (2, WcStatus::Success, WcOpcode::RdmaRead),
            (3, WcStatus::Success, WcOpcode::FetchAdd),
            (4, WcStatus::Success, WcOpcode::CompSwap)
        ]
    );
    assert_eq!(s[1].byte_len, 100_000);
    let lm = net.mem(&la).to_vec();
    // The READ returned what the WRITE put there (its first 16 bytes were later
    // overwritten locally by the atomics' results).
    assert_eq!(&lm[100_000..200_000], &net.mem(&rb)[..100_000]);
    assert_eq!(u64::from_ne_bytes(lm[0..8].try_into().unwrap()), 5);
    assert_eq!(u64::from_ne_bytes(lm[8..16].try_into().unwrap()), 15);
    assert_eq!(
        u64::from_ne_bytes(net.mem(&rb)[199_992..].try_into().unwrap()),
        99
    );
    assert!(net.mem(&rb)[..100_000] == lm[100_000..200_000]);
    // Nothing was dropped on a clean network.
    let c = net.nodes[1].engine.counters();
    assert_eq!(c.drop_bad_icrc + c.drop_malformed + c.duplicate_request, 0);
}

#[test]
fn write_with_imm_consumes_recv() {
    let mut net = SimNet::new(4, 2, Mtu::M512);
    let (a, b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 4000, full_access());
    let rb = net.reg(1, 4000, full_access());
    net.fill_random(&la);
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(55, Default::default()))
        .unwrap();
    let mut w = send_wr(1, WrOpcode::RdmaWriteWithImm, la.sges(0, 3333));
    w.remote_addr = rb.addr + 10;
    w.rkey = rb.rkey;
    w.imm_data = 0x1234;
    net.nodes[0].engine.post_send(0, a, w).unwrap();
    net.run(1_000_000_000);
    let r = net.take_completions(1);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (
            r[0].wr_id,
            r[0].status,
            r[0].opcode,
            r[0].byte_len,
            r[0].imm_data
        ),
        (
            55,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            3333,
            0x1234
        )
    );
    assert!(r[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(&net.mem(&rb)[10..3343], &net.mem(&la)[..3333]);
}

/// Registers `local` random bytes on node 0 and `remote` zeroed bytes on node 1, posts
/// one RDMA WRITE (wr_id 1) of all the local bytes on `a` to the start of the remote MR,
/// runs the network for up to `ns` and returns node 0's completions and the two MRs.
fn one_write(
    net: &mut SimNet,
    a: Qpn,
    local: usize,
    remote: usize,
    ns: u64,
) -> (Vec<Completion>, Mr, Mr) {
    let la = net.reg(0, local, full_access());
    let rb = net.reg(1, remote, full_access());
    net.fill_random(&la);
    let mut w = send_wr(1, WrOpcode::RdmaWrite, la.sges(0, local));
    w.remote_addr = rb.addr;
    w.rkey = rb.rkey;
    net.nodes[0].engine.post_send(0, a, w).unwrap();
    net.run(ns);
    (net.take_completions(0), la, rb)
}

#[test]
fn gso_batches_and_multi_megabyte_write() {
    let mut net = SimNet::new(5, 2, Mtu::M4096);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let size = 8 << 20;
    let (s, la, rb) = one_write(&mut net, a, size, size, 10_000_000_000);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].status, WcStatus::Success);
    assert!(net.mem(&rb) == net.mem(&la));
    assert!(net.max_batch >= 16, "GSO batches used: {}", net.max_batch);
    // Node 0 builds zero-copy: every data packet's payload went from the MR as it is.
    assert_eq!(net.external_payloads, size / 4096);
    // Each GSO send numbers its segments' IPv4 IDs from 0: the receiver predicts that
    // (one ICRC check per packet, no second try).
    assert_eq!(net.nodes[1].engine.counters().icrc_ipv4_id_mispredicted, 0);
    // ACKs are coalesced: far fewer ACK packets than data packets.
    let data_pkts = (size / 4096) as u64;
    let acks = net.nodes[1].engine.counters().sent_pkts;
    assert!(acks * 8 < data_pkts, "acks {acks} for {data_pkts} packets");
}

/// A multi-packet RC WRITE leaves as one WRITE Only per packet, each with a RETH for its
/// own 4 KiB, all in one GSO batch (EngineConfig::split_rc_writes); with the split off it
/// is First/Middle/Last as rxe sends it, and the longer First (its RETH) breaks the
/// batch. Both place the same bytes.
#[test]
fn split_write_is_one_batch_of_write_only_packets() {
    for split in [true, false] {
        // The packets' shapes alone: no congestion window splits the WRITE's flight.
        let mut net = SimNet::with_config(6, 2, Mtu::M4096, |c| {
            c.split_rc_writes = split;
            c.cc = CcAlgorithm::Off;
        });
        let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
        let size = 16 * 4096;
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let s2 = seen.clone();
        net.filter = Some(Box::new(move |from, p| {
            if from == 0 {
                s2.borrow_mut().push(p.to_vec());
            }
            false
        }));
        let (s, la, rb) = one_write(&mut net, a, size, size, 1_000_000_000);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].status, WcStatus::Success);
        assert!(net.mem(&rb) == net.mem(&la));
        let pkts = seen.borrow();
        assert_eq!(pkts.len(), 16);
        // BTH (12 bytes), then the RETH: VA (8), R_Key (4), DMA length (4).
        let reth = |p: &[u8]| {
            (
                u64::from_be_bytes(p[12..20].try_into().unwrap()),
                u32::from_be_bytes(p[20..24].try_into().unwrap()),
                u32::from_be_bytes(p[24..28].try_into().unwrap()),
            )
        };
        let ops: Vec<u8> = pkts.iter().map(|p| p[0]).collect();
        if split {
            assert!(ops.iter().all(|&o| o == 0x0a), "WRITE Only each: {ops:x?}");
            for (i, p) in pkts.iter().enumerate() {
                assert_eq!(reth(p), (rb.addr + i as u64 * 4096, rb.rkey, 4096));
                // AckReq on the WR's last packet only (no periodic one in 16).
                assert_eq!(p[8] & 0x80 != 0, i == 15);
            }
            assert_eq!(net.max_batch, 16, "one GSO batch");
        } else {
            assert_eq!(ops[0], 0x06, "WRITE First");
            assert!(ops[1..15].iter().all(|&o| o == 0x07), "Middles: {ops:x?}");
            assert_eq!(ops[15], 0x08, "WRITE Last");
            assert_eq!(reth(&pkts[0]), (rb.addr, rb.rkey, size as u32));
            assert!(net.max_batch < 16, "the First breaks the batch");
        }
    }
}

/// With one UDP source port for the device (softhca's sockets), packets of several QPs
/// to one peer share a GSO batch: four QPs' one-packet WRITEs leave as one Transmit, and
/// the four ACKs as one. Each QP's data lands where it should.
/// Node 0 posts one 4 KiB RDMA WRITE of random bytes on each of `qps` (WR ID its index),
/// into its own 4 KiB of an MR on node 1; returns (source MR, target MR).
fn one_write_each(net: &mut SimNet, qps: &[(Qpn, Qpn)]) -> (Mr, Mr) {
    let la = net.reg(0, qps.len() * 4096, full_access());
    let rb = net.reg(1, qps.len() * 4096, full_access());
    net.fill_random(&la);
    for (i, (a, _)) in qps.iter().enumerate() {
        let mut w = send_wr(i as u64, WrOpcode::RdmaWrite, la.sges(i * 4096, 4096));
        w.remote_addr = rb.addr + (i * 4096) as u64;
        w.rkey = rb.rkey;
        net.nodes[0].engine.post_send(0, *a, w).unwrap();
    }
    (la, rb)
}

/// Two engines sending from UDP port 4791 (as softhca's device socket), four RC QPs
/// between them, and node 0's [`one_write_each`] posted on them.
fn four_qps_one_write_each(seed: u64) -> (SimNet, Mr, Mr) {
    let mut net = SimNet::new(seed, 2, Mtu::M4096);
    for n in &mut net.nodes {
        n.engine.set_source_port(Some(4791));
    }
    let qps: Vec<(Qpn, Qpn)> = (0..4)
        .map(|_| pair(&mut net, QpType::Rc, &RcOpts::default()))
        .collect();
    let (la, rb) = one_write_each(&mut net, &qps);
    (net, la, rb)
}

#[test]
fn qps_to_one_peer_share_a_gso_batch() {
    let (mut net, la, rb) = four_qps_one_write_each(8);
    let mut buf = vec![0u8; 256 * 1024];
    let t = net.nodes[0].engine.poll_transmit(0, &mut buf).unwrap();
    assert_eq!(t.len / t.segment_size, 4, "four QPs' WRITEs in one batch");
    assert_eq!(t.src_port, 4791);
    assert!(net.nodes[0].engine.poll_transmit(0, &mut buf).is_none());
    let info = |t: &Transmit, i: u16| DatagramInfo {
        src: std::net::SocketAddr::new(t.src, t.src_port),
        dst: t.dst.ip(),
        segment_index: i,
        tos: 0,
    };
    let segs: Vec<Vec<u8>> = buf[..t.len]
        .chunks(t.segment_size)
        .map(<[u8]>::to_vec)
        .collect();
    for (i, seg) in segs.iter().enumerate() {
        net.nodes[1]
            .engine
            .handle_datagram(0, &info(&t, i as u16), seg);
    }
    assert!(net.mem(&rb) == net.mem(&la));
    let t = net.nodes[1].engine.poll_transmit(0, &mut buf).unwrap();
    assert_eq!(t.len / t.segment_size, 4, "four ACKs in one batch");
    assert!(net.nodes[1].engine.poll_transmit(0, &mut buf).is_none());
    let acks: Vec<Vec<u8>> = buf[..t.len]
        .chunks(t.segment_size)
        .map(<[u8]>::to_vec)
        .collect();
    for (i, ack) in acks.iter().enumerate() {
        assert_eq!(ack[0], 0x11, "ACKNOWLEDGE");
        net.nodes[0]
            .engine
            .handle_datagram(0, &info(&t, i as u16), ack);
    }
    let mut done: Vec<(u64, WcStatus)> =
        std::iter::from_fn(|| net.nodes[0].engine.poll_completion())
            .map(|(_, c)| (c.wr_id, c.status))
            .collect();
    done.sort_unstable_by_key(|&(id, _)| id);
    assert_eq!(
        done,
        (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
}

/// A split WRITE that runs past the end of the remote MR: each WRITE Only is checked on
/// its own, so the packets in bounds are placed and the first one out of bounds is NAKed
/// (a WRITE First would carry the whole length and be refused whole). The requester
/// sees the same error as with First/Middle/Last.
#[test]
fn split_write_past_the_mr_end_is_a_remote_access_error() {
    let mut net = SimNet::new(7, 2, Mtu::M4096);
    let (a, b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let (s, la, rb) = one_write(&mut net, a, 4 * 4096, 2 * 4096, 1_000_000_000);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].status, WcStatus::RemAccessErr);
    assert_eq!(
        net.nodes[1].engine.query_qp(b).unwrap().0.qp_state,
        QpState::Err
    );
    assert!(net.mem(&rb) == &net.mem(&la)[..2 * 4096]);
    assert_eq!(
        net.nodes[1].engine.counters().sent_remote_access_err_naks,
        1
    );
}

/// A 1 GiB RDMA WRITE (the largest message verbs users commonly post) in one WR.
/// Runs in release builds (CI runs the tests in release); ignored in debug, where it is slow.
#[test]
#[cfg_attr(debug_assertions, ignore)]
fn one_gib_write() {
    let mut net = SimNet::new(6, 2, Mtu::M4096);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let size = 1 << 30;
    let la = net.reg(0, size, full_access());
    let rb = net.reg(1, size, full_access());
    for (i, x) in net.mem_mut(&la).iter_mut().enumerate() {
        *x = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1];
    }
    let mut w = send_wr(1, WrOpcode::RdmaWrite, la.sges(0, size));
    w.remote_addr = rb.addr;
    w.rkey = rb.rkey;
    net.nodes[0].engine.post_send(0, a, w).unwrap();
    net.run(1_000_000_000_000);
    let s = net.take_completions(0);
    assert_eq!((s[0].status, s[0].byte_len), (WcStatus::Success, 1 << 30));
    assert!(net.mem(&rb) == net.mem(&la));
}

/// 64 QPs with 32 large WRITEs each would put 64 × 1024 PSNs on the wire if each QP
/// only obeyed its own window; the device budget keeps the sum bounded at every step,
/// every WRITE still completes and every byte lands.
#[test]
fn device_budget_bounds_inflight_over_many_qps() {
    let mut net = SimNet::new(9, 2, Mtu::M1024);
    let o = RcOpts::default();
    let nqp = 64;
    let msg = 64 * 1024;
    let per_qp = 32;
    let qps: Vec<_> = (0..nqp).map(|_| pair(&mut net, QpType::Rc, &o)).collect();
    let src = net.reg(0, msg, full_access());
    let dst = net.reg(1, nqp * msg, full_access());
    net.fill_random(&src);
    for (i, (a, _)) in qps.iter().enumerate() {
        for k in 0..per_qp {
            let mut wr = send_wr(
                (i * per_qp + k) as u64,
                WrOpcode::RdmaWrite,
                src.sges(0, msg),
            );
            wr.remote_addr = dst.addr + (i * msg) as u64;
            wr.rkey = dst.rkey;
            wr.flags = SendFlags::SIGNALED;
            net.nodes[0].engine.post_send(0, *a, wr).unwrap();
        }
    }
    let (_, limit) = net.nodes[0].engine.device_inflight_psns();
    let msg_psns = (msg / 1024) as u32;
    let mut peak = 0;
    let mut steps = 0u64;
    while net.count_completions(0) < nqp * per_qp && steps < 10_000_000 {
        if !net.step() {
            break;
        }
        steps += 1;
        let (now, _) = net.nodes[0].engine.device_inflight_psns();
        peak = peak.max(now);
        // A WQE starts only below the limit, and reserves its PSNs at once.
        assert!(
            now < limit + msg_psns,
            "{now} PSNs in flight, limit {limit}"
        );
    }
    let done = net.take_completions(0);
    assert_eq!(done.len(), nqp * per_qp);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    assert!(peak >= limit / 2, "the budget was never used: peak {peak}");
    assert_eq!(net.nodes[0].engine.device_inflight_psns().0, 0);
    let (s, d) = (net.mem(&src).to_vec(), net.mem(&dst).to_vec());
    for i in 0..nqp {
        assert_eq!(&d[i * msg..(i + 1) * msg], &s[..], "QP {i}");
    }
}

/// A ping-pong answer and the ACK of the request it answers leave as one GSO batch: the
/// answer first, the ACK as the shorter last segment (the kernel carries one datagram
/// instead of two; a GRO socket receives them in one). Both are accepted by the peer.
#[test]
fn answer_and_ack_leave_in_one_gso_batch() {
    let mut net = SimNet::new(9, 2, Mtu::M4096);
    let (a, b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 64, full_access());
    let lb = net.reg(1, 64, full_access());
    net.nodes[0]
        .engine
        .post_recv(a, recv_wr(1, la.sges(0, 64)))
        .unwrap();
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(2, lb.sges(0, 64)))
        .unwrap();
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(3, WrOpcode::Send, la.sges(0, 8)))
        .unwrap();
    let mut buf = vec![0u8; 65536];
    let t = net.nodes[0].engine.poll_transmit(0, &mut buf).unwrap();
    let request = buf[..t.len].to_vec();
    let info = |t: &Transmit, i: u16| DatagramInfo {
        src: std::net::SocketAddr::new(t.src, t.src_port),
        dst: t.dst.ip(),
        segment_index: i,
        tos: 0,
    };
    // Node 1 receives the request (its ACK is now owed) and answers before sending.
    net.nodes[1]
        .engine
        .handle_datagram(0, &info(&t, 0), &request);
    assert!(net.nodes[1].engine.only_acks_ready());
    net.nodes[1]
        .engine
        .post_send(0, b, send_wr(4, WrOpcode::Send, lb.sges(0, 8)))
        .unwrap();
    assert!(!net.nodes[1].engine.only_acks_ready());
    let t = net.nodes[1].engine.poll_transmit(0, &mut buf).unwrap();
    assert!(net.nodes[1].engine.poll_transmit(0, &mut buf).is_none());
    let segs: Vec<Vec<u8>> = buf[..t.len]
        .chunks(t.segment_size)
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(segs.len(), 2, "one batch of two packets");
    assert_eq!(segs[0][0], 0x04, "SEND only first");
    assert_eq!(segs[1][0], 0x11, "ACKNOWLEDGE last");
    assert!(segs[1].len() < segs[0].len());
    for (i, s) in segs.iter().enumerate() {
        net.nodes[0]
            .engine
            .handle_datagram(0, &info(&t, i as u16), s);
    }
    let c = net.take_completions(0);
    let mut got: Vec<(u64, WcStatus)> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    got.sort_unstable_by_key(|g| g.0);
    assert_eq!(got, [(1, WcStatus::Success), (3, WcStatus::Success)]);
}

/// A transmit that ended short of a full GSO send (the 16th packet of a 64 KiB WRITE at
/// MTU 4096) is filled up by the next WRITE's packets (`poll_transmit_append`), which
/// continue its packet numbering; both WRITEs arrive whole and in order.
#[test]
fn a_short_transmit_is_filled_by_the_next_post() {
    const GSO_MAX: usize = 65_507;
    const LEN: usize = 65_536;
    // Batching alone: no congestion window holds the third message back.
    let mut net = SimNet::with_config(31, 2, Mtu::M4096, |c| c.cc = CcAlgorithm::Off);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let src = net.reg(0, 2 * LEN, full_access());
    let dst = net.reg(1, 2 * LEN, full_access());
    net.fill_random(&src);
    let post = |net: &mut SimNet, id: u64, off: usize| {
        let mut wr = send_wr(id, WrOpcode::RdmaWrite, src.sges(off, LEN));
        wr.remote_addr = dst.addr + off as u64;
        wr.rkey = dst.rkey;
        net.nodes[0].engine.post_send(0, a, wr).unwrap();
    };
    let mut bufs = vec![vec![0u8; GSO_MAX]; 3];
    let mut pieces: Vec<Vec<TxPiece>> = vec![Vec::new(); 3];
    let now = net.now;

    post(&mut net, 1, 0);
    let e = &mut net.nodes[0].engine;
    let t0 = e
        .poll_transmit_gather(now, &mut bufs[0], &mut pieces[0])
        .unwrap();
    let t1 = e
        .poll_transmit_gather(now, &mut bufs[1], &mut pieces[1])
        .unwrap();
    assert_eq!(
        (t0.packets(), t1.packets()),
        (15, 1),
        "64 KiB is one packet more than a GSO send"
    );
    assert!(e
        .poll_transmit_gather(now, &mut bufs[2], &mut pieces[2])
        .is_none());
    assert!(
        e.poll_transmit_append(now, &mut bufs[1], &mut pieces[1], &t1)
            .is_none(),
        "nothing ready: nothing added"
    );

    post(&mut net, 2, LEN);
    let e = &mut net.nodes[0].engine;
    let t1 = e
        .poll_transmit_append(now, &mut bufs[1], &mut pieces[1], &t1)
        .unwrap();
    assert_eq!(t1.packets(), 15);
    assert_eq!(pieces[1].len(), 15);
    let t2 = e
        .poll_transmit_gather(now, &mut bufs[2], &mut pieces[2])
        .unwrap();
    assert_eq!(t2.packets(), 2);

    for (i, t) in [t0, t1, t2].iter().enumerate() {
        let mem = net.nodes[0].engine.memory();
        seal_gathered(mem, t, &mut bufs[i], &pieces[i]);
        let bytes = join_pieces(mem, &bufs[i], &pieces[i]);
        net.send_transmit(0, t, &bytes);
    }
    net.run(1_000_000_000);
    let c = net.take_completions(0);
    assert_eq!(c.len(), 2);
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(net.mem(&dst), net.mem(&src), "both WRITEs placed whole");
    assert_eq!(
        net.nodes[1]
            .engine
            .counters()
            .iter()
            .find(|(n, _)| *n == "drop_bad_icrc")
            .map(|(_, v)| v),
        Some(0),
        "the appended packets carry the ICRC of their position"
    );
}

/// A gathered build leaves every packet unsealed (ICRC zero), those built in the buffer
/// and those whose payload stays in registered memory alike, and `Transmit::seal` seals
/// them for the port and IPv4 ID given (an external payload read through
/// `MemoryTable::external_payload`). The ICRC of each is checked here, then by the
/// receiver.
#[test]
fn gathered_packets_are_sealed_by_the_caller() {
    const SMALL: usize = 64;
    const LARGE: usize = 8192;
    let mut net = SimNet::new(37, 2, Mtu::M4096);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let src = net.reg(0, SMALL + LARGE, full_access());
    let dst = net.reg(1, SMALL + LARGE, full_access());
    net.fill_random(&src);
    for (id, off, len) in [(1, 0, SMALL), (2, SMALL, LARGE)] {
        let mut wr = send_wr(id, WrOpcode::RdmaWrite, src.sges(off, len));
        wr.remote_addr = dst.addr + off as u64;
        wr.rkey = dst.rkey;
        net.nodes[0].engine.post_send(0, a, wr).unwrap();
    }
    let now = net.now;
    let (mut unsealed, mut external) = (0, 0);
    loop {
        let mut buf = vec![0u8; 65_507];
        let mut pieces = Vec::new();
        let Some(t) = net.nodes[0]
            .engine
            .poll_transmit_gather(now, &mut buf, &mut pieces)
        else {
            break;
        };
        let mem = net.nodes[0].engine.memory();
        for (i, p) in pieces.iter().enumerate() {
            let end = p.start + p.head + p.tail;
            assert_eq!(buf[end - 4..end], [0; 4], "left for the caller");
            match p.external {
                None => {
                    assert!(t.seal(&mut buf, p, &[], t.src_port, i as u16));
                    unsealed += 1;
                }
                Some(e) => {
                    let payload = mem.external_payload(&e).unwrap();
                    assert!(
                        !t.seal(&mut buf, p, &payload[1..], t.src_port, i as u16),
                        "a payload of another length is refused"
                    );
                    assert!(t.seal(&mut buf, p, payload, t.src_port, i as u16));
                    external += 1;
                }
            }
        }
        let bytes = join_pieces(mem, &buf, &pieces);
        let seg = t.segment_size.max(1);
        for (i, pkt) in bytes.chunks(seg).enumerate() {
            let (IpAddr::V4(s), IpAddr::V4(d)) = (t.src, t.dst.ip()) else {
                panic!("IPv4 test network");
            };
            let pseudo = softhca_wire::UdpPseudo {
                ip: softhca_wire::IpPseudo::V4 {
                    src: s,
                    dst: d,
                    id: i as u16,
                    dont_fragment: true,
                },
                sport: t.src_port,
                dport: t.dst.port(),
            };
            assert!(softhca_wire::verify(&pseudo, pkt), "packet {i} sealed");
        }
        net.send_transmit(0, &t, &bytes);
    }
    assert!(
        unsealed >= 1 && external >= 1,
        "{unsealed} in the buffer, {external} not"
    );
    net.run(1_000_000_000);
    let c = net.take_completions(0);
    assert_eq!(c.len(), 2);
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(net.mem(&dst), net.mem(&src));
    assert_eq!(net.nodes[1].engine.counters().drop_bad_icrc, 0);
}

/// The engine says what it built and what it received, so that a datapath never reads
/// opcodes: a requester's WRITE is not `only_acks` and its packets are `Other`; the
/// responder's answer is `only_acks`, and `segment_kind` reads it as an ACK to the
/// requester's QP, whose send CQ it completes on.
#[test]
fn transmits_and_segments_say_whether_they_are_acks() {
    let mut net = SimNet::new(41, 2, Mtu::M1024);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let src = net.reg(0, 4096, full_access());
    let dst = net.reg(1, 4096, full_access());
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, src.sges(0, 2048));
    wr.remote_addr = dst.addr;
    wr.rkey = dst.rkey;
    net.nodes[0].engine.post_send(0, a, wr).unwrap();
    let mut buf = vec![0u8; 65_507];
    let t = net.nodes[0].engine.poll_transmit(0, &mut buf).unwrap();
    assert!(!t.only_acks);
    assert_eq!(t.packets(), 2);
    let from = std::net::SocketAddr::new(t.src, t.src_port);
    let to = net.nodes[1].ip;
    for (k, pkt) in buf[..t.len].chunks(t.segment_size).enumerate() {
        assert_eq!(Engine::segment_kind(pkt), SegmentKind::Other);
        let info = DatagramInfo {
            src: from,
            dst: to,
            segment_index: k as u16,
            tos: 0,
        };
        net.nodes[1].engine.handle_datagram(0, &info, pkt);
    }
    let ack = net.nodes[1]
        .engine
        .poll_transmit(0, &mut buf)
        .expect("the WRITE's ACK");
    assert!(ack.only_acks);
    assert_eq!(ack.packets(), 1);
    assert_eq!(
        Engine::segment_kind(&buf[..ack.len]),
        SegmentKind::Ack { qpn: a }
    );
    assert_eq!(net.nodes[0].engine.send_cq(a), Some(net.nodes[0].cq));
}

/// The AV's GRH traffic class is the IP TOS of all of a QP's packets, requests and
/// ACKs (rxe's `prepare_ipv4_hdr` takes it from the AV): QPs to one peer that differ
/// only in it do not share a GSO batch, whose packets leave with one TOS.
#[test]
fn traffic_class_is_the_tos_of_a_qps_packets() {
    let mut net = SimNet::new(9, 2, Mtu::M4096);
    for n in &mut net.nodes {
        n.engine.set_source_port(Some(4791));
    }
    let marked = RcOpts {
        traffic_class: 0x20,
        ..RcOpts::default()
    };
    let qps = [
        pair(&mut net, QpType::Rc, &marked),
        pair(&mut net, QpType::Rc, &RcOpts::default()),
    ];
    let (la, rb) = one_write_each(&mut net, &qps);
    let mut buf = vec![0u8; 256 * 1024];
    let mut toses = |node: usize, net: &mut SimNet| {
        let mut got = Vec::new();
        while let Some(t) = net.nodes[node].engine.poll_transmit(0, &mut buf) {
            let info = DatagramInfo {
                src: std::net::SocketAddr::new(t.src, t.src_port),
                dst: t.dst.ip(),
                segment_index: 0,
                tos: 0,
            };
            got.push((t.tos, t.packets()));
            let pkt = buf[..t.len].to_vec();
            net.nodes[1 - node].engine.handle_datagram(0, &info, &pkt);
        }
        got.sort_unstable();
        got
    };
    assert_eq!(toses(0, &mut net), [(0, 1), (0x20, 1)], "WRITEs");
    assert_eq!(toses(1, &mut net), [(0, 1), (0x20, 1)], "ACKs");
    assert!(net.mem(&rb) == net.mem(&la));
}

/// A bundle (`softhca_wire::bundle`): four QPs' WRITEs, each packet sealed with IPv4 ID 0
/// and put in one datagram behind its length, the second one corrupted. The other three
/// land; the corrupted one is dropped as any packet with a bad ICRC; the datagram's own
/// IPv4 ID plays no part.
#[test]
fn a_bundles_packets_are_checked_and_executed_one_by_one() {
    let (mut net, la, rb) = four_qps_one_write_each(41);
    let mut buf = vec![0u8; 65_507];
    let mut pieces = Vec::new();
    let t = net.nodes[0]
        .engine
        .poll_transmit_gather(0, &mut buf, &mut pieces)
        .unwrap();
    assert_eq!(pieces.len(), 4);
    let mem = net.nodes[0].engine.memory();
    let mut bundle = softhca_wire::bundle_header().to_vec();
    for (i, p) in pieces.iter().enumerate() {
        let payload = p
            .external
            .map_or(&[][..], |e| mem.external_payload(&e).unwrap());
        assert!(t.seal(&mut buf, p, payload, t.src_port, 0));
        let mut pkt = buf[p.start..p.start + p.head].to_vec();
        pkt.extend_from_slice(payload);
        pkt.extend_from_slice(&buf[p.start + p.head..p.start + p.head + p.tail]);
        if i == 1 {
            pkt[40] ^= 1;
        }
        bundle.extend_from_slice(&(pkt.len() as u16).to_be_bytes());
        bundle.extend_from_slice(&pkt);
    }
    let info = DatagramInfo {
        src: std::net::SocketAddr::new(t.src, t.src_port),
        dst: t.dst.ip(),
        segment_index: 0,
        tos: 0,
    };
    net.nodes[1].engine.handle_datagram(0, &info, &bundle);
    let c = net.nodes[1].engine.counters();
    assert_eq!((c.rx_bundles, c.drop_bad_icrc, c.drop_malformed), (1, 1, 0));
    let (got, want) = (net.mem(&rb).to_vec(), net.mem(&la).to_vec());
    for i in 0..4 {
        let r = i * 4096..(i + 1) * 4096;
        assert_eq!(got[r.clone()] == want[r], i != 1, "WRITE {i}");
    }
    // A bundle cut short: the packets before the cut still count.
    let cut = &bundle[..bundle.len() - 1];
    net.nodes[1].engine.handle_datagram(0, &info, cut);
    let c = net.nodes[1].engine.counters();
    assert_eq!((c.rx_bundles, c.drop_malformed), (2, 1));
    assert_eq!(c.duplicate_request, 2, "WRITEs 0 and 2 again");
}

/// rxe sizes a send WQE by the larger of its SGE list and its inline data and grants
/// both limits in full: a QP that asked for one SGE and no inline data may post 16
/// inline bytes (rdma_xclient does), and is told so; 17 are refused.
#[test]
fn send_caps_are_rounded_to_the_wqe_as_rxe_rounds_them() {
    let mut net = SimNet::new(2, 2, Mtu::M1024);
    let cap = |max_send_sge, max_inline_data| QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge,
        max_recv_sge: 1,
        max_inline_data,
    };
    let create = |net: &mut SimNet, node: usize, cap: QpCap| {
        let n = &mut net.nodes[node];
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            pd: n.pd,
            send_cq: n.cq,
            recv_cq: n.cq,
            srq: None,
            cap,
            sq_sig_all: false,
        };
        let qpn = n.engine.create_qp(&init).unwrap();
        let (_, got) = n.engine.query_qp(qpn).unwrap();
        (qpn, (got.cap.max_send_sge, got.cap.max_inline_data))
    };
    for (asked, granted) in [
        (cap(1, 0), (1, 16)),
        (cap(0, 0), (1, 16)),
        (cap(2, 20), (2, 32)),
        (cap(1, 100), (6, 100)),
    ] {
        assert_eq!(create(&mut net, 0, asked).1, granted, "{asked:?}");
    }
    let o = RcOpts::default();
    let (a, _) = create(&mut net, 0, cap(1, 0));
    let (b, _) = create(&mut net, 1, cap(1, 0));
    connect_one(&mut net, 0, a, QpType::Rc, 1, b, &o, 100, 200);
    connect_one(&mut net, 1, b, QpType::Rc, 0, a, &o, 200, 100);
    let dst = net.reg(1, 64, full_access());
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(1, dst.sges(0, 64)))
        .unwrap();
    let inline = |wr_id, bytes: &[u8]| SendWr {
        wr_id,
        opcode: WrOpcode::Send,
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        payload: Payload::Inline(smallvec::SmallVec::from_slice(bytes)),
        ..SendWr::default()
    };
    let engine = &mut net.nodes[0].engine;
    assert!(engine.post_send(0, a, inline(2, &[7; 17])).is_err());
    engine
        .post_send(0, a, inline(3, b"sixteen bytes!!!"))
        .unwrap();
    net.run(1_000_000_000);
    let r = net.take_completions(1);
    assert_eq!(
        r.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(),
        vec![(1, 16)]
    );
    assert_eq!(&net.mem(&dst)[..16], b"sixteen bytes!!!");
}

/// A connected QP's path MTU is bounded by its source GID's interface, not by the
/// port's active MTU (the least of every served interface's): a device serving
/// loopback and a 1500-byte Ethernet runs MTU 4096 between loopback addresses, as the
/// kernel's rdma_cm offers it there. On a GID whose interface carries 1024, 4096 is
/// refused.
#[test]
fn path_mtu_is_bounded_by_the_source_gids_interface() {
    let mut net = SimNet::with_config(9, 2, Mtu::M4096, |c| {
        c.max_mtu = Mtu::M1024;
        c.gid_mtus = vec![Mtu::M4096];
    });
    let o = RcOpts {
        mtu: Some(Mtu::M4096),
        ..RcOpts::default()
    };
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    let src = net.reg(0, 65536, full_access());
    let dst = net.reg(1, 65536, full_access());
    net.fill_random(&src);
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(1, dst.sges(0, 65536)))
        .unwrap();
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(2, WrOpcode::Send, src.sges(0, 65536)))
        .unwrap();
    net.run(1_000_000_000);
    let r = net.take_completions(1);
    assert_eq!(
        (r.len(), r[0].status, r[0].byte_len),
        (1, WcStatus::Success, 65536)
    );
    assert!(net.mem(&dst) == net.mem(&src));
    assert_eq!(
        net.nodes[0].engine.counters().sent_pkts,
        16,
        "4096-byte packets"
    );

    // The same device with its GID on a 1500-byte interface.
    let mut net = SimNet::with_config(9, 2, Mtu::M4096, |c| {
        c.max_mtu = Mtu::M1024;
        c.gid_mtus = vec![Mtu::M1024];
    });
    let (a, b) = (
        create(&mut net, 0, QpType::Rc, &o, None),
        create(&mut net, 1, QpType::Rc, &o, None),
    );
    let c = connect_params(&net, 1, b, &o, 0, 0);
    assert!(matches!(
        net.nodes[0].engine.connect_qp(0, a, o.access, &c),
        Err(TransportError::InvalidArgument(_))
    ));
    let a = create(&mut net, 0, QpType::Rc, &o, None);
    let o = RcOpts {
        mtu: Some(Mtu::M1024),
        ..o
    };
    connect_one(&mut net, 0, a, QpType::Rc, 1, b, &o, 0, 0);
}
