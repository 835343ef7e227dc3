//! Queue pairs, shared receive queues and address handles.

use std::sync::Arc;

use crate::cq::{Cq, CqInner};
use crate::error::Error;
use crate::event::EventObject;
use crate::pd::Pd;
use crate::{
    AccessFlags, AddressVector, Gid, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    Qpn, RecvWr, SendWr, SrqAttr, SrqId, UdDest,
};
use softhca_transport::bringup;

/// What [`Pd::create_qp`] needs (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
pub struct QpInit<'a> {
    /// Transport type.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq,
    /// Shared receive queue instead of the QP's own.
    pub srq: Option<&'a Srq>,
    /// Queue capacities.
    pub cap: QpCap,
    /// Every send WR completes (else only those with [`crate::SendFlags::SIGNALED`]).
    pub sq_sig_all: bool,
}

impl<'a> QpInit<'a> {
    /// An RC/UC/UD QP with the same CQ for both queues, 256-deep queues, 4 SGEs,
    /// 64 bytes inline.
    pub fn new(qp_type: QpType, cq: &'a Cq) -> QpInit<'a> {
        QpInit {
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        }
    }
}

/// What one side of an RC/UC connection tells the other (perftest exchanges the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteQp {
    /// The peer's QPN.
    pub qpn: u32,
    /// The peer's initial send PSN (our expected receive PSN).
    pub psn: u32,
    /// The peer's GID (its IP address).
    pub gid: Gid,
}

/// What [`Qp::connect_rc_with`] sets besides the peer's data; the default is
/// [`Qp::connect_rc`]'s ([`defaults`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code the responder asks for.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic, both directions (`max_rd_atomic`, `max_dest_rd_atomic`).
    pub rd_atomic: u8,
    /// Access the QP grants (`None`: all for RC; LOCAL_WRITE | REMOTE_WRITE for UC).
    pub access: Option<AccessFlags>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: defaults::TIMEOUT,
            retry_cnt: defaults::RETRY_CNT,
            rnr_retry: defaults::RNR_RETRY,
            min_rnr_timer: defaults::MIN_RNR_TIMER,
            rd_atomic: defaults::RD_ATOMIC,
            access: None,
        }
    }
}

/// Default connection parameters of [`Qp::connect_rc`], as perftest uses them.
pub mod defaults {
    /// Local ACK timeout exponent (4.096 µs × 2^14 ≈ 67 ms).
    pub const TIMEOUT: u8 = 14;
    /// Transport retries.
    pub const RETRY_CNT: u8 = 7;
    /// RNR retries (7 = infinite).
    pub const RNR_RETRY: u8 = 7;
    /// RNR NAK timer code 12 (0.64 ms).
    pub const MIN_RNR_TIMER: u8 = 12;
    /// Outstanding READ/atomic, both directions.
    pub const RD_ATOMIC: u8 = 16;
    /// IP TTL.
    pub const HOP_LIMIT: u8 = 64;
}

/// A queue pair (`ibv_qp`). Dropping it destroys it; it keeps its CQs, SRQ and PD alive.
#[derive(Debug)]
pub struct Qp {
    pd: Pd,
    qpn: Qpn,
    qp_type: QpType,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
}

fn qpn_u32(q: Qpn) -> u32 {
    q.value()
}

impl Qp {
    pub(crate) fn create(pd: &Pd, init: &QpInit<'_>) -> Result<Qp, Error> {
        Self::create_numbered(pd, init, false)
    }

    /// The device's GSI QP (QPN 1), through which connection management MADs travel.
    pub(crate) fn create_gsi(pd: &Pd, init: &QpInit<'_>) -> Result<Qp, Error> {
        Self::create_numbered(pd, init, true)
    }

