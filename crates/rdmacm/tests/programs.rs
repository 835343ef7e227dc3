//! Debian 12's rdma_cm programs, unmodified, between two processes on one host: the
//! server's device on 127.0.6.2, the client's on 127.0.6.3. Each test checks the exit
//! status and the program's own success output. A missing program prints SKIP and passes.

mod common;

use std::time::Duration;

use common::{cmd, finish, have, lib_dir, pair, SERVER};

const T: Duration = Duration::from_secs(60);

fn ready(bins: &[&str]) -> bool {
    lib_dir().is_some() && bins.iter().all(|b| have(b))
}

#[test]
fn rping() {
    if !ready(&["rping"]) {
        return;
    }
    let (s, c) = pair(
        ("rping", &["-s", "-a", SERVER, "-v", "-C", "10"]),
        ("rping", &["-c", "-a", SERVER, "-v", "-C", "10"]),
        T,
        true,
        true,
    );
    assert_eq!(s.status, Some(0), "server: {}", s.all());
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    assert!(c.stdout.contains("ping data: rdma-ping-9"), "{}", c.all());
    assert!(
        s.stdout.contains("server ping data: rdma-ping-9"),
        "{}",
        s.all()
    );
}

#[test]
fn rping_with_its_own_qp_transitions() {
    // rping -q moves its QP with rdma_init_qp_attr and connects with rdma_establish.
    if !ready(&["rping"]) {
        return;
    }
    let (s, c) = pair(
        ("rping", &["-s", "-a", SERVER, "-v", "-C", "5", "-q"]),
        ("rping", &["-c", "-a", SERVER, "-v", "-C", "5", "-q"]),
        T,
        true,
        true,
    );
    assert_eq!(s.status, Some(0), "server: {}", s.all());
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    assert!(c.stdout.contains("ping data: rdma-ping-4"), "{}", c.all());
}

fn perftest(bin: &str, extra: &[&str], result_line: &str) {
    if !ready(&[bin]) {
        return;
    }
    let mut sargs = vec!["-R"];
    sargs.extend_from_slice(extra);
    let mut cargs = sargs.clone();
    cargs.push(SERVER);
    let (s, c) = pair((bin, &sargs), (bin, &cargs), T, true, true);
    assert_eq!(s.status, Some(0), "server: {}", s.all());
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    assert!(c.stdout.contains(result_line), "{}", c.all());
}

#[test]
fn ib_send_bw_rdma_cm() {
    perftest("ib_send_bw", &[], "BW average[MB/sec]");
}

#[test]
fn ib_write_bw_rdma_cm() {
    perftest("ib_write_bw", &[], "BW average[MB/sec]");
}

#[test]
fn ib_read_lat_rdma_cm() {
    perftest("ib_read_lat", &[], "t_avg[usec]");
}

#[test]
fn ib_send_bw_rdma_cm_ud() {
    perftest("ib_send_bw", &["-c", "UD"], "BW average[MB/sec]");
}

#[test]
fn ucmatose() {
    if !ready(&["ucmatose"]) {
        return;
    }
    let (s, c) = pair(
        ("ucmatose", &["-b", SERVER, "-c", "4"]),
        ("ucmatose", &["-s", SERVER, "-c", "4", "-C", "10"]),
        T,
        true,
        true,
    );
    assert_eq!(s.status, Some(0), "server: {}", s.all());
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    assert!(c.stdout.contains("data transfers complete"), "{}", c.all());
    assert!(s.stdout.contains("disconnected"), "{}", s.all());
}

#[test]
fn ucmatose_without_listener_is_rejected_with_reason_8() {
    if !ready(&["ucmatose"]) {
        return;
    }
    // The server's device listens on 7471; the client asks for 7472: its REQ gets a REJ
    // "invalid service ID" (8), as from the kernel's cm_match_req.
    let (_s, c) = pair(
        ("ucmatose", &["-b", SERVER, "-p", "7471"]),
        ("ucmatose", &["-s", SERVER, "-p", "7472"]),
        T,
        false,
        false,
    );
    assert!(
        c.stdout.contains("event: RDMA_CM_EVENT_REJECTED, error: 8"),
        "{}",
        c.all()
    );
    assert_eq!(c.status, Some(8), "{}", c.all());
}

#[test]
fn udaddy() {
    if !ready(&["udaddy"]) {
        return;
    }
    let (s, c) = pair(
        ("udaddy", &["-b", SERVER]),
        ("udaddy", &["-s", SERVER]),
        T,
        true,
        true,
    );
    assert_eq!(s.status, Some(0), "server: {}", s.all());
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    assert!(c.stdout.contains("data transfers complete"), "{}", c.all());
    assert!(s.stdout.contains("data transfers complete"), "{}", s.all());
}

/// An rdma_cma example pair (`rdma_server`/`rdma_client` and the like): both exit 0
/// and print "<program>: end 0".
fn example_pair((server, sargs): (&str, &[&str]), (client, cargs): (&str, &[&str])) {
    if !ready(&[server, client]) {
        return;
    }
    let (s, c) = pair((server, sargs), (client, cargs), T, true, true);
    assert_eq!(s.status, Some(0), "server: {}", s.all());
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    assert!(
        c.stdout.contains(&format!("{client}: end 0")),
        "{}",
        c.all()
    );
    assert!(
        s.stdout.contains(&format!("{server}: end 0")),
        "{}",
        s.all()
    );
}

#[test]
fn rdma_server_and_client() {
    example_pair(
        ("rdma_server", &["-s", SERVER]),
        ("rdma_client", &["-s", SERVER]),
    );
}

