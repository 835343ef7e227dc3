//! Applications that wait for an RDMA WRITE by spinning on memory, as perftest's
//! `ib_write_lat` does: each side polls only its send CQ, right after posting, and
//! then watches the last byte of its buffer, calling nothing. The peer's WRITE must
//! still be placed: after a few round trips in which it waited for the end of the
//! application's polling window, the datapath thread serves the sockets itself (see
//! `datapath/takeover.rs`; `dp_app_served` counts the periods). And one that polled
//! steadily, then stops polling without saying so, is still served.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use softhca::*;

const ROUNDS: u8 = 200;
const LEN: usize = 8;

/// Spins on the last byte of `me`'s buffer until the peer's WRITE of `want` lands.
fn await_byte(me: &Side, want: u8, round: u32) {
    let t = Instant::now();
    loop {
        let mut b = [0u8; 1];
        me.mr.read(LEN - 1, &mut b).unwrap();
        if b[0] == want {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "round {round}: the peer's WRITE of {want} never landed (byte is {})",
            b[0]
        );
        std::hint::spin_loop();
    }
}

/// One side of a WRITE ping-pong of `rounds` round trips: wait on memory for the peer's
/// byte, then WRITE the next one into the last byte of the peer's buffer (`peer`: its
/// address and rkey); `after_post` is what the application does right after each post.
fn spin_ping_pong(
    me: &Side,
    peer: (u64, u32),
    first: bool,
    rounds: u32,
    mut after_post: impl FnMut(u32),
) {
    for i in 0..rounds {
        let want = (if first { i } else { i + 1 }) as u8;
        if !(first && i == 0) {
            await_byte(me, want, i);
        }
        let tag = if first { want.wrapping_add(1) } else { want };
        me.mr.write(4096 + LEN - 1, &[tag]).unwrap();
        let mut wr = send_wr(
            u64::from(i),
            WrOpcode::RdmaWrite,
            me.mr.sge(4096, LEN as u32),
        );
        (wr.remote_addr, wr.rkey) = peer;
        me.qp.post_send(wr).unwrap();
        after_post(i);
    }
}

/// perftest's `ib_write_lat` side: after each post, polls its CQ until the WRITE
/// completes.
fn ping_pong(me: &Side, peer_addr: u64, peer_rkey: u32, first: bool) {
    let mut wc = [Completion::default(); 1];
    spin_ping_pong(me, (peer_addr, peer_rkey), first, u32::from(ROUNDS), |i| {
        let t = Instant::now();
        while me.cq.poll(&mut wc) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "round {i}: no completion"
            );
        }
        assert_eq!(wc[0].status, WcStatus::Success, "round {i}");
    });
}

/// Runs [`ping_pong`] between `a` and `b` on two threads and checks what it must leave:
/// both buffers hold the last byte written to them, few round trips waited for a
/// window, and, on a side that was served, `held` (a counter) moved.
fn served_ping_pong(a: &Side, b: &Side, held: &str) {
    let (a_addr, a_rkey) = (a.mr.addr(), a.mr.rkey());
    let (b_addr, b_rkey) = (b.mr.addr(), b.mr.rkey());
    // A side done with its rounds polls on until the other is done too and the peer's
    // last WRITE has landed, as an application does while it waits for its peer: that
    // WRITE then does not strand it (a period started by that stranding has nothing to
    // serve), and a UC one is in place before the check below.
    let done = AtomicUsize::new(0);
    let run = |me: &Side, peer: (u64, u32), first: bool| {
        ping_pong(me, peer.0, peer.1, first);
        done.fetch_add(1, Ordering::SeqCst);
        let mut wc = [Completion::default(); 1];
        let t = Instant::now();
        let last = || {
            let mut b = [0u8; 1];
            me.mr.read(LEN - 1, &mut b).unwrap();
            b[0]
        };
        while done.load(Ordering::SeqCst) < 2 || last() != ROUNDS {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the peer's last WRITE never landed"
            );
            assert_eq!(
                me.cq.poll(&mut wc),
                0,
                "a completion nothing was posted for"
            );
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| run(a, (b_addr, b_rkey), true));
        s.spawn(|| run(b, (a_addr, a_rkey), false));
    });
    let mut got = [0u8; 1];
    b.mr.read(LEN - 1, &mut got).unwrap();
    assert_eq!(got[0], ROUNDS);
    a.mr.read(LEN - 1, &mut got).unwrap();
    assert_eq!(got[0], ROUNDS);
    for (name, side) in [("a", a), ("b", b)] {
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
        let held_count = counter(&side.ctx, held);
        assert!(
            served == 0 || held_count > 0,
            "{name}: served {served} periods, {held} is 0"
        );
    }
}

#[test]
fn write_ping_pong_spinning_on_memory_gets_served() {
    let (a, b) = rc_pair("127.0.1.81", "127.0.1.82", 1 << 16);
    // Served, the ACK of a placed WRITE waits for the answer (every round trip's answer
    // is a WRITE), and still leaves when none comes (the last round's).
    served_ping_pong(&a, &b, "dp_tx_serve_held");
}

