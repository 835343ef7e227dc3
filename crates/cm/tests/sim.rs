//! Two endpoints over an in-memory network in virtual time: the handshakes, losses,
//! timeouts, rejects, SIDR and a REQ flood, asserting on states, events, MADs and
//! counters.

use std::net::IpAddr;

use softhca_cm::endpoint::{cm_ack_timeout, cm_convert_to_ms};
use softhca_cm::ip::{service_id, CmaHdr, PortSpace};
use softhca_cm::mad::{self, CmBody, CmMessage, MadHeader, MsgResponse};
use softhca_cm::{
    AcceptParams, CmEvent, CmId, CmState, ConnectParams, Endpoint, EndpointConfig, Outgoing, Psn,
    Qpn, RejReason, SidrReplyParams, SidrRequestParams, SidrStatus,
};

const MS: u64 = 1_000_000;
const GUID_A: u64 = 0x0002_c9ff_fe00_000a;
const GUID_B: u64 = 0x0002_c9ff_fe00_000b;

fn ip_a() -> IpAddr {
    [10, 0, 0, 1].into()
}
fn ip_b() -> IpAddr {
    [10, 0, 0, 2].into()
}
fn rping_sid() -> u64 {
    service_id(PortSpace::Tcp, 7174)
}

/// A MAD in flight, decoded for the assertions.
#[derive(Clone, Debug)]
struct Sent {
    at: u64,
    from: IpAddr,
    msg: CmMessage,
}

struct Net {
    a: Endpoint,
    b: Endpoint,
    now: u64,
    /// Returns true to drop the MAD.
    drop: Box<dyn FnMut(&Sent) -> bool>,
    log: Vec<Sent>,
    ev_a: Vec<CmEvent>,
    ev_b: Vec<CmEvent>,
}

impl Net {
    fn new() -> Net {
        Net::with(
            EndpointConfig::new(GUID_A, 0x1111_2222_3333_4444),
            EndpointConfig::new(GUID_B, 0x5555_6666_7777_8888),
        )
    }

    fn with(ca: EndpointConfig, cb: EndpointConfig) -> Net {
        Net {
            a: Endpoint::new(ca),
            b: Endpoint::new(cb),
            now: 0,
            drop: Box::new(|_| false),
            log: Vec::new(),
            ev_a: Vec::new(),
            ev_b: Vec::new(),
        }
    }

    /// Deliver until nothing is in flight.
    fn settle(&mut self) {
        loop {
            let mut moved = false;
            while let Some(Outgoing { dst, mad: m, .. }) = self.a.poll_transmit() {
                assert_eq!(dst, ip_b());
                moved = true;
                self.deliver(ip_a(), &m);
            }
            while let Some(Outgoing { dst, mad: m, .. }) = self.b.poll_transmit() {
                assert_eq!(dst, ip_a());
                moved = true;
                self.deliver(ip_b(), &m);
            }
            while let Some(e) = self.a.poll_event() {
                self.ev_a.push(e);
            }
            while let Some(e) = self.b.poll_event() {
                self.ev_b.push(e);
            }
            if !moved {
                return;
            }
        }
    }

    fn deliver(&mut self, from: IpAddr, m: &[u8; 256]) {
        let s = Sent {
            at: self.now,
            from,
            msg: mad::parse(m).expect("endpoints emit valid MADs"),
        };
        self.log.push(s.clone());
        if (self.drop)(&s) {
            return;
        }
        if from == ip_a() {
            self.b.handle_mad(self.now, from, 0, m);
        } else {
            self.a.handle_mad(self.now, from, 0, m);
        }
    }

    /// Jump to the next timer of either side and run it.
    fn advance(&mut self) -> bool {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { return false };
        self.now = self.now.max(t);
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.settle();
        true
    }

    fn sent(&self, from: IpAddr, name: &str) -> Vec<Sent> {
        self.log
            .iter()
            .filter(|s| s.from == from && s.msg.body.name() == name)
            .cloned()
            .collect()
    }

    fn take_b(&mut self) -> Vec<CmEvent> {
        std::mem::take(&mut self.ev_b)
    }
    fn take_a(&mut self) -> Vec<CmEvent> {
        std::mem::take(&mut self.ev_a)
    }
}

fn connect_params(sid: u64) -> ConnectParams {
    let mut p = ConnectParams::new(ip_a(), ip_b(), sid, Qpn::new(0x11), Psn::new(0xa0a0a));
    p.responder_resources = 4;
    p.initiator_depth = 2;
    let mut pd = vec![0u8; 40];
    CmaHdr {
        version: 0,
        src_port: 0xc001,
        src: ip_a(),
        dst: ip_b(),
    }
    .emit(&mut pd)
    .unwrap();
    pd[36..].copy_from_slice(b"user");
    p.private_data = pd;
    p
}

