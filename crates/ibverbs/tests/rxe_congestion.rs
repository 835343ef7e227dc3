//! Congestion control with the Linux kernel's Soft-RoCE (rdma_rxe) as the peer: the
//! sender alone decides its rate, so a shaped link between softhca and kernel rxe is
//! filled without overflowing, in both roles softhca can send data in.
//!
//! - WRITE: unmodified `ib_write_bw` on softhca writes to kernel rxe over a link shaped
//!   with tbf at 100 Mb/s on softhca's side (softhca's requester window and pacer).
//! - READ: unmodified `ib_read_bw` on softhca reads from kernel rxe, the guest's side of
//!   the link shaped the same way: rxe sends the responses, and softhca's requester
//!   window, which counts every READ's response PSNs, bounds what rxe has in flight.
//!
//! The shaper's own counters say whether the link was overflowed: it may have dropped
//! at most 1 % of the packets it saw (with `SOFTHCA_CC=0` it dropped about 5 % of a
//! WRITE's and 20 % of a READ's here). Rates are not asserted: the VM runs under
//! emulation.
//!
//! ```text
//! SOFTHCA_RXE_VM=1 cargo test --release -p softhca-ibverbs --test rxe_congestion -- --nocapture
//! ```

mod common;
#[path = "../../softhca/tests/rxe_vm/mod.rs"]
mod rxe_vm;

/// The shape of the issue's table (tbf at 100 Mb/s, 256 KiB burst, 5 ms of queue).
const TBF: &str = "tbf rate 100mbit burst 256kb latency 5ms";
/// 64 KiB messages: 64 MiB a direction, about 6 s at the link's rate.
const ITERS: u32 = 1000;

/// `tc -s qdisc` of the link's device in `role`, prefixed so both sides can be told apart.
fn shaper_counters(dev: &str, role: &str) -> String {
    format!("tc -s qdisc show dev {dev} | sed 's/^/{role}-qdisc: /'")
}

/// (packets sent, packets dropped) from the first `tc -s qdisc` line of `role`.
fn shaper(text: &str, role: &str) -> Option<(u64, u64)> {
    let prefix = format!("{role}-qdisc:  Sent ");
    let line = text.lines().find_map(|l| l.strip_prefix(&prefix))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    // "<bytes> bytes <pkts> pkt (dropped <n>, overlimits ..."
    let sent = words.get(2)?.parse().ok()?;
    let dropped = words.get(5)?.trim_end_matches(',').parse().ok()?;
    Some((sent, dropped))
}

#[test]
fn a_shaped_link_to_kernel_rxe_is_not_overflowed() {
    let Some(h) = rxe_vm::harness() else { return };
    for bin in ["ib_write_bw", "ib_read_bw", "tc"] {
        if !common::have(bin) {
            return;
        }
    }
    let lib = common::lib_dir().display().to_string();
    let perf = |prog: &str| format!("{prog} -x 1 -d rxe0 -s 65536 -n {ITERS} --report_gbits");
    // The guest shapes its side only after its WRITE server ended, before its READ
    // server listens: the host's READ client connects only once that one does.
    let guest = format!(
        "IF=$(ls /sys/class/net | grep -v '^lo$' | head -1); {}; echo guest-w=$?; \
         tc qdisc add dev $IF root {TBF}; {}; echo guest-r=$?; {}",
        perf("ib_write_bw"),
        perf("ib_read_bw"),
        shaper_counters("$IF", "guest")
    );
    let client = |prog: &str| {
        format!(
            "for i in $(seq 150); do sleep 1; {prog} -x 0 -s 65536 -n {ITERS} --report_gbits \
             10.99.0.2 && break; done"
        )
    };
    let host = format!(
        "export LD_LIBRARY_PATH={lib} SOFTHCA_STATS=1; tc qdisc add dev tap0 root {TBF}; \
         {}; echo host-w=$?; {}; tc qdisc del dev tap0 root; {}; echo host-r=$?",
        client("ib_write_bw"),
        shaper_counters("tap0", "host"),
        client("ib_read_bw"),
    );
    let (_, text) = rxe_vm::run(&h, &guest, &host);
    println!("{text}");
    for line in ["host-w=0", "host-r=0", "guest-w=0", "guest-r=0"] {
        assert!(text.contains(line), "missing {line}:\n{text}");
    }
    // WRITE: softhca's packets through the host's shaper; READ: rxe's responses through
    // the guest's.
    for role in ["host", "guest"] {
        let (sent, dropped) =
            shaper(&text, role).unwrap_or_else(|| panic!("no {role} qdisc counters:\n{text}"));
        println!("{role} shaper: {sent} packets sent, {dropped} dropped");
        // 64 MiB at a 1024-byte MTU is 64,000 data packets.
        assert!(
            sent > 60_000,
            "{role}: only {sent} packets crossed:\n{text}"
        );
        assert!(
            dropped * 100 <= sent + dropped,
            "{role}: the shaper dropped {dropped} of {} packets:\n{text}",
            sent + dropped
        );
    }
}

#[test]
fn shaper_lines_parse() {
    let text = "host-qdisc: qdisc tbf 8001: root refcnt 2 rate 100Mbit burst 256Kb lat 5ms \n\
                host-qdisc:  Sent 86294119 bytes 79764 pkt (dropped 12, overlimits 66879 requeues 0) \n";
    assert_eq!(shaper(text, "host"), Some((79764, 12)));
    assert_eq!(shaper(text, "guest"), None);
}
