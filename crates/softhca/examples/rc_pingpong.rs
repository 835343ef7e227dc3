//! RC ping-pong between two devices in one process (127.0.0.1 and 127.0.0.2 over real
//! loopback UDP): SEND a message, the peer SENDs it back, N times; prints the latency.
//!
//! ```text
//! cargo run --release -p softhca --example rc_pingpong -- [iterations] [size]
//! SOFTHCA_POLL=busy|adaptive|blocking   datapath idle policy (default adaptive)
//! SOFTHCA_PORT=4791                     UDP port (choose another if 4791 is taken)
//! ```

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca::*;

struct Side {
    ctx: Arc<Context>,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn open(addr: &str, size: usize) -> Result<Side, Error> {
    let ip: IpAddr = addr
        .parse()
        .map_err(|_| Error::InvalidArgument("address"))?;
    let cfg = Config {
        addrs: vec![ip],
        ..Config::from_env()?
    };
    let ctx = Context::open(&cfg)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64, None)?;
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq))?;
    let mr = pd.reg_mr(2 * size.max(1), AccessFlags::LOCAL_WRITE)?;
    Ok(Side { ctx, cq, qp, mr })
}

/// Spins on the CQ (like `ibv_rc_pingpong` without events) for one completion.
fn poll_one(cq: &Cq) -> Result<Completion, Error> {
    let mut wc = [Completion::default(); 1];
    let start = Instant::now();
    loop {
        if cq.poll(&mut wc) == 1 {
            if wc[0].status != WcStatus::Success {
                eprintln!("completion failed: {:?}", wc[0]);
                return Err(Error::InvalidArgument("work completion error"));
            }
            return Ok(wc[0]);
        }
        if start.elapsed() > Duration::from_secs(5) {
            return Err(Error::InvalidArgument("no completion within 5 s"));
        }
        std::hint::spin_loop();
    }
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);

    let a = open("127.0.0.1", size)?;
    let b = open("127.0.0.2", size)?;
    let mtu = a.ctx.active_mtu().min(b.ctx.active_mtu());
    let (psn_a, psn_b) = (0x1234, 0x5678);
    a.qp.connect_rc(
        psn_a,
        &RemoteQp {
            qpn: b.qp.qpn(),
            psn: psn_b,
            gid: b.ctx.gids()[0],
        },
        mtu,
        0,
    )?;
    b.qp.connect_rc(
        psn_b,
        &RemoteQp {
            qpn: a.qp.qpn(),
            psn: psn_a,
            gid: a.ctx.gids()[0],
        },
        mtu,
        0,
    )?;
    println!(
        "rc_pingpong: {} <-> {}, {iters} iterations of {size} bytes, MTU {}, poll {:?}, gso/gro {:?}",
        a.ctx.addrs()[0],
        b.ctx.addrs()[0],
        mtu.bytes(),
        a.ctx.poll_mode(),
        a.ctx.io_capabilities()
    );

    let recv = |s: &Side| {
        s.qp.post_recv(RecvWr {
            wr_id: 1,
            sg_list: smallvec![s.mr.sge(size, size as u32)],
        })
    };
    // A sends from the first half of its MR; B echoes from where it received.
    let send = |s: &Side, offset: usize| {
        s.qp.post_send(SendWr {
            wr_id: 2,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            payload: Payload::Sges(smallvec![s.mr.sge(offset, size as u32)]),
            ..SendWr::default()
        })
    };
    a.mr.fill(0xa5);
    recv(&a)?;
    recv(&b)?;
    let mut rtts = Vec::with_capacity(iters);
    let warmup = (iters / 10).min(1000);
    for i in 0..iters + warmup {
        let t = Instant::now();
        send(&a, 0)?;
        // B: its receive completes, it re-posts and answers.
        let r = poll_one(&b.cq)?;
        if r.opcode != WcOpcode::Recv || r.byte_len as usize != size {
            return Err(Error::InvalidArgument("unexpected completion at B"));
        }
        recv(&b)?;
        send(&b, size)?;
        // A: both its send and the answer complete (any order).
        let mut got_recv = false;
        for _ in 0..2 {
            got_recv |= poll_one(&a.cq)?.opcode == WcOpcode::Recv;
        }
        poll_one(&b.cq)?; // B's send completion
        if !got_recv {
            return Err(Error::InvalidArgument("A got no answer"));
        }
        recv(&a)?;
        if i >= warmup {
            rtts.push(t.elapsed());
        }
    }
    let mut got = vec![0u8; size];
    a.mr.read(size, &mut got)?;
    if got.iter().any(|&x| x != 0xa5) {
        return Err(Error::InvalidArgument("payload corrupted"));
    }
    rtts.sort();
    let pct = |p: f64| {
        rtts[((rtts.len() as f64 * p) as usize).min(rtts.len() - 1)].as_secs_f64() * 1e6 / 2.0
    };
    let avg = rtts.iter().sum::<Duration>().as_secs_f64() * 1e6 / rtts.len() as f64 / 2.0;
    println!(
        "one-way latency (RTT/2): avg {avg:.2} us, p50 {:.2} us, p99 {:.2} us, min {:.2} us",
        pct(0.5),
        pct(0.99),
        pct(0.0)
    );
    Ok(())
}
