//! Regression guards for the per-packet wire work: the ICRC (IBTA A17.3.3) per packet size
//! over IPv4 and IPv6, its slow paths (unknown IPv4 ID), header parse and packet build.
//!
//! Run: `cargo bench -p softhca-wire` (add `-- --quick` or
//! `-- --warm-up-time 1 --measurement-time 2` for a short check).
//! Throughput is in bytes of RoCE UDP payload (BTH .. ICRC), the bytes a receiver checks.

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use softhca_wire::*;

/// Payload sizes: a small message, and the 256 / 1024 / 4096 path MTUs.
const SIZES: [usize; 4] = [64, 256, 1024, 4096];

fn flow_v4(id: u16) -> UdpPseudo {
    UdpPseudo {
        ip: IpPseudo::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            id,
            dont_fragment: true,
        },
        sport: rxe_udp_sport(Qpn::new(0x11)),
        dport: ROCE_V2_UDP_PORT,
    }
}

fn flow_v6() -> UdpPseudo {
    UdpPseudo {
        ip: IpPseudo::V6 {
            src: Ipv6Addr::new(0xfe80, 0, 0, 0, 0x1, 0x2, 0x3, 0x4),
            dst: Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5, 0x6, 0x7, 0x8),
        },
        sport: rxe_udp_sport(Qpn::new(0x11)),
        dport: ROCE_V2_UDP_PORT,
    }
}

/// RC RDMA WRITE Only headers (BTH + RETH, 28 bytes) for `len` bytes of payload.
fn write_only(len: usize) -> Headers {
    let mut h = Headers::new(Bth::new(
        Opcode::RC_RDMA_WRITE_ONLY,
        Qpn::new(0x12),
        Psn::new(0x00ab_cdef),
    ));
    h.bth.ack_req = true;
    h.reth = Some(Reth {
        va: 0x7f00_1234_5000,
        rkey: 0x1234_5601,
        dma_len: len as u32,
    });
    h
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31)).collect()
}

/// A sealed packet: headers, payload, pad and ICRC.
fn packet(h: &Headers, data: &[u8], flow: &UdpPseudo) -> Vec<u8> {
    let mut buf = vec![0u8; h.len() + data.len() + 3 + ICRC_LEN];
    let n = emit_packet(h, data, &mut buf).expect("emit");
    let n = seal(flow, &mut buf, n).expect("seal");
    buf.truncate(n);
    assert!(verify(flow, &buf), "bench packet must carry a valid ICRC");
    buf
}

fn bench_icrc(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for (name, flow) in [("v4", flow_v4(0)), ("v6", flow_v6())] {
        for size in SIZES {
            let pkt = packet(&write_only(size), &payload(size), &flow);
            g.throughput(Throughput::Bytes(pkt.len() as u64));
            // Receive side: what the engine does for every datagram.
            g.bench_with_input(
                BenchmarkId::new(format!("verify_{name}"), size),
                &pkt,
                |b, pkt| b.iter(|| verify(black_box(&flow), black_box(pkt))),
            );
            // Send side: ICRC of the body, written as the trailer.
            let mut buf = pkt.clone();
            let body = pkt.len() - ICRC_LEN;
            g.bench_function(BenchmarkId::new(format!("seal_{name}"), size), |b| {
                b.iter(|| seal(black_box(&flow), black_box(&mut buf), body))
            });
        }
    }
    // A READ response's seal: its payload's CRC was taken as it was copied in, so only
    // the headers are hashed and the two CRCs joined (`icrc_with_tail`).
    for size in SIZES {
        let flow = flow_v4(0);
        let pkt = packet(&write_only(size), &payload(size), &flow);
        let body = &pkt[..pkt.len() - ICRC_LEN];
        let head = write_only(size).len();
        let tail_crc = crc32fast::hash(&body[head..]);
        assert_eq!(
            icrc_with_tail(&flow, &body[..head], body.len() - head, tail_crc),
            icrc(&flow, body)
        );
        g.throughput(Throughput::Bytes(pkt.len() as u64));
        g.bench_function(BenchmarkId::new("seal_with_tail_crc_v4", size), |b| {
            b.iter(|| {
                icrc_with_tail(
                    black_box(&flow),
                    black_box(&body[..head]),
                    body.len() - head,
                    tail_crc,
                )
            })
        });
    }
    // The floor: the same bytes through crc32fast alone (no masked pseudo-header).
    for size in SIZES {
        let pkt = packet(&write_only(size), &payload(size), &flow_v4(0));
        g.throughput(Throughput::Bytes(pkt.len() as u64));
        g.bench_with_input(BenchmarkId::new("crc32fast_floor", size), &pkt, |b, pkt| {
            b.iter(|| crc32fast::hash(black_box(pkt)))
        });
    }
    g.finish();
}

