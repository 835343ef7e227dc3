//! Error completions, remote access checks, the QP state machine and flushing.

mod sim;

use std::cell::RefCell;
use std::rc::Rc;

use sim::*;
use softhca_transport::*;

/// A WRITE that the responder must refuse; returns (requester completions, responder
/// QP state, target memory unchanged?).
fn refused_write(
    mk: impl FnOnce(&mut SimNet, &Mr) -> (u64, u32, usize, Option<Mr>),
) -> (Vec<Completion>, QpState, bool, Counters) {
    let mut net = SimNet::new(1, 2, Mtu::M1024);
    let (a, b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 8192, full_access());
    net.fill_random(&la);
    let rb = net.reg(1, 4096, full_access());
    let (addr, rkey, len, target) = mk(&mut net, &rb);
    let target = target.unwrap_or(rb);
    let before = net.mem(&target).to_vec();
    let mut w = send_wr(1, WrOpcode::RdmaWrite, la.sges(0, len));
    w.remote_addr = addr;
    w.rkey = rkey;
    net.nodes[0].engine.post_send(0, a, w).unwrap();
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(2, WrOpcode::Send, la.sges(0, 10)))
        .unwrap();
    net.run(1_000_000_000);
    let untouched = net.mem(&target) == &before[..] && net.mem(&rb).iter().all(|&x| x == 0);
    let st = net.nodes[1].engine.query_qp(b).unwrap().0.qp_state;
    let c = net.nodes[1].engine.counters().clone();
    (net.take_completions(0), st, untouched, c)
}

fn assert_rem_access(r: (Vec<Completion>, QpState, bool, Counters)) {
    let (s, st, untouched, c) = r;
    assert_eq!(
        s.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        st,
        QpState::Err,
        "rxe moves the RC responder to ERR on an rkey violation"
    );
    assert!(untouched, "target memory untouched");
    assert_eq!(c.sent_remote_access_err_naks, 1);
}

#[test]
fn remote_access_bad_rkey() {
    assert_rem_access(refused_write(|_, rb| {
        (rb.addr, rb.rkey ^ 0x5a5a_0000, 100, None)
    }));
}

#[test]
fn remote_access_out_of_bounds() {
    assert_rem_access(refused_write(|_, rb| (rb.addr + 4000, rb.rkey, 200, None)));
}

#[test]
fn remote_access_missing_remote_write() {
    assert_rem_access(refused_write(|net, _| {
        let ro = net.reg(1, 4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
        (ro.addr, ro.rkey, 100, Some(ro))
    }));
}

#[test]
fn remote_access_other_pd() {
    assert_rem_access(refused_write(|net, _| {
        let pd2 = net.nodes[1].engine.memory_mut().alloc_pd();
        let other = net.reg_pd(1, pd2, 4096, full_access());
        (other.addr, other.rkey, 100, Some(other))
    }));
}

#[test]
fn remote_access_iova_overflow() {
    assert_rem_access(refused_write(|_, rb| (u64::MAX - 10, rb.rkey, 100, None)));
}

#[test]
fn read_without_remote_read_and_misaligned_atomic() {
    for case in 0..2 {
        let mut net = SimNet::new(2, 2, Mtu::M1024);
        let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
        let la = net.reg(0, 64, full_access());
        let wo = net.reg(
            1,
            64,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        );
        net.mem_mut(&wo)[..16].copy_from_slice(&[7u8; 16]);
        let wr = if case == 0 {
            let mut r = send_wr(1, WrOpcode::RdmaRead, la.sges(0, 32));
            r.remote_addr = wo.addr;
            r.rkey = wo.rkey;
            r
        } else {
            let mut f = send_wr(1, WrOpcode::AtomicFetchAndAdd, la.sges(0, 8));
            f.remote_addr = wo.addr + 4;
            f.rkey = wo.rkey;
            f.compare_add = 1;
            f
        };
        net.nodes[0].engine.post_send(0, a, wr).unwrap();
        net.run(1_000_000_000);
        let s = net.take_completions(0);
        let want = if case == 0 {
            WcStatus::RemAccessErr
        } else {
            WcStatus::RemInvReqErr
        };
        assert_eq!(s[0].status, want, "case {case}");
        assert_eq!(&net.mem(&wo)[..16], &[7u8; 16]);
        assert!(net.mem(&la).iter().all(|&x| x == 0));
    }
}

#[test]
fn loc_len_err_on_small_receive_buffer() {
    let mut net = SimNet::new(3, 2, Mtu::M256);
    let (a, b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 1000, full_access());
    let rb = net.reg(1, 1000, full_access());
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(5, rb.sges(0, 300)))
        .unwrap();
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(6, rb.sges(300, 300)))
        .unwrap();
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(1, WrOpcode::Send, la.sges(0, 700)))
        .unwrap();
    net.run(1_000_000_000);
    let r = net.take_completions(1);
    assert_eq!(
        r.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(5, WcStatus::LocLenErr), (6, WcStatus::WrFlushErr)]
    );
    let s = net.take_completions(0);
    assert_eq!(s[0].status, WcStatus::RemInvReqErr);
    assert_eq!(net.nodes[1].engine.counters().sent_invalid_request_naks, 1);
}

