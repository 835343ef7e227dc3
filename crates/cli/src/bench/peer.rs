//! `softhca bench-peer`: one end of a baseline measurement (TCP stream, TCP and UDP
//! ping-pong, raw UDP blast), run as its own process so every number in `softhca bench`
//! comes from two processes, like the softhca measurements.
//!
//! Protocol with the parent: a server prints `READY <port>` on stdout once it listens;
//! both ends print one JSON object on stdout when done. CPU time is not reported here:
//! the parent takes it from `wait4(2)`, the same way for every child.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use serde_json::json;
use softhca_io::{self as sio, BindOptions, ConnectedSender, RecvBatch, RoceSocket, Transmit};
use softhca_perf::blast::{blast_recv, blast_send, RecvStop, DEFAULT_WINDOW, RECV_BATCH};

use crate::args::{BenchPeerArgs, PeerKind, PeerRole};
use crate::error::CliError;

/// Ping-pong round trips before sampling starts (warms caches and the scheduler).
const WARMUP: u64 = 100;

/// A peer never outlives its measurement by more than this (the parent may be gone).
const GRACE: Duration = Duration::from_secs(30);

/// Entry point of `softhca bench-peer`.
pub fn run(a: &BenchPeerArgs) -> Result<(), CliError> {
    if !(a.duration > 0.0 && a.duration < 3600.0) {
        return Err(CliError::Usage(format!("invalid duration {}", a.duration)));
    }
    let duration = Duration::from_secs_f64(a.duration);
    // Watchdog: a peer whose partner died must not linger in accept() or recv().
    let limit = duration + GRACE;
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("softhca: bench-peer timed out");
        std::process::exit(3);
    });
    let size = usize::try_from(a.size).map_err(|_| CliError::Usage("size too large".into()))?;
    let result = match a.role {
        PeerRole::Server => {
            let bind = SocketAddr::new(a.bind, 0);
            match a.kind {
                PeerKind::TcpStream => tcp_stream_server(bind, size)?,
                PeerKind::TcpPingpong => tcp_pingpong_server(bind, size)?,
                PeerKind::UdpPingpong => udp_pingpong_server(bind, size)?,
                PeerKind::UdpPingpongRoce => roce_pingpong_server(bind, size)?,
                PeerKind::UdpBlast => udp_blast_server(bind, duration, false)?,
                PeerKind::UdpBlastIcrc => udp_blast_server(bind, duration, true)?,
            }
        }
        PeerRole::Client => {
            let to = a
                .to
                .ok_or_else(|| CliError::Usage("bench-peer client needs --to ADDR:PORT".into()))?;
            match a.kind {
                PeerKind::TcpStream => tcp_stream_client(to, size, duration)?,
                PeerKind::TcpPingpong => tcp_pingpong_client(to, size, duration)?,
                PeerKind::UdpPingpong => udp_pingpong_client(to, size, duration)?,
                PeerKind::UdpPingpongRoce => roce_pingpong_client(to, size, duration)?,
                PeerKind::UdpBlast => udp_blast_client(to, size, duration, false)?,
                PeerKind::UdpBlastIcrc => udp_blast_client(to, size, duration, true)?,
            }
        }
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{result}")?;
    out.flush()?;
    Ok(())
}

/// Spin this long on an empty socket before sleeping in the kernel: softhca's default
/// adaptive polling (`SOFTHCA_POLL=adaptive`, 50 µs) does the same, so the ping-pong
/// baselines are not penalised by a wake-up that softhca avoids.
const SPIN: Duration = Duration::from_micros(50);

/// A socket whose blocking mode can be switched (TCP stream or UDP socket).
trait Toggle {
    fn nonblocking(&self, on: bool) -> std::io::Result<()>;
}

impl Toggle for TcpStream {
    fn nonblocking(&self, on: bool) -> std::io::Result<()> {
        self.set_nonblocking(on)
    }
}

impl Toggle for UdpSocket {
    fn nonblocking(&self, on: bool) -> std::io::Result<()> {
        self.set_nonblocking(on)
    }
}

