//! Property tests of the MAD codec: every well-formed message round-trips bit for bit,
//! and no input makes `parse` (or the endpoint fed with it) panic.

use proptest::prelude::*;
use softhca_cm::mad::{
    self, CmBody, CmMessage, Drep, Dreq, Gid, MadHeader, Mra, MsgResponse, Rej, RejReason, Rep,
    Req, ReqPath, Rtu, SidrRep, SidrReq, SidrStatus, TransportService,
};
use softhca_cm::{Endpoint, EndpointConfig, Psn, Qpn};

fn arr<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    prop::collection::vec(any::<u8>(), N).prop_map(|v| <[u8; N]>::try_from(v).unwrap())
}

fn qpn() -> impl Strategy<Value = Qpn> {
    (0u32..=0xff_ffff).prop_map(Qpn::new)
}

fn psn() -> impl Strategy<Value = Psn> {
    (0u32..=0xff_ffff).prop_map(Psn::new)
}

fn msg_response() -> impl Strategy<Value = MsgResponse> {
    prop_oneof![
        Just(MsgResponse::Req),
        Just(MsgResponse::Rep),
        Just(MsgResponse::Other)
    ]
}

fn transport() -> impl Strategy<Value = TransportService> {
    prop_oneof![
        Just(TransportService::Rc),
        Just(TransportService::Uc),
        Just(TransportService::Rd),
        Just(TransportService::Extended)
    ]
}

fn path() -> impl Strategy<Value = ReqPath> {
    (
        (any::<u16>(), any::<u16>(), arr::<16>(), arr::<16>()),
        (
            0u32..1 << 20,
            0u8..64,
            any::<u8>(),
            any::<u8>(),
            0u8..16,
            any::<bool>(),
            0u8..32,
        ),
    )
        .prop_map(
            |((ll, rl, lg, rg), (fl, rate, tc, hop, sl, sub, ack))| ReqPath {
                local_lid: ll,
                remote_lid: rl,
                local_gid: Gid(lg),
                remote_gid: Gid(rg),
                flow_label: fl,
                packet_rate: rate,
                traffic_class: tc,
                hop_limit: hop,
                sl,
                subnet_local: sub,
                local_ack_timeout: ack,
            },
        )
}

fn req() -> impl Strategy<Value = Req> {
    (
        (
            any::<u32>(),
            0u32..1 << 24,
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            qpn(),
            any::<u8>(),
            0u32..1 << 24,
            any::<u8>(),
            0u32..1 << 24,
        ),
        (
            0u8..32,
            transport(),
            any::<bool>(),
            psn(),
            0u8..32,
            0u8..8,
            any::<u16>(),
            0u8..16,
            any::<bool>(),
            0u8..8,
            0u8..16,
            any::<bool>(),
        ),
        (0u8..8, path(), path(), any::<bool>(), arr::<92>()),
    )
        .prop_map(
            |(
                (lc, vid, sid, guid, qkey, qpn, rr, leecn, id, reecn),
                (rcrt, ts, e2e, psn, lcrt, rc, pkey, mtu, rdc, rnr, mcr, srq),
                (ext, primary, alternate, sap, pd),
            )| Req {
                local_comm_id: lc,
                vendor_id: vid,
                service_id: sid,
                local_ca_guid: guid,
                local_qkey: qkey,
                local_qpn: qpn,
                responder_resources: rr,
                local_eecn: leecn,
                initiator_depth: id,
                remote_eecn: reecn,
                remote_cm_response_timeout: rcrt,
                transport: ts,
                end_to_end_flow_control: e2e,
                starting_psn: psn,
                local_cm_response_timeout: lcrt,
                retry_count: rc,
                pkey,
                path_mtu: mtu,
                rdc_exists: rdc,
                rnr_retry_count: rnr,
                max_cm_retries: mcr,
                srq,
                extended_transport: ext,
                primary,
                alternate,
                sap_supported: sap,
                private_data: pd,
            },
        )
}

fn rep() -> impl Strategy<Value = Rep> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            qpn(),
            0u32..1 << 24,
            psn(),
            0u32..1 << 24,
            any::<u8>(),
            any::<u8>(),
        ),
        (
            0u8..32,
            0u8..4,
            any::<bool>(),
            0u8..8,
            any::<bool>(),
            any::<u64>(),
            arr::<196>(),
        ),
    )
        .prop_map(
            |((lc, rc, qkey, qpn, eecn, psn, vid, rr, id), (tad, fo, e2e, rnr, srq, guid, pd))| {
                Rep {
                    local_comm_id: lc,
                    remote_comm_id: rc,
                    local_qkey: qkey,
                    local_qpn: qpn,
                    local_eecn: eecn,
                    starting_psn: psn,
                    vendor_id: vid,
                    responder_resources: rr,
                    initiator_depth: id,
                    target_ack_delay: tad,
                    failover_accepted: fo,
                    end_to_end_flow_control: e2e,
                    rnr_retry_count: rnr,
                    srq,
                    local_ca_guid: guid,
                    private_data: pd,
                }
            },
        )
}

