//! The QP state transition table: which `ibv_modify_qp` transitions are legal and which
//! attribute masks each requires or allows, per QP type.
//!
//! Same content as the kernel's `qp_state_table` / `ib_modify_qp_is_ok()`
//! (drivers/infiniband/core/verbs.c), which encodes IBTA 11.2.5 / table 94ff.

use crate::verbs::{QpAttrMask as M, QpState, QpType};

/// Required and optional attributes for a transition, or None if it is illegal.
pub fn transition(cur: QpState, next: QpState, ty: QpType) -> Option<(M, M)> {
    use QpState::*;
    use QpType::*;
    let e = M::empty();
    let r = match (cur, next) {
        (_, Reset) => (e, e),
        (Reset, Init) | (Init, Init) => {
            let p = match ty {
                Ud => M::PKEY_INDEX | M::PORT | M::QKEY,
                Uc | Rc => M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            };
            if cur == Reset {
                (p, e)
            } else {
                (e, p)
            }
        }
        (Reset, _) => return None,
        (_, Err) => (e, e),
        (Init, Rtr) => init_to_rtr(ty),
        (Rtr, Rts) => match ty {
            Ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
            Uc => (
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Rc => (
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match ty {
            Ud => (e, M::CUR_STATE | M::QKEY),
            Uc => (
                e,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
            ),
            Rc => (
                e,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
            ),
        },
        (Rts, Sqd) => (e, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => sqd_to_sqd(ty),
        (Sqe, Rts) => match ty {
            Ud => (e, M::CUR_STATE | M::QKEY),
            Uc => (e, M::CUR_STATE | M::ACCESS_FLAGS),
            Rc => return None,
        },
        _ => return None,
    };
    Some(r)
}

/// INIT to RTR: the path and the receive side's starting point (IBTA table 94ff).
fn init_to_rtr(ty: QpType) -> (M, M) {
    use QpType::*;
    let e = M::empty();
    match ty {
        Ud => (e, M::PKEY_INDEX | M::QKEY),
        Uc => (
            M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
            M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
        ),
        Rc => (
            M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
            M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
        ),
    }
}

/// SQD to SQD: what may change while the send queue is drained.
fn sqd_to_sqd(ty: QpType) -> (M, M) {
    use QpType::*;
    let e = M::empty();
    match ty {
        Ud => (e, M::PKEY_INDEX | M::QKEY),
        Uc => (
            e,
            M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
        ),
        Rc => (
            e,
            M::PORT
                | M::AV
                | M::TIMEOUT
                | M::RETRY_CNT
                | M::RNR_RETRY
                | M::MAX_QP_RD_ATOMIC
                | M::MAX_DEST_RD_ATOMIC
                | M::ALT_PATH
                | M::ACCESS_FLAGS
                | M::PKEY_INDEX
                | M::MIN_RNR_TIMER
                | M::PATH_MIG_STATE,
        ),
    }
}

/// `ib_modify_qp_is_ok()`: is `mask` acceptable for moving from `cur` to `next`?
pub fn modify_is_ok(cur: QpState, next: QpState, ty: QpType, mask: M) -> bool {
    // IBV_QP_CUR_STATE is only meaningful from RTR, RTS, SQD and SQE.
    if mask.contains(M::CUR_STATE)
        && !matches!(
            cur,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    {
        return false;
    }
    let Some((req, opt)) = transition(cur, next, ty) else {
        return false;
    };
    mask.contains(req) && (mask - (req | opt | M::STATE)).is_empty()
}
