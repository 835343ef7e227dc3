//! Bundles (several packets of different sizes in one datagram, `softhca_wire::bundle`)
//! between two softhca devices that offered them in multipath's negotiation, and none to
//! a device that did not: every byte arrives either way, and every bundled packet passes
//! its ICRC.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use softhca::*;

/// UCX's eager fragment at MTU 4096 (two full packets and a short one), and a short
/// message: the sizes GSO cannot put in one datagram.
const SIZES: [usize; 2] = [8192 + 40, 100];
const SLOT: usize = 16384;
const BURST: u64 = 8;
const ROUNDS: u64 = 20;

fn open_with(addr: &str, bundle: bool, gro: bool) -> Arc<Context> {
    let mut cfg = Config::loopback(ip(addr));
    cfg.poll = Config::from_env().unwrap().poll;
    cfg.bundle = bundle;
    cfg.gro = gro;
    // The sizes above are what GSO cannot send whole at MTU 4096: no larger packets.
    cfg.jumbo = 0;
    Context::open(&cfg).unwrap_or_else(|e| panic!("open {addr}: {e}"))
}

/// Two connected devices; `b` takes bundles or not, and receives with GRO (64 KiB
/// buffers) or without (9 KiB).
fn pair(a: &str, b: &str, b_bundles: bool, b_gro: bool) -> (Side, Side) {
    let sa = side(open_with(a, true, true), QpType::Rc, SLOT * BURST as usize);
    let sb = side(
        open_with(b, b_bundles, b_gro),
        QpType::Rc,
        SLOT * BURST as usize,
    );
    connect(&sa, &sb);
    // Both QPs' negotiations end (answered yes, or no) before the traffic starts.
    let t = Instant::now();
    let done = |s: &Side| counter(&s.ctx, "mp_negotiated") + counter(&s.ctx, "mp_fallback");
    while done(&sa) == 0 || done(&sb) == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "no negotiation");
        std::thread::sleep(Duration::from_millis(1));
    }
    (sa, sb)
}

/// Bursts of SENDs of both sizes, posted one per call between polls, each checked.
fn bursts(a: &Side, b: &Side) {
    let lens: Vec<usize> = (0..BURST).map(|i| SIZES[(i % 2) as usize]).collect();
    for round in 0..ROUNDS {
        send_burst(a, b, &lens, SLOT, round * BURST);
    }
}

#[test]
fn bursts_to_a_softhca_peer_leave_in_bundles() {
    let (a, b) = pair("127.0.1.81", "127.0.1.82", true, true);
    bursts(&a, &b);
    let bundles = counter(&a.ctx, "io_tx_bundles");
    let bundled = counter(&a.ctx, "io_tx_bundled_transmits");
    assert!(bundles > 0, "no bundle sent");
    assert!(
        bundled >= 2 * bundles,
        "{bundled} transmits in {bundles} bundles"
    );
    assert_eq!(counter(&b.ctx, "rx_bundles"), bundles);
    assert_eq!(counter(&b.ctx, "drop_bad_icrc"), 0);
    assert_eq!(counter(&b.ctx, "drop_malformed"), 0);
}

#[test]
fn no_bundles_to_a_peer_that_did_not_offer_them() {
    let (a, b) = pair("127.0.1.83", "127.0.1.84", false, true);
    bursts(&a, &b);
    assert_eq!(counter(&a.ctx, "io_tx_bundles"), 0);
    assert_eq!(counter(&b.ctx, "rx_bundles"), 0);
    // Its answers carry no bundles either, though the other side offered them.
    assert_eq!(counter(&b.ctx, "io_tx_bundles"), 0);
    assert_eq!(counter(&a.ctx, "rx_bundles"), 0);
}

#[test]
fn bundles_fit_the_receive_buffers_of_a_peer_without_gro() {
    let (a, b) = pair("127.0.1.85", "127.0.1.86", true, false);
    bursts(&a, &b);
    assert!(counter(&a.ctx, "io_tx_bundles") > 0, "no bundle sent");
    assert_eq!(counter(&b.ctx, "io_rx_truncated"), 0);
    assert_eq!(
        counter(&b.ctx, "rx_bundles"),
        counter(&a.ctx, "io_tx_bundles")
    );
    assert_eq!(counter(&b.ctx, "drop_bad_icrc"), 0);
}
