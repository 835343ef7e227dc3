//! UDP ports of RoCEv2 (IBTA A17.2.2) and the source port choice of Linux rxe.
//!
//! rxe gives every QP one fixed UDP source port so that a QP's packets stay one flow (in
//! order through ECMP and RSS) while different QPs spread over flows:
//! - at create (`rxe_qp_init_req`): `0xC000 + (hash_32(qp_num, 14) & 0x3fff)`; UD QPs keep it;
//! - at modify to RTR with a GRH address vector (`rxe_modify_qp`, all RoCEv2 RC/UC QPs):
//!   `rdma_get_udp_sport(flow_label, qp_num, dest_qp_num)` (include/rdma/ib_verbs.h).
//!
//! Both verified against `tests/data/rxe-rc-send-ud-send.pcapng`.

use crate::Qpn;

/// RoCEv2 UDP destination port (IANA, IBTA A17.2.2).
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// Base of the UDP source ports rxe and the RDMA core pick (start of the dynamic port range).
pub const ROCE_V2_SPORT_BASE: u16 = 0xc000;

/// Linux `GOLDEN_RATIO_32` (include/linux/hash.h).
const GOLDEN_RATIO_32: u32 = 0x61c8_8647;

/// Linux `hash_32(val, bits)`: multiply by the 32-bit golden ratio, keep the top `bits`
/// bits. `bits` is clamped to 1..=32.
pub const fn hash_32(val: u32, bits: u32) -> u32 {
    let bits = if bits == 0 {
        1
    } else if bits > 32 {
        32
    } else {
        bits
    };
    ((val.wrapping_mul(GOLDEN_RATIO_32)) as u64 >> (32 - bits)) as u32
}

/// The source port rxe gives a QP at creation: `0xC000 + (hash_32(qpn, 14) & 0x3fff)`.
/// This is the port of UD QPs (and of RC/UC QPs modified without a GRH).
pub const fn rxe_udp_sport(qpn: Qpn) -> u16 {
    ROCE_V2_SPORT_BASE | (hash_32(qpn.value(), 14) & 0x3fff) as u16
}

/// Linux `rdma_calc_flow_label(lqpn, rqpn)`: a 20-bit flow label from the QPN pair.
pub const fn rdma_calc_flow_label(lqpn: Qpn, rqpn: Qpn) -> u32 {
    let mut v = lqpn.value() as u64 * rqpn.value() as u64;
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xf_ffff) as u32
}

/// Linux `rdma_flow_label_to_udp_sport(fl)`: fold a 20-bit flow label into 14 bits above 0xC000.
pub const fn rdma_flow_label_to_udp_sport(flow_label: u32) -> u16 {
    let low = flow_label & 0x3fff;
    let high = flow_label & 0xf_c000;
    ((low ^ (high >> 14)) as u16) | ROCE_V2_SPORT_BASE
}

/// Linux `rdma_get_udp_sport(fl, lqpn, rqpn)`: the source port rxe uses for a connected
/// (RC/UC) QP once its address vector is set; a zero `flow_label` is derived from the QPNs.
pub const fn rdma_udp_sport(flow_label: u32, lqpn: Qpn, rqpn: Qpn) -> u16 {
    let fl = if flow_label == 0 {
        rdma_calc_flow_label(lqpn, rqpn)
    } else {
        flow_label
    };
    rdma_flow_label_to_udp_sport(fl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rxe_sport_by_hand() {
        // 0x12 * 0x61c88647 = 0x6_e019_70fe; low 32 bits 0xe01970fe; >> 18 = 0x3806;
        // 0xc000 | 0x3806 = 0xf806 = 63494 -- the UD frame of the rxe capture (src QP 0x12).
        assert_eq!(hash_32(0x12, 14), 0x3806);
        assert_eq!(rxe_udp_sport(Qpn::new(0x12)), 63494);
        // QPN 0: hash 0, port 0xc000.
        assert_eq!(rxe_udp_sport(Qpn::new(0)), 0xc000);
        assert!((0..5000).all(|q| rxe_udp_sport(Qpn::new(q)) >= 0xc000));
    }

    #[test]
    fn rdma_sport_by_hand() {
        // 0x11 * 0x123 = 0x1353 (no bits above 20 to fold), flow label 0x1353;
        // 0x1353 has no bits above 14, so the port is 0xc000 | 0x1353 = 54099 -- the RC
        // frames of the rxe capture (QP 0x11 to QP 0x123).
        assert_eq!(
            rdma_calc_flow_label(Qpn::new(0x11), Qpn::new(0x123)),
            0x1353
        );
        assert_eq!(rdma_udp_sport(0, Qpn::new(0x11), Qpn::new(0x123)), 54099);
        // High flow label bits fold into the low 14: 0xfc000 >> 14 = 0x3f.
        assert_eq!(rdma_flow_label_to_udp_sport(0xf_c000), 0xc03f);
        assert_eq!(
            rdma_udp_sport(0x1234, Qpn::new(1), Qpn::new(2)),
            0xc000 | 0x1234
        );
    }
}