fn body() -> impl Strategy<Value = CmBody> {
    prop_oneof![
        req().prop_map(CmBody::Req),
        rep().prop_map(CmBody::Rep),
        (
            any::<u32>(),
            any::<u32>(),
            msg_response(),
            0u8..32,
            arr::<222>()
        )
            .prop_map(|(l, r, m, t, pd)| CmBody::Mra(Mra {
                local_comm_id: l,
                remote_comm_id: r,
                msg_mraed: m,
                service_timeout: t,
                private_data: pd,
            })),
        (
            any::<u32>(),
            any::<u32>(),
            msg_response(),
            0u8..128,
            any::<u16>(),
            arr::<72>(),
            arr::<148>()
        )
            .prop_map(|(l, r, m, len, reason, ari, pd)| CmBody::Rej(Rej {
                local_comm_id: l,
                remote_comm_id: r,
                msg_rejected: m,
                ari_len: len,
                reason: RejReason::from_u16(reason),
                ari,
                private_data: pd,
            })),
        (any::<u32>(), any::<u32>(), arr::<224>()).prop_map(|(l, r, pd)| CmBody::Rtu(Rtu {
            local_comm_id: l,
            remote_comm_id: r,
            private_data: pd,
        })),
        (any::<u32>(), any::<u32>(), qpn(), arr::<220>()).prop_map(|(l, r, q, pd)| {
            CmBody::Dreq(Dreq {
                local_comm_id: l,
                remote_comm_id: r,
                remote_qpn: q,
                private_data: pd,
            })
        }),
        (any::<u32>(), any::<u32>(), arr::<224>()).prop_map(|(l, r, pd)| CmBody::Drep(Drep {
            local_comm_id: l,
            remote_comm_id: r,
            private_data: pd,
        })),
        (any::<u32>(), any::<u16>(), any::<u64>(), arr::<216>()).prop_map(|(id, pk, sid, pd)| {
            CmBody::SidrReq(SidrReq {
                request_id: id,
                pkey: pk,
                service_id: sid,
                private_data: pd,
            })
        }),
        (
            (any::<u32>(), any::<u8>(), any::<u8>(), 0u32..1 << 24, qpn()),
            (any::<u64>(), any::<u32>(), arr::<72>(), arr::<136>())
        )
            .prop_map(|((id, st, len, vid, q), (sid, qkey, info, pd))| {
                CmBody::SidrRep(SidrRep {
                    request_id: id,
                    status: SidrStatus::from_u8(st),
                    add_info_len: len,
                    vendor_id: vid,
                    qpn: q,
                    service_id: sid,
                    qkey,
                    add_info: info,
                    private_data: pd,
                })
            }),
    ]
}

fn message() -> impl Strategy<Value = CmMessage> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        any::<u32>(),
        body(),
    )
        .prop_map(|(status, cs, tid, am, body)| CmMessage {
            hdr: MadHeader {
                status,
                class_specific: cs,
                tid,
                attr_mod: am,
            },
            body,
        })
}

const ATTRS: [u16; 12] = [
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x01,
];

/// 256 random bytes behind a valid CM header, so the body decoders see them.
fn cm_shaped() -> impl Strategy<Value = Vec<u8>> {
    (arr::<256>(), prop::sample::select(&ATTRS[..])).prop_map(|(mut b, attr)| {
        b[..4].copy_from_slice(&[1, 7, 2, 3]);
        b[16..18].copy_from_slice(&attr.to_be_bytes());
        b.to_vec()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn emit_then_parse_is_identity(msg in message()) {
        let mut bytes = [0u8; 256];
        mad::emit(&msg, &mut bytes).unwrap();
        let back = mad::parse(&bytes).unwrap();
        prop_assert_eq!(back, msg);
        let mut again = [0u8; 256];
        mad::emit(&back, &mut again).unwrap();
        prop_assert_eq!(again, bytes);
    }

    #[test]
    fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = mad::parse(&bytes);
    }

    #[test]
    fn parse_of_cm_shaped_bytes_is_stable(bytes in cm_shaped()) {
        // Whatever parses re-emits to a MAD that parses to the same message: only
        // reserved bits can differ from the input.
        if let Ok(msg) = mad::parse(&bytes) {
            let mut out = [0u8; 256];
            mad::emit(&msg, &mut out).unwrap();
            prop_assert_eq!(mad::parse(&out).unwrap(), msg);
            let differ = bytes.iter().zip(out.iter()).filter(|(a, b)| a != b).count();
            prop_assert!(differ <= 16, "only reserved bits may differ, {} bytes did", differ);
        }
    }

    #[test]
    fn endpoint_survives_any_mad_sequence(mads in prop::collection::vec(cm_shaped(), 1..40)) {
        let mut ep = Endpoint::new(EndpointConfig::new(0x42, 7));
        ep.listen(0x0000_0000_0106_1c06).unwrap();
        ep.listen(0x0000_0000_0111_1c06).unwrap();
        let src = std::net::IpAddr::from([10, 0, 0, 9]);
        let mut now = 0;
        for m in &mads {
            ep.handle_mad(now, src, 0, m);
            while ep.poll_transmit().is_some() {}
            while ep.poll_event().is_some() {}
            now += 1_000_000_000;
            ep.handle_timeout(now);
        }
        prop_assert_eq!(ep.counters().rx_mads, mads.len() as u64);
    }
}
