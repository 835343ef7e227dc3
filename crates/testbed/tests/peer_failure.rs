//! Peer failure and partitions, with the softhca Rust API.
//!
//! * A peer *process* (this test binary re-run as a child) is killed with SIGKILL in the
//!   middle of a stream of RDMA WRITEs: the outstanding WRs must complete with
//!   IBV_WC_RETRY_EXC_ERR within the time `timeout` and `retry_cnt` imply, the QP must be
//!   in ERR, later WRs must flush with IBV_WC_WR_FLUSH_ERR, this process keeps running and
//!   a restarted peer is reachable with new QPs. Runs on loopback; needs no root.
//! * A partition (the impairment link dropping 100 %) longer than the retry budget does
//!   the same; a shorter one is survived with no error. Needs root and `ip netns`: each
//!   device is opened on a thread that entered one namespace, so its sockets live there.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca::*;
use softhca_testbed::{End as LinkEnd, Impairment, LinkConfig};

const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Local ACK timeout exponent used here: 4.096 µs × 2^12 ≈ 16.8 ms.
const TIMEOUT: u8 = 12;
/// Transport retries (7 would mean "retry forever" in rxe and softhca).
const RETRY_CNT: u8 = 3;

fn ack_timeout() -> Duration {
    Duration::from_nanos(4096 << TIMEOUT)
}

/// The time after which a requester whose peer went silent must have given up: the
/// first transmission's timeout plus one per retry, each doubled after a timeout in a
/// row without progress, at most 8× (softhca's backoff, `Qp::rto_deadline`).
fn retry_budget() -> Duration {
    (0..=u32::from(RETRY_CNT))
        .map(|k| ack_timeout() * (1 << k.min(3)))
        .sum()
}

struct Side {
    ctx: Arc<Context>,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(ctx: Arc<Context>, mr_len: usize) -> Side {
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(4096, None).expect("cq");
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    let qp = pd.create_qp(&init).expect("qp");
    let mr = pd.reg_mr(mr_len, ACCESS).expect("mr");
    Side {
        ctx,
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

/// INIT → RTR → RTS towards `remote` with this file's TIMEOUT and RETRY_CNT.
fn connect(s: &Side, local_psn: u32, remote_qpn: u32, remote_psn: u32, remote_ip: IpAddr) {
    let gid_index = s.ctx.gid_index_for(remote_ip).unwrap_or(0);
    let remote = RemoteQp {
        qpn: remote_qpn,
        psn: remote_psn,
        gid: Gid::from_ip(remote_ip),
    };
    let opts = ConnectOptions {
        timeout: TIMEOUT,
        retry_cnt: RETRY_CNT,
        access: Some(ACCESS),
        ..ConnectOptions::default()
    };
    s.qp.connect_rc_with(local_psn, &remote, s.ctx.active_mtu(), gid_index, &opts)
        .expect("INIT → RTR → RTS");
}

fn write_wr(s: &Side, wr_id: u64, off: usize, len: u32, raddr: u64, rkey: u32) -> SendWr {
    SendWr {
        wr_id,
        opcode: WrOpcode::RdmaWrite,
        flags: SendFlags::SIGNALED,
        payload: Payload::Sges(smallvec![s.mr.sge(off, len)]),
        remote_addr: raddr,
        rkey,
        ..SendWr::default()
    }
}

// ---------------------------------------------------------------- killed peer process

const ROLE: &str = "SOFTHCA_FAULTS_PEER_ROLE";
const PEER_ADDR: &str = "127.0.3.2";
const OUR_ADDR: &str = "127.0.3.1";
const PEER_MR: usize = 1 << 20;

/// The peer process: runs only when re-executed by the parent test with `ROLE` set.
/// Prints `PEER <qpn> <addr> <rkey>`, reads `<qpn> <psn>` of the parent, connects and
/// serves (its datapath thread answers) until killed, or 60 s as a safety net.
#[test]
fn peer_process_child() {
    if std::env::var_os(ROLE).is_none() {
        return;
    }
    let ctx = Context::open(&Config::loopback(PEER_ADDR.parse().expect("ip"))).expect("open");
    let s = side(ctx, PEER_MR);
    println!("PEER {} {} {}", s.qp.qpn(), s.mr.addr(), s.mr.rkey());
    std::io::stdout().flush().expect("flush");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("read parent");
    let v: Vec<u32> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    connect(&s, 0x2000, v[0], v[1], OUR_ADDR.parse().expect("ip"));
    println!("CONNECTED");
    std::io::stdout().flush().expect("flush");
    std::thread::sleep(Duration::from_secs(60));
}

struct Peer {
    child: Child,
    qpn: u32,
    addr: u64,
    rkey: u32,
}

impl Drop for Peer {
    /// A failing test must not leave a peer holding the address for the next run.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_peer(our_qpn: u32, our_psn: u32) -> Peer {
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "peer_process_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn peer");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let hello = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).expect("read peer") > 0,
            "peer died"
        );
        // libtest may print "test peer_process_child ... " in front of it.
        if let Some(rest) = line.find("PEER ").map(|i| &line[i + 5..]) {
            break rest
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>();
        }
    };
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{our_qpn} {our_psn}").expect("tell peer");
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).expect("read peer") > 0,
            "peer died"
        );
        if line.contains("CONNECTED") {
            break;
        }
    }
    // Keep the pipes open for the child's life (it must not see EOF or SIGPIPE).
    std::mem::forget(stdin);
    std::mem::forget(out);
    Peer {
        child,
        qpn: hello[0].parse().expect("qpn"),
        addr: hello[1].parse().expect("addr"),
        rkey: hello[2].parse().expect("rkey"),
    }
}

