//! A veth shaped by a token bucket at 1 Gb/s on both ends (`tbf rate 1gbit burst 256kb
//! latency 5ms`), the bottleneck of an ordinary link: softhca's congestion control must
//! fill it (at least 0.8× its rate here; the full table is `softhca-impair shaped`) with
//! every byte verified. Without congestion control the token bucket dropped a third of
//! what was sent and WRITE moved half the rate. Needs root; skipped with a message
//! otherwise.

mod common;

use std::time::Duration;

use softhca_testbed::{check_available, End, Shape, ShapedLink};

#[test]
fn a_shaped_link_is_filled_with_verified_data() {
    if let Err(e) = check_available() {
        eprintln!("skipped: needs root and ip netns ({e})");
        return;
    }
    let rate = 1_000_000_000;
    let link = ShapedLink::up(Shape {
        rate,
        delay: Duration::ZERO,
    })
    .expect("build the shaped link");
    // About a second per operation at the link's rate.
    let total = 128 << 20;
    for op in ["write", "send", "read"] {
        let sent = |l: &ShapedLink| {
            let (a, b) = (l.qdisc(End::A).unwrap(), l.qdisc(End::B).unwrap());
            (a.sent + b.sent, a.dropped + b.dropped)
        };
        let before = sent(&link);
        let r = common::perf(&link, op, total, 64 * 1024, Duration::from_secs(60));
        let after = sent(&link);
        let (pkts, drops) = (after.0 - before.0, after.1 - before.1);
        eprintln!(
            "{op}: {:.3} Gb/s over tbf 1 Gb/s, {drops} of {pkts} packets dropped",
            r.gbps
        );
        assert!(
            r.gbps >= 0.8 * rate as f64 / 1e9,
            "{op}: {:.3} Gb/s on a 1 Gb/s link",
            r.gbps
        );
    }
}
