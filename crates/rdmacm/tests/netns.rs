//! Debian 12's rdma_cm programs, unmodified, between two network namespaces joined by a
//! veth pair (softhca-testbed's `Veth`): each side's device serves its own interface
//! address with no softhca configuration (10.98.0.1 and 10.98.0.2), as on two hosts
//! joined by a cable. Needs root and iproute2; skipped with a message otherwise. Each
//! test checks the exit status and the program's own success output.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{have, lib_dir, pair_of, with_our_libs, Done};
use softhca_testbed::{check_available, End, Veth, VethLayout};

const T: Duration = Duration::from_secs(60);
/// The server's address, in namespace A.
const SERVER: &str = "10.98.0.1";

/// A veth pair of our own (namespaces `cmv<pid>n<n>-a` and `-b`), or `None` with the
/// reason printed.
fn link(bins: &[&str]) -> Option<Veth> {
    if lib_dir().is_none() || !bins.iter().all(|b| have(b)) {
        return None;
    }
    if let Err(e) = check_available() {
        eprintln!("SKIP: network namespaces: {e}");
        return None;
    }
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "cmv{}n{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    match Veth::up(&name, VethLayout::TwoHosts) {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!("SKIP: could not build the namespaces: {e}");
            None
        }
    }
}

/// `bin args` in namespace `end`, against our libraries, with no softhca configuration.
fn at(l: &Veth, end: End, bin: &str, args: &[&str]) -> Command {
    let mut c = l.command(end, bin);
    c.args(args)
        .env_remove("SOFTHCA_ADDR")
        .env_remove("SOFTHCA_NETDEV");
    with_our_libs(c)
}

/// Server in A, client in B.
fn run(
    l: &Veth,
    server: (&str, &[&str]),
    client: (&str, &[&str]),
    server_exits: bool,
) -> (Done, Done) {
    pair_of(
        || at(l, End::A, server.0, server.1),
        || at(l, End::B, client.0, client.1),
        T,
        server_exits,
        true,
    )
}

fn both_ok(s: &Done, c: &Done) {
    assert_eq!(s.status, Some(0), "server: {}", s.all());
    assert_eq!(c.status, Some(0), "client: {}", c.all());
}

#[test]
fn rping_between_namespaces() {
    let Some(l) = link(&["rping"]) else { return };
    let (s, c) = run(
        &l,
        ("rping", &["-s", "-a", SERVER, "-v", "-C", "100"]),
        ("rping", &["-c", "-a", SERVER, "-v", "-C", "100"]),
        true,
    );
    both_ok(&s, &c);
    assert!(c.stdout.contains("ping data: rdma-ping-99"), "{}", c.all());
    assert!(
        s.stdout.contains("server ping data: rdma-ping-99"),
        "{}",
        s.all()
    );
}

#[test]
fn ucmatose_between_namespaces() {
    let Some(l) = link(&["ucmatose"]) else { return };
    let (s, c) = run(
        &l,
        ("ucmatose", &["-b", SERVER, "-c", "4"]),
        ("ucmatose", &["-s", SERVER, "-c", "4", "-C", "10"]),
        true,
    );
    both_ok(&s, &c);
    assert!(c.stdout.contains("data transfers complete"), "{}", c.all());
    assert!(s.stdout.contains("disconnected"), "{}", s.all());
}

#[test]
fn ucmatose_with_tos_between_namespaces() {
    let Some(l) = link(&["ucmatose"]) else { return };
    // -t sets RDMA_OPTION_ID_TOS on the client's ids before they resolve their route;
    // the passive side takes the REQ's traffic class (tshark.rs checks the IP header).
    let (s, c) = run(
        &l,
        ("ucmatose", &["-b", SERVER, "-c", "4"]),
        (
            "ucmatose",
            &["-s", SERVER, "-c", "4", "-C", "10", "-t", "32"],
        ),
        true,
    );
    both_ok(&s, &c);
    assert!(c.stdout.contains("data transfers complete"), "{}", c.all());
    assert!(s.stdout.contains("disconnected"), "{}", s.all());
}

