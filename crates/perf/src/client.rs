//! The client side of a test: its parameters, the run, and the devices of a one-process
//! run.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use softhca::{Context, Mtu};

use crate::exchange::{Control, Ctl, TestParams};
use crate::setup::{pick_gid, stride, Side};
use crate::{bw, lat, LatStats, Mode, Op, PerfError, PerfResult, Progress, STALL};

/// Buffer memory a verified bandwidth test may use per QP for its slots.
const VERIFY_BUDGET: u64 = 64 << 20;

/// What the user asked of every test of a run (`softhca perf`'s options).
#[derive(Debug, Clone, PartialEq)]
pub struct TestOptions {
    /// Message size (default: 2 bytes for latency, 64 KiB for bandwidth; atomics: 8).
    pub size: Option<u64>,
    /// Messages per test (default: 1000 for latency, 5000 for bandwidth).
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a message count.
    pub duration: Option<f64>,
    /// Queue pairs.
    pub qps: u32,
    /// Outstanding work requests per QP.
    pub tx_depth: u32,
    /// Largest path MTU to use (the port's active MTU caps it).
    pub mtu: Option<u32>,
    /// Check every byte received.
    pub verify: bool,
    /// One buffer for all QPs (bandwidth tests).
    pub shared_buffer: bool,
    /// Sleep until a completion instead of spinning on the CQ (bandwidth tests).
    pub events: bool,
}

/// The parameters of one test of `op` (latency if `lat`) on `ctx`.
pub fn params(o: &TestOptions, op: Op, lat: bool, ctx: &Context) -> Result<TestParams, PerfError> {
    let size = if op == Op::Atomic {
        8
    } else {
        o.size.unwrap_or(if lat { 2 } else { 65536 })
    };
    let iters = match (o.iters, o.duration) {
        (_, Some(_)) => 0,
        (Some(n), None) => n,
        (None, None) => {
            if lat {
                1000
            } else {
                5000
            }
        }
    };
    let slots = if lat {
        2
    } else if o.verify {
        let fit = (VERIFY_BUDGET / stride(size)).max(1);
        u64::from(o.tx_depth).min(fit) as u32
    } else {
        1
    };
    let port = ctx.query_port(1).map_err(PerfError::verbs("query_port"))?;
    let active = port.active_mtu.bytes() as u32;
    let mtu = o.mtu.map_or(active, |m| m.min(active));
    Ok(TestParams {
        op: op.name().into(),
        lat,
        size,
        iters,
        duration_ms: o.duration.map_or(0, |d| (d * 1000.0).round() as u64),
        qps: o.qps,
        tx_depth: o.tx_depth,
        mtu,
        verify: o.verify,
        slots,
        shared: o.shared_buffer && !lat,
        events: o.events,
    })
}

/// A bandwidth test ([`run_test`] with `p.lat` false).
pub fn run_bw(
    ctx: &Arc<Context>,
    ctl: &mut Control,
    p: &TestParams,
    op: Op,
    cq_mod: u32,
    rdma_peer: IpAddr,
    progress: &mut dyn Progress,
) -> Result<PerfResult, PerfError> {
    debug_assert!(!p.lat);
    run_test(ctx, ctl, p, op, cq_mod, rdma_peer, progress)
}

/// A latency test ([`run_test`] with `p.lat` true).
pub fn run_lat(
    ctx: &Arc<Context>,
    ctl: &mut Control,
    p: &TestParams,
    op: Op,
    rdma_peer: IpAddr,
    progress: &mut dyn Progress,
) -> Result<PerfResult, PerfError> {
    debug_assert!(p.lat);
    run_test(ctx, ctl, p, op, 1, rdma_peer, progress)
}

/// One test, client side, over `ctl` to a server: sends `p`, connects the QPs towards
/// `rdma_peer`, runs, and returns what it measured once the server's verdict is in.
/// `cq_mod`: signal one send in this many (bandwidth tests).
pub fn run_test(
    ctx: &Arc<Context>,
    ctl: &mut Control,
    p: &TestParams,
    op: Op,
    cq_mod: u32,
    rdma_peer: IpAddr,
    progress: &mut dyn Progress,
) -> Result<PerfResult, PerfError> {
    let side = Side::create(ctx, p, if p.lat { 2 } else { 1 })?;
    let (gid_index, gid) = pick_gid(ctx, rdma_peer)?;
    if p.lat {
        lat::prepare(&side, op, p)?;
    }
    ctl.send_request(p, &side.infos(gid))?;
    let mtu_bytes = ctl.recv_accept()?;
    let remote = ctl.recv_qps(p.qps)?;
    let mtu = Mtu::from_bytes(mtu_bytes as usize).unwrap_or(Mtu::M1024);
    side.connect(&remote, gid_index, mtu)?;
    let mode = if p.lat { Mode::Lat } else { Mode::Bw };
    progress.begin(Instant::now());
    let run = if p.lat {
        lat::client(&side, op, p, &remote[0], progress)
    } else {
        bw::client(&side, op, p, cq_mod, &remote, ctl, progress)
    };
    let outcome = match run {
        Ok(o) => o,
        Err(e) => {
            let _ = ctl.send(&Ctl::Error(e.to_string()));
            return Err(e);
        }
    };
    ctl.send(&Ctl::End(outcome.counts.clone()))?;
    let verdict = loop {
        match ctl.recv(Some(STALL * 3))? {
            Some(Ctl::Verdict(ok, msg)) => break (ok, msg),
            Some(Ctl::Credit { .. }) => continue,
            Some(other) => {
                return Err(PerfError::exchange(
                    ctl.peer(),
                    format!("unexpected {other:?}"),
                ))
            }
            None => {
                return Err(PerfError::Timeout(format!(
                    "no verdict from server {}",
                    ctl.peer()
                )))
            }
        }
    };
    if !verdict.0 {
        return Err(PerfError::Verify(format!("server: {}", verdict.1)));
    }
    let mut samples = outcome.samples;
    // perftest reports half the round trip for SEND and WRITE ping-pong, the full
    // round trip for READ and atomics.
    let scale = if matches!(op, Op::Send | Op::Write) {
        0.5
    } else {
        1.0
    };
    let lat = p.lat.then(|| LatStats::from_ns(&mut samples, scale));
    let iters: u64 = outcome.counts.iter().sum();
    Ok(PerfResult {
        op: op.name(),
        mode,
        size: p.size,
        iters,
        qps: p.qps,
        mtu: mtu.bytes() as u32,
        seconds: outcome.seconds,
        lat,
        verified: p.verify.then_some(true),
    })
}
