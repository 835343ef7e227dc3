//! Send/receive over loopback: plain datagrams, GSO into GRO and non-GRO receivers,
//! IPv4 and IPv6, per-packet addresses, errors.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use softhca_io::{
    segments, BindOptions, ConnectedSender, Events, IoError, Poller, RecvBatch, RecvMeta,
    RoceSocket, Transmit,
};

const BOTH: BindOptions = BindOptions {
    allow_gso: true,
    allow_gro: true,
    recv_tos: false,
    ..BindOptions::DEFAULT
};
const NO_GRO: BindOptions = BindOptions {
    allow_gso: true,
    allow_gro: false,
    recv_tos: false,
    ..BindOptions::DEFAULT
};
const NO_OFFLOAD: BindOptions = BindOptions {
    allow_gso: false,
    allow_gro: false,
    recv_tos: false,
    ..BindOptions::DEFAULT
};

fn v4(last: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)), 0)
}

fn v6() -> SocketAddr {
    SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0)
}

/// Pattern bytes where every segment is distinguishable: byte = (segment, offset) mix.
fn pattern(len: usize, seg: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / seg) as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

/// Receives until `want` datagrams (after GRO splitting) arrived or 5 s passed.
fn recv_segments(sock: &RoceSocket, want: usize) -> Vec<(RecvMeta, Vec<u8>)> {
    let poller = Poller::new().unwrap();
    poller.add(sock.as_raw_fd(), 1).unwrap();
    let mut events = Events::with_capacity(4);
    let mut batch = RecvBatch::for_socket(sock, 16);
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out
        .iter()
        .map(|(m, b): &(RecvMeta, Vec<u8>)| segments(m, b).count())
        .sum::<usize>()
        < want
    {
        assert!(
            Instant::now() < deadline,
            "timed out with {} datagrams",
            out.len()
        );
        match sock.recv(&mut batch) {
            Ok(n) => {
                assert_eq!(n, batch.len());
                out.extend(batch.iter().map(|(m, b)| (m, b.to_vec())));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                poller
                    .wait(&mut events, Some(Duration::from_millis(100)))
                    .unwrap();
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    out
}

fn send_all(sock: &RoceSocket, t: &[Transmit<'_>]) {
    let mut done = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while done < t.len() {
        assert!(Instant::now() < deadline);
        match sock.send(&t[done..]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("send: {e}"),
        }
    }
}

#[test]
fn plain_batch_v4_carries_addresses() {
    let a = RoceSocket::bind_with(v4(1), BOTH).unwrap();
    let b = RoceSocket::bind_with(v4(2), BOTH).unwrap();
    let msgs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 100 + i as usize]).collect();
    let t: Vec<Transmit> = msgs
        .iter()
        .map(|m| Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: m,
            pieces: &[],
            segment_size: None,
        })
        .collect();
    assert_eq!(a.send(&t).unwrap(), 5);
    let got = recv_segments(&b, 5);
    assert_eq!(got.len(), 5);
    for (i, (meta, buf)) in got.iter().enumerate() {
        assert_eq!(buf, &msgs[i]);
        assert_eq!(meta.len, msgs[i].len());
        assert_eq!(meta.stride, meta.len);
        assert_eq!(meta.src, a.local_addr());
        assert_eq!(meta.dst_ip, Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))));
        assert!(!meta.truncated);
    }
    // Nothing more queued.
    let mut batch = RecvBatch::for_socket(&b, 4);
    assert_eq!(
        b.recv(&mut batch).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    assert!(batch.is_empty());
}

