//! `softhca stream`: a synthetic camera streaming frames to a host receiver on loopback
//! (two softhca devices on free 127.0.0.x addresses, two threads), in one mode or all
//! three back to back (`--compare`).

use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use softhca_stream::apart::{run_camera, serve_receiver, DEFAULT_PORT};
use softhca_stream::gige::GigeConfig;
use softhca_stream::gvcp::GVCP_PORT;
use softhca_stream::FrameStatus;

use softhca_stream::{
    run_loopback, FrameSpec, Live, Mode, Overflow, PixelFormat, RunReport, StreamConfig,
};

use crate::args::{StreamArgs, StreamMode, StreamRole};
use crate::error::CliError;

fn mode(m: StreamMode) -> Mode {
    match m {
        StreamMode::RcSend => Mode::RcSend,
        StreamMode::UcWrite => Mode::UcWrite,
        StreamMode::Gvsp => Mode::Gvsp,
    }
}

/// Runs `softhca stream`.
pub fn run(a: &StreamArgs) -> Result<(), CliError> {
    let pixel = PixelFormat::parse(&a.pixel).ok_or_else(|| {
        CliError::Usage(format!(
            "unknown pixel format {:?} (mono8, bayerrg8)",
            a.pixel
        ))
    })?;
    if !(0.0..1.0).contains(&a.loss) {
        return Err(CliError::Usage("--loss must be in [0, 1)".into()));
    }
    if a.width == 0 || a.height == 0 {
        return Err(CliError::Usage(
            "--width and --height must be positive".into(),
        ));
    }
    let base = StreamConfig {
        spec: FrameSpec {
            width: a.width,
            height: a.height,
            pixel,
        },
        frames: a.frames,
        duration: a.duration.map(Duration::from_secs_f64),
        fps: a.fps,
        loss: a.loss,
        ring_slots: a.ring as usize,
        overflow: if a.no_credits {
            Overflow::DropOldest
        } else {
            Overflow::Block
        },
        credits: !a.no_credits,
        gvsp_packet_size: a.packet_size as usize,
        verify: !a.no_verify,
        save_frame: a.save_frame.clone(),
        seed: a.seed,
        ..StreamConfig::default()
    };
    match &a.role {
        None => {}
        Some(StreamRole::Camera { to, bind }) => return camera(&base, a, to, *bind),
        Some(StreamRole::Receive { listen }) => return receive(&base, a, *listen),
        Some(StreamRole::Gige {
            camera,
            size,
            gvsp_packet_size,
            rate,
        }) => return gige(a, camera, size.as_deref(), *gvsp_packet_size, *rate),
    }
    let modes: Vec<Mode> = if a.compare {
        vec![Mode::RcSend, Mode::UcWrite, Mode::Gvsp]
    } else {
        vec![mode(a.mode)]
    };
    let live = live_printer();
    let mut rows = Vec::new();
    for (i, m) in modes.iter().enumerate() {
        let cfg = StreamConfig {
            mode: *m,
            // One PNG: from the first mode.
            save_frame: if i == 0 {
                base.save_frame.clone()
            } else {
                None
            },
            ..base.clone()
        };
        let live_ref: Option<&(dyn Fn(&Live) + Sync)> = live.as_ref().map(|f| f as _);
        let r = run_loopback(&cfg, live_ref)
            .map_err(|e| CliError::Usage(format!("{}: {e}", m.name())))?;
        if live.is_some() {
            eprint!("\r{:100}\r", "");
        }
        rows.push(r);
    }
    finish(&rows, a)
}

/// Prints the table, writes the JSON, and fails if a complete frame was corrupt.
fn finish(rows: &[RunReport], a: &StreamArgs) -> Result<(), CliError> {
    print_table(rows, a);
    if let Some(path) = &a.json {
        let doc = serde_json::json!({
            "width": rows.first().map_or(a.width, |r| r.width),
            "height": rows.first().map_or(a.height, |r| r.height),
            "pixel": a.pixel,
            "loss": a.loss,
            "rows": rows,
        });
        write_json(path, &doc)?;
    }
    if rows.iter().any(|r| r.corrupt > 0) {
        return Err(CliError::verify(
            "a frame reported complete did not match the camera's pattern".into(),
        ));
    }
    Ok(())
}

