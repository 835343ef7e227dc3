//! The packets Linux rxe put on the wire (tests/data/rxe-rc-send-ud-send.pcapng, see
//! /work/shared/data/roce/README.md): parse them, reproduce their ICRC both ways, and
//! re-emit them bit for bit.

use std::net::Ipv4Addr;

use softhca_wire::*;

const CAPTURE: &[u8] = include_bytes!("data/rxe-rc-send-ud-send.pcapng");

/// The packet data of every Enhanced Packet Block of a little-endian pcapng file.
fn pcapng_frames(file: &[u8]) -> Vec<&[u8]> {
    let u32_at = |at: usize| u32::from_le_bytes(file[at..at + 4].try_into().unwrap()) as usize;
    // Section header block: type 0x0A0D0D0A, byte-order magic 0x1A2B3C4D little-endian.
    assert_eq!(u32_at(0), 0x0A0D_0D0A);
    assert_eq!(u32_at(8), 0x1A2B_3C4D, "big-endian pcapng not handled");
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 12 <= file.len() {
        let (kind, len) = (u32_at(at), u32_at(at + 4));
        assert!(
            len >= 12 && at + len <= file.len(),
            "bad block length {len} at {at}"
        );
        if kind == 6 {
            // EPB: interface id, timestamp high, timestamp low, captured length, original length, data.
            let cap = u32_at(at + 20);
            frames.push(&file[at + 28..at + 28 + cap]);
        }
        at += len;
    }
    frames
}

struct Frame<'a> {
    eth: EthernetHeader,
    ipv4: Ipv4Header,
    udp: UdpHeader,
    ip_packet: &'a [u8],
    pseudo: UdpPseudo,
    udp_payload: &'a [u8],
}

fn decode(frame: &[u8]) -> Frame<'_> {
    let (eth, ip_packet) = EthernetHeader::parse(frame).unwrap();
    assert_eq!(eth.ethertype, ETHERTYPE_IPV4);
    let (ipv4, datagram) = Ipv4Header::parse(ip_packet).unwrap();
    let (udp, _) = UdpHeader::parse(datagram).unwrap();
    let (pseudo, udp_payload) = parse_ip_udp(ip_packet).unwrap();
    Frame {
        eth,
        ipv4,
        udp,
        ip_packet,
        pseudo,
        udp_payload,
    }
}

#[test]
fn five_frames_parse_as_rxe_sent_them() {
    let frames = pcapng_frames(CAPTURE);
    assert_eq!(frames.len(), 5);
    let expected = [
        (Opcode::RC_SEND_FIRST, 3124474, false, 1024),
        (Opcode::RC_SEND_MIDDLE, 3124475, false, 1024),
        (Opcode::RC_SEND_MIDDLE, 3124476, false, 1024),
        (Opcode::RC_SEND_LAST, 3124477, true, 1024),
        (Opcode::UD_SEND_ONLY, 12317511, false, 512),
    ];
    for (i, (frame, &(op, psn, ack_req, paylen))) in frames.iter().zip(&expected).enumerate() {
        let f = decode(frame);
        assert_eq!(f.ipv4.src, Ipv4Addr::new(10, 99, 0, 2), "frame {i}");
        assert_eq!(f.ipv4.dst, Ipv4Addr::new(10, 99, 0, 1));
        assert_eq!(f.udp.dport, ROCE_V2_UDP_PORT);
        let (h, payload) = parse(f.udp_payload).unwrap();
        assert_eq!(h.bth.opcode, op, "frame {i}");
        assert_eq!(h.bth.psn, Psn::new(psn));
        assert_eq!(h.bth.ack_req, ack_req);
        assert_eq!(h.bth.dest_qp, Qpn::new(0x000123));
        assert_eq!(h.bth.pkey, 0xffff);
        assert_eq!(
            (h.bth.pad_count, h.bth.tver, h.bth.solicited, h.bth.mig_req),
            (0, 0, false, false)
        );
        assert_eq!(payload.len(), paylen);
        assert_eq!(payload, op.header_len()..op.header_len() + paylen);
        assert_eq!(f.udp_payload.len(), op.header_len() + paylen + ICRC_LEN);
    }
    // PSNs of the RC message are consecutive.
    let psns: Vec<Psn> = frames[..4]
        .iter()
        .map(|f| parse(decode(f).udp_payload).unwrap().0.bth.psn)
        .collect();
    assert!(psns.windows(2).all(|w| w[1].diff(w[0]) == 1));

    // The UD frame: DETH with the Q_Key of ibv_ud_pingpong and source QP 0x12.
    let ud = decode(frames[4]);
    let (h, _) = parse(ud.udp_payload).unwrap();
    assert_eq!(
        h.deth,
        Some(Deth {
            qkey: 0x1111_1111,
            src_qp: Qpn::new(0x12)
        })
    );
    assert_eq!((h.reth, h.aeth, h.imm_dt), (None, None, None));
}