fn gso_round_trip(sender: SocketAddr, receiver: SocketAddr, rx_opts: BindOptions) {
    let a = RoceSocket::bind_with(sender, BOTH).unwrap();
    let b = RoceSocket::bind_with(receiver, rx_opts).unwrap();
    assert!(a.capabilities().gso, "this kernel supports UDP_SEGMENT");
    assert_eq!(b.capabilities().gro, rx_opts.allow_gro);
    const SEG: usize = 1024;
    let data = pattern(10 * SEG + 300, SEG); // 10 full segments + a short one
    let t = [Transmit {
        dst: b.local_addr(),
        src_ip: None,
        tos: 0,
        contents: &data,
        pieces: &[],
        segment_size: Some(SEG),
    }];
    assert_eq!(a.send(&t).unwrap(), 1);
    let got = recv_segments(&b, 11);
    if rx_opts.allow_gro {
        assert_eq!(got.len(), 1, "GRO socket gets the GSO datagram whole");
        assert_eq!(got[0].0.stride, SEG);
        assert_eq!(got[0].0.len, data.len());
    } else {
        assert_eq!(got.len(), 11, "kernel splits for a non-GRO socket");
        for (m, _) in &got {
            assert_eq!(m.stride, m.len);
        }
    }
    let segs: Vec<Vec<u8>> = got
        .iter()
        .flat_map(|(m, b)| segments(m, b).map(<[u8]>::to_vec).collect::<Vec<_>>())
        .collect();
    let expect: Vec<Vec<u8>> = data.chunks(SEG).map(<[u8]>::to_vec).collect();
    assert_eq!(segs, expect);
    for (m, _) in &got {
        assert_eq!(m.src, a.local_addr());
        assert_eq!(m.dst_ip, Some(receiver.ip()));
    }
}

/// After an empty receive a batch asks for one datagram (`recvmsg`, not `recvmmsg`):
/// that path must report the same things, GRO stride and packet info included, and an
/// empty datagram counts as one.
#[test]
fn one_datagram_after_an_empty_receive_keeps_its_metadata() {
    let server = RoceSocket::bind_with("0.0.0.0:0".parse().unwrap(), BOTH).unwrap();
    let dst = SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 21)),
        server.local_addr().port(),
    );
    let client = RoceSocket::bind_with(v4(22), BOTH).unwrap();
    let mut batch = RecvBatch::for_socket(&server, 8);
    let empty = |batch: &mut RecvBatch| {
        let e = server.recv(batch).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    };
    // Waits for the next datagram with single receives only (each WouldBlock keeps the
    // batch asking for one).
    let one = |batch: &mut RecvBatch| -> (RecvMeta, Vec<u8>) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match server.recv(batch) {
                Ok(n) => {
                    assert_eq!(n, 1, "a single receive takes one datagram");
                    let (m, b) = batch.get(0);
                    return (m, b.to_vec());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "timed out");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("recv: {e}"),
            }
        }
    };

    empty(&mut batch);
    let data = pattern(3 * 100 + 40, 100);
    let t = [Transmit {
        dst,
        src_ip: None,
        tos: 0,
        contents: &data,
        pieces: &[],
        segment_size: Some(100),
    }];
    assert_eq!(client.send(&t).unwrap(), 1);
    let (meta, buf) = one(&mut batch);
    assert_eq!(buf, data);
    assert_eq!(
        (meta.len, meta.stride),
        (data.len(), 100),
        "GRO stride from the cmsg"
    );
    assert_eq!(meta.src, client.local_addr());
    assert_eq!(meta.dst_ip, Some(dst.ip()), "IP_PKTINFO from the cmsg");
    assert!(!meta.truncated);

    empty(&mut batch);
    let plain = std::net::UdpSocket::bind(v4(23)).unwrap();
    plain.send_to(&[], dst).unwrap();
    let (meta, buf) = one(&mut batch);
    assert!(buf.is_empty());
    assert_eq!((meta.len, meta.stride), (0, 0));
    assert_eq!(meta.src, plain.local_addr().unwrap());
    empty(&mut batch);
}

#[test]
fn gso_into_gro_socket_v4() {
    gso_round_trip(v4(1), v4(3), BOTH);
}

#[test]
fn gso_into_plain_socket_v4() {
    gso_round_trip(v4(1), v4(4), NO_GRO);
}

#[test]
fn gso_into_gro_socket_v6() {
    gso_round_trip(v6(), v6(), BOTH);
}

