//! `softhca stream`: a synthetic camera streaming frames to a host receiver on loopback
//! (two softhca devices on free 127.0.0.x addresses, two threads), in one mode or all
//! three back to back (`--compare`).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use softhca_stream::{
    run_loopback, FrameSpec, Live, Mode, Overflow, PixelFormat, RunReport, StreamConfig,
};

use crate::args::{StreamArgs, StreamMode};
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
    let modes: Vec<Mode> = if a.compare {
        vec![Mode::RcSend, Mode::UcWrite, Mode::Gvsp]
    } else {
        vec![mode(a.mode)]
    };
    let tty = std::io::stderr().is_terminal();
    let live_line = |l: &Live| {
        let c = l.counters;
        eprint!(
            "\r{:9} {:6.1} s  {:7.1} fps  {:6.2} Gb/s  lost {}  incomplete {}  dropped {}   ",
            l.mode.name(),
            l.seconds,
            l.fps,
            l.gbps,
            c.lost,
            c.incomplete,
            c.dropped
        );
        let _ = std::io::stderr().flush();
    };
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
        let live: Option<&(dyn Fn(&Live) + Sync)> = if tty { Some(&live_line) } else { None };
        let r =
            run_loopback(&cfg, live).map_err(|e| CliError::Usage(format!("{}: {e}", m.name())))?;
        if tty {
            eprint!("\r{:100}\r", "");
        }
        rows.push(r);
    }
    print_table(&rows, a);
    if let Some(path) = &a.json {
        let doc = serde_json::json!({
            "width": a.width,
            "height": a.height,
            "pixel": a.pixel,
            "loss": a.loss,
            "rows": rows,
        });
        let text = serde_json::to_string_pretty(&doc)
            .map_err(|e| CliError::Usage(format!("JSON: {e}")))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| CliError::Usage(format!("cannot write {}: {e}", path.display())))?;
    }
    if rows.iter().any(|r| r.corrupt > 0) {
        return Err(CliError::Verify(
            "a frame reported complete did not match the camera's pattern".into(),
        ));
    }
    Ok(())
}

fn print_table(rows: &[RunReport], a: &StreamArgs) {
    println!(
        "{}x{} {} frames ({:.2} MB), loss {}",
        a.width,
        a.height,
        a.pixel,
        (u64::from(a.width) * u64::from(a.height)) as f64 / 1e6,
        a.loss
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
