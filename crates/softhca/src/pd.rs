//! Protection domains ([`Pd`]) and the objects created in one: QPs, SRQs, AHs (memory
//! registration is in `mr`).

use std::sync::Arc;

use crate::context::Context;
use crate::cq::Cq;
use crate::error::Error;
use crate::qp::{Ah, Qp, QpInit, Srq};
use crate::{AddressVector, PdId, SrqAttr};

/// A protection domain (`ibv_pd`). Cheap to clone; objects created from it keep it alive.
#[derive(Debug, Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

#[derive(Debug)]
pub(crate) struct PdInner {
    pub(crate) ctx: Arc<Context>,
    pub(crate) id: PdId,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let id = self.id;
        if let Err(e) = self
            .ctx
            .with_core_always(|core| core.engine.memory_mut().dealloc_pd(id))
        {
            tracing::debug!("dealloc_pd: {e}");
        }
    }
}

impl Pd {
    pub(crate) fn new(ctx: Arc<Context>, id: PdId) -> Pd {
        Pd {
            inner: Arc::new(PdInner { ctx, id }),
        }
    }

    /// The device this PD belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.inner.ctx
    }

    /// The engine's handle of this PD.
    pub fn id(&self) -> PdId {
        self.inner.id
    }

    /// Creates a queue pair (`ibv_create_qp`), in RESET.
    pub fn create_qp(&self, init: &QpInit<'_>) -> Result<Qp, Error> {
        Qp::create(self, init)
    }

    /// Creates the device's GSI QP (QPN 1, UD): connection management MADs to QP 1
    /// arrive on it and leave from it. One per device; `Busy` if it exists.
    pub fn create_gsi_qp(&self, init: &QpInit<'_>) -> Result<Qp, Error> {
        Qp::create_gsi(self, init)
    }

    /// Creates a shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, attr: SrqAttr) -> Result<Srq, Error> {
        Srq::create(self, attr)
    }

    /// Creates an address handle (`ibv_create_ah`) for UD sends.
    pub fn create_ah(&self, av: AddressVector) -> Result<Ah, Error> {
        Ah::create(self, av)
    }

    /// Creates a CQ on this PD's device (shortcut for [`Context::create_cq`]).
    pub fn create_cq(&self, cqe: u32) -> Result<Cq, Error> {
        self.inner.ctx.create_cq(cqe, None)
    }
}
