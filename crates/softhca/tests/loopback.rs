//! Two devices over real loopback UDP: every verb end to end. Each test uses its own pair
//! of 127.0.1.x addresses so tests run in parallel (and beside other test binaries).

mod common;

use std::time::Duration;

use common::*;
use softhca::*;

#[test]
fn rc_send_recv_with_imm() {
    let (a, b) = rc_pair("127.0.1.1", "127.0.1.2", 1 << 16);
    let msg = pattern(3000, 7);
    a.mr.write(0, &msg).unwrap();
    b.qp.post_recv(recv_wr(11, b.mr.sge(100, 4096))).unwrap();
    let mut wr = send_wr(22, WrOpcode::SendWithImm, a.mr.sge(0, msg.len() as u32));
    wr.imm_data = 0xdead_beef;
    a.qp.post_send(wr).unwrap();

    let rc = one(&b.cq);
    assert_eq!(rc.status, WcStatus::Success);
    assert_eq!(rc.wr_id, 11);
    assert_eq!(rc.opcode, WcOpcode::Recv);
    assert_eq!(rc.byte_len, 3000);
    assert!(rc.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(rc.imm_data, 0xdead_beef);
    assert_eq!(rc.qp_num, b.qp.qpn());
    let mut got = vec![0; msg.len()];
    b.mr.read(100, &mut got).unwrap();
    assert_eq!(got, msg);

    let sc = one(&a.cq);
    assert_eq!(
        (sc.status, sc.wr_id, sc.opcode),
        (WcStatus::Success, 22, WcOpcode::Send)
    );

    // And back, several times, with inline payloads.
    for i in 0..20u64 {
        a.qp.post_recv(recv_wr(100 + i, a.mr.sge(8192, 64)))
            .unwrap();
        let data = smallvec::SmallVec::from_slice(&i.to_le_bytes());
        b.qp.post_send(SendWr {
            wr_id: 200 + i,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            payload: Payload::Inline(data),
            ..SendWr::default()
        })
        .unwrap();
        let r = one(&a.cq);
        assert_eq!(
            (r.status, r.wr_id, r.byte_len),
            (WcStatus::Success, 100 + i, 8)
        );
        let mut v = [0u8; 8];
        a.mr.read(8192, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), i);
        assert_eq!(one(&b.cq).wr_id, 200 + i);
    }
}