    fn create_numbered(pd: &Pd, init: &QpInit<'_>, gsi: bool) -> Result<Qp, Error> {
        let ctx = pd.context();
        if !Arc::ptr_eq(&init.send_cq.inner.ctx, ctx) || !Arc::ptr_eq(&init.recv_cq.inner.ctx, ctx)
        {
            return Err(Error::InvalidArgument("CQ belongs to another device"));
        }
        if let Some(srq) = init.srq {
            if !Arc::ptr_eq(srq.inner.pd.context(), ctx) {
                return Err(Error::InvalidArgument("SRQ belongs to another device"));
            }
        }
        let attr = QpInitAttr {
            qp_type: init.qp_type,
            pd: pd.id(),
            send_cq: init.send_cq.id(),
            recv_cq: init.recv_cq.id(),
            srq: init.srq.map(|s| s.id()),
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
        };
        let qpn = ctx.with_core_untimed(|core| {
            let qpn = if gsi {
                core.engine.create_gsi_qp(&attr)?
            } else {
                core.engine.create_qp(&attr)?
            };
            core.own(EventObject::Qp(qpn.value()), ctx.events());
            Ok::<_, Error>(qpn)
        })??;
        Ok(Qp {
            pd: pd.clone(),
            qpn,
            qp_type: init.qp_type,
            send_cq: init.send_cq.inner.clone(),
            recv_cq: init.recv_cq.inner.clone(),
            _srq: init.srq.map(|s| s.inner.clone()),
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        qpn_u32(self.qpn)
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Modifies the QP (`ibv_modify_qp`): the fields of `attr` that `mask` selects.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), Error> {
        let ctx = self.pd.context();
        // ACKs held for the application's answer (see `Stepper::held`) leave first: a NIC
        // or rxe sent them as the packets came, and a QP moved to ERR sends nothing more,
        // so the peer's last SEND would wait out its retries (rdma_disconnect right after
        // the receive completed: rdma_client's pattern).
        ctx.with_core_no_transmit(|core| {
            core.engine
                .modify_qp(ctx.shared().now(), self.qpn, attr, mask)
        })?;
        // A state change may start traffic (RTS) or flush (ERR): let the datapath look.
        ctx.kick();
        Ok(())
    }

    /// Attributes and creation attributes (`ibv_query_qp`).
    pub fn query(&self) -> Result<(QpAttr, QpInitAttr), Error> {
        Ok(self
            .pd
            .context()
            .with_core_untimed(|core| core.engine.query_qp(self.qpn))??)
    }

    /// The current state.
    pub fn state(&self) -> Result<QpState, Error> {
        Ok(self.query()?.0.qp_state)
    }

    /// Attaches this UD QP to the multicast group `gid` (`ibv_attach_mcast`; on RoCE the
    /// multicast LID plays no part): packets sent to the group's address and QPN 0xFFFFFF
    /// reach it, as every other QP attached on this host or elsewhere. Attaching twice
    /// is no error; a QP that is not UD or a GID that is not multicast is EINVAL.
    pub fn attach_mcast(&self, gid: Gid) -> Result<(), Error> {
        let ctx = self.pd.context();
        ctx.with_core_untimed(|core| core.engine.attach_mcast(self.qpn, gid))??;
        if let Err(e) = ctx.sync_mcast() {
            // No socket for the group: the attachment would receive nothing.
            let _ = ctx.with_core_untimed(|core| core.engine.detach_mcast(self.qpn, gid));
            let _ = ctx.sync_mcast();
            return Err(e);
        }
        Ok(())
    }

    /// Detaches this QP from the multicast group `gid` (`ibv_detach_mcast`); EINVAL when
    /// it is not attached.
    pub fn detach_mcast(&self, gid: Gid) -> Result<(), Error> {
        let ctx = self.pd.context();
        ctx.with_core_untimed(|core| core.engine.detach_mcast(self.qpn, gid))??;
        ctx.sync_mcast()
    }

    /// Whether this QP is attached to a multicast group (the kernel then refuses
    /// `ibv_destroy_qp` with EBUSY; dropping a `Qp` detaches it).
    pub fn in_mcast_group(&self) -> bool {
        let ctx = self.pd.context();
        ctx.with_core_always(|core| core.engine.qp_in_mcast_group(self.qpn))
    }

    /// Posts one send WR (`ibv_post_send`). The engine lock is held only to queue it;
    /// the datapath sends it: the application thread at its next CQ poll if it is polling,
    /// else the datapath thread (its doorbell rings only if it sleeps).
    pub fn post_send(&self, wr: SendWr) -> Result<(), Error> {
        let ctx = self.pd.context();
        ctx.post(|core, now| core.engine.post_send(now, self.qpn, wr))??;
        Ok(())
    }

    /// Posts several send WRs under one lock hold and at most one doorbell. On error,
    /// returns the index of the first WR that was not posted (those before it were).
    pub fn post_send_batch(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, Error)> {
        let ctx = self.pd.context();
        let r = ctx
            .post(|core, now| {
                let mut posted = 0usize;
                for wr in wrs {
                    if let Err(e) = core.engine.post_send(now, self.qpn, wr) {
                        return (posted, Err(Error::from(e)));
                    }
                    posted += 1;
                }
                (posted, Ok(()))
            })
            .map_err(|e| (0, e))?;
        r.1.map_err(|e| (r.0, e))
    }

    /// Posts one receive WR (`ibv_post_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), Error> {
        Ok(self
            .pd
            .context()
            .with_core_untimed(|core| core.engine.post_recv(self.qpn, wr))??)
    }

    /// RESET → INIT → RTR → RTS for an RC (or UC) QP towards `remote`, with perftest's
    /// defaults (see [`defaults`]): timeout 14, retry 7, RNR retry 7, min RNR timer 12,
    /// 16 outstanding READ/atomic each way, access LOCAL_WRITE | REMOTE_WRITE |
    /// REMOTE_READ | REMOTE_ATOMIC (UC: LOCAL_WRITE | REMOTE_WRITE). `gid_index` is our
    /// source GID (see [`crate::Context::gid_index_for`]).
    pub fn connect_rc(
        &self,
        local_psn: u32,
        remote: &RemoteQp,
        mtu: Mtu,
        gid_index: u8,
    ) -> Result<(), Error> {
        self.connect_rc_with(
            local_psn,
            remote,
            mtu,
            gid_index,
            &ConnectOptions::default(),
        )
    }

    /// [`Qp::connect_rc`] with other timers, retries, READ depth or access.
    pub fn connect_rc_with(
        &self,
        local_psn: u32,
        remote: &RemoteQp,
        mtu: Mtu,
        gid_index: u8,
        opts: &ConnectOptions,
    ) -> Result<(), Error> {
        self.init_rc(opts.access)?;
        self.ready_rc(local_psn, remote, mtu, gid_index, opts)
    }

    /// RESET → INIT for an RC (or UC) QP granting `access` (`None`: as
    /// [`Qp::connect_rc`]). Receives may be posted from here on, before the peer is
    /// known; [`Qp::ready_rc`] then connects it.
    pub fn init_rc(&self, access: Option<AccessFlags>) -> Result<(), Error> {
        if self.qp_type == QpType::Ud {
            return Err(Error::InvalidArgument(
                "connect_rc on a UD QP (use ready_ud)",
            ));
        }
        let by_type = if self.qp_type == QpType::Rc {
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC
        } else {
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
        };
        let (init, mask) = bringup::init(self.qp_type, access.unwrap_or(by_type), 0);
        self.modify(&init, mask)
    }

    /// INIT → RTR → RTS for an RC (or UC) QP towards `remote` (see
    /// [`Qp::connect_rc_with`]; a UC QP takes only the PSNs, path and MTU).
    pub fn ready_rc(
        &self,
        local_psn: u32,
        remote: &RemoteQp,
        mtu: Mtu,
        gid_index: u8,
        opts: &ConnectOptions,
    ) -> Result<(), Error> {
        let c = bringup::Connect {
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            sq_psn: local_psn,
            av: AddressVector {
                dgid: remote.gid,
                sgid_index: gid_index,
                hop_limit: defaults::HOP_LIMIT,
                port_num: 1,
                ..AddressVector::default()
            },
            path_mtu: mtu,
            rd_atomic: opts.rd_atomic,
            min_rnr_timer: opts.min_rnr_timer,
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
        };
        let (rtr, mask) = c.rtr(self.qp_type);
        self.modify(&rtr, mask)?;
        let (rts, mask) = c.rts(self.qp_type);
        self.modify(&rts, mask)
    }

    /// RESET → INIT → RTR → RTS for a UD QP with Q_Key `qkey` and first PSN `sq_psn`.
    pub fn ready_ud(&self, qkey: u32, sq_psn: u32) -> Result<(), Error> {
        if self.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument(
                "ready_ud on a connected QP (use connect_rc)",
            ));
        }
        let (init, mask) = bringup::init(QpType::Ud, AccessFlags::empty(), qkey);
        self.modify(&init, mask)?;
        let (rtr, mask) = bringup::ud_rtr();
        self.modify(&rtr, mask)?;
        let (rts, mask) = bringup::ud_rts(sq_psn);
        self.modify(&rts, mask)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let qpn = self.qpn;
        // ACKs of what this QP just completed may be held for an answer that will
        // never come (the application is tearing down): they go first, and with them
        // the completions a step delivers after its send.
        let (r, in_group) = self.pd.context().with_core_no_transmit(|core| {
            core.disown(EventObject::Qp(qpn.value()));
            let in_group = core.engine.qp_in_mcast_group(qpn);
            let r = core.engine.destroy_qp(qpn);
            // Its completions not yet polled go with it, as mlx5 and mlx4 clean a
            // destroyed QP's CQEs (`__mlx5_cq_clean`; rxe leaves them): libfabric's
            // verbs provider flushes its CQ after destroying a QP and would hand ofi_rxm
            // a receive on an endpoint it has freed.
            for cq in [&self.send_cq, &self.recv_cq] {
                cq.ring.purge_qp(qpn.value());
            }
            (r, in_group)
        });
        if let Err(e) = r {
            tracing::debug!(qpn = qpn_u32(qpn), "destroy_qp: {e}");
        }
        // It left its groups: a group's socket goes with its last member.
        if in_group {
            if let Err(e) = self.pd.context().sync_mcast() {
                tracing::debug!("multicast sockets after destroy_qp: {e}");
            }
        }
    }
}

