//! RC ping-pong that speaks rdma-core's `ibv_rc_pingpong` connection exchange, so it pairs
//! with the real, unmodified `ibv_rc_pingpong` on another host — e.g. the Linux kernel's
//! Soft-RoCE (rxe) or a RoCE NIC. It is the interop check of the softhca core.
//!
//! ```text
//! cargo run --release -p softhca --example rdma_core_pingpong -- [SERVER] [-n ITERS] [-s SIZE] [-p PORT] [-m MTU]
//! # peer:  ibv_rc_pingpong -g <gid index of its RoCEv2 IPv4 GID> [-n ITERS] [-s SIZE] [SERVER]
//! ```
//!
//! The exchange is rdma-core's `pp_client_exch_dest` / `pp_server_exch_dest`: over TCP
//! (default port 18515) each side sends `"LLLL:QQQQQQ:PPPPPP:GGGG…"` — LID, QPN, PSN in hex
//! and the GID as 32 hex digits in wire order — NUL-terminated in a 52-byte buffer; the
//! client ends with `"done"`. Then both sides post receives and the client sends first;
//! each side sends its next message when its previous send and a receive have completed.
//! QP attributes follow the example: max_rd_atomic 1, min_rnr_timer 12, timeout 14,
//! retry_cnt 7, rnr_retry 7, path MTU 1024 unless `-m` says otherwise.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softhca::*;

const MSG_LEN: usize = 52; // sizeof "0000:000000:000000:00000000000000000000000000000000"
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

struct Args {
    server: Option<String>,
    iters: u64,
    size: usize,
    port: u16,
    mtu: Mtu,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        server: None,
        iters: 1000,
        size: 4096,
        port: 18515,
        mtu: Mtu::M1024,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "-n" => a.iters = val("-n")?.parse().map_err(|_| "bad -n")?,
            "-s" => a.size = val("-s")?.parse().map_err(|_| "bad -s")?,
            "-p" => a.port = val("-p")?.parse().map_err(|_| "bad -p")?,
            "-m" => {
                let bytes: usize = val("-m")?.parse().map_err(|_| "bad -m")?;
                a.mtu = Mtu::from_bytes(bytes).ok_or("-m takes 256, 512, 1024, 2048 or 4096")?;
            }
            s if !s.starts_with('-') => a.server = Some(s.to_string()),
            s => return Err(format!("unknown option {s}")),
        }
    }
    Ok(a)
}

/// One side's connection data, as `ibv_rc_pingpong` prints and sends it.
#[derive(Debug, Clone, Copy)]
struct Dest {
    lid: u16,
    qpn: u32,
    psn: u32,
    gid: Gid,
}

impl Dest {
    fn to_wire(self) -> [u8; MSG_LEN] {
        let gid: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!("{:04x}:{:06x}:{:06x}:{gid}", self.lid, self.qpn, self.psn);
        let mut msg = [0u8; MSG_LEN];
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    fn from_wire(msg: &[u8]) -> Result<Dest, String> {
        let text = std::str::from_utf8(msg)
            .map_err(|_| "peer sent non-text connection data")?
            .trim_end_matches('\0');
        let bad = || format!("peer sent malformed connection data {text:?}");
        let mut f = text.split(':');
        let mut hex = |max: u32| {
            f.next()
                .and_then(|s| u32::from_str_radix(s, 16).ok())
                .filter(|&v| v <= max)
                .ok_or_else(bad)
        };
        let lid = hex(0xffff)? as u16;
        let qpn = hex(0xff_ffff)?;
        let psn = hex(0xff_ffff)?;
        let g = f.next().filter(|g| g.len() == 32).ok_or_else(bad)?;
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Dest {
            lid,
            qpn,
            psn,
            gid: Gid(gid),
        })
    }
}

fn read_msg(s: &mut TcpStream, len: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)
        .map_err(|e| format!("connection exchange: {e}"))?;
    Ok(buf)
}

