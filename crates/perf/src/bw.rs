//! Bandwidth tests: `tx_depth` work requests outstanding per QP, a completion every
//! `cq_mod` (perftest's ib_*_bw).

use std::time::{Duration, Instant};

use softhca::{smallvec, Completion, Cq, Payload, SendFlags, SendWr, WcOpcode, WrOpcode};

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
/// The longest sleep of an `--events` wait for completions.
const EVENT_WAIT: Duration = Duration::from_millis(1);

/// Per-QP progress on the requester.
#[derive(Clone, Copy)]
struct Lane {
    posted: u64,
    done: u64,
    credit: u64,
    target: u64,
}

/// What the requester's loop needs besides its lanes: the test and the limits derived
/// from it.
struct Requester<'a> {
    side: &'a Side,
    op: Op,
    p: &'a TestParams,
    remote: &'a [QpInfo],
    /// WRs outstanding per QP.
    window: u64,
    /// Every `cq_mod`-th WR is signaled.
    cq_mod: u64,
    nslots: u64,
    post_list: usize,
    /// WRITE with --verify: the server's credits bound how far the slots are reused.
    write_verify: bool,
    scratch: Vec<u8>,
}

impl<'a> Requester<'a> {
    fn new(side: &'a Side, op: Op, p: &'a TestParams, cq_mod: u32, remote: &'a [QpInfo]) -> Self {
        // Without --verify every WR reuses slot 0 (perftest does the same), so only the
        // send queue bounds the window; with --verify a slot must not be rewritten before
        // its message completed, so the slots bound it too.
        let window = if p.verify {
            u64::from(p.tx_depth.min(p.slots)).max(1)
        } else {
            u64::from(p.tx_depth).max(1)
        };
        Requester {
            side,
            op,
            p,
            remote,
            window,
            // A signaled WR must fall inside every window, or the window never reopens.
            cq_mod: u64::from(cq_mod).min(window).max(1),
            nslots: side.nslots,
            post_list: if p.size <= SMALL {
                POST_LIST_SMALL
            } else {
                POST_LIST
            },
            write_verify: op == Op::Write && p.verify,
            scratch: vec![0u8; p.size as usize],
        }
    }

    /// Whether lane `l` may post another WR now (besides the list being full).
    fn may_post(&self, l: &Lane) -> bool {
        l.posted < l.target
            && l.posted - l.done < self.window
            && (!self.write_verify || l.posted < l.credit + self.nslots)
    }

    /// Work request `i` of QP `qi` (with the pattern written first under --verify).
    fn wr(&mut self, qi: usize, i: u64, target: u64) -> Result<SendWr, PerfError> {
        let (side, p) = (self.side, self.p);
        let mut flags = SendFlags::empty();
        if (i + 1).is_multiple_of(self.cq_mod) || i + 1 == target {
            flags |= SendFlags::SIGNALED;
        }
        let local_slot = if p.verify { i % u64::from(p.slots) } else { 0 };
        let rslot = if p.verify { i % self.nslots } else { 0 };
        let mut wr = SendWr {
            wr_id: wr_id(qi, i),
            flags,
            remote_addr: self.remote[qi].va + side.off(0, rslot),
            rkey: self.remote[qi].rkey,
            payload: Payload::Sges(smallvec![side.sge(qi, local_slot, p.size)]),
            ..SendWr::default()
        };
        match self.op {
            Op::Send | Op::Write => {
                if p.verify {
                    pattern::fill(&mut self.scratch, qi as u32, i);
                    side.mr
                        .write(side.off(qi, local_slot) as usize, &self.scratch)
                        .map_err(PerfError::verbs("writing the pattern"))?;
                }
                wr.opcode = match (self.op, p.verify) {
                    (Op::Send, _) => WrOpcode::Send,
                    (_, true) => WrOpcode::RdmaWriteWithImm,
                    (_, false) => WrOpcode::RdmaWrite,
                };
                wr.imm_data = i as u32;
            }
            Op::Read => wr.opcode = WrOpcode::RdmaRead,
            Op::Atomic => {
                wr.opcode = WrOpcode::AtomicFetchAndAdd;
                wr.payload = Payload::Sges(smallvec![side.sge(qi, local_slot, 8)]);
                wr.remote_addr = self.remote[qi].va;
                wr.compare_add = 1;
            }
        }
        Ok(wr)
    }