fn req_received(evs: &[CmEvent]) -> (CmId, mad::Req) {
    match evs {
        [CmEvent::ReqReceived { id, req, peer }] => {
            assert_eq!(*peer, ip_a());
            (*id, **req)
        }
        other => panic!("expected one ReqReceived, got {other:?}"),
    }
}

/// A connects, B accepts, A sends RTU: both ESTABLISHED. Returns (A's id, B's id).
fn establish(net: &mut Net) -> (CmId, CmId) {
    let _ = net.b.listen(rping_sid());
    let ida = net
        .a
        .connect(net.now, &connect_params(rping_sid()))
        .unwrap();
    net.settle();
    let (idb, req) = req_received(&net.take_b());
    let mut ap = AcceptParams::new(Qpn::new(0x22), Psn::new(0xb0b0b));
    // rdma_cm swaps the REQ's offer (`cma_accept_ib` after `cm_req_handler`).
    ap.responder_resources = req.initiator_depth;
    ap.initiator_depth = req.responder_resources;
    net.b.accept(net.now, idb, &ap).unwrap();
    net.settle();
    let evs = net.take_a();
    assert!(
        matches!(evs.as_slice(), [CmEvent::RepReceived { id, .. }] if *id == ida),
        "{evs:?}"
    );
    net.a.establish(net.now, ida, b"rtu").unwrap();
    net.settle();
    assert_eq!(net.take_b(), vec![CmEvent::Established { id: idb }]);
    (ida, idb)
}

#[test]
fn connect_accept_rtu_then_disconnect_and_timewait() {
    let mut net = Net::new();
    let (ida, idb) = establish(&mut net);
    assert_eq!(net.a.state(ida), Some(CmState::Established));
    assert_eq!(net.b.state(idb), Some(CmState::Established));

    // What went over the wire: REQ, REP, RTU with the comm IDs tied together.
    let req = &net.sent(ip_a(), "REQ")[0].msg;
    let CmBody::Req(r) = req.body else { panic!() };
    assert_eq!(r.local_comm_id, ida.0);
    assert_eq!(r.service_id, 0x0000_0000_0106_1c06);
    assert_eq!(r.local_ca_guid, GUID_A);
    assert_eq!(r.primary.remote_gid.to_ip(), ip_b());
    assert_eq!(r.primary.local_lid, 0xffff, "permissive LID when routed");
    assert_eq!((r.remote_cm_response_timeout, r.max_cm_retries), (20, 15));
    assert_eq!(&r.private_data[36..40], b"user");
    assert_eq!(
        CmaHdr::parse(&r.private_data).unwrap().dst,
        ip_b(),
        "cma_hdr carries the addresses"
    );
    let CmBody::Rep(p) = net.sent(ip_b(), "REP")[0].msg.body else {
        panic!()
    };
    assert_eq!((p.local_comm_id, p.remote_comm_id), (idb.0, ida.0));
    assert_eq!(
        net.sent(ip_b(), "REP")[0].msg.hdr.tid,
        req.hdr.tid,
        "REP echoes the REQ TID"
    );
    let CmBody::Rtu(t) = net.sent(ip_a(), "RTU")[0].msg.body else {
        panic!()
    };
    assert_eq!((t.local_comm_id, t.remote_comm_id), (ida.0, idb.0));
    assert_eq!(&t.private_data[..3], b"rtu");

    // QP attributes: PSNs cross over, resources swap, the MTU is the REQ's.
    let qa = net.a.qp_attrs(ida).unwrap();
    let qb = net.b.qp_attrs(idb).unwrap();
    assert_eq!(
        (qa.remote_qpn, qb.remote_qpn),
        (Qpn::new(0x22), Qpn::new(0x11))
    );
    assert_eq!(
        (qa.sq_psn, qa.rq_psn),
        (Psn::new(0xb0b0b), Psn::new(0xa0a0a))
    );
    assert_eq!(
        (qb.sq_psn, qb.rq_psn),
        (Psn::new(0xa0a0a), Psn::new(0xb0b0b))
    );
    assert_eq!((qb.responder_resources, qb.initiator_depth), (2, 4));
    assert_eq!((qa.responder_resources, qa.initiator_depth), (4, 2));
    assert_eq!(qb.path_mtu, 3);

    // Disconnect: DREQ carries B's QPN, B answers on disconnect, both in timewait.
    let t0 = net.now;
    net.a.disconnect(net.now, ida, &[]).unwrap();
    net.settle();
    let CmBody::Dreq(d) = net.sent(ip_a(), "DREQ")[0].msg.body else {
        panic!()
    };
    assert_eq!(d.remote_qpn, Qpn::new(0x22));
    assert!(matches!(net.take_b().as_slice(), [CmEvent::DreqReceived { id, .. }] if *id == idb));
    assert_eq!(net.b.state(idb), Some(CmState::DreqRcvd));
    net.b.disconnect(net.now, idb, &[]).unwrap();
    net.settle();
    assert_eq!(net.take_a(), vec![CmEvent::DrepReceived { id: ida }]);
    assert_eq!(net.a.state(ida), Some(CmState::Timewait));
    assert_eq!(net.b.state(idb), Some(CmState::Timewait));

    // Timewait lasts conv(av.timeout): A's is cm_ack_timeout(15, 18) = 19, B's the REQ's
    // LocalAckTimeout, the same 19: 2048 ms.
    assert_eq!(cm_ack_timeout(15, 18), 19);
    assert_eq!(net.a.poll_timeout(), Some(t0 + cm_convert_to_ms(19) * MS));
    assert!(net.advance());
    assert_eq!(net.take_a(), vec![CmEvent::TimewaitExit { id: ida }]);
    assert_eq!(net.take_b(), vec![CmEvent::TimewaitExit { id: idb }]);
    assert_eq!((net.a.connection_count(), net.b.connection_count()), (0, 0));
    assert_eq!(net.a.counters().tx_retries + net.b.counters().tx_retries, 0);
}

