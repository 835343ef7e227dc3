//! Loopback UDP throughput: one sender thread, one receiver thread, for each offload mode.
//!
//! `cargo run --release -p softhca-perf --example udp_blast -- [seconds] [segment_size]`
//! (defaults 2 s, 4096 B). Prints payload Gb/s received for GSO+GRO, GSO only and none.
//! Sender and receiver are pinned to CPUs 0 and 1 unless `BLAST_PIN=0`; the receiver
//! sleeps in epoll when idle unless `BLAST_BUSY=1`; `BLAST_ICRC=1` seals and checks a
//! RoCEv2 ICRC on every datagram. The measuring code is
//! [`softhca_perf::blast`], which `softhca bench` also uses.

use std::time::Duration;

use softhca_io::BindOptions;
use softhca_perf::blast::{blast_loopback, LoopbackBlast};

fn run(name: &str, tx: BindOptions, rx: BindOptions, secs: f64, seg: usize) {
    let cfg = LoopbackBlast {
        tx,
        rx,
        duration: Duration::from_secs_f64(secs),
        segment_size: seg,
        // BLAST_PIN=0 leaves scheduling to the kernel.
        pin: std::env::var("BLAST_PIN").map_or(true, |v| v != "0"),
        // BLAST_BUSY=1 makes the receiver spin on recv instead of sleeping in epoll.
        busy: std::env::var("BLAST_BUSY").is_ok_and(|v| v == "1"),
        rx_batch: std::env::var("BLAST_RXBATCH")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(softhca_perf::blast::RECV_BATCH),
        // BLAST_WINDOW=0 sends unpaced; otherwise bytes ahead of the receiver's credits.
        window: match std::env::var("BLAST_WINDOW")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            Some(0) => None,
            Some(w) => Some(w),
            None => Some(softhca_perf::blast::DEFAULT_WINDOW),
        },
        // BLAST_ICRC=1 seals and checks a RoCEv2 ICRC on every datagram.
        icrc: std::env::var("BLAST_ICRC").is_ok_and(|v| v == "1"),
    };
    let (sent, got) = match blast_loopback(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{name}: {e}");
            return;
        }
    };
    let secs = got.elapsed.as_secs_f64().max(1e-9);
    println!(
        "{name:<10} tx caps {:?} rx gro {}: sent {:.1} Gb/s, received {:.1} Gb/s, {} credit stalls ({:.0} kdatagrams/s, {:.1} datagrams per recv call)",
        sent.capabilities,
        got.capabilities.gro,
        sent.bytes as f64 * 8.0 / sent.elapsed.as_secs_f64().max(1e-9) / 1e9,
        got.gbps(),
        sent.credit_stalls,
        got.datagrams as f64 / secs / 1e3,
        got.datagrams as f64 / got.calls.max(1) as f64,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let seg: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let on = BindOptions {
        allow_gso: true,
        allow_gro: true,
        recv_tos: false,
        ..BindOptions::DEFAULT
    };
    let no_gro = BindOptions {
        allow_gso: true,
        allow_gro: false,
        recv_tos: false,
        ..BindOptions::DEFAULT
    };
    let off = BindOptions {
        allow_gso: false,
        allow_gro: false,
        recv_tos: false,
        ..BindOptions::DEFAULT
    };
    run("gso+gro", on, on, secs, seg);
    run("gso only", on, no_gro, secs, seg);
    run("none", off, off, secs, seg);
}
