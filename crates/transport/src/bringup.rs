//! The `ibv_modify_qp` steps that bring a QP from RESET to RTS, with the attributes each
//! transition requires (IBTA 10.3.1, the kernel's `qp_state_table`), as perftest and
//! rdma_cm set them: one owner for the device API, the tests, the benches and the fuzz
//! target.

use crate::verbs::{AccessFlags, AddressVector, Mtu, QpAttr, QpAttrMask, QpState, QpType};

/// RESET → INIT: port 1, P_Key index 0, and the QP's remote rights (RC, UC) or its
/// Q_Key (UD).
pub fn init(ty: QpType, access: AccessFlags, qkey: u32) -> (QpAttr, QpAttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: access,
        qkey,
        ..QpAttr::default()
    };
    let own = if ty == QpType::Ud {
        QpAttrMask::QKEY
    } else {
        QpAttrMask::ACCESS_FLAGS
    };
    let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | own;
    (attr, mask)
}

/// What a connected (RC or UC) QP needs to reach RTS towards its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect {
    /// The peer's QPN.
    pub dest_qp_num: u32,
    /// The first PSN the peer sends (our receive side expects it).
    pub rq_psn: u32,
    /// The first PSN we send.
    pub sq_psn: u32,
    /// The path to the peer.
    pub av: AddressVector,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// READs and atomics in flight each way (RC).
    pub rd_atomic: u8,
    /// RNR NAK timer code (RC).
    pub min_rnr_timer: u8,
    /// Local ACK timeout exponent (RC).
    pub timeout: u8,
    /// Transport retries (RC).
    pub retry_cnt: u8,
    /// RNR retries, 7 = infinite (RC).
    pub rnr_retry: u8,
}

impl Connect {
    /// INIT → RTR: the path, MTU, peer QPN and receive PSN; RC also its responder
    /// resources and RNR timer.
    pub fn rtr(&self, ty: QpType) -> (QpAttr, QpAttrMask) {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: self.path_mtu,
            dest_qp_num: self.dest_qp_num,
            rq_psn: self.rq_psn,
            ah_attr: self.av,
            max_dest_rd_atomic: self.rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN;
        if ty == QpType::Rc {
            mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
        }
        (attr, mask)
    }

    /// RTR → RTS: the send PSN; RC also its timeout, retries and READ depth.
    pub fn rts(&self, ty: QpType) -> (QpAttr, QpAttrMask) {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.sq_psn,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.rd_atomic,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
        if ty == QpType::Rc {
            mask |= QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC;
        }
        (attr, mask)
    }
}

/// INIT → RTR of a UD QP: nothing but the state.
pub fn ud_rtr() -> (QpAttr, QpAttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    (attr, QpAttrMask::STATE)
}

/// RTR → RTS of a UD QP: its first send PSN.
pub fn ud_rts(sq_psn: u32) -> (QpAttr, QpAttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        ..QpAttr::default()
    };
    (attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
}
