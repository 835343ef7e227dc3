//! CM MADs exchanged with the Linux kernel's rdma_cm over kernel rxe
//! (`data/kernel-cm.pcap`): every one decodes and re-encodes bit for bit, and the kernel's
//! answers say what its cm.c/cma.c put on the wire.
//!
//! The capture was made with the `kernel_probe` example on the host side of
//! `shared/tools/rxe-vm` (10.99.0.1; kernel 6.1 rxe at 10.99.0.2 running `rping -s` and
//! `rping -c -a 10.99.0.1`), with `tcpdump -i tap0 udp port 4791`:
//! our REQ → kernel REP → our RTU → our DREQ → kernel DREP; our REQ to a port nobody
//! listens on → kernel REJ 8; our SIDR_REQ → kernel SIDR_REP; kernel REQ → our REP →
//! kernel RTU (then the kernel's RC sends to the QPN we faked, which nobody answers).

use std::net::IpAddr;

use softhca_cm::ip::{service_id, CmaHdr, PortSpace};
use softhca_cm::mad::{self, CmBody, MsgResponse, GSI_QKEY};
use softhca_cm::{RejReason, SidrStatus};
use softhca_wire::{parse, parse_ip_udp, verify, Opcode, Qpn, ETHERNET_LEN};

const CAPTURE: &[u8] = include_bytes!("data/kernel-cm.pcap");

/// Frames of a classic little-endian pcap file (what `tcpdump -w` writes).
fn pcap_frames(file: &[u8]) -> Vec<&[u8]> {
    let u32_at = |at: usize| u32::from_le_bytes(file[at..at + 4].try_into().unwrap());
    assert_eq!(u32_at(0), 0xa1b2_c3d4, "classic little-endian pcap");
    assert_eq!(u32_at(20), 1, "Ethernet link type");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= file.len() {
        let caplen = u32_at(at + 8) as usize;
        let origlen = u32_at(at + 12) as usize;
        assert_eq!(caplen, origlen, "no frame was cut by the snap length");
        out.push(&file[at + 16..at + 16 + caplen]);
        at += 16 + caplen;
    }
    assert_eq!(at, file.len());
    out
}

struct Mad {
    src: IpAddr,
    bytes: [u8; 256],
    msg: mad::CmMessage,
}

fn cm_mads(capture: &[u8]) -> Vec<Mad> {
    let mut out = Vec::new();
    for frame in pcap_frames(capture) {
        let (pseudo, udp) = parse_ip_udp(&frame[ETHERNET_LEN..]).unwrap();
        // Both directions carry a valid ICRC: the kernel accepted ours, and we check theirs.
        assert!(verify(&pseudo, udp), "ICRC");
        let (h, range) = parse(udp).unwrap();
        if h.bth.opcode != Opcode::UD_SEND_ONLY {
            continue;
        }
        assert_eq!(h.bth.dest_qp, Qpn::GSI);
        let deth = h.deth.unwrap();
        assert_eq!((deth.qkey, deth.src_qp), (GSI_QKEY, Qpn::GSI));
        assert_eq!(h.bth.pkey, 0xffff);
        let bytes: [u8; 256] = udp[range].try_into().unwrap();
        let msg = mad::parse(&bytes).unwrap();
        let src = match pseudo.ip {
            softhca_wire::IpPseudo::V4 { src, .. } => IpAddr::V4(src),
            softhca_wire::IpPseudo::V6 { src, .. } => IpAddr::V6(src),
        };
        out.push(Mad { src, bytes, msg });
    }
    out
}

fn kernel() -> IpAddr {
    [10, 99, 0, 2].into()
}

