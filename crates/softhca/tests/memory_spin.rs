//! Applications that wait for an RDMA WRITE by spinning on memory, as perftest's
//! `ib_write_lat` does: each side polls only its send CQ, right after posting, and
//! then watches the last byte of its buffer, calling nothing. The peer's WRITE must
//! still be placed: after a few round trips in which it waited for the end of the
//! application's polling window, the datapath thread serves the sockets itself (see
//! `datapath/takeover.rs`; `dp_app_served` counts the periods).

mod common;

use std::time::{Duration, Instant};

use common::*;
use softhca::*;

const ROUNDS: u8 = 200;
const LEN: usize = 8;

/// One side of the ping-pong: wait for the peer's byte `i`, then WRITE byte `i + 1`.
fn ping_pong(me: &Side, peer_addr: u64, peer_rkey: u32, first: bool) {
    let mut wc = [Completion::default(); 1];
    for i in 0..ROUNDS {
        let want = if first { i } else { i.wrapping_add(1) };
        if !(first && i == 0) {
            let t = Instant::now();
            loop {
                let mut b = [0u8; 1];
                me.mr.read(LEN - 1, &mut b).unwrap();
                if b[0] == want {
                    break;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "round {i}: the peer's WRITE of {want} never landed (byte is {})",
                    b[0]
                );
                std::hint::spin_loop();
            }
        }
        let tag = if first { i.wrapping_add(1) } else { want };
        me.mr.write(4096 + LEN - 1, &[tag]).unwrap();
        let mut wr = send_wr(
            u64::from(i),
            WrOpcode::RdmaWrite,
            me.mr.sge(4096, LEN as u32),
        );
        wr.remote_addr = peer_addr;
        wr.rkey = peer_rkey;
        me.qp.post_send(wr).unwrap();
        let t = Instant::now();
        while me.cq.poll(&mut wc) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "round {i}: no completion"
            );
        }
        assert_eq!(wc[0].status, WcStatus::Success, "round {i}");
    }
}

#[test]
fn write_ping_pong_spinning_on_memory_gets_served() {
    let (a, b) = rc_pair("127.0.1.81", "127.0.1.82", 1 << 16);
    let (a_addr, a_rkey) = (a.mr.addr(), a.mr.rkey());
    let (b_addr, b_rkey) = (b.mr.addr(), b.mr.rkey());
    std::thread::scope(|s| {
        s.spawn(|| ping_pong(&a, b_addr, b_rkey, true));
        s.spawn(|| ping_pong(&b, a_addr, a_rkey, false));
    });
    // Both buffers hold the last byte written to them.
    let mut got = [0u8; 1];
    b.mr.read(LEN - 1, &mut got).unwrap();
    assert_eq!(got[0], ROUNDS);
    a.mr.read(LEN - 1, &mut got).unwrap();
    assert_eq!(got[0], ROUNDS);
    for (name, side) in [("a", &a), ("b", &b)] {
        let (served, stranded) = (
            counter(&side.ctx, "dp_app_served"),
            counter(&side.ctx, "dp_app_strandings"),
        );
        // Unserved, every round trip would wait for a window (one stranding each). Served,
        // a few strandings start each period (periods double, so there are few). On a
        // loaded machine strandings can also be too far apart to start a period (the
        // datapath thread itself waits for a core), so `served` may stay 0 there.
        assert!(
            stranded < u64::from(ROUNDS) / 4,
            "{name}: {stranded} of {ROUNDS} round trips waited for a window ({served} periods)"
        );
        // Served, the ACK of a placed WRITE waits for the answer (every round trip's
        // answer is a WRITE), and still leaves when none comes (the last round's).
        let serve_held = counter(&side.ctx, "dp_tx_serve_held");
        assert!(
            served == 0 || serve_held > 0,
            "{name}: served {served} periods, no ACK held for an answer"
        );
    }
}
