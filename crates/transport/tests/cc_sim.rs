//! Congestion control over a simulated bottleneck in virtual time: a link with a finite
//! drop-tail queue in front of the receivers; RC flows of 64 KiB WRITEs (or READs) kept
//! busy. The sender alone decides (nothing on the wire changes), from the round trips of
//! its own packets and from loss.

mod sim;

use sim::*;
use softhca_transport::*;

const MSG: usize = 64 * 1024;
/// WRs each flow keeps posted.
const DEPTH: usize = 64;
const GBIT: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// One RC flow kept busy with 64 KiB operations.
struct Flow {
    node: usize,
    qp: Qpn,
    src: Mr,
    dst: Mr,
    op: WrOpcode,
    posted: usize,
    done: usize,
    started: bool,
}

/// The queue of `tc qdisc add dev X root tbf rate R burst 256kb latency 5ms`: 5 ms of
/// the rate plus the burst.
fn tbf_queue(rate: u64) -> u64 {
    rate / 8 * 5 / 1000 + 256 * 1024
}

/// `n` sender/receiver node pairs (flow i: node i to node n + i), a bottleneck of
/// `rate` bits/s with a tbf's queue in front of the data's receivers.
fn net_with_flows(n: usize, rate: u64, op: WrOpcode) -> (SimNet, Vec<Flow>) {
    net_with_flows_cc(n, rate, op, CcAlgorithm::default())
}

/// [`net_with_flows`] with congestion control `cc`.
fn net_with_flows_cc(n: usize, rate: u64, op: WrOpcode, cc: CcAlgorithm) -> (SimNet, Vec<Flow>) {
    net_with_flows_rd(n, rate, op, cc, 16)
}

/// [`net_with_flows_cc`] with `rd_atomic` READs outstanding per QP.
fn net_with_flows_rd(
    n: usize,
    rate: u64,
    op: WrOpcode,
    cc: CcAlgorithm,
    rd_atomic: u8,
) -> (SimNet, Vec<Flow>) {
    let queue = tbf_queue(rate);
    let mut net = SimNet::with_config(7, 2 * n, Mtu::M4096, |c| c.cc = cc);
    net.faults.delay_ns = 20_000;
    let o = RcOpts {
        max_rd_atomic: rd_atomic,
        // perftest's: 67 ms, beyond a full queue's delay at 100 Mb/s.
        timeout: 14,
        ..RcOpts::default()
    };
    let mut flows = Vec::new();
    for i in 0..n {
        let (a, b) = (i, n + i);
        let qa = create(&mut net, a, QpType::Rc, &o, None);
        let qb = create(&mut net, b, QpType::Rc, &o, None);
        connect_one(&mut net, a, qa, QpType::Rc, b, qb, &o, 100, 200);
        connect_one(&mut net, b, qb, QpType::Rc, a, qa, &o, 200, 100);
        // WRITE: a's MR to b's; READ: b's MR into a's.
        let (la, rb) = (
            net.reg(a, MSG, full_access()),
            net.reg(b, MSG, full_access()),
        );
        let (src, dst) = if op == WrOpcode::RdmaRead {
            (rb, la)
        } else {
            (la, rb)
        };
        net.fill_random(&src);
        flows.push(Flow {
            node: a,
            qp: qa,
            src,
            dst,
            op,
            posted: 0,
            done: 0,
            started: false,
        });
    }
    // The data's receivers: b for WRITEs, a for READ responses.
    let behind = if op == WrOpcode::RdmaRead {
        (0..n).collect()
    } else {
        (n..2 * n).collect()
    };
    net.bottleneck = Some(Bottleneck::new(rate, queue, behind));
    (net, flows)
}