fn poll_one(cq: &Cq, limit: Duration) -> Option<Completion> {
    let mut wc = [Completion::default(); 1];
    let n = cq.wait(&mut wc, limit).expect("cq wait");
    (n == 1).then_some(wc[0])
}

#[test]
fn killed_peer_fails_outstanding_wrs_within_the_retry_budget_then_reconnects() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let ctx = Context::open(&Config::loopback(OUR_ADDR.parse().expect("ip"))).expect("open");
    let a = side(ctx.clone(), 4 << 20);
    let mut peer = start_peer(a.qp.qpn(), 0x1000);
    connect(&a, 0x1000, peer.qpn, 0x2000, PEER_ADDR.parse().expect("ip"));

    // A steady stream of 64 KiB WRITEs, 32 outstanding; kill the peer after 100 completed.
    const MSG: u32 = 64 * 1024;
    let (mut posted, mut ok) = (0u64, 0u64);
    let mut kill_at = None;
    let mut first_err = None;
    let mut statuses = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while first_err.is_none() && Instant::now() < deadline {
        while kill_at.is_none() && posted - ok - (statuses.len() as u64) < 32 {
            let off = (posted as usize % 16) * MSG as usize;
            let raddr = peer.addr + (posted % (PEER_MR as u64 / u64::from(MSG))) * u64::from(MSG);
            a.qp.post_send(write_wr(&a, posted, off, MSG, raddr, peer.rkey))
                .expect("post");
            posted += 1;
        }
        let Some(c) = poll_one(&a.cq, Duration::from_secs(2)) else {
            continue;
        };
        if c.status == WcStatus::Success {
            ok += 1;
        } else {
            first_err = Some((Instant::now(), c));
            statuses.push(c.status);
        }
        if ok == 100 && kill_at.is_none() {
            peer.child.kill().expect("SIGKILL the peer");
            // Reaped: its socket is gone. The 31 WRITEs still outstanding may all have
            // been ACKed before it died (they were, in half the runs, once the datapath
            // got faster), so one more goes to the dead peer for sure.
            let _ = peer.child.wait();
            kill_at = Some(Instant::now());
            let off = (posted as usize % 16) * MSG as usize;
            a.qp.post_send(write_wr(&a, posted, off, MSG, peer.addr, peer.rkey))
                .expect("post after the kill");
            posted += 1;
        }
    }
    let kill_at = kill_at.unwrap_or_else(|| {
        panic!("100 WRITEs completed before the kill: {ok} ok, first error {first_err:?}")
    });
    let (err_at, err) = first_err.expect("an error completion after the kill");
    let took = err_at.duration_since(kill_at);
    eprintln!(
        "peer killed after {ok} WRITEs; RETRY_EXC_ERR {took:?} later (budget {:?})",
        retry_budget()
    );
    assert_eq!(
        err.status,
        WcStatus::RetryExcErr,
        "first error is retry exceeded"
    );
    // Bound: the retry budget, plus scheduling slack for a loaded 2-core box.
    assert!(
        took <= retry_budget() + Duration::from_millis(400),
        "gave up after {took:?}, budget {:?}",
        retry_budget()
    );
    assert!(took >= ack_timeout() / 2, "gave up too early: {took:?}");
    assert_eq!(a.qp.state().expect("query"), QpState::Err);

    // Every other outstanding WR flushes.
    let outstanding = posted - ok - 1;
    for _ in 0..outstanding {
        let c = poll_one(&a.cq, Duration::from_secs(2)).expect("flush completion");
        assert!(
            matches!(c.status, WcStatus::WrFlushErr | WcStatus::Success),
            "outstanding WR ended with {:?}",
            c.status
        );
    }
    // A WR posted now flushes too.
    a.qp.post_send(write_wr(&a, 9999, 0, 16, peer.addr, peer.rkey))
        .expect("post to an ERR QP is accepted");
    let c = poll_one(&a.cq, Duration::from_secs(2)).expect("flush of a later WR");
    assert_eq!((c.wr_id, c.status), (9999, WcStatus::WrFlushErr));
    let _ = peer.child.wait();

    // The process lives on: a restarted peer (same address) with new QPs works.
    let b = side(ctx, 1 << 20);
    let mut peer2 = start_peer(b.qp.qpn(), 0x3000);
    connect(
        &b,
        0x3000,
        peer2.qpn,
        0x2000,
        PEER_ADDR.parse().expect("ip"),
    );
    let data: Vec<u8> = (0..MSG).map(|i| (i * 7 + 3) as u8).collect();
    b.mr.write(0, &data).expect("fill");
    b.qp.post_send(write_wr(&b, 1, 0, MSG, peer2.addr + 4096, peer2.rkey))
        .expect("post");
    let c = poll_one(&b.cq, Duration::from_secs(5)).expect("write done");
    assert_eq!(c.status, WcStatus::Success);
    let mut rd = write_wr(&b, 2, 1 << 19, MSG, peer2.addr + 4096, peer2.rkey);
    rd.opcode = WrOpcode::RdmaRead;
    b.qp.post_send(rd).expect("post read");
    let c = poll_one(&b.cq, Duration::from_secs(5)).expect("read done");
    assert_eq!(c.status, WcStatus::Success);
    let mut back = vec![0u8; MSG as usize];
    b.mr.read(1 << 19, &mut back).expect("read");
    assert_eq!(back, data, "the new peer has the bytes we wrote");
    let _ = peer2.child.kill();
    let _ = peer2.child.wait();
    drop(a);
}

