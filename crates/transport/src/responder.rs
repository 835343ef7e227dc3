//! Responder: the receive side of RC, UC and UD. PSN checks and duplicate handling,
//! receive WQEs (RQ or SRQ), payload placement, READ/atomic responder resources, and
//! the ACK/NAK stream (coalesced: a queued ACK not yet sent is replaced by a newer one).

use std::collections::VecDeque;
use std::net::IpAddr;

use crate::packet::{op, syndrome, PktHdr};
use crate::qp::{psn_add, psn_diff, Ctx, InMsg, Qp, RdRes, RespOut};
use crate::timers::{quiet_wait, rtt_update};
use crate::verbs::*;

/// What the engine knows about the datagram a request came in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxMeta {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// UDP payload length (for the GRH of UD receives).
    pub udp_len: usize,
}

/// Most out-of-sequence requests a QP keeps for later (see `on_rc`): a requester's
/// whole window (`requester::MAX_UNACKED_PSNS`), so that after one loss everything
/// behind it is kept and only the lost packet needs to come again (with 256, most of
/// a window was dropped and resent at 1 % loss). Bounded per device by DEVICE_OOO_BYTES.
pub(crate) const OOO_MAX: usize = 1024;
/// Only packets less than this far ahead of the expected PSN are kept.
pub(crate) const OOO_WINDOW: i32 = 1024;
/// A gap still open this long after the first packet behind it arrived is a loss.
pub(crate) const OOO_NAK_DELAY_NS: u64 = 1_000_000;
/// Times the sequence NAK of one gap is repeated while the gap stays open and the
/// requester has sent nothing for 4 round trips (at least 1 ms), then twice that
/// (`timers::quiet_wait`). IBTA C9-88 sends one NAK per gap and lets the requester's
/// timeout recover a lost one; but the timeout is 67 ms at perftest's timeout 14, and
/// at 1 % loss a lost NAK, or a lost retransmission of the packet it asked for, was
/// most of the remaining timeouts of a READ stream. A repeated NAK is one the requester
/// may have lost: rxe and softhca retransmit from its PSN again. The round trip is this
/// QP's own requester's, or the time from an earlier NAK to the packet it asked for;
/// with neither measured yet, the NAK is not repeated. Silence, not a fixed time after
/// the NAK, decides: on the testbed's slow, queueing links a retransmission arrived
/// many round trips after its NAK, and repeating it there cost a go-back-N each time.
pub(crate) const MAX_NAK_REPEATS: u8 = 2;
/// A gap this many packets old is a loss: NAK it (once), as IBTA C9-88 would at once.
const OOO_NAK_AFTER: i32 = 128;
/// Most bytes of kept requests over all QPs of a device.
pub(crate) const DEVICE_OOO_BYTES: usize = 16 << 20;

enum Fail {
    /// NAK with this syndrome; RC responder QP goes to ERR (rxe class C/D errors).
    Nak(u8),
    /// Receive WQE failed locally: complete it with this status and NAK.
    Local(WcStatus, u8),
    /// Silently drop.
    Drop,
}

