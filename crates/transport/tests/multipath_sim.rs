//! Multipath RC over a simulated network of several links, in virtual time: the
//! negotiation and its fallback, spraying, a path cut, one-way black holes, asymmetric
//! delay and loss, and a cut of every path shorter and longer than the retry budget.
//! Every test checks every byte and every completion.

mod sim;

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr};
use std::rc::Rc;

use sim::*;
use softhca_transport::*;

const MIB: usize = 1 << 20;

fn ip(node: u8, link: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, link, node + 1))
}

fn mp_on(cfg: &mut EngineConfig) {
    cfg.mp = MpConfig {
        enabled: true,
        ..MpConfig::default()
    };
}

/// Two nodes on `links` links, both with multipath on, and a connected RC pair with
/// a Local ACK Timeout of 16.8 ms (12): above the queueing delay of a full window at
/// 10 Gb/s (0.8 ms), as real timeouts are (67 ms at perftest's 14).
fn setup(seed: u64, links: u8) -> (SimNet, Qpn, Qpn) {
    setup_with(seed, links, 12)
}

fn setup_with(seed: u64, links: u8, timeout: u8) -> (SimNet, Qpn, Qpn) {
    let o = RcOpts {
        timeout,
        ..RcOpts::default()
    };
    setup_opts(seed, links, &o)
}

fn setup_opts(seed: u64, links: u8, o: &RcOpts) -> (SimNet, Qpn, Qpn) {
    let mut net = SimNet::multihomed(seed, links, Mtu::M1024, mp_on);
    let (a, b) = pair(&mut net, QpType::Rc, o);
    (net, a, b)
}

/// WRITEs 1 MiB in 16 WRITEs from `a` on node 0 to node 1 and checks it arrived.
fn write_mib(net: &mut SimNet, a: Qpn) {
    let la = net.reg(0, MIB, full_access());
    let rb = net.reg(1, MIB, full_access());
    net.fill_random(&la);
    post_writes(net, a, &la, &rb, 16, 64 * 1024);
    finish(net, 16, 1_000_000_000);
    assert_eq!(net.mem(&la), net.mem(&rb));
}

/// Every packet's opcode seen on the wire, from either node.
fn watch_opcodes(net: &mut SimNet) -> Rc<RefCell<Vec<u8>>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = seen.clone();
    net.filter = Some(Box::new(move |_, pkt| {
        s.borrow_mut().push(pkt[0]);
        false
    }));
    seen
}

/// Post `n` RDMA WRITEs of `len` bytes each from `la` to `rb` (same offsets).
fn post_writes(net: &mut SimNet, a: Qpn, la: &Mr, rb: &Mr, n: usize, len: usize) {
    for i in 0..n {
        post_rdma(net, a, WrOpcode::RdmaWrite, (la, rb), i, len);
    }
}

/// Posts WR `i` on node 0's `a`: an RDMA `op` of `len` bytes between the `i`-th `len`
/// bytes of `local` and of `remote`.
fn post_rdma(
    net: &mut SimNet,
    a: Qpn,
    op: WrOpcode,
    (local, remote): (&Mr, &Mr),
    i: usize,
    len: usize,
) {
    let mut w = send_wr(i as u64, op, local.sges(i * len, len));
    w.remote_addr = remote.addr + (i * len) as u64;
    w.rkey = remote.rkey;
    let now = net.now;
    net.nodes[0].engine.post_send(now, a, w).expect("post");
}

/// Run until `n` completions arrived on node 0 (or `max_ns`); every one a success,
/// in order. Returns the longest virtual time between two completions.
fn finish(net: &mut SimNet, n: usize, max_ns: u64) -> u64 {
    let mut last = net.now;
    let mut gap = 0;
    let mut got = Vec::new();
    let end = net.now + max_ns;
    while got.len() < n && net.now < end {
        if !net.step() {
            break;
        }
        for c in net.take_completions(0) {
            gap = gap.max(net.now - last);
            last = net.now;
            got.push(c);
        }
    }
    assert_eq!(got.len(), n, "completions by {} ns", net.now);
    for (i, c) in got.iter().enumerate() {
        assert_eq!(c.status, WcStatus::Success, "WR {i}");
        assert_eq!(c.wr_id, i as u64, "in order");
    }
    gap
}

fn stats(net: &SimNet, node: usize, q: Qpn) -> MpStats {
    net.nodes[node].engine.mp_stats(q).expect("multipath state")
}

/// Run the negotiation and path validation (a few ms of virtual time).
fn settle(net: &mut SimNet) {
    let until = net.now + 10_000_000;
    while net.now < until && net.step() {}
}

fn state(net: &SimNet, node: usize, q: Qpn) -> QpState {
    net.nodes[node].engine.query_qp(q).expect("qp").0.qp_state
}

#[test]
fn negotiates_validates_every_address_pair_and_sprays() {
    let (mut net, a, b) = setup(1, 2);
    let seen = watch_opcodes(&mut net);
    settle(&mut net);
    for (node, q) in [(0, a), (1, b)] {
        let s = stats(&net, node, q);
        assert_eq!(s.state, MpState::On);
        assert!(s.active);
        // 2 local × 2 remote addresses.
        assert_eq!(s.paths.len(), 4);
        assert!(s.paths.iter().all(|p| p.state == "active"), "{s:?}");
    }
    let la = net.reg(0, 8 * MIB, full_access());
    let rb = net.reg(1, 8 * MIB, full_access());
    net.fill_random(&la);
    post_writes(&mut net, a, &la, &rb, 128, 64 * 1024);
    finish(&mut net, 128, 1_000_000_000);
    assert_eq!(net.mem(&la), net.mem(&rb));
    let s = stats(&net, 0, a);
    let used = s.paths.iter().filter(|p| p.pkts > 100).count();
    assert!(used >= 2, "data on several paths: {s:?}");
    // The negotiation MAD went first, extension opcodes only after it.
    let ops = seen.borrow();
    let first_mp = ops
        .iter()
        .position(|&o| o >= 0xe0)
        .expect("extension packets");
    let first_mad = ops
        .iter()
        .position(|&o| o == 0x64)
        .expect("negotiation MAD");
    assert!(first_mad < first_mp);
}