/// `ib_write_lat -c UC`: the same ping-pong on UC, where a WRITE completes when it is
/// sent and no ACK comes with the answer. Every WRITE lands and completes; served, the
/// completions of the application's WRITEs wait for the peer's answer (or the hold's
/// end), so that its own poll places the answer.
#[test]
fn uc_write_ping_pong_spinning_on_memory() {
    let a = side(open("127.0.1.89"), QpType::Uc, 1 << 16);
    let b = side(open("127.0.1.90"), QpType::Uc, 1 << 16);
    connect(&a, &b);
    served_ping_pong(&a, &b, "dp_tx_sends_held");
    // Nothing is left held: every WRITE completed exactly once (`ping_pong` took one
    // completion per post).
    let mut wc = [Completion::default(); 4];
    assert_eq!(a.cq.poll(&mut wc), 0);
    assert_eq!(b.cq.poll(&mut wc), 0);
}

/// qperf's `rc_rdma_write_poll_lat`: each side polls its CQ once right after posting
/// (taking whatever is there), then spins on memory for the peer's WRITE, calling
/// nothing. Every WRITE lands and completes. Served, the ACK of a placed WRITE waits for
/// the application's answer and leaves with it (about one datagram per round trip on a
/// quiet machine, against two when the datapath thread sent each ACK alone; not
/// asserted: a descheduled application answers after the hold, and its ACK goes alone).
#[test]
fn write_ping_pong_polling_once_per_post() {
    const ROUNDS: u32 = 400;
    let (a, b) = rc_pair("127.0.1.83", "127.0.1.84", 1 << 16);
    let (a_addr, a_rkey) = (a.mr.addr(), a.mr.rkey());
    let (b_addr, b_rkey) = (b.mr.addr(), b.mr.rkey());
    let run = |me: &Side, peer: (u64, u32), first: bool| {
        let mut wc = [Completion::default(); 16];
        let mut done = 0u32;
        let mut reap = |done: &mut u32| {
            let n = me.cq.poll(&mut wc);
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success);
            }
            *done += n as u32;
        };
        spin_ping_pong(me, peer, first, ROUNDS, |_| reap(&mut done));
        let t = Instant::now();
        while done < ROUNDS {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{done} of {ROUNDS} completions"
            );
            reap(&mut done);
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| run(&a, (b_addr, b_rkey), true));
        s.spawn(|| run(&b, (a_addr, a_rkey), false));
    });
    let mut got = [0u8; 1];
    b.mr.read(LEN - 1, &mut got).unwrap();
    assert_eq!(got[0], ROUNDS as u8);
    a.mr.read(LEN - 1, &mut got).unwrap();
    assert_eq!(got[0], ROUNDS as u8);
    for (name, side) in [("a", &a), ("b", &b)] {
        let served = counter(&side.ctx, "dp_app_served");
        let held = counter(&side.ctx, "dp_tx_serve_held");
        assert!(
            served == 0 || held > 0,
            "{name}: served {served} periods, no ACK held for an answer"
        );
    }
}

/// An application that polls its CQ steadily (so the datapath thread checks on it less
/// and less often, see `APP_WINDOW_STRETCH_MAX_NS`), then stops polling without saying
/// so: a READ its peer sends after that is still answered, by the datapath thread, within
/// a couple of milliseconds, not when the application polls again.
#[test]
fn a_steady_poller_that_stops_polling_still_answers_reads() {
    const LEN: usize = 4096;
    let (a, b) = rc_pair("127.0.1.87", "127.0.1.88", 1 << 16);
    let data = pattern(LEN, 7);
    a.mr.write(0, &data).unwrap();
    let stopped = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut wc = [Completion::default(); 1];
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(100) {
                assert_eq!(a.cq.poll(&mut wc), 0);
            }
            stopped.wait();
            // Busy elsewhere: no poll, no blocking wait.
            std::thread::sleep(Duration::from_millis(500));
        });
        // Right as it stops: its window and the datapath thread's stretch are still on.
        stopped.wait();
        let mut wr = send_wr(1, WrOpcode::RdmaRead, b.mr.sge(0, LEN as u32));
        wr.remote_addr = a.mr.addr();
        wr.rkey = a.mr.rkey();
        let t = Instant::now();
        b.qp.post_send(wr).unwrap();
        let c = one(&b.cq);
        let took = t.elapsed();
        assert_eq!(c.status, WcStatus::Success);
        let mut got = vec![0u8; LEN];
        b.mr.read(0, &mut got).unwrap();
        assert!(got == data, "the READ's bytes");
        // 0.2 ms of window and at most 1.6 ms of stretch (0.5-1.9 ms here); generous for
        // a loaded machine, far below the 500 ms until the application would poll again.
        assert!(
            took < Duration::from_millis(100),
            "READ answered after {took:?}"
        );
    });
}