#[test]
fn gso_into_plain_socket_v6() {
    gso_round_trip(v6(), v6(), NO_GRO);
}

#[test]
fn without_gso_segments_are_split_in_user_space() {
    let a = RoceSocket::bind_with(v4(5), NO_OFFLOAD).unwrap();
    let b = RoceSocket::bind_with(v4(6), NO_OFFLOAD).unwrap();
    let caps = a.capabilities();
    assert!(!caps.gso && !caps.gro);
    assert_eq!(caps.max_gso_segments, 1);
    assert_eq!(a.recv_buf_size(), 9216);
    // 3 transmits: 100 segments of 256 (more than one sendmmsg batch), one plain, one 2-seg.
    let big = pattern(100 * 256, 256);
    let one = vec![0xabu8; 77];
    let two = pattern(300, 200);
    let t = [
        Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: &big,
            pieces: &[],
            segment_size: Some(256),
        },
        Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: &one,
            pieces: &[],
            segment_size: None,
        },
        Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: &two,
            pieces: &[],
            segment_size: Some(200),
        },
    ];
    send_all(&a, &t);
    let got = recv_segments(&b, 103);
    assert_eq!(got.len(), 103);
    let mut expect: Vec<&[u8]> = big.chunks(256).collect();
    expect.push(&one);
    expect.extend(two.chunks(200));
    let bufs: Vec<&[u8]> = got.iter().map(|(_, b)| &b[..]).collect();
    assert_eq!(bufs, expect);
}

#[test]
fn oversized_gso_transmit_is_split_into_several_gso_sends() {
    // (segment size, segments): 160 kB in 4000 B segments, and 1-byte segments (over the
    // 64-segment GSO limit), each more than one GSO datagram can hold.
    for (addrs, seg, n) in [
        ((v4(7), v4(8)), 4000, 40),
        ((v6(), v6()), 4000, 40),
        ((v4(7), v4(8)), 1, 200),
        ((v6(), v6()), 16_000, 9),
    ] {
        let a = RoceSocket::bind_with(addrs.0, BOTH).unwrap();
        let b = RoceSocket::bind_with(addrs.1, BOTH).unwrap();
        let data = pattern(n * seg, seg);
        let t = [Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: &data,
            pieces: &[],
            segment_size: Some(seg),
        }];
        assert_eq!(a.send(&t).unwrap(), 1);
        let got = recv_segments(&b, n);
        assert!(
            got.len() >= 3,
            "at least 3 GRO datagrams, got {}",
            got.len()
        );
        for (m, _) in &got {
            assert!(m.len <= 65_507 && m.len <= 64 * seg);
            assert_eq!(m.stride, seg);
        }
        let joined: Vec<u8> = got.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        assert_eq!(joined, data);
    }
}

#[test]
fn wildcard_socket_reports_dst_and_sends_from_chosen_source() {
    let server = RoceSocket::bind_with("0.0.0.0:0".parse().unwrap(), BOTH).unwrap();
    let port = server.local_addr().port();
    let client = RoceSocket::bind_with("0.0.0.0:0".parse().unwrap(), BOTH).unwrap();
    let cport = client.local_addr().port();
    for last in [9u8, 10] {
        let dst = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)), port);
        let src = IpAddr::V4(Ipv4Addr::new(127, 0, 0, last + 10));
        let msg = [last; 32];
        let t = [Transmit {
            dst,
            src_ip: Some(src),
            tos: 0,
            contents: &msg,
            pieces: &[],
            segment_size: None,
        }];
        assert_eq!(client.send(&t).unwrap(), 1);
        let got = recv_segments(&server, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].0.dst_ip,
            Some(dst.ip()),
            "IP_PKTINFO gives the address used"
        );
        assert_eq!(
            got[0].0.src,
            SocketAddr::new(src, cport),
            "IP_PKTINFO chose the source"
        );
        assert_eq!(got[0].1, msg);
    }
}