#[test]
fn rc_write_then_read_back() {
    let (a, b) = rc_pair("127.0.1.3", "127.0.1.4", 1 << 16);
    let data = pattern(20_000, 3);
    a.mr.write(0, &data).unwrap();
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, a.mr.sge(0, data.len() as u32));
    wr.remote_addr = b.mr.addr() + 512;
    wr.rkey = b.mr.rkey();
    a.qp.post_send(wr).unwrap();
    let c = one(&a.cq);
    assert_eq!(
        (c.status, c.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut got = vec![0; data.len()];
    b.mr.read(512, &mut got).unwrap();
    assert_eq!(got, data, "WRITE placed the bytes");

    let mut rd = send_wr(2, WrOpcode::RdmaRead, a.mr.sge(30_000, data.len() as u32));
    rd.remote_addr = b.mr.addr() + 512;
    rd.rkey = b.mr.rkey();
    a.qp.post_send(rd).unwrap();
    let c = one(&a.cq);
    assert_eq!(
        (c.status, c.opcode, c.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 20_000)
    );
    a.mr.read(30_000, &mut got).unwrap();
    assert_eq!(got, data, "READ brought the same bytes back");
}

#[test]
fn rc_atomics() {
    let (a, b) = rc_pair("127.0.1.5", "127.0.1.6", 4096);
    b.mr.write(64, &40u64.to_ne_bytes()).unwrap();
    let mut faa = send_wr(1, WrOpcode::AtomicFetchAndAdd, a.mr.sge(0, 8));
    faa.remote_addr = b.mr.addr() + 64;
    faa.rkey = b.mr.rkey();
    faa.compare_add = 2;
    a.qp.post_send(faa).unwrap();
    let c = one(&a.cq);
    assert_eq!(
        (c.status, c.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    let mut v = [0u8; 8];
    a.mr.read(0, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 40, "FAA returns the old value");
    b.mr.read(64, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 42);

    let mut cas = send_wr(2, WrOpcode::AtomicCmpAndSwp, a.mr.sge(8, 8));
    cas.remote_addr = b.mr.addr() + 64;
    cas.rkey = b.mr.rkey();
    cas.compare_add = 42;
    cas.swap = 7;
    a.qp.post_send(cas).unwrap();
    let c = one(&a.cq);
    assert_eq!(
        (c.status, c.opcode),
        (WcStatus::Success, WcOpcode::CompSwap)
    );
    a.mr.read(8, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 42);
    b.mr.read(64, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 7, "CAS swapped");
}

#[test]
fn ud_send_with_grh() {
    let a = side(open("127.0.1.7"), QpType::Ud, 8192);
    let b = side(open("127.0.1.8"), QpType::Ud, 8192);
    let qkey = 0x1111_2222;
    a.qp.ready_ud(qkey, 0).unwrap();
    b.qp.ready_ud(qkey, 0).unwrap();
    let msg = pattern(1000, 9);
    a.mr.write(0, &msg).unwrap();
    b.qp.post_recv(recv_wr(5, b.mr.sge(0, 40 + 2048))).unwrap();
    let ah =
        a.pd.create_ah(AddressVector {
            dgid: b.ctx.gids()[0],
            sgid_index: 0,
            traffic_class: 0x68,
            ..AddressVector::default()
        })
        .unwrap();
    let mut wr = send_wr(6, WrOpcode::Send, a.mr.sge(0, msg.len() as u32));
    wr.ud = Some(ah.ud_dest(b.qp.qpn(), qkey));
    a.qp.post_send(wr).unwrap();
    let c = one(&b.cq);
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(c.byte_len, 40 + 1000, "UD receives count the 40-byte GRH");
    assert!(c.wc_flags.contains(WcFlags::GRH));
    assert_eq!(c.src_qp, a.qp.qpn());
    let mut got = vec![0; msg.len()];
    b.mr.read(40, &mut got).unwrap();
    assert_eq!(got, msg);
    // RoCEv2 over IPv4 (as rxe): the IPv4 header sits in the last 20 bytes of the GRH.
    let mut grh = [0u8; 40];
    b.mr.read(0, &mut grh).unwrap();
    assert_eq!(grh[20] >> 4, 4, "IPv4 header version");
    // The AH's traffic class went on the wire as the TOS, and came back in the GRH.
    assert_eq!(grh[21], 0x68, "TOS");
    assert_eq!(&grh[32..36], &[127, 0, 1, 7], "source address");
    assert_eq!(&grh[36..40], &[127, 0, 1, 8], "destination address");
    assert_eq!(one(&a.cq).wr_id, 6);
}

/// 64 MiB in one RDMA WRITE, verified byte for byte (~6 s in a debug build).
#[test]
fn write_64_mib() {
    const LEN: usize = 64 << 20;
    let (a, b) = rc_pair("127.0.1.9", "127.0.1.10", LEN);
    let data = pattern(LEN, 0x5a);
    a.mr.write(0, &data).unwrap();
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, a.mr.sge(0, LEN as u32));
    wr.remote_addr = b.mr.addr();
    wr.rkey = b.mr.rkey();
    let t = std::time::Instant::now();
    a.qp.post_send(wr).unwrap();
    let mut wc = [Completion::default(); 1];
    assert_eq!(a.cq.wait(&mut wc, Duration::from_secs(60)).unwrap(), 1);
    let el = t.elapsed();
    assert_eq!(wc[0].status, WcStatus::Success);
    eprintln!(
        "64 MiB WRITE: {:?} = {:.2} Gb/s",
        el,
        (LEN * 8) as f64 / el.as_secs_f64() / 1e9
    );
    assert!(b.mr.to_vec() == data, "64 MiB arrived intact");
}

#[test]
fn completion_channel_fd_becomes_readable() {
    let a = side(open("127.0.1.11"), QpType::Rc, 4096);
    let ctx_b = open("127.0.1.12");
    let ch = ctx_b.create_comp_channel().unwrap();
    let pd = ctx_b.alloc_pd().unwrap();
    let cq = ctx_b.create_cq(64, Some(&ch)).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let b = Side {
        ctx: ctx_b,
        pd,
        cq,
        qp,
        mr,
    };
    connect(&a, &b);

    let readable = |ms: i32| {
        let mut p = libc::pollfd {
            fd: ch.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    };
    b.cq.req_notify(false).unwrap();
    assert!(!readable(0), "nothing yet");
    b.qp.post_recv(recv_wr(1, b.mr.sge(0, 64))).unwrap();
    a.qp.post_send(send_wr(2, WrOpcode::Send, a.mr.sge(0, 16)))
        .unwrap();
    assert!(
        readable(5000),
        "fd readable after a completion on an armed CQ"
    );
    assert_eq!(ch.get_event(Some(Duration::ZERO)).unwrap(), Some(b.cq.id()));
    ch.ack_events(1);
    assert_eq!(ch.unacked_events(), 0);
    assert!(!readable(0), "one event, taken");
    assert_eq!(one(&b.cq).wr_id, 1);

    // Not re-armed: a second completion does not fire.
    b.qp.post_recv(recv_wr(3, b.mr.sge(0, 64))).unwrap();
    a.qp.post_send(send_wr(4, WrOpcode::Send, a.mr.sge(0, 16)))
        .unwrap();
    assert_eq!(one(&b.cq).wr_id, 3);
    assert!(!readable(50), "disarmed after firing");
    assert_eq!(ch.get_event(Some(Duration::from_millis(10))).unwrap(), None);
}

#[test]
fn dropped_mr_gives_error_completions_not_a_crash() {
    let (a, b) = rc_pair("127.0.1.13", "127.0.1.14", 4096);
    // A receive names an MR that is then dropped: the incoming SEND cannot be placed.
    let doomed = b.pd.reg_mr(4096, ALL_ACCESS).unwrap();
    b.qp.post_recv(recv_wr(1, doomed.sge(0, 4096))).unwrap();
    let _rkey = doomed.rkey();
    let _raddr = doomed.addr();
    drop(doomed);
    a.qp.post_send(send_wr(2, WrOpcode::Send, a.mr.sge(0, 128)))
        .unwrap();
    let rc = one(&b.cq);
    assert_eq!(rc.wr_id, 1);
    assert_eq!(rc.status, WcStatus::LocProtErr, "receive into a dropped MR");
    let sc = one(&a.cq);
    assert_ne!(
        sc.status,
        WcStatus::Success,
        "the sender learns it failed: {sc:?}"
    );
}

#[test]
fn write_to_dropped_mr_is_a_remote_access_error() {
    let (a, b) = rc_pair("127.0.1.15", "127.0.1.16", 4096);
    let doomed = b.pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let (rkey, raddr) = (doomed.rkey(), doomed.addr());
    drop(doomed);
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, a.mr.sge(0, 256));
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    a.qp.post_send(wr).unwrap();
    let c = one(&a.cq);
    assert_eq!(c.status, WcStatus::RemAccessErr);
    // A local MR dropped after a post: the gather fails locally (never a use-after-free).
    let (c2, d2) = rc_pair("127.0.1.17", "127.0.1.18", 4096);
    let local = c2.pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let sge = local.sge(0, 64);
    drop(local);
    d2.qp.post_recv(recv_wr(9, d2.mr.sge(0, 64))).unwrap();
    c2.qp.post_send(send_wr(3, WrOpcode::Send, sge)).unwrap();
    assert_eq!(one(&c2.cq).status, WcStatus::LocProtErr);
}

#[test]
fn srq_limit_raises_async_event() {
    let ca = open("127.0.1.19");
    let cb = open("127.0.1.20");
    let a = side(ca, QpType::Rc, 4096);
    let pd = cb.alloc_pd().unwrap();
    let cq = cb.create_cq(64, None).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.srq = Some(&srq);
    let qp = pd.create_qp(&init).unwrap();
    for i in 0..10 {
        srq.post_recv(recv_wr(i, mr.sge(64 * i as usize, 64)))
            .unwrap();
    }
    srq.modify(
        SrqAttr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: 8,
        },
        SRQ_LIMIT,
    )
    .unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 8);
    let b = Side {
        ctx: cb.clone(),
        pd,
        cq,
        qp,
        mr,
    };
    connect(&a, &b);
    assert!(cb.get_async_event(Some(Duration::ZERO)).is_none());
    for i in 0..3 {
        a.qp.post_send(send_wr(i, WrOpcode::Send, a.mr.sge(0, 32)))
            .unwrap();
        assert_eq!(one(&b.cq).status, WcStatus::Success);
    }
    let ev = cb.get_async_event(Some(Duration::from_secs(5)));
    assert_eq!(ev, Some(AsyncEvent::SrqLimitReached(srq.id())));
    let mut p = libc::pollfd {
        fd: cb.async_event_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    assert_eq!(
        unsafe { libc::poll(&mut p, 1, 0) },
        0,
        "queue drained, fd not readable"
    );
}

#[test]
fn cq_overflow_raises_cq_err() {
    let ca = open("127.0.1.21");
    let cb = open("127.0.1.22");
    let a = side(ca, QpType::Rc, 4096);
    let pd = cb.alloc_pd().unwrap();
    let cq = cb.create_cq(2, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    let mr = pd.reg_mr(4096, ALL_ACCESS).unwrap();
    let b = Side {
        ctx: cb.clone(),
        pd,
        cq,
        qp,
        mr,
    };
    connect(&a, &b);
    for i in 0..4 {
        b.qp.post_recv(recv_wr(i, b.mr.sge(0, 64))).unwrap();
    }
    // Two fit; the third receive completion is lost.
    for i in 0..2 {
        a.qp.post_send(send_wr(i, WrOpcode::Send, a.mr.sge(0, 8)))
            .unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
    }
    a.qp.post_send(send_wr(2, WrOpcode::Send, a.mr.sge(0, 8)))
        .unwrap();
    assert_eq!(
        cb.get_async_event(Some(Duration::from_secs(5))),
        Some(AsyncEvent::CqErr(b.cq.id()))
    );
    // The QP whose completion was lost is fatally broken (IBTA 11.6.3.1, as mlx5).
    assert_eq!(
        cb.get_async_event(Some(Duration::from_secs(5))),
        Some(AsyncEvent::QpFatal(Qpn::new(b.qp.qpn())))
    );
    assert_eq!(b.qp.query().unwrap().0.qp_state, QpState::Err);
    let mut wc = [Completion::default(); 8];
    assert_eq!(b.cq.poll(&mut wc), 2, "the ring kept what fit");
    // The third SEND was placed, but b went to ERR before acknowledging it (like a HCA
    // whose CQ overran): a sees success if the ACK made it out first, otherwise its
    // retries run out (timeout 14, retry_cnt 7, backing off: about 3 s).
    let mut wc = [Completion::default(); 1];
    assert_eq!(a.cq.wait(&mut wc, Duration::from_secs(10)).unwrap(), 1);
    assert!(
        matches!(wc[0].status, WcStatus::Success | WcStatus::RetryExcErr),
        "{:?}",
        wc[0].status
    );
}

#[test]
fn device_and_port_attributes() {
    let ctx = open("127.0.1.23");
    assert_eq!(ctx.gids(), vec![Gid::from_ip(ip("127.0.1.23"))]);
    assert_eq!(ctx.query_gid(1, 0).unwrap(), Gid::from_ip(ip("127.0.1.23")));
    assert!(ctx.query_gid(1, 1).is_err());
    let port = ctx.query_port(1).unwrap();
    assert_eq!(
        (port.state, port.active_mtu, port.gid_tbl_len),
        (PortState::Active, Mtu::M4096, 1)
    );
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert!(ctx.query_port(2).is_err());
    let d = ctx.query_device();
    assert_eq!(d.phys_port_cnt, 1);
    assert_eq!(d.atomic_cap, AtomicCap::Hca);
    assert_eq!(ctx.gid_index_for(ip("127.0.0.1")), Some(0));
    assert!(ctx.counters().iter().any(|(n, _)| *n == "io_rx_datagrams"));
}

#[test]
fn explicit_address_errors_are_clear() {
    let e = Context::open(&Config::loopback(ip("10.123.45.67"))).unwrap_err();
    assert_eq!(
        e.to_string(),
        "address 10.123.45.67 is not assigned to any interface on this host"
    );
    assert_eq!(e.errno(), libc::EADDRNOTAVAIL);
    // Held by another socket (as by another process): a second open in this process
    // would share the device instead.
    let _held = std::net::UdpSocket::bind(("127.0.1.24", softhca::ROCE_UDP_PORT)).unwrap();
    let e = Context::open(&Config::loopback(ip("127.0.1.24"))).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRINUSE, "{e}");
}

/// Zero configuration on one host: the first device takes the interface addresses and
/// 127.0.0.1, the second (another name, as in another process) finds those in use and
/// takes the next loopback address; a QP on the second still reaches the first one's
/// GID 0 (an interface address if the host has one). Uses its own UDP port so it does
/// not meet other devices.
#[test]
fn zero_config_two_devices_on_one_host() {
    let cfg = Config {
        udp_port: 47_917,
        ..Config::default()
    };
    let server = Context::open(&cfg).unwrap();
    let client = Context::open(&Config {
        name: "softhca-other".into(),
        ..cfg.clone()
    })
    .unwrap();
    assert!(!server.same_device(&client));
    let (sa, ca) = (server.addrs(), client.addrs());
    assert!(
        sa.iter().all(|a| !ca.contains(a)),
        "no address served twice: {sa:?} {ca:?}"
    );
    assert!(ca.iter().any(|a| a.is_loopback()) && sa.iter().any(|a| a.is_loopback()));
    assert!(
        !sa[0].is_loopback() || sa.len() == 1,
        "interface addresses come first: {sa:?}"
    );

    let s = side(server.clone(), QpType::Rc, 4096);
    let c = side(client.clone(), QpType::Rc, 4096);
    let s_gid0 = server.gids()[0];
    let c_idx = client.gid_index_for(s_gid0.to_ip()).unwrap();
    let c_gid = client.gids()[usize::from(c_idx)];
    // The server answers from the GID it advertised (GID 0), as perftest's `-x 0` does:
    // each side's source GID must be the GID the other side targets.
    let s_idx = 0;
    let mtu = server.active_mtu().min(client.active_mtu());
    c.qp.connect_rc(
        5,
        &RemoteQp {
            qpn: s.qp.qpn(),
            psn: 6,
            gid: s_gid0,
        },
        mtu,
        c_idx,
    )
    .unwrap();
    s.qp.connect_rc(
        6,
        &RemoteQp {
            qpn: c.qp.qpn(),
            psn: 5,
            gid: c_gid,
        },
        mtu,
        s_idx,
    )
    .unwrap();
    s.qp.post_recv(recv_wr(1, s.mr.sge(0, 64))).unwrap();
    c.mr.write(0, b"hello over zero config").unwrap();
    c.qp.post_send(send_wr(2, WrOpcode::Send, c.mr.sge(0, 22)))
        .unwrap();
    let r = one(&s.cq);
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 22));
    let mut got = [0u8; 22];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello over zero config");
    assert_eq!(one(&c.cq).status, WcStatus::Success);
}

