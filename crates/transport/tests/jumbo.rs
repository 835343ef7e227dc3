//! Packets above the path MTU between two softhca devices (`EngineConfig::jumbo_mtu`,
//! agreed in multipath's negotiation): SENDs, WRITEs and READ responses are cut into
//! them, recovery under loss, reordering and duplication resends the same packets, and
//! without both ends' offer (or with a smaller path MTU than 4096) no packet exceeds the
//! MTU. Every test checks every byte.

mod sim;

use std::cell::RefCell;
use std::rc::Rc;

use sim::*;
use softhca_transport::*;

const JUMBO: u64 = 16384;
/// Message sizes around the packet sizes (4096 and 16384) and across many packets.
const SIZES: [usize; 8] = [1, 4095, 4097, 16384, 16385, 50_000, 65_536, 200_001];

/// Two nodes whose engines offer `jumbo_a` and `jumbo_b`, and a connected RC pair.
fn setup(seed: u64, (jumbo_a, jumbo_b): (u64, u64), o: &RcOpts) -> (SimNet, Qpn, Qpn) {
    let mut net = SimNet::with_config(seed, 2, Mtu::M4096, |cfg| {
        cfg.mp = MpConfig {
            enabled: true,
            ..MpConfig::default()
        };
        // Node 0 is 10.0.0.1 (`SimNet::with_config`).
        let first = cfg.gids[0].to_ip() == std::net::IpAddr::from([10, 0, 0, 1]);
        cfg.jumbo_mtu = if first { jumbo_a } else { jumbo_b };
    });
    let (a, b) = pair(&mut net, QpType::Rc, o);
    (net, a, b)
}

/// The largest payload put on the wire: of SEND and WRITE packets (by length, less the
/// BTH, a RETH where one is, and the ICRC), and of READ response Middles.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Largest {
    request: usize,
    read_response: usize,
}

fn watch_largest(net: &mut SimNet) -> Rc<RefCell<Largest>> {
    let largest = Rc::new(RefCell::new(Largest::default()));
    let l = largest.clone();
    net.filter = Some(Box::new(move |_, pkt| {
        let mut m = l.borrow_mut();
        let (slot, headers) = match pkt[0] {
            0x00..=0x05 => (&mut m.request, 12), // SEND First .. Only with immediate
            0x06..=0x0b => (&mut m.request, 12 + 16), // WRITE (Middle, Last: counted low)
            0x0e => (&mut m.read_response, 12),  // READ response Middle
            _ => return false,
        };
        *slot = (*slot).max(pkt.len().saturating_sub(headers + 4));
        false
    }));
    largest
}

/// Run until node 0 has `n` completions, all successes in posting order.
fn complete(net: &mut SimNet, node: usize, n: usize) {
    let mut got = Vec::new();
    while got.len() < n && net.now < 5_000_000_000 {
        if !net.step() {
            break;
        }
        got.extend(net.take_completions(node));
    }
    assert_eq!(got.len(), n, "completions by {} ns", net.now);
    for (i, c) in got.iter().enumerate() {
        assert_eq!(c.status, WcStatus::Success, "WR {i}: {c:?}");
    }
}

/// Let the negotiation finish (a few round trips of virtual time).
fn negotiate(net: &mut SimNet) {
    let end = net.now + 50_000_000;
    while net.now < end && net.step() {}
}

/// Posts on node 0's `a` an RDMA `op` of each size in [`SIZES`], one after the other
/// in `local` and at the same offsets in `remote`.
fn post_rdma(net: &mut SimNet, a: Qpn, op: WrOpcode, local: &Mr, remote: &Mr) {
    let mut off = 0;
    for (i, &len) in SIZES.iter().enumerate() {
        let mut w = send_wr(i as u64, op, local.sges(off, len));
        w.remote_addr = remote.addr + off as u64;
        w.rkey = remote.rkey;
        let now = net.now;
        net.nodes[0].engine.post_send(now, a, w).expect("post");
        off += len;
    }
}

