//! One test per NAK and timer path of RC: sequence NAK, retransmit timeout and retry
//! exhaustion, RNR NAK (retry, exhaustion, infinite), duplicate READ and atomic.

mod sim;

use std::cell::RefCell;
use std::rc::Rc;

use sim::*;
use softhca_transport::*;

fn psn_of(pkt: &[u8]) -> u32 {
    u32::from_be_bytes([0, pkt[9], pkt[10], pkt[11]])
}

/// Drop the first `n` packets from `node` matching `pred`.
fn drop_first(
    net: &mut SimNet,
    node: usize,
    n: usize,
    pred: impl Fn(&[u8]) -> bool + 'static,
) -> Rc<RefCell<usize>> {
    let dropped = Rc::new(RefCell::new(0usize));
    let d = dropped.clone();
    net.filter = Some(Box::new(move |from, pkt| {
        if from == node && *d.borrow() < n && pred(pkt) {
            *d.borrow_mut() += 1;
            return true;
        }
        false
    }));
    dropped
}

fn write_setup(net: &mut SimNet, size: usize) -> (Qpn, Qpn, Mr, Mr) {
    let (a, b) = pair(net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, size, full_access());
    let rb = net.reg(1, size, full_access());
    net.fill_random(&la);
    (a, b, la, rb)
}

fn post_write(net: &mut SimNet, a: Qpn, id: u64, la: &Mr, rb: &Mr, off: usize, len: usize) {
    let mut w = send_wr(id, WrOpcode::RdmaWrite, la.sges(off, len));
    w.remote_addr = rb.addr + off as u64;
    w.rkey = rb.rkey;
    let now = net.now;
    net.nodes[0].engine.post_send(now, a, w).unwrap();
}

#[test]
fn psn_sequence_nak_then_go_back_n() {
    let mut net = SimNet::new(1, 2, Mtu::M1024);
    let (a, _b, la, rb) = write_setup(&mut net, 20_000);
    // Lose the third packet of the message once.
    let first_psn = 0x00ff_fff0u32;
    let dropped = drop_first(&mut net, 0, 1, move |p| {
        psn_of(p) == (first_psn + 2) & 0xff_ffff
    });
    post_write(&mut net, a, 1, &la, &rb, 0, 20_000);
    net.run(1_000_000_000);
    assert_eq!(*dropped.borrow(), 1);
    let s = net.take_completions(0);
    assert_eq!(
        s.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)]
    );
    assert!(net.mem(&rb) == net.mem(&la));
    assert_eq!(
        net.nodes[1].engine.counters().seq_err_naks,
        1,
        "one NAK per sequence error"
    );
    assert_eq!(net.nodes[0].engine.counters().rcvd_seq_err, 1);
    assert_eq!(
        net.nodes[0].engine.counters().local_ack_timeout_err,
        0,
        "recovered by the NAK, not the timer"
    );
}

#[test]
fn retransmit_timeout_recovers_lost_tail() {
    let mut net = SimNet::new(2, 2, Mtu::M1024);
    let (a, _b, la, rb) = write_setup(&mut net, 3000);
    // Lose the last packet: no later packet can reveal the gap, only the timer. It is
    // the WRITE packet with AckReq (BTH byte 8, bit 7): a WRITE Last, or a WRITE Only
    // when the engine splits writes (EngineConfig::split_rc_writes).
    let dropped = drop_first(&mut net, 0, 1, |p| {
        matches!(p[0], 0x08 | 0x0a) && p[8] & 0x80 != 0
    });
    post_write(&mut net, a, 1, &la, &rb, 0, 3000);
    net.run(1_000_000_000);
    assert_eq!(*dropped.borrow(), 1);
    let s = net.take_completions(0);
    assert_eq!(s[0].status, WcStatus::Success);
    assert!(net.mem(&rb) == net.mem(&la));
    assert_eq!(net.nodes[0].engine.counters().local_ack_timeout_err, 1);
    // The retransmission happened one timeout (4.096 us << 8) after the send.
    assert!(net.now >= 4096 << 8);
}