/// Fault injection (`Config::tx_drop_ppm`, `SOFTHCA_TX_DROP`): 2 % of the sender's
/// packets, GSO segments included, never reach the kernel; RC recovers every byte and
/// the drops are counted.
#[test]
fn injected_tx_drops_are_recovered_by_rc() {
    const LEN: usize = 16 << 20;
    let mut cfg = Config::loopback(ip("127.0.1.61"));
    cfg.tx_drop_ppm = 20_000;
    let sa = side(Context::open(&cfg).unwrap(), QpType::Rc, LEN);
    let sb = side(open("127.0.1.62"), QpType::Rc, LEN);
    connect(&sa, &sb);
    let data = pattern(LEN, 0x3c);
    sa.mr.write(0, &data).unwrap();
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, sa.mr.sge(0, LEN as u32));
    wr.remote_addr = sb.mr.addr();
    wr.rkey = sb.mr.rkey();
    sa.qp.post_send(wr).unwrap();
    let mut wc = [Completion::default(); 1];
    assert_eq!(sa.cq.wait(&mut wc, Duration::from_secs(60)).unwrap(), 1);
    assert_eq!(
        wc[0].status,
        WcStatus::Success,
        "sender {:?}, receiver {:?}",
        sa.ctx.counters(),
        sb.ctx.counters()
    );
    assert!(sb.mr.to_vec() == data, "16 MiB arrived intact");
    let c: std::collections::HashMap<_, _> = sa.ctx.counters().into_iter().collect();
    let (drops, sent) = (c["io_tx_injected_drops"], c["sent_pkts"]);
    // About 2 % of every packet sent, retransmissions included: 1024 of 16 KiB (4096 of
    // 4 KiB before the peers agreed on 16 KiB) and the go-back-N resends the drops cause
    // (how many depends on timing: 1500 to 3500 here).
    assert!(
        drops > 0 && drops * 1000 >= sent * 3 && drops * 100 <= sent * 6,
        "injected drops {drops} of {sent} packets"
    );
}