#[test]
fn tos_is_sent_and_reported() {
    for (a_addr, b_addr) in [(v4(11), v4(12)), (v6(), v6())] {
        let a = RoceSocket::bind_with(a_addr, BOTH).unwrap();
        let with_tos = BindOptions {
            recv_tos: true,
            ..BOTH
        };
        let b = RoceSocket::bind_with(b_addr, with_tos).unwrap();
        a.set_tos(0x8a).unwrap(); // DSCP 34 (AF41), ECT(0)
        let t = [Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: b"x",
            pieces: &[],
            segment_size: None,
        }];
        assert_eq!(a.send(&t).unwrap(), 1);
        let got = recv_segments(&b, 1);
        assert_eq!(got[0].0.tos, 0x8a, "for {a_addr}");
        // A Transmit's own TOS wins over the socket's, for every GSO segment, next to
        // a source address (all three control messages in one send).
        let data = [7u8; 300];
        let t = [Transmit {
            dst: b.local_addr(),
            src_ip: Some(a.local_addr().ip()),
            tos: 0x20, // DSCP 8 (CS1): ucmatose -t 32
            contents: &data,
            pieces: &[],
            segment_size: Some(100),
        }];
        assert_eq!(a.send(&t).unwrap(), 1);
        let got = recv_segments(&b, 3);
        let n: usize = got.iter().map(|(m, d)| segments(m, d).count()).sum();
        assert_eq!(n, 3, "for {a_addr}");
        assert!(got.iter().all(|(m, _)| m.tos == 0x20), "for {a_addr}");
    }
}

