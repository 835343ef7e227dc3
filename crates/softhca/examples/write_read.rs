//! RDMA WRITE a buffer to a peer device, READ it back, verify every byte; then measure
//! 64 KiB RDMA WRITE bandwidth for one second. Both devices live in this process, on
//! 127.0.0.1 and 127.0.0.2, over real loopback UDP.
//!
//! ```text
//! cargo run --release -p softhca --example write_read -- [bytes (default 4 MiB)]
//! SOFTHCA_POLL / SOFTHCA_PORT / SOFTHCA_MTU as for every softhca program
//! ```

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca::*;

const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

struct Side {
    ctx: Arc<Context>,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn open(addr: &str, len: usize) -> Result<Side, Error> {
    let ip: IpAddr = addr
        .parse()
        .map_err(|_| Error::InvalidArgument("address"))?;
    let cfg = Config {
        addrs: vec![ip],
        ..Config::from_env()?
    };
    let ctx = Context::open(&cfg)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1024, None)?;
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = 512;
    let qp = pd.create_qp(&init)?;
    let mr = pd.reg_mr(len, ACCESS)?;
    Ok(Side { ctx, cq, qp, mr })
}

fn wait(cq: &Cq, out: &mut [Completion]) -> Result<usize, Error> {
    let n = cq.wait(out, Duration::from_secs(10))?;
    if n == 0 {
        return Err(Error::InvalidArgument("no completion within 10 s"));
    }
    if let Some(bad) = out[..n].iter().find(|c| c.status != WcStatus::Success) {
        eprintln!("completion failed: {bad:?}");
        return Err(Error::InvalidArgument("work completion error"));
    }
    Ok(n)
}

fn rdma(
    opcode: WrOpcode,
    wr_id: u64,
    local: Sge,
    remote_addr: u64,
    rkey: u32,
    signaled: bool,
) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        flags: if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        },
        payload: Payload::Sges(smallvec![local]),
        remote_addr,
        rkey,
        ..SendWr::default()
    }
}

fn main() -> Result<(), Error> {
    let len: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4 << 20);
    let len = len.clamp(1, 1 << 30);
    // The local MR holds the source and, after it, the READ destination.
    let a = open("127.0.0.1", 2 * len)?;
    let b = open("127.0.0.2", len.max(64 << 10))?;
    let mtu = a.ctx.active_mtu().min(b.ctx.active_mtu());
    a.qp.connect_rc(
        1,
        &RemoteQp {
            qpn: b.qp.qpn(),
            psn: 2,
            gid: b.ctx.gids()[0],
        },
        mtu,
        0,
    )?;
    b.qp.connect_rc(
        2,
        &RemoteQp {
            qpn: a.qp.qpn(),
            psn: 1,
            gid: a.ctx.gids()[0],
        },
        mtu,
        0,
    )?;
    println!(
        "write_read: {} -> {}, {len} bytes, MTU {}, poll {:?}",
        a.ctx.addrs()[0],
        b.ctx.addrs()[0],
        mtu.bytes(),
        a.ctx.poll_mode()
    );

    let data: Vec<u8> = (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8)) as u8)
        .collect();
    a.mr.write(0, &data)?;
    let mut wc = [Completion::default(); 64];

    let t = Instant::now();
    a.qp.post_send(rdma(
        WrOpcode::RdmaWrite,
        1,
        a.mr.sge(0, len as u32),
        b.mr.addr(),
        b.mr.rkey(),
        true,
    ))?;
    wait(&a.cq, &mut wc[..1])?;
    let tw = t.elapsed();
    let ok_write = b.mr.to_vec()[..len] == data[..];

    let t = Instant::now();
    a.qp.post_send(rdma(
        WrOpcode::RdmaRead,
        2,
        a.mr.sge(len, len as u32),
        b.mr.addr(),
        b.mr.rkey(),
        true,
    ))?;
    wait(&a.cq, &mut wc[..1])?;
    let tr = t.elapsed();
    let mut back = vec![0u8; len];
    a.mr.read(len, &mut back)?;
    let ok_read = back == data;
    let gbps = |d: Duration| (len * 8) as f64 / d.as_secs_f64() / 1e9;
    println!(
        "WRITE {len} B: {:?} ({:.2} Gb/s), peer bytes {}",
        tw,
        gbps(tw),
        if ok_write { "match" } else { "DIFFER" }
    );
    println!(
        "READ  {len} B: {:?} ({:.2} Gb/s), read-back bytes {}",
        tr,
        gbps(tr),
        if ok_read { "match" } else { "DIFFER" }
    );
    if !(ok_write && ok_read) {
        return Err(Error::InvalidArgument("data mismatch"));
    }

    // Bandwidth: 64 KiB WRITEs, up to 128 in flight, one in 16 signaled, for ~1 s.
    const MSG: usize = 64 << 10;
    const WINDOW: usize = 128;
    const SIG: usize = 16;
    let src_len = a.mr.len().min(MSG);
    let t = Instant::now();
    let deadline = t + Duration::from_secs(1);
    // Sends complete in order, so one signaled completion accounts for SIG messages;
    // WINDOW is a multiple of SIG, so `posted` always is too.
    let (mut posted, mut completed) = (0usize, 0usize);
    while Instant::now() < deadline {
        while posted - completed < WINDOW {
            let signaled = (posted + 1) % SIG == 0;
            a.qp.post_send(rdma(
                WrOpcode::RdmaWrite,
                posted as u64,
                a.mr.sge(0, src_len as u32),
                b.mr.addr(),
                b.mr.rkey(),
                signaled,
            ))?;
            posted += 1;
        }
        completed += wait(&a.cq, &mut wc)? * SIG;
    }
    while completed < posted {
        completed += wait(&a.cq, &mut wc)? * SIG;
    }
    let el = t.elapsed();
    println!(
        "64 KiB RDMA WRITE bandwidth: {posted} messages in {:.2} s = {:.2} Gb/s",
        el.as_secs_f64(),
        (posted * src_len * 8) as f64 / el.as_secs_f64() / 1e9
    );
    Ok(())
}
