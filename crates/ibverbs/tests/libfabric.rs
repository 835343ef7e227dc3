//! Unmodified libfabric (Debian's libfabric-bin 1.17) on softhca.
//!
//! - `fi_pingpong` over `verbs;ofi_rxd` (datagram endpoints, libibverbs only), whose verbs
//!   provider opens the device more than once per process, on two loopback addresses.
//! - The verbs provider's connected endpoints (`FI_EP_MSG`, over rdma_cm) and `ofi_rxm`'s
//!   reliable datagrams on top (`FI_EP_RDM`), which it offers only for a device that
//!   serves the address of a non-loopback interface: devices on the two ends of a veth
//!   pair, between two network namespaces (two hosts) and with both ends in one namespace
//!   (two processes on one host). These need root for the
//!   namespaces and say SKIP otherwise.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use softhca_testbed::{End, Veth, VethLayout};

/// The sizes of fi_pingpong's default sweep, as its result lines begin.
const SIZES: [&str; 6] = ["64 ", "256 ", "1k ", "4k ", "64k ", "1m "];

/// Both sides exited 0 and printed a result line with `iters` round trips per size.
fn check_sweep(s: &common::Done, c: &common::Done, iters: u32) {
    let want = format!("={iters}");
    for (who, d) in [("server", s), ("client", c)] {
        assert_eq!(d.status, Some(0), "{who}:\n{}", d.all());
        for size in SIZES {
            assert!(
                d.stdout
                    .lines()
                    .any(|l| l.starts_with(size) && l.contains(&want)),
                "{who}: no {size:?} line:\n{}",
                d.all()
            );
        }
    }
}

#[test]
fn fi_pingpong_rdm_over_verbs_rxd() {
    if !common::have("fi_pingpong") {
        return;
    }
    let _g = common::serial();
    let port = common::free_port().to_string();
    let args = ["-p", "verbs;ofi_rxd", "-e", "rdm", "-I", "50", "-B", &port];
    let server = common::cmd("fi_pingpong")
        .env("SOFTHCA_ADDR", "127.0.8.1")
        .args(args)
        .spawn()
        .expect("spawn server");
    let start = Instant::now();
    while !common::listening(port.parse().unwrap_or(0)) && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = common::cmd("fi_pingpong")
        .env("SOFTHCA_ADDR", "127.0.8.2")
        .args([
            "-p",
            "verbs;ofi_rxd",
            "-e",
            "rdm",
            "-I",
            "50",
            "-P",
            &port,
            "127.0.0.1",
        ])
        .spawn()
        .expect("spawn client");
    let c = common::finish(client, Duration::from_secs(120));
    let s = common::finish(server, Duration::from_secs(120));
    check_sweep(&s, &c, 50);
}

/// A veth pair named `name` in `layout`, or `None` (and a SKIP line) without root,
/// iproute2 or the libfabric tools.
fn veth(name: &str, layout: VethLayout) -> Option<Veth> {
    if !common::have("fi_info") || !common::have("fi_pingpong") {
        return None;
    }
    match Veth::up(name, layout) {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("SKIP: no veth pair between network namespaces ({e}); test not run");
            None
        }
    }
}

/// `bin` in the namespace of `end`, on our libibverbs and librdmacm, its device on the
/// end's interface (as a RoCE NIC on it would be), with its counters printed at exit.
/// With both ends in one namespace the device serves the end's address without being
/// tied to the interface (`SOFTHCA_NETDEV` would send through the veth, and the kernel
/// drops what arrives there from an address of its own).
fn fi_cmd(v: &Veth, end: End, bin: &str) -> Command {
    let mut c = v.command(end, bin);
    if v.netns(End::A) == v.netns(End::B) {
        c.env("SOFTHCA_ADDR", v.addr(end).to_string());
    } else {
        c.env("SOFTHCA_NETDEV", v.ifname(end));
    }
    c.env("LD_LIBRARY_PATH", common::lib_dir_with_rdmacm())
        .env("SOFTHCA_STATS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `fi_info` blocks (from one `sep` to the next) that mention all of `want`.
fn fi_info_blocks(v: &Veth, args: &[&str], sep: &str, want: &[&str]) -> usize {
    let out = fi_cmd(v, End::A, "fi_info")
        .args(args)
        .output()
        .expect("run fi_info");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fi_info {args:?}: {out:?}");
    text.split(sep)
        .filter(|b| want.iter().all(|w| b.contains(w)))
        .count()
}

#[test]
fn fi_info_lists_verbs_msg_and_rxm_rdm_on_an_interface() {
    let Some(v) = veth("shmwlfi", VethLayout::TwoHosts) else {
        return;
    };
    let msg = [
        "domain: softhca0\n",
        "type: FI_EP_MSG",
        "FI_PROTO_RDMA_CM_IB_RC",
    ];
    assert!(fi_info_blocks(&v, &["-p", "verbs"], "provider: ", &msg) >= 1);
    // ofi_rxm's endpoints listen on the interface's address, not on "localhost".
    let src = format!("src_addr: fi_sockaddr_in://{}:0", v.addr(End::A));
    let rdm = [
        "prov_name: verbs;ofi_rxm",
        "type: FI_EP_RDM",
        "protocol: FI_PROTO_RXM",
        &src,
    ];
    let args = ["-p", "verbs;ofi_rxm", "-t", "FI_EP_RDM", "-v"];
    assert!(fi_info_blocks(&v, &args, "fi_info:", &rdm) >= 1);
}

/// `fi_pingpong -p "verbs;ofi_rxm" -e rdm`: server on end `a`, client on end `b`; both
/// complete the sweep and their devices carried at least one packet per message.
fn rxm_pingpong(v: &Veth) {
    const ITERS: u32 = 50;
    let _g = common::serial();
    let port: u16 = 47592;
    let args = ["-p", "verbs;ofi_rxm", "-e", "rdm", "-I", "50"];
    let server = fi_cmd(v, End::A, "fi_pingpong")
        .args(args)
        .spawn()
        .expect("spawn server");
    let start = Instant::now();
    while !common::listening_in_netns_of(server.id(), port)
        && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = fi_cmd(v, End::B, "fi_pingpong")
        .args(args)
        .arg(v.addr(End::A).to_string())
        .spawn()
        .expect("spawn client");
    let c = common::finish(client, Duration::from_secs(180));
    let s = common::finish(server, Duration::from_secs(30));
    check_sweep(&s, &c, ITERS);
    let messages = ITERS as u64 * SIZES.len() as u64;
    for (who, d) in [("server", &s), ("client", &c)] {
        let sent: u64 = common::stat_values(&d.stderr, "sent_pkts").iter().sum();
        assert!(
            sent >= messages,
            "{who}: only {sent} packets sent through softhca (want {messages})\n{}",
            d.all()
        );
        eprintln!("{who}: {sent} packets sent through softhca");
    }
}

#[test]
fn fi_pingpong_rdm_over_verbs_rxm_between_namespaces() {
    if let Some(v) = veth("shmwlf2", VethLayout::TwoHosts) {
        rxm_pingpong(&v);
    }
}

#[test]
fn fi_pingpong_rdm_over_verbs_rxm_on_one_host() {
    if let Some(v) = veth("shmwlf1", VethLayout::OneHost) {
        rxm_pingpong(&v);
    }
}
