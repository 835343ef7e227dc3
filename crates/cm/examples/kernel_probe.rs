//! Talks IB CM with a Linux kernel rdma_cm peer over RoCEv2, using this crate's endpoint
//! on a real UDP socket: the tool behind `tests/data/kernel-cm.pcap`.
//!
//! Run inside the rxe-vm namespace (host side 10.99.0.1, kernel rxe at 10.99.0.2) while the
//! guest runs `rping -s`, `udaddy -s` and `rping -c -a 10.99.0.1`:
//!
//! 1. REQ to the guest's rping server (service 0x0000000001061C06) → kernel REP; we send
//!    RTU, then DREQ → kernel DREP.
//! 2. REQ to port 9999 where nothing listens → kernel REJ reason 8.
//! 3. SIDR_REQ to udaddy (0x0000000001111C06) → kernel SIDR_REP.
//! 4. We listen on 0x0000000001061C06 and accept the guest's rping client → kernel RTU;
//!    its data goes to a QPN nobody serves, so it gives up and sends DREQ → our DREP.
//!
//! `--scenario 2` (guest: `rping -s` on ports 7174 and 7175, `udaddy -s`) instead:
//!
//! 1. REQ to rping, sent twice back to back → kernel MRA (the duplicate finds the REQ in
//!    MRA_REQ_SENT, armed by rdma_cm) and REP; we send RTU.
//! 2. A second REQ from the same QPN while the first connection lives → kernel REJ 10
//!    (stale) and a kernel DREQ for the first connection → our DREP.
//! 3. REQ to port 7175 naming a GID the kernel does not have → kernel REJ 12 (invalid GID).
//! 4. SIDR_REQ to udaddy → kernel SIDR_REP with its QPN and Q_Key 0x01234567.
//!
//! `--scenario 3` (guest: `udaddy -b 10.99.0.2`, then `udaddy -s 10.99.0.1`): SIDR_REQ to
//! the guest's udaddy → kernel SIDR_REP with its QPN and Q_Key 0x01234567; the guest's
//! udaddy client's SIDR_REQ → our SIDR_REP.
//!
//! Prints every CM MAD in and out, decoded, and a summary; exits after `--secs` (45).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use softhca_cm::ip::{service_id, CmaHdr, PortSpace, RDMA_UDP_QKEY};
use softhca_cm::mad::{self, GSI_QKEY};
use softhca_cm::{
    AcceptParams, CmEvent, ConnectParams, Endpoint, EndpointConfig, Outgoing, SidrRequestParams,
};
use softhca_io::{BindOptions, RecvBatch, RoceSocket, Transmit};
use softhca_wire::{
    emit_packet, parse, seal, Bth, Deth, Headers, IpPseudo, Opcode, Psn, Qpn, UdpPseudo, ICRC_LEN,
};

const ME: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
const PORT: u16 = 4791;

fn cma_pd(src_port: u16) -> Vec<u8> {
    let mut pd = vec![0u8; softhca_cm::ip::CMA_HDR_LEN];
    CmaHdr {
        version: 0,
        src_port,
        src: ME.into(),
        dst: PEER.into(),
    }
    .emit(&mut pd)
    .unwrap();
    pd
}

fn describe(m: &[u8]) -> String {
    match mad::parse(m) {
        Ok(msg) => format!("{} {:?}", msg.body.name(), msg.body)
            .chars()
            .take(400)
            .collect(),
        Err(e) => format!("undecodable: {e}"),
    }
}