#[test]
fn lost_req_is_retransmitted_after_the_kernel_interval() {
    let mut net = Net::new();
    let mut dropped = false;
    net.drop = Box::new(move |s| {
        let first = s.msg.body.name() == "REQ" && !dropped;
        dropped |= first;
        first
    });
    net.b.listen(rping_sid()).unwrap();
    let ida = net.a.connect(0, &connect_params(rping_sid())).unwrap();
    net.settle();
    assert!(net.take_b().is_empty());
    // 2 × conv(PLT 18) + conv(20) = 2 × 1024 + 4096 ms.
    assert_eq!(net.a.poll_timeout(), Some(6144 * MS));
    net.advance();
    let reqs = net.sent(ip_a(), "REQ");
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].at, 6144 * MS);
    assert_eq!(reqs[0].msg, reqs[1].msg, "a retransmission is the same MAD");
    let (idb, _) = req_received(&net.take_b());
    net.b
        .accept(
            net.now,
            idb,
            &AcceptParams::new(Qpn::new(0x22), Psn::new(1)),
        )
        .unwrap();
    net.settle();
    assert!(matches!(
        net.take_a().as_slice(),
        [CmEvent::RepReceived { .. }]
    ));
    assert_eq!(net.a.counters().tx_retries, 1);
    assert_eq!(
        net.a.state(ida),
        Some(CmState::MraRepSent),
        "MRA armed for the REP"
    );

    // A duplicate REP before our RTU gets the armed MRA (cm_dup_rep_handler).
    let rep = net.sent(ip_b(), "REP")[0].msg;
    let mut m = [0u8; 256];
    mad::emit(&rep, &mut m).unwrap();
    net.a.handle_mad(net.now, ip_b(), 0, &m);
    let mra = net.a.poll_transmit().unwrap().mad;
    let CmBody::Mra(mra) = mad::parse(&mra).unwrap().body else {
        panic!()
    };
    assert_eq!((mra.msg_mraed, mra.service_timeout), (MsgResponse::Rep, 24));
    assert_eq!((mra.local_comm_id, mra.remote_comm_id), (ida.0, idb.0));
    let mut b = [0u8; 256];
    mad::emit(
        &CmMessage {
            hdr: MadHeader::default(),
            body: CmBody::Mra(mra),
        },
        &mut b,
    )
    .unwrap();
    net.b.handle_mad(net.now, ip_a(), 0, &b);
    assert_eq!(
        std::iter::from_fn(|| net.b.poll_event()).collect::<Vec<_>>(),
        vec![CmEvent::MraReceived {
            id: idb,
            service_timeout: 24
        }]
    );
    assert_eq!(net.b.state(idb), Some(CmState::MraRepRcvd));
    // B's REP timer now waits conv(24) + conv(av.timeout 19) ms.
    assert_eq!(net.b.poll_timeout(), Some(net.now + (65536 + 2048) * MS));
    net.a.establish(net.now, ida, &[]).unwrap();
    net.settle();
    assert_eq!(net.take_b(), vec![CmEvent::Established { id: idb }]);
}