/// A shared receive queue (`ibv_srq`). QPs attached to it keep it alive.
#[derive(Debug)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

#[derive(Debug)]
pub(crate) struct SrqInner {
    pub(crate) pd: Pd,
    pub(crate) id: SrqId,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let id = self.id;
        if let Err(e) = self.pd.context().with_core_always(|core| {
            core.disown(EventObject::Srq(id.0));
            core.engine.destroy_srq(id)
        }) {
            tracing::debug!(srq = id.0, "destroy_srq: {e}");
        }
    }
}

impl Srq {
    pub(crate) fn create(pd: &Pd, attr: SrqAttr) -> Result<Srq, Error> {
        let pdid = pd.id();
        let ctx = pd.context();
        let id = ctx.with_core_untimed(|core| {
            let id = core.engine.create_srq(pdid, attr)?;
            core.own(EventObject::Srq(id.0), ctx.events());
            Ok::<_, Error>(id)
        })??;
        Ok(Srq {
            inner: Arc::new(SrqInner { pd: pd.clone(), id }),
        })
    }

    /// The engine's handle (what [`crate::AsyncEvent::SrqLimitReached`] carries).
    pub fn id(&self) -> SrqId {
        self.inner.id
    }

    /// Posts a receive WR (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), Error> {
        let id = self.inner.id;
        Ok(self
            .inner
            .pd
            .context()
            .with_core_untimed(|core| core.engine.post_srq_recv(id, wr))??)
    }

    /// Modifies it (`ibv_modify_srq`); `mask`: [`crate::SRQ_MAX_WR`] | [`crate::SRQ_LIMIT`].
    /// Setting a limit arms [`crate::AsyncEvent::SrqLimitReached`].
    pub fn modify(&self, attr: SrqAttr, mask: u32) -> Result<(), Error> {
        let id = self.inner.id;
        Ok(self
            .inner
            .pd
            .context()
            .with_core_untimed(|core| core.engine.modify_srq(id, attr, mask))??)
    }

    /// Its attributes (`ibv_query_srq`).
    pub fn query(&self) -> Result<SrqAttr, Error> {
        let id = self.inner.id;
        Ok(self
            .inner
            .pd
            .context()
            .with_core_untimed(|core| core.engine.query_srq(id))??)
    }
}

/// An address handle (`ibv_ah`): where a UD send goes.
#[derive(Debug, Clone)]
pub struct Ah {
    _pd: Pd,
    av: AddressVector,
}

impl Ah {
    pub(crate) fn create(pd: &Pd, mut av: AddressVector) -> Result<Ah, Error> {
        if usize::from(av.sgid_index) >= pd.context().gids().len() {
            return Err(Error::InvalidArgument("sgid_index beyond the GID table"));
        }
        if av.dgid == Gid::default() {
            return Err(Error::InvalidArgument("dgid is zero"));
        }
        if av.port_num == 0 {
            av.port_num = 1;
        }
        if av.hop_limit == 0 {
            av.hop_limit = defaults::HOP_LIMIT;
        }
        Ok(Ah {
            _pd: pd.clone(),
            av,
        })
    }

    /// The address vector.
    pub fn av(&self) -> &AddressVector {
        &self.av
    }

    /// The `wr.ud` of a UD send to `remote_qpn` with `remote_qkey` through this AH.
    pub fn ud_dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            av: self.av,
            remote_qpn,
            remote_qkey,
        }
    }
}
