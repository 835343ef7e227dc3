//! The whole receive path: fuzzed packets, sealed with a valid ICRC so they get past it,
//! go into an engine with live RC and UD QPs, posted receives, outstanding sends and two
//! MRs (one read-only). Properties: no panic, and no byte outside the registered memory
//! changes (guard bands around each MR are checked after every input).
#![no_main]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use softhca_transport::*;
use softhca_wire::{seal, IpPseudo, UdpPseudo};

const GUARD: usize = 64;
const MR_LEN: usize = 4096;
const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn qp(e: &mut Engine, ty: QpType, pd: PdId, cq: CqId) -> Qpn {
    let init = QpInitAttr {
        qp_type: ty,
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: true,
    };
    e.create_qp(&init).expect("create_qp")
}

fn to_rts(e: &mut Engine, q: Qpn, ty: QpType) {
    if ty == QpType::Ud {
        e.ready_ud(0, q, 0x1111, 0).expect("UD to RTS");
        return;
    }
    let c = bringup::Connect {
        dest_qp_num: 0x22,
        rq_psn: 0,
        sq_psn: 0,
        av: AddressVector {
            dgid: Gid::from_ip(IpAddr::V4(PEER)),
            ..AddressVector::default()
        },
        path_mtu: Mtu::M1024,
        rd_atomic: 4,
        min_rnr_timer: 1,
        timeout: 1,
        retry_cnt: 2,
        rnr_retry: 2,
    };
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    e.connect_qp(0, q, access, &c).expect("RC to RTS");
}

fuzz_target!(|data: &[u8]| {
    // Two MRs, each with guard bands that must never change.
    let mut mem = vec![0x5au8; 2 * (MR_LEN + 2 * GUARD)];
    let base = mem.as_mut_ptr();
    let mut e = Engine::new(EngineConfig {
        gids: vec![Gid::from_ip(IpAddr::V4(LOCAL))],
        seed: 1,
        // Forged packets name QPs 0x11 and 0x12: the QPNs must not move.
        first_qpn: Some(0x11),
        ..EngineConfig::default()
    });
    let pd = e.memory_mut().alloc_pd();
    let cq = e.create_cq();
    let region = |i: usize| {
        // SAFETY: both regions lie inside `mem`, which outlives the engine (dropped first
        // at the end of this closure's caller).
        unsafe { base.add(i * (MR_LEN + 2 * GUARD) + GUARD) }
    };
    // SAFETY: `mem` outlives the engine and is not accessed while the engine runs.
    let rw = unsafe {
        e.memory_mut().register(
            pd,
            region(0),
            MR_LEN,
            0x1000,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
    }
    .expect("register rw");
    // SAFETY: as above.
    let _ro = unsafe {
        e.memory_mut()
            .register(pd, region(1), MR_LEN, 0x10_0000, AccessFlags::REMOTE_READ)
    }
    .expect("register ro");
    let rc = qp(&mut e, QpType::Rc, pd, cq);
    let ud = qp(&mut e, QpType::Ud, pd, cq);
    to_rts(&mut e, rc, QpType::Rc);
    to_rts(&mut e, ud, QpType::Ud);
    let sge = |off: u64, len: u32| Sge {
        addr: 0x1000 + off,
        length: len,
        lkey: rw.lkey,
    };
    for q in [rc, ud] {
        for i in 0..4 {
            let _ = e.post_recv(
                q,
                RecvWr {
                    wr_id: i,
                    sg_list: smallvec::smallvec![sge(i * 1024, 1024)],
                },
            );
        }
    }
    // Outstanding requests so that forged ACKs, NAKs and READ responses meet real state.
    let _ = e.post_send(
        0,
        rc,
        SendWr {
            wr_id: 100,
            opcode: WrOpcode::RdmaRead,
            flags: SendFlags::SIGNALED,
            payload: Payload::Sges(smallvec::smallvec![sge(2048, 2048)]),
            remote_addr: 0x5000,
            rkey: 0x1234,
            ..SendWr::default()
        },
    );
    let _ = e.post_send(
        0,
        rc,
        SendWr {
            wr_id: 101,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            payload: Payload::Sges(smallvec::smallvec![sge(0, 3000)]),
            ..SendWr::default()
        },
    );
    let mut tx = vec![0u8; 65536];
    while e.poll_transmit(0, &mut tx).is_some() {}

    // Input: a sequence of [len: u16 LE][len bytes] packets (BTH onwards, no ICRC).
    let pseudo = UdpPseudo {
        ip: IpPseudo::V4 {
            src: PEER,
            dst: LOCAL,
            id: 0,
            dont_fragment: true,
        },
        sport: 0xc000,
        dport: 4791,
    };
    let info = DatagramInfo {
        src: SocketAddr::new(IpAddr::V4(PEER), 0xc000),
        dst: IpAddr::V4(LOCAL),
        segment_index: 0,
        tos: 0,
    };
    let mut pkt = vec![0u8; 8192];
    let mut rest = data;
    let mut now = 0u64;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])) % 4200;
        rest = &rest[2..];
        let body = &rest[..len.min(rest.len())];
        rest = &rest[body.len()..];
        pkt[..body.len()].copy_from_slice(body);
        let Ok(total) = seal(&pseudo, &mut pkt, body.len()) else {
            continue;
        };
        e.handle_datagram(now, &info, &pkt[..total]);
        now += 1_000_000;
        e.handle_timeout(now);
        while e.poll_transmit(now, &mut tx).is_some() {}
        while e.poll_completion().is_some() {}
        while e.poll_event().is_some() {}
    }
    drop(e);
    for i in 0..2 {
        let start = i * (MR_LEN + 2 * GUARD);
        let before = &mem[start..start + GUARD];
        let after = &mem[start + GUARD + MR_LEN..start + 2 * GUARD + MR_LEN];
        assert!(
            before.iter().chain(after).all(|&b| b == 0x5a),
            "write outside registered memory"
        );
        if i == 1 {
            let ro = &mem[start + GUARD..start + GUARD + MR_LEN];
            assert!(ro.iter().all(|&b| b == 0x5a), "read-only MR written");
        }
    }
});
