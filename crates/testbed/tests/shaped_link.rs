//! A veth shaped by a token bucket at 1 Gb/s on both ends (`tbf rate 1gbit burst 256kb
//! latency 5ms`), the bottleneck of an ordinary link: softhca's congestion control must
//! fill it (at least 0.8× its rate here; the full table is `softhca-impair shaped`) with
//! every byte verified. Without congestion control the token bucket dropped a third of
//! what was sent and WRITE moved half the rate. Needs root; skipped with a message
//! otherwise.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use softhca_testbed::{check_available, spawn_in_netns, End, Shape, ShapedLink};

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

/// The token bucket counts whole Ethernet frames, the 14-byte header included (no FCS,
/// preamble or gap), on a veth and on the forwarder's taps alike: `softhca-impair shaped`
/// divides these bytes by the rate for the link's utilization. Datagrams of a known size
/// and count add exactly their frames to the sender's qdisc.
#[test]
fn the_shaper_counts_whole_ethernet_frames() {
    if let Err(e) = check_available() {
        eprintln!("skipped: needs root and ip netns ({e})");
        return;
    }
    const PAYLOAD: usize = 1000;
    const COUNT: u64 = 100;
    for delay in [Duration::ZERO, Duration::from_millis(5)] {
        let link = ShapedLink::up(Shape {
            rate: 1_000_000_000,
            delay,
        })
        .expect("build the shaped link");
        // A socket listens at the far end, so that nothing comes back (an ICMP port
        // unreachable, then an ARP probe answered through the measured qdisc).
        let at = SocketAddr::new(link.addr(End::B), 17_000);
        let sink = spawn_in_netns(&link.netns(End::B), move || UdpSocket::bind(at))
            .join()
            .expect("bind in B")
            .expect("bind the sink");
        let send = |n: u64| {
            spawn_in_netns(&link.netns(End::A), move || {
                let s = UdpSocket::bind("0.0.0.0:0").expect("bind in A");
                for _ in 0..n {
                    s.send_to(&[7u8; PAYLOAD], at).expect("send");
                }
            })
            .join()
            .expect("send from A");
        };
        // The first resolves the neighbour (an ARP exchange on the veth).
        send(1);
        std::thread::sleep(Duration::from_millis(100) + 2 * delay);
        let before = link.qdisc(End::A).unwrap();
        send(COUNT);
        std::thread::sleep(Duration::from_millis(100) + 2 * delay);
        let after = link.qdisc(End::A).unwrap();
        drop(sink);
        let frame = (PAYLOAD + 8 + 20 + 14) as u64;
        assert_eq!(after.sent - before.sent, COUNT, "{delay:?}");
        assert_eq!(after.bytes - before.bytes, COUNT * frame, "{delay:?}");
        assert_eq!(after.dropped, before.dropped);
    }
}
