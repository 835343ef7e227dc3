//! Responder: the receive side of RC, UC and UD. PSN checks and duplicate handling,
//! receive WQEs (RQ or SRQ), payload placement, READ/atomic responder resources, and
//! the ACK/NAK stream (coalesced: a queued ACK not yet sent is replaced by a newer one).

use std::collections::VecDeque;
use std::net::IpAddr;

use softhca_memory::AtomicOp;
use softhca_wire::{self as wire, Aeth, AethKind, Bth, Headers, NakCode, Opcode};

use crate::config::EngineConfig;
use crate::qp::{Ctx, InMsg, Qp, RdRes, RespOut};
use crate::timers::{quiet_wait, rtt_update};
use crate::verbs::*;

/// What the engine knows about the datagram a request came in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxMeta {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// UDP payload length (for the GRH of UD receives).
    pub udp_len: usize,
    /// The IP header's TOS or traffic class (for the GRH of UD receives).
    pub tos: u8,
}

impl RxMeta {
    /// What a request brings of its datagram `info`, whose UDP payload was `udp_len` long.
    pub(crate) fn of(info: &crate::DatagramInfo, udp_len: usize) -> RxMeta {
        RxMeta {
            src: info.src.ip(),
            dst: info.dst,
            udp_len,
            tos: info.tos,
        }
    }
}

/// Most out-of-sequence requests a QP keeps for later (see `on_rc`): a requester's
/// whole window (`requester::MAX_UNACKED_PSNS`), so that after one loss everything
/// behind it is kept and only the lost packet needs to come again. Bounded per device by
/// DEVICE_OOO_BYTES.
pub(crate) const OOO_MAX: usize = 1024;
/// Only packets less than this far ahead of the expected PSN are kept.
pub(crate) const OOO_WINDOW: i32 = 1024;
/// Times the sequence NAK of one gap is repeated while the gap stays open and the
/// requester has sent nothing for 4 round trips (at least 1 ms), then twice that
/// (`timers::quiet_wait`). IBTA C9-88 sends one NAK per gap and lets the requester's
/// timeout recover a lost one; but the timeout is 67 ms at perftest's timeout 14, and
/// under loss a lost NAK, or a lost retransmission of the packet it asked for, makes
/// most of a READ stream's timeouts. A repeated NAK is one the requester
/// may have lost: rxe and softhca retransmit from its PSN again. The round trip is this
/// QP's own requester's, or the time from an earlier NAK to the packet it asked for;
/// with neither measured yet, the NAK is not repeated. Silence, not a fixed time after
/// the NAK, decides: on a slow, queueing link a retransmission may arrive many round
/// trips after its NAK, and repeating the NAK there costs a go-back-N each time.
pub(crate) const MAX_NAK_REPEATS: u8 = 2;
/// A gap this many packets old is a loss: NAK it (once), as IBTA C9-88 would at once.
const OOO_NAK_AFTER: i32 = 128;
/// Most bytes of kept requests over all QPs of a device.
pub(crate) const DEVICE_OOO_BYTES: usize = 16 << 20;

/// A plain ACK, without end-to-end credits (rxe `AETH_ACK_UNLIMITED`).
const ACK: AethKind = AethKind::Ack {
    credits: Aeth::CREDITS_INVALID,
};

/// The MSN counts messages modulo 2^24 (IBTA 9.7.5.1.2).
fn next_msn(msn: u32) -> u32 {
    msn.wrapping_add(1) & 0x00ff_ffff
}

enum Fail {
    /// NAK with this code; RC responder QP goes to ERR (rxe class C/D errors).
    Nak(NakCode),
    /// Receive WQE failed locally: complete it with this status and NAK.
    Local(WcStatus, NakCode),
    /// Silently drop.
    Drop,
}

impl Qp {
    fn queue_ack(&mut self, psn: Psn, kind: AethKind) {
        self.resp.ack_owed = false;
        if kind == ACK && self.mp_sack_instead() {
            // Multipath: with requests held beyond a gap, a SACK says more.
            return;
        }
        let aeth = Aeth::from_kind(kind, self.resp.msn);
        // Coalesce: a plain ACK still waiting to go out is superseded by a newer one
        // (ACKs are cumulative, IBTA 9.7.5.1.2).
        if kind == ACK {
            if let Some(RespOut::Ack { psn: p, aeth: a }) = self.resp.out.back_mut() {
                if a.kind() == ACK {
                    *p = psn;
                    *a = aeth;
                    return;
                }
            }
        }
        self.resp.out.push_back(RespOut::Ack { psn, aeth });
    }

    fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<(RecvWr, bool)> {
        if let Some(id) = self.init.srq {
            let srq = ctx.srqs.get_mut(&id.0)?;
            return srq.take(id, ctx.events).map(|w| (w, true));
        }
        self.rq.pop_front().map(|w| (w, false))
    }