/// Post until each started flow has `DEPTH` WRs outstanding; count completions.
fn pump(net: &mut SimNet, flows: &mut [Flow]) {
    for f in flows.iter_mut() {
        for c in net.take_completions(f.node) {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            f.done += 1;
        }
        if !f.started {
            continue;
        }
        while f.posted - f.done < DEPTH {
            let (local, remote) = if f.op == WrOpcode::RdmaRead {
                (f.dst, f.src)
            } else {
                (f.src, f.dst)
            };
            let mut wr = send_wr(f.posted as u64, f.op, local.sges(0, MSG));
            wr.remote_addr = remote.addr;
            wr.rkey = remote.rkey;
            let now = net.now;
            net.nodes[f.node].engine.post_send(now, f.qp, wr).unwrap();
            f.posted += 1;
        }
    }
}

/// Run for `ns` of virtual time, keeping the flows busy.
fn run_for(net: &mut SimNet, flows: &mut [Flow], ns: u64) {
    let end = net.now + ns;
    while net.now < end {
        pump(net, flows);
        if !net.step() {
            break;
        }
    }
    pump(net, flows);
}

/// Bytes each flow's data sender put through the bottleneck.
fn through(net: &SimNet, flows: &[Flow]) -> Vec<u64> {
    let b = net.bottleneck.as_ref().unwrap();
    flows
        .iter()
        .map(|f| b.bytes_from.get(f.src.node).copied().unwrap_or(0))
        .collect()
}

/// Each flow's rate in bits/s over the next `ns`.
fn rates_over(net: &mut SimNet, flows: &mut [Flow], ns: u64) -> Vec<f64> {
    let before = through(net, flows);
    run_for(net, flows, ns);
    let after = through(net, flows);
    before
        .iter()
        .zip(after)
        .map(|(b, a)| (a - b) as f64 * 8.0 * 1e9 / ns as f64)
        .collect()
}

fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    s * s / (x.len() as f64 * q)
}

/// Every flow's last WRs complete and its destination holds its source's bytes.
fn finish_and_verify(net: &mut SimNet, flows: &mut [Flow]) {
    for f in flows.iter_mut() {
        f.started = false;
    }
    let end = net.now + 2_000 * MS;
    while flows.iter().any(|f| f.done < f.posted) && net.now < end {
        pump(net, flows);
        if !net.step() {
            break;
        }
    }
    pump(net, flows);
    for f in flows.iter() {
        assert_eq!(f.done, f.posted, "every WR completes");
        assert!(net.mem(&f.dst) == net.mem(&f.src), "data verified");
    }
}

fn drop_ratio(net: &SimNet) -> f64 {
    let b = net.bottleneck.as_ref().unwrap();
    b.drops as f64 / (b.drops + b.passed).max(1) as f64
}

fn converges_to_the_link_rate(op: WrOpcode, rate: u64) {
    converges_over(op, rate, 20_000, (10, 200), 0.9);
}

/// One flow over a bottleneck of `rate` with `delay` ns each way, after `warm` 10 ms
/// steps, reaches `share` of the link over the next `ms`.
fn converges_over(op: WrOpcode, rate: u64, delay: u64, (warm, ms): (u64, u64), share: f64) {
    let (mut net, mut flows) = net_with_flows(1, rate, op);
    net.faults.delay_ns = delay;
    flows[0].started = true;
    for _ in 0..warm {
        run_for(&mut net, &mut flows, 10 * MS);
        let b = net.bottleneck.as_ref().unwrap();
        let cc = net.nodes[0].engine.qp_cc_stats(flows[0].qp);
        eprintln!(
            "t={} drops={} passed={} {cc:?}",
            net.now / MS,
            b.drops,
            b.passed
        );
    }
    let r = rates_over(&mut net, &mut flows, ms * MS)[0];
    let cc = net.nodes[0].engine.qp_cc_stats(flows[0].qp).unwrap();
    eprintln!(
        "{op:?} at {} Mb/s: {:.0} Mb/s, drops {:.3} %, {cc:?}",
        rate / 1_000_000,
        r / 1e6,
        100.0 * drop_ratio(&net)
    );
    assert!(r >= share * rate as f64, "{:.0} Mb/s", r / 1e6);
    assert!(drop_ratio(&net) <= 0.01, "drops {}", drop_ratio(&net));
    finish_and_verify(&mut net, &mut flows);
}

