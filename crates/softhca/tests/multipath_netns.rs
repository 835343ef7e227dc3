//! Multipath RC across two network namespaces joined by two veth pairs: one RC QP over
//! both links (every address pair), one link silently cut (nftables drop, both
//! directions) mid-transfer, every byte verified, the QP still in RTS, the cut paths
//! failed and, once the link is back, readmitted. Needs root, iproute2 and nft;
//! skipped with a message otherwise. A few seconds.

mod common;

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use softhca::*;

fn run(args: &[&str]) -> bool {
    let (cmd, rest) = args.split_first().expect("a command");
    Command::new(cmd)
        .args(rest)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Two namespaces, named after this process, with links 1 and 2 between them:
/// 10.61.k.1 in `a`, 10.61.k.2 in `b`. Removed on drop.
struct Net {
    a: String,
    b: String,
    id: u32,
}

impl Net {
    fn new() -> Option<Net> {
        // SAFETY: geteuid has no preconditions and touches no memory.
        if unsafe { libc::geteuid() } != 0 || !run(&["ip", "-V"]) || !run(&["nft", "-v"]) {
            eprintln!("skipped: needs root, iproute2 and nft");
            return None;
        }
        let id = std::process::id() % 100_000;
        let n = Net {
            a: format!("mpc{id}a"),
            b: format!("mpc{id}b"),
            id,
        };
        let mut ok = run(&["ip", "netns", "add", &n.a]) && run(&["ip", "netns", "add", &n.b]);
        for ns in [&n.a, &n.b] {
            ok = ok
                && run(&["ip", "-n", ns, "link", "set", "lo", "up"])
                && run(&[
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-qw",
                    "net.ipv4.conf.all.rp_filter=0",
                ])
                && run(&[
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-qw",
                    "net.ipv4.conf.default.rp_filter=0",
                ]);
        }
        for k in 1..=2 {
            let (va, vb) = (n.veth('a', k), n.veth('b', k));
            let (ia, ib) = (format!("10.61.{k}.1/24"), format!("10.61.{k}.2/24"));
            ok =
                ok && run(&[
                    "ip", "link", "add", &va, "type", "veth", "peer", "name", &vb,
                ]) && run(&["ip", "link", "set", &va, "netns", &n.a])
                    && run(&["ip", "link", "set", &vb, "netns", &n.b])
                    && run(&["ip", "-n", &n.a, "addr", "add", &ia, "dev", &va])
                    && run(&["ip", "-n", &n.b, "addr", "add", &ib, "dev", &vb])
                    && run(&["ip", "-n", &n.a, "link", "set", &va, "up"])
                    && run(&["ip", "-n", &n.b, "link", "set", &vb, "up"]);
        }
        if !ok {
            eprintln!("skipped: could not build the two namespaces");
            return None;
        }
        Some(n)
    }

    fn veth(&self, side: char, k: u8) -> String {
        format!("mpc{}{side}{k}", self.id)
    }

    /// Drop everything arriving on link `k`, at both ends (a silent black hole), or
    /// lift that.
    fn cut(&self, k: u8, on: bool) {
        for (ns, side) in [(&self.a, 'a'), (&self.b, 'b')] {
            if on {
                let dev = self.veth(side, k);
                let nft = |args: &[&str]| {
                    let mut v = vec!["ip", "netns", "exec", ns.as_str(), "nft"];
                    v.extend_from_slice(args);
                    run(&v)
                };
                let ok = nft(&["add", "table", "inet", "mpcut"])
                    && nft(&[
                        "add",
                        "chain",
                        "inet",
                        "mpcut",
                        "pre",
                        "{ type filter hook prerouting priority -300; }",
                    ])
                    && nft(&[
                        "add", "rule", "inet", "mpcut", "pre", "iifname", &dev, "drop",
                    ]);
                assert!(ok, "nft cut");
            } else {
                let del = [
                    "ip",
                    "netns",
                    "exec",
                    ns.as_str(),
                    "nft",
                    "delete",
                    "table",
                    "inet",
                    "mpcut",
                ];
                assert!(run(&del), "nft restore");
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        run(&["ip", "netns", "del", &self.a]);
        run(&["ip", "netns", "del", &self.b]);
    }
}

/// Runs `f` with this thread in namespace `ns` (a device opened there keeps its sockets
/// and its datapath thread there).
fn in_ns<T>(ns: &str, f: impl FnOnce() -> T) -> T {
    let home = File::open("/proc/thread-self/ns/net").expect("own namespace");
    let there = File::open(format!("/run/netns/{ns}")).expect("namespace");
    // SAFETY: setns on valid descriptors of network namespaces; it changes only this
    // thread's namespace.
    assert_eq!(
        unsafe { libc::setns(there.as_raw_fd(), libc::CLONE_NEWNET) },
        0
    );
    let r = f();
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) },
        0
    );
    r
}

