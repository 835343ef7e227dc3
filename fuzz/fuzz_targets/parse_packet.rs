//! Fuzz the receive path of `softhca-wire`: parse a RoCE UDP payload, check its ICRC,
//! re-emit it and parse the result again; also parse the bytes as an IP packet and as an
//! Ethernet frame. Any panic is a bug (the crate promises none on any input).
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use softhca_wire::*;

fn flow() -> UdpPseudo {
    UdpPseudo {
        ip: IpPseudo::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            id: 0,
            dont_fragment: true,
        },
        sport: 0xc000,
        dport: ROCE_V2_UDP_PORT,
    }
}

fuzz_target!(|data: &[u8]| {
    let p = flow();
    let _ = verify(&p, data);
    let _ = verify_ipv4_any_id(&p, data, 1..3);
    if let Ok((h, range)) = parse(data) {
        assert!(range.start >= h.len() && range.end + ICRC_LEN <= data.len());
        let payload = &data[range.clone()];
        let mut buf = vec![0u8; data.len() + 8];
        let n = emit_packet(&h, payload, &mut buf).expect("parsed headers re-emit");
        let n = seal(&p, &mut buf, n).expect("room for the ICRC");
        assert!(verify(&p, &buf[..n]));
        let (h2, r2) = parse(&buf[..n]).expect("re-emitted packet parses");
        assert_eq!(h2, h);
        assert_eq!(&buf[r2], payload);
        // Same length as the input unless the input's pad count was not the minimal one.
        if usize::from(h.bth.pad_count) == usize::from(pad_count(payload.len())) {
            assert_eq!(n, data.len());
        }
    }
    if let Ok((pseudo, udp_payload)) = parse_ip_udp(data) {
        let icrc_ip = icrc_ip_packet(data);
        if let (Ok(c), Some(body)) = (
            icrc_ip,
            udp_payload.len().checked_sub(4).map(|n| &udp_payload[..n]),
        ) {
            // Both ICRC routes agree whenever the IPv4 reserved flag is clear.
            let evil = data.len() > 6 && data[0] >> 4 == 4 && data[6] & 0x80 != 0;
            if !evil {
                assert_eq!(c, icrc(&pseudo, body));
            }
        }
    }
    if let Ok((_, ip)) = EthernetHeader::parse(data) {
        let _ = parse_ip_udp(ip);
    }
});