/// A 10 ms round trip, over its first two seconds: slow start ends when the queue
/// shows, and the base probe after it costs about a round trip.
#[test]
fn write_fills_a_long_path() {
    converges_over(WrOpcode::RdmaWrite, GBIT, 5 * MS, (0, 2000), 0.93);
}

#[test]
fn write_converges_to_the_link_rate() {
    converges_to_the_link_rate(WrOpcode::RdmaWrite, GBIT);
}

#[test]
fn write_converges_on_a_slow_link() {
    converges_to_the_link_rate(WrOpcode::RdmaWrite, GBIT / 10);
}

#[test]
fn read_converges_to_the_link_rate() {
    converges_to_the_link_rate(WrOpcode::RdmaRead, GBIT);
}

#[test]
fn two_flows_share_the_link_fairly() {
    let (mut net, mut flows) = net_with_flows(2, GBIT, WrOpcode::RdmaWrite);
    flows.iter_mut().for_each(|f| f.started = true);
    run_for(&mut net, &mut flows, 200 * MS);
    let r = rates_over(&mut net, &mut flows, 500 * MS);
    eprintln!(
        "two flows: {:?} Mb/s, Jain {:.3}",
        r.iter().map(|x| (x / 1e6) as u64).collect::<Vec<_>>(),
        jain(&r)
    );
    assert!(jain(&r) >= 0.95, "{r:?}");
    assert!(r.iter().sum::<f64>() >= 0.9 * GBIT as f64, "{r:?}");
    // The second took part of the first's queue for its base (0.42 / 0.58 here without
    // probes taken together); both probe at the wall-clock grid's first point (1.07 s
    // at this round trip), see the base, and share the link from then on.
    run_for(&mut net, &mut flows, 500 * MS);
    let r = rates_over(&mut net, &mut flows, 1000 * MS);
    let total: f64 = r.iter().sum();
    eprintln!(
        "two flows after the grid's probe: {:?} Mb/s",
        r.iter().map(|x| (x / 1e6) as u64).collect::<Vec<_>>(),
    );
    assert!(
        r.iter().all(|x| (0.45..=0.55).contains(&(x / total))),
        "{r:?}"
    );
    assert!(total >= 0.9 * GBIT as f64, "{total}");
    assert!(drop_ratio(&net) <= 0.01, "drops {}", drop_ratio(&net));
    finish_and_verify(&mut net, &mut flows);
}

#[test]
fn a_late_starter_converges_to_its_share() {
    let (mut net, mut flows) = net_with_flows(2, GBIT, WrOpcode::RdmaWrite);
    flows[0].started = true;
    run_for(&mut net, &mut flows, 300 * MS);
    flows[1].started = true;
    // Within a second of its start, the late flow has its share.
    run_for(&mut net, &mut flows, 500 * MS);
    let r = rates_over(&mut net, &mut flows, 500 * MS);
    let total: f64 = r.iter().sum();
    eprintln!(
        "late starter: {:?} Mb/s",
        r.iter().map(|x| (x / 1e6) as u64).collect::<Vec<_>>()
    );
    // A delay-based late starter takes the queue it found for part of its base round
    // trip, so it leads a little (Vegas' and LEDBAT's known bias): Jain's index as for
    // two flows started together.
    assert!(jain(&r) >= 0.95, "{r:?}");
    assert!(total >= 0.9 * GBIT as f64, "{total}");
    finish_and_verify(&mut net, &mut flows);
}

