//! Bandwidth tests: `tx_depth` work requests outstanding per QP, a completion every
//! `cq_mod` (perftest's ib_*_bw).

use std::time::{Duration, Instant};

use softhca::{smallvec, Completion, Payload, SendFlags, SendWr, WcOpcode, WrOpcode};

use crate::error::PerfError;
use crate::exchange::{Control, Ctl, QpInfo, TestParams};
use crate::pattern;
use crate::progress::Progress;
use crate::setup::{check_wc, split_wr_id, wr_id, Idle, Side};
use crate::{Op, Outcome, ServerOutcome, STALL};

/// Most WRs per `post_send` list of small messages ([`SMALL`]): as many as one GSO send
/// carries (64 segments), so that the list leaves in one send and the peer answers it
/// with one ACK. With lists of 32 the 64 B message rate settled at 32 messages per
/// send and per ACK: 2.0 M/s, against 2.6 M/s with 64 (interleaved runs, 2-core VM).
const POST_LIST_SMALL: usize = 64;
/// Most WRs per list of larger messages (64 of them do not fit one GSO send anyway).
const POST_LIST: usize = 32;
/// Messages up to this size are small: 64 of them, with their headers, fit one GSO send
/// (64 KiB).
const SMALL: u64 = 512;

/// Per-QP progress on the requester.
#[derive(Clone, Copy)]
struct Lane {
    posted: u64,
    done: u64,
    credit: u64,
    target: u64,
}