#[test]
fn retry_exhaustion_then_flush() {
    let mut net = SimNet::new(3, 2, Mtu::M1024);
    let o = RcOpts {
        retry_cnt: 3,
        ..RcOpts::default()
    };
    let (a, _b) = pair(&mut net, QpType::Rc, &o);
    let la = net.reg(0, 5000, full_access());
    let rb = net.reg(1, 5000, full_access());
    net.filter = Some(Box::new(|from, _| from == 0)); // the peer never hears us
    for id in 1..=3 {
        post_write(&mut net, a, id, &la, &rb, 0, 1000);
    }
    net.run(10_000_000_000);
    let s = net.take_completions(0);
    assert_eq!(
        s.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    let c = net.nodes[0].engine.counters();
    assert_eq!(
        c.local_ack_timeout_err, 4,
        "initial try + 3 retries, each timed out"
    );
    assert_eq!(c.retry_exceeded_err, 1);
    assert_eq!(
        net.nodes[0].engine.query_qp(a).unwrap().0.qp_state,
        QpState::Err
    );
    // In ERR nothing more goes out.
    let sent = net.nodes[0].engine.counters().sent_pkts;
    net.run(1_000_000_000);
    assert_eq!(net.nodes[0].engine.counters().sent_pkts, sent);
}

fn rnr_setup(o: &RcOpts) -> (SimNet, Qpn, Qpn, Mr, Mr) {
    let mut net = SimNet::new(4, 2, Mtu::M1024);
    let (a, b) = pair(&mut net, QpType::Rc, o);
    let la = net.reg(0, 3000, full_access());
    let rb = net.reg(1, 3000, full_access());
    net.fill_random(&la);
    let now = net.now;
    net.nodes[0]
        .engine
        .post_send(now, a, send_wr(1, WrOpcode::Send, la.sges(0, 3000)))
        .unwrap();
    (net, a, b, la, rb)
}

/// Posts receive 9 on node 1's `b`, runs, checks that send 1 of node 0 completed, and
/// returns node 1's completions.
fn recv_then_done(net: &mut SimNet, b: Qpn, sges: smallvec::SmallVec<[Sge; 4]>) -> Vec<Completion> {
    net.nodes[1].engine.post_recv(b, recv_wr(9, sges)).unwrap();
    net.run(1_000_000_000);
    let s = net.take_completions(0);
    assert_eq!((s[0].wr_id, s[0].status), (1, WcStatus::Success));
    net.take_completions(1)
}

#[test]
fn rnr_nak_then_success_after_recv_posted() {
    let o = RcOpts {
        min_rnr_timer: 14,
        ..RcOpts::default()
    }; // 1.28 ms
    let (mut net, _a, b, la, rb) = rnr_setup(&o);
    net.run_until(1_000_000_000, |n| {
        n.nodes[0].engine.counters().rcvd_rnr_err >= 2
    });
    assert_eq!(net.nodes[1].engine.counters().send_rnr_err, 2);
    assert!(net.take_completions(0).is_empty());
    let r = recv_then_done(&mut net, b, rb.sges(0, 3000));
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len),
        (9, WcStatus::Success, 3000)
    );
    assert!(net.mem(&rb) == net.mem(&la));
    // RNR retries are paced by the RNR timer (IBTA table 45: code 14 = 1.28 ms).
    assert!(net.now >= 2 * 1_280_000);
}

