//! A device's published state ([`softhca::read_snapshot`]) is what the process itself
//! sees: its QPs with their peers and PSNs, and the counters of `Context::counters`.

mod common;

use common::*;
use softhca::*;

#[test]
fn published_snapshot_matches_the_device() {
    let dir = std::env::temp_dir().join(format!("softhca-pub-test-{}", std::process::id()));
    let open_in = |addr: &str| {
        let mut cfg = Config::loopback(ip(addr));
        cfg.publish = Publish::Dir(dir.clone());
        // 4 KiB packets whenever the WRITE starts: the PSNs below count them.
        cfg.jumbo = 0;
        Context::open(&cfg).unwrap()
    };
    let a = side(open_in("127.0.50.1"), QpType::Rc, 1 << 16);
    let b = side(open_in("127.0.50.2"), QpType::Rc, 1 << 16);
    connect(&a, &b);
    let data = pattern(20_000, 5);
    a.mr.write(0, &data).unwrap();
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, a.mr.sge(0, data.len() as u32));
    wr.remote_addr = b.mr.addr();
    wr.rkey = b.mr.rkey();
    a.qp.post_send(wr).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);

    let path = a.ctx.published_at().expect("published");
    let snap = read_snapshot(path).unwrap();
    assert_eq!(snap.pid, std::process::id());
    assert_eq!(snap.device.name, a.ctx.name());
    assert_eq!(snap.device.gids[0].ip, ip("127.0.50.1"));
    let qp = snap.qps.iter().find(|q| q.qpn == a.qp.qpn()).unwrap();
    assert_eq!((qp.qp_type.as_str(), qp.state.as_str()), ("RC", "RTS"));
    assert_eq!(qp.dest_qpn, b.qp.qpn());
    assert_eq!(qp.peer, Some(ip("127.0.50.2")));
    // 20000 bytes at MTU 4096: 5 packets from PSN 0x1000, all acknowledged.
    assert_eq!((qp.sq_psn, qp.una_psn, qp.send_queued), (0x1005, 0x1005, 0));
    let own: std::collections::BTreeMap<String, u64> = a
        .ctx
        .counters()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(
        snap.counters.keys().collect::<Vec<_>>(),
        own.keys().collect::<Vec<_>>()
    );
    for k in ["rdma_sends", "sent_pkts", "ack_received"] {
        if let Some(v) = own.get(k) {
            assert_eq!(snap.counters[k], *v, "{k}");
        }
    }
    assert_eq!(
        read_all(std::slice::from_ref(&dir)).len(),
        2,
        "both devices"
    );
    drop((a, b));
    assert!(
        read_all(std::slice::from_ref(&dir)).is_empty(),
        "sockets gone with the devices"
    );
    let _ = std::fs::remove_dir(&dir);
}
