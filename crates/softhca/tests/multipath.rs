//! The multipath RC extension between two real devices on loopback, each serving two
//! addresses: negotiated with no configuration, every address pair validated and used,
//! data verified; and plain RC when one side turns it off.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use softhca::*;

fn open_on(addrs: &[&str], mp: bool) -> Arc<Context> {
    open_with(addrs, mp, 1)
}

fn open_with(addrs: &[&str], mp: bool, sports: u8) -> Arc<Context> {
    open_dropping(addrs, mp, sports, 0)
}

fn open_dropping(addrs: &[&str], mp: bool, sports: u8, tx_drop_ppm: u32) -> Arc<Context> {
    let mut cfg = Config {
        addrs: addrs.iter().map(|a| ip(a)).collect(),
        tx_drop_ppm,
        ..Config::default()
    };
    cfg.poll = Config::from_env().unwrap().poll;
    cfg.multipath.enabled = mp;
    cfg.multipath.sports = sports;
    Context::open(&cfg).unwrap_or_else(|e| panic!("open {addrs:?}: {e}"))
}

/// Posts `n` WRITEs of `len` bytes from `a` to `b` and waits for every completion.
fn write_all(a: &Side, b: &Side, n: usize, len: usize) {
    for i in 0..n {
        let off = i * len;
        let mut wr = send_wr(i as u64, WrOpcode::RdmaWrite, a.mr.sge(off, len as u32));
        wr.remote_addr = b.mr.addr() + off as u64;
        wr.rkey = b.mr.rkey();
        a.qp.post_send(wr).unwrap();
    }
    let mut got = 0;
    let mut wc = [Completion::default(); 16];
    while got < n {
        let k = a.cq.wait(&mut wc, Duration::from_secs(20)).unwrap();
        assert!(k > 0, "completions stalled at {got} of {n}");
        for c in &wc[..k] {
            assert_eq!(c.status, WcStatus::Success, "WR {}", c.wr_id);
            assert_eq!(c.wr_id, got as u64, "in order");
            got += 1;
        }
    }
}

/// Waits until `ctx`'s only multipath QP has every path active.
fn wait_paths(ctx: &Context, paths: usize) -> MpStats {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some((_, s)) = ctx.multipath().into_iter().next() {
            if s.paths.len() == paths && s.paths.iter().all(|p| p.state == "active") {
                return s;
            }
        }
        assert!(std::time::Instant::now() < until, "{:?}", ctx.multipath());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn two_addresses_each_side_use_four_paths() {
    const LEN: usize = 16 << 20;
    let a = side(
        open_on(&["127.0.61.1", "127.0.61.3"], true),
        QpType::Rc,
        LEN,
    );
    let b = side(
        open_on(&["127.0.61.2", "127.0.61.4"], true),
        QpType::Rc,
        LEN,
    );
    connect(&a, &b);
    wait_paths(&a.ctx, 4);
    wait_paths(&b.ctx, 4);
    let data = pattern(LEN, 0x3c);
    a.mr.write(0, &data).unwrap();
    write_all(&a, &b, 256, LEN / 256);
    assert!(b.mr.to_vec() == data, "16 MiB arrived intact");
    let (_, s) = a.ctx.multipath().into_iter().next().expect("multipath QP");
    assert_eq!(s.state, MpState::On);
    let used = s.paths.iter().filter(|p| p.pkts > 0).count();
    eprintln!("{s}");
    assert!(used >= 2, "{s}");
    assert_eq!(counter(&a.ctx, "mp_negotiated"), 1);
    assert_eq!(a.qp.query().unwrap().0.qp_state, QpState::Rts);
}

#[test]
fn multipath_off_on_one_side_is_plain_rc() {
    const LEN: usize = 4 << 20;
    let a = side(
        open_on(&["127.0.61.5", "127.0.61.7"], true),
        QpType::Rc,
        LEN,
    );
    let b = side(
        open_on(&["127.0.61.6", "127.0.61.8"], false),
        QpType::Rc,
        LEN,
    );
    connect(&a, &b);
    let data = pattern(LEN, 0x77);
    a.mr.write(0, &data).unwrap();
    write_all(&a, &b, 64, LEN / 64);
    assert!(b.mr.to_vec() == data);
    // The "no" comes back at once: plain RC for the QP.
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while counter(&a.ctx, "mp_fallback") == 0 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(counter(&a.ctx, "mp_fallback"), 1);
    assert!(a.ctx.multipath().is_empty());
    assert_eq!(counter(&a.ctx, "mp_sack_rcvd"), 0);
}

#[test]
fn source_ports_alone_make_paths() {
    const LEN: usize = 8 << 20;
    let a = side(open_with(&["127.0.61.9"], true, 4), QpType::Rc, LEN);
    let b = side(open_with(&["127.0.61.10"], true, 4), QpType::Rc, LEN);
    connect(&a, &b);
    let s = wait_paths(&a.ctx, 4);
    let mut ports: Vec<u16> = s.paths.iter().map(|p| p.sport).collect();
    ports.dedup();
    assert_eq!(ports.len(), 4, "one source port per path: {s}");
    let data = pattern(LEN, 0x19);
    a.mr.write(0, &data).unwrap();
    write_all(&a, &b, 128, LEN / 128);
    assert!(b.mr.to_vec() == data, "8 MiB arrived intact");
    let (_, s) = a.ctx.multipath().into_iter().next().expect("multipath QP");
    assert!(s.paths.iter().filter(|p| p.pkts > 0).count() >= 2, "{s}");
}

/// Fault injection (`SOFTHCA_TX_DROP`, 5 % here) drops on every path, the extra source
/// ports' sockets included, and multipath repairs it: every path that carried 200
/// packets or more lost some (the chance it would not is 0.95^200), and 8 MiB arrive
/// intact.
#[test]
fn injected_drops_reach_every_source_port() {
    const LEN: usize = 8 << 20;
    let a = side(
        open_dropping(&["127.0.61.11"], true, 4, 50_000),
        QpType::Rc,
        LEN,
    );
    let b = side(open_with(&["127.0.61.12"], true, 4), QpType::Rc, LEN);
    connect(&a, &b);
    wait_paths(&a.ctx, 4);
    let data = pattern(LEN, 0x2b);
    a.mr.write(0, &data).unwrap();
    write_all(&a, &b, 128, LEN / 128);
    assert!(b.mr.to_vec() == data, "8 MiB arrived intact");
    let (_, s) = a.ctx.multipath().into_iter().next().expect("multipath QP");
    assert!(
        s.paths.iter().all(|p| p.pkts < 200 || p.losses > 0),
        "a path that carried data lost nothing: {s}"
    );
    assert!(counter(&a.ctx, "io_tx_injected_drops") > 0);
}