#[test]
fn loc_prot_err_on_bad_lkey() {
    let mut net = SimNet::new(4, 2, Mtu::M1024);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 1000, full_access());
    let mut bad = la.sges(0, 100);
    bad[0].lkey ^= 0x0101_0000;
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(1, WrOpcode::Send, bad))
        .unwrap();
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(2, WrOpcode::Send, la.sges(0, 10)))
        .unwrap();
    net.run(1_000_000_000);
    let s = net.take_completions(0);
    assert_eq!(
        s.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        net.nodes[0].engine.counters().sent_pkts,
        0,
        "nothing left for a bad lkey"
    );
    assert_eq!(
        net.nodes[0].engine.query_qp(a).unwrap().0.qp_state,
        QpState::Err
    );
}

#[test]
fn qp_state_transition_table() {
    let mut net = SimNet::new(5, 2, Mtu::M1024);
    let o = RcOpts::default();
    let q = create(&mut net, 0, QpType::Rc, &o, None);
    let e = &mut net.nodes[0].engine;
    let inval =
        |r: Result<(), TransportError>| matches!(r, Err(TransportError::InvalidArgument(_)));
    let st = |s| QpAttr {
        qp_state: s,
        port_num: 1,
        ..QpAttr::default()
    };
    let m = QpAttrMask::STATE;
    // RESET -> RTR is illegal; RESET -> ERR is illegal (kernel table).
    assert!(inval(e.modify_qp(0, q, &st(QpState::Rtr), m)));
    assert!(inval(e.modify_qp(0, q, &st(QpState::Err), m)));
    // RESET -> INIT needs PKEY_INDEX | PORT | ACCESS_FLAGS for RC ...
    assert!(inval(e.modify_qp(
        0,
        q,
        &st(QpState::Init),
        m | QpAttrMask::PORT
    )));
    // ... and refuses a Q_Key (UD only).
    let init = m | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    assert!(inval(e.modify_qp(
        0,
        q,
        &st(QpState::Init),
        init | QpAttrMask::QKEY
    )));
    // Bad values are EINVAL too.
    assert!(inval(e.modify_qp(
        0,
        q,
        &QpAttr {
            port_num: 2,
            ..st(QpState::Init)
        },
        init
    )));
    // post_recv in RESET, post_send in INIT: EINVAL.
    assert!(matches!(
        e.post_recv(q, RecvWr::default()),
        Err(TransportError::InvalidArgument(_))
    ));
    e.modify_qp(0, q, &st(QpState::Init), init).unwrap();
    assert_eq!(e.query_qp(q).unwrap().0.qp_state, QpState::Init);
    assert!(matches!(
        e.post_send(0, q, SendWr::default()),
        Err(TransportError::InvalidArgument(_))
    ));
    e.post_recv(q, RecvWr::default()).unwrap();
    // INIT -> INIT with optional attributes is fine; INIT -> RTS is not.
    e.modify_qp(0, q, &st(QpState::Init), m | QpAttrMask::ACCESS_FLAGS)
        .unwrap();
    assert!(inval(e.modify_qp(0, q, &st(QpState::Rts), m)));
    // INIT -> RTR without MIN_RNR_TIMER is refused for RC.
    let mut rtr = st(QpState::Rtr);
    rtr.path_mtu = Mtu::M1024;
    rtr.ah_attr.dgid = Gid::from_ip("10.0.0.2".parse().unwrap());
    let rtr_m = m
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC;
    assert!(inval(e.modify_qp(0, q, &rtr, rtr_m)));
    // A GID index past the table is refused.
    let mut bad = rtr;
    bad.ah_attr.sgid_index = 3;
    assert!(inval(e.modify_qp(
        0,
        q,
        &bad,
        rtr_m | QpAttrMask::MIN_RNR_TIMER
    )));
    e.modify_qp(0, q, &rtr, rtr_m | QpAttrMask::MIN_RNR_TIMER)
        .unwrap();
    assert!(matches!(
        e.post_send(0, q, SendWr::default()),
        Err(TransportError::InvalidArgument(_))
    ));
    // RTR -> RTS needs the full RC set.
    let rts_m = m
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::SQ_PSN;
    assert!(inval(e.modify_qp(0, q, &st(QpState::Rts), rts_m)));
    e.modify_qp(
        0,
        q,
        &st(QpState::Rts),
        rts_m | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
    // CUR_STATE must name the real state.
    let mut cs = st(QpState::Rts);
    cs.cur_qp_state = QpState::Rtr;
    assert!(inval(e.modify_qp(0, q, &cs, m | QpAttrMask::CUR_STATE)));
    // RTS -> SQD -> RTS; RTS -> RTR illegal; SQE is not reachable for RC from SQD.
    assert!(inval(e.modify_qp(0, q, &st(QpState::Rtr), m)));
    e.modify_qp(0, q, &st(QpState::Sqd), m).unwrap();
    assert_eq!(e.query_qp(q).unwrap().0.qp_state, QpState::Sqd);
    assert!(inval(e.modify_qp(0, q, &st(QpState::Sqe), m)));
    e.modify_qp(0, q, &st(QpState::Rts), m).unwrap();
    // Any state -> ERR -> RESET -> INIT.
    e.modify_qp(0, q, &st(QpState::Err), m).unwrap();
    assert!(inval(e.modify_qp(0, q, &st(QpState::Rts), m)));
    e.modify_qp(0, q, &st(QpState::Reset), m).unwrap();
    e.modify_qp(0, q, &st(QpState::Init), init).unwrap();
    // The receive posted earlier was flushed by ERR.
    let c = e.poll_completion().unwrap().1;
    assert_eq!(c.status, WcStatus::WrFlushErr);
    // UD: RESET -> INIT needs a Q_Key.
    let u = create(&mut net, 0, QpType::Ud, &o, None);
    let e = &mut net.nodes[0].engine;
    assert!(inval(e.modify_qp(
        0,
        u,
        &st(QpState::Init),
        m | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT
    )));
    e.modify_qp(
        0,
        u,
        &st(QpState::Init),
        m | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    e.modify_qp(0, u, &st(QpState::Rtr), m).unwrap();
    e.modify_qp(0, u, &st(QpState::Rts), m | QpAttrMask::SQ_PSN)
        .unwrap();
}

#[test]
fn flush_on_err() {
    let mut net = SimNet::new(6, 2, Mtu::M1024);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 100, full_access());
    net.filter = Some(Box::new(|_, _| true)); // nothing is ever answered
    for id in 1..=3 {
        net.nodes[0]
            .engine
            .post_send(0, a, send_wr(id, WrOpcode::Send, la.sges(0, 10)))
            .unwrap();
    }
    for id in 10..=11 {
        net.nodes[0]
            .engine
            .post_recv(a, recv_wr(id, la.sges(0, 100)))
            .unwrap();
    }
    net.step();
    let st = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    net.nodes[0]
        .engine
        .modify_qp(net.now, a, &st, QpAttrMask::STATE)
        .unwrap();
    // Posting in ERR completes at once with a flush error.
    net.nodes[0]
        .engine
        .post_send(0, a, send_wr(4, WrOpcode::Send, la.sges(0, 10)))
        .unwrap();
    net.nodes[0]
        .engine
        .post_recv(a, recv_wr(12, la.sges(0, 100)))
        .unwrap();
    let c = net.take_completions(0);
    let mut ids: Vec<_> = c.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect();
    ids.sort_by_key(|x| x.0);
    assert_eq!(
        ids,
        vec![
            (1, WcStatus::WrFlushErr, WcOpcode::Send),
            (2, WcStatus::WrFlushErr, WcOpcode::Send),
            (3, WcStatus::WrFlushErr, WcOpcode::Send),
            (4, WcStatus::WrFlushErr, WcOpcode::Send),
            (10, WcStatus::WrFlushErr, WcOpcode::Recv),
            (11, WcStatus::WrFlushErr, WcOpcode::Recv),
            (12, WcStatus::WrFlushErr, WcOpcode::Recv),
        ]
    );
}

/// Log of (node, opcode) for every packet on the wire.
fn log_opcodes(net: &mut SimNet) -> Rc<RefCell<Vec<(usize, u8)>>> {
    let log = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    net.filter = Some(Box::new(move |from, pkt| {
        l.borrow_mut().push((from, pkt[0]));
        false
    }));
    log
}

fn read_then_send(fence: bool, max_rd_atomic: u8, second_read: bool) -> Vec<(usize, u8)> {
    let mut net = SimNet::new(7, 2, Mtu::M1024);
    let o = RcOpts {
        max_rd_atomic,
        ..RcOpts::default()
    };
    let (a, b) = pair(&mut net, QpType::Rc, &o);
    let la = net.reg(0, 8192, full_access());
    let rb = net.reg(1, 8192, full_access());
    net.nodes[1]
        .engine
        .post_recv(b, recv_wr(1, rb.sges(0, 100)))
        .unwrap();
    let log = log_opcodes(&mut net);
    let mut r = send_wr(1, WrOpcode::RdmaRead, la.sges(0, 4000));
    r.remote_addr = rb.addr;
    r.rkey = rb.rkey;
    net.nodes[0].engine.post_send(0, a, r.clone()).unwrap();
    let mut s = if second_read {
        r.wr_id = 2;
        r
    } else {
        send_wr(2, WrOpcode::Send, la.sges(0, 10))
    };
    if fence {
        s.flags |= SendFlags::FENCE;
    }
    net.nodes[0].engine.post_send(0, a, s).unwrap();
    net.run(1_000_000_000);
    let c = net.take_completions(0);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let v = log.borrow().clone();
    v
}

fn pos(log: &[(usize, u8)], node: usize, op: u8, nth: usize) -> usize {
    log.iter()
        .enumerate()
        .filter(|(_, e)| **e == (node, op))
        .nth(nth)
        .map(|(i, _)| i)
        .expect("opcode in log")
}

#[test]
fn fence_waits_for_outstanding_read() {
    let plain = read_then_send(false, 16, false);
    let fenced = read_then_send(true, 16, false);
    // Without a fence the SEND leaves right behind the READ request; with one it waits
    // for the last READ response.
    assert!(pos(&plain, 0, 0x04, 0) < pos(&plain, 1, 0x0f, 0));
    assert!(pos(&fenced, 0, 0x04, 0) > pos(&fenced, 1, 0x0f, 0));
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let two = read_then_send(false, 2, true);
    let one = read_then_send(false, 1, true);
    assert!(pos(&two, 0, 0x0c, 1) < pos(&two, 1, 0x0f, 0));
    assert!(pos(&one, 0, 0x0c, 1) > pos(&one, 1, 0x0f, 0));
}

#[test]
fn unsignaled_completions() {
    let mut net = SimNet::new(8, 2, Mtu::M1024);
    let (a, _b) = pair(&mut net, QpType::Rc, &RcOpts::default());
    let la = net.reg(0, 100, full_access());
    let rb = net.reg(1, 100, full_access());
    for id in 1..=4 {
        let mut w = send_wr(id, WrOpcode::RdmaWrite, la.sges(0, 50));
        w.remote_addr = rb.addr;
        w.rkey = rb.rkey;
        if id != 3 {
            w.flags = SendFlags::empty();
        }
        net.nodes[0].engine.post_send(0, a, w).unwrap();
    }
    net.run(1_000_000_000);
    let s = net.take_completions(0);
    assert_eq!(s.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![3]);
    // With sq_sig_all every WR completes.
    let mut net = SimNet::new(9, 2, Mtu::M1024);
    let (a, _b) = pair(
        &mut net,
        QpType::Rc,
        &RcOpts {
            sq_sig_all: true,
            ..RcOpts::default()
        },
    );
    let la = net.reg(0, 100, full_access());
    let rb = net.reg(1, 100, full_access());
    for id in 1..=2 {
        let mut w = send_wr(id, WrOpcode::RdmaWrite, la.sges(0, 50));
        w.remote_addr = rb.addr;
        w.rkey = rb.rkey;
        w.flags = SendFlags::empty();
        net.nodes[0].engine.post_send(0, a, w).unwrap();
    }
    net.run(1_000_000_000);
    assert_eq!(
        net.take_completions(0)
            .iter()
            .map(|c| c.wr_id)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[test]
fn send_queue_full_is_enomem() {
    let mut net = SimNet::new(10, 2, Mtu::M1024);
    let o = RcOpts {
        max_send_wr: 2,
        ..RcOpts::default()
    };
    let (a, _b) = pair(&mut net, QpType::Rc, &o);
    net.filter = Some(Box::new(|_, _| true));
    let e = &mut net.nodes[0].engine;
    e.post_send(0, a, send_wr(1, WrOpcode::Send, Default::default()))
        .unwrap();
    e.post_send(0, a, send_wr(2, WrOpcode::Send, Default::default()))
        .unwrap();
    assert_eq!(
        e.post_send(0, a, send_wr(3, WrOpcode::Send, Default::default())),
        Err(TransportError::NoMemory)
    );
    assert_eq!(TransportError::NoMemory.errno(), 12);
}