#[test]
fn rnr_retry_exhaustion() {
    let o = RcOpts {
        rnr_retry: 2,
        min_rnr_timer: 1,
        ..RcOpts::default()
    };
    let (mut net, a, _b, _la, _rb) = rnr_setup(&o);
    let now = net.now;
    net.nodes[0]
        .engine
        .post_send(now, a, send_wr(2, WrOpcode::Send, Default::default()))
        .unwrap();
    net.run(1_000_000_000);
    let s = net.take_completions(0);
    assert_eq!(
        s.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(net.nodes[0].engine.counters().rcvd_rnr_err, 3);
    assert_eq!(net.nodes[0].engine.counters().retry_rnr_exceeded_err, 1);
}

#[test]
fn rnr_retry_7_is_infinite() {
    let o = RcOpts {
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..RcOpts::default()
    };
    let (mut net, _a, b, _la, rb) = rnr_setup(&o);
    net.run_until(10_000_000_000, |n| {
        n.nodes[0].engine.counters().rcvd_rnr_err >= 50
    });
    assert!(net.take_completions(0).is_empty());
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(9, rb.sges(0, 3000)))
        .unwrap();
    net.run(1_000_000_000);
    let s = net.take_completions(0);
    assert_eq!(s[0].status, WcStatus::Success);
}

/// RDMA WRITE with immediate of `len` bytes to a responder with no receive posted: the
/// packet carrying the immediate (Only, or Last after First and Middle were placed) gets
/// RNR NAKs; once a receive is posted its retry completes the write. rxe takes the
/// receive WQE before it checks or starts the write, so an RNR leaves no message in
/// progress behind (a retried Only after one would be out of sequence: invalid request).
fn write_with_imm_after_rnr(len: usize) {
    let o = RcOpts {
        min_rnr_timer: 1,
        ..RcOpts::default()
    };
    let mut net = SimNet::new(4, 2, Mtu::M1024);
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    let la = net.reg(0, len, full_access());
    let rb = net.reg(1, len, full_access());
    net.fill_random(&la);
    let mut w = send_wr(1, WrOpcode::RdmaWriteWithImm, la.sges(0, len));
    w.remote_addr = rb.addr;
    w.rkey = rb.rkey;
    w.imm_data = 0x1234_5678;
    let now = net.now;
    net.nodes[0].engine.post_send(now, a, w).unwrap();
    net.run_until(1_000_000_000, |n| {
        n.nodes[0].engine.counters().rcvd_rnr_err >= 2
    });
    let r = recv_then_done(&mut net, b, Default::default());
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len, r[0].imm_data),
        (9, WcStatus::Success, len as u32, 0x1234_5678)
    );
    assert!(net.mem(&rb) == net.mem(&la));
    assert_eq!(net.nodes[0].engine.counters().rcvd_invalid_request_naks, 0);
}

#[test]
fn rnr_on_write_with_imm_only_then_success() {
    write_with_imm_after_rnr(1000);
}

#[test]
fn rnr_on_write_with_imm_last_then_success() {
    write_with_imm_after_rnr(3000);
}

#[test]
fn duplicate_read_is_reexecuted() {
    let mut net = SimNet::new(5, 2, Mtu::M1024);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 10_000, full_access());
    let rb = net.reg(1, 10_000, full_access());
    net.fill_random(&rb);
    // Lose the second READ response packet once: the requester re-asks from there.
    let dropped = drop_first(&mut net, 1, 1, |p| p[0] == 0x0e);
    let mut r = send_wr(1, WrOpcode::RdmaRead, la.sges(0, 10_000));
    r.remote_addr = rb.addr;
    r.rkey = rb.rkey;
    net.nodes[0].engine.post_send(0, a, r).unwrap();
    net.run(1_000_000_000);
    assert_eq!(*dropped.borrow(), 1);
    let s = net.take_completions(0);
    assert_eq!((s[0].status, s[0].byte_len), (WcStatus::Success, 10_000));
    assert!(net.mem(&la) == net.mem(&rb));
    assert_eq!(
        net.nodes[1].engine.counters().duplicate_request,
        1,
        "the retried READ is a duplicate"
    );
}