#[test]
fn every_cm_mad_reencodes_bit_for_bit() {
    let mads = cm_mads(CAPTURE);
    let names: Vec<(bool, &str)> = mads
        .iter()
        .map(|m| (m.src == kernel(), m.msg.body.name()))
        .collect();
    assert_eq!(
        names,
        vec![
            (false, "REQ"),
            (true, "REP"),
            (false, "RTU"),
            (false, "DREQ"),
            (true, "DREP"),
            (false, "REQ"),
            (false, "SIDR_REQ"),
            (true, "REJ"),
            (true, "SIDR_REP"),
            (true, "REQ"),
            (false, "REP"),
            (true, "RTU"),
        ]
    );
    for m in &mads {
        let mut out = [0u8; 256];
        mad::emit(&m.msg, &mut out).unwrap();
        assert_eq!(out, m.bytes, "{} from {}", m.msg.body.name(), m.src);
    }
}

#[test]
fn what_the_kernel_said() {
    let mads = cm_mads(CAPTURE);
    let ours = |name: &str| {
        mads.iter()
            .find(|m| m.src != kernel() && m.msg.body.name() == name)
            .unwrap()
    };
    let theirs = |name: &str| {
        mads.iter()
            .find(|m| m.src == kernel() && m.msg.body.name() == name)
            .unwrap()
    };
    let CmBody::Req(our_req) = ours("REQ").msg.body else {
        panic!()
    };

    // REP to our REQ: echoes the TID, names our comm ID, rxe's ack delay 15.
    let rep = theirs("REP");
    assert_eq!(rep.msg.hdr.tid, ours("REQ").msg.hdr.tid);
    let CmBody::Rep(r) = rep.msg.body else {
        panic!()
    };
    assert_eq!(r.remote_comm_id, our_req.local_comm_id);
    assert_eq!(r.target_ack_delay, 15);
    assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));

    // DREP to our DREQ.
    let CmBody::Drep(d) = theirs("DREP").msg.body else {
        panic!()
    };
    assert_eq!(
        (d.local_comm_id, d.remote_comm_id),
        (r.local_comm_id, our_req.local_comm_id)
    );

    // No listener: REJ 8 for the REQ, LocalCommID 0 (`cm_issue_rej`).
    let CmBody::Rej(j) = theirs("REJ").msg.body else {
        panic!()
    };
    assert_eq!(j.reason, RejReason::InvalidServiceId);
    assert_eq!((j.local_comm_id, j.msg_rejected), (0, MsgResponse::Req));

    // SIDR_REP for the SIDR_REQ; nothing listened on UDP 7174 (udaddy had been started
    // with `-s`, which names the server for a client): status 1, unsupported.
    let CmBody::SidrRep(s) = theirs("SIDR_REP").msg.body else {
        panic!()
    };
    let CmBody::SidrReq(sq) = ours("SIDR_REQ").msg.body else {
        panic!()
    };
    assert_eq!(s.request_id, sq.request_id);
    assert_eq!(s.service_id, service_id(PortSpace::Udp, 7174));
    assert_eq!(s.status, SidrStatus::Unsupported);

    // The kernel's own REQ (rping -c): what cma_connect_ib and cm_format_req put there.
    let CmBody::Req(k) = theirs("REQ").msg.body else {
        panic!()
    };
    assert_eq!(k.service_id, service_id(PortSpace::Tcp, 7174));
    assert_eq!(
        (
            k.remote_cm_response_timeout,
            k.local_cm_response_timeout,
            k.max_cm_retries
        ),
        (20, 20, 15)
    );
    assert_eq!((k.retry_count, k.rnr_retry_count, k.path_mtu), (7, 7, 3));
    assert_eq!(k.pkey, 0xffff);
    assert_eq!(
        (k.primary.local_lid, k.primary.remote_lid),
        (0xffff, 0xffff)
    );
    assert_eq!(k.primary.local_gid.to_ip(), kernel());
    assert_eq!(k.primary.remote_gid.to_ip(), IpAddr::from([10, 99, 0, 1]));
    assert_eq!(k.primary.hop_limit, 64);
    // cm_ack_timeout(rxe ack delay 15, CMA_IBOE_PACKET_LIFETIME 18) = 19: kernel 6.1.
    assert_eq!(k.primary.local_ack_timeout, 19);
    assert!(!k.primary.subnet_local);
    assert_eq!(k.alternate, mad::ReqPath::default());
    let h = CmaHdr::parse(&k.private_data).unwrap();
    assert_eq!(
        (h.version, h.src, h.dst),
        (0, kernel(), IpAddr::from([10, 99, 0, 1]))
    );
    // Flow label from the ports: (sport × 31 + dport) & 0xFFFFF (cma.c,
    // `cma_get_roce_udp_flow_label`).
    assert_eq!(
        k.primary.flow_label,
        (u32::from(h.src_port) * 31 + 7174) & 0xfffff
    );

    // The kernel's RTU for our REP.
    let CmBody::Rtu(t) = theirs("RTU").msg.body else {
        panic!()
    };
    let CmBody::Rep(our_rep) = ours("REP").msg.body else {
        panic!()
    };
    assert_eq!(
        (t.local_comm_id, t.remote_comm_id),
        (k.local_comm_id, our_rep.local_comm_id)
    );
}