/// 5 % of each side's packets dropped (data, ACKs and SACKs alike), 1 MiB WRITEs with
/// many in flight: the selective repeat between two softhca devices recovers every
/// byte. Resends wait behind the receiver's socket buffer, longer than the round trips
/// measured before the loss; a hole the SACKs go on reporting meanwhile is resent again
/// without spending one of the QP's 7 retries (such a stream used to end in
/// RETRY_EXC_ERR).
#[test]
fn five_percent_loss_each_way_is_recovered() {
    const LEN: usize = 1 << 20;
    const N: usize = 48;
    let lossy = |addr: &str| {
        let mut cfg = Config::loopback(ip(addr));
        cfg.tx_drop_ppm = 50_000;
        Context::open(&cfg).unwrap()
    };
    let a = side(lossy("127.0.1.68"), QpType::Rc, N * LEN);
    let b = side(lossy("127.0.1.69"), QpType::Rc, N * LEN);
    connect(&a, &b);
    let data = pattern(N * LEN, 0x5a);
    a.mr.write(0, &data).unwrap();
    for i in 0..N {
        let mut wr = send_wr(i as u64, WrOpcode::RdmaWrite, a.mr.sge(i * LEN, LEN as u32));
        wr.remote_addr = b.mr.addr() + (i * LEN) as u64;
        wr.rkey = b.mr.rkey();
        a.qp.post_send(wr).unwrap();
    }
    let mut wc = [Completion::default(); 16];
    let mut done = 0;
    while done < N {
        let n = a.cq.wait(&mut wc, Duration::from_secs(60)).unwrap();
        assert!(n > 0, "{done} of {N} WRITEs completed");
        for c in &wc[..n] {
            assert_eq!(
                c.status,
                WcStatus::Success,
                "sender {:?}, receiver {:?}",
                a.ctx.counters(),
                b.ctx.counters()
            );
        }
        done += n;
    }
    assert!(b.mr.to_vec() == data, "48 MiB arrived intact");
    assert!(counter(&a.ctx, "io_tx_injected_drops") > 0);
    assert!(counter(&b.ctx, "io_tx_injected_drops") > 0);
}

