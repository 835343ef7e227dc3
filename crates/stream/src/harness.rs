//! Camera and receiver on two threads of one process, over loopback.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca::{Config, Context, PollMode, RemoteQp};

use crate::frame::{self, FrameSpec};
use crate::rdma::{FrameSent, RdmaCamera, RdmaReceiver};
use crate::ring::{FrameInfo, FrameStatus, Overflow, RxCounters};
use crate::stats::{named_threads_cpu_s, quantile, thread_cpu_s};
use crate::udp::{GvspCamera, GvspReceiver};
use crate::StreamError;

/// Streaming mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    /// RC SEND/RECV, one message per frame.
    RcSend,
    /// UC RDMA WRITE + WRITE-with-immediate per frame.
    UcWrite,
    /// GigE Vision GVSP over UDP with packet resend.
    Gvsp,
}

impl Mode {
    /// `rc-send`, `uc-write`, `gvsp`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::RcSend => "rc-send",
            Mode::UcWrite => "uc-write",
            Mode::Gvsp => "gvsp",
        }
    }
    /// Parses a mode name.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "rc-send" => Some(Mode::RcSend),
            "uc-write" => Some(Mode::UcWrite),
            "gvsp" => Some(Mode::Gvsp),
            _ => None,
        }
    }
}

/// One loopback run.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Mode.
    pub mode: Mode,
    /// Frame geometry.
    pub spec: FrameSpec,
    /// Frames to send (ignored when `duration` is set).
    pub frames: u64,
    /// Run this long instead.
    pub duration: Option<Duration>,
    /// Frames per second, 0 = as fast as possible.
    pub fps: f64,
    /// Loss probability per packet at the sender. gvsp: datagrams the camera does not
    /// send; uc-write: WRITE packets as the UC responder would lose them (the camera
    /// knows which frames it damaged); rc-send: packets the camera's softhca device
    /// drops before the kernel (`Config::tx_drop_ppm`), recovered by RC retransmission.
    pub loss: f64,
    /// Host ring slots.
    pub ring_slots: usize,
    /// Ring overflow policy.
    pub overflow: Overflow,
    /// The camera waits until the host has finished with frame `id - ring_slots + 1`
    /// before sending frame `id` (in-process credits; see the crate docs).
    pub credits: bool,
    /// GVSP packet size (IP header to end).
    pub gvsp_packet_size: usize,
    /// Check every byte of every complete frame.
    pub verify: bool,
    /// Write the first complete frame here as PNG.
    pub save_frame: Option<PathBuf>,
    /// Loss RNG seed.
    pub seed: u64,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            mode: Mode::RcSend,
            spec: FrameSpec::default(),
            frames: 100,
            duration: None,
            fps: 0.0,
            loss: 0.0,
            ring_slots: 8,
            overflow: Overflow::DropOldest,
            credits: true,
            gvsp_packet_size: 9000,
            verify: true,
            save_frame: None,
            seed: 1,
        }
    }
}

/// The result of one run (one row of `--compare`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunReport {
    /// Mode name.
    pub mode: &'static str,
    /// Frame geometry.
    pub width: u32,
    /// Frame geometry.
    pub height: u32,
    /// Loss probability applied at the sender.
    pub loss: f64,
    /// Frames the camera sent.
    pub frames_sent: u64,
    /// Wall time from the first frame to the receiver's end.
    pub seconds: f64,
    /// Complete frames per second.
    pub fps: f64,
    /// Image payload of complete frames, Gb/s.
    pub gbps: f64,
    /// Receiver thread CPU seconds (its thread CPU clock), verification excluded.
    pub rx_cpu_s: f64,
    /// Receiver thread CPU seconds per GB of complete frames.
    pub rx_cpu_s_per_gb: f64,
    /// Also counting the host device's datapath thread (RDMA modes: the "NIC" is
    /// software here, and it runs on the host's CPU).
    pub rx_total_cpu_s_per_gb: f64,
    /// Receiver counters.
    pub counters: RxCounters,
    /// Complete frames whose bytes did not match the pattern (must be 0).
    pub corrupt: u64,
    /// Frames sent but never delivered.
    pub missing: u64,
    /// Frames the loss emulation damaged at the sender.
    pub damaged_at_sender: u64,
    /// uc-write: the set of incomplete or missing frames equals the set damaged.
    pub damage_named_exactly: bool,
    /// Frame ready at the camera (`FrameSent::ready_ns`) → frame delivered by the
    /// receiver, p50, µs.
    pub latency_p50_us: f64,
    /// Same, p99.
    pub latency_p99_us: f64,
    /// Whether `loss` was applied in this mode.
    pub loss_emulated: bool,
    /// rc-send: packets the camera's device dropped (fault injection); the transport
    /// retransmitted them.
    pub packets_dropped_at_sender: u64,
}

