//! Completer: the requester's receive side. Handles ACK, NAK, RNR NAK, READ responses
//! and atomic ACKs, retires WQEs in order and writes send completions; runs the
//! retransmit and RNR timers.

use smallvec::SmallVec;

use softhca_wire::{AethKind, Headers, NakCode};

use crate::qp::{wc_opcode, Ctx, Qp};
use crate::recovery::{LossCause, LossRecovery};
use crate::responder::{OOO_MAX, OOO_WINDOW};
use crate::timers::{ack_timeout_ns, quiet_wait, rnr_timer_ns, rtt_update, QUIET_MIN_NS};
use crate::verbs::*;

/// While a retransmission is under way, silence from the responder for 4 round trips
/// (at least 1 ms; doubling at the second time) means it was lost too, or its answer
/// was: resend, at most this many times before the retransmit timeout (67 ms at
/// perftest's timeout 14, doubling) takes over again. Why: a lost retransmission (a
/// re-requested READ, the packet a sequence NAK asked for) or a lost response to it
/// left the requester waiting a whole timeout: nothing else reports it, least of all
/// with the window full. A responder serves requests in order, so silence with a
/// retransmission outstanding means loss. The round trip is measured
/// (`Requester::srtt`), not fixed: a fixed one resends spuriously on a long-delay link.
/// A responder that only stalls gets at most two duplicates (see `rto_deadline`).
const MAX_QUIET_RESENDS: u8 = 2;

/// Tail-loss probes per silence (see `Qp::tail_probe_deadline`): at a round trip of at
/// most half a millisecond they go 1, 4, 16 and 64 ms into it (a responder that only
/// pauses for a few milliseconds gets one or two duplicates; a sequence NAK the first
/// probe draws after the responder's 1 ms reordering window comes before the second),
/// and the retransmit timeout stays the last resort.
const MAX_TAIL_PROBES: u8 = 4;