    fn return_recv(&mut self, ctx: &mut Ctx<'_>, wqe: RecvWr, from_srq: bool) {
        if from_srq {
            if let Some(srq) = self.init.srq.and_then(|id| ctx.srqs.get_mut(&id.0)) {
                srq.queue.push_front(wqe);
            }
        } else {
            self.rq.push_front(wqe);
        }
    }

    fn recv_completion(
        &self,
        ctx: &mut Ctx<'_>,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
    ) -> Completion {
        let _ = ctx;
        Completion {
            wr_id,
            status,
            opcode,
            qp_num: self.qpn,
            src_qp: self.attr.dest_qp_num,
            ..Completion::default()
        }
    }

    /// A request packet (anything but a response) for this QP.
    pub fn on_request(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8], meta: &RxMeta) {
        if let Some(m) = self.mp.as_deref_mut() {
            m.last_rx = Some((meta.dst, meta.src));
        }
        if !matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.counters.drop_bad_state += 1;
            return;
        }
        if self.state == QpState::Rtr && !self.resp.comm_est {
            // IBTA 11.6.3: first packet received in RTR.
            self.resp.comm_est = true;
            ctx.events.push_back(AsyncEvent::CommEst(self.qpn_t()));
        }
        match self.init.qp_type {
            QpType::Ud => self.on_ud(ctx, h, payload, meta),
            QpType::Uc => self.on_uc(ctx, h, payload),
            QpType::Rc => self.on_rc(ctx, h, payload),
        }
    }

    /// An RC request: rxe `check_psn` sorts it as early, duplicate or expected; the
    /// expected one executes, then the kept requests its arrival lets through.
    fn on_rc(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8]) {
        self.resp.last_rx_at = ctx.now;
        if self.resp.reorder.on_packet(h.bth.psn, ctx.now) {
            ctx.counters.reorder_spurious += 1;
        }
        let d = h.bth.psn.diff(self.resp.epsn);
        if d > 0 {
            self.on_early(ctx, h, payload, d);
            return;
        }
        if d < 0 {
            ctx.counters.duplicate_request += 1;
            self.on_duplicate(ctx, h);
            return;
        }
        if self.resp.nak_sent {
            // The gap our NAK was for has filled: its repeat is off (a gap behind it
            // gets its own reorder delay below).
            self.resp.gap_nak_at = None;
            if self.resp.nak_at > 0 && self.resp.nak_repeats == 0 {
                // The packet the NAK asked for: a round-trip sample (none if the NAK
                // was repeated: which one it answers is unknown).
                let sample = ctx.now.saturating_sub(self.resp.nak_at);
                self.resp.nak_rtt = rtt_update(self.resp.nak_rtt, sample);
            }
        }
        self.resp.nak_at = 0;
        self.resp.nak_repeats = 0;
        self.in_order(ctx, h, payload);
        self.run_kept(ctx);
    }

    /// A request `d` PSNs ahead of the expected one.
    ///
    /// Reordering tolerance. IBTA C9-88 has the responder NAK the first out-of-sequence
    /// packet and drop until the expected one comes, which is right on an in-order
    /// fabric; but a UDP path can reorder (ECMP, bonding, VMs, the fault testbed's
    /// jitter), and then every reordering costs a go-back-N of the whole window. So a
    /// packet that arrives a little early is kept (bounded per QP and per device) and
    /// executed when the gap before it fills; the NAK goes out only once the gap is
    /// OOO_NAK_AFTER packets old (a loss, not a reordering) or nothing more can be
    /// kept. The requester sees the standard protocol: ACKs, and at most one sequence
    /// NAK per gap.
    fn on_early(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8], d: i32) {
        ctx.counters.out_of_seq_request += 1;
        let epsn = self.resp.epsn;
        let kept = d < OOO_WINDOW
            && self.resp.ooo.len() < OOO_MAX
            && ctx.budget.ooo_bytes + payload.len() <= DEVICE_OOO_BYTES
            && match self
                .resp
                .ooo
                .binary_search_by(|(k, _)| k.bth.psn.diff(epsn).cmp(&d))
            {
                Ok(_) => true, // a duplicate of one already kept
                Err(i) => {
                    // Accounted into budget.ooo_bytes by the engine's sync after
                    // this packet (within one packet, the check above may lag).
                    self.resp.ooo.insert(i, (*h, payload.to_vec()));
                    self.resp.ooo_bytes += payload.len();
                    ctx.counters.ooo_buffered += 1;
                    self.mp_kept(h.bth.ack_req);
                    true
                }
            };
        if !self.resp.nak_sent {
            if self.resp.gap_nak_at.is_none() {
                self.resp.gap_since = ctx.now;
                self.resp.gap_nak_at = Some(ctx.now + self.resp.reorder.wait());
            }
            // Once the path has shown reordering, only time decides (RFC 8985 drops
            // the duplicate threshold the same way).
            let count_says_lost = d >= OOO_NAK_AFTER && self.resp.reorder.spurious == 0;
            if !kept || count_says_lost {
                self.nak_gap(ctx);
            }
        }
    }

    /// Execute the kept requests the gap was holding back, in PSN order.
    fn run_kept(&mut self, ctx: &mut Ctx<'_>) {
        while !self.resp.ooo.is_empty() && self.state != QpState::Err {
            let epsn = self.resp.epsn;
            // Kept packets the in-order path has passed (their PSNs arrived again and
            // executed, or a multi-packet message moved epsn on) are stale.
            while let Some((k, _)) = self.resp.ooo.front() {
                if !k.bth.psn.is_before(epsn) {
                    break;
                }
                if let Some((_, p)) = self.resp.ooo.pop_front() {
                    self.resp.ooo_bytes -= p.len();
                }
            }
            if self.resp.ooo.front().is_none_or(|(k, _)| k.bth.psn != epsn) {
                break;
            }
            let Some((kh, kp)) = self.resp.ooo.pop_front() else {
                break;
            };
            self.resp.ooo_bytes -= kp.len();
            ctx.counters.ooo_placed += 1;
            self.in_order(ctx, &kh, &kp);
            if self.resp.epsn == epsn {
                // Not accepted (RNR): the requester resends from here.
                break;
            }
        }
        if self.resp.ooo.is_empty() {
            self.resp.gap_nak_at = None;
            if self.resp.ooo.capacity() > 0 {
                self.resp.ooo = VecDeque::new();
            }
        } else if !self.resp.nak_sent && self.resp.gap_nak_at.is_none() {
            // Another gap behind the one that filled: its reorder delay starts now.
            self.resp.gap_since = ctx.now;
            self.resp.gap_nak_at = Some(ctx.now + self.resp.reorder.wait());
        }
    }

    /// The PSN-sequence NAK for the gap at `epsn` (IBTA C9-88; repeated at most
    /// `MAX_NAK_REPEATS` times while the gap stays open).
    fn nak_gap(&mut self, ctx: &mut Ctx<'_>) {
        if !self.resp.nak_sent {
            self.resp.nak_at = ctx.now;
            let since = self.resp.gap_since;
            self.resp.reorder.on_asked(self.resp.epsn, since, ctx.now);
        }
        self.resp.nak_sent = true;
        let rtt = self.req.srtt.max(self.resp.nak_rtt);
        self.resp.gap_nak_at = if self.resp.nak_repeats < MAX_NAK_REPEATS {
            quiet_wait(rtt, self.resp.nak_repeats).map(|w| ctx.now + w)
        } else {
            None
        };
        if self.mp_sack_instead() {
            // Multipath: the requester resends only what the SACK shows missing.
            return;
        }
        ctx.counters.seq_err_naks += 1;
        let e = self.resp.epsn;
        self.queue_ack(e, AethKind::Nak(NakCode::PsnSequenceError));
    }

    /// The reorder timer: a gap still open for the reordering window is a loss.
    pub(crate) fn on_gap_timer(&mut self, ctx: &mut Ctx<'_>) {
        match self.resp.gap_nak_at {
            Some(t) if t <= ctx.now => {
                self.resp.gap_nak_at = None;
                if self.resp.ooo.is_empty() || self.state == QpState::Err {
                    return;
                }
                if self.resp.nak_sent {
                    // Our NAK, or the retransmission it asked for, was lost: if the
                    // requester has fallen silent too. While requests still arrive
                    // (its window, or a retransmission queued behind it on a slow
                    // link), wait on: measured round trips vary with queueing, and a
                    // needless NAK costs a go-back-N.
                    let rtt = self.req.srtt.max(self.resp.nak_rtt);
                    let Some(wait) = quiet_wait(rtt, self.resp.nak_repeats) else {
                        return;
                    };
                    if ctx.now < self.resp.last_rx_at + wait {
                        self.resp.gap_nak_at = Some(self.resp.last_rx_at + wait);
                        return;
                    }
                    self.resp.nak_repeats += 1;
                }
                self.nak_gap(ctx);
            }
            _ => {}
        }
    }

    /// The expected request: execute it, NAK on failure.
    fn in_order(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8]) {
        match self.execute(ctx, h, payload) {
            Ok(()) => {}
            Err(Fail::Drop) => {}
            Err(Fail::Nak(s)) => self.nak_and_fail(ctx, h.bth.psn, s),
            Err(Fail::Local(status, s)) => {
                if let Some(InMsg::Send { wqe, .. }) = self.resp.cur.take() {
                    let wc = self.recv_completion(ctx, wqe.wr_id, status, WcOpcode::Recv);
                    self.post_completion(ctx, false, wc);
                }
                self.nak_and_fail(ctx, h.bth.psn, s)
            }
        }
    }

    fn nak_and_fail(&mut self, ctx: &mut Ctx<'_>, psn: Psn, code: NakCode) {
        match code {
            NakCode::RemoteAccessError => ctx.counters.sent_remote_access_err_naks += 1,
            NakCode::InvalidRequest => ctx.counters.sent_invalid_request_naks += 1,
            _ => {}
        }
        self.resp.cur = None;
        self.queue_ack(psn, AethKind::Nak(code));
        // rxe: after a class C/D error the responder QP moves to ERR once the NAK is
        // out. The NAK stays queued: flush keeps the ACK stream (see enter_error_keep_out).
        let out = std::mem::take(&mut self.resp.out);
        self.enter_error(ctx);
        ctx.events.push_back(if code == NakCode::RemoteAccessError {
            AsyncEvent::QpAccessErr(self.qpn_t())
        } else {
            AsyncEvent::QpReqErr(self.qpn_t())
        });
        self.resp.out = out;
    }

    fn on_duplicate(&mut self, ctx: &mut Ctx<'_>, h: &Headers) {
        let op = h.bth.opcode;
        if op.is_read_request() {
            self.replay_read(ctx, h);
        } else if op.is_atomic() {
            // Replay the saved result; never execute twice (IBTA 9.7.5.1.x).
            let psn = h.bth.psn;
            let saved = self.resp.res.iter().find_map(|r| match r {
                RdRes::Atomic { psn: p, orig } if *p == psn => Some(*orig),
                _ => None,
            });
            if let Some(orig) = saved {
                let msn = self.resp.msn;
                self.resp
                    .out
                    .push_back(RespOut::AtomicAck { psn, orig, msn });
            }
        } else {
            // SEND/WRITE: acknowledge again, cumulatively (rxe: ACK epsn - 1).
            let p = self.resp.epsn.sub(1);
            self.queue_ack(p, ACK);
        }
    }

    /// A duplicate READ request: re-execute from the responder resource that covers the
    /// PSN (IBTA 9.7.5.1.x): the retried request may resume mid-way.
    fn replay_read(&mut self, ctx: &mut Ctx<'_>, h: &Headers) {
        let psn = h.bth.psn;
        let range = self.resp.res.iter().find_map(|r| match r {
            RdRes::Read {
                first_psn,
                last_psn,
            } if !psn.is_before(*first_psn) && !psn.is_after(*last_psn) => {
                Some((*first_psn, *last_psn))
            }
            _ => None,
        });
        let Some(reth) = h.reth else {
            return;
        };
        let Some((first, last)) = range else { return };
        // Asked again for a PSN not sent yet (its responses still queued behind others):
        // the requester resent its requests (go-back-N after a lost request), nothing of
        // this READ was lost. Only a PSN that left is a loss signal.
        let queued_from = self.resp.out.iter().find_map(|o| match o {
            RespOut::Read { psn: p, .. } if !p.is_before(first) && !p.is_after(last) => Some(*p),
            _ => None,
        });
        if queued_from.is_none_or(|p| psn.is_before(p)) {
            self.cc_read_repeated(ctx, psn);
        }
        let len = u64::from(reth.dma_len);
        if self
            .check_rkey(ctx, reth.rkey, reth.va, len, AccessFlags::REMOTE_READ)
            .is_err()
        {
            return;
        }
        let Ok(mtu) = self.read_response_mtu(ctx.cfg, &h.bth) else {
            return;
        };
        // The retry supersedes a response to the same READ still queued (only
        // that one: responses to other READs must still go out).
        self.resp.out.retain(|o| {
            !matches!(o, RespOut::Read { psn, .. }
                if !psn.is_before(first) && !psn.is_after(last))
        });
        self.resp.out.push_back(RespOut::Read {
            psn,
            rkey: reth.rkey,
            va: reth.va,
            remaining: len,
            first: true,
            msn: self.resp.msn,
            mtu,
        });
    }

    /// The payload size of the responses to READ request `bth`: the path MTU, or the
    /// larger size the request names in its reserved bits (a softhca peer that agreed
    /// to it), if this device takes packets that large from this QP's peer; a size it
    /// does not take is an invalid request (its PSNs would be counted otherwise).
    fn read_response_mtu(&self, cfg: &EngineConfig, bth: &Bth) -> Result<u64, Fail> {
        let mtu = self.mtu(cfg);
        if bth.resv7 == 0 {
            return Ok(mtu);
        }
        let size = u64::from(bth.resv7) * crate::config::JUMBO_UNIT;
        if size > mtu && size <= self.max_request_payload(cfg) {
            Ok(size)
        } else {
            Err(self.nak_or_drop(NakCode::InvalidRequest))
        }
    }

    /// How a failed check ends (rxe `RESPST_ERR_*`): an RC responder NAKs, a UC one
    /// drops the packet silently (UC has no ACKs, IBTA 9.7.x).
    fn nak_or_drop(&self, code: NakCode) -> Fail {
        if self.is_rc() {
            Fail::Nak(code)
        } else {
            Fail::Drop
        }
    }

    /// rxe `check_rkey`: the QP's own access flags, then the MR or MW behind `rkey`.
    fn check_rkey(
        &self,
        ctx: &Ctx<'_>,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), NakCode> {
        // The QP's own access flags gate remote operations first (IBTA 10.2.4.x).
        if !self.attr.qp_access_flags.contains(need) {
            return Err(NakCode::RemoteAccessError);
        }
        if len == 0 {
            return Ok(());
        }
        ctx.mem
            .check_remote((self.init.pd, self.qpn), rkey, va, len, need)
            .map_err(|_| NakCode::RemoteAccessError)
    }

    /// rxe `check_op_seq`: a Middle or Last packet continues the message in progress of
    /// its own kind; a First or Only one starts a message (IBTA 9.8.3.x).
    fn check_op_seq(&self, op: Opcode) -> Result<(), Fail> {
        let continues = !op.starts_message();
        let ok = match self.resp.cur {
            Some(InMsg::Send { .. }) => op.is_send() && continues,
            Some(InMsg::Write { .. }) => op.is_write() && continues,
            None => !((op.is_send() || op.is_write()) && continues),
        };
        ok.then_some(())
            .ok_or_else(|| self.nak_or_drop(NakCode::InvalidRequest))
    }

    /// rxe `check_length`: First and Middle packets carry exactly the path MTU, Last and
    /// Only ones at most that (IBTA 9.7.5.1.x). A softhca peer that agreed to a larger
    /// packet size (`Qp::jumbo`) cuts its messages by that: First and Middle packets
    /// then carry a multiple of `JUMBO_UNIT` above the MTU, up to this device's size.
    fn check_length(&self, ctx: &Ctx<'_>, op: Opcode, payload: &[u8]) -> Result<(), Fail> {
        let (n, mtu) = (payload.len() as u64, self.mtu(ctx.cfg));
        let max = self.max_request_payload(ctx.cfg);
        let ok = if op.ends_message() {
            n <= max
        } else {
            n == mtu || (n > mtu && n <= max && n.is_multiple_of(crate::config::JUMBO_UNIT))
        };
        ok.then_some(())
            .ok_or_else(|| self.nak_or_drop(NakCode::InvalidRequest))
    }

    /// Execute an in-sequence RC/UC request: rxe's responder pipeline after the PSN
    /// check (`check_op_seq`, `check_length`, resources and rkey, then `execute`).
    fn execute(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8]) -> Result<(), Fail> {
        let op = h.bth.opcode;
        let rc = self.is_rc();
        self.check_op_seq(op)?;
        if op.is_send() {
            self.check_length(ctx, op, payload)?;
            self.exec_send(ctx, h, payload)?;
        } else if op.is_write() {
            self.check_length(ctx, op, payload)?;
            self.exec_write(ctx, h, payload)?;
        } else if op.is_read_request() && rc {
            return self.exec_read(ctx, h);
        } else if op.is_atomic() && rc {
            return self.exec_atomic(ctx, h);
        } else {
            return Err(self.nak_or_drop(NakCode::InvalidRequest));
        }
        self.resp.epsn = h.bth.psn.next();
        self.resp.nak_sent = false;
        if op.ends_message() {
            self.resp.msn = next_msn(self.resp.msn);
        }
        if rc && h.bth.ack_req {
            self.queue_ack(h.bth.psn, ACK);
        } else if rc {
            ctx.counters.ack_deferred += 1;
            self.resp.ack_owed = true;
        }
        Ok(())
    }

    /// A SEND packet: the First or Only one takes a receive WQE (RNR without one), each
    /// scatters its payload, the Last or Only one completes the WQE.
    fn exec_send(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8]) -> Result<(), Fail> {
        let op = h.bth.opcode;
        if op.starts_message() {
            let Some((wqe, from_srq)) = self.take_recv(ctx) else {
                return self.rnr(ctx, h.bth.psn);
            };
            self.resp.cur = Some(InMsg::Send {
                wqe,
                from_srq,
                off: 0,
            });
        }
        let pd = self.init.pd;
        let n = payload.len() as u64;
        let Some(InMsg::Send { wqe, off, .. }) = &mut self.resp.cur else {
            return Err(Fail::Drop);
        };
        let total: u64 = wqe.sg_list.iter().map(|s| u64::from(s.length)).sum();
        if *off + n > total {
            return Err(Fail::Local(WcStatus::LocLenErr, NakCode::InvalidRequest));
        }
        if n > 0
            && ctx
                .mem
                .scatter(pd, &wqe.sg_list, *off as usize, payload)
                .is_err()
        {
            return Err(Fail::Local(
                WcStatus::LocProtErr,
                NakCode::RemoteOperationalError,
            ));
        }
        *off += n;
        if op.ends_message() {
            let Some(InMsg::Send { wqe, off, from_srq }) = self.resp.cur.take() else {
                return Err(Fail::Drop);
            };
            if let Some(srq) = self.init.srq.filter(|_| from_srq) {
                if let Some(s) = ctx.srqs.get_mut(&srq.0) {
                    s.placed = s.placed.saturating_add(off as usize);
                }
            }
            let mut wc = self.recv_completion(ctx, wqe.wr_id, WcStatus::Success, WcOpcode::Recv);
            wc.byte_len = off as u32;
            if let Some(imm) = h.imm_dt {
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
            if let Some(rkey) = h.ieth {
                wc.imm_data = rkey;
                wc.wc_flags |= WcFlags::WITH_INV;
            }
            self.post_completion(ctx, false, wc);
        }
        Ok(())
    }

    /// An RDMA WRITE packet: the First or Only one checks the whole range against its
    /// rkey; each writes its part; with immediate, the Last or Only one consumes and
    /// completes a receive WQE.
    fn exec_write(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8]) -> Result<(), Fail> {
        let op = h.bth.opcode;
        let is_last = op.ends_message();
        let n = payload.len() as u64;
        // WRITE with immediate consumes a receive WQE; without one, RNR before the
        // packet is checked or any byte placed, and before an Only packet starts a
        // message (rxe `check_resource` comes before `check_rkey`): its retry must find
        // the responder as it was.
        let recv = if h.imm_dt.is_some() {
            match self.take_recv(ctx) {
                Some(r) => Some(r),
                None => return self.rnr(ctx, h.bth.psn),
            }
        } else {
            None
        };
        if let Err(f) = self.start_or_continue_write(ctx, h, n) {
            if let Some((w, s)) = recv {
                self.return_recv(ctx, w, s);
            }
            return Err(f);
        }
        let pd = self.init.pd;
        let Some(InMsg::Write {
            rkey,
            va,
            remaining,
            total,
        }) = &mut self.resp.cur
        else {
            return Err(Fail::Drop);
        };
        if n > 0
            && ctx
                .mem
                .remote_write((pd, self.qpn), *rkey, *va, payload)
                .is_err()
        {
            if let Some((w, s)) = recv {
                self.return_recv(ctx, w, s);
            }
            return Err(self.nak_or_drop(NakCode::RemoteAccessError));
        }
        *va = va.wrapping_add(n);
        *remaining -= n;
        let total = *total;
        if is_last {
            self.resp.cur = None;
            if let Some((w, _)) = recv {
                let mut wc = self.recv_completion(
                    ctx,
                    w.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                );
                wc.byte_len = total as u32;
                wc.imm_data = h.imm_dt.unwrap_or_default();
                wc.wc_flags |= WcFlags::WITH_IMM;
                self.post_completion(ctx, false, wc);
            }
        }
        Ok(())
    }

    /// A WRITE packet of `n` bytes: a First or Only one checks the whole range against
    /// its rkey and starts the message; each must fit what the message has left, a Last
    /// or Only one exactly.
    fn start_or_continue_write(&mut self, ctx: &Ctx<'_>, h: &Headers, n: u64) -> Result<(), Fail> {
        let op = h.bth.opcode;
        if op.starts_message() {
            let Some(reth) = h.reth else {
                return Err(Fail::Drop);
            };
            let len = u64::from(reth.dma_len);
            self.check_rkey(ctx, reth.rkey, reth.va, len, AccessFlags::REMOTE_WRITE)
                .map_err(|c| self.nak_or_drop(c))?;
            self.resp.cur = Some(InMsg::Write {
                rkey: reth.rkey,
                va: reth.va,
                remaining: len,
                total: len,
            });
        }
        let Some(InMsg::Write { remaining, .. }) = &self.resp.cur else {
            return Err(Fail::Drop);
        };
        if n > *remaining || (op.ends_message() && n != *remaining) {
            self.resp.cur = None;
            return Err(self.nak_or_drop(NakCode::InvalidRequest));
        }
        Ok(())
    }

    /// An RDMA READ request: checked, remembered as a responder resource, and queued
    /// for its responses, which take its PSN and the ones after it.
    fn exec_read(&mut self, ctx: &mut Ctx<'_>, h: &Headers) -> Result<(), Fail> {
        let Some(reth) = h.reth else {
            return Err(Fail::Drop);
        };
        if self.attr.max_dest_rd_atomic == 0 {
            return Err(Fail::Nak(NakCode::InvalidRequest));
        }
        let len = u64::from(reth.dma_len);
        self.check_rkey(ctx, reth.rkey, reth.va, len, AccessFlags::REMOTE_READ)
            .map_err(Fail::Nak)?;
        self.check_rd_atomic_room(ctx)?;
        let psn = h.bth.psn;
        let mtu = self.read_response_mtu(ctx.cfg, &h.bth)?;
        let npkts = len.div_ceil(mtu).max(1) as u32;
        self.push_res(RdRes::Read {
            first_psn: psn,
            last_psn: psn.add(npkts - 1),
        });
        self.resp.msn = next_msn(self.resp.msn);
        self.resp.out.push_back(RespOut::Read {
            psn,
            rkey: reth.rkey,
            va: reth.va,
            remaining: len,
            first: true,
            msn: self.resp.msn,
            mtu,
        });
        self.resp.epsn = psn.add(npkts);
        self.resp.nak_sent = false;
        Ok(())
    }

    /// A CmpSwap or FetchAdd request: executed once, its original value kept as a
    /// responder resource for a duplicate to replay.
    fn exec_atomic(&mut self, ctx: &mut Ctx<'_>, h: &Headers) -> Result<(), Fail> {
        let Some(a) = h.atomic_eth else {
            return Err(Fail::Drop);
        };
        if self.attr.max_dest_rd_atomic == 0 {
            return Err(Fail::Nak(NakCode::InvalidRequest));
        }
        // rxe: a misaligned atomic is an invalid request, not an access error.
        if a.va % 8 != 0 {
            return Err(Fail::Nak(NakCode::InvalidRequest));
        }
        self.check_rkey(ctx, a.rkey, a.va, 8, AccessFlags::REMOTE_ATOMIC)
            .map_err(Fail::Nak)?;
        self.check_rd_atomic_room(ctx)?;
        let aop = if h.bth.opcode == Opcode::RC_COMPARE_SWAP {
            AtomicOp::CompareSwap {
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add }
        };
        let orig = ctx
            .mem
            .remote_atomic((self.init.pd, self.qpn), a.rkey, a.va, aop)
            .map_err(|_| Fail::Nak(NakCode::RemoteAccessError))?;
        let psn = h.bth.psn;
        self.push_res(RdRes::Atomic { psn, orig });
        self.resp.msn = next_msn(self.resp.msn);
        let msn = self.resp.msn;
        self.resp
            .out
            .push_back(RespOut::AtomicAck { psn, orig, msn });
        self.resp.epsn = psn.next();
        self.resp.nak_sent = false;
        Ok(())
    }

    fn rnr(&mut self, ctx: &mut Ctx<'_>, psn: Psn) -> Result<(), Fail> {
        if !self.is_rc() {
            return Err(Fail::Drop); // UC: no receive WQE drops the message
        }
        ctx.counters.send_rnr_err += 1;
        // Suppress sequence NAKs for the packets behind it until the retry arrives
        // (and repeats of one sent before: the requester now waits for the RNR timer).
        self.resp.nak_sent = true;
        self.resp.gap_nak_at = None;
        self.resp.nak_repeats = MAX_NAK_REPEATS;
        self.resp.nak_at = 0;
        let timer = self.attr.min_rnr_timer & 0x1f;
        self.queue_ack(psn, AethKind::RnrNak { timer });
        Err(Fail::Drop)
    }

    /// Responder resources (IBTA 9.5.x: max_dest_rd_atomic): a requester keeps at most
    /// that many READ/atomic requests outstanding, so several times more responses
    /// than that waiting to go out means a flood. The extra request is dropped before it
    /// executes (its PSN is not consumed; a real requester resends it after its timeout),
    /// so the response queue, and the memory behind it, stays bounded.
    fn check_rd_atomic_room(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Fail> {
        // Room for a go-back-N's re-executed duplicates besides the new requests: a
        // new READ dropped here costs a real requester a whole retransmit timeout.
        let cap = 4 * usize::from(self.attr.max_dest_rd_atomic.max(16));
        let pending = self
            .resp
            .out
            .iter()
            .filter(|o| matches!(o, RespOut::Read { .. } | RespOut::AtomicAck { .. }))
            .count();
        if pending >= cap {
            ctx.counters.drop_rd_atomic_overflow += 1;
            return Err(Fail::Drop);
        }
        Ok(())
    }

    fn push_res(&mut self, r: RdRes) {
        let cap = usize::from(self.attr.max_dest_rd_atomic.max(1));
        while self.resp.res.len() >= cap {
            self.resp.res.pop_front();
        }
        self.resp.res.push_back(r);
    }

    fn on_uc(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8]) {
        let psn = h.bth.psn;
        if psn != self.resp.epsn || self.resp.uc_resync {
            // UC (IBTA 9.7.x): a gap kills the message in progress; the receive WQE is
            // reused for the next message. Resume at the next FIRST/ONLY.
            if let Some(InMsg::Send { wqe, from_srq, .. }) = self.resp.cur.take() {
                self.return_recv(ctx, wqe, from_srq);
            }
            self.resp.cur = None;
            if !h.bth.opcode.starts_message() {
                self.resp.uc_resync = true;
                self.resp.epsn = psn.next();
                ctx.counters.out_of_seq_request += 1;
                return;
            }
            self.resp.uc_resync = false;
            self.resp.epsn = psn;
        }
        if let Err(Fail::Local(status, _)) = self.execute(ctx, h, payload) {
            if let Some(InMsg::Send { wqe, .. }) = self.resp.cur.take() {
                let wc = self.recv_completion(ctx, wqe.wr_id, status, WcOpcode::Recv);
                self.post_completion(ctx, false, wc);
            }
            self.resp.uc_resync = true;
        }
        if self.resp.epsn == psn {
            // Dropped (no WQE / bad request): skip the rest of this message.
            if let Some(InMsg::Send { wqe, from_srq, .. }) = self.resp.cur.take() {
                self.return_recv(ctx, wqe, from_srq);
            }
            self.resp.cur = None;
            self.resp.uc_resync = true;
            self.resp.epsn = psn.next();
        }
    }

    fn on_ud(&mut self, ctx: &mut Ctx<'_>, h: &Headers, payload: &[u8], meta: &RxMeta) {
        let Some(deth) = h.deth else { return };
        if deth.qkey != self.attr.qkey {
            ctx.counters.drop_bad_qkey += 1;
            return;
        }
        let Some((wqe, _)) = self.take_recv(ctx) else {
            return; // UD: no receive WQE, silently dropped (IBTA 9.7.x)
        };
        let total: u64 = wqe.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let mut wc = Completion {
            wr_id: wqe.wr_id,
            opcode: WcOpcode::Recv,
            qp_num: self.qpn,
            src_qp: deth.src_qp.value(),
            // A user-space ibv_wc has no network header type (the kernel's has): as mlx5,
            // the RoCEv2 L3 type goes in `sl` (2 IPv4, 1 IPv6). UCX's ud_verbs reads it
            // to find an IPv4 destination in the last 4 bytes of the GRH area.
            sl: if meta.src.is_ipv4() { 2 } else { 1 },
            ..Completion::default()
        };
        if payload.len() as u64 + 40 > total {
            wc.status = WcStatus::LocLenErr;
            self.post_completion(ctx, false, wc);
            return;
        }
        let grh = grh_bytes(meta);
        let pd = self.init.pd;
        if ctx.mem.scatter(pd, &wqe.sg_list, 0, &grh).is_err()
            || (!payload.is_empty() && ctx.mem.scatter(pd, &wqe.sg_list, 40, payload).is_err())
        {
            wc.status = WcStatus::LocProtErr;
            self.post_completion(ctx, false, wc);
            return;
        }
        wc.byte_len = payload.len() as u32 + 40;
        wc.wc_flags |= WcFlags::GRH;
        if let Some(imm) = h.imm_dt {
            wc.imm_data = imm;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
        self.post_completion(ctx, false, wc);
    }
}

