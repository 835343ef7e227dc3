//! Property tests: emit → parse round trips for every opcode, and no input panics.

use std::net::Ipv4Addr;

use proptest::prelude::*;
use softhca_wire::*;

fn opcode() -> impl Strategy<Value = Opcode> {
    let all: Vec<Opcode> = Opcode::all().collect();
    prop::sample::select(all)
}

prop_compose! {
    fn bth(op: Opcode)(solicited: bool, mig_req: bool, pkey: u16, fecn: bool, becn: bool,
                       qpn in 0u32..1 << 24, ack_req: bool, resv7 in 0u8..0x80,
                       psn in 0u32..1 << 24) -> Bth {
        Bth { opcode: op, solicited, mig_req, pad_count: 0, tver: 0, pkey, fecn, becn,
              dest_qp: Qpn::new(qpn), ack_req, resv7, psn: Psn::new(psn) }
    }
}

prop_compose! {
    /// Headers consistent with an arbitrary supported opcode.
    fn headers()(op in opcode())
               (bth in bth(op), va in any::<u64>(), rkey in any::<u32>(), len in any::<u32>(),
                syndrome in any::<u8>(), msn in 0u32..1 << 24, swap in any::<u64>(),
                cmp in any::<u64>(), orig in any::<u64>(), imm in any::<u32>(), inv in any::<u32>(),
                qkey in any::<u32>(), src in 0u32..1 << 24)
               -> Headers {
        let e = bth.opcode.ext();
        let mut h = Headers::new(bth);
        h.reth = e.contains(ExtHeaders::RETH).then_some(Reth { va, rkey, dma_len: len });
        h.aeth = e.contains(ExtHeaders::AETH).then_some(Aeth { syndrome, msn });
        h.atomic_eth = e.contains(ExtHeaders::ATOMIC_ETH)
            .then_some(AtomicEth { va, rkey, swap_add: swap, compare: cmp });
        h.atomic_ack_eth = e.contains(ExtHeaders::ATOMIC_ACK_ETH).then_some(AtomicAckEth { orig });
        h.imm_dt = e.contains(ExtHeaders::IMM_DT).then_some(imm);
        h.ieth = e.contains(ExtHeaders::IETH).then_some(inv);
        h.deth = e.contains(ExtHeaders::DETH).then_some(Deth { qkey, src_qp: Qpn::new(src) });
        h
    }
}

fn flow(id: u16) -> UdpPseudo {
    UdpPseudo {
        ip: IpPseudo::V4 {
            src: Ipv4Addr::new(192, 168, 1, 1),
            dst: Ipv4Addr::new(192, 168, 1, 2),
            id,
            dont_fragment: true,
        },
        sport: 0xd000,
        dport: ROCE_V2_UDP_PORT,
    }
}

proptest! {
    #[test]
    fn emit_parse_round_trip(h in headers(), data in prop::collection::vec(any::<u8>(), 0..600), id: u16) {
        let payload: &[u8] = if h.bth.opcode.has_payload() { &data } else { &[] };
        let mut buf = [0u8; 1024];
        let n = emit_packet(&h, payload, &mut buf).unwrap();
        prop_assert_eq!(n % 4, 0);
        prop_assert_eq!(n, h.len() + payload.len() + usize::from(pad_count(payload.len())));
        let n = seal(&flow(id), &mut buf, n).unwrap();
        let pkt = &buf[..n];
        prop_assert!(verify(&flow(id), pkt));
        let (parsed, range) = parse(pkt).unwrap();
        let mut want = h;
        want.bth.pad_count = pad_count(payload.len());
        prop_assert_eq!(parsed, want);
        prop_assert_eq!(&pkt[range], payload);
        // Headers alone round-trip too.
        let mut hb = [0u8; 64];
        let hl = want.emit(&mut hb).unwrap();
        prop_assert_eq!(hl, want.len());
        prop_assert_eq!(Headers::parse(&hb[..hl]).unwrap(), want);
        // Too small a buffer is an error, not a panic.
        prop_assert!(emit_packet(&h, payload, &mut buf[..n - 5]).is_err());
    }

    #[test]
    fn parse_arbitrary_bytes_never_panics(data in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok((h, range)) = parse(&data) {
            prop_assert!(range.end + 4 <= data.len());
            // A parsed packet re-emits to something that parses to the same headers.
            let mut buf = [0u8; 256];
            let n = emit_packet(&h, &data[range.clone()], &mut buf).unwrap();
            let n = seal(&flow(0), &mut buf, n).unwrap();
            let (h2, r2) = parse(&buf[..n]).unwrap();
            prop_assert_eq!(h2, h);
            prop_assert_eq!(&buf[r2], &data[range]);
        }
        let _ = verify(&flow(0), &data);
        let _ = verify_ipv4_any_id(&flow(0), &data, 1..4);
        let _ = icrc_ip_packet(&data);
        let _ = EthernetHeader::parse(&data);
        let _ = Headers::parse(&data);
    }

    #[test]
    fn opcode_byte_mutations_never_panic(h in headers(), op: u8, b1: u8) {
        let mut buf = [0u8; 128];
        let n = emit_packet(&h, &[], &mut buf).unwrap_or(0);
        buf[0] = op;
        buf[1] = b1;
        for len in 0..=n + 8 {
            let _ = parse(&buf[..len]);
        }
    }
}