fn write_json(path: &std::path::Path, doc: &serde_json::Value) -> Result<(), CliError> {
    let text =
        serde_json::to_string_pretty(doc).map_err(|e| CliError::Usage(format!("JSON: {e}")))?;
    std::fs::write(path, text + "\n")
        .map_err(|e| CliError::Usage(format!("cannot write {}: {e}", path.display())))
}

/// `HOST[:PORT]` with a default port.
fn host_port(s: &str, default_port: u16) -> Result<SocketAddr, CliError> {
    let with_port = if s.parse::<SocketAddr>().is_ok()
        || s.rsplit_once(':')
            .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok())
    {
        s.to_string()
    } else if s.contains(':') && !s.starts_with('[') {
        format!("[{s}]:{default_port}")
    } else {
        format!("{s}:{default_port}")
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .ok_or_else(|| CliError::Usage(format!("bad address {s:?} (HOST[:PORT])")))
}

fn live_printer() -> Option<impl Fn(&Live) + Sync> {
    std::io::stderr().is_terminal().then_some(|l: &Live| {
        let c = l.counters;
        eprint!(
            "\r{:9} {:6.1} s  {:7.1} fps  {:6.2} Gb/s  rx CPU {:5.1} %  lost {}  incomplete {}  dropped {}   ",
            l.mode.name(),
            l.seconds,
            l.fps,
            l.gbps,
            l.cpu_pct,
            c.lost,
            c.incomplete,
            c.dropped
        );
        let _ = std::io::stderr().flush();
    })
}

/// `softhca stream camera --to ADDR`.
fn camera(
    base: &StreamConfig,
    a: &StreamArgs,
    to: &str,
    bind: Option<std::net::IpAddr>,
) -> Result<(), CliError> {
    let addr = host_port(to, DEFAULT_PORT)?;
    let cfg = StreamConfig {
        mode: mode(a.mode),
        ..base.clone()
    };
    eprintln!("camera: {} to {addr}", cfg.mode.name());
    let r = run_camera(&cfg, addr, bind).map_err(|e| CliError::Usage(format!("camera: {e}")))?;
    let c = r.receiver;
    println!(
        "camera: sent {} frames in {:.2} s ({:.1} fps); receiver: {} complete, {} incomplete, {} lost, {} dropped",
        r.frames_sent,
        r.seconds,
        r.frames_sent as f64 / r.seconds.max(1e-9),
        c.complete,
        c.incomplete,
        c.lost,
        c.dropped
    );
    if r.damaged > 0 || r.packets_dropped > 0 {
        println!(
            "camera: loss emulation damaged {} frames, device dropped {} packets",
            r.damaged, r.packets_dropped
        );
    }
    Ok(())
}

/// `softhca stream receive`.
fn receive(base: &StreamConfig, a: &StreamArgs, listen: SocketAddr) -> Result<(), CliError> {
    let live = live_printer();
    let live_ref: Option<&(dyn Fn(&Live) + Sync)> = live.as_ref().map(|f| f as _);
    let r = serve_receiver(
        base,
        listen,
        &mut |at| {
            eprintln!("receiver: waiting for a camera on {at} (softhca stream camera --to {at})")
        },
        live_ref,
    )
    .map_err(|e| CliError::Usage(format!("receiver: {e}")))?;
    if live.is_some() {
        eprint!("\r{:100}\r", "");
    }
    finish(&[r], a)
}