/// Second session (`kernel_probe --scenario 2`; guest: `rping -s` on 7174 and 7175).
const CAPTURE_2: &[u8] = include_bytes!("data/kernel-cm-2.pcap");

#[test]
fn second_capture_reencodes_bit_for_bit() {
    let mads = cm_mads(CAPTURE_2);
    let names: Vec<(bool, &str)> = mads
        .iter()
        .map(|m| (m.src == kernel(), m.msg.body.name()))
        .collect();
    assert_eq!(
        names,
        vec![
            (false, "REQ"),
            (false, "REQ"),
            (true, "MRA"),
            (true, "REP"),
            (false, "RTU"),
            (false, "REQ"),
            (false, "REQ"),
            (true, "REJ"),
            (true, "DREQ"),
            (false, "DREP"),
            (true, "REJ"),
            (false, "SIDR_REQ"),
            (true, "SIDR_REP"),
        ]
    );
    for m in &mads {
        let mut out = [0u8; 256];
        mad::emit(&m.msg, &mut out).unwrap();
        assert_eq!(out, m.bytes, "{} from {}", m.msg.body.name(), m.src);
    }
}

#[test]
fn kernel_mra_stale_dreq_and_invalid_gid() {
    let mads = cm_mads(CAPTURE_2);
    let from_kernel: Vec<&Mad> = mads.iter().filter(|m| m.src == kernel()).collect();
    let ours: Vec<&Mad> = mads.iter().filter(|m| m.src != kernel()).collect();
    let CmBody::Req(req1) = ours[0].msg.body else {
        panic!()
    };
    assert_eq!(ours[0].bytes, ours[1].bytes, "the REQ sent twice");

    // The duplicate REQ found the connection in MRA_REQ_SENT (rdma_cm's
    // `ib_send_cm_mra(IB_CM_MRA_FLAG_DELAY | 24)`): MRA for the REQ, timeout 24.
    let CmBody::Mra(mra) = from_kernel[0].msg.body else {
        panic!()
    };
    assert_eq!(mra.msg_mraed, MsgResponse::Req);
    assert_eq!(mra.service_timeout, 24);
    assert_eq!(mra.remote_comm_id, req1.local_comm_id);
    assert_eq!(from_kernel[0].msg.hdr.tid, ours[0].msg.hdr.tid);
    let CmBody::Rep(rep) = from_kernel[1].msg.body else {
        panic!()
    };
    assert_eq!(rep.local_comm_id, mra.local_comm_id);

    // A second REQ from the same QPN and CA GUID while the first lives: REJ 10 for it
    // and a DREQ for the first connection, naming our QPN (`cm_match_req`).
    let CmBody::Req(req2) = ours[3].msg.body else {
        panic!()
    };
    assert_eq!(req2.local_qpn, req1.local_qpn);
    let CmBody::Rej(stale) = from_kernel[2].msg.body else {
        panic!()
    };
    assert_eq!(stale.reason, RejReason::StaleConn);
    assert_eq!(
        (stale.local_comm_id, stale.remote_comm_id),
        (0, req2.local_comm_id)
    );
    let CmBody::Dreq(dreq) = from_kernel[3].msg.body else {
        panic!()
    };
    assert_eq!(
        (dreq.local_comm_id, dreq.remote_comm_id, dreq.remote_qpn),
        (rep.local_comm_id, req1.local_comm_id, req1.local_qpn)
    );

    // A REQ naming a GID the kernel does not have: REJ 12 with the port's GID 0 as ARI.
    let CmBody::Req(req3) = ours[4].msg.body else {
        panic!()
    };
    assert_eq!(
        req3.primary.remote_gid.to_ip(),
        IpAddr::from([10, 99, 0, 9])
    );
    let CmBody::Rej(badgid) = from_kernel[4].msg.body else {
        panic!()
    };
    assert_eq!(badgid.reason, RejReason::InvalidGid);
    assert_eq!(badgid.remote_comm_id, req3.local_comm_id);
    assert_eq!(badgid.ari_len, 16);
    assert_eq!(&badgid.ari[..2], &[0xfe, 0x80], "GID 0: the link-local one");
}