/// Packets leave with their payload still in the source MR (zero-copy send). Dropping
/// that MR while a large WRITE from it is in flight must neither crash nor send bytes
/// read after the memory was freed: deregistration waits for the transmit in progress,
/// and what is left of the WR then fails with a local protection error (rxe
/// `copy_data`). Deregistration may also wait until every packet is out (the datapath
/// thread can take the transmit lock again and again meanwhile): then it succeeds.
#[test]
fn deregistering_the_source_mid_write_is_safe() {
    const LEN: usize = 32 << 20;
    let sa = side(open("127.0.1.63"), QpType::Rc, 4096);
    let sb = side(open("127.0.1.64"), QpType::Rc, LEN);
    connect(&sa, &sb);
    let src = sa.pd.reg_mr(LEN, ALL_ACCESS).unwrap();
    src.fill(0x5a);
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, src.sge(0, LEN as u32));
    wr.remote_addr = sb.mr.addr();
    wr.rkey = sb.mr.rkey();
    sa.qp.post_send(wr).unwrap();
    drop(src);
    let mut wc = [Completion::default(); 1];
    assert_eq!(sa.cq.wait(&mut wc, Duration::from_secs(30)).unwrap(), 1);
    let got = sb.mr.to_vec();
    match wc[0].status {
        WcStatus::LocProtErr => assert!(
            got.iter().all(|&b| b == 0 || b == 0x5a),
            "bytes that were never in the source arrived"
        ),
        WcStatus::Success => assert!(got.iter().all(|&b| b == 0x5a), "WRITE incomplete"),
        other => panic!("status {other:?}"),
    }
}

/// A device serving several addresses (as a default one does: every interface address
/// plus a loopback one) polls its sockets through one readiness check: traffic on its
/// second address, in both directions and in bulk, still flows, and a poll with all
/// sockets quiet costs one system call (not checked here: see the datapath).
#[test]
fn traffic_on_the_second_of_several_served_addresses() {
    let mut cfg = Config::loopback(ip("127.0.1.65"));
    cfg.addrs.push(ip("127.0.1.66"));
    let ctx_a = Context::open(&cfg).unwrap();
    assert_eq!(ctx_a.addrs().len(), 2);
    let sa = side(ctx_a, QpType::Rc, 1 << 20);
    let sb = side(open("127.0.1.67"), QpType::Rc, 1 << 20);
    connect_gids(&sa, 1, &sb, 0);
    let data = pattern(1 << 20, 0x77);
    sa.mr.write(0, &data).unwrap();
    // Bulk one way (WRITE), then a SEND back.
    let mut w = send_wr(1, WrOpcode::RdmaWrite, sa.mr.sge(0, 1 << 20));
    w.remote_addr = sb.mr.addr();
    w.rkey = sb.mr.rkey();
    sa.qp.post_send(w).unwrap();
    assert_eq!(one(&sa.cq).status, WcStatus::Success);
    assert!(sb.mr.to_vec() == data);
    sa.qp.post_recv(recv_wr(2, sa.mr.sge(0, 64))).unwrap();
    sb.qp
        .post_send(send_wr(3, WrOpcode::Send, sb.mr.sge(100, 64)))
        .unwrap();
    assert_eq!(one(&sb.cq).status, WcStatus::Success);
    let c = one(&sa.cq);
    assert_eq!((c.wr_id, c.status, c.byte_len), (2, WcStatus::Success, 64));
    let mut got = [0u8; 64];
    sa.mr.read(0, &mut got).unwrap();
    assert_eq!(&got[..], &data[100..164]);
}