/// `softhca stream gige`.
fn gige(
    a: &StreamArgs,
    camera: &str,
    size: Option<&str>,
    packet_size: Option<u32>,
    rate: Option<f64>,
) -> Result<(), CliError> {
    let mut cfg = GigeConfig::new(host_port(camera, GVCP_PORT)?, a.frames);
    if let Some(s) = size {
        let (w, h) = s
            .split_once('x')
            .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
            .filter(|&(w, h): &(u32, u32)| w > 0 && h > 0)
            .ok_or_else(|| CliError::Usage(format!("--size {s:?}: want WIDTHxHEIGHT")))?;
        cfg.size = Some((w, h));
    }
    cfg.packet_size = packet_size;
    if let Some(r) = rate {
        if !(r > 0.0 && r <= 1e6) {
            return Err(CliError::Usage(
                "--rate must be in (0, 1e6] frames/s".into(),
            ));
        }
        cfg.frame_period_us = Some((1e6 / r).round() as u32);
    }
    let mut saved = a.save_frame.is_none();
    let mut save_err = None;
    let mut arrivals = Vec::new();
    let tty = std::io::stderr().is_terminal();
    let r = softhca_stream::gige::receive(&cfg, |f| {
        arrivals.push(f.info.arrival_ns);
        if tty {
            eprint!(
                "\rframe {} ({:?}, {} bytes)   ",
                f.info.id, f.info.status, f.payload_len
            );
        }
        if !saved && f.info.status == FrameStatus::Complete {
            if let (Some(p), Some(l)) = (&a.save_frame, f.leader) {
                if let Err(e) = softhca_stream::png::write_gray8(p, l.width, l.height, f.image) {
                    save_err = Some(format!("cannot write {}: {e}", p.display()));
                }
            }
            saved = true;
        }
    })
    .map_err(|e| CliError::Usage(format!("GigE camera {camera}: {e}")))?;
    if tty {
        eprint!("\r{:60}\r", "");
    }
    if let Some(e) = save_err {
        return Err(CliError::Usage(e));
    }
    let c = r.counters;
    let s = r.settings;
    println!(
        "{} {} (serial {}) at {}: {}x{} pixel format {:#010x}, GVSP packets {} B",
        r.device.manufacturer,
        r.device.model,
        r.device.serial,
        cfg.camera,
        s.width,
        s.height,
        s.pixel_format,
        s.packet_size
    );
    let bytes = c.complete as f64 * f64::from(s.width) * f64::from(s.height);
    println!(
        "{} frames in {:.2} s: {} complete, {} incomplete, {} lost, {} resend requests; {:.1} fps, {:.3} Gb/s",
        c.complete + c.incomplete,
        r.seconds,
        c.complete,
        c.incomplete,
        c.lost,
        c.resend_requests,
        c.complete as f64 / r.seconds.max(1e-9),
        bytes * 8.0 / r.seconds.max(1e-9) / 1e9
    );
    if let Some(path) = &a.json {
        let doc = serde_json::json!({
            "device": {"manufacturer": r.device.manufacturer, "model": r.device.model,
                       "serial": r.device.serial},
            "width": s.width, "height": s.height, "pixel_format": s.pixel_format,
            "packet_size": s.packet_size, "seconds": r.seconds, "counters": c,
        });
        write_json(path, &doc)?;
    }
    if c.complete == 0 {
        return Err(CliError::verify("no complete frame from the camera".into()));
    }
    Ok(())
}

fn print_table(rows: &[RunReport], a: &StreamArgs) {
    let (w, h) = rows
        .first()
        .map_or((a.width, a.height), |r| (r.width, r.height));
    println!(
        "{}x{} {} frames ({:.2} MB), loss {}",
        w,
        h,
        a.pixel,
        (u64::from(w) * u64::from(h)) as f64 / 1e6,
        rows.first().map_or(a.loss, |r| r.loss)
    );
    println!(
        "{:9} {:>7} {:>8} {:>7} {:>10} {:>13} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9}",
        "mode",
        "frames",
        "fps",
        "Gb/s",
        "rx CPU-s/GB",
        "+device s/GB",
        "lost",
        "incompl",
        "dropped",
        "resends",
        "p50 µs",
        "p99 µs"
    );
    for r in rows {
        let c = r.counters;
        println!(
            "{:9} {:>7} {:>8.1} {:>7.2} {:>10.4} {:>13.4} {:>9} {:>9} {:>8} {:>8} {:>9.0} {:>9.0}",
            r.mode,
            c.complete,
            r.fps,
            r.gbps,
            r.rx_cpu_s_per_gb,
            r.rx_total_cpu_s_per_gb,
            c.lost + r.missing.saturating_sub(c.lost),
            c.incomplete,
            c.dropped,
            c.resend_requests,
            r.latency_p50_us,
            r.latency_p99_us
        );
    }
    for r in rows.iter().filter(|r| r.loss_emulated) {
        match r.mode {
            "rc-send" => println!(
                "rc-send: the camera's device dropped {} packets; RC retransmitted them",
                r.packets_dropped_at_sender
            ),
            "uc-write" => println!(
                "uc-write: {} frames damaged at the sender; the incomplete and missing frames are {}",
                r.damaged_at_sender,
                if r.damage_named_exactly { "exactly those" } else { "NOT exactly those" }
            ),
            _ => println!(
                "gvsp: {} frames had packets dropped at the sender; {} resend requests, {} packets resent",
                r.damaged_at_sender, r.counters.resend_requests, r.counters.resent_packets
            ),
        }
    }
}