#[test]
fn lost_rep_is_retransmitted_and_taken_once() {
    let mut net = Net::new();
    let mut dropped = false;
    net.drop = Box::new(move |s| {
        let first = s.msg.body.name() == "REP" && !dropped;
        dropped |= first;
        first
    });
    net.b.listen(rping_sid()).unwrap();
    let ida = net.a.connect(0, &connect_params(rping_sid())).unwrap();
    net.settle();
    let (idb, _) = req_received(&net.take_b());
    net.b
        .accept(
            net.now,
            idb,
            &AcceptParams::new(Qpn::new(0x22), Psn::new(1)),
        )
        .unwrap();
    net.settle();
    assert!(net.take_a().is_empty());
    // The REP goes again after conv(REQ.LocalCMResponseTimeout 20) = 4096 ms, before the
    // REQ's own 6144 ms.
    assert_eq!(net.b.poll_timeout(), Some(4096 * MS));
    net.advance();
    assert_eq!(net.sent(ip_b(), "REP").len(), 2);
    assert!(matches!(net.take_a().as_slice(), [CmEvent::RepReceived { id, .. }] if *id == ida));
    net.a.establish(net.now, ida, &[]).unwrap();
    net.settle();
    assert_eq!(net.take_b(), vec![CmEvent::Established { id: idb }]);
    assert_eq!(net.b.counters().tx_retries, 1);
    assert_eq!(net.a.counters().tx_retries, 0);
    assert_eq!(net.a.poll_timeout(), None, "REQ timer cancelled by the REP");

    // A duplicate REP after ESTABLISHED gets the RTU again (cm_dup_rep_handler).
    let rep = net.sent(ip_b(), "REP")[0].msg;
    let mut m = [0u8; 256];
    mad::emit(&rep, &mut m).unwrap();
    net.a.handle_mad(net.now, ip_b(), 0, &m);
    let again = net.a.poll_transmit().unwrap().mad;
    assert!(matches!(mad::parse(&again).unwrap().body, CmBody::Rtu(_)));
    assert_eq!(net.a.counters().rx_duplicates, 1);
}

#[test]
fn duplicate_req_while_consumer_thinks_gets_the_armed_mra() {
    let mut net = Net::new();
    net.b.listen(rping_sid()).unwrap();
    let ida = net.a.connect(0, &connect_params(rping_sid())).unwrap();
    net.settle();
    let (idb, _) = req_received(&net.take_b());
    assert_eq!(
        net.b.state(idb),
        Some(CmState::MraReqSent),
        "MRA armed as rdma_cm does"
    );
    assert!(
        net.sent(ip_b(), "MRA").is_empty(),
        "but not sent until a duplicate"
    );
    net.advance(); // the REQ retransmission at 6144 ms
    let mras = net.sent(ip_b(), "MRA");
    assert_eq!(mras.len(), 1);
    let CmBody::Mra(m) = mras[0].msg.body else {
        panic!()
    };
    assert_eq!((m.msg_mraed, m.service_timeout), (MsgResponse::Req, 24));
    assert_eq!(m.remote_comm_id, ida.0);
    assert_eq!(net.b.counters().rx_duplicates, 1);
    assert!(net.take_b().is_empty(), "a duplicate is no new connection");
    assert_eq!(net.a.state(ida), Some(CmState::MraReqRcvd));
    assert_eq!(
        net.take_a(),
        vec![CmEvent::MraReceived {
            id: ida,
            service_timeout: 24
        }]
    );
    // The REQ timer becomes conv(24) + conv(av.timeout 19) from the MRA.
    assert_eq!(net.a.poll_timeout(), Some(6144 * MS + (65536 + 2048) * MS));
    // The consumer accepts late; the connection completes.
    net.b
        .accept(
            net.now,
            idb,
            &AcceptParams::new(Qpn::new(0x22), Psn::new(1)),
        )
        .unwrap();
    net.settle();
    assert!(matches!(
        net.take_a().as_slice(),
        [CmEvent::RepReceived { .. }]
    ));
}

