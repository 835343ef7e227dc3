//! Debian 12's rdma_cm programs, unmodified, between two network namespaces joined by a
//! link (softhca-testbed's, no impairment): each side's device serves its own
//! interface address with no softhca configuration (10.99.0.1 and 10.99.0.2), as on two
//! hosts. Needs root and iproute2; skipped with a message otherwise. Each test checks
//! the exit status and the program's own success output.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{have, lib_dir, pair_of, with_our_libs, Done};
use softhca_testbed::{check_available, End, Link, LinkConfig};

const T: Duration = Duration::from_secs(60);
/// The server's address, in namespace A.
const SERVER: &str = "10.99.0.1";

/// A link of our own (namespaces `shcm<pid><n>-a` and `-b`), or `None` with the reason
/// printed.
fn link(bins: &[&str]) -> Option<Link> {
    if lib_dir().is_none() || !bins.iter().all(|b| have(b)) {
        return None;
    }
    if let Err(e) = check_available() {
        eprintln!("SKIP: network namespaces: {e}");
        return None;
    }
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "shcm{}n{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    match Link::up(LinkConfig {
        name: Some(name),
        ..LinkConfig::default()
    }) {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!("SKIP: could not build the namespaces: {e}");
            None
        }
    }
}

/// `bin args` in namespace `end`, against our libraries, with no softhca configuration.
fn at(l: &Link, end: End, bin: &str, args: &[&str]) -> Command {
    let mut c = l.command(end, bin);
    c.args(args)
        .env_remove("SOFTHCA_ADDR")
        .env_remove("SOFTHCA_NETDEV");
    with_our_libs(c)
}

/// Server in A, client in B.
fn run(
    l: &Link,
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

#[test]
fn ib_send_bw_rdma_cm_between_namespaces() {
    let Some(l) = link(&["ib_send_bw"]) else {
        return;
    };
    let (s, c) = run(
        &l,
        ("ib_send_bw", &["-R"]),
        ("ib_send_bw", &["-R", SERVER]),
        true,
    );
    both_ok(&s, &c);
    assert!(c.stdout.contains("BW average[MB/sec]"), "{}", c.all());
}

#[test]
fn qperf_cm1_rc_bw_between_namespaces() {
    let Some(l) = link(&["qperf"]) else { return };
    // qperf's server is a daemon: killed once the client is done.
    let (_s, c) = run(
        &l,
        ("qperf", &[]),
        (
            "qperf",
            &["-cm1", "-t", "2", SERVER, "rc_bw", "rc_rdma_write_bw"],
        ),
        false,
    );
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    for t in ["rc_bw:", "rc_rdma_write_bw:"] {
        let after = c.stdout.split(t).nth(1).unwrap_or_default();
        assert!(after.trim_start().starts_with("bw  ="), "{t} {}", c.all());
    }
}

#[test]
fn ucmatose_from_a_second_address_between_namespaces() {
    let Some(l) = link(&["ucmatose"]) else { return };
    // The client's device serves a second address of its interface, not the one the
    // route to the server leaves from: its MADs must still leave from it (the kernel's
    // CM sends from the cm_id's source GID), else the REQ is never sent.
    let second = "10.99.0.12";
    let ok = softhca_testbed::ip(&[
        "-n",
        &l.netns(End::B),
        "addr",
        "add",
        &format!("{second}/24"),
        "dev",
        &format!("{}b", l.name()),
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
