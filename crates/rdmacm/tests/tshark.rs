//! Wire check of softhca's CM messages: tshark's InfiniBand CM dissector (RoCEv2 on UDP
//! 4791, which Wireshark decodes as RRoCE by itself) must decode every MAD that
//! unmodified rdma_cm programs make softhca send on loopback, REQ, REP, RTU, DREQ, DREP
//! (rping), REJ (ucmatose to a port with no listener), SIDR_REQ and SIDR_REP (udaddy),
//! with no malformed packet and no error-level expert entry. Needs tshark and the right to
//! capture on `lo` (root); skipped with a message otherwise.

mod common;

use std::time::Duration;

use common::{cmd, have, lib_dir, pair_of};
use softhca_testbed::capture::{fields, problems, Capture};
use softhca_wire::{bundle_packets, OP_BUNDLE};

/// This test's device pair: the capture keeps only their packets.
const SERVER: &str = "127.0.20.2";
const CLIENT: &str = "127.0.20.3";
const T: Duration = Duration::from_secs(60);

/// Server and client of one program, each on its own address.
fn run(bin: &str, server: &[&str], client: &[&str], retry: bool) -> (common::Done, common::Done) {
    pair_of(
        || cmd(SERVER, bin, server),
        || cmd(CLIENT, bin, client),
        T,
        retry,
        retry,
    )
}

fn both_ok(s: &common::Done, c: &common::Done) {
    assert_eq!(
        (s.status, c.status),
        (Some(0), Some(0)),
        "{}{}",
        s.all(),
        c.all()
    );
}