fn run(a: Args) -> Result<(), String> {
    let ctx = Context::open_default().map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = ctx.create_cq(1024, None).map_err(|e| e.to_string())?;
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_recv_wr = 500;
    init.cap.max_send_wr = 1;
    let qp = pd.create_qp(&init).map_err(|e| e.to_string())?;
    let mr = pd
        .reg_mr(a.size.max(1), AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let psn = rand::random::<u32>() & 0xff_ffff;

    // The GID that reaches the peer (our own address on the route to it).
    let gid_for = |peer: IpAddr| -> Result<(u8, Gid), String> {
        let idx = ctx.gid_index_for(peer).unwrap_or(0);
        let gid = ctx
            .query_gid(1, u32::from(idx))
            .map_err(|e| e.to_string())?;
        Ok((idx, gid))
    };
    let (mut stream, gid_index, rem) = match &a.server {
        Some(host) => {
            let mut s = TcpStream::connect((host.as_str(), a.port))
                .map_err(|e| format!("cannot reach {host}:{}: {e}", a.port))?;
            let (idx, gid) = gid_for(s.peer_addr().map_err(|e| e.to_string())?.ip())?;
            let me = Dest {
                lid: 0,
                qpn: qp.qpn(),
                psn,
                gid,
            };
            println!("  local address:  {me:?}");
            s.write_all(&me.to_wire()).map_err(|e| e.to_string())?;
            let rem = Dest::from_wire(&read_msg(&mut s, MSG_LEN)?)?;
            s.write_all(b"done\0").map_err(|e| e.to_string())?;
            (s, idx, rem)
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", a.port))
                .map_err(|e| format!("cannot listen on port {}: {e}", a.port))?;
            let (mut s, peer) = l.accept().map_err(|e| e.to_string())?;
            let rem = Dest::from_wire(&read_msg(&mut s, MSG_LEN)?)?;
            let (idx, gid) = gid_for(peer.ip())?;
            let me = Dest {
                lid: 0,
                qpn: qp.qpn(),
                psn,
                gid,
            };
            println!("  local address:  {me:?}");
            // The server connects before answering, as pp_server_exch_dest does.
            connect(&qp, psn, &rem, a.mtu, idx)?;
            s.write_all(&me.to_wire()).map_err(|e| e.to_string())?;
            read_msg(&mut s, 5)?; // "done"
            (s, idx, rem)
        }
    };
    println!("  remote address: {rem:?}");
    if a.server.is_some() {
        connect(&qp, psn, &rem, a.mtu, gid_index)?;
    }

    let recv = || {
        qp.post_recv(RecvWr {
            wr_id: RECV_WRID,
            sg_list: smallvec![mr.sge(0, a.size as u32)],
        })
        .map_err(|e| e.to_string())
    };
    let send = || {
        qp.post_send(SendWr {
            wr_id: SEND_WRID,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            payload: Payload::Sges(smallvec![mr.sge(0, a.size as u32)]),
            ..SendWr::default()
        })
        .map_err(|e| e.to_string())
    };
    let rx_depth = 500u64.min(a.iters.max(1));
    for _ in 0..rx_depth {
        recv()?;
    }
    let mut posted_recvs = rx_depth;
    let start = Instant::now();
    let mut pending = RECV_WRID;
    if a.server.is_some() {
        send()?;
        pending |= SEND_WRID;
    }
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut wc = [Completion::default(); 16];
    let mut last_progress = Instant::now();
    while rcnt < a.iters || scnt < a.iters {
        let n = cq.poll(&mut wc);
        if n == 0 {
            if last_progress.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "no completion for 10 s (sent {scnt}, received {rcnt})"
                ));
            }
            std::hint::spin_loop();
            continue;
        }
        last_progress = Instant::now();
        for c in &wc[..n] {
            if c.status != WcStatus::Success {
                return Err(format!(
                    "completion failed: {:?} wr_id {}",
                    c.status, c.wr_id
                ));
            }
            match c.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    rcnt += 1;
                    if posted_recvs < a.iters {
                        recv()?;
                        posted_recvs += 1;
                    }
                }
                other => return Err(format!("completion for unknown wr_id {other}")),
            }
            pending &= !c.wr_id;
            if scnt < a.iters && pending == 0 {
                send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = a.size as f64 * a.iters as f64 * 2.0;
    println!(
        "{} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        bytes * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        a.iters,
        secs * 1e6 / a.iters as f64
    );
    drop(stream.flush());
    Ok(())
}

fn connect(qp: &Qp, psn: u32, rem: &Dest, mtu: Mtu, gid_index: u8) -> Result<(), String> {
    qp.connect_rc(
        psn,
        &RemoteQp {
            qpn: rem.qpn,
            psn: rem.psn,
            gid: rem.gid,
        },
        mtu,
        gid_index,
    )
    .map_err(|e| e.to_string())
}

fn main() {
    if let Err(e) = parse_args().and_then(run) {
        eprintln!("rdma_core_pingpong: {e}");
        std::process::exit(1);
    }
}