#[test]
fn recovers_after_the_link_rate_changes() {
    let (mut net, mut flows) = net_with_flows(1, GBIT, WrOpcode::RdmaWrite);
    flows[0].started = true;
    run_for(&mut net, &mut flows, 200 * MS);
    // The path slows to a quarter: the flow follows it down without a loss storm...
    net.bottleneck.as_mut().unwrap().set_rate(GBIT / 4);
    run_for(&mut net, &mut flows, 100 * MS);
    let drops_before = net.bottleneck.as_ref().unwrap().drops;
    let r = rates_over(&mut net, &mut flows, 200 * MS)[0];
    eprintln!("down to 250 Mb/s: {:.0} Mb/s", r / 1e6);
    assert!(r >= 0.9 * GBIT as f64 / 4.0, "{r}");
    assert!(
        net.bottleneck.as_ref().unwrap().drops - drops_before < 50,
        "settled at the new rate without losses"
    );
    // ...and back up when it speeds up again.
    net.bottleneck.as_mut().unwrap().set_rate(GBIT);
    run_for(&mut net, &mut flows, 200 * MS);
    let r = rates_over(&mut net, &mut flows, 200 * MS)[0];
    eprintln!("back to 1 Gb/s: {:.0} Mb/s", r / 1e6);
    assert!(r >= 0.9 * GBIT as f64, "{r}");
    finish_and_verify(&mut net, &mut flows);
}

/// A ping-pong of `size`-byte SENDs between nodes 0 and 1 (no bottleneck: nothing can
/// queue), `iters` round trips; before every `stall_every`-th answer the answering host
/// stalls for `stall_ns` (descheduled, or holding its ACK for the application's answer
/// as softhca's datapath does), which delays the ACK of the message it just received.
/// Returns each round trip's virtual time and node 0's congestion figures.
fn ping_pong(
    cc: bool,
    size: usize,
    iters: usize,
    stall_every: usize,
    stall_ns: u64,
) -> (Vec<u64>, Option<CcStats>) {
    let mut net = SimNet::with_config(11, 2, Mtu::M4096, |c| {
        if !cc {
            c.cc = CcAlgorithm::Off;
        }
    });
    net.faults.delay_ns = 20_000;
    // 10 Gb/s hosts: what a stalled host sends waits for it.
    net.link_ps_per_byte = 800;
    let o = RcOpts {
        timeout: 14,
        ..RcOpts::default()
    };
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    let qps = [a, b];
    let bufs: Vec<(Mr, Mr)> = (0..2)
        .map(|n| {
            let src = net.reg(n, size, full_access());
            net.fill_random(&src);
            (src, net.reg(n, size, full_access()))
        })
        .collect();
    for n in 0..2 {
        for i in 0..4 {
            let wr = recv_wr(i, bufs[n].1.sges(0, size));
            net.nodes[n].engine.post_recv(qps[n], wr).unwrap();
        }
    }
    let mut times = Vec::new();
    for i in 0..iters {
        let t0 = net.now;
        for (from, to) in [(0, 1), (1, 0)] {
            let wr = send_wr(i as u64, WrOpcode::Send, bufs[from].0.sges(0, size));
            let now = net.now;
            net.nodes[from]
                .engine
                .post_send(now, qps[from], wr)
                .unwrap();
            let mut got = false;
            let end = net.now + 10_000 * MS;
            while !got && net.now < end {
                assert!(net.step(), "nothing left to do");
                for n in 0..2 {
                    for c in net.take_completions(n) {
                        assert_eq!(c.status, WcStatus::Success, "{c:?}");
                        if c.opcode == WcOpcode::Recv {
                            assert_eq!(n, to);
                            assert_eq!(c.byte_len as usize, size);
                            let wr = recv_wr(c.wr_id, bufs[n].1.sges(0, size));
                            net.nodes[n].engine.post_recv(qps[n], wr).unwrap();
                            got = true;
                        }
                    }
                }
            }
            assert!(got, "message {i} from node {from} arrived");
            assert!(
                net.mem(&bufs[to].1) == net.mem(&bufs[from].0),
                "data verified"
            );
            if from == 0 && stall_every > 0 && i % stall_every == stall_every - 1 {
                net.stall(1, stall_ns);
            }
        }
        times.push(net.now - t0);
    }
    (times, net.nodes[0].engine.qp_cc_stats(a))
}