#[test]
fn duplicate_atomic_replayed_not_reexecuted() {
    let mut net = SimNet::new(6, 2, Mtu::M1024);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 64, full_access());
    let rb = net.reg(1, 64, full_access());
    net.mem_mut(&rb)[..8].copy_from_slice(&100u64.to_ne_bytes());
    // Lose the ATOMIC ACKNOWLEDGE twice: the requester times out and resends.
    let dropped = drop_first(&mut net, 1, 2, |p| p[0] == 0x12);
    let mut f = send_wr(1, WrOpcode::AtomicFetchAndAdd, la.sges(0, 8));
    f.remote_addr = rb.addr;
    f.rkey = rb.rkey;
    f.compare_add = 1;
    net.nodes[0].engine.post_send(0, a, f).unwrap();
    net.run(1_000_000_000);
    assert_eq!(*dropped.borrow(), 2);
    let s = net.take_completions(0);
    assert_eq!(
        (s[0].status, s[0].opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(
        u64::from_ne_bytes(net.mem(&la)[..8].try_into().unwrap()),
        100,
        "original value"
    );
    assert_eq!(
        u64::from_ne_bytes(net.mem(&rb)[..8].try_into().unwrap()),
        101,
        "added exactly once"
    );
    assert_eq!(net.nodes[1].engine.counters().duplicate_request, 2);
}

/// Reordering without loss on a 10 Gb/s link (30 % of packets 0–20 µs late, well inside
/// the 200 µs reorder timer): early WRITE requests are kept by the responder and early
/// READ responses placed by the requester, so not one sequence NAK, retransmission or
/// timeout happens, and every byte arrives (plain go-back-N would NAK and resend the
/// window on each reordering).
#[test]
fn reordering_is_absorbed_without_go_back_n() {
    // Unpaced, as the seed's reorderings were chosen: paced, a READ request reordered
    // behind the next one is 256 PSNs "ahead" (its responses' PSNs), past
    // OOO_NAK_AFTER, and draws one harmless NAK.
    let mut net = SimNet::with_config(21, 2, Mtu::M1024, |c| c.cc = CcAlgorithm::Off);
    // A 10 Gb/s link: a 20 us late packet lands about 24 packets behind its place.
    net.link_ps_per_byte = 800;
    net.faults = Faults {
        reorder: 0.3,
        jitter_ns: 20_000,
        ..Faults::default()
    };
    let size = 1 << 20;
    let (a, _b, la, rb) = write_setup(&mut net, size);
    for k in 0..4 {
        post_write(&mut net, a, k, &la, &rb, k as usize * size / 4, size / 4);
    }
    net.run(2_000_000_000);
    let s = net.take_completions(0);
    assert_eq!(s.len(), 4);
    assert!(s.iter().all(|c| c.status == WcStatus::Success), "{s:?}");
    assert!(net.mem(&rb) == net.mem(&la));
    // READ it back into a fresh buffer.
    let back = net.reg(0, size, full_access());
    for k in 0..4u64 {
        let off = k as usize * size / 4;
        let mut w = send_wr(10 + k, WrOpcode::RdmaRead, back.sges(off, size / 4));
        w.remote_addr = rb.addr + off as u64;
        w.rkey = rb.rkey;
        let now = net.now;
        net.nodes[0].engine.post_send(now, a, w).unwrap();
    }
    net.run(2_000_000_000);
    let s = net.take_completions(0);
    assert_eq!(s.len(), 4);
    assert!(s.iter().all(|c| c.status == WcStatus::Success), "{s:?}");
    assert!(net.mem(&back) == net.mem(&la), "READ data differs");
    let (req, resp) = (
        net.nodes[0].engine.counters().clone(),
        net.nodes[1].engine.counters().clone(),
    );
    assert!(resp.ooo_placed > 10, "responder kept nothing: {resp:?}");
    assert!(
        req.ooo_placed > 10,
        "requester placed no early READ response: {req:?}"
    );
    assert_eq!(resp.seq_err_naks, 0, "{resp:?}");
    assert_eq!(req.completer_retry_err, 0, "{req:?}");
    assert_eq!(req.local_ack_timeout_err, 0, "{req:?}");
}

/// Posts `n` signaled READs of `size` bytes on `a` (node 0), each into its own slice of
/// a new local buffer from the same slice of a new remote one filled with random bytes.
fn post_reads(net: &mut SimNet, a: Qpn, n: usize, size: usize) -> (Mr, Mr) {
    let la = net.reg(0, n * size, full_access());
    let rb = net.reg(1, n * size, full_access());
    net.fill_random(&rb);
    for k in 0..n {
        let mut r = send_wr(k as u64, WrOpcode::RdmaRead, la.sges(k * size, size));
        r.remote_addr = rb.addr + (k * size) as u64;
        r.rkey = rb.rkey;
        r.flags = SendFlags::SIGNALED;
        let now = net.now;
        net.nodes[0].engine.post_send(now, a, r).unwrap();
    }
    (la, rb)
}

/// Every one of the `n` READs completed successfully with the remote bytes; returns the
/// requester's and the responder's counters.
fn reads_done(net: &mut SimNet, n: usize, la: &Mr, rb: &Mr) -> (Counters, Counters) {
    let s = net.take_completions(0);
    assert_eq!(s.len(), n);
    assert!(s.iter().all(|c| c.status == WcStatus::Success), "{s:?}");
    assert!(net.mem(la) == net.mem(rb), "READ data differs");
    (
        net.nodes[0].engine.counters().clone(),
        net.nodes[1].engine.counters().clone(),
    )
}

/// A READ responder that stalls for a second with 128 READs of 64 KiB outstanding
/// (kernel rxe does, under an emulated or loaded host; CI saw `ib_read_bw` fail so).
/// Each retransmit timeout used to re-request every outstanding READ: the responder
/// replays every one of them, 8 MiB more work per timeout on a peer already behind, and
/// 8 timeouts of 67 ms without progress ended the QP in RETRY_EXC_ERR. Now the timeout
/// doubles while nothing progresses, and each timeout re-requests only the READ at the
/// head: every READ completes, and the responder replays a handful.
#[test]
fn stalled_read_responder_is_not_flooded_with_duplicates() {
    let mut net = SimNet::new(41, 2, Mtu::M4096);
    // About 32 MB/s of responses, like rxe under emulation.
    net.link_ps_per_byte = 31_250;
    let o = RcOpts {
        timeout: 14,
        max_rd_atomic: 128,
        ..RcOpts::default()
    };
    let (a, _b) = pair(&mut net, QpType::Rc, &o);
    let n = 128;
    let (la, rb) = post_reads(&mut net, a, n, 65_536);
    net.run_until(50_000_000, |n| n.now >= 50_000_000);
    net.stall(1, 1_000_000_000);
    net.run(30_000_000_000);
    let (req, resp) = reads_done(&mut net, n, &la, &rb);
    assert!(req.local_ack_timeout_err >= 2, "no stall seen: {req:?}");
    // Each timeout, and each of the (at most 2) resends after a silence, asks for the
    // head READ alone.
    assert!(req.quiet_resend <= 2, "{req:?}");
    let resends = req.local_ack_timeout_err + req.quiet_resend;
    assert_eq!(req.read_probe, resends, "{req:?}");
    assert!(
        resp.duplicate_request <= resends,
        "replayed {} READs for {resends} resends",
        resp.duplicate_request,
    );
}

/// The other side of re-requesting only the head READ at a timeout: READ requests lost
/// at the tail (nothing behind them for the responder to NAK) are each asked again in
/// turn, and every READ completes with its data.
#[test]
fn lost_tail_of_read_requests_is_recovered() {
    let mut net = SimNet::new(42, 2, Mtu::M1024);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let n = 16;
    let (la, rb) = post_reads(&mut net, a, n, 4096);
    // The first transmission of the last 6 READ requests is lost.
    let dropped = drop_first(&mut net, 0, 6, {
        let seen = std::cell::Cell::new(0usize);
        move |p| {
            if p[0] != 0x0c {
                return false;
            }
            seen.set(seen.get() + 1);
            seen.get() > n - 6
        }
    });
    net.run(1_000_000_000);
    assert_eq!(*dropped.borrow(), 6);
    reads_done(&mut net, n, &la, &rb);
}

/// 16 READs of 16 KiB (16 response packets each at MTU 1024) in flight at 10 Gb/s, so
/// that responses of later READs arrive while a hole waits. All 16 go out at once: no
/// congestion window (they are the subject, not the pace).
fn sixteen_reads(seed: u64, o: &RcOpts) -> (SimNet, Mr, Mr) {
    let mut net = SimNet::with_config(seed, 2, Mtu::M1024, |c| c.cc = CcAlgorithm::Off);
    net.link_ps_per_byte = 800;
    let (a, _b) = pair(&mut net, QpType::Rc, o);
    let (la, rb) = post_reads(&mut net, a, 16, 16_384);
    (net, la, rb)
}

/// Loses the READ response packets numbered `lost` (from 1, in sending order) once.
fn lose_responses(net: &mut SimNet, lost: &'static [usize]) -> Rc<RefCell<usize>> {
    let seen = std::cell::Cell::new(0usize);
    drop_first(net, 1, lost.len(), move |p| {
        if !(0x0d..=0x10).contains(&p[0]) {
            return false;
        }
        seen.set(seen.get() + 1);
        lost.contains(&seen.get())
    })
}

/// A response lost in the middle of one READ of 16 in flight: the reorder timer
/// re-requests that READ's missing part alone. The READs behind it, whose responses
/// arrived and were placed meanwhile, are not asked again (going back N made the
/// responder replay all of them).
#[test]
fn hole_in_one_read_re_requests_only_that_read() {
    let (mut net, la, rb) = sixteen_reads(43, &RcOpts::default());
    // READ 0's 6th response packet.
    let dropped = lose_responses(&mut net, &[6]);
    net.run(1_000_000_000);
    assert_eq!(*dropped.borrow(), 1);
    let (req, resp) = reads_done(&mut net, 16, &la, &rb);
    assert_eq!(req.read_probe, 1, "{req:?}");
    assert_eq!(req.local_ack_timeout_err, 0, "{req:?}");
    assert_eq!(
        resp.duplicate_request, 1,
        "only the READ with the hole: {resp:?}"
    );
}

/// Holes in two READs' responses, with placed responses between and after them: both
/// READs are re-requested in one pass, each from its first missing response, and none
/// of the READs between them (going back N replayed every READ from the first hole).
#[test]
fn holes_in_two_reads_re_request_only_those_two() {
    let (mut net, la, rb) = sixteen_reads(44, &RcOpts::default());
    // In READ 0 and in READ 9.
    let dropped = lose_responses(&mut net, &[6, 150]);
    net.run(1_000_000_000);
    assert_eq!(*dropped.borrow(), 2);
    let (req, resp) = reads_done(&mut net, 16, &la, &rb);
    assert_eq!(req.read_probe, 2, "{req:?}");
    assert_eq!(req.local_ack_timeout_err, 0, "{req:?}");
    assert_eq!(
        resp.duplicate_request, 2,
        "only the two READs with holes: {resp:?}"
    );
}

/// The re-request of a READ with a hole is lost too, with the READ window full: nothing
/// is sent after it, so no NAK and no new gap can report the loss. The responder then
/// falls silent with the hole still open, and after 4 round trips of silence (at least
/// 1 ms) the READ is asked again, instead of waiting out the retransmit timeout (67 ms
/// at timeout 14, where each such loss cost a timeout: most of READ's time at 1 % loss).
#[test]
fn lost_re_request_is_asked_again_before_the_timeout() {
    let o = RcOpts {
        timeout: 14,
        ..RcOpts::default()
    };
    let (mut net, la, rb) = sixteen_reads(45, &o);
    let n = 16;
    // Response packet 6 (in READ 0) is lost, then the first re-request (the 17th READ
    // request on the wire).
    let dropped = Rc::new(RefCell::new(0usize));
    let d = dropped.clone();
    let (responses, requests) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0usize));
    net.filter = Some(Box::new(move |from, p| {
        let drop = match (from, p[0]) {
            (1, 0x0d..=0x10) => {
                responses.set(responses.get() + 1);
                responses.get() == 6
            }
            (0, 0x0c) => {
                requests.set(requests.get() + 1);
                requests.get() == n + 1
            }
            _ => false,
        };
        *d.borrow_mut() += usize::from(drop);
        drop
    }));
    let start = net.now;
    assert!(net.run_until(1_000_000_000, |net| net.count_completions(0) >= n));
    let took = net.now - start;
    assert!(
        took < 10_000_000,
        "done {} us after the start; one retransmit timeout is 67 ms",
        took / 1000
    );
    net.run(1_000_000_000);
    assert_eq!(*dropped.borrow(), 2);
    let (req, resp) = reads_done(&mut net, n, &la, &rb);
    assert_eq!(req.local_ack_timeout_err, 0, "{req:?}");
    assert_eq!(req.read_probe, 2, "{req:?}");
    assert_eq!(resp.duplicate_request, 1, "the second re-request: {resp:?}");
}

