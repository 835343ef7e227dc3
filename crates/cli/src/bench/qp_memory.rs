//! Memory per idle connected RC QP: the resident-set growth of this process when it
//! creates and connects many QPs with one-entry rings (so that almost nothing of the
//! growth is ring space), divided by their number.

use std::net::IpAddr;
use std::sync::Arc;

use softhca::{Config, Context};

use crate::error::CliError;
use softhca_perf::exchange::TestParams;
use softhca_perf::setup::{pick_gid, Side};

/// QPs created for the measurement (1024: many connections on one device).
pub const IDLE_QPS: u32 = 1024;

/// Resident bytes of this process (`/proc/self/statm`, second field, in pages).
fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// Opens a device on `ip`, connects `IDLE_QPS` RC QPs to themselves (RTS, idle) and
/// returns the resident bytes they added per QP.
pub fn measure(ip: IpAddr) -> Result<f64, CliError> {
    let cfg = Config {
        addrs: vec![ip],
        ..Config::from_env().map_err(CliError::verbs("configuration"))?
    };
    let ctx: Arc<Context> =
        Context::open(&cfg).map_err(CliError::verbs(format!("cannot open a device on {ip}")))?;
    let p = TestParams {
        op: "write".into(),
        lat: false,
        size: 64,
        iters: 0,
        duration_ms: 0,
        qps: 1,
        tx_depth: 1,
        mtu: 1024,
        verify: false,
        slots: 1,
        shared: false,
        events: false,
    };
    let (gid_index, gid) = pick_gid(&ctx, ip)?;
    // Warm-up: the first QP brings the CQs, the MR and the allocator's arenas.
    let warm = Side::create(&ctx, &p, 1)?;
    warm.connect(&warm.infos(gid), gid_index, softhca::Mtu::M1024)?;
    let before = rss_bytes().unwrap_or(0);
    let many = Side::create(
        &ctx,
        &TestParams {
            qps: IDLE_QPS,
            ..p.clone()
        },
        1,
    )?;
    many.connect(&many.infos(gid), gid_index, softhca::Mtu::M1024)?;
    let after = rss_bytes().unwrap_or(0);
    // The MR of `many` (two 64-byte slots per QP) is part of the growth but not of a
    // QP: take it out.
    let infos = many.infos(gid);
    let mr = infos.first().map_or(0, |i| i.len) * u64::from(IDLE_QPS);
    if before == 0 || after == 0 {
        return Err(CliError::Usage("cannot read /proc/self/statm".into()));
    }
    let per_qp = after.saturating_sub(before).saturating_sub(mr) as f64 / f64::from(IDLE_QPS);
    drop(many);
    drop(warm);
    Ok(per_qp)
}