#[test]
fn udp_source_ports_follow_rxe() {
    let frames = pcapng_frames(CAPTURE);
    // UD QP 0x12 keeps its create-time port: 0xC000 + hash_32(qpn, 14).
    let ud = decode(frames[4]);
    assert_eq!(ud.udp.sport, rxe_udp_sport(Qpn::new(0x12)));
    // RC QP (0x11, the first QP rxe hands out) -> 0x123 got rdma_get_udp_sport(0, 0x11, 0x123)
    // when ibv_rc_pingpong moved it to RTR with a GRH.
    for f in &frames[..4] {
        assert_eq!(
            decode(f).udp.sport,
            rdma_udp_sport(0, Qpn::new(0x11), Qpn::new(0x123))
        );
    }
}

#[test]
fn icrc_reproduced_both_ways() {
    for (i, frame) in pcapng_frames(CAPTURE).into_iter().enumerate() {
        let f = decode(frame);
        let stored = stored_icrc_ip_packet(f.ip_packet).unwrap();
        let (body, trailer) = f.udp_payload.split_at(f.udp_payload.len() - 4);
        assert_eq!(stored, u32::from_le_bytes(trailer.try_into().unwrap()));
        assert_eq!(
            icrc_ip_packet(f.ip_packet).unwrap(),
            stored,
            "frame {i}: masked IP packet"
        );
        assert_eq!(
            icrc(&f.pseudo, body),
            stored,
            "frame {i}: rebuilt pseudo header"
        );
        assert!(verify(&f.pseudo, f.udp_payload));
        // rxe used non-zero IPv4 IDs (__ip_select_ident); recoverable from nearby candidates.
        let IpPseudo::V4 { id, .. } = f.pseudo.ip else {
            panic!("IPv4 capture")
        };
        assert_ne!(id, 0);
        let blind = f.pseudo.with_ipv4_id(0);
        assert!(!verify(&blind, f.udp_payload));
        assert_eq!(
            verify_ipv4_any_id(
                &blind,
                f.udp_payload,
                id.wrapping_sub(3)..id.wrapping_add(3)
            ),
            Some(id)
        );
        // With no candidate at all, the ID is recovered by solving the affine CRC system.
        assert_eq!(solve_ipv4_id(&blind, f.udp_payload), Some(id));
        // A flipped payload bit is caught.
        let mut bad = f.udp_payload.to_vec();
        bad[40] ^= 1;
        assert!(!verify(&f.pseudo, &bad));
    }
}

#[test]
fn re_emit_is_bit_exact() {
    for (i, frame) in pcapng_frames(CAPTURE).into_iter().enumerate() {
        let f = decode(frame);
        let pkt = Packet::parse(f.udp_payload).unwrap();
        // RoCE: headers + payload + pad, then the ICRC.
        let mut roce = vec![0u8; f.udp_payload.len()];
        let n = pkt.emit(&mut roce).unwrap();
        let n = seal(&f.pseudo, &mut roce, n).unwrap();
        assert_eq!(&roce[..n], f.udp_payload, "frame {i}: UDP payload");
        // The whole frame, IPv4 checksum recomputed.
        let mut out = vec![0u8; frame.len()];
        let mut at = f.eth.emit(&mut out).unwrap();
        at += f.ipv4.emit(&mut out[at..]).unwrap();
        at += f.udp.emit(&mut out[at..]).unwrap();
        out[at..at + n].copy_from_slice(&roce[..n]);
        assert_eq!(at + n, frame.len());
        assert_eq!(out, frame, "frame {i}: Ethernet frame");
    }
}