/// Live numbers for a progress line.
#[derive(Debug, Clone, Copy)]
pub struct Live {
    /// Mode.
    pub mode: Mode,
    /// Seconds since start.
    pub seconds: f64,
    /// Frames per second over the run so far.
    pub fps: f64,
    /// Gb/s so far.
    pub gbps: f64,
    /// Receiver CPU so far, % of one core: its thread plus the host device's datapath
    /// thread (RDMA modes).
    pub cpu_pct: f64,
    /// Counters.
    pub counters: RxCounters,
}

/// Packets a camera's devices agree on with a softhca peer unless `SOFTHCA_JUMBO` says
/// otherwise: four of them with their headers fill a 64 KiB GSO/GRO datagram, where the
/// device default (16 KiB, best for 64 KiB messages) fits three, so a frame takes a
/// quarter fewer system calls on each side.
const FRAME_JUMBO: u64 = 15872;

/// The configuration of a camera's or a receiver's device: the environment over the
/// stream's defaults. Blocking unless `SOFTHCA_POLL` says otherwise, so that the
/// receiver's CPU figures show work, not spinning; [`FRAME_JUMBO`] packets.
pub(crate) fn device_config() -> Result<Config, StreamError> {
    Config::from_env_with(Config {
        poll: PollMode::Blocking,
        jumbo: FRAME_JUMBO,
        ..Config::default()
    })
    .map_err(StreamError::verbs("configuration"))
}

/// Opens two devices on free loopback addresses (127.0.0.x), named `cam` and `host`.
fn open_pair(cam_drop_ppm: u32) -> Result<(Arc<Context>, Arc<Context>), StreamError> {
    let base = device_config()?;
    let mut got: Vec<Arc<Context>> = Vec::new();
    for octet in 1..255u8 {
        let cfg = Config {
            addrs: vec![IpAddr::V4(Ipv4Addr::new(127, 0, 0, octet))],
            name: if got.is_empty() { "cam" } else { "host" }.into(),
            tx_drop_ppm: if got.is_empty() { cam_drop_ppm } else { 0 },
            ..base.clone()
        };
        match Context::open(&cfg) {
            Ok(c) => got.push(c),
            Err(e) if e.errno() == libc::EADDRINUSE => continue,
            Err(e) => return Err(StreamError::verbs("open loopback device")(e)),
        }
        if got.len() == 2 {
            let host = got.pop();
            let cam = got.pop();
            if let (Some(c), Some(h)) = (cam, host) {
                return Ok((c, h));
            }
        }
    }
    Err(StreamError::Invalid(
        "no two free loopback addresses (127.0.0.1-254)".into(),
    ))
}

pub(crate) enum Rx {
    Rdma(RdmaReceiver),
    Gvsp(GvspReceiver),
}

impl Rx {
    fn next(&mut self, t: Duration) -> Result<Option<FrameInfo>, StreamError> {
        match self {
            Rx::Rdma(r) => r.next(t),
            Rx::Gvsp(r) => r.next(t),
        }
    }
    fn image(&self, slot: usize) -> &[u8] {
        match self {
            Rx::Rdma(r) => r.image(slot),
            Rx::Gvsp(r) => r.image(slot),
        }
    }
    fn release(&mut self, f: &FrameInfo) -> Result<(), StreamError> {
        match self {
            Rx::Rdma(r) => r.release(f),
            Rx::Gvsp(r) => {
                r.release(f);
                Ok(())
            }
        }
    }
    fn counters(&self) -> RxCounters {
        match self {
            Rx::Rdma(r) => r.counters(),
            Rx::Gvsp(r) => r.counters(),
        }
    }
}

pub(crate) enum Cam {
    Rdma(RdmaCamera),
    Gvsp(GvspCamera),
}

pub(crate) struct RxOut {
    delivered: Vec<(u64, u64, FrameStatus)>,
    pub counters: RxCounters,
    cpu_s: f64,
    corrupt: u64,
}

/// What the camera and receiver loops share: in one process directly, between two
/// processes mirrored over the TCP control connection (see [`crate::apart`]).
#[derive(Default)]
pub(crate) struct Shared {
    /// Frames the receiver has accounted for (complete, incomplete, dropped, lost): the
    /// camera's credit.
    pub released: AtomicU64,
    /// Frames the camera sent, once it has finished (`u64::MAX` before).
    pub sent_total: AtomicU64,
    /// The receiver has finished.
    pub rx_done: AtomicBool,
    /// The camera stopped on an error.
    pub cam_failed: AtomicBool,
}