/// A WRITE pair with perftest's timeout (14: 67 ms) whose round trip is measured (one
/// WRITE of 1000 bytes done), buffers of `size` bytes.
fn measured_write_pair(seed: u64, size: usize) -> (SimNet, Qpn, Mr, Mr) {
    let mut net = SimNet::new(seed, 2, Mtu::M1024);
    let o = RcOpts {
        timeout: 14,
        ..RcOpts::default()
    };
    let (a, _b) = pair(&mut net, QpType::Rc, &o);
    let la = net.reg(0, size, full_access());
    let rb = net.reg(1, size, full_access());
    net.fill_random(&la);
    post_write(&mut net, a, 1, &la, &rb, 0, 1000);
    net.run_until(1_000_000_000, |n| n.count_completions(0) == 1);
    assert_eq!(net.take_completions(0)[0].status, WcStatus::Success);
    (net, a, la, rb)
}

/// WRITE 2 of `len` bytes completes intact, within 10 ms of its post (not a timeout
/// later); returns the requester's counters.
fn second_write_done(net: &mut SimNet, a: Qpn, la: &Mr, rb: &Mr, len: usize) -> Counters {
    let start = net.now;
    post_write(net, a, 2, la, rb, 0, len);
    net.run_until(1_000_000_000, |n| n.count_completions(0) == 1);
    let s = net.take_completions(0);
    assert_eq!((s[0].wr_id, s[0].status), (2, WcStatus::Success));
    assert!(net.mem(rb) == net.mem(la));
    assert!(
        net.now - start < 10_000_000,
        "done {} ns after the post",
        net.now - start
    );
    net.nodes[0].engine.counters().clone()
}