impl Qp {
    /// A response packet (ACK, ATOMIC ACKNOWLEDGE, READ RESPONSE) for this QP's requester.
    pub fn on_response(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8]) {
        self.req.quiet_from = ctx.now;
        if !matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe) {
            ctx.counters.drop_bad_state += 1;
            return;
        }
        let psn = h.bth.psn;
        if h.bth.opcode.is_read_response() && self.req.reorder.on_packet(psn, ctx.now) {
            ctx.counters.reorder_spurious += 1;
        }
        // Only PSNs in [una, max_sent) can be answered; older ones are stale duplicates.
        if psn.is_before(self.req.una) || psn.diff(self.req.max_sent) >= 0 {
            return;
        }
        let una_before = self.req.una;
        let op = h.bth.opcode;
        if op.is_ack()
            && h.aeth
                .is_some_and(|a| matches!(a.kind(), AethKind::Ack { .. }))
        {
            // The responder holds every request up to it, even where `una` waits for a
            // READ's responses: the scoreboard must not take those for lost.
            self.mp_held_through(ctx.now, psn);
        }
        if op.is_ack() {
            self.on_ack(ctx, h);
        } else if op.is_atomic_ack() {
            self.on_atomic_ack(ctx, h);
        } else if op.is_read_response() {
            self.on_read_response(ctx, h, payload);
        } else {
            ctx.counters.drop_bad_opcode += 1;
        }
        if self.req.una.is_after(una_before) {
            // Forward progress restores the retry budgets (rxe resets them on every
            // good response) and restarts the retransmit timer.
            self.req.retry_left = self.attr.retry_cnt;
            self.req.rnr_left = self.attr.rnr_retry;
            self.req.rto_backoff = 0;
            self.req.quiet_resends = 0;
            self.req.tail_probes = 0;
            self.req.recovery.on_progress(self.req.una);
            self.req.held.on_progress(self.req.una);
            self.cc_progress(ctx, una_before);
            self.req.rto =
                if self.req.max_sent.is_after(self.req.una) && self.req.rnr_wait.is_none() {
                    self.rto_deadline(ctx.now)
                } else {
                    None
                };
            self.mp_progress(ctx);
        }
        self.complete_sends(ctx);
    }

    /// Everything up to and including `last` is acknowledged. A READ/atomic in that
    /// range still missing its response lost it (responses precede later ACKs on one
    /// path): resend from there. Returns false when such a loss was found.
    fn ack_through(&mut self, ctx: &mut Ctx<'_>, last: Psn) -> bool {
        let mut una = last.next();
        let mut loss = None;
        for w in self.req.sq.iter_mut() {
            if !w.started || w.first_psn.is_after(last) {
                break;
            }
            if w.done || w.status.is_some() {
                continue;
            }
            if w.is_rd_atomic() {
                if w.read_next_psn.is_after(last) {
                    break; // responses so far cover `last`
                }
                una = w.read_next_psn;
                loss = Some(w.read_next_psn);
                break;
            }
            if !w.last_psn().is_after(last) {
                w.done = true;
            } else {
                break;
            }
        }
        if una.is_after(self.req.una) {
            self.req.una = una;
        }
        if let Some(p) = loss {
            if self.mp_active() {
                // Multipath: responses and ACKs take different paths, so a later ACK may
                // overtake them. Missing ones are judged as early responses are, after
                // the reorder wait (each judgement spends a retry).
                if self.req.read_gap_at.is_none() {
                    self.req.read_gap_at = Some(ctx.now + self.req.reorder.wait());
                }
                return false;
            }
            self.retransmit_from(ctx, p, LossCause::Gap);
            return false;
        }
        true
    }

    fn on_ack(&mut self, ctx: &mut Ctx<'_>, h: &Headers) {
        let Some(aeth) = h.aeth else { return };
        let psn = h.bth.psn;
        match aeth.kind() {
            AethKind::Ack { .. } => {
                self.ack_through(ctx, psn);
            }
            AethKind::RnrNak { timer } => {
                // An RNR NAK acknowledges everything before its PSN (IBTA 9.7.5.1.x).
                if !self.ack_through(ctx, psn.sub(1)) {
                    return;
                }
                ctx.counters.rcvd_rnr_err += 1;
                if self.req.rnr_left == 0 {
                    ctx.counters.retry_rnr_exceeded_err += 1;
                    self.fail_wqe_at(psn, WcStatus::RnrRetryExcErr);
                    return;
                }
                if self.attr.rnr_retry != 7 {
                    self.req.rnr_left -= 1;
                }
                ctx.counters.rnr_nak_retry_err += 1;
                self.rewind_to(psn);
                // The responder may have dropped what it held behind the refused one.
                self.req.held.clear();
                self.req.rnr_wait = Some((ctx.now + rnr_timer_ns(timer), psn));
                self.req.rto = None;
            }
            AethKind::Nak(code) => self.on_nak(ctx, psn, Some(code)),
            // A NAK with an undefined code (011x_xxxx) is a remote operational error.
            AethKind::Reserved(s) if s & 0xe0 == 0x60 => self.on_nak(ctx, psn, None),
            AethKind::Reserved(_) => {}
        }
    }

    /// A NAK (IBTA 9.7.5.2.4): everything before its PSN is acknowledged; a sequence
    /// error resends from it, the others fail the WQE holding it. `None`: a code IBTA
    /// does not define, taken as a remote operational error.
    fn on_nak(&mut self, ctx: &mut Ctx<'_>, psn: Psn, code: Option<NakCode>) {
        if !self.ack_through(ctx, psn.sub(1)) {
            return;
        }
        match code {
            Some(NakCode::PsnSequenceError) => {
                ctx.counters.rcvd_seq_err += 1;
                if self.req.rnr_wait.is_none() {
                    self.retransmit_from(ctx, psn, LossCause::NakSeq);
                }
            }
            Some(NakCode::InvalidRequest) => {
                ctx.counters.rcvd_invalid_request_naks += 1;
                self.fail_wqe_at(psn, WcStatus::RemInvReqErr);
            }
            Some(NakCode::RemoteAccessError) => {
                ctx.counters.rcvd_remote_access_err_naks += 1;
                self.fail_wqe_at(psn, WcStatus::RemAccessErr);
            }
            Some(NakCode::RemoteOperationalError | NakCode::InvalidRdRequest) | None => {
                ctx.counters.rcvd_remote_op_err_naks += 1;
                self.fail_wqe_at(psn, WcStatus::RemOpErr);
            }
        }
    }

    /// The WQE holding `psn` failed (reported when it reaches the head).
    fn fail_wqe_at(&mut self, psn: Psn, status: WcStatus) {
        if let Some(w) = self.req.sq.iter_mut().find(|w| w.contains(psn)) {
            if w.status.is_none() {
                w.status = Some(status);
            }
        }
    }

    fn on_atomic_ack(&mut self, ctx: &mut Ctx<'_>, h: &Headers) {
        let psn = h.bth.psn;
        let Some(idx) = self.req.sq.iter().position(|w| w.contains(psn)) else {
            return;
        };
        let Some(w) = self.req.sq.get(idx) else {
            return;
        };
        if w.done
            || w.first_psn != psn
            || !matches!(
                w.wr.opcode,
                WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
            )
        {
            return;
        }
        if !self.ack_through(ctx, psn.sub(1)) {
            return;
        }
        let orig = h.atomic_ack_eth.map_or(0, |a| a.orig);
        let pd = self.init.pd;
        let Some(w) = self.req.sq.get_mut(idx) else {
            return;
        };
        // verbs: the original value lands in the local buffer in host byte order.
        if let Payload::Sges(sges) = &w.wr.payload {
            if ctx.mem.scatter(pd, sges, 0, &orig.to_ne_bytes()).is_err() {
                w.status = Some(WcStatus::LocProtErr);
            }
        }
        w.done = true;
        w.read_next_psn = psn.next();
        self.req.una = psn.next();
    }

    fn on_read_response(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8]) {
        let psn = h.bth.psn;
        let Some(idx) = self.req.sq.iter().position(|w| w.contains(psn)) else {
            return;
        };
        let Some(w) = self.req.sq.get(idx) else {
            return;
        };
        if w.wr.opcode != WrOpcode::RdmaRead || w.done {
            return;
        }
        if w.rtt_sample {
            // A READ's first answer: a round-trip sample (see `complete_sends`), the
            // first one a connection gets when it starts with a window of READs.
            self.on_rtt_sample(ctx.now.saturating_sub(w.sent_at));
            if let Some(w) = self.req.sq.get_mut(idx) {
                w.rtt_sample = false;
            }
        }
        let Some(w) = self.req.sq.get(idx) else {
            return;
        };
        let d = psn.diff(w.read_next_psn);
        if d < 0 {
            return; // duplicate response
        }
        // In order means: the PSN this READ expects, with no earlier READ or atomic
        // still waiting for its response (those come first on the wire).
        let behind = self
            .req
            .sq
            .iter()
            .take(idx)
            .any(|w| w.is_rd_atomic() && !w.done && w.status.is_none());
        let early = d > 0 || behind;
        if early && d < OOO_WINDOW && self.req.read_early.len() < OOO_MAX {
            // Reordering tolerance (as the responder's, see responder::on_rc): each
            // READ response says where its data goes, so an early one is placed now
            // and counted when the gap before it fills; only a gap that stays open
            // the reordering window is a loss and resends the READ from there.
            let una = self.req.una;
            let slot = self
                .req
                .read_early
                .binary_search_by(|&p| p.diff(una).cmp(&psn.diff(una)));
            // Kept in PSN order: a duplicate is found by binary search, the drain
            // pops from the front.
            if let Err(i) = slot {
                if self.place_read(ctx, idx, h, payload) {
                    self.req.read_early.insert(i, psn);
                    ctx.counters.ooo_buffered += 1;
                    if self.req.read_gap_at.is_none() {
                        self.req.read_gap_at = Some(ctx.now + self.req.reorder.wait());
                    }
                }
            }
            return;
        }
        if early {
            // A response went missing: go back to it.
            let from = w.read_next_psn;
            if self.ack_through(ctx, w.first_psn.sub(1)) {
                self.retransmit_from(ctx, from, LossCause::Gap);
            }
            return;
        }
        // A READ response implicitly acknowledges every earlier request (an implied
        // ACK, as rxe `check_ack` takes it).
        let first_psn = w.first_psn;
        if !self.ack_through(ctx, first_psn.sub(1)) {
            return;
        }
        if !self.place_read(ctx, idx, h, payload) {
            return; // malformed response: ignore, the timer recovers
        }
        let Some(w) = self.req.sq.get_mut(idx) else {
            return;
        };
        w.read_next_psn = psn.next();
        if psn == w.last_psn() {
            w.done = true;
        }
        self.req.una = psn.next();
        self.drain_read_early(ctx);
    }

    /// Writes one READ response's data where it belongs in WQE `idx`; false if the
    /// response does not fit the WQE (length or opcode), then nothing is written.
    fn place_read(&mut self, ctx: &mut Ctx<'_>, idx: usize, h: &Headers, payload: &[u8]) -> bool {
        let pd = self.init.pd;
        let Some(w) = self.req.sq.get_mut(idx) else {
            return false;
        };
        let off = w.offset_of(h.bth.psn);
        let is_last = h.bth.psn == w.last_psn();
        let n = payload.len() as u64;
        let len_ok = if is_last {
            off + n == w.len
        } else {
            n == w.mtu
        };
        let op_ok = h.bth.opcode.ends_message() == is_last;
        if !len_ok || !op_ok {
            return false;
        }
        if let Payload::Sges(sges) = &w.wr.payload {
            if n > 0 && ctx.mem.scatter(pd, sges, off as usize, payload).is_err() {
                w.status = Some(WcStatus::LocProtErr);
            }
        }
        true
    }

    /// Counts READ responses placed early once everything before them arrived.
    fn drain_read_early(&mut self, ctx: &mut Ctx<'_>) {
        let una_before = self.req.una;
        while !self.req.read_early.is_empty() {
            let una = self.req.una;
            while self
                .req
                .read_early
                .front()
                .is_some_and(|&p| p.is_before(una))
            {
                self.req.read_early.pop_front();
            }
            if self.req.read_early.front() != Some(&una) {
                break;
            }
            let Some(w) = self
                .req
                .sq
                .iter_mut()
                .find(|w| w.started && w.contains(una))
            else {
                break;
            };
            if w.wr.opcode != WrOpcode::RdmaRead || w.done || w.read_next_psn != una {
                break;
            }
            self.req.read_early.pop_front();
            w.read_next_psn = una.next();
            if una == w.last_psn() {
                w.done = true;
            }
            self.req.una = una.next();
            ctx.counters.ooo_placed += 1;
        }
        if self.req.read_early.is_empty() {
            self.req.read_gap_at = None;
        } else if self.req.read_gap_at.is_none() || self.req.una != una_before {
            // A gap is still open in front of placed responses (after progress, or
            // after a resend that did not fill it yet): give it its full time again.
            self.req.read_gap_at = Some(ctx.now + self.req.reorder.wait());
        }
    }

    /// A round trip measured from a WQE sent once: the smoothed one that times silence,
    /// and the least one that sizes the reordering window.
    fn on_rtt_sample(&mut self, rtt: Nanos) {
        self.req.srtt = rtt_update(self.req.srtt, rtt);
        self.req.reorder.on_rtt(rtt);
        self.resp.reorder.on_rtt(rtt);
    }

    /// The READ reorder timer: responses still missing in front of early ones are lost.
    fn on_read_gap_timer(&mut self, ctx: &mut Ctx<'_>) {
        match self.req.read_gap_at {
            Some(t) if t <= ctx.now => {
                self.req.read_gap_at = None;
                let opened_at = t.saturating_sub(self.req.reorder.wait());
                // Early responses stay placed: when the resent range fills the gap,
                // una jumps over them.
                match self.read_holes() {
                    Some(holes) if !holes.is_empty() => {
                        // Re-request each READ with a hole, from its first missing
                        // response, and nothing else (see `rerequest_reads`). If that
                        // is lost too, the quiet timer notices (see `MAX_QUIET_RESENDS`).
                        if let Some((&(_, from), more)) = holes.split_first() {
                            if self.retransmit_from(ctx, from, LossCause::ReadHole) {
                                self.req.reorder.on_asked(from, opened_at, ctx.now);
                                // RACK (RFC 8985 6.3): the resent request gets a round
                                // trip and the reordering window before it counts lost.
                                let wait = self.req.srtt + self.req.reorder.wait();
                                self.req.read_gap_at = Some(ctx.now + wait);
                                self.rerequest_reads(ctx, more);
                            }
                        }
                    }
                    _ => {
                        // Something other than READ responses is missing (the ACK of a
                        // request between them): go back N from the READ at una.
                        let una = self.req.una;
                        let from = self
                            .req
                            .sq
                            .iter()
                            .find(|w| {
                                w.started && w.contains(una) && w.wr.opcode == WrOpcode::RdmaRead
                            })
                            .map(|w| w.read_next_psn);
                        if let Some(from) = from {
                            self.retransmit_from(ctx, from, LossCause::Gap);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// The READs with responses missing in front of the last one placed: (sq index,
    /// first missing PSN), in order. None when something else is missing there too.
    fn read_holes(&self) -> Option<SmallVec<[(usize, Psn); 8]>> {
        let &max = self.req.read_early.back()?;
        let una = self.req.una;
        let placed = |p: Psn| {
            self.req
                .read_early
                .binary_search_by(|&q| q.diff(una).cmp(&p.diff(una)))
                .is_ok()
        };
        let mut holes = SmallVec::new();
        for (i, w) in self.req.sq.iter().enumerate() {
            if !w.started || w.first_psn.is_after(max) {
                break;
            }
            if w.done || w.last_psn().is_before(una) {
                continue;
            }
            if w.wr.opcode != WrOpcode::RdmaRead {
                return None;
            }
            let mut p = w.read_next_psn;
            while !p.is_after(w.last_psn()) && placed(p) {
                p = p.next();
            }
            if !p.is_after(w.last_psn()) && p.is_before(max) {
                holes.push((i, p));
            }
        }
        Some(holes)
    }

    /// Retire finished WQEs from the head in order, writing completions; a WQE with an
    /// error completes with it and moves the QP to ERR (rxe: requester errors are fatal
    /// to the QP), flushing the rest.
    pub fn complete_sends(&mut self, ctx: &mut Ctx<'_>) {
        while let Some(w) = self.req.sq.front() {
            if let Some(status) = w.status {
                // A local error only completes once everything before it did.
                let wc = Completion {
                    wr_id: w.wr.wr_id,
                    status,
                    opcode: wc_opcode(w.wr.opcode),
                    qp_num: self.qpn,
                    ..Completion::default()
                };
                self.req.sq.pop_front();
                self.post_completion(ctx, true, wc);
                self.enter_error(ctx);
                return;
            }
            if !w.done {
                break;
            }
            let Some(w) = self.req.sq.pop_front() else {
                break;
            };
            if self.req.last_retransmit_at.is_none_or(|t| w.sent_at > t) {
                // Sent once and acknowledged: a round-trip sample (Karn: none from
                // anything a retransmission may have answered).
                self.on_rtt_sample(ctx.now.saturating_sub(w.sent_at));
            }
            if !self.req.probe_next.is_empty() {
                if self.req.send_idx == 0 {
                    // The READ to re-request completed first (the responder was slow,
                    // not lossy): no re-request, on to the next position.
                    if let Some((idx, off)) = self.req.probe_next.pop_front() {
                        self.req.send_idx = idx.saturating_sub(1);
                        self.req.send_off = if idx == 0 { 0 } else { off };
                    }
                } else {
                    self.req.send_idx -= 1;
                }
                for p in self.req.probe_next.iter_mut() {
                    p.0 = p.0.saturating_sub(1);
                }
            } else if self.req.send_idx == 0 {
                // A late ACK finished the WQE a rewind was resending: carry on with the
                // next WQE from its start (the offset belonged to the retired one).
                self.req.send_off = 0;
            } else {
                self.req.send_idx -= 1;
            }
            if w.is_rd_atomic() {
                self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
            }
            if w.signaled {
                let byte_len = match w.wr.opcode {
                    WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => 8,
                    _ => w.len as u32,
                };
                let wc = Completion {
                    wr_id: w.wr.wr_id,
                    status: WcStatus::Success,
                    opcode: wc_opcode(w.wr.opcode),
                    byte_len,
                    qp_num: self.qpn,
                    ..Completion::default()
                };
                self.post_completion(ctx, true, wc);
            }
        }
        if self.state == QpState::Sqd
            && self.req.sq.iter().all(|w| !w.started)
            && self.req.sqd_notify
        {
            self.req.sqd_notify = false;
            ctx.events.push_back(AsyncEvent::SqDrained(self.qpn_t()));
        }
    }

    /// The QP's timer fired.
    pub fn on_timer(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        self.cc_on_timer(now);
        self.mp_on_timer(ctx);
        self.on_gap_timer(ctx);
        self.on_read_gap_timer(ctx);
        if self.quiet_deadline().is_some_and(|t| t <= now) {
            // The retransmission under way was lost, or what answered it: resend from
            // the oldest unacknowledged PSN (a READ there alone, see `retransmit_from`).
            self.req.quiet_resends += 1;
            ctx.counters.quiet_resend += 1;
            self.req.recovery.on_retransmission_lost();
            let una = self.req.una;
            self.retransmit_from(ctx, una, LossCause::Quiet);
        }
        if self.tail_probe_deadline().is_some_and(|t| t <= now) {
            self.send_tail_probe(ctx);
        }
        if let Some((at, psn)) = self.req.rnr_wait {
            if at <= now {
                self.req.rnr_wait = None;
                self.rewind_to(psn);
                self.req.rto = ack_timeout_ns(self.attr.timeout).map(|t| now + t);
            }
            return;
        }
        if let Some(at) = self.req.rto {
            if at > now {
                return;
            }
            self.req.rto = None;
            if self.req.max_sent.is_after(self.req.una) && self.state != QpState::Err {
                ctx.counters.local_ack_timeout_err += 1;
                let una = self.req.una;
                self.retransmit_from(ctx, una, LossCause::Timeout);
            }
        }
    }

    /// The deadline this QP wants (retransmit, RNR, reorder, pacing).
    pub fn deadline(&self) -> Option<Nanos> {
        let req = match self.req.rnr_wait {
            Some((t, _)) => Some(t),
            None => self.req.rto,
        };
        // A fold the compiler unrolls (`flatten().min()` over the array ran as an
        // iterator, and this is asked after every event of every QP).
        [
            self.resp.gap_nak_at,
            self.req.read_gap_at,
            self.quiet_deadline(),
            self.tail_probe_deadline(),
            self.cc_deadline(),
            self.mp_deadline(),
        ]
        .into_iter()
        .fold(req, |a, b| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// When the responder's silence means a retransmission was lost (see `MAX_QUIET_RESENDS`):
    /// only while one is under way, so loss-free traffic arms no timer for it.
    fn quiet_deadline(&self) -> Option<Nanos> {
        let armed = self.req.recovery.in_progress()
            && self.req.rnr_wait.is_none()
            && self.req.quiet_resends < MAX_QUIET_RESENDS
            && self.req.max_sent.is_after(self.req.una)
            && self.state != QpState::Err;
        if !armed {
            return None;
        }
        quiet_wait(self.req.srtt, self.req.quiet_resends).map(|w| self.req.quiet_from + w)
    }

    /// When silence at the tail of the send queue means the last packets were lost (RFC
    /// 8985 7, the tail-loss probe): two round trips (at least `QUIET_MIN_NS`) after the
    /// later of the last new request and the last response, while nothing else is left
    /// to send and no retransmission is under way; again four times as far into the
    /// silence, up to `MAX_TAIL_PROBES` times. Why: a loss at the end of a burst (every
    /// loss, for a ping-pong) has no later packet to reveal it to the responder, and
    /// waited for the retransmit timeout (67 ms at perftest's timeout 14, 2.1 s at
    /// rdma_cm's); a probe, or what it draws, may be lost too. Multipath has its own
    /// silence rules (`multipath`).
    fn tail_probe_deadline(&self) -> Option<Nanos> {
        let armed = self.req.tail_probes < MAX_TAIL_PROBES
            && self.is_rc()
            && !self.mp_active()
            && self.state == QpState::Rts
            && !self.req.recovery.in_progress()
            && self.req.rnr_wait.is_none()
            && self.req.probe_next.is_empty()
            && self.req.send_idx >= self.req.sq.len()
            && self.req.max_sent.is_after(self.req.una);
        if !armed || self.req.srtt == 0 {
            return None;
        }
        let wait = (2 * self.req.srtt).max(QUIET_MIN_NS) << (2 * self.req.tail_probes);
        Some(self.req.quiet_from.max(self.req.sent_at) + wait)
    }

    /// Sends the last request packet again (see `tail_probe_deadline`). It draws an ACK
    /// if everything arrived (a duplicate is acknowledged again, IBTA 9.7.5.1.2), the
    /// missing READ response if only that was lost, or a sequence NAK at the first
    /// missing PSN, which goes back N from there as any NAK does. No retry is spent and
    /// the congestion window is not cut: nothing is known lost yet. The retransmit
    /// timer keeps running.
    fn send_tail_probe(&mut self, ctx: &mut Ctx<'_>) {
        self.req.tail_probes += 1;
        ctx.counters.tail_probe += 1;
        let last = self.req.max_sent.sub(1);
        self.rewind_to(last);
    }
}