/// A UC (or UD) send completes when its packets have been handed to the kernel, never
/// before. The payload leaves from registered memory (zero-copy), sealed with an ICRC
/// over those bytes, so a completion delivered ahead of the `sendmmsg` lets the
/// application rewrite a buffer the kernel has not copied yet: the receiver then drops
/// the packets for a bad ICRC (the `uc-write` camera stream lost its first frames so).
/// Here, as that camera does, four source buffers are rewritten with the next frame as
/// soon as their WRITE completes, while the datapath may still be sending.
#[test]
fn uc_send_completion_means_the_payload_has_left() {
    const FRAME: usize = 300 << 10;
    const BUFS: usize = 4;
    const FRAMES: usize = 64;
    // A busy-polling datapath thread does most of the sending (a post finds it in a
    // step and leaves the packets to it), as the camera's did: the completion then
    // reaches this thread while that one sends.
    let mut cfg = Config::loopback(ip("127.0.1.73"));
    cfg.poll = PollMode::Busy;
    let a = side(Context::open(&cfg).unwrap(), QpType::Uc, BUFS * FRAME);
    let b = side(open("127.0.1.74"), QpType::Uc, FRAMES * FRAME);
    connect(&a, &b);
    for f in 0..FRAMES {
        b.qp.post_recv(recv_wr(f as u64, b.mr.sge(0, 0))).unwrap();
    }
    let mut busy = [false; BUFS];
    let mut wc = [Completion::default(); 8];
    for f in 0..FRAMES {
        let k = f % BUFS;
        while busy[k] {
            let n = a.cq.poll(&mut wc);
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success);
                busy[c.wr_id as usize % BUFS] = false;
            }
        }
        a.mr.write(k * FRAME, &pattern(FRAME, f as u8)).unwrap();
        let mut wr = send_wr(
            f as u64,
            WrOpcode::RdmaWriteWithImm,
            a.mr.sge(k * FRAME, FRAME as u32),
        );
        wr.remote_addr = b.mr.addr() + (f * FRAME) as u64;
        wr.rkey = b.mr.rkey();
        wr.imm_data = f as u32;
        a.qp.post_send(wr).unwrap();
        busy[k] = true;
    }
    let bad_icrc = || {
        b.ctx
            .counters()
            .into_iter()
            .find(|(k, _)| *k == "drop_bad_icrc")
            .map_or(0, |(_, v)| v)
    };
    let mut got = 0;
    while got < FRAMES {
        let n = b.cq.wait(&mut wc, Duration::from_secs(5)).unwrap();
        assert!(
            n > 0,
            "{got} of {FRAMES} frames arrived; {} packets dropped for a bad ICRC",
            bad_icrc()
        );
        got += n;
    }
    assert_eq!(
        bad_icrc(),
        0,
        "packets changed between their ICRC and their send"
    );
    let mem = b.mr.to_vec();
    for f in 0..FRAMES {
        assert!(
            mem[f * FRAME..(f + 1) * FRAME] == pattern(FRAME, f as u8)[..],
            "frame {f}"
        );
    }
}

/// Small SENDs each way and their ACKs (through sockets connected to the peer, sealed for
/// their port and the IPv4 IDs Linux writes on them) interleaved with bulk WRITEs and
/// READs (through the device sockets, IDs per send): every byte arrives, no packet fails
/// its ICRC, and each side predicts the other's IDs from the first counted one on.
#[test]
fn small_transmits_leave_through_connected_sockets() {
    let (a, b) = rc_pair("127.0.1.75", "127.0.1.76", 1 << 20);
    let bulk = pattern(300_000, 9);
    a.mr.write(0, &bulk).unwrap();
    for round in 0..40u64 {
        // Ping-pong of 8-byte SENDs.
        b.qp.post_recv(recv_wr(round, b.mr.sge(900_000, 64)))
            .unwrap();
        a.qp.post_recv(recv_wr(round, a.mr.sge(900_000, 64)))
            .unwrap();
        let inline = |wr_id: u64, v: u64| SendWr {
            wr_id,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            payload: Payload::Inline(smallvec::SmallVec::from_slice(&v.to_le_bytes())),
            ..SendWr::default()
        };
        a.qp.post_send(inline(round, round)).unwrap();
        assert_eq!(one(&b.cq).status, WcStatus::Success);
        b.qp.post_send(inline(round, round * 3)).unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
        let sent = [one(&a.cq), one(&b.cq)];
        assert!(sent.iter().all(|c| c.status == WcStatus::Success));
        let mut v = [0u8; 8];
        b.mr.read(900_000, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), round);
        a.mr.read(900_000, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), round * 3);
        // Every fourth round, a bulk WRITE and a READ of part of it back.
        if round % 4 == 0 {
            let mut wr = send_wr(1000 + round, WrOpcode::RdmaWrite, a.mr.sge(0, 300_000));
            wr.remote_addr = b.mr.addr();
            wr.rkey = b.mr.rkey();
            a.qp.post_send(wr).unwrap();
            assert_eq!(one(&a.cq).status, WcStatus::Success);
            let mut rd = send_wr(2000 + round, WrOpcode::RdmaRead, a.mr.sge(400_000, 70_000));
            rd.remote_addr = b.mr.addr() + 1000;
            rd.rkey = b.mr.rkey();
            a.qp.post_send(rd).unwrap();
            assert_eq!(one(&a.cq).status, WcStatus::Success);
            let mut got = vec![0u8; 70_000];
            a.mr.read(400_000, &mut got).unwrap();
            assert_eq!(got, bulk[1000..71_000]);
        }
    }
    let mut got = vec![0u8; bulk.len()];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(got, bulk);
    for (side, ctx) in [("a", &a.ctx), ("b", &b.ctx)] {
        let all = ctx.counters();
        let c = |n: &str| counter(ctx, n);
        assert!(c("io_tx_connected") >= 40, "{side}: {all:?}");
        assert_eq!(c("io_tx_connected_opened"), 1, "{side}: {all:?}");
        assert_eq!(c("io_tx_connected_failed"), 0, "{side}: {all:?}");
        assert_eq!(c("drop_bad_icrc"), 0, "{side}: {all:?}");
        // First contact, and the first counted ID if the device socket spoke first.
        assert!(c("icrc_ipv4_id_resync") <= 2, "{side}: {all:?}");
        assert!(c("icrc_ipv4_id_mispredicted") <= 4, "{side}: {all:?}");
    }
}