/// A ping-pong's loss is always at the tail: the last packet of a WRITE with nothing
/// sent after it. Once a round trip is measured, the tail-loss probe resends it after
/// two round trips of silence instead of waiting for the retransmit timeout. When the
/// probe is lost too (or what it draws), another follows, four times as far into the
/// silence, still before the timeout.
#[test]
fn tail_loss_probes_recover_a_lost_last_packet_before_the_timeout() {
    for (seed, lost) in [(3, 1), (7, 2)] {
        let (mut net, a, la, rb) = measured_write_pair(seed, 3000);
        // The last packet (the one asking for the ACK), then the probes' copies of it.
        let dropped = drop_first(&mut net, 0, lost, |p| {
            matches!(p[0], 0x08 | 0x0a) && p[8] & 0x80 != 0
        });
        let c = second_write_done(&mut net, a, &la, &rb, 3000);
        assert_eq!(*dropped.borrow(), lost);
        assert_eq!(
            (c.tail_probe, c.local_ack_timeout_err),
            (lost as u64, 0),
            "{c:?}"
        );
        assert_eq!(c.completer_retry_err, 0, "a probe spends no retry");
    }
}

/// The whole tail of a message lost: the probe (its last packet) reaches the responder
/// out of sequence and draws a sequence NAK, which goes back N from the first missing
/// packet.
#[test]
fn tail_loss_probe_draws_a_sequence_nak_when_more_was_lost() {
    let (mut net, a, la, rb) = measured_write_pair(4, 8192);
    // Lose the last three request packets of an 8-packet WRITE, once each.
    let dropped = drop_first(&mut net, 0, 3, {
        let seen = std::cell::Cell::new(0usize);
        move |p| {
            if !matches!(p[0], 0x06..=0x0b) {
                return false;
            }
            seen.set(seen.get() + 1);
            seen.get() > 5
        }
    });
    let c = second_write_done(&mut net, a, &la, &rb, 8192);
    assert_eq!(*dropped.borrow(), 3);
    assert_eq!((c.tail_probe, c.local_ack_timeout_err), (1, 0), "{c:?}");
    assert_eq!(c.rcvd_seq_err, 1, "{c:?}");
}