/// Third session (`kernel_probe --scenario 3`; guest: `udaddy -b 10.99.0.2`, then
/// `udaddy -s 10.99.0.1 -C 1`).
const CAPTURE_3: &[u8] = include_bytes!("data/kernel-cm-3.pcap");

#[test]
fn sidr_both_ways_with_the_kernel() {
    let mads = cm_mads(CAPTURE_3);
    let names: Vec<(bool, &str)> = mads
        .iter()
        .map(|m| (m.src == kernel(), m.msg.body.name()))
        .collect();
    assert_eq!(
        names,
        vec![
            (false, "SIDR_REQ"),
            (true, "SIDR_REP"),
            (true, "SIDR_REQ"),
            (false, "SIDR_REP"),
        ]
    );
    for m in &mads {
        let mut out = [0u8; 256];
        mad::emit(&m.msg, &mut out).unwrap();
        assert_eq!(out, m.bytes, "{} from {}", m.msg.body.name(), m.src);
    }
    // udaddy's answer: success, its UD QPN, rdma_cm's UD Q_Key (`cma_send_sidr_rep`).
    let CmBody::SidrRep(rep) = mads[1].msg.body else {
        panic!()
    };
    let CmBody::SidrReq(req) = mads[0].msg.body else {
        panic!()
    };
    assert_eq!(rep.request_id, req.request_id);
    assert_eq!(rep.status, SidrStatus::Success);
    assert_eq!(rep.qkey, softhca_cm::ip::RDMA_UDP_QKEY);
    assert_ne!(rep.qpn, Qpn::new(0));
    assert_eq!(mads[1].msg.hdr.tid, mads[0].msg.hdr.tid);

    // The kernel's SIDR_REQ: cma_hdr first, service ID of UDP port 7174.
    let CmBody::SidrReq(k) = mads[2].msg.body else {
        panic!()
    };
    assert_eq!(
        (k.service_id, k.pkey),
        (service_id(PortSpace::Udp, 7174), 0xffff)
    );
    let h = CmaHdr::parse(&k.private_data).unwrap();
    assert_eq!(
        (h.version, h.src, h.dst),
        (0, kernel(), IpAddr::from([10, 99, 0, 1]))
    );

    // Our SIDR_REP was understood: udaddy's first datagram goes to the QPN and Q_Key we
    // named.
    let CmBody::SidrRep(ours) = mads[3].msg.body else {
        panic!()
    };
    let data: Vec<_> = pcap_frames(CAPTURE_3)
        .into_iter()
        .filter_map(|f| {
            let (_, udp) = parse_ip_udp(&f[ETHERNET_LEN..]).ok()?;
            let (h, _) = parse(udp).ok()?;
            (h.bth.opcode != Opcode::UD_SEND_ONLY).then_some(h)
        })
        .collect();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0].bth.dest_qp, ours.qpn);
    assert_eq!(data[0].deth.unwrap().qkey, ours.qkey);
}