/// `Config::connected_senders` off (`SOFTHCA_CONNECTED=0`): everything leaves through
/// the device socket, as before.
#[test]
fn connected_sockets_can_be_turned_off() {
    let mk = |addr: &str| {
        let mut cfg = Config::loopback(ip(addr));
        cfg.connected_senders = false;
        side(Context::open(&cfg).unwrap(), QpType::Rc, 4096)
    };
    let (a, b) = (mk("127.0.1.77"), mk("127.0.1.78"));
    connect(&a, &b);
    for i in 0..5 {
        b.qp.post_recv(recv_wr(i, b.mr.sge(0, 64))).unwrap();
        a.qp.post_send(send_wr(i, WrOpcode::Send, a.mr.sge(0, 8)))
            .unwrap();
        assert_eq!(one(&b.cq).status, WcStatus::Success);
        assert_eq!(one(&a.cq).status, WcStatus::Success);
    }
    for ctx in [&a.ctx, &b.ctx] {
        assert_eq!(counter(ctx, "io_tx_connected"), 0);
        assert_eq!(counter(ctx, "io_tx_connected_opened"), 0);
        assert!(counter(ctx, "io_tx_transmits") >= 5);
    }
}

/// An application posting 64 KiB WRITEs one WR per call while it polls (perftest's
/// ib_write_bw): the short last transmit of each post is filled by the next post's
/// packets, so messages leave in about one GSO send each (15 + 1 datagrams per
/// message before), and every byte arrives. The sharing lasts while the application's
/// polling window is open; on a loaded machine a descheduled poller lets the window
/// close and the datapath thread sends what was kept back, so the burst is tried up to
/// three times and the best one counts.
#[test]
fn single_wr_posts_share_gso_sends() {
    const LEN: usize = 64 << 10;
    const N: usize = 48;
    // WRITE Only packets of 4 KiB, 16 a message.
    let a = side(open_4k("127.0.1.91"), QpType::Rc, N * LEN);
    let b = side(open_4k("127.0.1.92"), QpType::Rc, N * LEN);
    connect(&a, &b);
    let mut best = u64::MAX;
    for attempt in 0..3u8 {
        let data = pattern(N * LEN, 0x3c ^ attempt);
        a.mr.write(0, &data).unwrap();
        let transmits = write_burst(&a, &b, LEN, N);
        assert!(b.mr.to_vec() == data, "every WRITE arrived intact");
        best = best.min(transmits);
        if best < (N + N / 2) as u64 {
            break;
        }
    }
    assert!(
        best < (N + N / 2) as u64,
        "{best} datagrams for {N} WRITEs of 64 KiB (2 each when nothing is kept back)"
    );
}

/// Posts `n` WRITEs of `len` bytes from `a`'s MR to the same place in `b`'s, one WR per
/// call, polling between them as ib_write_bw does, and waits for all; returns the
/// datagrams `a` sent.
fn write_burst(a: &Side, b: &Side, len: usize, n: usize) -> u64 {
    let sent = |s: &Side| counter(&s.ctx, "io_tx_transmits");
    let before = sent(a);
    let mut wc = [Completion::default(); 16];
    let mut done = 0;
    // A poll first: the application polls, so its posts may keep a transmit back.
    done += a.cq.poll(&mut wc);
    for i in 0..n {
        let mut wr = send_wr(i as u64, WrOpcode::RdmaWrite, a.mr.sge(i * len, len as u32));
        wr.remote_addr = b.mr.addr() + (i * len) as u64;
        wr.rkey = b.mr.rkey();
        a.qp.post_send(wr).unwrap();
        if i % 8 == 7 {
            done += a.cq.poll(&mut wc);
        }
    }
    let t = std::time::Instant::now();
    while done < n {
        let k = a.cq.poll(&mut wc);
        assert!(wc[..k].iter().all(|c| c.status == WcStatus::Success));
        done += k;
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{done} of {n} WRITEs completed"
        );
    }
    sent(a) - before
}

