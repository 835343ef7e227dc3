//! The control plane: create, modify, query and destroy CQs, SRQs and QPs, with the
//! checks `ibv_create_*` and `ibv_modify_*` make against the device's limits.

use std::collections::VecDeque;

use crate::engine::{sync, Engine, Parts, FIRST_QPN, GSI_QPN};
use crate::error::TransportError;
use crate::mcast::MULTICAST_QPN;
use crate::path::Path;
use crate::qp::state::modify_is_ok;
use crate::qp::{Ctx, Qp, Srq};
use crate::verbs::*;

/// Bytes of one SGE in a send WQE (`struct ib_sge`), the unit rxe sizes WQEs in.
const SGE_BYTES: u32 = 16;

impl Engine {
    /// Create a completion queue.
    pub fn create_cq(&mut self) -> CqId {
        let id = self.next_cq;
        self.next_cq += 1;
        self.cqs.insert(id);
        CqId(id)
    }

    /// Destroy a completion queue (Busy while QPs use it). Its pending completions go.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), TransportError> {
        if !self.cqs.contains(&cq.0) {
            return Err(TransportError::NotFound);
        }
        if self
            .qps
            .values()
            .any(|q| q.init.send_cq == cq || q.init.recv_cq == cq)
        {
            return Err(TransportError::Busy);
        }
        self.cqs.remove(&cq.0);
        self.completions.retain(|(c, _)| *c != cq);
        Ok(())
    }

    /// Create a shared receive queue.
    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<SrqId, TransportError> {
        if attr.max_wr == 0 || attr.max_wr > self.cfg.max_qp_wr {
            return Err(TransportError::InvalidArgument("srq max_wr"));
        }
        if attr.max_sge > self.cfg.max_sge {
            return Err(TransportError::InvalidArgument("srq max_sge"));
        }
        let id = self.next_srq;
        self.next_srq += 1;
        self.srqs.insert(
            id,
            Srq {
                pd,
                attr,
                queue: VecDeque::new(),
                users: 0,
                placed: 0,
            },
        );
        Ok(SrqId(id))
    }

    /// Modify an SRQ (`mask`: [`SRQ_MAX_WR`] | [`SRQ_LIMIT`]).
    pub fn modify_srq(
        &mut self,
        srq: SrqId,
        attr: SrqAttr,
        mask: u32,
    ) -> Result<(), TransportError> {
        let s = self.srqs.get_mut(&srq.0).ok_or(TransportError::NotFound)?;
        if mask & !(SRQ_MAX_WR | SRQ_LIMIT) != 0 {
            return Err(TransportError::InvalidArgument("srq attr mask"));
        }
        let max_wr = if mask & SRQ_MAX_WR != 0 {
            attr.max_wr
        } else {
            s.attr.max_wr
        };
        if max_wr == 0 || max_wr > self.cfg.max_qp_wr || (max_wr as usize) < s.queue.len() {
            return Err(TransportError::InvalidArgument("srq max_wr"));
        }
        if mask & SRQ_LIMIT != 0 && attr.srq_limit > max_wr {
            return Err(TransportError::InvalidArgument("srq_limit above max_wr"));
        }
        s.attr.max_wr = max_wr;
        if mask & SRQ_LIMIT != 0 {
            s.attr.srq_limit = attr.srq_limit;
        }
        Ok(())
    }

    /// Query an SRQ.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, TransportError> {
        self.srqs
            .get(&srq.0)
            .map(|s| s.attr)
            .ok_or(TransportError::NotFound)
    }

    /// Destroy an SRQ (Busy while QPs use it).
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), TransportError> {
        let s = self.srqs.get(&srq.0).ok_or(TransportError::NotFound)?;
        if s.users > 0 {
            return Err(TransportError::Busy);
        }
        self.srqs.remove(&srq.0);
        Ok(())
    }

    /// RESET → INIT → RTR → RTS of a connected (RC or UC) QP towards its peer, with
    /// `access` as its remote rights ([`crate::bringup`]).
    pub fn connect_qp(
        &mut self,
        now: Nanos,
        qpn: Qpn,
        access: AccessFlags,
        c: &crate::bringup::Connect,
    ) -> Result<(), TransportError> {
        let ty = self.qp_type(qpn)?;
        let (a, m) = crate::bringup::init(ty, access, 0);
        self.modify_qp(now, qpn, &a, m)?;
        let (a, m) = c.rtr(ty);
        self.modify_qp(now, qpn, &a, m)?;
        let (a, m) = c.rts(ty);
        self.modify_qp(now, qpn, &a, m)
    }

    /// RESET → INIT → RTR → RTS of a UD QP with Q_Key `qkey` ([`crate::bringup`]).
    pub fn ready_ud(
        &mut self,
        now: Nanos,
        qpn: Qpn,
        qkey: u32,
        sq_psn: u32,
    ) -> Result<(), TransportError> {
        let (a, m) = crate::bringup::init(QpType::Ud, AccessFlags::empty(), qkey);
        self.modify_qp(now, qpn, &a, m)?;
        let (a, m) = crate::bringup::ud_rtr();
        self.modify_qp(now, qpn, &a, m)?;
        let (a, m) = crate::bringup::ud_rts(sq_psn);
        self.modify_qp(now, qpn, &a, m)
    }

    fn qp_type(&self, qpn: Qpn) -> Result<QpType, TransportError> {
        self.qps
            .get(&qpn.value())
            .map(|q| q.init.qp_type)
            .ok_or(TransportError::NotFound)
    }

    /// Create a QP in RESET. QPNs count up from a random point at or above 0x11 (rxe
    /// starts user QPs at 0x11).
    pub fn create_qp(&mut self, init: &QpInitAttr) -> Result<Qpn, TransportError> {
        let init = self.admit_qp(init)?;
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) || qpn == MULTICAST_QPN {
            qpn = qpn_after(qpn);
        }
        self.next_qpn = qpn_after(qpn);
        self.qps.insert(qpn, Qp::new(qpn, init));
        Ok(Qpn::new(qpn))
    }

    /// Create the device's GSI QP (`IB_QPT_GSI`, QPN 1): a UD QP through which CM MADs
    /// are sent and received. One per device: [`TransportError::Busy`] if it exists.
    pub fn create_gsi_qp(&mut self, init: &QpInitAttr) -> Result<Qpn, TransportError> {
        if init.qp_type != QpType::Ud {
            return Err(TransportError::InvalidArgument("the GSI QP is a UD QP"));
        }
        if self.qps.contains_key(&GSI_QPN) {
            return Err(TransportError::Busy);
        }
        let init = self.admit_qp(init)?;
        self.qps.insert(GSI_QPN, Qp::new(GSI_QPN, init));
        Ok(Qpn::new(GSI_QPN))
    }

    /// The checks of a QP's creation attributes, with its SRQ counted and its
    /// capabilities rounded as rxe does.
    fn admit_qp(&mut self, init: &QpInitAttr) -> Result<QpInitAttr, TransportError> {
        if !self.cqs.contains(&init.send_cq.0) || !self.cqs.contains(&init.recv_cq.0) {
            return Err(TransportError::InvalidArgument("no such cq"));
        }
        let c = &init.cap;
        if c.max_send_wr > self.cfg.max_qp_wr
            || c.max_recv_wr > self.cfg.max_qp_wr
            || c.max_send_sge > self.cfg.max_sge
            || c.max_recv_sge > self.cfg.max_sge
            || c.max_inline_data > self.cfg.max_inline_data
        {
            return Err(TransportError::InvalidArgument(
                "qp capabilities above device limits",
            ));
        }
        if let Some(srq) = init.srq {
            let s = self
                .srqs
                .get_mut(&srq.0)
                .ok_or(TransportError::InvalidArgument("no such srq"))?;
            s.users += 1;
        }
        let mut init = *init;
        // Like rxe, a zero capability still allows one entry.
        init.cap.max_send_wr = init.cap.max_send_wr.max(1);
        init.cap.max_recv_wr = init.cap.max_recv_wr.max(1);
        init.cap.max_send_sge = init.cap.max_send_sge.max(1);
        init.cap.max_recv_sge = init.cap.max_recv_sge.max(1);
        // rxe_init_sq: a send WQE holds the larger of its SGE list (16 bytes an entry)
        // and its inline data, and both limits grow to fill it; the caller is told
        // (rdma_xclient posts 16 inline bytes on a QP that asked for none and one SGE).
        let wqe = (init.cap.max_send_sge * SGE_BYTES).max(init.cap.max_inline_data);
        init.cap.max_send_sge = (wqe / SGE_BYTES).min(self.cfg.max_sge);
        init.cap.max_inline_data = wqe;
        Ok(init)
    }

    fn check_attr_values(&self, qp: &Qp, a: &QpAttr, m: QpAttrMask) -> Result<(), TransportError> {
        use TransportError::InvalidArgument as E;
        if m.contains(QpAttrMask::PORT) && a.port_num != 1 {
            return Err(E("port_num"));
        }
        if m.contains(QpAttrMask::PKEY_INDEX) && a.pkey_index != 0 {
            return Err(E("pkey_index"));
        }
        let sgid = if m.contains(QpAttrMask::AV) {
            a.ah_attr.sgid_index
        } else {
            qp.attr.ah_attr.sgid_index
        };
        if m.contains(QpAttrMask::PATH_MTU) && a.path_mtu > self.cfg.gid_mtu(sgid) {
            return Err(E("path_mtu above the source GID's interface MTU"));
        }
        if m.contains(QpAttrMask::TIMEOUT) && a.timeout > 31 {
            return Err(E("timeout"));
        }
        if m.contains(QpAttrMask::RETRY_CNT) && a.retry_cnt > 7 {
            return Err(E("retry_cnt"));
        }
        if m.contains(QpAttrMask::RNR_RETRY) && a.rnr_retry > 7 {
            return Err(E("rnr_retry"));
        }
        if m.contains(QpAttrMask::MIN_RNR_TIMER) && a.min_rnr_timer > 31 {
            return Err(E("min_rnr_timer"));
        }
        if m.contains(QpAttrMask::MAX_QP_RD_ATOMIC) && a.max_rd_atomic > self.cfg.max_qp_rd_atom {
            return Err(E("max_rd_atomic"));
        }
        // max_dest_rd_atomic is not checked (rxe_qp_chk_attr takes any value): the
        // responder's queue of READ/atomic responses is bounded on its own.
        if m.contains(QpAttrMask::AV) && Path::resolve(&self.cfg, &a.ah_attr, qp.qpn).is_none() {
            return Err(E("address vector: bad sgid_index or address family"));
        }
        if m.contains(QpAttrMask::CAP) {
            return Err(E("cap cannot be modified"));
        }
        Ok(())
    }

    /// Modify a QP (`ibv_modify_qp`): the transition and masks are checked against the
    /// IBTA / kernel table; illegal ones are EINVAL.
    pub fn modify_qp(
        &mut self,
        now: Nanos,
        qpn: Qpn,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), TransportError> {
        let n = qpn.value();
        let qp = self.qps.get(&n).ok_or(TransportError::NotFound)?;
        let (cur, next) = transition(qp, attr, mask)?;
        self.check_attr_values(qp, attr, mask)?;
        let Parts {
            qps,
            ready,
            timers,
            mut ctx,
        } = self.parts(now);
        let qp = qps.get_mut(&n).ok_or(TransportError::NotFound)?;
        qp.modify(&mut ctx, attr, mask);
        if next != cur || mask.contains(QpAttrMask::STATE) {
            qp.enter_state(&mut ctx, cur, next);
        }
        sync(qp, &mut ctx, ready, timers);
        Ok(())
    }

    /// Query a QP.
    pub fn query_qp(&self, qpn: Qpn) -> Result<(QpAttr, QpInitAttr), TransportError> {
        let qp = self.qps.get(&qpn.value()).ok_or(TransportError::NotFound)?;
        let mut a = qp.attr;
        a.qp_state = qp.state;
        a.cur_qp_state = qp.state;
        a.cap = qp.init.cap;
        a.sq_draining = qp.state == QpState::Sqd && qp.req.sq.iter().any(|w| w.started);
        Ok((a, qp.init))
    }

    /// Attaches a UD QP to the multicast group of `gid` (`ibv_attach_mcast`).
    pub fn attach_mcast(&mut self, qpn: Qpn, gid: Gid) -> Result<(), TransportError> {
        let qp = self.qps.get(&qpn.value()).ok_or(TransportError::NotFound)?;
        // ib_attach_mcast: UD QPs only.
        if qp.init.qp_type != QpType::Ud || qpn.value() == GSI_QPN {
            return Err(TransportError::InvalidArgument("multicast needs a UD QP"));
        }
        self.mcast.attach(gid, qpn.value())
    }

    /// Detaches a QP from the multicast group of `gid` (`ibv_detach_mcast`).
    pub fn detach_mcast(&mut self, qpn: Qpn, gid: Gid) -> Result<(), TransportError> {
        if !self.qps.contains_key(&qpn.value()) {
            return Err(TransportError::NotFound);
        }
        self.mcast.detach(gid, qpn.value())
    }

    /// The multicast groups that have a QP attached.
    pub fn mcast_groups(&self) -> Vec<Gid> {
        self.mcast.gids().copied().collect()
    }

    /// Whether the QP is attached to a multicast group (uverbs refuses to destroy it:
    /// EBUSY).
    pub fn qp_in_mcast_group(&self, qpn: Qpn) -> bool {
        self.mcast.has_member(qpn.value())
    }

    /// Destroy a QP. Its queued work disappears without completions (like rxe), and it
    /// leaves its multicast groups.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), TransportError> {
        let qp = self
            .qps
            .remove(&qpn.value())
            .ok_or(TransportError::NotFound)?;
        self.mcast.forget(qpn.value());
        if let Some(cc) = qp.cc_stats() {
            // Its last figures, for a run whose QPs are gone when counters are read.
            tracing::debug!("qp {:#x} congestion: {cc}", qp.qpn);
        }
        if let Some(mp) = qp.mp_stats() {
            tracing::debug!("qp {:#x} {mp}", qp.qpn);
        }
        self.budget.inflight = self.budget.inflight.saturating_sub(qp.reported_inflight);
        self.budget.ooo_bytes = self.budget.ooo_bytes.saturating_sub(qp.reported_ooo);
        if let Some(s) = qp.init.srq.and_then(|s| self.srqs.get_mut(&s.0)) {
            s.users = s.users.saturating_sub(1);
        }
        Ok(())
    }
}