fn mean(x: &[u64]) -> f64 {
    x.iter().sum::<u64>() as f64 / x.len().max(1) as f64
}

/// A ping-pong cannot fill a queue: a stalling peer (a host delay in the round trip,
/// the ACK of a message held for the application's answer) is not congestion, and the
/// round trips between stalls stay as fast as without congestion control.
#[test]
fn a_ping_pong_with_a_stalling_peer_keeps_its_speed() {
    for size in [4096, MSG] {
        let (off, _) = ping_pong(false, size, 200, 4, 3 * MS);
        let (on, cc) = ping_pong(true, size, 200, 4, 3 * MS);
        let cc = cc.expect("a controller");
        // The round trips without a stall: the last 100, every 4th left out.
        let quiet = |t: &[u64]| -> Vec<u64> {
            t.iter()
                .enumerate()
                .skip(100)
                .filter(|(i, _)| i % 4 != 3)
                .map(|(_, &v)| v)
                .collect()
        };
        let (m_off, m_on) = (mean(&quiet(&off)), mean(&quiet(&on)));
        eprintln!(
            "{size} B ping-pong, stall 3 ms every 4th: {:.0} us without, {:.0} us with congestion control; {cc:?}",
            m_off / 1e3,
            m_on / 1e3
        );
        assert!(m_on <= 1.2 * m_off, "{m_on} vs {m_off}");
        assert_eq!(cc.delay_decreases, 0, "{cc:?}");
    }
}

/// Bits/s one 64 KiB `op` flow completes over 1 % random loss each way on 2 Gb/s links
/// (no shared queue: nothing congests, the hosts' links limit), with or without
/// congestion control.
fn rate_at_random_loss(op: WrOpcode, cc: bool) -> (f64, Vec<CcStats>) {
    let alg = if cc {
        CcAlgorithm::default()
    } else {
        CcAlgorithm::Off
    };
    let (mut net, mut flows) = net_with_flows_cc(1, 2 * GBIT, op, alg);
    net.bottleneck = None;
    net.link_ps_per_byte = 4000;
    net.faults.loss = 0.01;
    net.faults.reorder = 0.0;
    flows[0].started = true;
    run_for(&mut net, &mut flows, 100 * MS);
    let done = flows[0].done;
    run_for(&mut net, &mut flows, 500 * MS);
    let r = ((flows[0].done - done) * MSG) as f64 * 8.0 / 0.5;
    let cc = net
        .nodes
        .iter()
        .flat_map(|n| n.engine.cc_stats())
        .map(|(_, s)| s)
        .collect();
    finish_and_verify(&mut net, &mut flows);
    (r, cc)
}

/// Random loss with no queue is not congestion: neither the requester's window nor the
/// responder's READ response rate falls for it.
#[test]
fn random_loss_keeps_the_rate() {
    for op in [WrOpcode::RdmaWrite, WrOpcode::RdmaRead] {
        let (off, _) = rate_at_random_loss(op, false);
        let (on, cc) = rate_at_random_loss(op, true);
        eprintln!(
            "{op:?} at 1 % loss: {:.0} Mb/s without, {:.0} Mb/s with congestion control; {cc:?}",
            off / 1e6,
            on / 1e6
        );
        assert!(on >= 0.9 * off, "{on} vs {off}");
    }
}