/// A second open of a device this process has gives a context on the same device (as a
/// second `ibv_open_device` of a card does): same GIDs, one QPN space, QPs of the two
/// contexts talk to each other; the device lives until the last context goes.
#[test]
fn second_open_shares_the_device() {
    let cfg = Config {
        udp_port: 47_919,
        ..Config::loopback(ip("127.0.3.1"))
    };
    let a = Context::open(&cfg).unwrap();
    let b = Context::open(&cfg).unwrap();
    assert!(a.same_device(&b));
    assert_eq!(a.gids(), b.gids());
    assert_ne!(a.async_event_fd(), b.async_event_fd());
    let sa = side(a.clone(), QpType::Rc, 4096);
    let sb = side(b.clone(), QpType::Rc, 4096);
    assert_ne!(sa.qp.qpn(), sb.qp.qpn());
    connect(&sa, &sb);
    let msg = pattern(3000, 9);
    sa.mr.write(0, &msg).unwrap();
    sb.qp.post_recv(recv_wr(1, sb.mr.sge(0, 4096))).unwrap();
    sa.qp
        .post_send(send_wr(2, WrOpcode::Send, sa.mr.sge(0, 3000)))
        .unwrap();
    assert_eq!(one(&sb.cq).status, WcStatus::Success);
    assert_eq!(one(&sa.cq).status, WcStatus::Success);
    let mut got = vec![0; 3000];
    sb.mr.read(0, &mut got).unwrap();
    assert_eq!(got, msg);
    drop((sa, sb));
    drop(a);
    // The device is still open through `b`: a third open shares it, no bind happens.
    let c = Context::open(&cfg).unwrap();
    assert!(c.same_device(&b));
}

/// The GSI QP: QP 1 of each device, UD with the GSI Q_Key, carries a 256-byte MAD from
/// one device's QP 1 to the other's (BTH DestQP 1, DETH SrcQP 1), as CM MADs travel.
#[test]
fn gsi_qp_is_qp_1_and_carries_mads() {
    const GSI_QKEY: u32 = 0x8001_0000;
    let gsi = |ctx: std::sync::Arc<Context>| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let qp = pd.create_gsi_qp(&QpInit::new(QpType::Ud, &cq)).unwrap();
        let mr = pd.reg_mr(8192, ALL_ACCESS).unwrap();
        Side {
            ctx,
            pd,
            cq,
            qp,
            mr,
        }
    };
    let a = gsi(open("127.0.1.61"));
    let b = gsi(open("127.0.1.62"));
    assert_eq!((a.qp.qpn(), b.qp.qpn()), (1, 1));
    // One per device.
    assert!(a.pd.create_gsi_qp(&QpInit::new(QpType::Ud, &a.cq)).is_err());
    // Other QPs never take QPN 1.
    let other = side(a.ctx.clone(), QpType::Ud, 64);
    assert!(other.qp.qpn() > 1);
    a.qp.ready_ud(GSI_QKEY, 0).unwrap();
    b.qp.ready_ud(GSI_QKEY, 0).unwrap();
    let mad = pattern(256, 3);
    a.mr.write(0, &mad).unwrap();
    b.qp.post_recv(recv_wr(1, b.mr.sge(0, 40 + 256))).unwrap();
    let ah = ah_to(&a.pd, &b.ctx);
    let mut wr = send_wr(2, WrOpcode::Send, a.mr.sge(0, 256));
    wr.ud = Some(ah.ud_dest(b.qp.qpn(), GSI_QKEY));
    a.qp.post_send(wr).unwrap();
    let c = one(&b.cq);
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!((c.byte_len, c.src_qp), (40 + 256, 1));
    let mut got = vec![0; 256];
    b.mr.read(40, &mut got).unwrap();
    assert_eq!(got, mad);
}

/// An RDMA READ of memory that its owner keeps writing meanwhile completes, every time:
/// the responder sends the bytes it read with an ICRC over those same bytes (rxe copies
/// and CRCs a response in one pass), so the requester sees torn data at worst, never a
/// packet whose ICRC fails because the bytes changed between the CRC and the send.
#[test]
fn rc_read_of_memory_written_meanwhile() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const LEN: usize = 256 << 10;
    let (a, b) = rc_pair("127.0.1.120", "127.0.1.121", 2 * LEN);
    /// Stops the writer when the test ends, by a failed assertion too (the scope would
    /// otherwise wait for it forever).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = Stop(&stop);
        s.spawn(|| {
            let mut byte = 0u8;
            while !stop.load(Ordering::Relaxed) {
                b.mr.fill(byte);
                byte = byte.wrapping_add(1);
            }
        });
        for k in 0..50 {
            let mut wr = send_wr(k, WrOpcode::RdmaRead, a.mr.sge(0, LEN as u32));
            wr.remote_addr = b.mr.addr();
            wr.rkey = b.mr.rkey();
            a.qp.post_send(wr).unwrap();
            let c = one(&a.cq);
            assert_eq!(
                (c.wr_id, c.status, c.byte_len as usize),
                (k, WcStatus::Success, LEN)
            );
        }
    });
    assert_eq!(counter(&a.ctx, "drop_bad_icrc"), 0);
}