fn main() {
    let arg = |name: &str, default: u64| -> u64 {
        std::env::args()
            .skip_while(|a| a != name)
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let secs = arg("--secs", 45);
    let scenario = arg("--scenario", 1);
    let sock = RoceSocket::bind_with(
        SocketAddr::new(ME.into(), PORT),
        BindOptions {
            allow_gso: false,
            allow_gro: false,
            recv_tos: false,
            ..BindOptions::DEFAULT
        },
    )
    .expect("bind 10.99.0.1:4791 (run inside the rxevm namespace)");
    let mut batch = RecvBatch::for_socket(&sock, 8);
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut ep = Endpoint::new(EndpointConfig::new(0x0266_55ff_fe00_0001, seed));
    ep.listen(service_id(PortSpace::Tcp, 7174)).unwrap();
    ep.listen(service_id(PortSpace::Udp, 7174)).unwrap();
    let mut psn = 0u32;
    let mut step = 0;
    let mut seen: Vec<String> = Vec::new();
    let mut hangup = None;
    let mut duplicate_next_req = false;
    let flow = |sport| UdpPseudo {
        ip: IpPseudo::V4 {
            src: ME,
            dst: PEER,
            id: 0,
            dont_fragment: true,
        },
        sport,
        dport: PORT,
    };
    while start.elapsed() < Duration::from_secs(secs) {
        let t = start.elapsed();
        // The scripted active side.
        let rping = |qpn: u32, port: u16, sport: u16| {
            let mut p = ConnectParams::new(
                ME.into(),
                PEER.into(),
                service_id(PortSpace::Tcp, port),
                Qpn::new(qpn),
                Psn::new(0x12345 + qpn),
            );
            p.responder_resources = 1;
            p.initiator_depth = 1;
            p.private_data = cma_pd(sport);
            p
        };
        if scenario == 1 {
            if step == 0 && t > Duration::from_secs(4) {
                let id = ep.connect(now(), &rping(0x77, 7174, 0xd001)).unwrap();
                println!("probe: connect rping server as {id:?}");
                step = 1;
            } else if step == 1 && t > Duration::from_secs(7) {
                ep.connect(now(), &rping(0x78, 9999, 0xd002)).unwrap();
                let mut s = SidrRequestParams::new(PEER.into(), service_id(PortSpace::Udp, 7174));
                s.private_data = cma_pd(0xd003);
                ep.sidr_request(now(), &s).unwrap();
                step = 2;
            }
        } else if scenario == 3 {
            if step == 0 && t > Duration::from_secs(5) {
                let mut s = SidrRequestParams::new(PEER.into(), service_id(PortSpace::Udp, 7174));
                s.private_data = cma_pd(0xd021);
                ep.sidr_request(now(), &s).unwrap();
                step = 1;
            }
        } else if step == 0 && t > Duration::from_secs(6) {
            ep.connect(now(), &rping(0x77, 7174, 0xd011)).unwrap();
            duplicate_next_req = true;
            step = 1;
        } else if step == 2 && t > Duration::from_secs(9) {
            // Same QPN and GUID as the live connection: stale.
            ep.connect(now(), &rping(0x77, 7174, 0xd012)).unwrap();
            let mut p = rping(0x79, 7175, 0xd013);
            p.remote_gid = softhca_cm::Gid::from_ip(Ipv4Addr::new(10, 99, 0, 9).into());
            ep.connect(now(), &p).unwrap();
            step = 3;
        } else if step == 3 && t > Duration::from_secs(14) {
            let mut s = SidrRequestParams::new(PEER.into(), service_id(PortSpace::Udp, 7174));
            s.private_data = cma_pd(0xd014);
            ep.sidr_request(now(), &s).unwrap();
            step = 4;
        }
        if let Some((id, at)) = hangup {
            if t >= at {
                hangup = None;
                ep.disconnect(now(), id, &[]).unwrap();
            }
        }
        if ep.poll_timeout().is_some_and(|d| d <= now()) {
            ep.handle_timeout(now());
        }
        // Receive.
        if let Ok(n) = sock.recv(&mut batch) {
            for i in 0..n {
                let (meta, bytes) = batch.get(i);
                let Ok((h, range)) = parse(bytes) else {
                    continue;
                };
                if h.bth.opcode != Opcode::UD_SEND_ONLY || h.bth.dest_qp != Qpn::GSI {
                    println!(
                        "probe: non-CM packet {:?} to {} ({} bytes)",
                        h.bth.opcode, h.bth.dest_qp, meta.len
                    );
                    continue;
                }
                let Some(m) = bytes.get(range) else { continue };
                let d = describe(m);
                println!("probe: <- {} {d}", meta.src.ip());
                seen.push(format!("in {}", d.split(' ').next().unwrap_or("")));
                ep.handle_mad(now(), meta.src.ip(), meta.tos, m);
            }
        }
        while let Some(ev) = ep.poll_event() {
            println!("probe: event {ev:?}");
            match ev {
                CmEvent::RepReceived { id, .. } => {
                    ep.establish(now(), id, &[]).unwrap();
                    if scenario == 1 {
                        // Give the server time to see ESTABLISHED, then hang up.
                        hangup = Some((id, start.elapsed() + Duration::from_millis(1500)));
                    } else {
                        step = 2;
                    }
                }
                CmEvent::ReqReceived { id, req, .. } => {
                    println!("probe: cma_hdr {:?}", CmaHdr::parse(&req.private_data));
                    let mut a = AcceptParams::new(Qpn::new(0x99), Psn::new(0x777));
                    a.responder_resources = req.initiator_depth;
                    a.initiator_depth = req.responder_resources;
                    ep.accept(now(), id, &a).unwrap();
                }
                CmEvent::SidrReqReceived { id, req, .. } => {
                    println!("probe: cma_hdr {:?}", CmaHdr::parse(&req.private_data));
                    let p = softhca_cm::SidrReplyParams {
                        status: softhca_cm::SidrStatus::Success,
                        qpn: Qpn::new(0x9a),
                        qkey: RDMA_UDP_QKEY,
                        private_data: Vec::new(),
                    };
                    ep.sidr_reply(now(), id, &p).unwrap();
                }
                CmEvent::DreqReceived { id, .. } => {
                    ep.disconnect(now(), id, &[]).unwrap();
                }
                CmEvent::SidrRepReceived { rep, .. } => {
                    println!(
                        "probe: SIDR_REP qkey {:#x} (rdma_cm UD: {:#x})",
                        rep.qkey, RDMA_UDP_QKEY
                    );
                }
                _ => {}
            }
        }
        // Send.
        while let Some(Outgoing { dst, mad: m, .. }) = ep.poll_transmit() {
            assert_eq!(dst, IpAddr::V4(PEER));
            let mut h = Headers::new(Bth::new(Opcode::UD_SEND_ONLY, Qpn::GSI, Psn::new(psn)));
            psn = psn.wrapping_add(1);
            h.deth = Some(Deth {
                qkey: GSI_QKEY,
                src_qp: Qpn::GSI,
            });
            let mut buf = [0u8; 512];
            let n = emit_packet(&h, &m, &mut buf).unwrap();
            let n = seal(&flow(PORT), &mut buf, n).unwrap();
            debug_assert!(n == 12 + 8 + 256 + ICRC_LEN);
            let d = describe(&m);
            println!("probe: -> {dst} {d}");
            seen.push(format!("out {}", d.split(' ').next().unwrap_or("")));
            let copies = if duplicate_next_req && d.starts_with("REQ") {
                duplicate_next_req = false;
                2
            } else {
                1
            };
            for _ in 0..copies {
                sock.send(&[Transmit {
                    dst: SocketAddr::new(dst, PORT),
                    src_ip: None,
                    tos: 0,
                    contents: &buf[..n],
                    pieces: &[],
                    segment_size: None,
                }])
                .unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    println!("probe: summary {seen:?}");
    println!("probe: counters {:?}", ep.counters());
}
