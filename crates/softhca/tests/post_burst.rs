//! An application that posts one WR per call, a burst of them between two polls, with
//! messages that do not fill whole packets (UCX's eager fragments: 8 KiB plus a header,
//! two full packets and a short one at MTU 4096): the burst leaves in one `sendmmsg`
//! batch at its end, not one system call per post, and every byte arrives.

mod common;

use common::*;
use softhca::*;

#[test]
fn a_burst_of_posts_leaves_in_few_send_batches() {
    const LEN: usize = 8192 + 40;
    const SLOT: usize = 16384;
    const BURST: u64 = 8;
    const ROUNDS: u64 = 10;
    // Packets of 4 KiB: each fragment the three packets above.
    let a = side(open_4k("127.0.1.79"), QpType::Rc, SLOT * BURST as usize);
    let b = side(open_4k("127.0.1.80"), QpType::Rc, SLOT * BURST as usize);
    connect(&a, &b);
    let batches = || counter(&a.ctx, "io_tx_batches");
    let transmits = || counter(&a.ctx, "io_tx_transmits");
    let (batches0, transmits0) = (batches(), transmits());
    for round in 0..ROUNDS {
        send_burst(&a, &b, &[LEN; BURST as usize], SLOT, round * BURST);
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
