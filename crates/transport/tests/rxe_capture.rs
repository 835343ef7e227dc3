//! Packets captured from Linux rxe (../../shared/data/roce) are accepted: the ICRC with
//! rxe's non-zero IPv4 IDs, the RC SEND sequence, the UD SEND with its GRH.

mod sim;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use sim::*;
use softhca_transport::bringup;
use softhca_transport::*;

struct Frame {
    src: SocketAddr,
    dst: IpAddr,
    payload: Vec<u8>,
}

/// Minimal pcapng reader: Ethernet/IPv4/UDP frames from Enhanced Packet Blocks.
fn frames() -> Vec<Frame> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/roce/rxe-rc-send-ud-send.pcapng"
    );
    let Ok(d) = std::fs::read(path) else {
        return Vec::new();
    };
    let u32le = |i: usize| u32::from_le_bytes(d[i..i + 4].try_into().unwrap()) as usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i + 8 <= d.len() {
        let (t, l) = (u32le(i), u32le(i + 4));
        if t == 6 {
            let cap = u32le(i + 20);
            let pkt = &d[i + 28..i + 28 + cap];
            let ip = &pkt[14..];
            let ihl = usize::from(ip[0] & 15) * 4;
            let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            let udp = &ip[ihl..];
            let sport = u16::from_be_bytes([udp[0], udp[1]]);
            let ulen = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
            out.push(Frame {
                src: SocketAddr::new(src.into(), sport),
                dst: dst.into(),
                payload: udp[8..ulen].to_vec(),
            });
        }
        if l == 0 {
            break;
        }
        i += l;
    }
    out
}

fn engine_with_qpn(want: u32, ty: QpType) -> (Engine, Qpn, PdId, CqId) {
    let mut e = Engine::new(EngineConfig {
        gids: vec![Gid::from_ip("10.99.0.1".parse().unwrap())],
        first_qpn: Some(0x11),
        ..EngineConfig::default()
    });
    let pd = e.memory_mut().alloc_pd();
    let cq = e.create_cq();
    let init = QpInitAttr {
        qp_type: ty,
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    loop {
        let q = e.create_qp(&init).unwrap();
        if q.value() == want {
            return (e, q, pd, cq);
        }
        assert!(q.value() < want);
    }
}

/// An engine with RC QP 0x123 in RTR, connected to the captured rxe QP, one receive of
/// 8 KiB posted into `buf`.
fn rc_receiver(buf: &mut [u8]) -> (Engine, Qpn) {
    let (mut e, q, pd, _cq) = engine_with_qpn(0x123, QpType::Rc);
    // SAFETY: `buf` outlives the engine's use of it in this test and is not touched
    // while the engine may write it.
    let keys = unsafe {
        e.memory_mut().register(
            pd,
            buf.as_mut_ptr(),
            buf.len(),
            buf.as_ptr() as u64,
            AccessFlags::LOCAL_WRITE,
        )
    }
    .unwrap();
    // Stopped in RTR: the captured rxe requester's packets arrive, nothing is sent.
    let (a, m) = bringup::init(QpType::Rc, AccessFlags::empty(), 0);
    e.modify_qp(0, q, &a, m).unwrap();
    let c = bringup::Connect {
        dest_qp_num: 0x456,
        rq_psn: 0x2facfa,
        sq_psn: 0,
        av: AddressVector {
            dgid: Gid::from_ip("10.99.0.2".parse().unwrap()),
            ..AddressVector::default()
        },
        path_mtu: Mtu::M1024,
        rd_atomic: 0,
        min_rnr_timer: 0,
        timeout: 0,
        retry_cnt: 0,
        rnr_retry: 0,
    };
    let (a, m) = c.rtr(QpType::Rc);
    e.modify_qp(0, q, &a, m).unwrap();
    let sge = Sge {
        addr: buf.as_ptr() as u64,
        length: 8192,
        lkey: keys.lkey,
    };
    e.post_recv(q, recv_wr(1, smallvec::smallvec![sge]))
        .unwrap();
    (e, q)
}

#[test]
fn rxe_ipv4_ids_slightly_out_of_order_are_accepted() {
    let f = frames();
    if f.is_empty() {
        eprintln!("capture not found; skipping");
        return;
    }
    let mut buf = vec![0u8; 8192];
    let (mut e, _q) = rc_receiver(&mut buf);
    // rxe takes IPv4 IDs when it builds packets, so an ACK built later can leave first
    // and the next data packet arrives with a lower ID (seen against kernel 6.1).
    for (fr, id) in f[..4].iter().zip([0x7d23u16, 0x7d22, 0x7d24, 0x7d25]) {
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (fr.src.ip(), fr.dst) else {
            panic!("IPv4 capture")
        };
        let pseudo = softhca_wire::UdpPseudo {
            ip: softhca_wire::IpPseudo::V4 {
                src,
                dst,
                id,
                dont_fragment: true,
            },
            sport: fr.src.port(),
            dport: 4791,
        };
        let mut p = fr.payload.clone();
        let body = p.len() - 4;
        softhca_wire::seal(&pseudo, &mut p, body).unwrap();
        let info = DatagramInfo {
            src: fr.src,
            dst: fr.dst,
            segment_index: 0,
            tos: 0,
        };
        e.handle_datagram(0, &info, &p);
    }
    assert_eq!(e.counters().drop_bad_icrc, 0);
    assert_eq!(e.counters().rcvd_pkts, 4);
    assert_eq!(e.counters().out_of_seq_request, 0);
    assert!(e.poll_completion().is_some());
}

#[test]
fn rxe_rc_send_is_received_and_acked() {
    let f = frames();
    if f.is_empty() {
        eprintln!("capture not found; skipping");
        return;
    }
    let mut buf = vec![0u8; 8192];
    let (mut e, _q) = rc_receiver(&mut buf);
    for fr in &f[..4] {
        let info = DatagramInfo {
            src: fr.src,
            dst: fr.dst,
            segment_index: 0,
            tos: 0,
        };
        e.handle_datagram(0, &info, &fr.payload);
    }
    assert_eq!(
        e.counters().drop_bad_icrc,
        0,
        "rxe's ICRC with its IPv4 IDs verifies"
    );
    assert_eq!(e.counters().rcvd_pkts, 4);
    // The first packet's unseen IPv4 ID is solved for; the next three are predicted.
    assert_eq!(e.counters().icrc_ipv4_id_resync, 1);
    let (_, c) = e.poll_completion().unwrap();
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (1, WcStatus::Success, 4096)
    );
    // The data is the SEND's payload.
    let payloads: Vec<u8> = f[..4]
        .iter()
        .flat_map(|fr| fr.payload[12..fr.payload.len() - 4].to_vec())
        .collect();
    assert!(buf[..4096] == payloads[..]);
    // One coalesced ACK for the message, to rxe at 4791.
    let mut out = vec![0u8; 4096];
    let t = e.poll_transmit(0, &mut out).unwrap();
    assert_eq!(
        (t.len, t.dst),
        (20, SocketAddr::new("10.99.0.2".parse().unwrap(), 4791))
    );
    assert_eq!(out[0], 0x11);
    assert_eq!(&out[9..12], &[0x2f, 0xac, 0xfd]);
    assert!(e.poll_transmit(0, &mut out).is_none());
}