impl Shared {
    pub fn new() -> Shared {
        Shared {
            sent_total: AtomicU64::new(u64::MAX),
            ..Shared::default()
        }
    }
}

/// How long the camera waits for the receiver's count to move before sending anyway.
const CREDIT_STALL: Duration = Duration::from_secs(1);

/// Checks the frame geometry of a run.
pub(crate) fn check_spec(spec: &FrameSpec) -> Result<(), StreamError> {
    if spec.image_len() == 0 || spec.image_len() > (1 << 30) {
        return Err(StreamError::Invalid(
            "frame size must be 1 B ..= 1 GiB".into(),
        ));
    }
    Ok(())
}

/// The camera's loop: paces, waits for credits, sends frames; calls `finished` with
/// what it sent, then keeps answering GVSP resends (or flushes its RDMA sends) until
/// the receiver is done.
pub(crate) fn camera_loop(
    cam: &mut Cam,
    cfg: &StreamConfig,
    slots: usize,
    sh: &Shared,
    start: Instant,
    finished: &mut dyn FnMut(&[FrameSent]) -> Result<(), StreamError>,
) -> Result<Vec<FrameSent>, StreamError> {
    let frames = if cfg.duration.is_some() {
        u64::MAX
    } else {
        cfg.frames
    };
    let mut sent = Vec::new();
    let window = slots as u64 - 1;
    let res = (|| {
        for id in 0..frames {
            if cfg.duration.is_some_and(|d| start.elapsed() >= d) {
                break;
            }
            if cfg.fps > 0.0 {
                let due = start + Duration::from_secs_f64(id as f64 / cfg.fps);
                while Instant::now() < due {
                    if let Cam::Gvsp(c) = cam {
                        c.serve_resends()?;
                    }
                    std::thread::sleep(
                        due.saturating_duration_since(Instant::now())
                            .min(Duration::from_micros(500)),
                    );
                }
            }
            if cfg.credits {
                // A receiver learns of a frame lost whole (UC, GVSP) only from a later
                // one; if everything after it is lost too, its count stalls. Like a
                // real camera, which never waits, go on after CREDIT_STALL.
                let mut seen = sh.released.load(Ordering::Acquire);
                let mut since = Instant::now();
                while id >= sh.released.load(Ordering::Acquire) + window {
                    if sh.rx_done.load(Ordering::Acquire) {
                        return Err(StreamError::Timeout(
                            "receiver stopped before the camera".into(),
                        ));
                    }
                    let now = sh.released.load(Ordering::Acquire);
                    if now != seen {
                        (seen, since) = (now, Instant::now());
                    } else if since.elapsed() > CREDIT_STALL {
                        break;
                    }
                    if let Cam::Gvsp(c) = cam {
                        c.serve_resends()?;
                    }
                    std::thread::yield_now();
                }
            }
            let fs = match cam {
                Cam::Rdma(c) => c.send_frame(id)?,
                Cam::Gvsp(c) => c.send_frame(id)?,
            };
            sent.push(fs);
        }
        Ok(())
    })();
    if res.is_err() {
        sh.cam_failed.store(true, Ordering::Release);
    }
    finished(&sent)?;
    sh.sent_total.store(sent.len() as u64, Ordering::Release);
    // Keep answering resends until the receiver is done.
    match cam {
        Cam::Rdma(c) => {
            let _ = c.flush(Duration::from_secs(10));
        }
        Cam::Gvsp(c) => {
            let t0 = Instant::now();
            while !sh.rx_done.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(30) {
                c.serve_resends()?;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
    res.map(|_| sent)
}

/// The receiver's loop: takes frames in order, verifies them, saves one, publishes
/// credits and live numbers, and ends when every sent frame is accounted for (or
/// nothing came for 2 s after the camera finished).
pub(crate) fn receiver_loop(
    rx: &mut Rx,
    cfg: &StreamConfig,
    sh: &Shared,
    live: Option<&(dyn Fn(&Live) + Sync)>,
    start: Instant,
) -> Result<RxOut, StreamError> {
    let spec = cfg.spec;
    let cpu0 = thread_cpu_s();
    let dp0 = named_threads_cpu_s(HOST_DP_THREAD);
    let mut verify_cpu = 0.0;
    let mut delivered = Vec::new();
    let mut corrupt = 0u64;
    let mut saved = cfg.save_frame.is_none();
    let mut last_live = Instant::now();
    let mut idle_since: Option<Instant> = None;
    let res = (|| {
        loop {
            let f = rx.next(Duration::from_millis(20))?;
            if let Some(f) = f {
                idle_since = None;
                if f.status == FrameStatus::Complete && (cfg.verify || !saved) {
                    let v0 = thread_cpu_s();
                    let img = rx.image(f.slot);
                    if cfg.verify && frame::verify(&spec, f.id, img).is_err() {
                        corrupt += 1;
                    }
                    if !saved {
                        if let Some(p) = &cfg.save_frame {
                            crate::png::write_gray8(p, spec.width, spec.height, img)
                                .map_err(StreamError::io(format!("write {}", p.display())))?;
                        }
                        saved = true;
                    }
                    verify_cpu += thread_cpu_s() - v0;
                }
                delivered.push((f.id, f.arrival_ns, f.status));
                rx.release(&f)?;
            }
            let c = rx.counters();
            let accounted = c.complete + c.incomplete + c.dropped + c.lost;
            sh.released.store(accounted, Ordering::Release);
            if let Some(cb) = live {
                if last_live.elapsed() >= Duration::from_millis(500) {
                    last_live = Instant::now();
                    let t = start.elapsed().as_secs_f64();
                    let cpu = thread_cpu_s() - cpu0 - verify_cpu
                        + (named_threads_cpu_s(HOST_DP_THREAD) - dp0);
                    cb(&Live {
                        mode: cfg.mode,
                        seconds: t,
                        cpu_pct: 100.0 * cpu / t.max(1e-9),
                        fps: c.complete as f64 / t,
                        gbps: (c.complete * spec.image_len() as u64 * 8) as f64 / t / 1e9,
                        counters: c,
                    });
                }
            }
            let total = sh.sent_total.load(Ordering::Acquire);
            if total != u64::MAX {
                if accounted >= total {
                    break;
                }
                // Nothing more will come (frames lost at the tail).
                let idle = *idle_since.get_or_insert_with(Instant::now);
                if f.is_none() && idle.elapsed() > Duration::from_secs(2) {
                    break;
                }
            } else if sh.cam_failed.load(Ordering::Acquire) {
                break;
            }
        }
        Ok(())
    })();
    sh.rx_done.store(true, Ordering::Release);
    res?;
    Ok(RxOut {
        delivered,
        counters: rx.counters(),
        cpu_s: (thread_cpu_s() - cpu0 - verify_cpu).max(0.0),
        corrupt,
    })
}

/// rc-send applies `loss` in the camera's device (see [`StreamConfig::loss`]).
pub(crate) fn rc_drop_ppm(cfg: &StreamConfig) -> u32 {
    if cfg.mode == Mode::RcSend {
        (cfg.loss.clamp(0.0, 0.999_999) * 1e6).round() as u32
    } else {
        0
    }
}

/// The camera device's count of packets dropped by fault injection.
pub(crate) fn injected_drops(ctx: &Context) -> u64 {
    ctx.counters()
        .into_iter()
        .find(|(n, _)| *n == "io_tx_injected_drops")
        .map_or(0, |(_, v)| v)
}

/// Name of the host device's datapath thread (its CPU counts as the receiver's).
pub(crate) const HOST_DP_THREAD: &str = "softhca-dp-host";

/// Runs camera and receiver on two threads over loopback and reports.
pub fn run_loopback(
    cfg: &StreamConfig,
    live: Option<&(dyn Fn(&Live) + Sync)>,
) -> Result<RunReport, StreamError> {
    let spec = cfg.spec;
    check_spec(&spec)?;
    let slots = cfg.ring_slots.clamp(2, 64);
    let mut devices = None;
    let (mut cam, mut rx) = match cfg.mode {
        Mode::RcSend | Mode::UcWrite => {
            let (cctx, hctx) = open_pair(rc_drop_ppm(cfg))?;
            let mut r = RdmaReceiver::new(&hctx, cfg.mode, spec, slots, cfg.overflow)?;
            let mut c = RdmaCamera::new(&cctx, cfg.mode, spec, 4)?;
            c.set_loss(cfg.loss, cfg.seed);
            let mtu = cctx.active_mtu().min(hctx.active_mtu());
            let (cg, hg) = (cctx.gids()[0], hctx.gids()[0]);
            r.connect(
                2,
                &RemoteQp {
                    qpn: c.qpn(),
                    psn: 1,
                    gid: cg,
                },
                mtu,
                0,
            )?;
            c.connect(
                1,
                &RemoteQp {
                    qpn: r.qpn(),
                    psn: 2,
                    gid: hg,
                },
                mtu,
                0,
                r.ring(),
            )?;
            devices = Some((cctx, hctx));
            (Cam::Rdma(c), Rx::Rdma(r))
        }
        Mode::Gvsp => {
            let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
            let mut r = GvspReceiver::new(ip, spec, cfg.gvsp_packet_size, slots, cfg.overflow)?;
            let mut c = GvspCamera::new(ip, r.local_addr()?, spec, cfg.gvsp_packet_size, 16)?;
            c.set_loss(cfg.loss, cfg.seed);
            r.set_camera_control(c.control_addr()?);
            (Cam::Gvsp(c), Rx::Gvsp(r))
        }
    };
    let dp_cpu0 = if devices.is_some() {
        named_threads_cpu_s(HOST_DP_THREAD)
    } else {
        0.0
    };
    let sh = Shared::new();
    let start = Instant::now();
    let (cam_res, rx_res) = std::thread::scope(|s| {
        let camera = s.spawn(|| camera_loop(&mut cam, cfg, slots, &sh, start, &mut |_| Ok(())));
        let receiver = s.spawn(|| receiver_loop(&mut rx, cfg, &sh, live, start));
        let r = receiver.join();
        let c = camera.join();
        (c, r)
    });
    let elapsed = start.elapsed().as_secs_f64();
    let dp_cpu = if devices.is_some() {
        named_threads_cpu_s(HOST_DP_THREAD) - dp_cpu0
    } else {
        0.0
    };
    let packets_dropped = devices.as_ref().map_or(0, |(c, _)| injected_drops(c));
    drop(devices);
    let panicked = || StreamError::Invalid("a stream thread panicked".into());
    let rxo = rx_res.map_err(|_| panicked())??;
    let sent = cam_res.map_err(|_| panicked())??;
    let mut rep = build_report(cfg, &sent, &rxo, elapsed, dp_cpu);
    if cfg.mode == Mode::RcSend {
        rep.packets_dropped_at_sender = packets_dropped;
    }
    Ok(rep)
}

/// One row of the report from what the camera sent and what the receiver saw.
pub(crate) fn build_report(
    cfg: &StreamConfig,
    sent: &[FrameSent],
    rxo: &RxOut,
    elapsed: f64,
    dp_cpu: f64,
) -> RunReport {
    let spec = cfg.spec;
    let c = rxo.counters;
    let bytes = c.complete as f64 * spec.image_len() as f64;
    let gb = bytes / 1e9;
    let mut lat: Vec<f64> = Vec::new();
    let sent_at: std::collections::HashMap<u64, u64> =
        sent.iter().map(|s| (s.id, s.ready_ns)).collect();
    for (id, arr, st) in &rxo.delivered {
        if *st == FrameStatus::Complete {
            if let Some(t) = sent_at.get(id) {
                lat.push(arr.saturating_sub(*t) as f64 / 1e3);
            }
        }
    }
    let delivered_ids: BTreeSet<u64> = rxo.delivered.iter().map(|d| d.0).collect();
    let bad: BTreeSet<u64> = rxo
        .delivered
        .iter()
        .filter(|d| d.2 == FrameStatus::Incomplete)
        .map(|d| d.0)
        .chain(
            sent.iter()
                .map(|s| s.id)
                .filter(|i| !delivered_ids.contains(i)),
        )
        .collect();
    let damaged: BTreeSet<u64> = sent.iter().filter(|s| s.damaged).map(|s| s.id).collect();
    let missing = sent
        .iter()
        .filter(|s| !delivered_ids.contains(&s.id))
        .count() as u64;
    let per_gb = |cpu: f64| if gb > 0.0 { cpu / gb } else { 0.0 };
    RunReport {
        mode: cfg.mode.name(),
        width: spec.width,
        height: spec.height,
        loss: cfg.loss,
        frames_sent: sent.len() as u64,
        seconds: elapsed,
        fps: c.complete as f64 / elapsed,
        gbps: bytes * 8.0 / elapsed / 1e9,
        rx_cpu_s: rxo.cpu_s,
        rx_cpu_s_per_gb: per_gb(rxo.cpu_s),
        rx_total_cpu_s_per_gb: per_gb(rxo.cpu_s + dp_cpu),
        counters: c,
        corrupt: rxo.corrupt,
        missing,
        damaged_at_sender: damaged.len() as u64,
        damage_named_exactly: bad == damaged,
        latency_p50_us: quantile(&mut lat, 0.5),
        latency_p99_us: quantile(&mut lat, 0.99),
        loss_emulated: cfg.loss > 0.0,
        packets_dropped_at_sender: 0,
    }
}
