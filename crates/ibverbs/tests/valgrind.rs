//! One pingpong and one perftest with the server under valgrind's memcheck: no invalid
//! read or write, no use of uninitialised memory and no definite leak with our library
//! on the stack. (perftest itself writes uninitialised stack bytes in its TCP exchange
//! and leaks a few small strings and the device list; those are the program's, not ours.)

mod common;

use common::{have, pair_with};
use std::time::Duration;

/// Runs `bin` as a server under memcheck against a plain client; returns the log.
fn memcheck(bin: &str, args: &[&str]) -> String {
    let log = std::env::temp_dir().join(format!("softhca-vg-{bin}-{}.log", std::process::id()));
    let log_arg = format!("--log-file={}", log.display());
    let wrapper = [
        "valgrind",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        // Our library is Rust with debug info: frames name its functions and file.
        "--num-callers=30",
        &log_arg,
    ];
    let (s, c) = pair_with(&wrapper, bin, args, Duration::from_secs(300));
    assert_eq!(c.status, Some(0), "client:\n{}", c.all());
    assert_eq!(s.status, Some(0), "server under valgrind:\n{}", s.all());
    let text = std::fs::read_to_string(&log).expect("valgrind log");
    let _ = std::fs::remove_file(&log);
    text
}

/// The error records of a memcheck log (blocks separated by a bare `==pid==` line)
/// whose stack passes through our library.
fn ours(log: &str) -> Vec<String> {
    let mut records = Vec::new();
    let mut cur = String::new();
    for line in log.lines() {
        let body = line.split_once("== ").map(|(_, b)| b).unwrap_or("");
        if body.trim().is_empty() {
            if !cur.is_empty() {
                records.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push_str(body);
            cur.push('\n');
        }
    }
    records.push(cur);
    records
        .into_iter()
        .filter(|r| {
            let is_error = r.contains("Invalid ")
                || r.contains("uninitialised")
                || r.contains("definitely lost in")
                || r.contains("Mismatched free")
                || r.contains("Source and destination overlap");
            let in_lib = r.contains("libibverbs.so") || r.contains("softhca") || r.contains(".rs:");
            // The device list belongs to the caller until ibv_free_device_list;
            // perftest never frees it (with rdma-core's library too).
            let callers_list =
                r.contains("definitely lost in") && r.contains("ibv_get_device_list");
            is_error && in_lib && !callers_list
        })
        .collect()
}

fn check(bin: &str, args: &[&str]) {
    if !have("valgrind") || !have(bin) {
        return;
    }
    let log = memcheck(bin, args);
    assert!(log.contains("ERROR SUMMARY"), "valgrind ran:\n{log}");
    let bad = ours(&log);
    assert!(
        bad.is_empty(),
        "memcheck errors in our library:\n{}",
        bad.join("\n")
    );
    assert!(
        !log.contains("Invalid read") && !log.contains("Invalid write"),
        "invalid accesses:\n{log}"
    );
}

#[test]
fn rc_pingpong_server_under_memcheck() {
    check("ibv_rc_pingpong", &["-g", "0", "-n", "100", "-s", "8192"]);
}

#[test]
fn write_bw_server_under_memcheck() {
    check("ib_write_bw", &["-x", "0", "-n", "200"]);
}
