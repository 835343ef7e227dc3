//! UD multicast (`ibv_attach_mcast`): a send to a group reaches every QP attached to it,
//! on every device of the host, as rxe delivers it (`rxe_rcv_mcast_pkt`).

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::*;
use softhca::*;

const QKEY: u32 = 0x0123_4567;

fn group(last: u8) -> Gid {
    Gid::from(Ipv4Addr::new(239, 77, 0, last))
}

/// A UD QP in RTS with `n` receives of 40 + 1024 bytes posted, slot i at i × 2048.
fn ud_receiver(ctx: std::sync::Arc<Context>, n: u64) -> Side {
    let s = side(ctx, QpType::Ud, 64 << 10);
    s.qp.ready_ud(QKEY, 0).unwrap();
    for i in 0..n {
        s.qp.post_recv(recv_wr(i, s.mr.sge(i as usize * 2048, 40 + 1024)))
            .unwrap();
    }
    s
}

/// Sends `msg` from `a` to the group (QPN 0xFFFFFF).
fn send_to_group(a: &Side, g: Gid, msg: &[u8], wr_id: u64) {
    a.mr.write(32 << 10, msg).unwrap();
    let ah =
        a.pd.create_ah(AddressVector {
            dgid: g,
            sgid_index: 0,
            ..AddressVector::default()
        })
        .unwrap();
    let mut wr = send_wr(
        wr_id,
        WrOpcode::SendWithImm,
        a.mr.sge(32 << 10, msg.len() as u32),
    );
    wr.imm_data = 0x5eed;
    wr.ud = Some(ah.ud_dest(0x00ff_ffff, QKEY));
    a.qp.post_send(wr).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
}

/// The message in receive slot `slot` of `s`, after its completion `c`.
fn received(s: &Side, c: &Completion, len: usize) -> Vec<u8> {
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(c.byte_len as usize, 40 + len);
    assert!(c.wc_flags.contains(WcFlags::GRH));
    assert_eq!(c.imm_data, 0x5eed);
    let mut grh = [0u8; 40];
    s.mr.read(c.wr_id as usize * 2048, &mut grh).unwrap();
    assert_eq!(
        &grh[36..40],
        &[239, 77, 0, grh[39]],
        "GRH: the group's address"
    );
    let mut got = vec![0; len];
    s.mr.read(c.wr_id as usize * 2048 + 40, &mut got).unwrap();
    got
}

fn nothing_within(cq: &Cq, d: Duration) {
    let mut wc = [Completion::default(); 1];
    assert_eq!(cq.wait(&mut wc, d).unwrap(), 0, "unexpected completion");
}

#[test]
fn a_send_to_a_group_reaches_every_attached_qp_on_every_device() {
    let g = group(1);
    let a = ud_receiver(open("127.0.1.130"), 4);
    let b = ud_receiver(open("127.0.1.131"), 4);
    let b2 = ud_receiver(b.ctx.clone(), 4);
    let c = ud_receiver(open("127.0.1.132"), 4);
    for s in [&a, &b, &b2, &c] {
        s.qp.attach_mcast(g).unwrap();
        assert!(s.qp.in_mcast_group());
    }
    let msg = pattern(1000, 3);
    send_to_group(&a, g, &msg, 100);
    // Every attached QP gets its copy, the sender's own included (no loopback
    // blocking, as rxe).
    for s in [&a, &b, &b2, &c] {
        let wc = one(&s.cq);
        assert_eq!(wc.src_qp, a.qp.qpn());
        assert_eq!(received(s, &wc, msg.len()), msg);
    }
    // Detached, a QP gets nothing more; the others still do.
    c.qp.detach_mcast(g).unwrap();
    assert!(!c.qp.in_mcast_group());
    a.qp.detach_mcast(g).unwrap();
    let msg = pattern(700, 4);
    send_to_group(&a, g, &msg, 101);
    for s in [&b, &b2] {
        let wc = one(&s.cq);
        assert_eq!(received(s, &wc, msg.len()), msg);
    }
    nothing_within(&c.cq, Duration::from_millis(300));
    nothing_within(&a.cq, Duration::from_millis(1));
    // A wrong Q_Key is dropped by each QP, as rxe's check_keys.
    let ah =
        a.pd.create_ah(AddressVector {
            dgid: g,
            ..AddressVector::default()
        })
        .unwrap();
    let mut wr = send_wr(102, WrOpcode::Send, a.mr.sge(0, 8));
    wr.ud = Some(ah.ud_dest(0x00ff_ffff, QKEY + 1));
    a.qp.post_send(wr).unwrap();
    one(&a.cq);
    nothing_within(&b.cq, Duration::from_millis(300));
    assert!(counter(&b.ctx, "drop_bad_qkey") >= 2);
}

#[test]
fn attach_and_detach_errors_are_the_kernels() {
    let rc = side(open("127.0.1.133"), QpType::Rc, 4096);
    let err = |r: Result<(), Error>| r.unwrap_err().errno();
    assert_eq!(err(rc.qp.attach_mcast(group(2))), libc::EINVAL, "RC QP");
    let ud = ud_receiver(rc.ctx.clone(), 1);
    let unicast = Gid::from(Ipv4Addr::new(10, 1, 2, 3));
    assert_eq!(
        err(ud.qp.attach_mcast(unicast)),
        libc::EINVAL,
        "unicast GID"
    );
    assert_eq!(
        err(ud.qp.detach_mcast(group(2))),
        libc::EINVAL,
        "not attached"
    );
    ud.qp.attach_mcast(group(2)).unwrap();
    ud.qp.attach_mcast(group(2)).unwrap();
    ud.qp.detach_mcast(group(2)).unwrap();
    assert_eq!(
        err(ud.qp.detach_mcast(group(2))),
        libc::EINVAL,
        "detached once"
    );
    assert_eq!(rc.ctx.query_device().max_mcast_grp, 8192);
    assert_eq!(rc.ctx.query_device().max_mcast_qp_attach, 56);
}

/// A QP dropped while attached leaves its group; a new QP attaching again gets the
/// group's traffic (its socket was closed and is opened again).
#[test]
fn a_dropped_qp_leaves_its_group() {
    let g = group(3);
    let a = ud_receiver(open("127.0.1.134"), 1);
    let b = ud_receiver(open("127.0.1.135"), 1);
    b.qp.attach_mcast(g).unwrap();
    drop(b);
    let b = ud_receiver(open("127.0.1.135"), 2);
    b.qp.attach_mcast(g).unwrap();
    let msg = pattern(64, 5);
    send_to_group(&a, g, &msg, 1);
    let wc = one(&b.cq);
    assert_eq!(received(&b, &wc, msg.len()), msg);
}