#[test]
fn cm_messages_decode_cleanly_in_tshark() {
    if lib_dir().is_none() || !["rping", "ucmatose", "udaddy"].iter().all(|b| have(b)) {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("softhca-rdmacm-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("capture dir");
    let filter = format!("udp port 4791 and host {SERVER} and host {CLIENT}");
    let cap = match Capture::start("lo", &filter, &dir.join("cm.pcapng")) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIP: {why}");
            return;
        }
    };
    let a = SERVER;
    let (s, c) = run(
        "rping",
        &["-s", "-a", a, "-v", "-C", "3"],
        &["-c", "-a", a, "-v", "-C", "3"],
        true,
    );
    both_ok(&s, &c);
    let (_, c) = run(
        "ucmatose",
        &["-b", a, "-p", "7471"],
        &["-s", a, "-p", "7472"],
        false,
    );
    assert!(
        c.stdout.contains("RDMA_CM_EVENT_REJECTED, error: 8"),
        "{}",
        c.all()
    );
    let (s, c) = run("udaddy", &["-b", a], &["-s", a], true);
    both_ok(&s, &c);
    let file = cap.stop();

    // Class 0x07 (CM), attribute IDs of IBTA table 99 (12.6).
    let seen: std::collections::BTreeSet<String> = fields(
        &file,
        None,
        "infiniband.mad.mgmtclass == 0x07",
        &["infiniband.mad.attributeid"],
    )
    .into_iter()
    .collect();
    for (name, id) in [
        ("REQ", "0x0010"),
        ("REJ", "0x0012"),
        ("REP", "0x0013"),
        ("RTU", "0x0014"),
        ("DREQ", "0x0015"),
        ("DREP", "0x0016"),
        ("SIDR_REQ", "0x0017"),
        ("SIDR_REP", "0x0018"),
    ] {
        assert!(
            seen.contains(id),
            "no {name} ({id}) decoded as CM; seen {seen:?} (capture kept at {})",
            file.display()
        );
    }
    let bad = problems(&file, None);
    assert!(
        bad.is_empty(),
        "tshark found problems (capture kept at {}):\n{bad}",
        file.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ucmatose -t 32` (RDMA_OPTION_ID_TOS): every packet of its connections, their SENDs
/// and ACKs and their CM MADs, both ways, carries TOS 0x20 in its IPv4 header, as the
/// kernel's rdma_cm puts the id's TOS in the path's traffic class, its CM sends on an
/// address handle made from the path and rxe writes the AV's traffic class into the IP
/// header; the passive side takes it from the REQ's primary path.
#[test]
fn ucmatose_tos_is_in_the_ip_header_of_its_packets() {
    if lib_dir().is_none() || !have("ucmatose") {
        return;
    }
    let (server, client) = ("127.0.0.200", "127.0.0.201");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("softhca-rdmacm-tos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("capture dir");
    let filter = format!("udp port 4791 and host {server} and host {client}");
    let cap = match Capture::start("lo", &filter, &dir.join("tos.pcapng")) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIP: {why}");
            return;
        }
    };
    let (s, c) = pair_of(
        || cmd(server, "ucmatose", &["-b", server, "-p", "7476", "-c", "2"]),
        || {
            cmd(
                client,
                "ucmatose",
                &[
                    "-s", server, "-p", "7476", "-c", "2", "-C", "10", "-t", "32",
                ],
            )
        },
        T,
        true,
        true,
    );
    let file = cap.stop();
    both_ok(&s, &c);
    assert!(c.stdout.contains("data transfers complete"), "{}", c.all());
    // Everything but QP1's MADs: SENDs, their ACKs, both directions, each packet of a
    // bundle (two softhca peers may carry an ACK beside a SEND in one datagram) by itself.
    let rc: Vec<String> = fields(
        &file,
        None,
        "infiniband.bth.destqp != 1",
        &[
            "ip.src",
            "ip.dsfield",
            "infiniband.bth.opcode",
            "udp.payload",
        ],
    )
    .iter()
    .flat_map(|l| unbundle(l))
    .collect();
    // Opcodes 4 (SEND Only) and 17 (ACKNOWLEDGE), IBTA table 38.
    let has = |ip: &str, op: &str| rc.iter().any(|l| *l == format!("{ip}\t0x20\t{op}"));
    for ip in [server, client] {
        assert!(
            has(ip, "4") && has(ip, "17"),
            "no SEND and ACK from {ip} (capture kept at {}):\n{rc:?}",
            file.display()
        );
    }
    let wrong: Vec<&String> = rc.iter().filter(|l| !l.contains("\t0x20\t")).collect();
    assert!(
        wrong.is_empty(),
        "packets without TOS 0x20 (capture kept at {}):\n{wrong:?}",
        file.display()
    );
    // The connections' CM MADs too: REQ, REP, RTU, DREQ, DREP.
    let cm = fields(
        &file,
        None,
        "infiniband.mad.mgmtclass == 0x07",
        &["ip.dsfield", "infiniband.mad.attributeid"],
    );
    for id in ["0x0010", "0x0013", "0x0014", "0x0015", "0x0016"] {
        assert!(
            cm.iter().any(|l| *l == format!("0x20\t{id}")),
            "no CM attribute {id} with TOS 0x20 (capture kept at {}):\n{cm:?}",
            file.display()
        );
    }
    assert!(
        cm.iter().all(|l| l.starts_with("0x20\t")),
        "CM MADs without TOS 0x20 (capture kept at {}):\n{cm:?}",
        file.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A row `ip.src, ip.dsfield, opcode, udp.payload` as `ip.src\tip.dsfield\topcode` rows,
/// one per packet: a bundle's datagram gives its packets' opcodes (each BTH's first byte).
fn unbundle(row: &str) -> Vec<String> {
    let f: Vec<&str> = row.split('\t').collect();
    let (ip, ds, op, payload) = (f[0], f[1], f[2], f.get(3).copied().unwrap_or(""));
    if op != OP_BUNDLE.to_string() {
        return vec![format!("{ip}\t{ds}\t{op}")];
    }
    let bytes: Vec<u8> = (0..payload.len() / 2)
        .filter_map(|i| u8::from_str_radix(&payload[2 * i..2 * i + 2], 16).ok())
        .collect();
    let mut packets = bundle_packets(&bytes);
    let rows: Vec<String> = packets
        .by_ref()
        .map(|p| format!("{ip}\t{ds}\t{}", p[0]))
        .collect();
    assert!(
        !packets.malformed() && !rows.is_empty(),
        "a malformed bundle: {payload}"
    );
    rows
}