/// The extension's packets (negotiation, probes and their answers, SACKs) go with the
/// QP's traffic class as their IP TOS, as its requests and ACKs do: a switch that
/// queues or marks by it treats the whole connection alike.
/// Paths with a 10 ms round trip: each path's first probes are answered after the
/// least probe timeout (5 ms) has sent the next one; a late answer is still a round
/// trip, which sets the timeout of the next probe, and the paths are validated, not
/// failed (they failed and waited for readmission's backoff while every answer was
/// taken for one to an older probe).
#[test]
fn paths_with_a_long_round_trip_are_validated_without_failing() {
    let (mut net, a, b) = setup(23, 2);
    net.faults.delay_ns = 5_000_000;
    let until = net.now + 200_000_000;
    while net.now < until && net.step() {}
    for (node, q) in [(0, a), (1, b)] {
        let s = stats(&net, node, q);
        assert!(s.paths.iter().all(|p| p.state == "active"), "{s:?}");
        let c = net.nodes[node].engine.counters();
        assert_eq!(c.mp_path_failed, 0, "node {node}: {c:?}");
    }
    write_mib(&mut net, a);
}

#[test]
fn extension_packets_carry_the_qps_traffic_class() {
    let o = RcOpts {
        timeout: 12,
        traffic_class: 0x48,
        ..RcOpts::default()
    };
    let (mut net, a, _b) = setup_opts(11, 2, &o);
    net.wire_tos = Some(Vec::new());
    settle(&mut net);
    write_mib(&mut net, a);
    let seen = net.wire_tos.take().unwrap();
    let ext: Vec<_> = seen
        .iter()
        .filter(|(op, _)| *op >= 0xe0 || *op == 0x64)
        .collect();
    assert!(ext.len() > 4, "extension packets: {ext:?}");
    assert!(seen.iter().all(|&(_, tos)| tos == 0x48), "{seen:?}");
}