#[test]
fn udaddy_between_namespaces() {
    let Some(l) = link(&["udaddy"]) else { return };
    let (s, c) = run(
        &l,
        ("udaddy", &["-b", SERVER]),
        ("udaddy", &["-s", SERVER]),
        true,
    );
    both_ok(&s, &c);
    assert!(c.stdout.contains("data transfers complete"), "{}", c.all());
    assert!(s.stdout.contains("data transfers complete"), "{}", s.all());
}

/// perftest's `bin -R` server in A, client in B: both exit 0, the client prints its
/// result line.
fn perftest(bin: &str, extra: &[&str], result_line: &str) {
    let Some(l) = link(&[bin]) else { return };
    let sargs = [&["-R"], extra].concat();
    let cargs = [&sargs[..], &[SERVER]].concat();
    let (s, c) = run(&l, (bin, &sargs), (bin, &cargs), true);
    both_ok(&s, &c);
    assert!(c.stdout.contains(result_line), "{}", c.all());
}

#[test]
fn ib_send_bw_rdma_cm_between_namespaces() {
    perftest("ib_send_bw", &[], "BW average[MB/sec]");
}

#[test]
fn ib_send_bw_rdma_cm_ud_between_namespaces() {
    perftest("ib_send_bw", &["-c", "UD"], "BW average[MB/sec]");
}

#[test]
fn ib_write_bw_rdma_cm_between_namespaces() {
    perftest("ib_write_bw", &[], "BW average[MB/sec]");
}

#[test]
fn ib_read_lat_rdma_cm_between_namespaces() {
    perftest("ib_read_lat", &[], "t_avg[usec]");
}

#[test]
fn rdma_server_and_client_between_namespaces() {
    let Some(l) = link(&["rdma_server", "rdma_client"]) else {
        return;
    };
    let (s, c) = run(
        &l,
        ("rdma_server", &["-s", SERVER]),
        ("rdma_client", &["-s", SERVER]),
        true,
    );
    both_ok(&s, &c);
    assert!(c.stdout.contains("rdma_client: end 0"), "{}", c.all());
    assert!(s.stdout.contains("rdma_server: end 0"), "{}", s.all());
}

#[test]
fn qperf_cm1_between_namespaces() {
    let Some(l) = link(&["qperf"]) else { return };
    // qperf's server is a daemon: killed once the client is done.
    let tests = ["rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_read_bw"];
    let args = [&["-cm1", "-t", "1", SERVER][..], &tests].concat();
    let (_s, c) = run(&l, ("qperf", &[]), ("qperf", &args), false);
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    for t in tests {
        let after = c.stdout.split(&format!("{t}:")).nth(1).unwrap_or_default();
        let want = if t == "rc_lat" { "latency  =" } else { "bw  =" };
        assert!(after.trim_start().starts_with(want), "{t} {}", c.all());
    }
}

#[test]
fn qperf_cm1_on_one_host_with_no_configuration() {
    let Some(l) = link(&["qperf"]) else { return };
    // Both ends in one namespace with no SOFTHCA_ADDR. qperf's client opens its device
    // first (it takes 10.98.0.1 and 127.0.0.1) and its server one per test, after the
    // client asked (a free loopback address): the client's connection to 127.0.0.1, its
    // own address with no listener of its own, reaches the server's wildcard listener,
    // as on one kernel.
    let tests = ["rc_bw", "rc_lat", "rc_rdma_read_bw"];
    let args = [&["-cm1", "-t", "1", "127.0.0.1"][..], &tests].concat();
    let (_s, c) = pair_of(
        || at(&l, End::A, "qperf", &[]),
        || at(&l, End::A, "qperf", &args),
        T,
        false,
        true,
    );
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    for t in tests {
        let after = c.stdout.split(&format!("{t}:")).nth(1).unwrap_or_default();
        let want = if t == "rc_lat" { "latency  =" } else { "bw  =" };
        assert!(after.trim_start().starts_with(want), "{t} {}", c.all());
    }
}