/// A 10 ms round trip behind a 5 ms token bucket: slow start ends as the queue shows,
/// overshooting it by at most one loss cut (a window that doubles per round trip is
/// up to twice the path's by the time the first late sample is back; whether that
/// overflows a queue of half the path depends on where the doubling falls), and one
/// base probe finds the base where it was, so no second follows.
#[test]
fn slow_start_on_a_long_path_overflows_its_queue_at_most_once() {
    let (mut net, mut flows) = net_with_flows(1, GBIT, WrOpcode::RdmaWrite);
    net.faults.delay_ns = 5 * MS;
    flows[0].started = true;
    let r = rates_over(&mut net, &mut flows, 1000 * MS)[0];
    let cc = net.nodes[0].engine.qp_cc_stats(flows[0].qp).unwrap();
    eprintln!("{:.0} Mb/s over the first second, {cc:?}", r / 1e6);
    assert!(drop_ratio(&net) <= 0.005, "{}", drop_ratio(&net));
    assert!(cc.loss_decreases <= 1);
    assert!(!cc.slow_start);
    assert_eq!(cc.base_probes, 1);
    assert_eq!(cc.min_rtt / MS, 10);
    finish_and_verify(&mut net, &mut flows);
}

/// The first 300 ms of a 10 ms round trip at 1 Gb/s: 0.78 of the link for WRITEs and
/// for READs, whose requests are paced by the responses they ask for (paced by
/// their own few bytes, a window of READs came back as one burst, whose queue ended
/// slow start early: 0.59, with 36 packets dropped), and the shaper drops under
/// 1 % of the packets (the overshoot of slow start, once). READs: 128
/// outstanding, as `softhca perf` asks for (16 of 64 KiB hold 1 MiB, less than the
/// path holds).
#[test]
fn a_long_path_fills_quickly() {
    for (op, rd_atomic, share) in [
        (WrOpcode::RdmaWrite, 16, 0.78),
        (WrOpcode::RdmaRead, 128, 0.78),
    ] {
        let alg = CcAlgorithm::default();
        let (mut net, mut flows) = net_with_flows_rd(1, GBIT, op, alg, rd_atomic);
        net.faults.delay_ns = 5 * MS;
        flows[0].started = true;
        let r = rates_over(&mut net, &mut flows, 300 * MS)[0];
        let cc = net.nodes[0].engine.qp_cc_stats(flows[0].qp).unwrap();
        eprintln!("{op:?}: {:.0} Mb/s over the first 300 ms, {cc:?}", r / 1e6);
        assert!(r >= share * GBIT as f64, "{op:?}: {:.0} Mb/s", r / 1e6);
        assert!(drop_ratio(&net) <= 0.01, "{op:?}: {}", drop_ratio(&net));
        assert!(!cc.slow_start);
        finish_and_verify(&mut net, &mut flows);
    }
}

/// [`run_for`], with `node`'s process descheduled for `pause` at the start of every
/// `period` (a loaded host's scheduler).
fn run_pausing(
    net: &mut SimNet,
    flows: &mut [Flow],
    ns: u64,
    node: usize,
    (period, pause): (u64, u64),
) {
    let end = net.now + ns;
    while net.now < end {
        let next = (net.now + period).min(end);
        net.pause(node, pause);
        run_for(net, flows, next - net.now);
    }
}

/// A WRITE flow over 1 Gb/s and a 10 ms round trip, its first `warm` ms undisturbed,
/// then `ns` with `node` paused as [`run_pausing`] does, the period starting again
/// every 50 ms (so that pauses do not fall at one phase of the round trip): the rate
/// over those, the flow's figures, and the shaper's drops during them.
fn pausing_flow(warm: u64, ns: u64, node: usize, pauses: (u64, u64)) -> (f64, CcStats, u64) {
    let (mut net, mut flows) = net_with_flows(1, GBIT, WrOpcode::RdmaWrite);
    net.faults.delay_ns = 5 * MS;
    flows[0].started = true;
    run_for(&mut net, &mut flows, warm * MS);
    let drops = net.bottleneck.as_ref().unwrap().drops;
    let before = through(&net, &flows)[0];
    let end = net.now + ns * MS;
    while net.now < end {
        let chunk = (50 * MS).min(end - net.now);
        run_pausing(&mut net, &mut flows, chunk, node, pauses);
    }
    let r = (through(&net, &flows)[0] - before) as f64 * 8.0 * 1e9 / (ns * MS) as f64;
    let cc = net.nodes[0].engine.qp_cc_stats(flows[0].qp).unwrap();
    let dropped = net.bottleneck.as_ref().unwrap().drops - drops;
    finish_and_verify(&mut net, &mut flows);
    (r, cc, dropped)
}