impl Qp {
    fn queue_ack(&mut self, psn: u32, syndrome: u8) {
        let msn = self.resp.msn;
        // Coalesce: a plain ACK still waiting to go out is superseded by a newer one
        // (ACKs are cumulative, IBTA 9.7.5.1.2).
        if syndrome == crate::packet::syndrome::ACK {
            if let Some(RespOut::Ack {
                syndrome: s,
                psn: p,
                msn: m,
            }) = self.resp.out.back_mut()
            {
                if *s == crate::packet::syndrome::ACK {
                    *p = psn;
                    *m = msn;
                    return;
                }
            }
        }
        self.resp.out.push_back(RespOut::Ack { psn, syndrome, msn });
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
    pub fn on_request(&mut self, ctx: &mut Ctx<'_>, h: &PktHdr, payload: &[u8], meta: &RxMeta) {
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

    fn on_rc(&mut self, ctx: &mut Ctx<'_>, h: &PktHdr, payload: &[u8]) {
        self.resp.last_rx_at = ctx.now;
        let d = psn_diff(h.psn, self.resp.epsn);
        if d > 0 {
            ctx.counters.out_of_seq_request += 1;
            // Reordering tolerance. IBTA C9-88 has the responder NAK the first
            // out-of-sequence packet and drop until the expected one comes, which is
            // right on an in-order fabric; but a UDP path can reorder (ECMP, bonding,
            // VMs, the fault testbed's jitter), and then every reordering costs a
            // go-back-N of the whole window: at 20 us of jitter a WRITE stream fell to
            // 0.02 Gb/s. So a packet that arrives a little early is kept (bounded per
            // QP and per device) and executed when the gap before it fills; the NAK
            // goes out only once the gap is OOO_NAK_AFTER packets old (a loss, not a
            // reordering) or nothing more can be kept. The requester sees the standard
            // protocol: ACKs, and at most one sequence NAK per gap.
            let epsn = self.resp.epsn;
            let kept = d < OOO_WINDOW
                && self.resp.ooo.len() < OOO_MAX
                && ctx.budget.ooo_bytes + payload.len() <= DEVICE_OOO_BYTES
                && match self
                    .resp
                    .ooo
                    .binary_search_by(|(k, _)| psn_diff(k.psn, epsn).cmp(&d))
                {
                    Ok(_) => true, // a duplicate of one already kept
                    Err(i) => {
                        // Accounted into budget.ooo_bytes by the engine's sync after
                        // this packet (within one packet, the check above may lag).
                        self.resp.ooo.insert(i, (*h, payload.to_vec()));
                        self.resp.ooo_bytes += payload.len();
                        ctx.counters.ooo_buffered += 1;
                        true
                    }
                };
            if !self.resp.nak_sent {
                if !kept || d >= OOO_NAK_AFTER {
                    self.nak_gap(ctx);
                } else if self.resp.gap_nak_at.is_none() {
                    self.resp.gap_nak_at = Some(ctx.now + OOO_NAK_DELAY_NS);
                }
            }
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
        // Execute the kept packets the gap was holding back, in PSN order.
        while !self.resp.ooo.is_empty() && self.state != QpState::Err {
            let epsn = self.resp.epsn;
            // Kept packets the in-order path has passed (their PSNs arrived again and
            // executed, or a multi-packet message moved epsn on) are stale.
            while let Some((k, _)) = self.resp.ooo.front() {
                if psn_diff(k.psn, epsn) >= 0 {
                    break;
                }
                if let Some((_, p)) = self.resp.ooo.pop_front() {
                    self.resp.ooo_bytes -= p.len();
                }
            }
            if self.resp.ooo.front().is_none_or(|(k, _)| k.psn != epsn) {
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
            self.resp.gap_nak_at = Some(ctx.now + OOO_NAK_DELAY_NS);
        }
    }

    /// The PSN-sequence NAK for the gap at `epsn` (IBTA C9-88; repeated at most
    /// `MAX_NAK_REPEATS` times while the gap stays open).
    fn nak_gap(&mut self, ctx: &mut Ctx<'_>) {
        if !self.resp.nak_sent {
            self.resp.nak_at = ctx.now;
        }
        self.resp.nak_sent = true;
        let rtt = self.req.srtt.max(self.resp.nak_rtt);
        self.resp.gap_nak_at = if self.resp.nak_repeats < MAX_NAK_REPEATS {
            quiet_wait(rtt, self.resp.nak_repeats).map(|w| ctx.now + w)
        } else {
            None
        };
        ctx.counters.seq_err_naks += 1;
        let e = self.resp.epsn;
        self.queue_ack(e, syndrome::NAK_PSN_SEQ);
    }

    /// The reorder timer: a gap still open after `OOO_NAK_DELAY_NS` is a loss.
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
    fn in_order(&mut self, ctx: &mut Ctx<'_>, h: &PktHdr, payload: &[u8]) {
        match self.execute(ctx, h, payload) {
            Ok(()) => {}
            Err(Fail::Drop) => {}
            Err(Fail::Nak(s)) => self.nak_and_fail(ctx, h.psn, s),
            Err(Fail::Local(status, s)) => {
                if let Some(InMsg::Send { wqe, .. }) = self.resp.cur.take() {
                    let wc = self.recv_completion(ctx, wqe.wr_id, status, WcOpcode::Recv);
                    self.post_completion(ctx, false, wc);
                }
                self.nak_and_fail(ctx, h.psn, s)
            }
        }
    }

    fn nak_and_fail(&mut self, ctx: &mut Ctx<'_>, psn: u32, s: u8) {
        match s {
            syndrome::NAK_REMOTE_ACCESS => ctx.counters.sent_remote_access_err_naks += 1,
            syndrome::NAK_INVALID_REQUEST => ctx.counters.sent_invalid_request_naks += 1,
            _ => {}
        }
        self.resp.cur = None;
        self.queue_ack(psn, s);
        // rxe: after a class C/D error the responder QP moves to ERR once the NAK is
        // out. The NAK stays queued: flush keeps the ACK stream (see enter_error_keep_out).
        let out = std::mem::take(&mut self.resp.out);
        self.enter_error(ctx);
        ctx.events.push_back(if s == syndrome::NAK_REMOTE_ACCESS {
            AsyncEvent::QpAccessErr(self.qpn_t())
        } else {
            AsyncEvent::QpReqErr(self.qpn_t())
        });
        self.resp.out = out;
    }

    fn on_duplicate(&mut self, ctx: &mut Ctx<'_>, h: &PktHdr) {
        let base = h.opcode & 0x1f;
        match base {
            op::READ_REQUEST => {
                // Re-execute from the responder resource that covers the PSN (IBTA
                // 9.7.5.1.x): the retried request may resume mid-way.
                let range = self.resp.res.iter().find_map(|r| match r {
                    RdRes::Read {
                        first_psn,
                        last_psn,
                    } if psn_diff(h.psn, *first_psn) >= 0 && psn_diff(h.psn, *last_psn) <= 0 => {
                        Some((*first_psn, *last_psn))
                    }
                    _ => None,
                });
                let Some((va, rkey, len)) = h.reth else {
                    return;
                };
                let Some((first, last)) = range else { return };
                if self
                    .check_remote(ctx, rkey, va, u64::from(len), AccessFlags::REMOTE_READ)
                    .is_err()
                {
                    return;
                }
                // The retry supersedes a response to the same READ still queued (only
                // that one: responses to other READs must still go out).
                self.resp.out.retain(|o| {
                    !matches!(o, RespOut::Read { psn, .. }
                        if psn_diff(*psn, first) >= 0 && psn_diff(*psn, last) <= 0)
                });
                self.resp.out.push_back(RespOut::Read {
                    psn: h.psn,
                    rkey,
                    va,
                    remaining: u64::from(len),
                    first: true,
                    msn: self.resp.msn,
                });
            }
            op::CMP_SWAP | op::FETCH_ADD => {
                // Replay the saved result; never execute twice (IBTA C9-...).
                let saved = self.resp.res.iter().find_map(|r| match r {
                    RdRes::Atomic { psn, orig } if *psn == h.psn => Some(*orig),
                    _ => None,
                });
                if let Some(orig) = saved {
                    let msn = self.resp.msn;
                    self.resp.out.push_back(RespOut::AtomicAck {
                        psn: h.psn,
                        orig,
                        msn,
                    });
                }
            }
            _ => {
                // SEND/WRITE: acknowledge again, cumulatively (rxe: ACK epsn - 1).
                let p = psn_add(self.resp.epsn, 0xff_ffff);
                self.queue_ack(p, syndrome::ACK);
            }
        }
    }

    fn check_remote(
        &self,
        ctx: &Ctx<'_>,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), Fail> {
        // The QP's own access flags gate remote operations first (IBTA 10.2.4.x).
        if !self.attr.qp_access_flags.contains(need) {
            return Err(Fail::Nak(syndrome::NAK_REMOTE_ACCESS));
        }
        if len == 0 {
            return Ok(());
        }
        ctx.mem
            .check_remote((self.init.pd, self.qpn), rkey, va, len, need)
            .map_err(|_| Fail::Nak(syndrome::NAK_REMOTE_ACCESS))
    }

    /// Check the opcode sequence against the message in progress (IBTA 9.8.3.x).
    fn sequence_ok(&self, base: u8) -> bool {
        let mid = matches!(
            base,
            op::SEND_MIDDLE | op::SEND_LAST | op::SEND_LAST_IMM | op::SEND_LAST_INV
        );
        let wmid = matches!(base, op::WRITE_MIDDLE | op::WRITE_LAST | op::WRITE_LAST_IMM);
        match self.resp.cur {
            Some(InMsg::Send { .. }) => mid,
            Some(InMsg::Write { .. }) => wmid,
            None => !mid && !wmid,
        }
    }

    /// Execute an in-sequence RC/UC request.
    fn execute(&mut self, ctx: &mut Ctx<'_>, h: &PktHdr, payload: &[u8]) -> Result<(), Fail> {
        let base = h.opcode & 0x1f;
        let rc = self.is_rc();
        if !self.sequence_ok(base) {
            return Err(if rc {
                Fail::Nak(syndrome::NAK_INVALID_REQUEST)
            } else {
                Fail::Drop
            });
        }
        let mtu = self.mtu(ctx.cfg);
        let n = payload.len() as u64;
        let is_first = matches!(
            base,
            op::SEND_FIRST
                | op::SEND_ONLY
                | op::SEND_ONLY_IMM
                | op::SEND_ONLY_INV
                | op::WRITE_FIRST
                | op::WRITE_ONLY
                | op::WRITE_ONLY_IMM
        );
        let is_last = !matches!(
            base,
            op::SEND_FIRST | op::SEND_MIDDLE | op::WRITE_FIRST | op::WRITE_MIDDLE
        );
        // Packet length rules: FIRST/MIDDLE carry exactly the PMTU, LAST/ONLY at most
        // (IBTA C9-... ; rxe check_length).
        let len_ok = if is_last { n <= mtu } else { n == mtu };
        match base {
            op::SEND_FIRST
            | op::SEND_MIDDLE
            | op::SEND_LAST
            | op::SEND_LAST_IMM
            | op::SEND_ONLY
            | op::SEND_ONLY_IMM
            | op::SEND_LAST_INV
            | op::SEND_ONLY_INV => {
                if !len_ok {
                    return Err(if rc {
                        Fail::Nak(syndrome::NAK_INVALID_REQUEST)
                    } else {
                        Fail::Drop
                    });
                }
                if is_first {
                    let Some((wqe, from_srq)) = self.take_recv(ctx) else {
                        return self.rnr(ctx, h.psn);
                    };
                    self.resp.cur = Some(InMsg::Send {
                        wqe,
                        from_srq,
                        off: 0,
                    });
                }
                let pd = self.init.pd;
                let Some(InMsg::Send { wqe, off, .. }) = &mut self.resp.cur else {
                    return Err(Fail::Drop);
                };
                let total: u64 = wqe.sg_list.iter().map(|s| u64::from(s.length)).sum();
                if *off + n > total {
                    return Err(Fail::Local(
                        WcStatus::LocLenErr,
                        syndrome::NAK_INVALID_REQUEST,
                    ));
                }
                if n > 0
                    && ctx
                        .mem
                        .scatter(pd, &wqe.sg_list, *off as usize, payload)
                        .is_err()
                {
                    return Err(Fail::Local(WcStatus::LocProtErr, syndrome::NAK_REMOTE_OP));
                }
                *off += n;
                if is_last {
                    let Some(InMsg::Send { wqe, off, .. }) = self.resp.cur.take() else {
                        return Err(Fail::Drop);
                    };
                    let mut wc =
                        self.recv_completion(ctx, wqe.wr_id, WcStatus::Success, WcOpcode::Recv);
                    wc.byte_len = off as u32;
                    if let Some(imm) = h.imm {
                        wc.imm_data = imm;
                        wc.wc_flags |= WcFlags::WITH_IMM;
                    }
                    if let Some(rkey) = h.ieth {
                        wc.imm_data = rkey;
                        wc.wc_flags |= WcFlags::WITH_INV;
                    }
                    self.post_completion(ctx, false, wc);
                }
            }
            op::WRITE_FIRST
            | op::WRITE_MIDDLE
            | op::WRITE_LAST
            | op::WRITE_LAST_IMM
            | op::WRITE_ONLY
            | op::WRITE_ONLY_IMM => {
                if !len_ok {
                    return Err(if rc {
                        Fail::Nak(syndrome::NAK_INVALID_REQUEST)
                    } else {
                        Fail::Drop
                    });
                }
                if is_first {
                    let Some((va, rkey, len)) = h.reth else {
                        return Err(Fail::Drop);
                    };
                    let len = u64::from(len);
                    if let Err(e) = self.check_remote(ctx, rkey, va, len, AccessFlags::REMOTE_WRITE)
                    {
                        return Err(if rc { e } else { Fail::Drop });
                    }
                    self.resp.cur = Some(InMsg::Write {
                        rkey,
                        va,
                        remaining: len,
                        total: len,
                    });
                }
                let Some(InMsg::Write { remaining, .. }) = &self.resp.cur else {
                    return Err(Fail::Drop);
                };
                if n > *remaining || (is_last && n != *remaining) {
                    self.resp.cur = None;
                    return Err(if rc {
                        Fail::Nak(syndrome::NAK_INVALID_REQUEST)
                    } else {
                        Fail::Drop
                    });
                }
                let with_imm = h.imm.is_some();
                // WRITE with immediate consumes a receive WQE; without one, RNR before
                // any byte of this packet is placed.
                let recv = if with_imm {
                    match self.take_recv(ctx) {
                        Some(r) => Some(r),
                        None => return self.rnr(ctx, h.psn),
                    }
                } else {
                    None
                };
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
                    return Err(if rc {
                        Fail::Nak(syndrome::NAK_REMOTE_ACCESS)
                    } else {
                        Fail::Drop
                    });
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
                        wc.imm_data = h.imm.unwrap_or_default();
                        wc.wc_flags |= WcFlags::WITH_IMM;
                        self.post_completion(ctx, false, wc);
                    }
                }
            }
            op::READ_REQUEST if rc => {
                let Some((va, rkey, len)) = h.reth else {
                    return Err(Fail::Drop);
                };
                if self.attr.max_dest_rd_atomic == 0 {
                    return Err(Fail::Nak(syndrome::NAK_INVALID_REQUEST));
                }
                self.check_remote(ctx, rkey, va, u64::from(len), AccessFlags::REMOTE_READ)?;
                self.rd_atomic_room(ctx)?;
                let npkts = u64::from(len).div_ceil(mtu).max(1) as u32;
                self.push_res(RdRes::Read {
                    first_psn: h.psn,
                    last_psn: psn_add(h.psn, npkts - 1),
                });
                self.resp.msn = psn_add(self.resp.msn, 1);
                self.resp.out.push_back(RespOut::Read {
                    psn: h.psn,
                    rkey,
                    va,
                    remaining: u64::from(len),
                    first: true,
                    msn: self.resp.msn,
                });
                self.resp.epsn = psn_add(h.psn, npkts);
                self.resp.nak_sent = false;
                return Ok(());
            }
            op::CMP_SWAP | op::FETCH_ADD if rc => {
                let Some((va, rkey, swap_add, compare)) = h.atomic else {
                    return Err(Fail::Drop);
                };
                if self.attr.max_dest_rd_atomic == 0 {
                    return Err(Fail::Nak(syndrome::NAK_INVALID_REQUEST));
                }
                // rxe: a misaligned atomic is an invalid request, not an access error.
                if va % 8 != 0 {
                    return Err(Fail::Nak(syndrome::NAK_INVALID_REQUEST));
                }
                self.check_remote(ctx, rkey, va, 8, AccessFlags::REMOTE_ATOMIC)?;
                self.rd_atomic_room(ctx)?;
                let aop = if base == op::CMP_SWAP {
                    crate::deps::AtomicOp::CompareSwap {
                        compare,
                        swap: swap_add,
                    }
                } else {
                    crate::deps::AtomicOp::FetchAdd { add: swap_add }
                };
                let orig = ctx
                    .mem
                    .remote_atomic((self.init.pd, self.qpn), rkey, va, aop)
                    .map_err(|_| Fail::Nak(syndrome::NAK_REMOTE_ACCESS))?;
                self.push_res(RdRes::Atomic { psn: h.psn, orig });
                self.resp.msn = psn_add(self.resp.msn, 1);
                let msn = self.resp.msn;
                self.resp.out.push_back(RespOut::AtomicAck {
                    psn: h.psn,
                    orig,
                    msn,
                });
                self.resp.epsn = psn_add(h.psn, 1);
                self.resp.nak_sent = false;
                return Ok(());
            }
            _ => {
                return Err(if rc {
                    Fail::Nak(syndrome::NAK_INVALID_REQUEST)
                } else {
                    Fail::Drop
                });
            }
        }
        self.resp.epsn = psn_add(h.psn, 1);
        self.resp.nak_sent = false;
        if is_last {
            self.resp.msn = psn_add(self.resp.msn, 1);
        }
        if rc && h.ack_req {
            self.queue_ack(h.psn, syndrome::ACK);
        } else if rc {
            ctx.counters.ack_deferred += 1;
        }
        Ok(())
    }

    fn rnr(&mut self, ctx: &mut Ctx<'_>, psn: u32) -> Result<(), Fail> {
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
        let code = self.attr.min_rnr_timer & 0x1f;
        self.queue_ack(psn, syndrome::RNR_NAK | code);
        Err(Fail::Drop)
    }

    /// Responder resources (IBTA 9.5.x: max_dest_rd_atomic): a requester keeps at most
    /// that many READ/atomic requests outstanding, so several times more responses
    /// than that waiting to go out means a flood. The extra request is dropped before it executes (its
    /// PSN is not consumed; a real requester resends it after its timeout), so the
    /// response queue, and the memory behind it, stays bounded.
    fn rd_atomic_room(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Fail> {
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

    fn on_uc(&mut self, ctx: &mut Ctx<'_>, h: &PktHdr, payload: &[u8]) {
        let base = h.opcode & 0x1f;
        let starts = matches!(
            base,
            op::SEND_FIRST
                | op::SEND_ONLY
                | op::SEND_ONLY_IMM
                | op::WRITE_FIRST
                | op::WRITE_ONLY
                | op::WRITE_ONLY_IMM
        );
        if h.psn != self.resp.epsn || self.resp.uc_resync {
            // UC (IBTA 9.7.x): a gap kills the message in progress; the receive WQE is
            // reused for the next message. Resume at the next FIRST/ONLY.
            if let Some(InMsg::Send { wqe, from_srq, .. }) = self.resp.cur.take() {
                self.return_recv(ctx, wqe, from_srq);
            }
            self.resp.cur = None;
            if !starts {
                self.resp.uc_resync = true;
                self.resp.epsn = psn_add(h.psn, 1);
                ctx.counters.out_of_seq_request += 1;
                return;
            }
            self.resp.uc_resync = false;
            self.resp.epsn = h.psn;
        }
        if let Err(Fail::Local(status, _)) = self.execute(ctx, h, payload) {
            if let Some(InMsg::Send { wqe, .. }) = self.resp.cur.take() {
                let wc = self.recv_completion(ctx, wqe.wr_id, status, WcOpcode::Recv);
                self.post_completion(ctx, false, wc);
            }
            self.resp.uc_resync = true;
        }
        if self.resp.epsn == h.psn {
            // Dropped (no WQE / bad request): skip the rest of this message.
            if let Some(InMsg::Send { wqe, from_srq, .. }) = self.resp.cur.take() {
                self.return_recv(ctx, wqe, from_srq);
            }
            self.resp.cur = None;
            self.resp.uc_resync = true;
            self.resp.epsn = psn_add(h.psn, 1);
        }
    }

    fn on_ud(&mut self, ctx: &mut Ctx<'_>, h: &PktHdr, payload: &[u8], meta: &RxMeta) {
        let Some((qkey, src_qp)) = h.deth else { return };
        if qkey != self.attr.qkey {
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
            src_qp,
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
        if let Some(imm) = h.imm {
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
    let udp_total = meta.udp_len + 8;
    match (meta.src, meta.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = &mut g[20..40];
            ip[0] = 0x45;
            let tot = (udp_total + 20) as u16;
            ip[2..4].copy_from_slice(&tot.to_be_bytes());
            ip[6] = 0x40; // DF
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let mut sum: u32 = 0;
            for c in ip.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        (s, d) => {
            let s6 = match s {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            let d6 = match d {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            g[0] = 0x60;
            g[4..6].copy_from_slice(&(udp_total as u16).to_be_bytes());
            g[6] = 17;
            g[7] = 64;
            g[8..24].copy_from_slice(&s6.octets());
            g[24..40].copy_from_slice(&d6.octets());
        }
    }
    g
}