#[test]
fn a_peer_with_multipath_off_gets_plain_rc_and_no_extension_opcode() {
    let mut net = SimNet::multihomed(2, 2, Mtu::M1024, mp_on);
    net.nodes[1].engine = {
        let mut cfg = net.nodes[1].engine.config().clone();
        cfg.mp.enabled = false;
        Engine::new(cfg)
    };
    let pd = net.nodes[1].engine.memory_mut().alloc_pd();
    let cq = net.nodes[1].engine.create_cq();
    net.nodes[1].pd = pd;
    net.nodes[1].cq = cq;
    let (a, b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let seen = watch_opcodes(&mut net);
    settle(&mut net);
    assert!(net.nodes[0].engine.mp_stats(a).is_none(), "fell back");
    assert!(net.nodes[1].engine.mp_stats(b).is_none());
    assert_eq!(net.nodes[0].engine.counters().mp_fallback, 1);
    write_mib(&mut net, a);
    assert!(
        seen.borrow().iter().all(|&o| o < 0xe0),
        "no extension opcode"
    );
}

/// On one path between two devices that speak the extension, a loss is repaired by
/// resending what the responder does not hold (its SACKs replace the sequence NAK),
/// not the whole window: the same seeded run at 1 % loss on a 1 ms round trip sends
/// far fewer duplicates than plain RC (both sides with the extension off), every byte
/// and completion intact.
#[test]
fn one_path_resends_only_what_the_responder_lacks() {
    let run = |mp: bool| {
        let mut net = SimNet::multihomed(7, 1, Mtu::M1024, |c| c.mp.enabled = mp);
        let o = RcOpts {
            timeout: 12,
            ..RcOpts::default()
        };
        let (a, b) = pair(&mut net, QpType::Rc, &o);
        settle(&mut net);
        assert_eq!(net.nodes[0].engine.mp_stats(a).is_some(), mp);
        net.faults = Faults {
            loss: 0.01,
            delay_ns: 500_000,
            jitter_ns: 0,
            ..Faults::default()
        };
        let la = net.reg(0, 4 * MIB, full_access());
        let rb = net.reg(1, 4 * MIB, full_access());
        net.fill_random(&la);
        post_writes(&mut net, a, &la, &rb, 64, 64 * 1024);
        finish(&mut net, 64, 20_000_000_000);
        assert_eq!(net.mem(&la), net.mem(&rb));
        assert_eq!(state(&net, 0, a), QpState::Rts);
        assert_eq!(state(&net, 1, b), QpState::Rts);
        let c = |n: usize| net.nodes[n].engine.counters().clone();
        (c(0), c(1))
    };
    let (plain_req, plain_resp) = run(false);
    let (req, resp) = run(true);
    assert!(plain_resp.seq_err_naks > 2, "{plain_resp:?}");
    assert_eq!(plain_req.held_skipped, 0);
    assert!(req.held_skipped > 100, "{req:?}");
    assert!(resp.mp_sack_sent > 5 && resp.seq_err_naks == 0, "{resp:?}");
    assert!(
        4 * resp.duplicate_request < plain_resp.duplicate_request,
        "duplicates: {} with SACKs, {} plain",
        resp.duplicate_request,
        plain_resp.duplicate_request
    );
}

#[test]
fn a_silent_peer_means_plain_rc_after_the_tries() {
    let (mut net, a, _b) = setup(3, 2);
    // Every negotiation MAD vanishes (a peer whose QP 1 never answers).
    net.filter = Some(Box::new(|_, pkt| pkt[0] == 0x64));
    let seen_before = net.nodes[0].engine.counters().mp_hello_sent;
    assert_eq!(seen_before, 0);
    // Still asking after 60 ms (a host pause is not a silent peer) ...
    let until = net.now + 60_000_000;
    while net.now < until && net.step() {}
    assert!(net.nodes[0].engine.counters().mp_fallback == 0);
    // ... plain RC after 1.5 s of silence.
    let until = net.now + 1_500_000_000;
    while net.now < until && net.step() {}
    assert!(net.nodes[0].engine.mp_stats(a).is_none());
    assert_eq!(net.nodes[0].engine.counters().mp_hello_sent, 10);
    assert_eq!(net.nodes[0].engine.counters().mp_fallback, 1);
}

/// A bulk transfer with `fault` applied after `at_ns`; returns the longest gap between
/// completions. Every byte is checked and the QP must stay in RTS.
fn bulk_with_fault(seed: u64, links: u8, at_ns: u64, faults: &[PathFault]) -> (SimNet, Qpn, u64) {
    bulk_on(seed, links, &[], at_ns, faults)
}

/// [`bulk_with_fault`] on paths with `fixed` faults from the start.
fn bulk_on(
    seed: u64,
    links: u8,
    fixed: &[PathFault],
    at_ns: u64,
    faults: &[PathFault],
) -> (SimNet, Qpn, u64) {
    let (mut net, a, b) = setup(seed, links);
    net.path_faults.extend_from_slice(fixed);
    settle(&mut net);
    let n = 256;
    let len = 32 * 1024;
    let la = net.reg(0, n * len, full_access());
    let rb = net.reg(1, n * len, full_access());
    net.fill_random(&la);
    net.link_ps_per_byte = 800; // 10 Gb/s per node
    post_writes(&mut net, a, &la, &rb, n, len);
    let until = net.now + at_ns;
    while net.now < until && net.step() {}
    net.path_faults.extend_from_slice(faults);
    let done = net.count_completions(0);
    let got: Vec<Completion> = net.take_completions(0);
    assert_eq!(got.len(), done);
    assert!(got.iter().all(|c| c.status == WcStatus::Success));
    let gap = finish_rest(&mut net, got.len(), n, 2_000_000_000);
    assert_eq!(net.mem(&la), net.mem(&rb), "every byte");
    assert_eq!(state(&net, 0, a), QpState::Rts);
    assert_eq!(state(&net, 1, b), QpState::Rts);
    let st = stats(&net, 0, a);
    let lost: u64 = st.paths.iter().map(|p| p.losses - p.spurious).sum();
    eprintln!(
        "seed {seed}: longest gap between completions {gap} ns, resent {} for {lost} lost",
        st.resends
    );
    (net, a, gap)
}

/// [`finish`] for WRs `from..n` (those before completed already).
fn finish_rest(net: &mut SimNet, from: usize, n: usize, max_ns: u64) -> u64 {
    let mut last = net.now;
    let mut gap = 0;
    let mut next = from;
    let end = net.now + max_ns;
    while next < n && net.now < end {
        if !net.step() {
            break;
        }
        for c in net.take_completions(0) {
            gap = gap.max(net.now - last);
            last = net.now;
            assert_eq!(c.status, WcStatus::Success, "WR {}", c.wr_id);
            assert_eq!(c.wr_id, next as u64, "in order");
            next += 1;
        }
    }
    assert_eq!(next, n, "completions by {} ns", net.now);
    gap
}

fn cut(src: Option<IpAddr>, dst: Option<IpAddr>) -> PathFault {
    PathFault {
        src,
        dst,
        cut: true,
        ..PathFault::default()
    }
}

#[test]
fn a_cut_link_fails_its_paths_and_nothing_is_lost() {
    // Link 1 goes dark both ways mid-transfer.
    let faults = [cut(None, Some(ip(1, 1))), cut(None, Some(ip(0, 1)))];
    let (mut net, a, gap) = bulk_with_fault(4, 2, 300_000, &faults);
    // Its paths went silent while the others delivered: their packets moved at once.
    assert!(net.nodes[0].engine.counters().mp_path_silent >= 1);
    // Their probes go unanswered: they fail.
    let until = net.now + 100_000_000;
    while net.now < until && net.step() {}
    let c = net.nodes[0].engine.counters();
    assert!(c.mp_path_failed >= 2, "{c:?}");
    assert!(c.mp_resent > 0);
    // No retransmit timeout: the retry budget was never touched.
    assert_eq!(c.local_ack_timeout_err, 0);
    assert_eq!(c.retry_exceeded_err, 0);
    let s = stats(&net, 0, a);
    // Every path with an end on link 1: from or to its addresses (a probe answer comes
    // back on the reverse pair).
    let to_cut = |p: &&MpPathStats| p.dst.ip() == ip(1, 1);
    assert!(
        s.paths.iter().filter(to_cut).all(|p| p.state == "failed"),
        "{s:?}"
    );
    // The longest stall is a few round trips (0.9 ms with the queue), far below the
    // timeout.
    assert!(gap < 5_000_000, "gap {gap} ns");
}

#[test]
fn one_way_black_holes_in_either_direction() {
    // Data direction only (A → B on link 1).
    let (net, _a, gap) = bulk_with_fault(5, 2, 300_000, &[cut(None, Some(ip(1, 1)))]);
    let c = net.nodes[0].engine.counters();
    assert_eq!(c.retry_exceeded_err, 0);
    assert!(c.mp_path_silent + c.mp_path_failed >= 1, "{c:?}");
    assert!(
        gap < 5_000_000,
        "data-direction gap {gap} ns: {c:?} {:?}",
        stats(&net, 0, _a)
    );
    // ACK direction only (B → A on link 1).
    let (net, _a, gap) = bulk_with_fault(6, 2, 300_000, &[cut(None, Some(ip(0, 1)))]);
    let c = net.nodes[0].engine.counters();
    assert_eq!(c.retry_exceeded_err, 0);
    assert!(gap < 5_000_000, "ACK-direction gap {gap} ns");
}

#[test]
fn asymmetric_delay_and_loss() {
    let faults = [
        PathFault {
            dst: Some(ip(1, 1)),
            delay_ns: 400_000,
            ..PathFault::default()
        },
        PathFault {
            dst: Some(ip(1, 0)),
            loss: 0.01,
            ..PathFault::default()
        },
        PathFault {
            dst: Some(ip(0, 0)),
            delay_ns: 50_000,
            ..PathFault::default()
        },
    ];
    let (net, a, _gap) = bulk_on(7, 2, &faults, 0, &[]);
    let c = net.nodes[0].engine.counters();
    assert_eq!(c.retry_exceeded_err, 0);
    let s = stats(&net, 0, a);
    let lost: u64 = s.paths.iter().map(|p| p.losses - p.spurious).sum();
    assert!(lost > 0, "{s:?}");
    // Selective: resends stay near the losses (not a window per loss).
    assert!(
        s.resends <= 3 * lost + 8,
        "resent {} for {lost} lost: {s:?}",
        s.resends
    );
}

#[test]
fn one_lossy_path_resends_about_what_it_lost() {
    // 1 % of the packets towards one of node 1's two addresses vanish: RACK per path
    // finds each one from the packets after it on its own path, and nothing that was
    // only slower is sent again.
    let faults = [PathFault {
        dst: Some(ip(1, 0)),
        loss: 0.01,
        ..PathFault::default()
    }];
    let (net, a, _gap) = bulk_on(15, 2, &faults, 0, &[]);
    let s = stats(&net, 0, a);
    // Lost: what the faults dropped and what the responder's bounded reorder memory
    // could not keep.
    let r = net.nodes[1].engine.counters();
    let lost = net.path_fault_drops + (r.out_of_seq_request - r.ooo_buffered);
    assert!(net.path_fault_drops > 10, "{}", net.path_fault_drops);
    assert!(
        s.resends * 2 <= 3 * lost,
        "resent {} for {lost} lost: {s:?}",
        s.resends
    );
    // Nothing resent had arrived already.
    assert!(r.duplicate_request * 10 <= lost, "{r:?}");
    assert_eq!(net.nodes[0].engine.counters().mp_path_failed, 0);
}

#[test]
fn a_path_ten_times_slower_is_neither_lossy_nor_silent() {
    // Every packet towards node 1's second address takes 500 µs more each way: ten
    // times the others' round trip. Its packets are late, not lost: the other paths'
    // deliveries say nothing of them.
    let faults = [
        PathFault {
            dst: Some(ip(1, 1)),
            delay_ns: 500_000,
            ..PathFault::default()
        },
        PathFault {
            src: Some(ip(1, 1)),
            delay_ns: 500_000,
            ..PathFault::default()
        },
    ];
    let (net, a, _gap) = bulk_on(16, 2, &faults, 0, &[]);
    let s = stats(&net, 0, a);
    let slow: u64 = s
        .paths
        .iter()
        .filter(|p| p.dst.ip() == ip(1, 1))
        .map(|p| p.pkts)
        .sum();
    assert!(slow > 100, "the slow path carried: {s:?}");
    let pkts: u64 = s.paths.iter().map(|p| p.pkts).sum();
    assert!(
        s.resends * 100 <= pkts,
        "resent {} of {pkts}: {s:?}",
        s.resends
    );
    let c = net.nodes[0].engine.counters();
    assert_eq!(c.mp_path_failed, 0, "{c:?}");
}

#[test]
fn four_links_one_cut_and_restored_is_readmitted() {
    let faults = [cut(None, Some(ip(1, 2))), cut(None, Some(ip(0, 2)))];
    let (mut net, a, _gap) = bulk_with_fault(8, 4, 200_000, &faults);
    let until = net.now + 100_000_000;
    while net.now < until && net.step() {}
    assert!(stats(&net, 0, a).paths.iter().any(|p| p.state == "failed"));
    net.path_faults.clear();
    let until = net.now + 1_000_000_000;
    while net.now < until && net.step() {}
    let s = stats(&net, 0, a);
    assert!(s.paths.iter().all(|p| p.state == "active"), "{s:?}");
    assert!(net.nodes[0].engine.counters().mp_path_readmitted >= 1);
}

#[test]
fn every_path_cut_shorter_than_the_retry_budget_resumes() {
    let (mut net, a, _b) = setup_with(9, 2, 8);
    settle(&mut net);
    let la = net.reg(0, 4 * MIB, full_access());
    let rb = net.reg(1, 4 * MIB, full_access());
    net.fill_random(&la);
    post_writes(&mut net, a, &la, &rb, 64, 64 * 1024);
    let until = net.now + 100_000;
    while net.now < until && net.step() {}
    net.path_faults.push(cut(None, None));
    // 3 ms of silence: less than 1 + 2 + 4 + 8 ... timeouts of 1 ms.
    let until = net.now + 3_000_000;
    while net.now < until && net.step() {}
    net.path_faults.clear();
    let done: Vec<_> = net.take_completions(0);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    finish_rest(&mut net, done.len(), 64, 2_000_000_000);
    assert_eq!(net.mem(&la), net.mem(&rb));
    assert_eq!(state(&net, 0, a), QpState::Rts);
}

#[test]
fn every_path_cut_for_good_ends_in_retry_exceeded_without_a_hang() {
    let (mut net, a, _b) = setup_with(10, 2, 8);
    settle(&mut net);
    let la = net.reg(0, MIB, full_access());
    let rb = net.reg(1, MIB, full_access());
    post_writes(&mut net, a, &la, &rb, 8, 64 * 1024);
    let until = net.now + 20_000;
    while net.now < until && net.step() {}
    net.path_faults.push(cut(None, None));
    let start = net.now;
    let ok = net.run_until(2_000_000_000, |n| {
        n.nodes[0]
            .completions
            .iter()
            .any(|(_, c)| c.status == WcStatus::RetryExcErr)
    });
    assert!(ok, "RETRY_EXC_ERR");
    // Within timeout × retries with the capped backoff: (1+2+4+8×5) × 1.05 ms.
    assert!(net.now - start < 60_000_000, "{} ns", net.now - start);
    assert_eq!(state(&net, 0, a), QpState::Err);
}

#[test]
fn sends_and_reads_across_a_cut_link() {
    let (mut net, a, b) = setup(11, 2);
    settle(&mut net);
    let n = 64;
    let len = 16 * 1024;
    let la = net.reg(0, n * len, full_access());
    let lb = net.reg(1, n * len, full_access());
    let back = net.reg(0, n * len, full_access());
    net.fill_random(&la);
    net.fill_random(&lb);
    net.link_ps_per_byte = 800;
    // SENDs land in node 1's receives, in order; READs fetch node 1's buffer.
    let rb = net.reg(1, n * len, full_access());
    for i in 0..n {
        net.nodes[1]
            .engine
            .post_recv(b, recv_wr(i as u64, rb.sges(i * len, len)))
            .expect("post_recv");
    }
    for i in 0..n {
        let now = net.now;
        let w = send_wr(i as u64, WrOpcode::Send, la.sges(i * len, len));
        net.nodes[0].engine.post_send(now, a, w).expect("send");
        let mut r = send_wr((n + i) as u64, WrOpcode::RdmaRead, back.sges(i * len, len));
        r.remote_addr = lb.addr + (i * len) as u64;
        r.rkey = lb.rkey;
        net.nodes[0].engine.post_send(now, a, r).expect("read");
    }
    let until = net.now + 200_000;
    while net.now < until && net.step() {}
    net.path_faults
        .extend([cut(None, Some(ip(1, 1))), cut(None, Some(ip(0, 1)))]);
    let mut got = net.take_completions(0);
    let end = net.now + 2_000_000_000;
    while got.len() < 2 * n && net.now < end && net.step() {
        got.extend(net.take_completions(0));
    }
    assert_eq!(got.len(), 2 * n);
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    let want: Vec<u64> = (0..n as u64).flat_map(|i| [i, n as u64 + i]).collect();
    assert_eq!(ids, want, "completions in posting order");
    assert_eq!(net.mem(&la), net.mem(&rb), "SENDs");
    assert_eq!(net.mem(&lb), net.mem(&back), "READs");
    let recvs = net.take_completions(1);
    assert_eq!(recvs.len(), n);
    assert!(recvs.iter().enumerate().all(|(i, c)| c.wr_id == i as u64
        && c.status == WcStatus::Success
        && c.byte_len == len as u32));
    assert_eq!(state(&net, 0, a), QpState::Rts);
    let c = net.nodes[0].engine.counters();
    assert!(c.mp_path_failed >= 1, "the cut hit traffic: {c:?}");
    assert_eq!(c.retry_exceeded_err, 0);
}

/// Two paths each behind its own 1 Gb/s bottleneck with a drop-tail queue of 5 ms and
/// 32 KB (the testbed's `tbf rate 1gbit burst 256kb latency 5ms` per path): RDMA WRITEs of 32 MiB, every byte checked. Returns the
/// goodput in Gb/s, the bytes each bottleneck passed and the times a path that carried
/// data failed.
fn two_bottlenecked_links(seed: u64, cc: bool) -> (f64, [u64; 2], u64) {
    let (gbps, passed, failed, _) = bottlenecked_links_pausing(seed, cc, 0);
    (gbps, passed, failed)
}

/// [`two_bottlenecked_links`], each node's process descheduled for `pause` every 50 ms
/// (the responder 25 ms after the requester), as on a loaded 2-core host; also returns
/// the packets resent.
fn bottlenecked_links_pausing(seed: u64, cc: bool, pause: u64) -> (f64, [u64; 2], u64, u64) {
    let mut net = SimNet::multihomed(seed, 2, Mtu::M4096, |cfg| {
        mp_on(cfg);
        if !cc {
            cfg.cc = CcAlgorithm::Off;
        }
    });
    // perftest's Local ACK Timeout (67 ms), above a full 5 ms queue.
    let o = RcOpts {
        timeout: 14,
        ..RcOpts::default()
    };
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    let gbit = 1_000_000_000;
    for link in 0..2 {
        net.addr_bottlenecks
            .push((ip(1, link), Bottleneck::new(gbit, 657_000, vec![1])));
    }
    net.link_ps_per_byte = 800; // 10 Gb/s per node: the bottlenecks are the paths
                                // One path per link, as on two separate networks: the crossed address pairs do not
                                // route.
    for (x, y) in [(0, 1), (1, 0)] {
        for (from, to) in [(0, 1), (1, 0)] {
            net.path_faults
                .push(cut(Some(ip(from, x)), Some(ip(to, y))));
        }
    }
    settle(&mut net);
    let (n, len) = (128, 256 * 1024);
    let la = net.reg(0, n * len, full_access());
    let rb = net.reg(1, n * len, full_access());
    net.fill_random(&la);
    let start = net.now;
    post_writes(&mut net, a, &la, &rb, n, len);
    let mut ms = 0u64;
    while pause > 0 && net.count_completions(0) < n && net.now < start + 2_000_000_000 {
        let until = net.now + 1_000_000;
        while net.now < until && net.step() {}
        ms += 1;
        match ms % 50 {
            0 => net.pause(0, pause),
            25 => net.pause(1, pause),
            _ => {}
        }
    }
    finish(&mut net, n, 2_000_000_000);
    let secs = (net.now - start) as f64 / 1e9;
    assert_eq!(net.mem(&la), net.mem(&rb), "every byte");
    assert_eq!(state(&net, 0, a), QpState::Rts);
    assert_eq!(state(&net, 1, b), QpState::Rts);
    let passed = [0, 1].map(|k| net.addr_bottlenecks[k].1.bytes_from.iter().sum::<u64>());
    let s = stats(&net, 0, a);
    // The primary path starts active, the other one by a change from probing; each
    // failure is a change to failed and one back.
    let failed = s
        .paths
        .iter()
        .enumerate()
        .filter(|(_, p)| p.pkts > 0)
        .map(|(i, p)| (p.state_changes - u64::from(i > 0)).div_ceil(2))
        .sum();
    eprintln!(
        "seed {seed} cc {cc}: {:.2} Gb/s, per link {passed:?} B, drops {:?}, {:?}",
        (n * len) as f64 * 8.0 / secs / 1e9,
        net.addr_bottlenecks
            .iter()
            .map(|(_, b)| b.drops)
            .collect::<Vec<_>>(),
        s
    );
    let gbps = (n * len) as f64 * 8.0 / secs / 1e9;
    (gbps, passed, failed, s.resends)
}

/// Two nodes on two links with a 10 ms round trip, multipath validated, each link
/// behind a 1 Gb/s bottleneck with a tbf's queue in front of node `receiver`, and a
/// connected RC pair with perftest's Local ACK Timeout (67 ms).
fn long_bottlenecked_paths(seed: u64, receiver: u8) -> (SimNet, Qpn, Qpn) {
    let mut net = SimNet::multihomed(seed, 2, Mtu::M4096, mp_on);
    let o = RcOpts {
        timeout: 14,
        ..RcOpts::default()
    };
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    for link in 0..2 {
        let at = Bottleneck::new(1_000_000_000, 657_000, vec![usize::from(receiver)]);
        net.addr_bottlenecks.push((ip(receiver, link), at));
    }
    net.link_ps_per_byte = 800;
    net.faults.delay_ns = 5_000_000;
    settle(&mut net);
    (net, a, b)
}

/// READs over two paths, each behind its own 1 Gb/s bottleneck with a tbf's queue: a
/// READ's responses wait behind those of every READ ahead of it at the responder and in
/// the queue, so when they come says nothing of whether its request was lost. Judged by
/// the time of its path's other packets, the requests were taken for lost and asked
/// again by the dozen, each re-request added responses to the queue, and the QP ended
/// in RETRY_EXC_ERR within a second.
#[test]
fn reads_through_two_bottlenecked_paths_complete_intact() {
    // The responses' direction is the bottleneck: node 0 receives them.
    let (mut net, a, b) = long_bottlenecked_paths(15, 0);
    let (n, len) = (64, 256 * 1024);
    let la = net.reg(0, n * len, full_access());
    let rb = net.reg(1, n * len, full_access());
    net.fill_random(&rb);
    for i in 0..n {
        post_rdma(&mut net, a, WrOpcode::RdmaRead, (&la, &rb), i, len);
    }
    finish(&mut net, n, 5_000_000_000);
    assert_eq!(net.mem(&la), net.mem(&rb), "every byte");
    assert_eq!(state(&net, 0, a), QpState::Rts);
    assert_eq!(state(&net, 1, b), QpState::Rts);
    let c = net.nodes[0].engine.counters();
    assert_eq!(c.retry_exceeded_err, 0, "{c:?}");
    // The bottlenecks are in the responses' direction: no request is lost, and none is
    // taken for lost (54 were, before).
    assert_eq!(c.mp_lost, 0, "{c:?}");
}

/// An application that posts less than the paths carry (64 KiB every 2 ms, 0.26 Gb/s,
/// over two 1 Gb/s paths with a 10 ms round trip): each path's window grows only as far
/// as it is used, as a single-path QP's. Grown on every ACK of an unused window, both
/// reached the protocol's 1024 packets, and the first burst the application posts
/// after such a stretch leaves as one window into a 5 ms queue.
#[test]
fn an_application_limited_qp_does_not_grow_its_path_windows() {
    let (mut net, a, _b) = long_bottlenecked_paths(16, 1);
    let (n, len) = (400, 64 * 1024);
    let la = net.reg(0, n * len, full_access());
    let rb = net.reg(1, n * len, full_access());
    net.fill_random(&la);
    for i in 0..n {
        post_rdma(&mut net, a, WrOpcode::RdmaWrite, (&la, &rb), i, len);
        let until = net.now + 2_000_000;
        while net.now < until && net.step() {}
    }
    finish(&mut net, n, 1_000_000_000);
    assert_eq!(net.mem(&la), net.mem(&rb), "every byte");
    let s = stats(&net, 0, a);
    let windows: Vec<u32> = s
        .paths
        .iter()
        .filter(|p| p.pkts > 0)
        .map(|p| p.cwnd)
        .collect();
    // 80 packets per round trip over all the paths: windows of a few hundred packets at
    // most (slow start doubles what was used); up to 1024 without the rule.
    assert!(
        !windows.is_empty() && windows.iter().all(|&w| w <= 300),
        "{windows:?}"
    );
}

/// Both hosts pause for 15 ms every 50 ms: nothing is lost, and little is resent. A
/// probe answer, sent at once, overtook the acknowledgement of the requests ahead of
/// the probe (sent only when a request asks for one), and the prober took every packet
/// sent during the responder's pause for a lost tail: 110 resent, 551 taken for lost.
/// Now 35 and 136 (a path found silent once each pause, its packets moved).
#[test]
fn pausing_hosts_resend_little_on_bottlenecked_paths() {
    let (gbps, _passed, failed, resent) = bottlenecked_links_pausing(12, true, 15_000_000);
    assert!(gbps > 0.9, "{gbps:.2} Gb/s");
    assert_eq!(failed, 0, "paths failed");
    assert!(resent <= 50, "{resent} resent");
}

#[test]
fn two_bottlenecked_paths_aggregate_with_a_controller_per_path() {
    let (gbps, passed, failed) = two_bottlenecked_links(12, true);
    // One path's rate is 1 Gb/s; a window for the whole QP held the sum near it.
    assert!(gbps > 1.6, "{gbps:.2} Gb/s over 2 × 1 Gb/s");
    let total = (passed[0] + passed[1]) as f64;
    assert!(
        passed.iter().all(|&p| p as f64 > 0.35 * total),
        "both links carry: {passed:?}"
    );
    // A token bucket's drops are congestion, not a dead path.
    assert_eq!(failed, 0, "paths failed");
}

#[test]
fn tail_drops_without_congestion_control_do_not_thrash_the_paths() {
    let (gbps, _passed, failed) = two_bottlenecked_links(14, false);
    assert!(gbps > 1.6, "{gbps:.2} Gb/s");
    // A full queue's drops are not silence. A loss-only window in slow start can still
    // fill a 5 ms queue faster than the smoothed round trip follows, once.
    assert!(failed <= 1, "paths failed {failed} times");
}

/// After the paths settled, `n` RDMA WRITEs of 64 KiB from node 0 to node 1 posted on
/// `a`, node 0's link at `ps_per_byte`: the local and remote buffers.
fn post_bulk(net: &mut SimNet, a: Qpn, n: usize, ps_per_byte: u64) -> (Mr, Mr) {
    settle(net);
    let len = 64 * 1024;
    let la = net.reg(0, n * len, full_access());
    let rb = net.reg(1, n * len, full_access());
    net.fill_random(&la);
    net.link_ps_per_byte = ps_per_byte;
    post_writes(net, a, &la, &rb, n, len);
    (la, rb)
}

/// Run for `ns` of virtual time; every completion a success, in order from `*done`.
fn run_checking(net: &mut SimNet, ns: u64, done: &mut usize) {
    let until = net.now + ns;
    while net.now < until && net.step() {}
    for c in net.take_completions(0) {
        assert_eq!(c.status, WcStatus::Success, "WR {}", c.wr_id);
        assert_eq!(c.wr_id, *done as u64, "in order");
        *done += 1;
    }
}

/// [`finish_rest`] of [`post_bulk`]'s WRITEs, then every byte checked and both QPs in
/// RTS.
fn finish_checked(net: &mut SimNet, (a, b): (Qpn, Qpn), bufs: &(Mr, Mr), done: usize, n: usize) {
    finish_rest(net, done, n, 2_000_000_000);
    assert_eq!(net.mem(&bufs.0), net.mem(&bufs.1), "every byte");
    assert_eq!(state(net, 0, a), QpState::Rts);
    assert_eq!(state(net, 1, b), QpState::Rts);
}

#[test]
fn a_peer_whose_host_stalls_gets_nothing_sent_twice() {
    // The responder's host stalls 3 ms, three times, then 13 ms right after a keepalive
    // probe went out (it and the next time out meanwhile) during a transfer over four
    // links (a loaded 2-core host does that): no path delivers meanwhile, then every
    // path delivers at once. Nothing was lost, so nothing is resent, and no path
    // fails.
    let (mut net, a, b) = setup(21, 4);
    let n = 1024;
    let bufs = post_bulk(&mut net, a, n, 800); // 10 Gb/s per node
    let mut done = 0;
    for stall in [3_000_000, 3_000_000, 3_000_000, 13_000_000] {
        let until = net.now + 500_000;
        while net.now < until && net.step() {}
        if stall > 5_000_000 {
            let probes = net.nodes[0].engine.counters().mp_probe_sent;
            while net.nodes[0].engine.counters().mp_probe_sent == probes && net.step() {}
        }
        net.stall(1, stall);
        // Past the stall and what it held back.
        run_checking(&mut net, stall + 500_000, &mut done);
    }
    finish_checked(&mut net, (a, b), &bufs, done, n);
    let s = stats(&net, 0, a);
    let r = net.nodes[1].engine.counters();
    let c = net.nodes[0].engine.counters();
    assert!(
        done < n / 2,
        "the stalls fell within the transfer: {done} done"
    );
    assert!(s.resends <= 16, "resent {}: {c:?} {s:?}", s.resends);
    assert!(r.duplicate_request <= 16, "{r:?}");
    assert_eq!(c.mp_path_failed, 0, "{c:?}");
}

#[test]
fn a_lost_last_packet_is_resent_without_the_retransmit_timeout() {
    // The very last packet of a transfer is lost and nothing is sent after it: a probe
    // of its path, not the Local ACK Timeout (67 ms) nor a retry, finds it lost.
    let (mut net, a, b) = setup_with(22, 2, 14);
    settle(&mut net);
    let (n, len) = (8, 64 * 1024);
    let la = net.reg(0, n * len, full_access());
    let rb = net.reg(1, n * len, full_access());
    net.fill_random(&la);
    net.link_ps_per_byte = 800;
    // 64 packets of 1 KiB per WRITE: the last one's PSN.
    let last =
        (net.nodes[0].engine.query_qp(a).expect("qp").0.sq_psn + (n * 64) as u32 - 1) & 0xff_ffff;
    let mut dropped = 0;
    net.filter = Some(Box::new(move |from, pkt| {
        let psn = u32::from_be_bytes([0, pkt[9], pkt[10], pkt[11]]);
        let drop = from == 0 && pkt[0] < 0xe0 && psn == last && dropped == 0;
        dropped += u32::from(drop);
        drop
    }));
    let start = net.now;
    post_writes(&mut net, a, &la, &rb, n, len);
    finish(&mut net, n, 1_000_000_000);
    assert_eq!(net.mem(&la), net.mem(&rb), "every byte");
    assert_eq!(state(&net, 0, a), QpState::Rts);
    assert_eq!(state(&net, 1, b), QpState::Rts);
    let c = net.nodes[0].engine.counters();
    assert_eq!(c.local_ack_timeout_err, 0, "{c:?}");
    // The lost one, and the few before it that its ACK request would have had
    // acknowledged (the responder coalesces ACKs up to a request).
    assert!((1..=4).contains(&c.mp_resent), "{c:?}");
    assert!(net.now - start < 20_000_000, "took {} ns", net.now - start);
}

#[test]
fn a_path_whose_delay_jumps_is_taken_for_silent_less_and_less() {
    // The link to node 1's second address gains 2 ms of delay every 10 ms, then loses
    // it (a queue that fills and drains behind other traffic). Each jump may make its
    // paths look silent; a silent path that answers the probe sent since was only late,
    // and its silence allowance grows, so the jumps stop counting as silences.
    let (mut net, a, b) = setup(23, 2);
    let n = 1024;
    // 1 Gb/s per node: the transfer lasts about 0.5 s.
    let bufs = post_bulk(&mut net, a, n, 8_000);
    let slow = PathFault {
        dst: Some(ip(1, 1)),
        delay_ns: 2_000_000,
        ..PathFault::default()
    };
    let mut done = 0;
    for k in 0..40 {
        net.path_faults.clear();
        if k % 2 == 0 {
            net.path_faults.push(slow);
        }
        run_checking(&mut net, 10_000_000, &mut done);
    }
    net.path_faults.clear();
    finish_checked(&mut net, (a, b), &bufs, done, n);
    assert!(
        done > n / 2,
        "the jumps fell within the transfer: {done} done"
    );
    let c = net.nodes[0].engine.counters();
    assert!(c.mp_path_silent <= 8, "{c:?}");
    assert_eq!(c.mp_path_failed, 0, "{c:?}");
}

/// READs at 5 % loss on one path with the extension: the holes behind the oldest
/// unacknowledged PSN that selective repeat and READ re-requests fill spend no retry
/// (the budget guards the oldest request, which go-back-N's every retry starts from).
/// Counted, they spent a budget of 7 while the oldest was still being repaired, and a
/// run of 2048 READs of 64 KiB through the impairment forwarder failed with
/// RetryExcErr one time in three.
#[test]
fn holes_behind_the_oldest_read_spend_no_retry() {
    for seed in 0..8 {
        let o = RcOpts {
            timeout: 12,
            retry_cnt: 2,
            max_rd_atomic: 16,
            ..RcOpts::default()
        };
        let (mut net, a, _b) = setup_opts(seed, 1, &o);
        net.faults = Faults {
            loss: 0.05,
            delay_ns: 50_000,
            ..Faults::default()
        };
        let n = 64;
        let la = net.reg(0, n * 64 * 1024, full_access());
        let rb = net.reg(1, n * 64 * 1024, full_access());
        net.fill_random(&rb);
        for i in 0..n {
            post_rdma(&mut net, a, WrOpcode::RdmaRead, (&la, &rb), i, 64 * 1024);
        }
        finish(&mut net, n, 20_000_000_000);
        assert_eq!(net.mem(&la), net.mem(&rb), "seed {seed}");
    }
}

/// One path between two nodes that speak the extension (selective repeat by SACK), 5 %
/// loss each way and a deep queue in front of the receiver (1 Gb/s, 4 MB: 32 ms), no
/// congestion control to keep it short (a loopback socket's receive buffer is such a
/// queue). A resent hole waits behind the queue far longer than two of the round
/// trips measured before; the SACKs that meanwhile go on reporting it resend it again,
/// and when each of those spent a retry the QP ended in RETRY_EXC_ERR while the first
/// resend was still on its way.
#[test]
fn resends_queued_behind_a_deep_queue_spend_no_retries() {
    let mut net = SimNet::with_config(61, 2, Mtu::M4096, |c| {
        mp_on(c);
        c.cc = CcAlgorithm::Off;
    });
    let o = RcOpts {
        timeout: 14,
        ..RcOpts::default()
    };
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    settle(&mut net);
    net.bottleneck = Some(Bottleneck::new(1_000_000_000, 4_000_000, vec![1]));
    net.faults.loss = 0.05;
    let (n, len) = (64, 256 * 1024);
    let la = net.reg(0, n * len, full_access());
    let rb = net.reg(1, n * len, full_access());
    net.fill_random(&la);
    post_writes(&mut net, a, &la, &rb, n, len);
    finish(&mut net, n, 20_000_000_000);
    assert_eq!(net.mem(&la), net.mem(&rb), "every byte");
    assert_eq!(state(&net, 0, a), QpState::Rts);
    assert_eq!(state(&net, 1, b), QpState::Rts);
    let c = net.nodes[0].engine.counters();
    assert!(c.mp_sack_rcvd > 0 && c.held_skipped > 0, "{c:?}");
}

/// The other side of the rule above: a packet that never gets through while the
/// responder goes on reporting its hole (every copy of one PSN dropped) still ends in
/// RETRY_EXC_ERR, by the retransmit timeouts, which its resends do not push out.
#[test]
fn a_hole_that_never_fills_still_ends_in_retry_exceeded() {
    let mut net = SimNet::with_config(62, 2, Mtu::M4096, mp_on);
    let o = RcOpts {
        timeout: 10,
        ..RcOpts::default()
    };
    let (a, _b) = pair(&mut net, QpType::Rc, &o);
    settle(&mut net);
    let (n, len) = (8, 64 * 1024);
    let la = net.reg(0, n * len, full_access());
    let rb = net.reg(1, n * len, full_access());
    net.fill_random(&la);
    // The 20th request packet of the stream, every time it is sent.
    let first = net.nodes[0].engine.query_qp(a).expect("qp").0.sq_psn;
    let doomed = (first + 20) & 0xff_ffff;
    net.filter = Some(Box::new(move |from, pkt| {
        let psn = u32::from_be_bytes([0, pkt[9], pkt[10], pkt[11]]);
        from == 0 && pkt[0] < 0x20 && psn == doomed
    }));
    post_writes(&mut net, a, &la, &rb, n, len);
    let end = net.now + 60_000_000_000;
    let mut got: Vec<Completion> = Vec::new();
    while !got.iter().any(|c| c.status != WcStatus::Success) && net.now < end && net.step() {
        got.extend(net.take_completions(0));
    }
    let failed = got.iter().find(|c| c.status != WcStatus::Success);
    assert_eq!(
        failed.map(|c| c.status),
        Some(WcStatus::RetryExcErr),
        "{got:?}"
    );
    let c = net.nodes[0].engine.counters();
    assert!(c.mp_sack_rcvd > 0, "{c:?}");
}
