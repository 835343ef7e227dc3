//! Connect, establish and disconnect over a network that drops and duplicates MADs as a
//! property test chooses: whatever is lost, both endpoints end with no connection left once
//! their timers have run (no leak, no stuck state), and a connection both sides saw
//! established was seen established by both.

use std::net::IpAddr;

use proptest::prelude::*;
use softhca_cm::ip::{service_id, PortSpace};
use softhca_cm::{
    AcceptParams, CmEvent, ConnectParams, Endpoint, EndpointConfig, Outgoing, Psn, Qpn,
};

#[derive(Clone, Copy, Debug)]
enum Fate {
    Deliver,
    Drop,
    Twice,
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        6 => Just(Fate::Deliver),
        3 => Just(Fate::Drop),
        1 => Just(Fate::Twice),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn lossy_lifecycle_leaves_nothing_behind(fates in prop::collection::vec(fate(), 0..48)) {
        let ip_a: IpAddr = [10, 0, 0, 1].into();
        let ip_b: IpAddr = [10, 0, 0, 2].into();
        let sid = service_id(PortSpace::Tcp, 7174);
        let mut a = Endpoint::new(EndpointConfig::new(0xa, 11));
        let mut b = Endpoint::new(EndpointConfig::new(0xb, 22));
        b.listen(sid).unwrap();
        let ida = a
            .connect(0, &ConnectParams::new(ip_a, ip_b, sid, Qpn::new(0x11), Psn::new(1)))
            .unwrap();
        let mut now = 0u64;
        let mut n = 0usize;
        let (mut a_est, mut b_est) = (false, false);
        for _round in 0..10_000 {
            // Deliver everything in flight, each MAD meeting the next fate.
            loop {
                let mut moved = false;
                for from_a in [true, false] {
                    loop {
                        let out = if from_a { a.poll_transmit() } else { b.poll_transmit() };
                        let Some(Outgoing { mad: m, .. }) = out else { break };
                        moved = true;
                        let f = fates.get(n).copied().unwrap_or(Fate::Deliver);
                        n += 1;
                        let copies = match f {
                            Fate::Deliver => 1,
                            Fate::Drop => 0,
                            Fate::Twice => 2,
                        };
                        for _ in 0..copies {
                            if from_a {
                                b.handle_mad(now, ip_a, 0, &m);
                            } else {
                                a.handle_mad(now, ip_b, 0, &m);
                            }
                        }
                    }
                }
                // The consumers: B accepts, A sends RTU, A hangs up once connected, B
                // answers a DREQ.
                while let Some(e) = b.poll_event() {
                    match e {
                        CmEvent::ReqReceived { id, .. } => {
                            b.accept(now, id, &AcceptParams::new(Qpn::new(0x22), Psn::new(2)))
                                .unwrap();
                        }
                        CmEvent::Established { .. } => b_est = true,
                        CmEvent::DreqReceived { id, .. } => b.disconnect(now, id, &[]).unwrap(),
                        _ => {}
                    }
                    moved = true;
                }
                while let Some(e) = a.poll_event() {
                    if let CmEvent::RepReceived { id, .. } = e {
                        a.establish(now, id, &[]).unwrap();
                        a_est = true;
                        a.disconnect(now, id, &[]).unwrap();
                    }
                    moved = true;
                }
                if !moved {
                    break;
                }
            }
            let next = [a.poll_timeout(), b.poll_timeout()].into_iter().flatten().min();
            let Some(t) = next else { break };
            prop_assert!(t >= now, "timers never go back in time");
            now = t;
            a.handle_timeout(now);
            b.handle_timeout(now);
        }
        prop_assert_eq!(a.connection_count(), 0, "A left {:?}", a.state(ida));
        prop_assert_eq!(b.connection_count(), 0);
        prop_assert!(a.poll_timeout().is_none() && b.poll_timeout().is_none());
        if b_est {
            prop_assert!(a_est, "B cannot be established unless A sent the RTU");
        }
    }
}