/// WRITEs, SENDs and READs of every size in [`SIZES`] from node 0, each checked byte for
/// byte; returns the largest payloads seen on the wire.
fn every_op(net: &mut SimNet, a: Qpn, b: Qpn) -> Largest {
    let largest = watch_largest(net);
    let total: usize = SIZES.iter().sum();
    let src = net.reg(0, total, full_access());
    let dst = net.reg(1, total, full_access());
    net.fill_random(&src);
    post_rdma(net, a, WrOpcode::RdmaWrite, &src, &dst);
    complete(net, 0, SIZES.len());
    assert_eq!(net.mem(&src), net.mem(&dst), "WRITEs");

    let rcv = net.reg(1, total, full_access());
    let mut off = 0;
    for (i, &len) in SIZES.iter().enumerate() {
        net.nodes[1]
            .engine
            .post_recv(b, recv_wr(i as u64, rcv.sges(off, len)))
            .expect("post_recv");
        let w = send_wr(i as u64, WrOpcode::Send, src.sges(off, len));
        let now = net.now;
        net.nodes[0].engine.post_send(now, a, w).expect("post SEND");
        off += len;
    }
    complete(net, 0, SIZES.len());
    complete(net, 1, SIZES.len());
    assert_eq!(net.mem(&src), net.mem(&rcv), "SENDs");

    let back = net.reg(0, total, full_access());
    post_rdma(net, a, WrOpcode::RdmaRead, &back, &dst);
    complete(net, 0, SIZES.len());
    assert_eq!(net.mem(&src), net.mem(&back), "READs");
    let l = *largest.borrow();
    l
}

/// Requests and READ responses both in packets of `size`.
fn both(size: u64) -> Largest {
    let size = size as usize;
    Largest {
        request: size,
        read_response: size,
    }
}

#[test]
fn agreed_jumbo_packets_carry_every_op_intact() {
    let (mut net, a, b) = setup(1, (JUMBO, JUMBO), &RcOpts::default());
    negotiate(&mut net);
    for (node, q) in [(0, a), (1, b)] {
        let s = net.nodes[node].engine.mp_stats(q).expect("negotiated");
        assert_eq!(
            (s.state, s.packet_bytes),
            (MpState::On, JUMBO),
            "node {node}"
        );
    }
    assert_eq!(every_op(&mut net, a, b), both(JUMBO));
}

#[test]
fn jumbo_packets_recover_from_loss_reordering_and_duplicates() {
    for seed in 0..4 {
        let (mut net, a, b) = setup(10 + seed, (JUMBO, JUMBO), &RcOpts::default());
        negotiate(&mut net);
        net.faults = Faults {
            loss: 0.03,
            reorder: 0.05,
            duplicate: 0.02,
            ..Faults::default()
        };
        assert_eq!(every_op(&mut net, a, b), both(JUMBO), "seed {seed}");
    }
}

#[test]
fn jumbo_packets_received_directly_recover_from_loss() {
    // Payload received straight into registered memory (the datapath's direct
    // receive), so a lost or reordered packet's successors land where the plan aimed.
    for seed in 0..3 {
        let (mut net, a, b) = setup(20 + seed, (JUMBO, JUMBO), &RcOpts::default());
        net.direct = true;
        negotiate(&mut net);
        net.faults = Faults {
            loss: 0.03,
            reorder: 0.05,
            ..Faults::default()
        };
        assert_eq!(every_op(&mut net, a, b), both(JUMBO), "seed {seed}");
        let c = net.nodes[1].engine.counters();
        assert!(c.rx_direct > 0, "seed {seed}: none received directly");
    }
}

#[test]
fn the_smaller_offer_sets_the_size() {
    let (mut net, a, b) = setup(2, (JUMBO, 8704), &RcOpts::default());
    negotiate(&mut net);
    assert_eq!(every_op(&mut net, a, b), both(8704));
}

#[test]
fn no_offer_or_a_smaller_path_mtu_keeps_ibta_packets() {
    let (mut net, a, b) = setup(3, (JUMBO, 0), &RcOpts::default());
    negotiate(&mut net);
    assert_eq!(every_op(&mut net, a, b), both(4096));
    let o = RcOpts {
        mtu: Some(Mtu::M1024),
        ..RcOpts::default()
    };
    let (mut net, a, b) = setup(4, (JUMBO, JUMBO), &o);
    negotiate(&mut net);
    assert_eq!(every_op(&mut net, a, b), both(1024));
}

#[test]
fn messages_posted_before_the_answer_keep_their_size() {
    // Posted at once: the first WQEs start at 4096 while the negotiation is under way,
    // later ones at the agreed size; a loss makes both kinds go again.
    let (mut net, a, b) = setup(5, (JUMBO, JUMBO), &RcOpts::default());
    net.faults = Faults {
        loss: 0.02,
        ..Faults::default()
    };
    assert_eq!(every_op(&mut net, a, b), both(JUMBO));
}
