//! Camera and receiver as the two ends of `softhca stream camera --to` / `stream
//! receive`: set-up, credits and the end of the run over the TCP control connection.

use std::net::SocketAddr;
use std::sync::mpsc;

use softhca_stream::apart::{run_camera, serve_receiver};
use softhca_stream::{FrameSpec, Mode, Overflow, PixelFormat, StreamConfig};

fn run(mode: Mode, listen: &str, loss: f64) {
    let cfg = StreamConfig {
        mode,
        spec: FrameSpec {
            width: 640,
            height: 480,
            pixel: PixelFormat::Mono8,
        },
        frames: 30,
        loss,
        overflow: Overflow::Block,
        gvsp_packet_size: 1500,
        ..StreamConfig::default()
    };
    let listen: SocketAddr = listen.parse().unwrap();
    let (tx, rx) = mpsc::channel();
    // Mode and geometry come from the camera; ring policy is the receiver's.
    let host_cfg = StreamConfig {
        overflow: Overflow::Block,
        ..StreamConfig::default()
    };
    let host = std::thread::spawn(move || {
        serve_receiver(&host_cfg, listen, &mut |a| tx.send(a).unwrap(), None)
    });
    let addr = rx.recv().unwrap();
    let cam = run_camera(&cfg, addr, None).unwrap();
    let rep = host.join().unwrap().unwrap();
    assert_eq!(rep.mode, mode.name());
    assert_eq!((rep.width, rep.height), (640, 480));
    assert_eq!(cam.frames_sent, 30);
    assert_eq!(rep.frames_sent, 30);
    assert_eq!(rep.corrupt, 0, "{rep:?}");
    assert_eq!(
        cam.receiver, rep.counters,
        "the camera learns the receiver's counters"
    );
    if loss == 0.0 || mode == Mode::RcSend {
        assert_eq!(rep.counters.complete, 30, "{rep:?}");
        if loss > 0.0 {
            assert!(cam.packets_dropped > 0, "{cam:?}");
        }
    } else {
        // uc-write: exactly the damaged frames are incomplete or missing.
        assert!(cam.damaged > 0, "{cam:?}");
        assert!(rep.damage_named_exactly, "{rep:?}");
        assert_eq!(rep.counters.complete, 30 - cam.damaged, "{rep:?}");
    }
}

#[test]
fn rc_send_two_ends() {
    run(Mode::RcSend, "127.0.3.10:0", 0.0);
}

#[test]
fn uc_write_two_ends() {
    run(Mode::UcWrite, "127.0.3.20:0", 0.0);
}

#[test]
fn gvsp_two_ends() {
    run(Mode::Gvsp, "127.0.3.30:0", 0.0);
}

#[test]
fn uc_write_two_ends_names_damaged_frames() {
    run(Mode::UcWrite, "127.0.3.40:0", 0.002);
}

#[test]
fn rc_send_two_ends_recovers_dropped_packets() {
    run(Mode::RcSend, "127.0.3.50:0", 0.01);
}
