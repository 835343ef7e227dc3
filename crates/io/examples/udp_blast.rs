//! Loopback UDP throughput: one sender thread, one receiver thread, for each offload mode.
//!
//! `cargo run --release -p softhca-io --example udp_blast -- [seconds] [segment_size]`
//! (defaults 2 s, 4096 B). Prints payload Gb/s received for GSO+GRO, GSO only and none.
//! Sender and receiver are pinned to CPUs 0 and 1 unless `BLAST_PIN=0`; the receiver
//! sleeps in epoll when idle unless `BLAST_BUSY=1`.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softhca_io::{
    pin_current_thread, segments, BindOptions, Events, Poller, RecvBatch, RoceSocket, Transmit,
};

fn run(name: &str, tx_opts: BindOptions, rx_opts: BindOptions, secs: f64, seg: usize) {
    let rx = RoceSocket::bind_with("127.0.0.1:0".parse().unwrap(), rx_opts).expect("bind rx");
    let tx = RoceSocket::bind_with("127.0.0.2:0".parse().unwrap(), tx_opts).expect("bind tx");
    let dst: SocketAddr = rx.local_addr();
    let stop = AtomicBool::new(false);
    let segs_per_send = (65_507 / seg).max(1);
    let payload = vec![0x5au8; segs_per_send * seg];
    // BLAST_PIN=0 leaves scheduling to the kernel.
    let pin = std::env::var("BLAST_PIN").map_or(true, |v| v != "0");
    // BLAST_BUSY=1 makes the receiver spin on recv instead of sleeping in epoll.
    let busy = std::env::var("BLAST_BUSY").is_ok_and(|v| v == "1");

    let (sent, (bytes, dgrams, calls, elapsed)) = std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            if pin {
                let _ = pin_current_thread(1);
            }
            let poller = Poller::new().unwrap();
            poller.add(rx.as_raw_fd(), 0).unwrap();
            let mut events = Events::with_capacity(2);
            let mut batch = RecvBatch::for_socket(
                &rx,
                std::env::var("BLAST_RXBATCH")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(64),
            );
            let (mut bytes, mut dgrams, mut calls) = (0u64, 0u64, 0u64);
            let mut start = None;
            while !stop.load(Ordering::Relaxed) {
                match rx.recv(&mut batch) {
                    Ok(_) => {
                        calls += 1;
                        start.get_or_insert_with(Instant::now);
                        for (m, b) in batch.iter() {
                            dgrams += segments(&m, b).count() as u64;
                            bytes += m.len as u64;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && busy => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        poller
                            .wait(&mut events, Some(Duration::from_millis(10)))
                            .unwrap();
                    }
                    Err(e) => panic!("recv: {e}"),
                }
            }
            let elapsed = start.map_or(Duration::ZERO, |s| s.elapsed());
            (bytes, dgrams, calls, elapsed)
        });
        if pin {
            let _ = pin_current_thread(0);
        }
        // Each Transmit is one 64 KiB run of `seg`-byte datagrams; 8 per sendmmsg.
        let t = Transmit {
            dst,
            src_ip: None,
            contents: &payload,
            segment_size: Some(seg),
        };
        let batch = [t; 8];
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut sent = 0u64;
        while Instant::now() < end {
            match tx.send(&batch) {
                Ok(n) => sent += (n * payload.len()) as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("send: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::Relaxed);
        (sent, receiver.join().unwrap())
    });
    let gbps = |b: u64| b as f64 * 8.0 / elapsed.as_secs_f64().max(1e-9) / 1e9;
    println!(
        "{name:<10} tx caps {:?} rx gro {}: sent {:.1} Gb/s, received {:.1} Gb/s ({:.0} kdatagrams/s, {:.1} datagrams per recv call)",
        tx.capabilities(),
        rx.capabilities().gro,
        gbps(sent),
        gbps(bytes),
        dgrams as f64 / elapsed.as_secs_f64().max(1e-9) / 1e3,
        dgrams as f64 / calls.max(1) as f64,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let seg: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let on = BindOptions {
        allow_gso: true,
        allow_gro: true,
    };
    let no_gro = BindOptions {
        allow_gso: true,
        allow_gro: false,
    };
    let off = BindOptions {
        allow_gso: false,
        allow_gro: false,
    };
    run("gso+gro", on, on, secs, seg);
    run("gso only", on, no_gro, secs, seg);
    run("none", off, off, secs, seg);
}