/// One read-like call: non-blocking for up to [`SPIN`], then blocking (the socket is left
/// non-blocking).
fn adaptive<S: Toggle, T>(
    s: &S,
    mut op: impl FnMut(&S) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let start = Instant::now();
    loop {
        match op(s) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() >= SPIN {
                    break;
                }
                std::hint::spin_loop();
            }
            other => return other,
        }
    }
    s.nonblocking(false)?;
    let r = op(s);
    s.nonblocking(true)?;
    r
}

/// `read_exact` with adaptive waiting; `UnexpectedEof` when the peer closed.
fn read_exact_adaptive(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = adaptive(&*s, |mut st: &TcpStream| st.read(&mut buf[done..]))?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        done += n;
    }
    Ok(())
}

/// `write_all` on a non-blocking stream (the echo is small; a full buffer is waited out).
fn write_all_nb(s: &mut TcpStream, buf: &[u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match s.write(&buf[done..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn ready(port: u16) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {port}")?;
    out.flush()?;
    Ok(())
}

fn listen(bind: SocketAddr) -> Result<TcpListener, CliError> {
    let l = TcpListener::bind(bind).map_err(CliError::listen(bind))?;
    let port = l.local_addr().map_err(CliError::listen(bind))?.port();
    ready(port)?;
    Ok(l)
}

fn accept(l: &TcpListener) -> Result<TcpStream, CliError> {
    let (s, _) = l
        .accept()
        .map_err(|e| CliError::exchange("bench client", crate::error::io_msg(&e)))?;
    Ok(s)
}

fn connect(to: SocketAddr) -> Result<TcpStream, CliError> {
    TcpStream::connect_timeout(&to, Duration::from_secs(5)).map_err(|source| {
        softhca_perf::PerfError::Connect {
            addr: to.to_string(),
            source,
        }
        .into()
    })
}

fn net(peer: &str) -> impl Fn(std::io::Error) -> CliError + '_ {
    move |e| CliError::exchange(peer, crate::error::io_msg(&e))
}

/// Receives until EOF; measures from the first byte to EOF.
fn tcp_stream_server(bind: SocketAddr, size: usize) -> Result<serde_json::Value, CliError> {
    let l = listen(bind)?;
    let mut s = accept(&l)?;
    let mut buf = vec![0u8; size.clamp(4096, 1 << 20)];
    let mut bytes = 0u64;
    let mut first: Option<Instant> = None;
    loop {
        let n = s.read(&mut buf).map_err(net("tcp client"))?;
        if n == 0 {
            break;
        }
        first.get_or_insert_with(Instant::now);
        bytes += n as u64;
    }
    let seconds = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    Ok(json!({ "bytes": bytes, "seconds": seconds }))
}

/// Writes `size`-byte messages for `duration`, then closes.
fn tcp_stream_client(
    to: SocketAddr,
    size: usize,
    duration: Duration,
) -> Result<serde_json::Value, CliError> {
    let mut s = connect(to)?;
    let buf = vec![0x5au8; size];
    let start = Instant::now();
    let end = start + duration;
    let mut messages = 0u64;
    while Instant::now() < end {
        s.write_all(&buf).map_err(net("tcp server"))?;
        messages += 1;
    }
    s.shutdown(std::net::Shutdown::Write)
        .map_err(net("tcp server"))?;
    // Wait for the server to read everything (it closes after EOF).
    let mut sink = [0u8; 64];
    let _ = s.read(&mut sink);
    Ok(json!({
        "bytes": messages * size as u64,
        "messages": messages,
        "seconds": start.elapsed().as_secs_f64(),
    }))
}

fn tcp_pingpong_server(bind: SocketAddr, size: usize) -> Result<serde_json::Value, CliError> {
    let l = listen(bind)?;
    let mut s = accept(&l)?;
    s.set_nodelay(true).map_err(net("tcp client"))?;
    s.set_nonblocking(true).map_err(net("tcp client"))?;
    let mut buf = vec![0u8; size];
    let mut iters = 0u64;
    loop {
        match read_exact_adaptive(&mut s, &mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(net("tcp client")(e)),
        }
        write_all_nb(&mut s, &buf).map_err(net("tcp client"))?;
        iters += 1;
    }
    Ok(json!({ "iters": iters }))
}

/// Half round trips in µs, p50 and p99 (perftest's convention for send/write latency).
fn lat_json(samples: &mut [u64], iters: u64, seconds: f64, lost: u64) -> serde_json::Value {
    let l = softhca_perf::LatStats::from_ns(samples, 0.5);
    json!({
        "iters": iters,
        "seconds": seconds,
        "lat_us_p50": l.p50,
        "lat_us_p99": l.p99,
        "lat_us_avg": l.avg,
        "lost": lost,
    })
}

fn tcp_pingpong_client(
    to: SocketAddr,
    size: usize,
    duration: Duration,
) -> Result<serde_json::Value, CliError> {
    let mut s = connect(to)?;
    s.set_nodelay(true).map_err(net("tcp server"))?;
    s.set_nonblocking(true).map_err(net("tcp server"))?;
    let out = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    let mut samples = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    let end = start + duration;
    let mut n = 0u64;
    loop {
        let t = Instant::now();
        if t >= end {
            break;
        }
        write_all_nb(&mut s, &out).map_err(net("tcp server"))?;
        read_exact_adaptive(&mut s, &mut back).map_err(net("tcp server"))?;
        if n >= WARMUP {
            samples.push(t.elapsed().as_nanos() as u64);
        }
        n += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(lat_json(&mut samples, n, seconds, 0))
}

fn udp_bind(bind: SocketAddr) -> Result<UdpSocket, CliError> {
    UdpSocket::bind(bind).map_err(CliError::listen(bind))
}

/// Echoes every datagram; an empty datagram ends the test.
fn udp_pingpong_server(bind: SocketAddr, size: usize) -> Result<serde_json::Value, CliError> {
    let s = udp_bind(bind)?;
    let port = s.local_addr().map_err(CliError::listen(bind))?.port();
    ready(port)?;
    s.set_nonblocking(true).map_err(net("udp client"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(net("udp client"))?;
    let mut buf = vec![0u8; size.max(1) + 1];
    let mut iters = 0u64;
    loop {
        let (n, from) = match adaptive(&s, |u: &UdpSocket| u.recv_from(&mut buf)) {
            Ok(x) => x,
            // The client's end marker was lost (or the client died): stop after 5 s idle.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => return Err(net("udp client")(e)),
        };
        if n == 0 {
            break;
        }
        s.send_to(&buf[..n], from).map_err(net("udp client"))?;
        iters += 1;
    }
    Ok(json!({ "iters": iters }))
}

fn udp_pingpong_client(
    to: SocketAddr,
    size: usize,
    duration: Duration,
) -> Result<serde_json::Value, CliError> {
    let local = SocketAddr::new(to.ip(), 0);
    let s = udp_bind(local)?;
    s.connect(to).map_err(net("udp server"))?;
    // A lost datagram (rare on loopback) costs one timeout and is counted, not fatal.
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(net("udp server"))?;
    s.set_nonblocking(true).map_err(net("udp server"))?;
    let out = vec![0x5au8; size.max(1)];
    let mut back = vec![0u8; size.max(1) + 1];
    let mut samples = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    let end = start + duration;
    let (mut n, mut lost) = (0u64, 0u64);
    loop {
        let t = Instant::now();
        if t >= end {
            break;
        }
        s.send(&out).map_err(net("udp server"))?;
        match adaptive(&s, |u: &UdpSocket| u.recv(&mut back)) {
            Ok(len) if len == out.len() => {
                if n >= WARMUP {
                    samples.push(t.elapsed().as_nanos() as u64);
                }
                n += 1;
            }
            Ok(len) => {
                return Err(CliError::exchange(
                    "udp server",
                    format!("echo of {len} bytes, expected {}", out.len()),
                ))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                lost += 1
            }
            Err(e) => return Err(net("udp server")(e)),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // Tell the server to stop (twice: a datagram may be lost).
    for _ in 0..2 {
        let _ = s.send(&[]);
    }
    Ok(lat_json(&mut samples, n, seconds, lost))
}

/// BTH (12) and ICRC (4) around a SEND's payload.
const ROCE_OVERHEAD: usize = 16;
/// An ACK: BTH, AETH and ICRC.
const ROCE_ACK: usize = 20;

/// What one softhca ping-pong step hands the kernel, without the protocol: a message
/// the size of a SEND packet and, as the last segment of the same GSO send, one the size
/// of the ACK it owes (softhca sends an answer and the ACK of the request it answers
/// together, `Qp::plan`), from a socket connected to the peer (softhca's `senders`),
/// received by the peer's own socket with GRO and cmsgs by `recvmmsg`.
fn roce_step(size: usize) -> Vec<u8> {
    vec![0x5a; size + ROCE_OVERHEAD + ROCE_ACK]
}

/// The first datagram of a client: it comes from the client's receiving socket, so
/// the server learns where to answer (softhca answers to port 4791, not to the port a
/// request came from).
const HELLO: usize = 2;

fn roce_send(s: &ConnectedSender, to: SocketAddr, step: &[u8], size: usize) -> std::io::Result<()> {
    s.socket()
        .send(&[Transmit {
            dst: to,
            src_ip: None,
            tos: 0,
            contents: step,
            pieces: &[],
            segment_size: Some(size + ROCE_OVERHEAD),
        }])
        .map(|_| ())
}

/// A connected sender like softhca's.
fn roce_sender(from: &RoceSocket, to: SocketAddr) -> Result<ConnectedSender, CliError> {
    ConnectedSender::open(from.local_addr().ip(), to, offloads()).map_err(io_err)
}

/// Receives until a datagram whose first segment is `len` bytes (or an end marker of 1
/// byte, or a [`HELLO`]) arrives; returns its source and that length. None after `patience`. Spins for
/// [`SPIN`] on an empty socket, then sleeps in `poll(2)`, like the other baselines and
/// softhca's adaptive polling (two processes spinning forever on a busy 2-core machine
/// get a round trip per scheduler tick).
fn roce_wait(
    s: &RoceSocket,
    batch: &mut RecvBatch,
    len: usize,
    patience: Duration,
) -> std::io::Result<Option<(SocketAddr, usize)>> {
    let start = Instant::now();
    let mut idle_since = start;
    loop {
        match s.recv(batch) {
            Ok(n) => {
                for k in 0..n {
                    let (meta, buf) = batch.get(k);
                    if let Some(first) = sio::segments(&meta, buf).next() {
                        if first.len() == len || first.len() == 1 || first.len() == HELLO {
                            return Ok(Some((meta.src, first.len())));
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        let waited = now.duration_since(start);
        if waited >= patience {
            return Ok(None);
        }
        if now.duration_since(idle_since) < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let mut pfd = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = (patience - waited).as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: one valid pollfd for the call's duration; the result only says whether
        // to receive again, which the loop does either way.
        unsafe {
            libc::poll(&mut pfd, 1, ms);
        }
        idle_since = Instant::now();
    }
}

/// Echoes with softhca's socket setup (see [`roce_step`]); a 1-byte datagram ends it.
fn roce_pingpong_server(bind: SocketAddr, size: usize) -> Result<serde_json::Value, CliError> {
    let s = RoceSocket::bind_with(bind, offloads()).map_err(io_err)?;
    ready(s.local_addr().port())?;
    let mut batch = RecvBatch::for_socket(&s, 32);
    let step = roce_step(size);
    let mut iters = 0u64;
    let len = size + ROCE_OVERHEAD;
    let mut client = None;
    while let Some((from, got)) =
        roce_wait(&s, &mut batch, len, Duration::from_secs(5)).map_err(net("udp client"))?
    {
        match got {
            1 => break,
            HELLO => client = Some((from, roce_sender(&s, from)?)),
            _ => {
                let Some((to, c)) = &client else { continue };
                roce_send(c, *to, &step, size).map_err(net("udp client"))?;
                iters += 1;
            }
        }
    }
    Ok(json!({ "iters": iters }))
}

fn roce_pingpong_client(
    to: SocketAddr,
    size: usize,
    duration: Duration,
) -> Result<serde_json::Value, CliError> {
    let s = RoceSocket::bind_with(SocketAddr::new(to.ip(), 0), offloads()).map_err(io_err)?;
    let mut batch = RecvBatch::for_socket(&s, 32);
    let step = roce_step(size);
    let len = size + ROCE_OVERHEAD;
    s.send(&[Transmit {
        dst: to,
        src_ip: None,
        tos: 0,
        contents: &[0; HELLO],
        pieces: &[],
        segment_size: None,
    }])
    .map_err(net("udp server"))?;
    let c = roce_sender(&s, to)?;
    let mut samples = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    let end = start + duration;
    let (mut n, mut lost) = (0u64, 0u64);
    while Instant::now() < end {
        let t = Instant::now();
        roce_send(&c, to, &step, size).map_err(net("udp server"))?;
        match roce_wait(&s, &mut batch, len, Duration::from_millis(200))
            .map_err(net("udp server"))?
        {
            Some(_) => {
                if n >= WARMUP {
                    samples.push(t.elapsed().as_nanos() as u64);
                }
                n += 1;
            }
            None => lost += 1,
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    for _ in 0..2 {
        let _ = s.send(&[Transmit {
            dst: to,
            src_ip: None,
            tos: 0,
            contents: &[0],
            pieces: &[],
            segment_size: None,
        }]);
    }
    Ok(lat_json(&mut samples, n, seconds, lost))
}

/// GSO and GRO on, and the buffer size a softhca device would ask for.
fn offloads() -> BindOptions {
    BindOptions {
        sockbuf: softhca::Config::from_env().map_or(softhca::DEFAULT_SOCKBUF, |c| c.sockbuf),
        ..BindOptions::DEFAULT
    }
}

fn io_err(e: softhca_io::IoError) -> CliError {
    CliError::Usage(e.to_string())
}

/// Receives the blast (checking each datagram's ICRC with `icrc`); stops 300 ms after
/// the last datagram.
fn udp_blast_server(
    bind: SocketAddr,
    duration: Duration,
    icrc: bool,
) -> Result<serde_json::Value, CliError> {
    let s = RoceSocket::bind_with(bind, offloads()).map_err(io_err)?;
    ready(s.local_addr().port())?;
    let r = blast_recv(
        &s,
        RecvStop {
            idle: Duration::from_millis(300),
            deadline: Instant::now() + duration + Duration::from_secs(10),
            flag: None,
            busy: false,
            batch: RECV_BATCH,
            credit: true,
            icrc,
        },
    )
    .map_err(io_err)?;
    Ok(json!({
        "bytes": r.bytes,
        "datagrams": r.datagrams,
        "calls": r.calls,
        "seconds": r.elapsed.as_secs_f64(),
        "gro": r.capabilities.gro,
        "icrc_failures": r.icrc_failures,
    }))
}

fn udp_blast_client(
    to: SocketAddr,
    size: usize,
    duration: Duration,
    icrc: bool,
) -> Result<serde_json::Value, CliError> {
    let s = RoceSocket::bind_with(SocketAddr::new(to.ip(), 0), offloads()).map_err(io_err)?;
    let r = blast_send(&s, to, size, duration, Some(DEFAULT_WINDOW), icrc)
        .map_err(net("udp blast receiver"))?;
    Ok(json!({
        "bytes": r.bytes,
        "datagrams": r.datagrams,
        "seconds": r.elapsed.as_secs_f64(),
        "gso": r.capabilities.gso,
        "gso_fallbacks": s.gso_fallbacks(),
        "credit_stalls": r.credit_stalls,
    }))
}