// ---------------------------------------------------------------- partitions

/// Runs `f` on a thread that entered network namespace `ns`, and waits for it.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    softhca_testbed::spawn_in_netns(ns, f)
        .join()
        .expect("netns thread")
}

/// Streams 64 KiB WRITEs from `a` to `b` for `run`, with a partition of `cut` starting
/// after `before`. Returns the first error completion (and when it came, from the cut).
fn stream_with_partition(
    link: &softhca_testbed::Link,
    a: &Side,
    b: &Side,
    cut: Duration,
    run: Duration,
) -> (u64, Option<(Duration, WcStatus)>) {
    const MSG: u32 = 64 * 1024;
    let before = Duration::from_millis(300);
    let start = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut cut_at = None;
    let mut healed = false;
    while start.elapsed() < run {
        let t = start.elapsed();
        if cut_at.is_none() && t >= before {
            link.set_impairment(Impairment::PARTITION);
            cut_at = Some(Instant::now());
        }
        if let Some(c) = cut_at {
            if !healed && c.elapsed() >= cut {
                link.set_impairment(Impairment::NONE);
                healed = true;
            }
        }
        while posted - done < 16 {
            let off = (posted as usize % 16) * MSG as usize;
            let raddr = b.mr.addr() + off as u64;
            a.qp.post_send(write_wr(a, posted, off, MSG, raddr, b.mr.rkey()))
                .expect("post");
            posted += 1;
        }
        if let Some(c) = poll_one(&a.cq, Duration::from_millis(5)) {
            done += 1;
            if c.status != WcStatus::Success {
                let since = cut_at.map_or(Duration::ZERO, |t| t.elapsed());
                return (done, Some((since, c.status)));
            }
        }
    }
    link.set_impairment(Impairment::NONE);
    (done, None)
}

