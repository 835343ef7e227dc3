//! Camera and receiver as two processes, possibly on two hosts: [`serve_receiver`]
//! (`softhca stream receive`) listens on TCP, [`run_camera`] (`softhca stream camera
//! --to ADDR`) connects. The TCP connection carries the set-up and the camera's credits,
//! like perftest's out-of-band exchange; frames travel only over RoCEv2 or GVSP/UDP.
//!
//! Messages are JSON lines:
//! 1. camera → host [`CameraHello`]: mode, geometry, its QP and GID;
//! 2. host → camera [`HostAccept`]: its QP, GID, ring (address, rkey), GVSP port;
//! 3. camera → host `Ready` (with the GVSP camera's control address for resends);
//! 4. host → camera `Credit(n)` whenever the count of accounted frames grows;
//! 5. camera → host `Done` with every frame's id, send time and damage flag;
//! 6. host → camera `End` with the receiver's counters.
//!
//! Latency needs the two hosts' CLOCK_MONOTONIC to agree, which holds on one host
//! (namespaces, loopback) and not across hosts.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca::{Config, Context, Gid, Mtu, RemoteQp};

use crate::harness::{
    build_report, camera_loop, check_spec, injected_drops, rc_drop_ppm, receiver_loop, Cam, Rx,
    Shared, HOST_DP_THREAD,
};
use crate::rdma::{FrameSent, RdmaCamera, RdmaReceiver, RingInfo};
use crate::ring::RxCounters;
use crate::stats::named_threads_cpu_s;
use crate::udp::{GvspCamera, GvspReceiver};
use crate::{FrameSpec, Live, Mode, RunReport, StreamConfig, StreamError};

/// Default TCP port of `softhca stream receive`.
pub const DEFAULT_PORT: u16 = 18516;
const HELLO: &str = "SOFTHCA-STREAM/1";
const CAMERA_PSN: u32 = 1;
const HOST_PSN: u32 = 2;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct CameraHello {
    hello: String,
    mode: Mode,
    spec: FrameSpec,
    gvsp_packet_size: usize,
    loss: f64,
    qpn: u32,
    gid: [u8; 16],
    mtu: usize,
}