#[test]
fn cmtime_between_namespaces() {
    let Some(l) = link(&["cmtime"]) else { return };
    // 100 connections set up and torn down; the server is a daemon.
    let (_s, c) = run(
        &l,
        ("cmtime", &["-b", SERVER]),
        ("cmtime", &["-s", SERVER]),
        false,
    );
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    assert!(
        c.stdout.contains("destroying id") && c.stdout.contains("connect      :"),
        "{}",
        c.all()
    );
}

#[test]
fn ucmatose_from_a_second_address_between_namespaces() {
    let Some(l) = link(&["ucmatose"]) else { return };
    // The client's device serves a second address of its interface, not the one the
    // route to the server leaves from: its MADs must still leave from it (the kernel's
    // CM sends from the cm_id's source GID), else the REQ is never sent.
    let second = "10.98.0.12";
    let ok = softhca_testbed::ip(&[
        "-n",
        &l.netns(End::B),
        "addr",
        "add",
        &format!("{second}/24"),
        "dev",
        &l.ifname(End::B),
    ]);
    if let Err(e) = ok {
        eprintln!("SKIP: second address: {e}");
        return;
    }
    let (s, c) = pair_of(
        || at(&l, End::A, "ucmatose", &["-b", SERVER, "-c", "2"]),
        || {
            let mut c = at(
                &l,
                End::B,
                "ucmatose",
                &["-s", SERVER, "-b", second, "-c", "2", "-C", "10"],
            );
            c.env("SOFTHCA_ADDR", second);
            c
        },
        T,
        true,
        true,
    );
    both_ok(&s, &c);
    assert!(c.stdout.contains("data transfers complete"), "{}", c.all());
}

#[test]
fn rping_over_loopback_beside_a_smaller_mtu_interface() {
    let Some(l) = link(&["rping"]) else { return };
    // In one namespace: the server's device serves the veth's address (MTU 1500, so
    // the port's active MTU is 1024) and 127.0.0.1; the client's, started second, a
    // free loopback address (MTU 4096). The REQ offers 4096, what loopback carries, and
    // the server's QP on 127.0.0.1 takes it (it was refused against the port's 1024).
    let mtu = [
        "-n",
        &l.netns(End::A),
        "link",
        "set",
        "dev",
        &l.ifname(End::A),
        "mtu",
        "1500",
    ];
    if let Err(e) = softhca_testbed::ip(&mtu) {
        eprintln!("SKIP: set the MTU: {e}");
        return;
    }
    let (s, c) = pair_of(
        || {
            at(
                &l,
                End::A,
                "rping",
                &["-s", "-a", "127.0.0.1", "-v", "-C", "20"],
            )
        },
        || {
            at(
                &l,
                End::A,
                "rping",
                &["-c", "-a", "127.0.0.1", "-v", "-C", "20"],
            )
        },
        T,
        true,
        true,
    );
    both_ok(&s, &c);
    assert!(c.stdout.contains("ping data: rdma-ping-19"), "{}", c.all());
}

#[test]
fn rping_to_a_destination_with_no_route_fails_at_once() {
    let Some(l) = link(&["rping"]) else { return };
    // No default route in the namespace: rdma_resolve_addr itself fails with
    // ENETUNREACH, as the kernel's rdma_resolve_ip does, and rping says so and exits.
    let start = std::time::Instant::now();
    let c = common::finish(
        at(&l, End::B, "rping", &["-c", "-a", "192.0.2.1", "-C", "1"])
            .spawn()
            .expect("spawn rping"),
        T,
    );
    assert_eq!(c.status, Some(255), "{}", c.all());
    assert!(
        c.stderr
            .contains("rdma_resolve_addr: Network is unreachable"),
        "{}",
        c.all()
    );
    assert!(start.elapsed() < Duration::from_secs(10), "{}", c.all());
}