/// The client (requester) side of a bandwidth test.
pub fn client(
    side: &Side,
    op: Op,
    p: &TestParams,
    cq_mod: u32,
    remote: &[QpInfo],
    ctl: &mut Control,
    progress: &mut dyn Progress,
) -> Result<Outcome, PerfError> {
    let size = p.size;
    // Without --verify every WR reuses slot 0 (perftest does the same), so only the send
    // queue bounds the window; with --verify a slot must not be rewritten before its
    // message completed, so the slots bound it too.
    let window = if p.verify {
        u64::from(p.tx_depth.min(p.slots)).max(1)
    } else {
        u64::from(p.tx_depth).max(1)
    };
    // A signaled WR must fall inside every window, or the window never reopens.
    let cq_mod = u64::from(cq_mod).min(window).max(1);
    let nslots = side.nslots;
    let post_list = if size <= SMALL {
        POST_LIST_SMALL
    } else {
        POST_LIST
    };
    let write_verify = op == Op::Write && p.verify;
    let mut lanes = vec![
        Lane {
            posted: 0,
            done: 0,
            credit: 0,
            target: if p.iters > 0 { p.iters } else { u64::MAX }
        };
        side.qps.len()
    ];
    let mut scratch = vec![0u8; size as usize];
    let mut wcs = [Completion::default(); 64];
    let mut idle = Idle::new(STALL);
    let start = Instant::now();
    let stop_at = (p.duration_ms > 0).then(|| start + Duration::from_millis(p.duration_ms));
    let total_target = if p.iters > 0 {
        p.iters * lanes.len() as u64
    } else {
        0
    };
    let mut stopping = false;
    let mut wrs: Vec<SendWr> = Vec::with_capacity(POST_LIST_SMALL);
    loop {
        let now = Instant::now();
        if let Some(t) = stop_at {
            if !stopping && now >= t {
                stopping = true;
                // Stop at the next signaled WR so the last one posted reports completion.
                for l in &mut lanes {
                    l.target = l.posted.div_ceil(cq_mod) * cq_mod;
                }
            }
        }
        let mut all_done = true;
        for (qi, l) in lanes.iter_mut().enumerate() {
            if l.done < l.target {
                all_done = false;
            }
            wrs.clear();
            while l.posted < l.target
                && l.posted - l.done < window
                && (!write_verify || l.posted < l.credit + nslots)
                && wrs.len() < post_list
            {
                let i = l.posted;
                let mut flags = SendFlags::empty();
                if (i + 1) % cq_mod == 0 || i + 1 == l.target {
                    flags |= SendFlags::SIGNALED;
                }
                let local_slot = if p.verify { i % u64::from(p.slots) } else { 0 };
                let mut wr = SendWr {
                    wr_id: wr_id(qi, i),
                    flags,
                    ..SendWr::default()
                };
                match op {
                    Op::Send | Op::Write => {
                        if p.verify {
                            pattern::fill(&mut scratch, qi as u32, i);
                            side.mr
                                .write(side.off(qi, local_slot) as usize, &scratch)
                                .map_err(PerfError::verbs("writing the pattern"))?;
                        }
                        wr.payload = Payload::Sges(smallvec![side.sge(qi, local_slot, size)]);
                        if op == Op::Send {
                            wr.opcode = WrOpcode::Send;
                        } else {
                            let rslot = if p.verify { i % nslots } else { 0 };
                            wr.opcode = if p.verify {
                                WrOpcode::RdmaWriteWithImm
                            } else {
                                WrOpcode::RdmaWrite
                            };
                            wr.imm_data = i as u32;
                            wr.remote_addr = remote[qi].va + side.off(0, rslot);
                            wr.rkey = remote[qi].rkey;
                        }
                    }
                    Op::Read => {
                        let rslot = if p.verify { i % nslots } else { 0 };
                        wr.opcode = WrOpcode::RdmaRead;
                        wr.payload = Payload::Sges(smallvec![side.sge(qi, local_slot, size)]);
                        wr.remote_addr = remote[qi].va + side.off(0, rslot);
                        wr.rkey = remote[qi].rkey;
                    }
                    Op::Atomic => {
                        wr.opcode = WrOpcode::AtomicFetchAndAdd;
                        wr.payload = Payload::Sges(smallvec![side.sge(qi, local_slot, 8)]);
                        wr.remote_addr = remote[qi].va;
                        wr.rkey = remote[qi].rkey;
                        wr.compare_add = 1;
                    }
                }
                wrs.push(wr);
                l.posted += 1;
            }
            if !wrs.is_empty() {
                side.qps[qi]
                    .post_send_batch(wrs.drain(..))
                    .map_err(|(_, e)| PerfError::verbs("post_send")(e))?;
            }
        }
        if all_done {
            break;
        }
        let n = side.scq.poll(&mut wcs);
        for wc in &wcs[..n] {
            check_wc(wc, op.name())?;
            let (qi, last) = split_wr_id(wc.wr_id);
            let l = lanes.get_mut(qi).ok_or_else(|| {
                PerfError::Verify(format!("completion for unknown wr_id {:#x}", wc.wr_id))
            })?;
            if p.verify && matches!(op, Op::Read | Op::Atomic) {
                for i in l.done..=last {
                    let local = side.off(qi, i % u64::from(p.slots)) as usize;
                    if op == Op::Read {
                        side.mr
                            .read(local, &mut scratch)
                            .map_err(PerfError::verbs("reading the buffer"))?;
                        pattern::check(&scratch, qi as u32, i % nslots)
                            .map_err(|m| PerfError::Verify(pattern::describe(qi as u32, i, m)))?;
                    } else {
                        let mut v = [0u8; 8];
                        side.mr
                            .read(local, &mut v)
                            .map_err(PerfError::verbs("reading the buffer"))?;
                        let got = u64::from_ne_bytes(v);
                        if got != i {
                            return Err(PerfError::Verify(format!(
                                "QP {qi} atomic {i}: fetched {got}, expected {i}"
                            )));
                        }
                    }
                }
            }
            l.done = l.done.max(last + 1);
        }
        if n > 0 {
            idle.progress();
            let done: u64 = lanes.iter().map(|l| l.done).sum();
            progress.update(Instant::now(), done, total_target, size);
        } else {
            let starved = write_verify
                && lanes
                    .iter()
                    .any(|l| l.posted < l.target && l.posted >= l.credit + nslots);
            if starved {
                // Flow control: the server has not verified the slots we would overwrite.
                if let Some(c) = ctl.recv(Some(Duration::from_micros(200)))? {
                    apply_credit(&mut lanes, c, ctl)?;
                    idle.progress();
                    while let Some(c) = ctl.recv(Some(Duration::ZERO))? {
                        apply_credit(&mut lanes, c, ctl)?;
                    }
                }
            }
            idle.idle("waiting for send completions")?;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    progress.finish();
    Ok(Outcome {
        counts: lanes.iter().map(|l| l.done).collect(),
        seconds,
        samples: Vec::new(),
    })
}

fn apply_credit(lanes: &mut [Lane], c: Ctl, ctl: &Control) -> Result<(), PerfError> {
    match c {
        Ctl::Credit { qp, count } => {
            if let Some(l) = lanes.get_mut(qp as usize) {
                l.credit = l.credit.max(count);
            }
            Ok(())
        }
        other => Err(PerfError::exchange(
            ctl.peer(),
            format!("unexpected {other:?} during the test"),
        )),
    }
}

/// Receive WQEs the server posts per QP for this test.
pub fn server_rx_depth(op: Op, p: &TestParams, max_wr: u32) -> u32 {
    match op {
        Op::Send if p.verify => p.slots + 1,
        // perftest's 512, or 8 times the sender's window when that is larger: one
        // receive step (32 GRO datagrams of up to 64 small SENDs each) can consume
        // a thousand receives before the application reposts any, and every receive
        // queue underrun costs an RNR NAK, a 0.64 ms wait and a go-back-N resend.
        Op::Send => p.tx_depth.saturating_mul(8).max(512).min(max_wr),
        Op::Write if p.verify => p.slots + 1,
        _ => 1,
    }
}

/// Posts the server's initial receives and fills READ sources (before it is connected).
pub fn server_prepare(side: &Side, op: Op, p: &TestParams, max_wr: u32) -> Result<(), PerfError> {
    let rx = server_rx_depth(op, p, max_wr);
    for qi in 0..side.qps.len() {
        match op {
            Op::Send => {
                for j in 0..u64::from(rx) {
                    side.post_recv(qi, if p.verify { j } else { 0 }, p.size)?;
                }
            }
            Op::Write if p.verify => {
                for j in 0..u64::from(rx) {
                    side.post_recv(qi, j, 0)?;
                }
            }
            Op::Read if p.verify => {
                let mut buf = vec![0u8; p.size as usize];
                for s in 0..side.nslots {
                    pattern::fill(&mut buf, qi as u32, s);
                    side.mr
                        .write(side.off(qi, s) as usize, &buf)
                        .map_err(PerfError::verbs("writing the pattern"))?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The server (responder) side: for SEND and verified WRITE it consumes receives and
/// checks each message; otherwise it only waits for the client's end message.
pub fn server(
    side: &Side,
    op: Op,
    p: &TestParams,
    ctl: &mut Control,
) -> Result<ServerOutcome, PerfError> {
    let active = op == Op::Send || (op == Op::Write && p.verify);
    let end_wait = if p.duration_ms > 0 {
        Duration::from_millis(p.duration_ms) + STALL
    } else {
        STALL * 6
    };
    if !active {
        let counts = wait_end(ctl, side, end_wait)?;
        let mut verdict = Ok(());
        if op == Op::Atomic && p.verify {
            for (qi, &n) in counts.iter().enumerate() {
                let mut v = [0u8; 8];
                side.mr
                    .read(side.off(qi, 0) as usize, &mut v)
                    .map_err(PerfError::verbs("reading the buffer"))?;
                let got = u64::from_ne_bytes(v);
                if got != n {
                    verdict = Err(format!(
                        "QP {qi}: counter is {got} after {n} fetch-and-adds"
                    ));
                }
            }
        }
        return Ok(ServerOutcome { counts, verdict });
    }
    let size = p.size;
    let nq = side.qps.len();
    let mut received = vec![0u64; nq];
    let mut end: Option<Vec<u64>> = None;
    let mut scratch = vec![0u8; size as usize];
    let mut wcs = [Completion::default(); 64];
    let mut idle = Idle::new(end_wait);
    let credit_every = (u64::from(p.slots) / 4).max(1);
    let mut verdict: Result<(), String> = Ok(());
    loop {
        let n = side.rcq.poll(&mut wcs);
        for wc in &wcs[..n] {
            check_wc(wc, "receive")?;
            let (qi, slot) = split_wr_id(wc.wr_id);
            let i = match received.get(qi) {
                Some(&i) => i,
                None => {
                    return Err(PerfError::Verify(format!(
                        "receive for unknown wr_id {:#x}",
                        wc.wr_id
                    )))
                }
            };
            if p.verify && verdict.is_ok() {
                let (off, expect_op) = if op == Op::Send {
                    (side.off(qi, slot), WcOpcode::Recv)
                } else {
                    (side.off(qi, i % side.nslots), WcOpcode::RecvRdmaWithImm)
                };
                if wc.opcode != expect_op || u64::from(wc.byte_len) != size && op == Op::Send {
                    verdict = Err(format!(
                        "QP {qi} message {i}: completion {:?} with {} bytes, expected {:?} with {size}",
                        wc.opcode, wc.byte_len, expect_op
                    ));
                } else if op == Op::Write && wc.imm_data != i as u32 {
                    verdict = Err(format!(
                        "QP {qi} message {i}: immediate {} out of order",
                        wc.imm_data
                    ));
                } else {
                    side.mr
                        .read(off as usize, &mut scratch)
                        .map_err(PerfError::verbs("reading the buffer"))?;
                    if let Err(m) = pattern::check(&scratch, qi as u32, i) {
                        verdict = Err(pattern::describe(qi as u32, i, m));
                    }
                }
            }
            received[qi] = i + 1;
            let repost_len = if op == Op::Send { size } else { 0 };
            side.post_recv(
                qi,
                if p.verify || op != Op::Send { slot } else { 0 },
                repost_len,
            )?;
            if op == Op::Write && (i + 1) % credit_every == 0 {
                ctl.send(&Ctl::Credit {
                    qp: qi as u32,
                    count: i + 1,
                })?;
            }
        }
        if n > 0 {
            idle.progress();
        } else {
            if end.is_none() && idle.should_check() {
                match ctl.recv(Some(Duration::ZERO))? {
                    Some(Ctl::End(c)) => {
                        end = Some(c);
                        idle.progress();
                    }
                    Some(other) => {
                        return Err(PerfError::exchange(
                            ctl.peer(),
                            format!("unexpected {other:?}"),
                        ))
                    }
                    None => {}
                }
            }
            idle.idle("waiting for messages")?;
        }
        if let Some(e) = &end {
            if e.len() == nq && e.iter().zip(&received).all(|(want, got)| got >= want) {
                return Ok(ServerOutcome {
                    counts: received,
                    verdict,
                });
            }
        }
    }
}

/// Waits for the client's end message, giving up only after `stall` with neither that
/// message nor a packet on `side`'s device. Why not a fixed limit: a passive server
/// (WRITE, READ) cannot tell how long a client's fixed count takes (1024 QPs x 5000
/// 64 KiB WRITEs is minutes), and a server that left mid-run failed the client with
/// RETRY_EXC_ERR. perftest's server waits for as long as the client runs.
pub fn wait_end(ctl: &mut Control, side: &Side, stall: Duration) -> Result<Vec<u64>, PerfError> {
    let mut seen = side.traffic();
    let mut deadline = Instant::now() + stall;
    loop {
        let slice = (Instant::now() + Duration::from_secs(1)).min(deadline);
        match ctl.recv_until(slice)? {
            Some(Ctl::End(c)) => return Ok(c),
            Some(other) => {
                return Err(PerfError::exchange(
                    ctl.peer(),
                    format!("unexpected {other:?}"),
                ))
            }
            None => {}
        }
        let now = side.traffic();
        if now != seen {
            seen = now;
            deadline = Instant::now() + stall;
        } else if Instant::now() >= deadline {
            return Err(PerfError::Timeout(format!(
                "client {} did not finish",
                ctl.peer()
            )));
        }
    }
}