/// The 40 bytes a UD receive gets in front of the payload: like rxe for RoCEv2, an IPv4
/// header in the last 20 bytes (first 20 zero) or the IPv6 header, so
/// `ibv_wc_read_...`/rdma-core's GRH parsing finds the source GID.
pub(crate) fn grh_bytes(meta: &RxMeta) -> [u8; 40] {
    let mut g = [0u8; 40];
    let udp_total = meta.udp_len + wire::UDP_LEN;
    let to_v6 = |a: IpAddr| match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    // Both headers fit their part of `g`: emit cannot fail.
    let _ = match (meta.src, meta.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => wire::Ipv4Header {
            tos: meta.tos,
            total_len: (udp_total + wire::IPV4_LEN) as u16,
            id: 0,
            flags_frag: wire::Ipv4Header::DF,
            ttl: 64,
            protocol: wire::IP_PROTOCOL_UDP,
            checksum: 0,
            src,
            dst,
        }
        .emit(g.split_at_mut(20).1),
        (s, d) => wire::Ipv6Header {
            traffic_class: meta.tos,
            flow_label: 0,
            payload_len: udp_total as u16,
            next_header: wire::IP_PROTOCOL_UDP,
            hop_limit: 64,
            src: to_v6(s),
            dst: to_v6(d),
        }
        .emit(&mut g),
    };
    g
}