#[test]
fn truncation_is_flagged() {
    let a = RoceSocket::bind_with(v4(13), NO_OFFLOAD).unwrap();
    let b = RoceSocket::bind_with(v4(14), NO_OFFLOAD).unwrap();
    let big = vec![5u8; 3000];
    let t = [Transmit {
        dst: b.local_addr(),
        src_ip: None,
        tos: 0,
        contents: &big,
        pieces: &[],
        segment_size: None,
    }];
    assert_eq!(a.send(&t).unwrap(), 1);
    let mut batch = RecvBatch::new(2, 1000);
    let deadline = Instant::now() + Duration::from_secs(5);
    let n = loop {
        match b.recv(&mut batch) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(n, 1);
    let (m, buf) = batch.get(0);
    assert!(m.truncated);
    assert_eq!((m.len, buf.len()), (1000, 1000));
}

#[test]
fn errors_are_typed_with_clear_messages() {
    let a = RoceSocket::bind_with(v4(15), BOTH).unwrap();
    let err = RoceSocket::bind(a.local_addr()).unwrap_err();
    assert!(matches!(err, IoError::AddrInUse(x) if x == a.local_addr()));
    assert_eq!(
        err.to_string(),
        format!("address {} is already in use", a.local_addr())
    );
    assert_eq!(err.raw_os_error(), Some(libc_eaddrinuse()));

    let nowhere: SocketAddr = "192.0.2.77:4791".parse().unwrap(); // TEST-NET-1
    let err = RoceSocket::bind(nowhere).unwrap_err();
    assert!(matches!(err, IoError::AddrNotAvailable(x) if x == nowhere));
    assert_eq!(
        err.to_string(),
        "address 192.0.2.77 is not assigned to any interface on this host"
    );

    // A transmit of the wrong family is refused, not sent, and does not panic.
    let t = [Transmit {
        dst: "[::1]:4791".parse().unwrap(),
        src_ip: None,
        tos: 0,
        contents: b"x",
        pieces: &[],
        segment_size: None,
    }];
    assert_eq!(a.send(&t).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    // After a good one, the bad one stops the batch: count of good ones is returned.
    let b = RoceSocket::bind_with(v4(16), BOTH).unwrap();
    let good = Transmit {
        dst: b.local_addr(),
        src_ip: None,
        tos: 0,
        contents: b"ok",
        pieces: &[],
        segment_size: None,
    };
    assert_eq!(a.send(&[good, t[0], good]).unwrap(), 1);
    // Empty input.
    assert_eq!(a.send(&[]).unwrap(), 0);
    // Too big for one datagram without segmentation: EMSGSIZE for the first transmit.
    let huge = vec![0u8; 70_000];
    let t = [Transmit {
        dst: b.local_addr(),
        src_ip: None,
        tos: 0,
        contents: &huge,
        pieces: &[],
        segment_size: None,
    }];
    assert_eq!(
        a.send(&t).unwrap_err().raw_os_error(),
        Some(libc_emsgsize())
    );
}

// errno values on Linux (x86-64 and aarch64 alike); the tests avoid a libc dependency.
fn libc_eaddrinuse() -> i32 {
    98
}
fn libc_emsgsize() -> i32 {
    90
}

#[test]
fn ipv4_id_prediction_follows_gso_grouping() {
    let a = RoceSocket::bind_with(v4(17), BOTH).unwrap();
    assert_eq!(a.segments_per_gso_send(4096), 15); // 15 * 4096 <= 65507 < 16 * 4096
    assert_eq!(a.segments_per_gso_send(1024), 63);
    assert_eq!(a.segments_per_gso_send(256), 64);
    let ids: Vec<u16> = (0..18).map(|k| a.ipv4_id_of_segment(4096, k)).collect();
    assert_eq!(
        ids,
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0, 1, 2]
    );
    let plain = RoceSocket::bind_with(a.local_addr(), NO_OFFLOAD).unwrap_err();
    assert!(matches!(plain, IoError::AddrInUse(_)));
    let plain = RoceSocket::bind_with(v4(18), NO_OFFLOAD).unwrap();
    assert_eq!(plain.segments_per_gso_send(4096), 1);
    assert!((0..5).all(|k| plain.ipv4_id_of_segment(4096, k) == 0));
    let six = RoceSocket::bind_with(v6(), BOTH).unwrap();
    assert_eq!(six.ipv4_id_of_segment(1000, 3), 0);
}

/// A Transmit given as pieces (header, payload elsewhere, trailer per segment: the
/// zero-copy send) arrives as the same datagrams as the joined bytes, as one GSO send
/// and, without GSO, cut into plain datagrams at segment boundaries inside pieces.
#[test]
fn gathered_pieces_arrive_as_joined_segments() {
    for (ai, bi, opts) in [(19, 20, BOTH), (21, 22, NO_OFFLOAD)] {
        let a = RoceSocket::bind_with(v4(ai), opts).unwrap();
        let b = RoceSocket::bind_with(v4(bi), opts).unwrap();
        // 5 segments of 12 + 1000 + 8 bytes; the last has a 300-byte payload.
        let heads: Vec<Vec<u8>> = (0..5u8).map(|i| vec![0x10 + i; 12]).collect();
        let payload = pattern(4300, 1000);
        let tails: Vec<Vec<u8>> = (0..5u8).map(|i| vec![0xe0 + i; 8]).collect();
        let mut pieces = Vec::new();
        let mut joined = Vec::new();
        for i in 0..5 {
            let p = &payload[i * 1000..(i * 1000 + 1000).min(payload.len())];
            for part in [&heads[i][..], p, &tails[i][..]] {
                pieces.push(libc::iovec {
                    iov_base: part.as_ptr() as *mut libc::c_void,
                    iov_len: part.len(),
                });
                joined.extend_from_slice(part);
            }
        }
        let t = [Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: &[],
            pieces: &pieces,
            segment_size: Some(1020),
        }];
        assert_eq!(t[0].byte_len(), joined.len());
        send_all(&a, &t);
        let got = recv_segments(&b, 5);
        let bufs: Vec<&[u8]> = got.iter().flat_map(|(m, b)| segments(m, b)).collect();
        let lens: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        assert_eq!(lens, [1020, 1020, 1020, 1020, 320], "offloads {opts:?}");
        let expect: Vec<&[u8]> = joined.chunks(1020).collect();
        assert!(bufs == expect, "offloads {opts:?}: bytes differ");
    }
}

