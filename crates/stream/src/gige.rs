//! Receiving from a real GigE Vision camera: GVCP control ([`crate::gvcp`]) plus the
//! GVSP receiver of the `gvsp` mode, in GEV 1.x id form (16-bit block ids), which is
//! what a camera sends unless switched to extended ids.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use crate::gvcp::{CameraSettings, DeviceInfo, GigeCamera};
use crate::gvsp::ImageLeader;
use crate::ring::{FrameInfo, Overflow, RxCounters};
use crate::udp::GvspReceiver;
use crate::{FrameSpec, PixelFormat, StreamError};

/// What to ask of the camera.
#[derive(Debug, Clone)]
pub struct GigeConfig {
    /// The camera's GVCP address (port 3956 if 0).
    pub camera: SocketAddr,
    /// Frames to receive.
    pub frames: u64,
    /// Image size to set, or the camera's current one.
    pub size: Option<(u32, u32)>,
    /// GVSP packet size to set (IP bytes), or the camera's current one.
    pub packet_size: Option<u32>,
    /// Frame period to set (µs), where the camera has a plain register for it.
    pub frame_period_us: Option<u32>,
    /// Ring slots.
    pub slots: usize,
    /// Give up when no frame arrives for this long.
    pub idle_timeout: Duration,
}

impl GigeConfig {
    /// `frames` frames from `camera` at its current settings.
    pub fn new(camera: SocketAddr, frames: u64) -> GigeConfig {
        GigeConfig {
            camera,
            frames,
            size: None,
            packet_size: None,
            frame_period_us: None,
            slots: 8,
            idle_timeout: Duration::from_secs(3),
        }
    }
}

/// What a GigE session saw.
#[derive(Debug, Clone)]
pub struct GigeReport {
    /// The device's discovery data.
    pub device: DeviceInfo,
    /// Its settings as read back after configuration.
    pub settings: CameraSettings,
    /// Receiver counters (complete, incomplete, lost, resend requests, …).
    pub counters: RxCounters,
    /// Seconds from acquisition start to the last frame.
    pub seconds: f64,
}

/// A delivered frame, as the callback sees it.
pub struct GigeFrame<'a> {
    /// Id (16-bit block id widened), status and times.
    pub info: FrameInfo,
    /// The leader: width, height, pixel format, camera timestamp.
    pub leader: Option<ImageLeader>,
    /// Image payload bytes placed.
    pub payload_len: usize,
    /// The image.
    pub image: &'a [u8],
}

/// Configures the camera, streams `cfg.frames` frames to a GVSP receiver on the
/// address the camera reaches this host at, and calls `on_frame` for each in order.
/// Acquisition is stopped and control released before returning.
pub fn receive(
    cfg: &GigeConfig,
    mut on_frame: impl FnMut(&GigeFrame<'_>),
) -> Result<GigeReport, StreamError> {
    let mut cam = GigeCamera::open(cfg.camera)?;
    if let Some((w, h)) = cfg.size {
        cam.set_size(w, h)?;
    }
    if let Some(p) = cfg.packet_size {
        cam.set_packet_size(p)?;
    }
    if let Some(us) = cfg.frame_period_us {
        cam.set_frame_period_us(us)?;
    }
    let settings = cam.settings()?;
    let pixel = PixelFormat::from_pfnc(settings.pixel_format).ok_or_else(|| {
        StreamError::Invalid(format!(
            "camera pixel format {:#010x} is not Mono8 or BayerRG8",
            settings.pixel_format
        ))
    })?;
    let spec = FrameSpec {
        width: settings.width,
        height: settings.height,
        pixel,
    };
    let ip = cam.local_ip()?;
    let mut rx = GvspReceiver::new(
        IpAddr::V4(ip),
        spec,
        settings.packet_size as usize,
        cfg.slots,
        Overflow::DropOldest,
    )?
    .legacy_ids();
    rx.set_camera_control(cfg.camera);
    let port = rx.local_addr()?.port();
    cam.start(SocketAddrV4::new(ip, port))?;
    let t0 = Instant::now();
    let mut beat = Instant::now();
    let mut last_frame = Instant::now();
    let mut got = 0;
    while got < cfg.frames {
        if beat.elapsed() > Duration::from_secs(1) {
            cam.heartbeat()?;
            beat = Instant::now();
        }
        let Some(f) = rx.next(Duration::from_millis(200))? else {
            if last_frame.elapsed() > cfg.idle_timeout {
                return Err(StreamError::Timeout(format!(
                    "no frame from {} for {:?}",
                    cfg.camera, cfg.idle_timeout
                )));
            }
            continue;
        };
        last_frame = Instant::now();
        got += 1;
        on_frame(&GigeFrame {
            info: f,
            leader: rx.leader(&f),
            payload_len: rx.payload_len(&f),
            image: rx.image(f.slot),
        });
        rx.release(&f);
    }
    let seconds = t0.elapsed().as_secs_f64();
    cam.stop()?;
    Ok(GigeReport {
        device: cam.info().clone(),
        settings,
        counters: rx.counters(),
        seconds,
    })
}