/// The paths taken when the IPv4 ID (covered by the ICRC, invisible to a UDP socket) is not
/// the predicted one: a candidate found by CRC combine, and solving for the ID.
fn bench_icrc_id_paths(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc_ipv4_id");
    let size = 4096;
    let id = 0x1234;
    let pkt = packet(&write_only(size), &payload(size), &flow_v4(id));
    g.throughput(Throughput::Bytes(pkt.len() as u64));
    let predicted = flow_v4(id);
    g.bench_function("predicted_4096", |b| {
        b.iter(|| verify_ipv4_any_id(black_box(&predicted), black_box(&pkt), [].into_iter()))
    });
    // Predicted ID wrong; the right one is the 17th candidate (rxe counts up per packet).
    let wrong = flow_v4(id - 17);
    assert_eq!(
        verify_ipv4_any_id(&wrong, &pkt, (1..=32).map(|d| id - 17 + d)),
        Some(id)
    );
    g.bench_function("candidates_4096", |b| {
        b.iter(|| {
            verify_ipv4_any_id(
                black_box(&wrong),
                black_box(&pkt),
                (1..=32u16).map(|d| (id - 17).wrapping_add(d)),
            )
        })
    });
    assert_eq!(solve_ipv4_id(&wrong, &pkt), Some(id));
    g.bench_function("solve_4096", |b| {
        b.iter(|| solve_ipv4_id(black_box(&wrong), black_box(&pkt)))
    });
    g.finish();
}

fn bench_parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(1));
    let flow = flow_v4(0);
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // RDMA WRITE First: BTH + RETH + MTU payload.
    let mut h = write_only(4096);
    h.bth.opcode = Opcode::RC_RDMA_WRITE_FIRST;
    h.bth.ack_req = false;
    cases.push(("rc_write_first_reth", packet(&h, &payload(1024), &flow)));
    // RDMA WRITE Only with Immediate: BTH + RETH + ImmDt.
    let mut h = write_only(64);
    h.bth.opcode = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
    h.imm_dt = Some(0xdead_beef);
    cases.push(("rc_write_only_imm", packet(&h, &payload(64), &flow)));
    // SEND Only, 8 bytes: the latency case.
    let h = Headers::new(Bth::new(Opcode::RC_SEND_ONLY, Qpn::new(0x12), Psn::new(5)));
    cases.push(("rc_send_only_8", packet(&h, &payload(8), &flow)));
    // ACK: BTH + AETH.
    let mut h = Headers::new(Bth::new(
        Opcode::RC_ACKNOWLEDGE,
        Qpn::new(0x12),
        Psn::new(5),
    ));
    h.aeth = Some(Aeth::ack(9, Aeth::CREDITS_INVALID));
    cases.push(("rc_ack", packet(&h, &[], &flow)));
    // UD SEND Only: BTH + DETH.
    let mut h = Headers::new(Bth::new(Opcode::UD_SEND_ONLY, Qpn::new(0x12), Psn::new(5)));
    h.deth = Some(Deth {
        qkey: 0x1111_1111,
        src_qp: Qpn::new(0x13),
    });
    cases.push(("ud_send_only_deth", packet(&h, &payload(256), &flow)));
    for (name, pkt) in &cases {
        assert!(parse(pkt).is_ok(), "{name} must parse");
        g.bench_with_input(BenchmarkId::from_parameter(name), pkt, |b, pkt| {
            b.iter(|| parse(black_box(pkt)))
        });
    }
    g.finish();
}

/// Build a whole packet: headers, payload copy, pad and ICRC (the send path per segment).
fn bench_build(c: &mut Criterion) {
    let mut g = c.benchmark_group("emit_seal");
    let flow = flow_v4(0);
    for size in SIZES {
        let h = write_only(size);
        let data = payload(size);
        let mut buf = vec![0u8; h.len() + size + 3 + ICRC_LEN];
        g.throughput(Throughput::Bytes(buf.len() as u64));
        g.bench_function(BenchmarkId::from_parameter(size), |b| {
            b.iter(|| {
                let n = emit_packet(black_box(&h), black_box(&data), &mut buf).ok()?;
                seal(&flow, &mut buf, n).ok()
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_icrc,
    bench_icrc_id_paths,
    bench_parse,
    bench_build
);
criterion_main!(benches);
