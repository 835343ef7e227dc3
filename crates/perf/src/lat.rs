//! Latency tests (perftest's ib_*_lat): SEND and WRITE ping-pong, one READ or atomic
//! outstanding at a time. One QP.
//!
//! Slots of QP 0's region: 0 and 1 receive (SEND alternates; WRITE lands in 0), 2 is
//! the send source; READ targets rotate over the server's three slots so a stale
//! buffer never matches.

use std::time::{Duration, Instant};

use softhca::{smallvec, Completion, Payload, SendFlags, SendWr, WrOpcode};

use crate::error::PerfError;
use crate::exchange::{Control, Ctl, QpInfo, TestParams};
use crate::pattern;
use crate::progress::Progress;
use crate::setup::{check_wc, split_wr_id, wr_id, Idle, Side};
use crate::{Op, Outcome, ServerOutcome, STALL};

const SRC: u64 = 2;

/// The byte WRITE latency polls for: never 0 (the zeroed buffer), differs for consecutive messages.
fn tag(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Writes message `i`'s content into the send slot.
fn fill_src(
    side: &Side,
    op: Op,
    i: u64,
    verify: bool,
    scratch: &mut [u8],
) -> Result<(), PerfError> {
    let off = side.off(0, SRC) as usize;
    let size = scratch.len();
    if verify {
        pattern::fill(scratch, 0, i);
        if op == Op::Write {
            scratch[size - 1] = tag(i);
        }
        side.mr
            .write(off, scratch)
            .map_err(PerfError::verbs("writing the pattern"))
    } else if op == Op::Write {
        side.mr
            .write(off + size - 1, &[tag(i)])
            .map_err(PerfError::verbs("writing the buffer"))
    } else {
        Ok(())
    }
}

/// Checks a received message in `slot`. For WRITE the last byte is the tag, which we
/// polled; the rest may still be landing (the packet copy need not run front to back),
/// so a mismatch is re-read for a moment before it counts.
fn check_slot(side: &Side, op: Op, slot: u64, i: u64, scratch: &mut [u8]) -> Result<(), String> {
    let off = side.off(0, slot) as usize;
    let size = scratch.len();
    let body = if op == Op::Write { size - 1 } else { size };
    let deadline = Instant::now() + Duration::from_millis(100);
    loop {
        if let Err(e) = side.mr.read(off, scratch) {
            return Err(e.to_string());
        }
        match pattern::check(&scratch[..body], 0, i) {
            Ok(()) => return Ok(()),
            Err(m) if op != Op::Write || Instant::now() > deadline => {
                return Err(pattern::describe(0, i, m))
            }
            Err(_) => std::thread::yield_now(),
        }
    }
}

fn send_wr(side: &Side, op: Op, i: u64, size: u64, remote: &QpInfo, rslot: u64) -> SendWr {
    let mut wr = SendWr {
        wr_id: wr_id(0, i),
        flags: SendFlags::SIGNALED,
        ..SendWr::default()
    };
    match op {
        Op::Send => {
            wr.opcode = WrOpcode::Send;
            wr.payload = Payload::Sges(smallvec![side.sge(0, SRC, size)]);
        }
        Op::Write => {
            wr.opcode = WrOpcode::RdmaWrite;
            wr.payload = Payload::Sges(smallvec![side.sge(0, SRC, size)]);
            wr.remote_addr = remote.va + side.off(0, 0);
            wr.rkey = remote.rkey;
        }
        Op::Read => {
            wr.opcode = WrOpcode::RdmaRead;
            wr.payload = Payload::Sges(smallvec![side.sge(0, 0, size)]);
            wr.remote_addr = remote.va + side.off(0, rslot);
            wr.rkey = remote.rkey;
        }
        Op::Atomic => {
            wr.opcode = WrOpcode::AtomicFetchAndAdd;
            wr.payload = Payload::Sges(smallvec![side.sge(0, 0, 8)]);
            wr.remote_addr = remote.va;
            wr.rkey = remote.rkey;
            wr.compare_add = 1;
        }
    }
    wr
}

/// Posts the receives a latency side needs (SEND only) before connecting.
pub fn prepare(side: &Side, op: Op, p: &TestParams) -> Result<(), PerfError> {
    if op == Op::Send {
        for j in 0..2 {
            side.post_recv(0, j, p.size)?;
        }
    }
    if op == Op::Read {
        let mut buf = vec![0u8; p.size as usize];
        for s in 0..side.nslots {
            pattern::fill(&mut buf, 0, s);
            side.mr
                .write(side.off(0, s) as usize, &buf)
                .map_err(PerfError::verbs("writing the pattern"))?;
        }
    }
    Ok(())
}

/// Waits for message `i`: a receive (SEND) or the tag byte (WRITE). `Ok(false)` when
/// `end` was seen instead (server).
struct Waiter {
    wcs: [Completion; 16],
    idle: Idle,
}

/// Empty polls of the receive CQ between two send-CQ polls while waiting for a SEND.
const REAP_EVERY: u32 = 16;

impl Waiter {
    /// While waiting for a SEND: drains send completions only every `REAP_EVERY` empty
    /// polls (as perftest polls its send CQ only every cq_mod sends). Each CQ poll
    /// runs a datapath step, one `recvmmsg` on an empty socket; a second CQ polled
    /// every turn doubled the time from a packet's arrival to its discovery. WRITE
    /// waits poll memory, not a CQ, so there the send CQ poll is what drives progress.
    fn reap_while_waiting(
        &mut self,
        side: &Side,
        op: Op,
        outstanding: &mut u64,
        spins: &mut u32,
    ) -> Result<(), PerfError> {
        *spins = spins.wrapping_add(1);
        if op != Op::Send || spins.is_multiple_of(REAP_EVERY) {
            self.reap_sends(side, op, outstanding)?;
        }
        Ok(())
    }

    /// Drains send completions without waiting.
    fn reap_sends(&mut self, side: &Side, op: Op, outstanding: &mut u64) -> Result<(), PerfError> {
        let n = side.scq.poll(&mut self.wcs);
        for wc in &self.wcs[..n] {
            check_wc(wc, op.name())?;
            *outstanding = outstanding.saturating_sub(1);
        }
        Ok(())
    }

    /// Polls for message `i` once; Some(slot) when it arrived.
    fn poll_msg(
        &mut self,
        side: &Side,
        op: Op,
        i: u64,
        size: u64,
    ) -> Result<Option<u64>, PerfError> {
        match op {
            Op::Send => {
                let n = side.rcq.poll(&mut self.wcs[..1]);
                if n == 0 {
                    return Ok(None);
                }
                let wc = self.wcs[0];
                check_wc(&wc, "receive")?;
                let (_, slot) = split_wr_id(wc.wr_id);
                if u64::from(wc.byte_len) != size {
                    return Err(PerfError::Verify(format!(
                        "message {i}: {} bytes, expected {size}",
                        wc.byte_len
                    )));
                }
                Ok(Some(slot))
            }
            _ => {
                let mut b = [0u8; 1];
                side.mr
                    .read((side.off(0, 0) + size - 1) as usize, &mut b)
                    .map_err(PerfError::verbs("reading the buffer"))?;
                Ok((b[0] == tag(i)).then_some(0))
            }
        }
    }
}

/// The client side of a latency test: returns one round-trip sample per message.
pub fn client(
    side: &Side,
    op: Op,
    p: &TestParams,
    remote: &QpInfo,
    progress: &mut dyn Progress,
) -> Result<Outcome, PerfError> {
    let size = p.size;
    let mut scratch = vec![0u8; size as usize];
    let iters = if p.iters > 0 { p.iters } else { u64::MAX };
    let stop_at =
        (p.duration_ms > 0).then(|| Instant::now() + Duration::from_millis(p.duration_ms));
    let mut samples = Vec::with_capacity(iters.min(1 << 22) as usize);
    let mut w = Waiter {
        wcs: [Completion::default(); 16],
        idle: Idle::new(STALL),
    };
    let mut outstanding = 0u64;
    let start = Instant::now();
    let mut i = 0;
    while i < iters {
        if stop_at.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        fill_src(side, op, i, p.verify, &mut scratch)?;
        while outstanding >= u64::from(p.tx_depth.max(1)) {
            w.reap_sends(side, op, &mut outstanding)?;
            w.idle.idle("waiting for send completions")?;
        }
        let t0 = Instant::now();
        side.qps[0]
            .post_send(send_wr(side, op, i, size, remote, i % side.nslots))
            .map_err(PerfError::verbs("post_send"))?;
        outstanding += 1;
        w.idle.progress();
        match op {
            Op::Send | Op::Write => {
                let mut spins = 0;
                let slot = loop {
                    if let Some(s) = w.poll_msg(side, op, i, size)? {
                        break s;
                    }
                    w.reap_while_waiting(side, op, &mut outstanding, &mut spins)?;
                    w.idle.idle("waiting for the reply")?;
                };
                samples.push(t0.elapsed().as_nanos() as u64);
                if p.verify {
                    check_slot(side, op, slot, i, &mut scratch).map_err(PerfError::Verify)?;
                }
                if op == Op::Send {
                    side.post_recv(0, slot, size)?;
                }
            }
            Op::Read | Op::Atomic => {
                while outstanding > 0 {
                    w.reap_sends(side, op, &mut outstanding)?;
                    if outstanding > 0 {
                        w.idle.idle("waiting for the response")?;
                    }
                }
                samples.push(t0.elapsed().as_nanos() as u64);
                if p.verify {
                    check_fetched(side, op, i, &mut scratch)?;
                }
            }
        }
        i += 1;
        progress.update(
            Instant::now(),
            i,
            if p.iters > 0 { p.iters } else { 0 },
            size,
        );
    }
    let seconds = start.elapsed().as_secs_f64();
    while outstanding > 0 {
        w.reap_sends(side, op, &mut outstanding)?;
        if outstanding > 0 {
            w.idle.idle("waiting for send completions")?;
        }
    }
    progress.finish();
    Ok(Outcome {
        counts: vec![i],
        seconds,
        samples,
    })
}

/// Under --verify, what READ `i` or fetch-and-add `i` brought into the local buffer.
fn check_fetched(side: &Side, op: Op, i: u64, scratch: &mut [u8]) -> Result<(), PerfError> {
    if op == Op::Read {
        side.mr
            .read(side.off(0, 0) as usize, scratch)
            .map_err(PerfError::verbs("reading"))?;
        return pattern::check(scratch, 0, i % side.nslots)
            .map_err(|m| PerfError::Verify(pattern::describe(0, i, m)));
    }
    let mut v = [0u8; 8];
    side.mr
        .read(side.off(0, 0) as usize, &mut v)
        .map_err(PerfError::verbs("reading"))?;
    let got = u64::from_ne_bytes(v);
    if got != i {
        return Err(PerfError::Verify(format!(
            "atomic {i}: fetched {got}, expected {i}"
        )));
    }
    Ok(())
}

/// The server side: echoes SEND / WRITE messages until the client's end message; READ
/// and atomic only wait.
pub fn server(
    side: &Side,
    op: Op,
    p: &TestParams,
    remote: &QpInfo,
    ctl: &mut Control,
) -> Result<ServerOutcome, PerfError> {
    let limit = if p.duration_ms > 0 {
        Duration::from_millis(p.duration_ms) + STALL
    } else {
        STALL * 6
    };
    if matches!(op, Op::Read | Op::Atomic) {
        let counts = super::bw::wait_end(ctl, side, limit)?;
        let mut verdict = Ok(());
        if op == Op::Atomic && p.verify {
            let mut v = [0u8; 8];
            side.mr
                .read(side.off(0, 0) as usize, &mut v)
                .map_err(PerfError::verbs("reading"))?;
            let got = u64::from_ne_bytes(v);
            if Some(&got) != counts.first() {
                verdict = Err(format!(
                    "counter is {got} after {:?} fetch-and-adds",
                    counts.first()
                ));
            }
        }
        return Ok(ServerOutcome { counts, verdict });
    }
    let size = p.size;
    let mut scratch = vec![0u8; size as usize];
    let mut w = Waiter {
        wcs: [Completion::default(); 16],
        idle: Idle::new(limit),
    };
    let mut outstanding = 0u64;
    let mut verdict = Ok(());
    let mut i = 0u64;
    let mut end: Option<Vec<u64>> = None;
    loop {
        if let Some(e) = &end {
            if e.first().is_some_and(|&n| i >= n) {
                break;
            }
        }
        let mut spins = 0;
        let slot = loop {
            if let Some(s) = w.poll_msg(side, op, i, size)? {
                break Some(s);
            }
            w.reap_while_waiting(side, op, &mut outstanding, &mut spins)?;
            if end.is_none() && w.idle.should_check() {
                match ctl.recv(Some(Duration::ZERO))? {
                    Some(Ctl::End(c)) => {
                        let done = c.first().is_some_and(|&n| i >= n);
                        end = Some(c);
                        if done {
                            break None;
                        }
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
            w.idle.idle("waiting for the client's message")?;
        };
        let Some(slot) = slot else { break };
        w.idle.progress();
        if p.verify && verdict.is_ok() {
            verdict = check_slot(side, op, slot, i, &mut scratch);
        }
        if op == Op::Send {
            side.post_recv(0, slot, size)?;
        }
        fill_src(side, op, i, p.verify, &mut scratch)?;
        while outstanding >= u64::from(p.tx_depth.max(1)) {
            w.reap_sends(side, op, &mut outstanding)?;
            w.idle.idle("waiting for send completions")?;
        }
        side.qps[0]
            .post_send(send_wr(side, op, i, size, remote, 0))
            .map_err(PerfError::verbs("post_send"))?;
        outstanding += 1;
        i += 1;
    }
    let counts = match end {
        Some(c) => c,
        None => super::bw::wait_end(ctl, side, limit)?,
    };
    Ok(ServerOutcome { counts, verdict })
}