#[test]
fn rxe_ud_send_gets_grh() {
    let f = frames();
    if f.len() < 5 {
        return;
    }
    let (mut e, q, pd, _cq) = engine_with_qpn(0x123, QpType::Ud);
    let mut buf = vec![0u8; 2048];
    // SAFETY: as above.
    let keys = unsafe {
        e.memory_mut().register(
            pd,
            buf.as_mut_ptr(),
            buf.len(),
            buf.as_ptr() as u64,
            AccessFlags::LOCAL_WRITE,
        )
    }
    .unwrap();
    let qkey = u32::from_be_bytes(f[4].payload[12..16].try_into().unwrap());
    let (a, m) = bringup::init(QpType::Ud, AccessFlags::empty(), qkey);
    e.modify_qp(0, q, &a, m).unwrap();
    let (a, m) = bringup::ud_rtr();
    e.modify_qp(0, q, &a, m).unwrap();
    let sge = Sge {
        addr: buf.as_ptr() as u64,
        length: 2048,
        lkey: keys.lkey,
    };
    e.post_recv(q, recv_wr(3, smallvec::smallvec![sge]))
        .unwrap();
    let fr = &f[4];
    e.handle_datagram(
        0,
        &DatagramInfo {
            src: fr.src,
            dst: fr.dst,
            segment_index: 0,
            tos: 0,
        },
        &fr.payload,
    );
    let (_, c) = e.poll_completion().expect("UD receive");
    assert_eq!((c.status, c.byte_len), (WcStatus::Success, 512 + 40));
    assert!(c.wc_flags.contains(WcFlags::GRH));
    assert_eq!(&buf[32..36], &[10, 99, 0, 2], "source address in the GRH");
}