/// A READ's last response lost: no later response shows a gap. The probe asks again
/// for that response alone (a READ request at its PSN), and only it comes back.
#[test]
fn tail_loss_probe_asks_again_for_a_lost_last_read_response() {
    let mut net = SimNet::new(5, 2, Mtu::M1024);
    let o = RcOpts {
        timeout: 14,
        ..RcOpts::default()
    };
    let (a, _b) = pair(&mut net, QpType::Rc, &o);
    let (la, rb) = post_reads(&mut net, a, 1, 3072);
    net.run_until(1_000_000_000, |n| n.count_completions(0) == 1);
    reads_done(&mut net, 1, &la, &rb);
    // READ RESPONSE Last (0x0f) of the next READ, once.
    let dropped = drop_first(&mut net, 1, 1, |p| p[0] == 0x0f);
    net.fill_random(&rb);
    let mut r = send_wr(7, WrOpcode::RdmaRead, la.sges(0, 3072));
    r.remote_addr = rb.addr;
    r.rkey = rb.rkey;
    r.flags = SendFlags::SIGNALED;
    let start = net.now;
    net.nodes[0].engine.post_send(start, a, r).unwrap();
    net.run_until(1_000_000_000, |n| n.count_completions(0) == 1);
    assert_eq!(*dropped.borrow(), 1);
    let (req, resp) = reads_done(&mut net, 1, &la, &rb);
    assert_eq!(
        (req.tail_probe, req.local_ack_timeout_err),
        (1, 0),
        "{req:?}"
    );
    // 3 + 3 responses for the two READs, and the one asked again.
    assert_eq!(resp.sent_pkts, 7, "{resp:?}");
    assert!(net.now - start < 10_000_000, "{} ns", net.now - start);
}

/// A responder that only pauses (its ACK is late, nothing was lost): each probe is a
/// duplicate, acknowledged again, and spends no retry. A 5 ms pause sees two (1 and 4
/// ms into the silence), a 3 ms one a single probe.
#[test]
fn a_spurious_tail_loss_probe_costs_a_duplicate() {
    for (seed, pause, probes) in [(6, 5_000_000, 2), (8, 3_000_000, 1)] {
        let (mut net, a, la, rb) = measured_write_pair(seed, 2048);
        net.pause(1, pause);
        let c = second_write_done(&mut net, a, &la, &rb, 2048);
        assert_eq!(c.tail_probe, probes, "{c:?}");
        assert_eq!(
            (c.completer_retry_err, c.local_ack_timeout_err),
            (0, 0),
            "{c:?}"
        );
        assert_eq!(net.nodes[1].engine.counters().duplicate_request, probes);
    }
}
