//! Frames from a real GigE Vision device: Aravis's `arv-fake-gv-camera-0.8` (Debian
//! package aravis-tools), controlled over GVCP and streaming GVSP with 16-bit block ids.
//! Skipped (with a note) where the program is not installed, except under CI, where
//! `.ci/run` installs it and a missing camera is a failure.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use softhca_stream::gige::{self, GigeConfig};
use softhca_stream::gvcp::GvcpClient;
use softhca_stream::FrameStatus;

const FAKE: &str = "arv-fake-gv-camera-0.8";

struct Camera(Child);
impl Drop for Camera {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_camera() -> Option<Camera> {
    let child = match Command::new(FAKE)
        .args(["-i", "127.0.0.1", "-s", "SOFTHCA1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "{FAKE} not runnable under CI: {e}"
            );
            eprintln!("skipped: {FAKE} not installed ({e}); apt-get install aravis-tools");
            return None;
        }
    };
    let cam = Camera(child);
    // Wait until it answers discovery.
    let addr: SocketAddr = "127.0.0.1:3956".parse().unwrap();
    let t0 = Instant::now();
    loop {
        let info = GvcpClient::connect(addr).and_then(|mut c| c.discover());
        match info {
            Ok(i) if i.serial == "SOFTHCA1" => return Some(cam),
            Ok(i) => panic!("another GigE device answers on {addr}: {i:?}"),
            Err(e) if t0.elapsed() > Duration::from_secs(10) => {
                panic!("{FAKE} did not answer discovery: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[test]
fn frames_from_aravis_fake_camera() {
    let Some(_cam) = start_camera() else { return };
    let mut cfg = GigeConfig::new("127.0.0.1:3956".parse().unwrap(), 12);
    cfg.size = Some((640, 480));
    cfg.packet_size = Some(1500);
    cfg.frame_period_us = Some(20_000); // 50 fps
    let mut frames = Vec::new();
    let report = gige::receive(&cfg, |f| {
        let l = f.leader.expect("leader");
        // Aravis's diagonal ramp: pixel (x, y) = (x + y + frame id) % 255 at the default
        // exposure and gain, so every byte follows from pixel (0, 0).
        let base = u32::from(f.image[0]);
        let bad = (0..480u32)
            .flat_map(|y| (0..640u32).map(move |x| (x, y)))
            .filter(|&(x, y)| u32::from(f.image[(y * 640 + x) as usize]) != (base + x + y) % 255)
            .count();
        frames.push((
            f.info.id,
            f.info.status,
            l.width,
            l.height,
            l.pixel_format,
            f.payload_len,
            bad,
        ));
    })
    .unwrap();
    assert_eq!(report.device.manufacturer, "Aravis");
    assert_eq!(report.device.serial, "SOFTHCA1");
    assert_eq!((report.settings.width, report.settings.height), (640, 480));
    assert_eq!(report.settings.packet_size, 1500);
    assert_eq!(frames.len(), 12, "{report:?}");
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f.1, FrameStatus::Complete, "frame {i}: {f:?} {report:?}");
        assert_eq!((f.2, f.3, f.4), (640, 480, 0x0108_0001), "frame {i}");
        assert_eq!(f.5, 640 * 480, "frame {i} payload size");
        assert_eq!(f.6, 0, "frame {i}: pixels off the ramp");
        if i > 0 {
            assert!(f.0 > frames[i - 1].0, "ids in order: {frames:?}");
        }
    }
    assert_eq!(
        report.counters.lost + report.counters.incomplete,
        0,
        "{report:?}"
    );
}