impl CameraHello {
    /// The camera's side of the set-up; `qpn`, `gid`, `mtu` are 0 for GVSP.
    fn new(cfg: &StreamConfig, qpn: u32, gid: [u8; 16], mtu: usize) -> CameraHello {
        CameraHello {
            hello: HELLO.into(),
            mode: cfg.mode,
            spec: cfg.spec,
            gvsp_packet_size: cfg.gvsp_packet_size,
            loss: cfg.loss,
            qpn,
            gid,
            mtu,
        }
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct HostAccept {
    qpn: u32,
    gid: [u8; 16],
    mtu: usize,
    ring: RingInfo,
    gvsp_dest: Option<SocketAddr>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum CamMsg {
    Ready {
        gvsp_ctl: Option<SocketAddr>,
    },
    Done {
        sent: Vec<FrameSent>,
        /// rc-send: packets the camera's device dropped by fault injection.
        packets_dropped: u64,
    },
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum HostMsg {
    Credit(u64),
    End(RxCounters),
    Refused(String),
}

/// One JSON line each way over the control connection.
struct Line {
    r: BufReader<TcpStream>,
    w: TcpStream,
    peer: SocketAddr,
}

impl Line {
    fn new(s: TcpStream) -> Result<Line, StreamError> {
        let peer = s.peer_addr().map_err(StreamError::io("control peer"))?;
        let _ = s.set_nodelay(true);
        let w = s.try_clone().map_err(StreamError::io("control socket"))?;
        Ok(Line {
            r: BufReader::new(s),
            w,
            peer,
        })
    }
    fn send<T: serde::Serialize>(&mut self, m: &T) -> Result<(), StreamError> {
        send_line(&mut self.w, m)
    }
    fn recv<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, StreamError> {
        recv_line(&mut self.r, self.peer)
    }
}

fn send_line<T: serde::Serialize>(w: &mut TcpStream, m: &T) -> Result<(), StreamError> {
    let mut s = serde_json::to_string(m)
        .map_err(|e| StreamError::Invalid(format!("encode control message: {e}")))?;
    s.push('\n');
    w.write_all(s.as_bytes())
        .map_err(StreamError::io("send control message"))
}

fn recv_line<T: serde::de::DeserializeOwned>(
    r: &mut BufReader<TcpStream>,
    peer: SocketAddr,
) -> Result<T, StreamError> {
    let mut s = String::new();
    let n = r
        .read_line(&mut s)
        .map_err(StreamError::io(format!("control connection to {peer}")))?;
    if n == 0 {
        return Err(StreamError::Invalid(format!(
            "peer {peer} closed the control connection"
        )));
    }
    serde_json::from_str(s.trim_end())
        .map_err(|e| StreamError::Invalid(format!("bad control message from {peer}: {e}")))
}

/// Opens a softhca device on `ip`, named `name` (its datapath thread is
/// `softhca-dp-<name>`).
fn open_device(ip: IpAddr, name: &str, tx_drop_ppm: u32) -> Result<Arc<Context>, StreamError> {
    let base = crate::harness::device_config()?;
    let cfg = Config {
        addrs: vec![ip],
        name: name.into(),
        tx_drop_ppm,
        ..base
    };
    Context::open(&cfg).map_err(StreamError::verbs(format!("open device on {ip}")))
}

/// The receiving host: listens on `listen` (TCP), accepts one camera, streams with the
/// camera's mode and geometry into a ring of `cfg.ring_slots` buffers and reports.
/// `cfg`'s mode, geometry, GVSP packet size and loss are taken from the camera.
pub fn serve_receiver(
    cfg: &StreamConfig,
    listen: SocketAddr,
    ready: &mut dyn FnMut(SocketAddr),
    live: Option<&(dyn Fn(&Live) + Sync)>,
) -> Result<RunReport, StreamError> {
    let l = TcpListener::bind(listen).map_err(StreamError::io(format!("listen on {listen}")))?;
    // The device first: on loopback a camera started next picks another address.
    let ctx = open_device(listen.ip(), "host", 0)?;
    ready(l.local_addr().map_err(StreamError::io("listen address"))?);
    let (s, _) = l.accept().map_err(StreamError::io("accept camera"))?;
    let mut line = Line::new(s)?;
    let hello: CameraHello = line.recv()?;
    let checked = if hello.hello != HELLO {
        Err(StreamError::Invalid(format!(
            "camera speaks {:?}, this receiver {HELLO}",
            hello.hello
        )))
    } else {
        check_spec(&hello.spec)
    };
    match receive_from(cfg, ctx, listen.ip(), &mut line, hello, checked, live) {
        Ok(r) => Ok(r),
        Err(e) => {
            // Tell the camera why, rather than just closing on it.
            let _ = line.send(&HostMsg::Refused(e.to_string()));
            Err(e)
        }
    }
}

fn receive_from(
    cfg: &StreamConfig,
    ctx: Arc<Context>,
    ip: IpAddr,
    line: &mut Line,
    hello: CameraHello,
    checked: Result<(), StreamError>,
    live: Option<&(dyn Fn(&Live) + Sync)>,
) -> Result<RunReport, StreamError> {
    checked?;
    let cfg = StreamConfig {
        mode: hello.mode,
        spec: hello.spec,
        gvsp_packet_size: hello.gvsp_packet_size,
        loss: hello.loss,
        ..cfg.clone()
    };
    let (mut rx, device) = host_setup(&cfg, ctx, ip, line, &hello)?;
    let dp0 = named_threads_cpu_s(HOST_DP_THREAD);
    let sh = Shared::new();
    let start = Instant::now();
    let mut sent: Vec<FrameSent> = Vec::new();
    let mut dropped = 0;
    let peer = line.peer;
    let (r, w) = (&mut line.r, &mut line.w);
    let rxo = std::thread::scope(|s| {
        // Credits out; the camera's Done in. A dead camera ends the run.
        let credits = s.spawn(|| {
            let mut last = 0u64;
            while !sh.rx_done.load(Ordering::Acquire) {
                let n = sh.released.load(Ordering::Acquire);
                if n != last {
                    last = n;
                    if send_line(w, &HostMsg::Credit(n)).is_err() {
                        sh.cam_failed.store(true, Ordering::Release);
                        break;
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let done = s.spawn(|| match recv_line::<CamMsg>(r, peer) {
            Ok(CamMsg::Done {
                sent: v,
                packets_dropped: d,
            }) => {
                sh.sent_total.store(v.len() as u64, Ordering::Release);
                sent = v;
                dropped = d;
            }
            _ => sh.cam_failed.store(true, Ordering::Release),
        });
        let res = receiver_loop(&mut rx, &cfg, &sh, live, start);
        let _ = credits.join();
        let _ = done.join();
        res
    })?;
    let elapsed = start.elapsed().as_secs_f64();
    let dp = if device.is_some() {
        named_threads_cpu_s(HOST_DP_THREAD) - dp0
    } else {
        0.0
    };
    let _ = send_line(&mut line.w, &HostMsg::End(rxo.counters));
    drop(rx);
    drop(device);
    let mut rep = build_report(&cfg, &sent, &rxo, elapsed, dp);
    rep.packets_dropped_at_sender = dropped;
    Ok(rep)
}

/// The host's end of the mode `hello` asks for: the receiver, the accept message with
/// what the camera needs to reach it, and the camera's go-ahead. Returns the receiver
/// and, for the RDMA modes, the device (kept for its datapath thread's CPU time).
fn host_setup(
    cfg: &StreamConfig,
    ctx: Arc<Context>,
    ip: IpAddr,
    line: &mut Line,
    hello: &CameraHello,
) -> Result<(Rx, Option<Arc<Context>>), StreamError> {
    let slots = cfg.ring_slots.clamp(2, 64);
    let mut device = None;
    let mut rx = match cfg.mode {
        Mode::RcSend | Mode::UcWrite => {
            let mut r = RdmaReceiver::new(&ctx, cfg.mode, cfg.spec, slots, cfg.overflow)?;
            let mtu =
                Mtu::from_bytes(hello.mtu.min(ctx.active_mtu().bytes())).unwrap_or(Mtu::M1024);
            let remote = RemoteQp {
                qpn: hello.qpn,
                psn: CAMERA_PSN,
                gid: Gid(hello.gid),
            };
            r.connect(HOST_PSN, &remote, mtu, 0)?;
            line.send(&HostAccept {
                qpn: r.qpn(),
                gid: ctx.gids()[0].0,
                mtu: mtu.bytes(),
                ring: r.ring(),
                gvsp_dest: None,
            })?;
            device = Some(ctx);
            Rx::Rdma(r)
        }
        Mode::Gvsp => {
            let r = GvspReceiver::new(ip, cfg.spec, cfg.gvsp_packet_size, slots, cfg.overflow)?;
            line.send(&HostAccept {
                qpn: 0,
                gid: [0; 16],
                mtu: 0,
                ring: RingInfo::default(),
                gvsp_dest: Some(r.local_addr()?),
            })?;
            Rx::Gvsp(r)
        }
    };
    match line.recv::<CamMsg>()? {
        CamMsg::Ready { gvsp_ctl } => {
            if let (Rx::Gvsp(r), Some(a)) = (&mut rx, gvsp_ctl) {
                r.set_camera_control(a);
            }
        }
        CamMsg::Done { .. } => {
            return Err(StreamError::Invalid("camera ended before starting".into()));
        }
    }
    Ok((rx, device))
}

/// What the camera process saw.
#[derive(Debug, Clone)]
pub struct CameraReport {
    /// Frames sent.
    pub frames_sent: u64,
    /// Frames the loss emulation damaged (uc-write, gvsp).
    pub damaged: u64,
    /// rc-send: packets the device dropped by fault injection.
    pub packets_dropped: u64,
    /// Seconds streaming.
    pub seconds: f64,
    /// The receiver's final counters.
    pub receiver: RxCounters,
}

/// The local address the kernel routes towards `to` from.
fn route_source(to: SocketAddr) -> Result<IpAddr, StreamError> {
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => "0.0.0.0:0".parse(),
        SocketAddr::V6(_) => "[::]:0".parse(),
    }
    .map_err(|_| StreamError::Invalid("address literal".into()))?;
    let u = UdpSocket::bind(any).map_err(StreamError::io("route lookup"))?;
    u.connect(to)
        .map_err(StreamError::io(format!("no route to {to}")))?;
    Ok(u.local_addr()
        .map_err(StreamError::io("route lookup"))?
        .ip())
}

/// The camera: connects to a receiver at `to` (TCP), streams `cfg`'s frames and
/// returns when the receiver has accounted for them. `bind` is the local address to
/// stream from (default: the one the kernel routes towards `to` from; on loopback,
/// the next free 127.0.0.x when the receiver's device holds it).
pub fn run_camera(
    cfg: &StreamConfig,
    to: SocketAddr,
    bind: Option<IpAddr>,
) -> Result<CameraReport, StreamError> {
    check_spec(&cfg.spec)?;
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(5))
        .map_err(StreamError::io(format!("connect to receiver {to}")))?;
    let mut line = Line::new(s)?;
    let ip = match bind {
        Some(ip) => ip,
        None => route_source(to)?,
    };
    let (mut cam, device) = camera_setup(cfg, bind, ip, &mut line)?;
    let sh = Shared::new();
    let start = Instant::now();
    let slots = cfg.ring_slots.clamp(2, 64);
    let peer = line.peer;
    let (mut r, mut w) = (line.r, line.w);
    let mut counters = RxCounters::default();
    let sent = std::thread::scope(|s| {
        // Credits and the receiver's end come in on their own thread.
        let reader = s.spawn(|| {
            loop {
                match recv_line::<HostMsg>(&mut r, peer) {
                    Ok(HostMsg::Credit(n)) => sh.released.store(n, Ordering::Release),
                    Ok(HostMsg::End(c)) => {
                        counters = c;
                        break;
                    }
                    Ok(HostMsg::Refused(_)) | Err(_) => break,
                }
            }
            sh.rx_done.store(true, Ordering::Release);
        });
        let res = camera_loop(&mut cam, cfg, slots, &sh, start, &mut |sent| {
            // What the device dropped so far; a tail still in flight may add a few.
            let packets_dropped = device.as_ref().map_or(0, |c| injected_drops(c));
            send_line(
                &mut w,
                &CamMsg::Done {
                    sent: sent.to_vec(),
                    packets_dropped,
                },
            )
        });
        if res.is_err() {
            // Unblock the reader: the receiver ends when it sees the connection go.
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        let _ = reader.join();
        res
    })?;
    let seconds = start.elapsed().as_secs_f64();
    drop(cam);
    let packets_dropped = device.as_ref().map_or(0, |c| injected_drops(c));
    drop(device);
    Ok(CameraReport {
        frames_sent: sent.len() as u64,
        damaged: sent.iter().filter(|f| f.damaged).count() as u64,
        seconds,
        packets_dropped,
        receiver: counters,
    })
}

/// The camera's end of `cfg.mode`: its device (on loopback the next free address when
/// the receiver's device holds `ip`) or GVSP socket, the hello, the receiver's accept,
/// and the go-ahead.
fn camera_setup(
    cfg: &StreamConfig,
    bind: Option<IpAddr>,
    ip: IpAddr,
    line: &mut Line,
) -> Result<(Cam, Option<Arc<Context>>), StreamError> {
    let mut device = None;
    let cam = match cfg.mode {
        Mode::RcSend | Mode::UcWrite => {
            let ctx = match (bind, ip) {
                (None, IpAddr::V4(v4)) if v4.is_loopback() => {
                    open_free_loopback(v4, rc_drop_ppm(cfg))?
                }
                _ => open_device(ip, "cam", rc_drop_ppm(cfg))?,
            };
            let mut c = RdmaCamera::new(&ctx, cfg.mode, cfg.spec, 4)?;
            c.set_loss(cfg.loss, cfg.seed);
            line.send(&CameraHello::new(
                cfg,
                c.qpn(),
                ctx.gids()[0].0,
                ctx.active_mtu().bytes(),
            ))?;
            let acc = accept(line)?;
            let mtu = Mtu::from_bytes(acc.mtu).unwrap_or(Mtu::M1024);
            let remote = RemoteQp {
                qpn: acc.qpn,
                psn: HOST_PSN,
                gid: Gid(acc.gid),
            };
            c.connect(CAMERA_PSN, &remote, mtu, 0, acc.ring)?;
            line.send(&CamMsg::Ready { gvsp_ctl: None })?;
            device = Some(ctx);
            Cam::Rdma(c)
        }
        Mode::Gvsp => {
            line.send(&CameraHello::new(cfg, 0, [0; 16], 0))?;
            let acc = accept(line)?;
            let dest = acc
                .gvsp_dest
                .ok_or_else(|| StreamError::Invalid("receiver sent no GVSP address".into()))?;
            let mut c = GvspCamera::new(ip, dest, cfg.spec, cfg.gvsp_packet_size, 16)?;
            c.set_loss(cfg.loss, cfg.seed);
            line.send(&CamMsg::Ready {
                gvsp_ctl: Some(c.control_addr()?),
            })?;
            Cam::Gvsp(c)
        }
    };
    Ok((cam, device))
}

fn accept(line: &mut Line) -> Result<HostAccept, StreamError> {
    let v: serde_json::Value = line.recv()?;
    if let Ok(HostMsg::Refused(why)) = serde_json::from_value::<HostMsg>(v.clone()) {
        return Err(StreamError::Invalid(format!("receiver refused: {why}")));
    }
    serde_json::from_value(v)
        .map_err(|e| StreamError::Invalid(format!("bad answer from receiver: {e}")))
}

/// On loopback the receiver's device may hold `ip`'s RoCEv2 port: use the next free
/// 127.0.0.x.
fn open_free_loopback(
    first: std::net::Ipv4Addr,
    tx_drop_ppm: u32,
) -> Result<Arc<Context>, StreamError> {
    let [a, b, c, d] = first.octets();
    let mut last = None;
    for i in 0..254u8 {
        let o = d.wrapping_add(i);
        if o == 0 || o == 255 {
            continue;
        }
        let ip = IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, o));
        match open_device(ip, "cam", tx_drop_ppm) {
            Ok(ctx) => return Ok(ctx),
            Err(StreamError::Verbs { what, source }) if source.errno() == libc::EADDRINUSE => {
                last = Some(StreamError::Verbs { what, source })
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| StreamError::Invalid("no free loopback address".into())))
}
