//! Two shaped paths between two namespaces (`softhca-impair paths`): a UDP probe shows
//! that a cut black-holes exactly the path and direction it names and that a restore
//! brings it back, and a softhca WRITE with the multipath extension on moves verified
//! data over both paths; ECMP spreads source ports over both. Needs root, iproute2, tc and nft; skipped with a message
//! otherwise. The full table is `softhca-impair paths table`.

mod common;

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::Duration;

use softhca_testbed::{check_available, spawn_in_netns, Direction, End, Fault, Paths};

/// Whether a UDP datagram from `from` reaches the other end over path `i` (3 tries).
fn probe(p: &Paths, i: usize, from: End) -> bool {
    let to = match from {
        End::A => End::B,
        End::B => End::A,
    };
    let dst = SocketAddr::new(p.addr(to, i).into(), 47_000 + i as u16);
    let src = SocketAddr::new(p.addr(from, i).into(), 0);
    let rx = spawn_in_netns(&p.netns(to), move || {
        let s = UdpSocket::bind(dst).expect("bind the probe receiver");
        s.set_read_timeout(Some(Duration::from_millis(400)))
            .unwrap();
        s
    })
    .join()
    .expect("receiver socket");
    spawn_in_netns(&p.netns(from), move || {
        let s = UdpSocket::bind(src).expect("bind the probe sender");
        for _ in 0..3 {
            s.send_to(b"probe", dst).expect("send the probe");
        }
    })
    .join()
    .expect("sender");
    let mut buf = [0u8; 16];
    matches!(rx.recv_from(&mut buf), Ok((5, _)))
}

#[test]
fn cut_restore_and_a_verified_transfer_over_two_paths() {
    if let Err(e) = check_available() {
        eprintln!("skipped: needs root and ip netns ({e})");
        return;
    }
    if Command::new("nft").arg("--version").output().is_err() {
        eprintln!("skipped: nft (nftables) is not installed");
        return;
    }
    let name = format!("mpbq{}", std::process::id() % 100_000);
    let p = Paths::up(&name, &[1_000_000_000; 2]).expect("build two paths");
    for i in 0..2 {
        assert!(
            probe(&p, i, End::A) && probe(&p, i, End::B),
            "path {i} before any cut"
        );
    }
    p.set_fault(1, Direction::AToB, Fault::Cut).unwrap();
    assert!(!probe(&p, 1, End::A), "path 1 A→B is cut");
    assert!(
        probe(&p, 1, End::B),
        "path 1 B→A still delivers (one-way cut)"
    );
    assert!(probe(&p, 0, End::A), "path 0 is untouched");
    p.set_fault(1, Direction::Both, Fault::Cut).unwrap();
    assert!(!probe(&p, 1, End::B), "path 1 B→A is cut too");
    let s = p.stats().unwrap();
    assert!(s[1].ab_faulted >= 3 && s[1].ba_faulted >= 3, "{s:?}");
    assert_eq!(s[0].ab_faulted + s[0].ba_faulted, 0, "{s:?}");
    p.set_fault(1, Direction::Both, Fault::Clear).unwrap();
    assert!(
        probe(&p, 1, End::A) && probe(&p, 1, End::B),
        "path 1 restored"
    );

    // ECMP between the loopback addresses hashes source ports over both paths.
    let ecmp: BTreeSet<usize> = (49152..49152 + 16)
        .map(|sport| p.ecmp_path(sport, 4791).expect("ip route get"))
        .collect();
    assert_eq!(ecmp.len(), 2, "16 source ports take both paths: {ecmp:?}");

    // The softhca processes inherit this; each device serves every address of its end,
    // and multipath may use the two paths' (not the management pair's).
    let path_addrs: Vec<String> = [End::A, End::B]
        .iter()
        .flat_map(|&e| (0..2).map(move |i| (e, i)))
        .map(|(e, i)| p.addr(e, i).to_string())
        .collect();
    std::env::set_var("SOFTHCA_MP_ADDRS", path_addrs.join(","));
    std::env::set_var("SOFTHCA_MP", "1");
    // Congestion control off: its window is the QP's, not each path's, so it holds a
    // multipath QP to about one path's rate and the lowest-RTT path takes nearly all of
    // it; this checks that the paths share the traffic, which the per-path windows do.
    std::env::set_var("SOFTHCA_CC", "0");
    let before = p.stats().unwrap();
    let r = common::perf(&p, "write", 64 << 20, 64 * 1024, Duration::from_secs(60));
    let after = p.stats().unwrap();
    let bytes: Vec<u64> = (0..2)
        .map(|i| after[i].since(&before[i]).ab_bytes)
        .collect();
    eprintln!(
        "write: {:.3} Gb/s over 2 × 1 Gb/s, bytes A→B per path {bytes:?}",
        r.gbps
    );
    let total: u64 = bytes.iter().sum();
    assert!(
        total >= r.bytes,
        "{total} bytes on the paths for {} moved",
        r.bytes
    );
    for (i, b) in bytes.iter().enumerate() {
        assert!(
            *b >= total / 10,
            "path {i} carried {b} of {total} bytes: multipath uses both"
        );
    }
}