/// A sender descheduled for 5 ms of every 10 for 200 ms sends half of what its window
/// allows; the queue drains and the round trips stay at the base, but a window it did
/// not fill says nothing of a larger one: it must not grow, or the first full round
/// after the pauses overflows the token bucket.
#[test]
fn a_descheduled_sender_does_not_grow_its_window() {
    let (mut net, mut flows) = net_with_flows(1, GBIT, WrOpcode::RdmaWrite);
    net.faults.delay_ns = 5 * MS;
    flows[0].started = true;
    run_for(&mut net, &mut flows, 500 * MS);
    let w0 = net.nodes[0].engine.qp_cc_stats(flows[0].qp).unwrap();
    let drops = net.bottleneck.as_ref().unwrap().drops;
    run_pausing(&mut net, &mut flows, 200 * MS, 0, (10 * MS, 5 * MS));
    let w1 = net.nodes[0].engine.qp_cc_stats(flows[0].qp).unwrap();
    let r = rates_over(&mut net, &mut flows, 300 * MS)[0];
    let w2 = net.nodes[0].engine.qp_cc_stats(flows[0].qp).unwrap();
    let dropped = net.bottleneck.as_ref().unwrap().drops - drops;
    eprintln!(
        "window {} KiB before the pauses, {} KiB after; then {:.0} Mb/s, {dropped} dropped, {w2:?}",
        w0.window / 1024,
        w1.window / 1024,
        r / 1e6
    );
    assert!(w1.window <= w0.window + 64 * 1024, "{w0:?} {w1:?}");
    assert_eq!(dropped, 0);
    assert_eq!(w2.loss_decreases, w0.loss_decreases);
    assert!(r >= 0.93 * GBIT as f64, "{:.0} Mb/s", r / 1e6);
    finish_and_verify(&mut net, &mut flows);
}

/// A receiver (node 1), then a sender (node 0), descheduled for 3 ms at a time from
/// the start, over the first second: at least 0.8 of the link, at most `most_dropped`
/// of its 30,000 packets dropped, and a window still over the path's 1.25 MB.
fn keeps_up_while_pausing(node: usize, most_dropped: u64) {
    let (r, cc, dropped) = pausing_flow(0, 1000, node, (15 * MS, 3 * MS));
    eprintln!(
        "node {node} pausing: {:.0} Mb/s over the first second, {dropped} dropped, {cc:?}",
        r / 1e6
    );
    assert!(r >= 0.8 * GBIT as f64, "{:.0} Mb/s", r / 1e6);
    assert!(dropped <= most_dropped, "{dropped}");
    assert!(cc.window >= 1_250_000, "{cc:?}");
}

/// A pausing receiver's ACKs come late, in bunches: the window must not collapse. A
/// loss found as the first base probe began left nothing sampled until its repair was
/// done, and the probe, which ended only on a sample, held the least window through a
/// go-back-N repair for 400 ms (0.52 of the link over the first second). The bunched
/// ACKs still let slow start overshoot (a few hundred packets dropped, under the
/// issue's 1 %).
#[test]
fn a_pausing_receiver_neither_ends_slow_start_early_nor_collapses_the_window() {
    keeps_up_while_pausing(1, 300);
}

/// A pausing sender catches up after each pause, paced, and the link stays full.
#[test]
fn a_pausing_sender_keeps_the_link_full() {
    keeps_up_while_pausing(0, 10);
}