/// rdma_xclient asks for one SGE and no inline data, then posts its 16-byte message
/// inline: rxe grants a WQE's inline room as its SGE list's size, and so does softhca.
#[test]
fn rdma_xserver_and_xclient() {
    example_pair(
        ("rdma_xserver", &["-p", "7472"]),
        ("rdma_xclient", &["-s", SERVER, "-p", "7472"]),
    );
}

#[test]
fn qperf_cm1_rc_bw_rc_lat() {
    if !ready(&["qperf"]) {
        return;
    }
    // qperf's server is a daemon: killed once the client is done. A listen port of our
    // own, not the default 19765 another qperf on the host may hold.
    let (_s, c) = pair(
        ("qperf", &["-lp", "19862"]),
        (
            "qperf",
            &["-lp", "19862", "-cm1", SERVER, "rc_bw", "rc_lat"],
        ),
        T,
        false,
        true,
    );
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    assert!(
        c.stdout.contains("rc_bw:") && c.stdout.contains("bw  ="),
        "{}",
        c.all()
    );
    assert!(
        c.stdout.contains("rc_lat:") && c.stdout.contains("latency  ="),
        "{}",
        c.all()
    );
}

#[test]
fn qperf_cm1_rc_rdma_write_bw_rc_rdma_read_bw() {
    if !ready(&["qperf"]) {
        return;
    }
    // RDMA WRITE with immediate and RDMA READ over rdma_cm connections, one after the
    // other from one client process: the READ test asks for responder resources and
    // initiator depth through the REQ and REP. With 4 KiB messages each WRITE is one
    // packet, which the server, reposting its receives as it polls, meets with RNR NAKs
    // now and then; 64 KiB ones (qperf's default) meet them on their Last packet.
    for size in ["4096", "65536"] {
        let (_s, c) = pair(
            ("qperf", &["-lp", "19863"]),
            (
                "qperf",
                &[
                    "-lp",
                    "19863",
                    "-cm1",
                    "-t",
                    "1",
                    "-m",
                    size,
                    SERVER,
                    "rc_rdma_write_bw",
                    "rc_rdma_read_bw",
                ],
            ),
            T,
            false,
            true,
        );
        assert_eq!(c.status, Some(0), "client: {}", c.all());
        for t in ["rc_rdma_write_bw:", "rc_rdma_read_bw:"] {
            let after = c.stdout.split(t).nth(1).unwrap_or_default();
            assert!(after.trim_start().starts_with("bw  ="), "{t} {}", c.all());
        }
    }
}

#[test]
fn qperf_cm1_verified_atomics_and_write_poll_latency() {
    if !ready(&["qperf"]) {
        return;
    }
    // `ver_rc_*` check every returned value (qperf exits non-zero at the first one that
    // is not what the sequence of compare-and-swaps or fetch-and-adds must give);
    // `rc_rdma_write_poll_lat` waits for each WRITE by spinning on memory, calling
    // nothing: the device's datapath thread has to place it.
    let tests = [
        "ver_rc_compare_swap",
        "ver_rc_fetch_add",
        "rc_rdma_write_poll_lat",
    ];
    let mut args = vec!["-lp", "19864", "-cm1", "-t", "1", SERVER];
    args.extend(tests);
    let (_s, c) = pair(
        ("qperf", &["-lp", "19864"]),
        ("qperf", &args),
        T,
        false,
        true,
    );
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    for (t, figure) in tests
        .iter()
        .zip(["msg_rate  =", "msg_rate  =", "latency  ="])
    {
        let after = c.stdout.split(&format!("{t}:")).nth(1).unwrap_or_default();
        assert!(after.trim_start().starts_with(figure), "{t} {}", c.all());
    }
}

#[test]
fn cmtime() {
    if !ready(&["cmtime"]) {
        return;
    }
    // 100 connections set up and torn down; the server is a daemon.
    let (_s, c) = pair(
        ("cmtime", &["-b", SERVER]),
        ("cmtime", &["-s", SERVER]),
        T,
        false,
        true,
    );
    assert_eq!(c.status, Some(0), "client: {}", c.all());
    assert!(
        c.stdout.contains("destroying id") && c.stdout.contains("connect      :"),
        "{}",
        c.all()
    );
}

#[test]
fn connect_to_a_stopped_server_is_unreachable_after_the_req_retries() {
    if !ready(&["ucmatose"]) {
        return;
    }
    // A server that stops answering (SIGSTOP: its device gets the REQs and never
    // replies, a hung host) on addresses of its own, so that the other tests' pairs run
    // meanwhile. The client's REQ goes 16 times, 6.144 s apart (2 × 2^(18-8) ms packet
    // lifetime + 2^(20-8) ms CM response timeout, as the kernel's cm.c times it), then
    // UNREACHABLE with -110 (ETIMEDOUT), which ucmatose exits with (146).
    let (server, client) = ("127.0.20.22", "127.0.20.23");
    let mut s = cmd(server, "ucmatose", &["-b", server, "-p", "7475"])
        .spawn()
        .expect("spawn server");
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on the child we spawned.
    unsafe { libc::kill(s.id() as i32, libc::SIGSTOP) };
    let start = std::time::Instant::now();
    let c = finish(
        cmd(client, "ucmatose", &["-s", server, "-p", "7475"])
            .spawn()
            .expect("spawn client"),
        Duration::from_secs(150),
    );
    let took = start.elapsed().as_secs_f64();
    let _ = s.kill();
    let _ = s.wait();
    assert!(
        c.stdout.contains("RDMA_CM_EVENT_UNREACHABLE, error: -110"),
        "{}",
        c.all()
    );
    assert_eq!(c.status, Some(146), "{}", c.all());
    assert!(
        (97.0..125.0).contains(&took),
        "UNREACHABLE after {took:.1} s"
    );
}