/// A connected sender's datagrams arrive from its own port, without an address per send,
/// and the IPv4 ID it predicts is the one Linux writes: after a plain datagram and a GSO
/// send of four segments (which takes one ID, as Linux numbers datagrams when it builds
/// them), learning the counter again (two looped probes) finds exactly the predicted
/// value plus the two probes.
#[test]
fn connected_sender_counts_the_ids_linux_writes() {
    let b = RoceSocket::bind_with(v4(23), BOTH).unwrap();
    let mut s = ConnectedSender::open(v4(24).ip(), b.local_addr(), BOTH).unwrap();
    assert_eq!(s.socket().local_addr().ip(), v4(24).ip());
    assert_ne!(s.source_port(), 0);
    let plain = pattern(100, 100);
    let gso = pattern(3 * 200 + 50, 200);
    let t = [
        Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: &plain,
            pieces: &[],
            segment_size: None,
        },
        Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: &gso,
            pieces: &[],
            segment_size: Some(200),
        },
    ];
    let before = s.next_ipv4_id();
    send_all(s.socket(), &t);
    let got = recv_segments(&b, 5);
    assert!(got
        .iter()
        .all(|(m, _)| m.src == s.socket().local_addr() && m.dst_ip == Some(v4(23).ip())));
    let bytes: Vec<u8> = got.iter().flat_map(|(_, d)| d.clone()).collect();
    assert_eq!(bytes, [&plain[..], &gso[..]].concat());
    let predicted = s.next_ipv4_id();
    assert_eq!(predicted, before.wrapping_add(2));
    s.relearn().unwrap();
    assert_eq!(s.next_ipv4_id(), predicted.wrapping_add(2));
    // Without GSO the same Transmits are five datagrams, five IDs.
    let mut plain = ConnectedSender::open(v4(24).ip(), b.local_addr(), NO_OFFLOAD).unwrap();
    let before = plain.next_ipv4_id();
    send_all(plain.socket(), &t);
    assert_eq!(recv_segments(&b, 5).len(), 5);
    let predicted = plain.next_ipv4_id();
    assert_eq!(predicted, before.wrapping_add(5));
    plain.relearn().unwrap();
    assert_eq!(plain.next_ipv4_id(), predicted.wrapping_add(2));
    // IPv6 has no ID: nothing to learn, and sends still arrive.
    let b6 = RoceSocket::bind_with(v6(), BOTH).unwrap();
    let s6 = ConnectedSender::open(v6().ip(), b6.local_addr(), BOTH).unwrap();
    assert_eq!(s6.next_ipv4_id(), 0);
    send_all(
        s6.socket(),
        &[Transmit {
            dst: b6.local_addr(),
            ..t[0]
        }],
    );
    assert_eq!(recv_segments(&b6, 1)[0].1, t[0].contents);
}

/// 15 full segments and a short one fit one GSO message (62068 of 65507 bytes) where 16
/// full ones would not: they leave as one, so the segments carry IPv4 IDs 0..15 in
/// order, which is how the transport sealed them (it was cut after 15, and the 16th
/// left alone with ID 0 and a wrong ICRC: every READ of a size just under a multiple of
/// 64 KiB lost its last packet once).
#[test]
fn short_last_segment_keeps_a_transmit_in_one_gso_message() {
    let a = RoceSocket::bind_with(v4(25), BOTH).unwrap();
    let b = RoceSocket::bind_with(v4(26), BOTH).unwrap();
    let data = pattern(15 * 4112 + 388, 4112);
    send_all(
        &a,
        &[Transmit {
            dst: b.local_addr(),
            src_ip: None,
            tos: 0,
            contents: &data,
            pieces: &[],
            segment_size: Some(4112),
        }],
    );
    let got = recv_segments(&b, 16);
    assert_eq!(got.len(), 1, "one GRO datagram");
    assert_eq!((got[0].0.len, got[0].0.stride), (data.len(), 4112));
    assert_eq!(got[0].1, data);
}
