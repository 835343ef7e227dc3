//! An application that posts one WR per call, a burst of them between two polls, with
//! messages that do not fill whole packets (UCX's eager fragments: 8 KiB plus a header,
//! two full packets and a short one at MTU 4096): the burst leaves in one `sendmmsg`
//! batch at its end, not one system call per post, and every byte arrives.

mod common;

use std::time::{Duration, Instant};

use common::*;
use softhca::*;

#[test]
fn a_burst_of_posts_leaves_in_few_send_batches() {
    const LEN: usize = 8192 + 40;
    const SLOT: usize = 16384;
    const BURST: u64 = 8;
    const ROUNDS: u64 = 10;
    let (a, b) = rc_pair("127.0.1.79", "127.0.1.80", SLOT * BURST as usize);
    let batches = || counter(&a.ctx, "io_tx_batches");
    let transmits = || counter(&a.ctx, "io_tx_transmits");
    let (batches0, transmits0) = (batches(), transmits());
    for round in 0..ROUNDS {
        for i in 0..BURST {
            let off = i as usize * SLOT;
            b.qp.post_recv(recv_wr(i, b.mr.sge(off, SLOT as u32)))
                .unwrap();
            a.mr.write(off, &pattern(LEN, (round * BURST + i) as u8))
                .unwrap();
        }
        // The application polls (its polling window opens), then posts its burst.
        let mut wc = [Completion::default(); 16];
        assert_eq!(a.cq.poll(&mut wc), 0);
        for i in 0..BURST {
            let off = i as usize * SLOT;
            a.qp.post_send(send_wr(i, WrOpcode::Send, a.mr.sge(off, LEN as u32)))
                .unwrap();
        }
        let (mut sent, mut received) = (0, 0);
        let t = Instant::now();
        while sent < BURST || received < BURST {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "round {round}: {sent} sends and {received} receives completed"
            );
            let n = a.cq.poll(&mut wc);
            for c in &wc[..n] {
                assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Send));
                sent += 1;
            }
            let n = b.cq.poll(&mut wc);
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success);
                assert_eq!(c.byte_len as usize, LEN);
                let mut got = vec![0u8; LEN];
                b.mr.read(c.wr_id as usize * SLOT, &mut got).unwrap();
                let want = pattern(LEN, (round * BURST + c.wr_id) as u8);
                assert!(got == want, "round {round}, message {}", c.wr_id);
                received += 1;
            }
        }
    }
    // One post per system call would make a batch per transmit. A loaded machine may
    // deschedule the poster mid-burst (its window closes, the datapath thread sends what
    // waited): half leaves room for that.
    let (batches, transmits) = (batches() - batches0, transmits() - transmits0);
    assert!(transmits >= ROUNDS * BURST, "{transmits} transmits");
    assert!(
        2 * batches <= transmits,
        "{batches} send batches for {transmits} transmits"
    );
}