/// The QPN after `qpn` in the 24-bit space, wrapping to the first user QPN.
fn qpn_after(qpn: u32) -> u32 {
    ((qpn + 1) & 0x00ff_ffff).max(FIRST_QPN)
}

/// The current and the next state of a modify (`cur_qp_state` must match when given),
/// if the kernel's transition table allows it with this mask.
fn transition(
    qp: &Qp,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<(QpState, QpState), TransportError> {
    let cur = if mask.contains(QpAttrMask::CUR_STATE) {
        if attr.cur_qp_state != qp.state {
            return Err(TransportError::InvalidArgument(
                "cur_qp_state does not match",
            ));
        }
        attr.cur_qp_state
    } else {
        qp.state
    };
    let next = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };
    if !modify_is_ok(cur, next, qp.init.qp_type, mask) {
        return Err(TransportError::InvalidArgument(
            "illegal QP transition or attribute mask",
        ));
    }
    Ok((cur, next))
}

impl Qp {
    /// Take the attributes `mask` selects, and what follows from them: the path of a
    /// new address vector, fresh retry budgets, the PSNs both sides start from.
    fn modify(&mut self, ctx: &mut Ctx<'_>, attr: &QpAttr, mask: QpAttrMask) {
        use QpAttrMask as M;
        self.attr.apply(attr, mask);
        if mask.contains(M::AV) {
            if let Some(p) = Path::resolve(ctx.cfg, &attr.ah_attr, self.qpn) {
                self.path = p;
            }
        }
        if mask.contains(M::RETRY_CNT) {
            self.req.retry_left = attr.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            self.req.rnr_left = attr.rnr_retry;
        }
        if mask.contains(M::RQ_PSN) {
            self.resp.epsn = Psn::new(attr.rq_psn);
        }
        if mask.contains(M::SQ_PSN) {
            let p = Psn::new(attr.sq_psn);
            self.req.next_psn = p;
            self.req.una = p;
            self.req.max_sent = p;
        }
    }

    /// Move from `cur` to `next` (IBTA 10.3.1): RESET empties the queues, ERR flushes
    /// them, SQD arms its drained event, RTS starts with full retry budgets.
    fn enter_state(&mut self, ctx: &mut Ctx<'_>, cur: QpState, next: QpState) {
        match next {
            QpState::Reset => {
                self.reset();
                self.attr.qp_state = QpState::Reset;
            }
            QpState::Err => self.enter_error(ctx),
            QpState::Sqd => {
                self.state = QpState::Sqd;
                self.req.sqd_notify = self.attr.en_sqd_async_notify;
            }
            s => {
                if s == QpState::Rts && cur != QpState::Rts {
                    self.req.retry_left = self.attr.retry_cnt;
                    self.req.rnr_left = self.attr.rnr_retry;
                    self.mp_start(ctx);
                }
                self.state = s;
            }
        }
        self.attr.qp_state = self.state;
    }
}