fn partition_pair() -> Option<(softhca_testbed::Link, Side, Side)> {
    let link = common::link(LinkConfig::default())?;
    let (ip_a, ip_b) = (link.addr(LinkEnd::A), link.addr(LinkEnd::B));
    let a = in_netns(&link.netns(LinkEnd::A), || {
        side(Context::open(&Config::default()).expect("open a"), 1 << 20)
    });
    let b = in_netns(&link.netns(LinkEnd::B), || {
        side(Context::open(&Config::default()).expect("open b"), 1 << 20)
    });
    connect(&a, 0x100, b.qp.qpn(), 0x200, ip_b);
    connect(&b, 0x200, a.qp.qpn(), 0x100, ip_a);
    Some((link, a, b))
}

#[test]
fn partition_shorter_than_the_retry_budget_is_survived() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let Some((link, a, b)) = partition_pair() else {
        return;
    };
    // About two timeouts long: retries are used, the budget (4 timeouts) is not.
    let cut = ack_timeout() * 2;
    let (done, err) = stream_with_partition(&link, &a, &b, cut, Duration::from_millis(1500));
    assert_eq!(err, None, "no error across a {cut:?} partition");
    assert!(
        done > 20,
        "traffic flowed after the partition ({done} WRITEs)"
    );
    assert!(
        link.stats(LinkEnd::A)
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    assert_eq!(a.qp.state().expect("query"), QpState::Rts);
}

#[test]
fn partition_longer_than_the_retry_budget_fails_like_a_dead_peer() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let Some((link, a, b)) = partition_pair() else {
        return;
    };
    let cut = Duration::from_secs(2);
    let (_, err) = stream_with_partition(&link, &a, &b, cut, Duration::from_secs(4));
    let (since, status) = err.expect("an error during a 2 s partition");
    assert_eq!(status, WcStatus::RetryExcErr);
    assert!(
        since <= retry_budget() + Duration::from_millis(400),
        "gave up {since:?} after the cut, budget {:?}",
        retry_budget()
    );
    assert_eq!(a.qp.state().expect("query"), QpState::Err);
    a.qp.post_send(write_wr(&a, 7777, 0, 8, b.mr.addr(), b.mr.rkey()))
        .expect("post");
    // Drain: every remaining completion is a flush, ending with ours.
    let mut last = None;
    while let Some(c) = poll_one(&a.cq, Duration::from_millis(500)) {
        assert!(matches!(c.status, WcStatus::WrFlushErr | WcStatus::Success));
        last = Some(c);
    }
    let last = last.expect("the later WR completed");
    assert_eq!((last.wr_id, last.status), (7777, WcStatus::WrFlushErr));
}