/// `mckey` receiver and sender: both exit 0 and say so, the receiver having taken all of
/// its messages (it polls for them, so a lost one would hang it until `T`).
fn mckey_pair(l: &Veth, recv: (End, &[&str]), send: (End, &[&str])) {
    let (r, s) = pair_of(
        || at(l, recv.0, "mckey", recv.1),
        || at(l, send.0, "mckey", send.1),
        T,
        true,
        true,
    );
    both_ok(&r, &s);
    for d in [&r, &s] {
        assert!(d.stdout.contains("joined dgid: ::ffff:239."), "{}", d.all());
        assert!(d.stdout.contains("data transfers complete"), "{}", d.all());
        assert!(d.stdout.contains("return status 0"), "{}", d.all());
    }
}

#[test]
fn mckey_between_namespaces() {
    let Some(l) = link(&["mckey"]) else { return };
    // Each side binds its interface address (the namespaces have no route to the
    // group); the group's datagrams cross the veth as IP multicast.
    let msgs = ["-C", "100", "-S", "1000"];
    let recv = [&["-m", "239.98.0.1", "-b", SERVER][..], &msgs].concat();
    let send = [&["-m", "239.98.0.1", "-b", "10.98.0.2", "-s"][..], &msgs].concat();
    mckey_pair(&l, (End::A, &recv), (End::B, &send));
}

#[test]
fn mckey_on_one_host_with_no_configuration() {
    let Some(l) = link(&["mckey", "ip", "stdbuf"]) else {
        return;
    };
    // One namespace with a multicast route out of its veth, no SOFTHCA_ADDR. The
    // receiver opens its device first (10.98.0.1 and 127.0.0.1); the sender gets a free
    // loopback address, sends from it (the group's route leaves from an address it does
    // not serve) and reaches the receiver's device, which joined on the loopback too.
    let ifname = l.ifname(End::A);
    let route = l
        .command(End::A, "ip")
        .args(["route", "add", "224.0.0.0/4", "dev", &ifname])
        .status()
        .unwrap();
    assert!(route.success());
    let msgs = ["-C", "20"];
    let recv = [&["-m", "239.98.0.2"][..], &msgs].concat();
    let send = [&["-m", "239.98.0.2", "-s"][..], &msgs].concat();
    mckey_pair(&l, (End::A, &recv), (End::A, &send));
    // And the other way round: the first device sends out of the veth, and the
    // loopback-only one hears it there (it joined on the group's route too).
    // Line-buffered, so that a receiver stopped at the timeout shows how far it got.
    let send_first = [&["-oL", "mckey", "-m", "239.98.0.3", "-s"][..], &msgs].concat();
    let recv_second = [&["-oL", "mckey", "-m", "239.98.0.3"][..], &msgs].concat();
    // mckey's sender sends once, 3 s after its own join: a receiver that joins later
    // (started 1.5 s after it, on a loaded machine) waits for nothing until the timeout.
    // That race is mckey's, so it gets one more try; the first one's output is kept.
    let mut earlier = String::new();
    for attempt in 1..=2 {
        let (s, r) = pair_of(
            || at(&l, End::A, "stdbuf", &send_first),
            || at(&l, End::A, "stdbuf", &recv_second),
            T,
            true,
            true,
        );
        if attempt == 1 && s.status == Some(0) && r.status.is_none() {
            earlier = format!("--- attempt 1 (receiver timed out)\n{}", r.all());
            continue;
        }
        both_ok(&s, &r);
        assert!(
            r.stdout.contains("data transfers complete"),
            "{}{earlier}",
            r.all()
        );
        break;
    }
}
