//! `Qp::connect_rc_with` and its two halves: what they set, in which state they leave a
//! QP, and that a QP brought up in two steps carries traffic.

mod common;

use common::*;
use softhca::*;

fn remote_of(s: &Side, psn: u32) -> RemoteQp {
    RemoteQp {
        qpn: s.qp.qpn(),
        psn,
        gid: s.ctx.gids()[0],
    }
}

#[test]
fn options_reach_the_qp_attributes() {
    let a = side(open("127.0.4.41"), QpType::Rc, 4096);
    let b = side(open("127.0.4.42"), QpType::Rc, 4096);
    let opts = ConnectOptions {
        timeout: 12,
        retry_cnt: 3,
        rnr_retry: 5,
        min_rnr_timer: 9,
        rd_atomic: 8,
        access: Some(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ),
    };
    a.qp.connect_rc_with(0x111, &remote_of(&b, 0x222), Mtu::M1024, 0, &opts)
        .unwrap();
    let (attr, _) = a.qp.query().unwrap();
    assert_eq!(attr.qp_state, QpState::Rts);
    assert_eq!(
        (
            attr.timeout,
            attr.retry_cnt,
            attr.rnr_retry,
            attr.min_rnr_timer
        ),
        (12, 3, 5, 9)
    );
    assert_eq!((attr.max_rd_atomic, attr.max_dest_rd_atomic), (8, 8));
    assert_eq!(
        attr.qp_access_flags,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ
    );
    assert_eq!((attr.sq_psn, attr.rq_psn), (0x111, 0x222));
    assert_eq!(attr.dest_qp_num, b.qp.qpn());

    // The defaults are `connect_rc`'s.
    b.qp.connect_rc(0x222, &remote_of(&a, 0x111), Mtu::M1024, 0)
        .unwrap();
    let (attr, _) = b.qp.query().unwrap();
    assert_eq!(
        (
            attr.timeout,
            attr.retry_cnt,
            attr.rnr_retry,
            attr.min_rnr_timer
        ),
        (
            defaults::TIMEOUT,
            defaults::RETRY_CNT,
            defaults::RNR_RETRY,
            defaults::MIN_RNR_TIMER
        )
    );
    assert_eq!(attr.max_rd_atomic, defaults::RD_ATOMIC);
    assert_eq!(attr.qp_access_flags, ALL_ACCESS);
}

#[test]
fn receives_posted_in_init_are_used_after_ready() {
    let a = side(open("127.0.4.43"), QpType::Rc, 4096);
    let b = side(open("127.0.4.44"), QpType::Rc, 4096);
    b.qp.init_rc(None).unwrap();
    assert_eq!(b.qp.state().unwrap(), QpState::Init);
    b.qp.post_recv(recv_wr(7, b.mr.sge(0, 64))).unwrap();
    let opts = ConnectOptions::default();
    b.qp.ready_rc(0x20, &remote_of(&a, 0x10), Mtu::M1024, 0, &opts)
        .unwrap();
    a.qp.connect_rc(0x10, &remote_of(&b, 0x20), Mtu::M1024, 0)
        .unwrap();

    a.mr.write(0, b"brought up in two steps").unwrap();
    a.qp.post_send(send_wr(1, WrOpcode::Send, a.mr.sge(0, 23)))
        .unwrap();
    let wc = one(&b.cq);
    assert_eq!(
        (wc.status, wc.wr_id, wc.byte_len),
        (WcStatus::Success, 7, 23)
    );
    let mut got = [0u8; 23];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"brought up in two steps");
}

#[test]
fn ud_qp_is_refused() {
    let a = side(open("127.0.4.45"), QpType::Ud, 4096);
    assert!(matches!(a.qp.init_rc(None), Err(Error::InvalidArgument(_))));
    assert_eq!(a.qp.state().unwrap(), QpState::Reset);
}