fn open_in(ns: &str, addrs: [&str; 2]) -> Arc<Context> {
    in_ns(ns, || {
        let cfg = Config {
            addrs: addrs.iter().map(|a| a.parse::<IpAddr>().unwrap()).collect(),
            // Connected sockets would be opened lazily, from whichever thread runs the
            // datapath, in whichever namespace it is in: keep to the device sockets.
            connected_senders: false,
            poll: PollMode::Blocking,
            // The veths' 1500 bytes (the interface MTU is not read across namespaces).
            mtu: Mtu::M1024,
            ..Config::default()
        };
        Context::open(&cfg).unwrap_or_else(|e| panic!("open in {ns}: {e}"))
    })
}

fn stats(ctx: &Context) -> MpStats {
    ctx.multipath()
        .into_iter()
        .next()
        .expect("a multipath QP")
        .1
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    start.elapsed()
}

#[test]
fn one_qp_over_two_links_survives_a_cut_link() {
    let Some(net) = Net::new() else { return };
    const N: usize = 256;
    const LEN: usize = 256 << 10;
    const WINDOW: usize = 8;
    let a = side(
        open_in(&net.a, ["10.61.1.1", "10.61.2.1"]),
        QpType::Rc,
        N * LEN,
    );
    let b = side(
        open_in(&net.b, ["10.61.1.2", "10.61.2.2"]),
        QpType::Rc,
        N * LEN,
    );
    connect(&a, &b);
    wait_for("four active paths", Duration::from_secs(5), || {
        a.ctx
            .multipath()
            .first()
            .is_some_and(|(_, s)| s.paths.len() == 4 && s.paths.iter().all(|p| p.state == "active"))
    });
    let data = pattern(N * LEN, 0x61);
    a.mr.write(0, &data).unwrap();
    let post = |i: usize| {
        let off = i * LEN;
        let mut wr = send_wr(i as u64, WrOpcode::RdmaWrite, a.mr.sge(off, LEN as u32));
        wr.remote_addr = b.mr.addr() + off as u64;
        wr.rkey = b.mr.rkey();
        a.qp.post_send(wr).unwrap();
    };
    // A window of WRITEs in flight, so that the cut falls in the middle of traffic.
    let (mut posted, mut got) = (0usize, 0usize);
    while posted < WINDOW {
        post(posted);
        posted += 1;
    }
    let (mut gap, mut last, mut cut_at) = (Duration::ZERO, Instant::now(), None);
    let mut wc = [Completion::default(); 32];
    while got < N {
        if got >= N / 4 && cut_at.is_none() {
            net.cut(2, true);
            // From when the rule is in place (loading it takes a few ms).
            cut_at = Some(Instant::now());
            last = Instant::now();
        }
        let k = a.cq.wait(&mut wc, Duration::from_secs(10)).unwrap();
        assert!(
            k > 0,
            "stalled at {got} of {N}: {:?} {:?}",
            a.ctx.multipath(),
            a.ctx.counters()
        );
        let now = Instant::now();
        if cut_at.is_some() {
            gap = gap.max(now - last);
        }
        last = now;
        for c in &wc[..k] {
            assert_eq!(
                c.status,
                WcStatus::Success,
                "WR {}: {:?}",
                c.wr_id,
                a.ctx.multipath()
            );
            assert_eq!(c.wr_id, got as u64, "in order");
            got += 1;
            if posted < N {
                post(posted);
                posted += 1;
            }
        }
    }
    let cut_for = cut_at.map(|t| t.elapsed()).unwrap_or_default();
    assert!(b.mr.to_vec() == data, "every byte arrived");
    assert_eq!(a.qp.query().unwrap().0.qp_state, QpState::Rts);
    assert_eq!(b.qp.query().unwrap().0.qp_state, QpState::Rts);
    let s = stats(&a.ctx);
    eprintln!("transfer went on {cut_for:?} after the cut; longest wait for a completion then: {gap:?}\n{s}");
    let nonzero = |c: &Context| {
        c.counters()
            .into_iter()
            .filter(|(n, v)| *v != 0 && !n.starts_with("io_") && !n.starts_with("dp_"))
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    eprintln!(
        "A: {}\nB: {}\nB {}",
        nonzero(&a.ctx),
        nonzero(&b.ctx),
        stats(&b.ctx)
    );
    let on_link2 = |p: &&MpPathStats| {
        p.src.to_string().starts_with("10.61.2.") || p.dst.ip().to_string().starts_with("10.61.2.")
    };
    wait_for("the cut paths failed", Duration::from_secs(2), || {
        stats(&a.ctx)
            .paths
            .iter()
            .filter(on_link2)
            .all(|p| p.state == "failed")
    });
    assert_eq!(counter(&a.ctx, "retry_exceeded_err"), 0);
    net.cut(2, false);
    let back = wait_for("readmission", Duration::from_secs(3), || {
        stats(&a.ctx).paths.iter().all(|p| p.state == "active")
    });
    eprintln!("all paths active again {back:?} after the link came back");
    drop((a, b));
}
