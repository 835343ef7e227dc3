//! The server side of a test.

use std::sync::Arc;

use softhca::{Context, Mtu};

use crate::exchange::{Control, Ctl, TestParams};
use crate::setup::{pick_gid, Side};
use crate::{bw, lat, Op, PerfError, MAX_MESSAGE};

/// A test a server ran to the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// What the client asked for.
    pub params: TestParams,
    /// Messages per QP (the client's count).
    pub counts: Vec<u64>,
}

/// One test, server side, over `ctl` from a client; `allowed`: the only operation this
/// server runs (`None`: any). `None` when the client said `quit`.
pub fn serve_test(
    ctx: &Arc<Context>,
    ctl: &mut Control,
    allowed: Option<Op>,
    events: bool,
) -> Result<Option<Served>, PerfError> {
    let p = TestParams {
        events,
        ..ctl.recv_params()?
    };
    if p.op == "quit" {
        return Ok(None);
    }
    let op = Op::parse(&p.op)
        .ok_or_else(|| PerfError::Usage(format!("client asked for unknown test '{}'", p.op)))?;
    if let Some(only) = allowed.filter(|a| *a != op) {
        return Err(PerfError::Usage(format!(
            "server runs '{}', client asked for '{}'",
            only.name(),
            op.name()
        )));
    }
    if p.size == 0 || p.size > MAX_MESSAGE || p.qps == 0 || p.slots == 0 || p.tx_depth == 0 {
        return Err(PerfError::Usage(
            "client sent invalid test parameters".into(),
        ));
    }
    let max_wr = ctx.query_device().max_qp_wr;
    let rx = if p.lat {
        2
    } else {
        bw::server_rx_depth(op, &p, max_wr)
    };
    let side = Side::create(ctx, &p, rx)?;
    let remote = ctl.recv_qps(p.qps)?;
    let (gid_index, gid) = pick_gid(ctx, remote[0].gid.to_ip())?;
    let own = ctx
        .query_port(1)
        .map_err(PerfError::verbs("query_port"))?
        .active_mtu
        .bytes() as u32;
    let mtu_bytes = p.mtu.min(own);
    let mtu = Mtu::from_bytes(mtu_bytes as usize).unwrap_or(Mtu::M256);
    if p.lat {
        lat::prepare(&side, op, &p)?;
    } else {
        bw::server_prepare(&side, op, &p, max_wr)?;
    }
    side.connect(&remote, gid_index, mtu)?;
    ctl.send_accept(mtu.bytes() as u32)?;
    ctl.send_qps(&side.infos(gid))?;
    let o = if p.lat {
        lat::server(&side, op, &p, &remote[0], ctl)?
    } else {
        bw::server(&side, op, &p, ctl)?
    };
    match &o.verdict {
        Ok(()) => ctl.send(&Ctl::Verdict(true, "ok".into()))?,
        Err(m) => {
            ctl.send(&Ctl::Verdict(false, m.clone()))?;
            return Err(PerfError::Verify(m.clone()));
        }
    }
    Ok(Some(Served {
        params: p,
        counts: o.counts,
    }))
}