    /// Posts what each lane may post, one list per QP. Returns true when every lane is
    /// done.
    fn post(&mut self, lanes: &mut [Lane], wrs: &mut Vec<SendWr>) -> Result<bool, PerfError> {
        let mut all_done = true;
        for (qi, l) in lanes.iter_mut().enumerate() {
            if l.done < l.target {
                all_done = false;
            }
            wrs.clear();
            while self.may_post(l) && wrs.len() < self.post_list {
                wrs.push(self.wr(qi, l.posted, l.target)?);
                l.posted += 1;
            }
            if !wrs.is_empty() {
                self.side.qps[qi]
                    .post_send_batch(wrs.drain(..))
                    .map_err(|(_, e)| PerfError::verbs("post_send")(e))?;
            }
        }
        Ok(all_done)
    }

    /// Under --verify, READ and atomic results are in the local buffer when their WRs
    /// complete: checks those of QP `qi` from `from` to `last`.
    fn verify_local(&mut self, qi: usize, from: u64, last: u64) -> Result<(), PerfError> {
        let (side, p) = (self.side, self.p);
        for i in from..=last {
            let local = side.off(qi, i % u64::from(p.slots)) as usize;
            if self.op == Op::Read {
                side.mr
                    .read(local, &mut self.scratch)
                    .map_err(PerfError::verbs("reading the buffer"))?;
                pattern::check(&self.scratch, qi as u32, i % self.nslots)
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
        Ok(())
    }

    /// Takes the completions polled: lanes advance, READ and atomic results are checked.
    fn complete(&mut self, lanes: &mut [Lane], wcs: &[Completion]) -> Result<(), PerfError> {
        for wc in wcs {
            check_wc(wc, self.op.name())?;
            let (qi, last) = split_wr_id(wc.wr_id);
            let done = lanes.get(qi).map(|l| l.done).ok_or_else(|| {
                PerfError::Verify(format!("completion for unknown wr_id {:#x}", wc.wr_id))
            })?;
            if self.p.verify && matches!(self.op, Op::Read | Op::Atomic) {
                self.verify_local(qi, done, last)?;
            }
            lanes[qi].done = done.max(last + 1);
        }
        Ok(())
    }

    /// Under WRITE --verify: whether the server's credits hold a lane back.
    fn starved(&self, lanes: &[Lane]) -> bool {
        self.write_verify
            && lanes
                .iter()
                .any(|l| l.posted < l.target && l.posted >= l.credit + self.nslots)
    }

    /// Nothing completed: under WRITE --verify, wait briefly for the server's credits if
    /// they are what holds the lanes back.
    fn wait_for_credits(
        &self,
        lanes: &mut [Lane],
        ctl: &mut Control,
        idle: &mut Idle,
    ) -> Result<(), PerfError> {
        if !self.starved(lanes) {
            return Ok(());
        }
        // Flow control: the server has not verified the slots we would overwrite.
        if let Some(c) = ctl.recv(Some(Duration::from_micros(200)))? {
            apply_credit(lanes, c, ctl)?;
            idle.progress();
            while let Some(c) = ctl.recv(Some(Duration::ZERO))? {
                apply_credit(lanes, c, ctl)?;
            }
        }
        Ok(())
    }
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
    let mut r = Requester::new(side, op, p, cq_mod, remote);
    let target = if p.iters > 0 { p.iters } else { u64::MAX };
    let mut lanes = vec![
        Lane {
            posted: 0,
            done: 0,
            credit: 0,
            target,
        };
        side.qps.len()
    ];
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
        if stop_at.is_some_and(|t| !stopping && Instant::now() >= t) {
            stopping = true;
            // Stop at the next signaled WR so the last one posted reports completion.
            for l in &mut lanes {
                l.target = l.posted.div_ceil(r.cq_mod) * r.cq_mod;
            }
        }
        if r.post(&mut lanes, &mut wrs)? {
            break;
        }
        let mut n = side.scq.poll(&mut wcs);
        if n == 0 && p.events && !r.starved(&lanes) {
            n = wait(&side.scq, &mut wcs)?;
        }
        r.complete(&mut lanes, &wcs[..n])?;
        if n > 0 {
            idle.progress();
            let done: u64 = lanes.iter().map(|l| l.done).sum();
            progress.update(Instant::now(), done, total_target, p.size);
        } else {
            r.wait_for_credits(&mut lanes, ctl, &mut idle)?;
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

/// `--events`: sleeps until `cq` has completions, at most [`EVENT_WAIT`] (the loop
/// has a clock and a control connection to look at too).
fn wait(cq: &Cq, wcs: &mut [Completion]) -> Result<usize, PerfError> {
    cq.wait(wcs, EVENT_WAIT)
        .map_err(PerfError::verbs("waiting for completions"))
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
    let end_wait = if p.duration_ms > 0 {
        Duration::from_millis(p.duration_ms) + STALL
    } else {
        STALL * 6
    };
    // Only SENDs and verified WRITEs (with immediate) consume receives here.
    if !(op == Op::Send || (op == Op::Write && p.verify)) {
        return passive_server(side, op, p, ctl, end_wait);
    }
    let nq = side.qps.len();
    let mut received = vec![0u64; nq];
    let mut end: Option<Vec<u64>> = None;
    let mut scratch = vec![0u8; p.size as usize];
    let mut wcs = [Completion::default(); 64];
    let mut idle = Idle::new(end_wait);
    let credit_every = (u64::from(p.slots) / 4).max(1);
    let mut verdict: Result<(), String> = Ok(());
    loop {
        let mut n = side.rcq.poll(&mut wcs);
        if n == 0 && p.events {
            n = wait(&side.rcq, &mut wcs)?;
        }
        for wc in &wcs[..n] {
            check_wc(wc, "receive")?;
            let (qi, slot) = split_wr_id(wc.wr_id);
            let Some(&i) = received.get(qi) else {
                return Err(PerfError::Verify(format!(
                    "receive for unknown wr_id {:#x}",
                    wc.wr_id
                )));
            };
            if p.verify && verdict.is_ok() {
                verdict = check_received(side, op, p, wc, (qi, slot, i), &mut scratch)?;
            }
            received[qi] = i + 1;
            let repost_len = if op == Op::Send { p.size } else { 0 };
            side.post_recv(
                qi,
                if p.verify || op != Op::Send { slot } else { 0 },
                repost_len,
            )?;
            if op == Op::Write && (i + 1).is_multiple_of(credit_every) {
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
                end = take_end(ctl)?;
                if end.is_some() {
                    idle.progress();
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

/// A server that posts nothing (READ, unverified WRITE, atomics): waits for the client's
/// end and, for verified atomics, checks the counter each QP incremented.
fn passive_server(
    side: &Side,
    op: Op,
    p: &TestParams,
    ctl: &mut Control,
    end_wait: Duration,
) -> Result<ServerOutcome, PerfError> {
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
    Ok(ServerOutcome { counts, verdict })
}

/// The client's end message, if it came (nothing else may come during a test).
fn take_end(ctl: &mut Control) -> Result<Option<Vec<u64>>, PerfError> {
    match ctl.recv(Some(Duration::ZERO))? {
        Some(Ctl::End(c)) => Ok(Some(c)),
        Some(other) => Err(PerfError::exchange(
            ctl.peer(),
            format!("unexpected {other:?}"),
        )),
        None => Ok(None),
    }
}

/// Under --verify, message `i` of QP `qi` (received into `slot`): its completion and its
/// bytes. Returns the verdict (an error only when the buffer cannot be read).
fn check_received(
    side: &Side,
    op: Op,
    p: &TestParams,
    wc: &Completion,
    (qi, slot, i): (usize, u64, u64),
    scratch: &mut [u8],
) -> Result<Result<(), String>, PerfError> {
    let size = p.size;
    let (off, expect_op) = if op == Op::Send {
        (side.off(qi, slot), WcOpcode::Recv)
    } else {
        (side.off(qi, i % side.nslots), WcOpcode::RecvRdmaWithImm)
    };
    if wc.opcode != expect_op || u64::from(wc.byte_len) != size && op == Op::Send {
        return Ok(Err(format!(
            "QP {qi} message {i}: completion {:?} with {} bytes, expected {:?} with {size}",
            wc.opcode, wc.byte_len, expect_op
        )));
    }
    if op == Op::Write && wc.imm_data != i as u32 {
        return Ok(Err(format!(
            "QP {qi} message {i}: immediate {} out of order",
            wc.imm_data
        )));
    }
    side.mr
        .read(off as usize, scratch)
        .map_err(PerfError::verbs("reading the buffer"))?;
    Ok(pattern::check(scratch, qi as u32, i).map_err(|m| pattern::describe(qi as u32, i, m)))
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
