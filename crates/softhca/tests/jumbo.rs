//! Two softhca devices on loopback agree on packets of 16 KiB (`Config::jumbo`, offered
//! in multipath's negotiation as far as the interface MTU allows): a 1 MiB WRITE and
//! READ then take a quarter of the packets 4 KiB ones would, and every byte arrives; a
//! device that offers none keeps both ends at 4096. UC QPs agree the same way (a camera
//! streaming frames by UC WRITE sends a quarter of the packets).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use softhca::*;

const LEN: usize = 1 << 20;

fn open_offering(addr: &str, jumbo: u64) -> Arc<Context> {
    let mut cfg = Config::loopback(ip(addr));
    cfg.poll = Config::from_env().unwrap().poll;
    cfg.jumbo = jumbo;
    Context::open(&cfg).unwrap()
}

/// The QP's multipath figures once its negotiation has ended.
fn negotiated(ctx: &Context) -> MpStats {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some((_, s)) = ctx.multipath().into_iter().next() {
            if s.state == MpState::On {
                return s;
            }
        }
        assert!(
            Instant::now() < until,
            "no negotiation: {:?}",
            ctx.multipath()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A 1 MiB WRITE from `a` to `b` and a READ of it back into `a`'s second half, both
/// checked; the packets `a` and `b` sent meanwhile.
fn write_then_read(a: &Side, b: &Side) -> (u64, u64) {
    let data = pattern(LEN, 0x6b);
    a.mr.write(0, &data).unwrap();
    let before = (counter(&a.ctx, "sent_pkts"), counter(&b.ctx, "sent_pkts"));
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, a.mr.sge(0, LEN as u32));
    wr.remote_addr = b.mr.addr();
    wr.rkey = b.mr.rkey();
    a.qp.post_send(wr).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let mut rd = send_wr(2, WrOpcode::RdmaRead, a.mr.sge(LEN, LEN as u32));
    rd.remote_addr = b.mr.addr();
    rd.rkey = b.mr.rkey();
    a.qp.post_send(rd).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let mut back = vec![0u8; LEN];
    a.mr.read(LEN, &mut back).unwrap();
    assert!(back == data, "1 MiB written and read back intact");
    (
        counter(&a.ctx, "sent_pkts") - before.0,
        counter(&b.ctx, "sent_pkts") - before.1,
    )
}

#[test]
fn loopback_devices_agree_on_16_kib_packets() {
    let a = side(
        open_offering("127.0.1.95", DEFAULT_JUMBO),
        QpType::Rc,
        2 * LEN,
    );
    let b = side(
        open_offering("127.0.1.96", DEFAULT_JUMBO),
        QpType::Rc,
        2 * LEN,
    );
    connect(&a, &b);
    for ctx in [&a.ctx, &b.ctx] {
        assert_eq!(negotiated(ctx).packet_bytes, 16384);
    }
    let (from_a, from_b) = write_then_read(&a, &b);
    // 64 WRITE packets and the READ request (plus ACK requests' ACKs); 64 responses.
    assert!(
        (65..128).contains(&from_a),
        "{from_a} packets from the writer"
    );
    assert!(
        (64..128).contains(&from_b),
        "{from_b} packets from the responder"
    );
}

#[test]
fn a_device_that_offers_none_keeps_4_kib_packets() {
    let a = side(
        open_offering("127.0.1.97", DEFAULT_JUMBO),
        QpType::Rc,
        2 * LEN,
    );
    let b = side(open_offering("127.0.1.98", 0), QpType::Rc, 2 * LEN);
    connect(&a, &b);
    for ctx in [&a.ctx, &b.ctx] {
        assert_eq!(negotiated(ctx).packet_bytes, 0);
    }
    let (from_a, from_b) = write_then_read(&a, &b);
    assert!(from_a >= 257, "{from_a} packets from the writer");
    assert!(from_b >= 256, "{from_b} packets from the responder");
}

#[test]
fn uc_qps_agree_on_16_kib_packets_too() {
    let a = side(open_offering("127.0.1.99", DEFAULT_JUMBO), QpType::Uc, LEN);
    let b = side(open_offering("127.0.1.100", DEFAULT_JUMBO), QpType::Uc, LEN);
    connect(&a, &b);
    for ctx in [&a.ctx, &b.ctx] {
        let s = negotiated(ctx);
        assert_eq!(s.packet_bytes, 16384);
        // UC has no acknowledgements to judge paths by: no path table, its one path.
        assert!(s.paths.is_empty(), "{s}");
    }
    let data = pattern(LEN, 0x2d);
    a.mr.write(0, &data).unwrap();
    b.qp.post_recv(recv_wr(7, b.mr.sge(0, 0))).unwrap();
    let before = counter(&a.ctx, "sent_pkts");
    let mut wr = send_wr(1, WrOpcode::RdmaWriteWithImm, a.mr.sge(0, LEN as u32));
    wr.remote_addr = b.mr.addr();
    wr.rkey = b.mr.rkey();
    wr.imm_data = 0x5eed;
    a.qp.post_send(wr).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let c = one(&b.cq);
    assert_eq!(
        (c.status, c.wr_id, c.imm_data),
        (WcStatus::Success, 7, 0x5eed)
    );
    assert_eq!(c.byte_len, LEN as u32);
    assert!(b.mr.to_vec() == data, "1 MiB written intact");
    // A quarter of the 256 packets of 4 KiB.
    assert_eq!(counter(&a.ctx, "sent_pkts") - before, 64);
}