#[test]
fn no_listener_gets_rej_invalid_service_id() {
    let mut net = Net::new();
    let ida = net
        .a
        .connect(0, &connect_params(service_id(PortSpace::Tcp, 9)))
        .unwrap();
    net.settle();
    let rejs = net.sent(ip_b(), "REJ");
    assert_eq!(rejs.len(), 1);
    let CmBody::Rej(r) = rejs[0].msg.body else {
        panic!()
    };
    assert_eq!(r.reason, RejReason::InvalidServiceId);
    assert_eq!(r.reason.to_u16(), 8);
    assert_eq!(r.msg_rejected, MsgResponse::Req);
    assert_eq!(r.remote_comm_id, ida.0);
    let evs = net.take_a();
    match evs.as_slice() {
        [CmEvent::Rejected { id, rej }] => {
            assert_eq!(*id, ida);
            assert_eq!(rej.reason, RejReason::InvalidServiceId);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(net.a.state(ida), None, "rejected connections are gone");
    assert_eq!(net.a.poll_timeout(), None);
    assert_eq!(net.b.connection_count(), 0);
    assert_eq!(net.b.counters().req_no_listener, 1);
}

/// B waits `no_listener_grace` (100 ms here) for a listener before it rejects.
fn with_grace() -> Net {
    let mut cb = EndpointConfig::new(GUID_B, 0x5555_6666_7777_8888);
    cb.no_listener_grace = 100 * MS;
    Net::with(EndpointConfig::new(GUID_A, 0x1111_2222_3333_4444), cb)
}

#[test]
fn req_before_listen_is_handed_to_the_listener_that_comes() {
    let mut net = with_grace();
    net.a.connect(0, &connect_params(rping_sid())).unwrap();
    net.settle();
    assert!(net.sent(ip_b(), "REJ").is_empty());
    assert!(net.take_b().is_empty());
    assert_eq!(net.b.poll_timeout(), Some(100 * MS));
    net.now = 30 * MS;
    net.b.listen(rping_sid()).unwrap();
    assert_eq!(net.b.poll_timeout(), Some(0), "due at once");
    net.advance();
    let (_, req) = req_received(&net.take_b());
    assert_eq!(req.service_id, rping_sid());
    assert!(net.sent(ip_b(), "REJ").is_empty());
    assert_eq!(net.b.counters().req_no_listener, 0);
}

#[test]
fn req_nobody_listens_for_is_rejected_after_the_grace() {
    let mut net = with_grace();
    let ida = net.a.connect(0, &connect_params(rping_sid())).unwrap();
    net.settle();
    net.advance();
    let rejs = net.sent(ip_b(), "REJ");
    assert_eq!(
        rejs.iter().map(|s| s.at).collect::<Vec<_>>(),
        vec![100 * MS]
    );
    assert!(matches!(
        net.take_a().as_slice(),
        [CmEvent::Rejected { id, rej }] if *id == ida && rej.reason == RejReason::InvalidServiceId
    ));
    assert_eq!(net.b.counters().req_no_listener, 1);
    assert_eq!(net.b.poll_timeout(), None);
}

#[test]
fn sidr_req_before_listen_waits_for_the_listener_else_unsupported() {
    let mut net = with_grace();
    let sid = service_id(PortSpace::Udp, 7174);
    net.a
        .sidr_request(0, &SidrRequestParams::new(ip_b(), sid))
        .unwrap();
    net.settle();
    assert!(net.sent(ip_b(), "SIDR_REP").is_empty());
    net.b.listen(sid).unwrap();
    net.advance();
    assert!(matches!(
        net.take_b().as_slice(),
        [CmEvent::SidrReqReceived { .. }]
    ));
    // Another service ID, never listened on: "unsupported" once the grace is over.
    let other = service_id(PortSpace::Udp, 1);
    let t0 = net.now;
    net.a
        .sidr_request(t0, &SidrRequestParams::new(ip_b(), other))
        .unwrap();
    net.settle();
    while net.take_a().is_empty() && net.advance() {}
    let reps = net.sent(ip_b(), "SIDR_REP");
    let CmBody::SidrRep(r) = reps.last().expect("a SIDR_REP").msg.body else {
        panic!()
    };
    assert_eq!(r.status, SidrStatus::Unsupported);
    assert_eq!(reps.last().map(|s| s.at), Some(t0 + 100 * MS));
}

#[test]
fn consumer_reject_carries_reason_28_and_private_data() {
    let mut net = Net::new();
    net.b.listen(rping_sid()).unwrap();
    let ida = net.a.connect(0, &connect_params(rping_sid())).unwrap();
    net.settle();
    let (idb, _) = req_received(&net.take_b());
    net.b
        .reject(net.now, idb, RejReason::ConsumerDefined, b"go away")
        .unwrap();
    net.settle();
    match net.take_a().as_slice() {
        [CmEvent::Rejected { id, rej }] => {
            assert_eq!(*id, ida);
            assert_eq!(rej.reason.to_u16(), 28);
            assert_eq!(&rej.private_data[..7], b"go away");
            assert_eq!(rej.local_comm_id, idb.0, "MRA_REQ_SENT rejects with our ID");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((net.a.connection_count(), net.b.connection_count()), (0, 0));
}

#[test]
fn unanswered_req_times_out_after_max_retries() {
    let mut net = Net::new();
    net.drop = Box::new(|_| true);
    let ida = net.a.connect(0, &connect_params(rping_sid())).unwrap();
    net.settle();
    while net.advance() {}
    assert_eq!(net.sent(ip_a(), "REQ").len(), 16, "1 + 15 retries");
    assert_eq!(
        net.take_a(),
        vec![CmEvent::Timeout {
            id: ida,
            state: CmState::ReqSent
        }]
    );
    assert_eq!(net.now, 16 * 6144 * MS, "about 98 s, as the notes measure");
    let c = net.a.counters();
    assert_eq!((c.tx_retries, c.timeouts), (15, 1));
    assert_eq!(net.a.connection_count(), 0);
}

#[test]
fn dreq_timeout_enters_timewait_and_reports() {
    let mut net = Net::new();
    let (ida, _) = establish(&mut net);
    net.drop = Box::new(|s| s.msg.body.name() == "DREQ");
    net.a.disconnect(net.now, ida, &[]).unwrap();
    net.settle();
    while net.a.state(ida) == Some(CmState::DreqSent) {
        assert!(net.advance());
    }
    assert_eq!(net.a.state(ida), Some(CmState::Timewait));
    assert!(net.take_a().contains(&CmEvent::Timeout {
        id: ida,
        state: CmState::DreqSent
    }));
    assert_eq!(net.sent(ip_a(), "DREQ").len(), 16);
}

#[test]
fn dreq_duplicates_and_strays_get_a_drep() {
    let mut net = Net::new();
    let (ida, idb) = establish(&mut net);
    net.a.disconnect(net.now, ida, &[]).unwrap();
    net.settle();
    net.b.disconnect(net.now, idb, b"bye").unwrap();
    net.settle();
    let dreq = net.sent(ip_a(), "DREQ")[0].msg;
    let mut m = [0u8; 256];
    mad::emit(&dreq, &mut m).unwrap();
    // Again while B is in timewait: DREP with the same private data.
    net.b.handle_mad(net.now, ip_a(), 0, &m);
    let d = net.b.poll_transmit().unwrap().mad;
    let CmBody::Drep(d) = mad::parse(&d).unwrap().body else {
        panic!()
    };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (idb.0, ida.0));
    assert_eq!(&d.private_data[..3], b"bye");
    // After timewait B has forgotten it; a stray DREQ still gets a DREP (cm_issue_drep).
    while net.advance() {}
    net.b.handle_mad(net.now, ip_a(), 0, &m);
    let Outgoing { dst, mad: d, .. } = net.b.poll_transmit().unwrap();
    assert_eq!(dst, ip_a());
    let CmBody::Drep(d) = mad::parse(&d).unwrap().body else {
        panic!()
    };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (idb.0, ida.0));
    assert_eq!(net.b.counters().rx_duplicates, 2);
}

#[test]
fn dreq_naming_another_qpn_is_dropped() {
    let mut net = Net::new();
    let (ida, idb) = establish(&mut net);
    let dreq = CmMessage {
        hdr: MadHeader::default(),
        body: CmBody::Dreq(mad::Dreq {
            local_comm_id: ida.0,
            remote_comm_id: idb.0,
            remote_qpn: Qpn::new(0x23),
            private_data: [0; 220],
        }),
    };
    let mut m = [0u8; 256];
    mad::emit(&dreq, &mut m).unwrap();
    net.b.handle_mad(net.now, ip_a(), 0, &m);
    assert_eq!(net.b.counters().dreq_bad_qpn, 1);
    assert_eq!(net.b.state(idb), Some(CmState::Established));
    assert!(net.b.poll_transmit().is_none());
}

#[test]
fn req_from_a_live_remote_qp_is_stale() {
    let mut net = Net::new();
    let (_ida, idb) = establish(&mut net);
    // A restarted A (new comm IDs, same GUID and QPN) connects again while B still has
    // the old connection: REJ 10, and B tears the old one down with a DREQ.
    let mut a2 = Endpoint::new(EndpointConfig::new(GUID_A, 0x9999));
    a2.connect(net.now, &connect_params(rping_sid())).unwrap();
    let req = a2.poll_transmit().unwrap().mad;
    net.b.handle_mad(net.now, ip_a(), 0, &req);
    let out: Vec<_> = std::iter::from_fn(|| net.b.poll_transmit()).collect();
    let names: Vec<_> = out
        .iter()
        .map(|o| mad::parse(&o.mad).unwrap().body)
        .collect();
    assert!(
        matches!(names.as_slice(), [CmBody::Rej(r), CmBody::Dreq(_)] if r.reason == RejReason::StaleConn),
        "{names:?}"
    );
    assert_eq!(net.b.counters().req_stale, 1);
    assert_eq!(net.b.state(idb), Some(CmState::DreqSent));
}

#[test]
fn comm_ids_come_from_the_random_operand() {
    let mut e1 = Endpoint::new(EndpointConfig::new(1, 0xdead_beef));
    let mut e2 = Endpoint::new(EndpointConfig::new(1, 0x1234_5678));
    let p = connect_params(rping_sid());
    let a = e1.connect(0, &p).unwrap();
    let b = e2.connect(0, &p).unwrap();
    assert_eq!(a.0, 0xdead_beef);
    assert_eq!(b.0, 0x1234_5678);
    let a2 = e1.connect(0, &p).unwrap();
    assert_eq!(a2.0, 0xdead_beef ^ 1);
}

#[test]
fn sidr_request_and_reply() {
    let mut net = Net::new();
    let sid = service_id(PortSpace::Udp, 7174);
    net.b.listen(sid).unwrap();
    let mut p = SidrRequestParams::new(ip_b(), sid);
    p.private_data = b"sidr!".to_vec();
    let ida = net.a.sidr_request(0, &p).unwrap();
    net.settle();
    let (idb, req) = match net.take_b().as_slice() {
        [CmEvent::SidrReqReceived { id, req, peer }] => {
            assert_eq!(*peer, ip_a());
            (*id, **req)
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(req.service_id, sid);
    assert_eq!(&req.private_data[..5], b"sidr!");
    net.b
        .sidr_reply(
            net.now,
            idb,
            &SidrReplyParams {
                status: SidrStatus::Success,
                qpn: Qpn::new(0x345),
                qkey: 0x0123_4567,
                private_data: Vec::new(),
            },
        )
        .unwrap();
    net.settle();
    match net.take_a().as_slice() {
        [CmEvent::SidrRepReceived { id, rep }] => {
            assert_eq!(*id, ida);
            assert_eq!(rep.status, SidrStatus::Success);
            assert_eq!((rep.qpn, rep.qkey), (Qpn::new(0x345), 0x0123_4567));
            assert_eq!(rep.service_id, sid);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((net.a.connection_count(), net.b.connection_count()), (0, 0));

    // No listener: status 1 (unsupported), as cm_sidr_req_handler answers.
    let id2 = net
        .a
        .sidr_request(
            net.now,
            &SidrRequestParams::new(ip_b(), service_id(PortSpace::Udp, 1)),
        )
        .unwrap();
    net.settle();
    match net.take_a().as_slice() {
        [CmEvent::SidrRepReceived { id, rep }] => {
            assert_eq!(*id, id2);
            assert_eq!(rep.status, SidrStatus::Unsupported);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn lost_sidr_req_is_retried_every_4096_ms() {
    let mut net = Net::new();
    let sid = service_id(PortSpace::Udp, 7174);
    net.b.listen(sid).unwrap();
    let mut n = 0;
    net.drop = Box::new(move |s| {
        n += 1;
        s.msg.body.name() == "SIDR_REQ" && n <= 2
    });
    net.a
        .sidr_request(0, &SidrRequestParams::new(ip_b(), sid))
        .unwrap();
    net.settle();
    net.advance();
    net.advance();
    let reqs = net.sent(ip_a(), "SIDR_REQ");
    assert_eq!(
        reqs.iter().map(|s| s.at / MS).collect::<Vec<_>>(),
        vec![0, 4096, 8192]
    );
    assert!(matches!(
        net.take_b().as_slice(),
        [CmEvent::SidrReqReceived { .. }]
    ));
}

#[test]
fn req_flood_is_bounded() {
    let mut cfg = EndpointConfig::new(GUID_B, 3);
    cfg.max_pending = 8;
    let mut b = Endpoint::new(cfg);
    b.listen(rping_sid()).unwrap();
    let mut a = Endpoint::new(EndpointConfig::new(GUID_A, 5));
    let mut p = connect_params(rping_sid());
    for i in 0..1000u32 {
        // A distinct QP each time so none looks stale or duplicate.
        p.local_qpn = Qpn::new(0x100 + i);
        a.connect(0, &p).unwrap();
    }
    let mut n = 0;
    while let Some(Outgoing { mad: m, .. }) = a.poll_transmit() {
        b.handle_mad(0, ip_a(), 0, &m);
        n += 1;
    }
    assert_eq!(n, 1000);
    assert_eq!(b.connection_count(), 8);
    let c = b.counters();
    assert_eq!((c.req_over_limit, c.rx_mads), (992, 1000));
    assert!(
        b.poll_transmit().is_none(),
        "a flood is dropped, not answered"
    );
    let ids: Vec<CmId> = std::iter::from_fn(|| b.poll_event())
        .map(|e| e.id())
        .collect();
    assert_eq!(ids.len(), 8);
    // Answering one frees a slot for the next retransmission.
    b.reject(0, ids[0], RejReason::ConsumerDefined, &[])
        .unwrap();
    assert_eq!(b.connection_count(), 7);
    a.handle_timeout(6144 * MS);
    let mut taken = 0;
    while let Some(Outgoing { mad: m, .. }) = a.poll_transmit() {
        b.handle_mad(6144 * MS, ip_a(), 0, &m);
        taken += 1;
    }
    assert!(taken >= 999);
    assert_eq!(b.connection_count(), 8);
    assert_eq!(
        b.counters().rx_duplicates,
        7,
        "the 7 pending ones are recognised"
    );
}

#[test]
fn malformed_and_unmatched_mads_are_counted_and_dropped() {
    let mut b = Endpoint::new(EndpointConfig::new(GUID_B, 3));
    b.handle_mad(0, ip_a(), 0, &[0u8; 10]);
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 7, 2, 3]);
    m[17] = 0x19; // LAP
    b.handle_mad(0, ip_a(), 0, &m);
    m[17] = 0x14; // RTU for nothing
    b.handle_mad(0, ip_a(), 0, &m);
    let c = b.counters();
    assert_eq!((c.rx_mads, c.rx_malformed, c.rx_unmatched), (3, 2, 1));
    assert!(b.poll_transmit().is_none());
    assert!(b.poll_event().is_none());
}

#[test]
fn destroy_sends_what_the_kernel_sends() {
    let mut net = Net::new();
    net.b.listen(rping_sid()).unwrap();
    // Destroying our REQ in flight: REJ timeout with our GUID as ARI; B forgets the REQ.
    let ida = net.a.connect(0, &connect_params(rping_sid())).unwrap();
    net.settle();
    let (idb, _) = req_received(&net.take_b());
    net.a.destroy(net.now, ida);
    net.settle();
    let CmBody::Rej(r) = net.sent(ip_a(), "REJ")[0].msg.body else {
        panic!()
    };
    assert_eq!(r.reason, RejReason::Timeout);
    assert_eq!(&r.ari[..8], &GUID_A.to_be_bytes());
    assert!(matches!(net.take_b().as_slice(), [CmEvent::Rejected { id, .. }] if *id == idb));
    assert_eq!((net.a.connection_count(), net.b.connection_count()), (0, 0));
    // Destroying an established connection sends a DREQ and reports nothing more.
    let (ida, idb) = establish(&mut net);
    net.a.destroy(net.now, ida);
    net.settle();
    assert!(matches!(
        net.take_b().as_slice(),
        [CmEvent::DreqReceived { .. }]
    ));
    net.b.disconnect(net.now, idb, &[]).unwrap();
    net.settle();
    while net.advance() {}
    assert!(net.take_a().is_empty());
    assert_eq!(net.a.connection_count(), 0);
}

/// A connection's MADs go with its primary path's traffic class as their IP TOS, both
/// ways (the kernel's CM sends on an address handle built from the path, and the passive
/// side's path is the REQ's). Answers that belong to no connection (a REJ to a REQ
/// nobody listens for, a DREP to a DREQ for a connection gone, a SIDR_REP "unsupported")
/// go back with the TOS the MAD came with, as the kernel answers on an address handle
/// built from the received GRH.
#[test]
fn mads_carry_the_paths_traffic_class() {
    let mut a = Endpoint::new(EndpointConfig::new(GUID_A, 1));
    let mut b = Endpoint::new(EndpointConfig::new(GUID_B, 2));
    b.listen(rping_sid()).unwrap();
    let mut p = connect_params(rping_sid());
    p.traffic_class = 0x20;
    let ca = a.connect(0, &p).unwrap();
    let req = a.poll_transmit().unwrap();
    assert_eq!((req.dst, req.traffic_class), (ip_b(), 0x20));
    b.handle_mad(0, ip_a(), 0, &req.mad);
    let Some(CmEvent::ReqReceived { id: cb, .. }) = b.poll_event() else {
        panic!()
    };
    b.accept(0, cb, &AcceptParams::new(Qpn::new(0x22), Psn::new(2)))
        .unwrap();
    let rep = b.poll_transmit().unwrap();
    assert_eq!((rep.dst, rep.traffic_class), (ip_a(), 0x20));
    a.handle_mad(0, ip_b(), 0, &rep.mad);
    a.establish(0, ca, &[]).unwrap();
    let rtu = a.poll_transmit().unwrap();
    assert_eq!(rtu.traffic_class, 0x20, "RTU");
    b.handle_mad(0, ip_a(), 0, &rtu.mad);
    b.disconnect(0, cb, &[]).unwrap();
    assert_eq!(b.poll_transmit().unwrap().traffic_class, 0x20, "DREQ");
    // No listener on another port: the REJ belongs to no connection.
    let mut p = connect_params(service_id(PortSpace::Tcp, 7175));
    p.traffic_class = 0x20;
    a.connect(0, &p).unwrap();
    b.handle_mad(0, ip_a(), 0x48, &a.poll_transmit().unwrap().mad);
    let rej = b.poll_transmit().unwrap();
    assert!(matches!(mad::parse(&rej.mad).unwrap().body, CmBody::Rej(_)));
    assert_eq!(rej.traffic_class, 0x48, "REJ");
    // A DREQ for a connection b no longer has: the DREP.
    let dreq = CmMessage {
        hdr: MadHeader::default(),
        body: CmBody::Dreq(mad::Dreq {
            local_comm_id: 0x1234,
            remote_comm_id: 0x5678,
            remote_qpn: Qpn::new(0x99),
            private_data: [0; 220],
        }),
    };
    let mut m = [0u8; 256];
    mad::emit(&dreq, &mut m).unwrap();
    b.handle_mad(0, ip_a(), 0x68, &m);
    let drep = b.poll_transmit().unwrap();
    assert!(matches!(
        mad::parse(&drep.mad).unwrap().body,
        CmBody::Drep(_)
    ));
    assert_eq!((drep.dst, drep.traffic_class), (ip_a(), 0x68), "DREP");
}
