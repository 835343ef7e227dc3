//! Requester: turns send WQEs into packets (segmentation at the path MTU, PSN
//! assignment, AckReq placement), enforces the READ/atomic and fence rules, and
//! rewinds for retransmission.

use std::net::{IpAddr, SocketAddr};

use softhca_wire::{
    crc32_extend, pad_count, Aeth, AtomicAckEth, AtomicEth, Bth, Deth, Headers, NakCode, Opcode,
    Position, Reth, Transport,
};

use crate::config::EngineConfig;
use crate::datagram::TailCrc;
use crate::multipath::Resend;
use crate::path::Path;
use crate::qp::{Ctx, Qp, RespOut, SendWqe};
use crate::recovery::{LossCause, LossRecovery};
use crate::timers::ack_timeout_ns;
use crate::verbs::*;
use softhca_memory::External;

/// Most PSNs in flight before the requester waits for ACKs (rxe: RXE_MAX_UNACKED_PSNS).
pub(crate) const MAX_UNACKED_PSNS: i32 = 1024;
/// Ask for an ACK at least this often inside long messages (rxe: RXE_MAX_PKT_PER_ACK).
pub(crate) const ACK_EVERY: u32 = 32;
/// Doublings of the retransmit timeout after timeouts in a row (see `rto_deadline`).
pub(crate) const MAX_RTO_BACKOFF: u8 = 3;
/// The least round trip a lost retransmission is judged by (`Qp::on_held`): a hole the
/// responder still reports twice that long after the pass over the holes began.
const MIN_HELD_RTT_NS: Nanos = 1_000_000;

/// Where the next packet of a QP comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxSource {
    /// The responder's output queue (ACK/NAK, READ response, atomic ACK).
    Responder,
    /// The send queue.
    Requester,
}

/// Smallest payload left in registered memory by a zero-copy build: copying a few
/// hundred bytes costs less than the kernel's walk over three iovecs instead of one.
const IN_PLACE_MIN: usize = 512;

/// Where a request packet's payload goes in a zero-copy build.
enum InPlace {
    /// Left in registered memory.
    Left(External),
    /// Copied into the transmit buffer (inline data, or it spans SGEs).
    Copy,
}

/// What [`Qp::build_placed`] wrote: `in_buf` bytes of `buf`; with `external`, the
/// packet is `buf[..head]`, then the external payload, then `buf[head..in_buf]` (pad).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Built {
    pub in_buf: usize,
    pub head: usize,
    pub external: Option<External>,
    /// The CRC of the payload and pad, when taken as the payload was copied in.
    pub tail_crc: Option<TailCrc>,
}

/// The next packet of a QP, decided but not yet written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxPlan {
    pub source: TxSource,
    /// The packet's headers, its BTH pad count set for `payload_len`.
    pub hdr: Headers,
    pub payload_len: usize,
    pub src: IpAddr,
    pub dst: SocketAddr,
    pub sport: u16,
    /// The IP header's TOS / traffic class.
    pub tos: u8,
    /// Multipath: the index of the path in the QP's path table (0 otherwise).
    pub path: u8,
}

impl TxPlan {
    pub fn wire_len(&self) -> usize {
        self.hdr.packet_len(self.payload_len)
    }

    /// What this request packet takes from the congestion pacer: a READ request the
    /// responses it asks for, which take the path's rate (the window counts their PSNs
    /// too). Paced by its own few bytes, a window of READs left at once and their
    /// responses came back as one burst, whose queue at the bottleneck ended slow start
    /// at half a 10 ms path's window.
    pub fn paced_len(&self) -> u64 {
        let own = self.wire_len() as u64;
        match self.hdr.reth {
            Some(r) if self.hdr.bth.opcode.is_read_request() => own.max(r.dma_len.into()),
            _ => own,
        }
    }
}

/// Headers for a packet to `dqpn` with this opcode and PSN (default P_Key, pad count
/// for `payload_len`); the caller adds the extension headers the opcode carries.
fn headers(opcode: Opcode, dqpn: u32, psn: Psn, payload_len: usize) -> Headers {
    let mut h = Headers::new(Bth::new(opcode, Qpn::new(dqpn), psn));
    h.bth.pad_count = pad_count(payload_len);
    h
}

impl Qp {
    /// True if `plan` would return something (used to keep the ready queue honest).
    pub fn has_output(&mut self, ctx: &mut Ctx<'_>) -> bool {
        self.plan(ctx).is_some()
    }

    /// Request PSNs the next WQE to start will take (at least 1): what the device budget
    /// must have room for to let it go.
    pub fn next_wqe_psns(&self, cfg: &EngineConfig) -> u32 {
        self.req
            .sq
            .get(self.req.send_idx)
            .map_or(1, |w| w.psns_at(self.start_mtu(cfg)))
    }

    /// Request PSNs this QP counts against the device budget: those sent and not yet
    /// acknowledged, while it can still send. A QP in timeout recovery (its peer may be
    /// gone) counts none, so a dead peer cannot hold every other connection of the
    /// device back for its whole retry budget.
    pub fn inflight_psns(&self) -> u32 {
        let sending = matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe);
        if self.init.qp_type != QpType::Rc || !sending || self.req.retry_left < self.attr.retry_cnt
        {
            return 0;
        }
        self.req.next_psn.diff(self.req.una).max(0) as u32
    }

    /// Nothing to send but ACKs (no request packet, no READ or atomic response).
    pub fn only_acks_to_send(&self) -> bool {
        self.req.send_idx >= self.req.sq.len()
            && self
                .resp
                .out
                .iter()
                .all(|o| matches!(o, RespOut::Ack { .. }))
    }

    /// Decide the next packet of this QP. Responder output goes first: ACKs are small
    /// and unblock the peer, READ responses are ordered with them (but a lone ACK may
    /// wait behind one request packet, see below).
    pub fn plan(&mut self, ctx: &mut Ctx<'_>) -> Option<TxPlan> {
        if self.state == QpState::Err {
            // Only the final NAK of a responder error can still be queued.
            return self.plan_response(ctx);
        }
        if !matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            return None;
        }
        if let Some(p) = self.plan_response(ctx) {
            // A lone ACK goes behind one request packet of this QP that is ready: the
            // two then leave as one GSO send, the ACK as the shorter last segment (an
            // answer and the ACK of the request it answers: a ping-pong's every step),
            // and reach a peer's GRO socket as one datagram. The kernel's cost per
            // datagram, not our work, is most of a small message's latency here.
            let lone_ack = self.resp.out.len() == 1 && p.hdr.bth.opcode == Opcode::RC_ACKNOWLEDGE;
            if lone_ack && !self.ack_behind {
                if let Some(r) = self.plan_request(ctx) {
                    if r.wire_len() >= p.wire_len() {
                        self.ack_behind = true;
                        return Some(r);
                    }
                }
            }
            self.ack_behind = false;
            return Some(p);
        }
        self.ack_behind = false;
        self.plan_request(ctx)
    }

    fn plan_response(&mut self, ctx: &mut Ctx<'_>) -> Option<TxPlan> {
        let item = *self.resp.out.front()?;
        let dqpn = self.attr.dest_qp_num;
        let (hdr, payload_len) = match item {
            RespOut::Ack { psn, aeth } => {
                let mut h = headers(Opcode::RC_ACKNOWLEDGE, dqpn, psn, 0);
                h.aeth = Some(aeth);
                (h, 0)
            }
            RespOut::Read {
                psn,
                remaining,
                first,
                msn,
                mtu,
                ..
            } => {
                if !self.cc_allows_response(ctx) {
                    return None;
                }
                let n = remaining.min(mtu);
                let last = n == remaining;
                let op = Opcode::read_response(Position::from_ends(first, last));
                let mut h = headers(op, dqpn, psn, n as usize);
                if first || last {
                    h.aeth = Some(Aeth::ack(msn, Aeth::CREDITS_INVALID));
                }
                (h, n as usize)
            }
            RespOut::AtomicAck { psn, orig, msn } => {
                let mut h = headers(Opcode::RC_ATOMIC_ACKNOWLEDGE, dqpn, psn, 0);
                h.aeth = Some(Aeth::ack(msn, Aeth::CREDITS_INVALID));
                h.atomic_ack_eth = Some(AtomicAckEth { orig });
                (h, 0)
            }
        };
        let path = if self.mp_active() {
            self.mp_response_path(!hdr.bth.opcode.is_read_response())
        } else {
            *self.path.for_psn(hdr.bth.psn)
        };
        Some(TxPlan {
            source: TxSource::Responder,
            hdr,
            payload_len,
            src: path.src,
            dst: path.dst,
            sport: path.sport,
            tos: path.tos,
            path: 0,
        })
    }

    fn plan_request(&mut self, ctx: &mut Ctx<'_>) -> Option<TxPlan> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.rnr_wait.is_some() {
            return None;
        }
        self.req.resend_at = None;
        if self.mp_active() {
            match self.mp_plan_resend(ctx) {
                Resend::Plan(p) => return Some(p),
                Resend::Blocked => return None,
                Resend::None => {}
            }
        }
        self.skip_held(ctx);
        let idx = self.req.send_idx;
        let next_psn = self.req.next_psn;
        let w = self.req.sq.get_mut(idx)?;
        if w.status.is_some() {
            // Halted at a local error: it completes when it reaches the head.
            return None;
        }
        if w.is_local_op() {
            // Executed when posted; it takes no PSN and completes in order.
            w.started = true;
            w.done = true;
            w.first_psn = next_psn;
            self.req.send_idx += 1;
            self.req.send_off = 0;
            self.complete_sends(ctx);
            return self.plan_request(ctx);
        }
        // Congestion control first: a WQE that starts takes its PSNs from the device
        // budget at once, so one the window holds back must not start yet.
        let (psn, takes_to) = self.next_request_psns(ctx.cfg, idx)?;
        if !self.cc_allows_request(ctx, psn, takes_to) {
            return None;
        }
        if !self.req.sq.get(idx)?.started {
            self.start_wqe(ctx, idx)?;
        }
        let ty = self.init.qp_type;
        let w = self.req.sq.get(idx)?;
        let off = self.req.send_off;
        let psn = w.psn_at(off);
        let msg_last = w.last_psn();
        let at = PacketAt {
            tr: ty.transport(),
            off,
            mtu: w.mtu,
            split: self.splits_writes(ctx.cfg),
            dqpn: self.attr.dest_qp_num,
            psn,
        };
        let (mut hdr, payload_len, last) = w.request_at(&at)?;
        let mut path_idx = 0;
        let path = if ty == QpType::Ud {
            let ud = w.wr.ud.unwrap_or_default();
            self.address_ud(ctx.cfg, &ud, &mut hdr)?
        } else if self.mp_active() {
            let (i, p) = self.mp_request_path(ctx.now)?;
            path_idx = i;
            p
        } else {
            *self.path.for_psn(psn)
        };
        if ty == QpType::Rc {
            // Coalesced ACKs: ask on the last packet of a message, and periodically in
            // long ones, and when the window is about to close.
            // With congestion control: also on the last packet the window lets go, and
            // twice per window, so that a small window is acknowledged before it
            // closes, and the window gets round-trip samples.
            let every = self.cc_ack_every(ctx.cfg).min(ACK_EVERY);
            hdr.bth.ack_req = last
                || self.req.pkts_since_ack_req + 1 >= every
                || self.cc_window_closes_at(ctx.cfg, psn, path_idx)
                || self.cc_first_request(ctx.cfg, psn, msg_last)
                || psn.diff(self.req.una) + 1 >= MAX_UNACKED_PSNS;
        }
        Some(TxPlan {
            source: TxSource::Requester,
            hdr,
            payload_len,
            src: path.src,
            dst: path.dst,
            sport: path.sport,
            tos: path.tos,
            path: path_idx,
        })
    }

    /// A UD send's path (from the WR's address vector) and its BTH destination QP and
    /// DETH.
    fn address_ud(&self, cfg: &EngineConfig, ud: &UdDest, hdr: &mut Headers) -> Option<Path> {
        let path = Path::resolve(cfg, &ud.av, self.qpn)?;
        hdr.bth.dest_qp = Qpn::new(ud.remote_qpn);
        // IBTA 10.2.4: a WR Q_Key with the high bit set means "use the QP's Q_Key".
        let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
            self.attr.qkey
        } else {
            ud.remote_qkey
        };
        hdr.deth = Some(Deth {
            qkey,
            src_qp: Qpn::new(self.qpn),
        });
        Some(path)
    }

    /// A selective resend of `psn`, a packet of WQE `idx` (SEND or WRITE), on path
    /// `path`: planned like the original, its position kept in `req.resend_at` for the
    /// build, the send position left where it is.
    pub(crate) fn plan_at(
        &mut self,
        ctx: &mut Ctx<'_>,
        idx: usize,
        psn: Psn,
        path: usize,
    ) -> Option<TxPlan> {
        let w = self.req.sq.get(idx)?;
        let off = w.offset_of(psn);
        let at = PacketAt {
            tr: self.init.qp_type.transport(),
            off,
            mtu: w.mtu,
            split: self.splits_writes(ctx.cfg),
            dqpn: self.attr.dest_qp_num,
            psn,
        };
        let (mut hdr, payload_len, _) = w.request_at(&at)?;
        // Asked for at once: a resend's acknowledgement ends the recovery.
        hdr.bth.ack_req = true;
        let p = self.mp.as_deref()?.paths.get(path)?.path;
        self.req.resend_at = Some((idx, off));
        Some(TxPlan {
            source: TxSource::Requester,
            hdr,
            payload_len,
            src: p.src,
            dst: p.dst,
            sport: p.sport,
            tos: p.tos,
            path: path as u8,
        })
    }

    /// The WQE and byte offset the packet being built comes from: a selective resend's,
    /// or the send position.
    fn cursor(&self) -> (usize, u64) {
        self.req
            .resend_at
            .unwrap_or((self.req.send_idx, self.req.send_off))
    }

    /// The PSN of WQE `idx`'s next request packet (for one not started: the PSN it
    /// would get), and the last PSN that packet takes (a READ request: its last
    /// response's).
    fn next_request_psns(&self, cfg: &EngineConfig, idx: usize) -> Option<(Psn, Psn)> {
        let w = self.req.sq.get(idx)?;
        let psn = if w.started {
            w.psn_at(self.req.send_off)
        } else {
            self.req.next_psn
        };
        let takes_to = match w.wr.opcode {
            WrOpcode::RdmaRead if w.started => w.last_psn(),
            WrOpcode::RdmaRead => psn.add(w.psns_at(self.start_mtu(cfg)) - 1),
            _ => psn,
        };
        Some((psn, takes_to))
    }

    /// Give WQE `idx` its PSNs, if the window, the device budget, the READ/atomic limit
    /// and fences let it start now; None if it must wait or failed a local check (then
    /// its status says why).
    fn start_wqe(&mut self, ctx: &mut Ctx<'_>, idx: usize) -> Option<()> {
        if self.state != QpState::Rts {
            // SQD: no new WQE starts (IBTA 10.3.1.x); outstanding ones finish.
            return None;
        }
        let ty = self.init.qp_type;
        let mtu = self.mtu(ctx.cfg);
        let wqe_mtu = self.start_mtu(ctx.cfg);
        let max_rd = u32::from(self.attr.max_rd_atomic.max(1));
        let rd_inflight = self.req.rd_atomic_inflight;
        let unacked = self.req.next_psn.diff(self.req.una);
        let reported = self.reported_inflight;
        let pd = self.init.pd;
        let w = self.req.sq.get_mut(idx)?;
        if ty == QpType::Rc {
            if unacked >= MAX_UNACKED_PSNS {
                return None;
            }
            if !ctx.budget.allows(reported, unacked.max(0) as u32) {
                ctx.budget.hit = true;
                return None;
            }
            if w.is_rd_atomic() && rd_inflight >= max_rd {
                return None;
            }
            // IBV_SEND_FENCE: wait for every earlier READ/atomic to complete.
            if w.wr.flags.contains(SendFlags::FENCE) && rd_inflight > 0 {
                return None;
            }
        }
        if ty == QpType::Ud && w.len > mtu {
            // rxe: a UD message must fit one packet.
            w.status = Some(WcStatus::LocQpOpErr);
            return None;
        }
        if let Payload::Sges(sges) = &w.wr.payload {
            // Check every lkey before the first packet leaves (rxe reports a bad
            // lkey as IBV_WC_LOC_PROT_ERR on that WQE). READ and atomic results
            // are written locally, so they need LOCAL_WRITE.
            if ctx.mem.validate_sges(pd, sges, w.is_rd_atomic()).is_err() {
                w.status = Some(WcStatus::LocProtErr);
                return None;
            }
        }
        let npkts = w.psns_at(wqe_mtu);
        w.mtu = wqe_mtu;
        self.req.pkt_bytes = wqe_mtu;
        w.started = true;
        w.sent_at = ctx.now;
        w.rtt_sample = true;
        w.first_psn = self.req.next_psn;
        w.read_next_psn = w.first_psn;
        w.npkts = npkts;
        self.req.next_psn = self.req.next_psn.add(npkts);
        if w.is_rd_atomic() {
            self.req.rd_atomic_inflight += 1;
        }
        Some(())
    }

    /// Write the planned packet (headers, payload, pad; no ICRC) into `buf` and advance.
    /// None if it could not be built (local error: the QP recorded it).
    ///
    /// With `in_place`, a request payload that lies in one SGE is left in registered
    /// memory: `buf` gets the headers then the pad, and the payload's address comes
    /// back (zero-copy send: the kernel copies it from the MR directly).
    pub fn build_placed(
        &mut self,
        ctx: &mut Ctx<'_>,
        plan: &TxPlan,
        buf: &mut [u8],
        in_place: bool,
    ) -> Option<Built> {
        let hl = plan.hdr.emit(buf).ok()?;
        let n = plan.payload_len;
        let pad = usize::from(plan.hdr.bth.pad_count);
        let body = buf.get_mut(hl..hl + n + pad)?;
        if in_place && n >= IN_PLACE_MIN && plan.source == TxSource::Requester {
            if let InPlace::Left(external) = self.payload_in_place(ctx, n)? {
                // The pad follows the headers in the buffer; the payload stays put.
                body.get_mut(..pad)?.fill(0);
                self.advance_request(ctx, plan);
                ctx.counters.sent_pkts += 1;
                return Some(Built {
                    in_buf: hl + pad,
                    head: hl,
                    external: Some(external),
                    tail_crc: None,
                });
            }
        }
        let (payload, pad_bytes) = body.split_at_mut(n);
        let mut tail_crc = None;
        match plan.source {
            TxSource::Responder => {
                match self.copy_read_response(ctx, payload, in_place) {
                    Ok(crc) => {
                        // The pad's zeros extend the CRC taken while copying.
                        let zeros = [0u8; 3];
                        tail_crc = crc.map(|c| TailCrc {
                            at: hl,
                            crc: crc32_extend(c, zeros.get(..pad).unwrap_or_default()),
                        });
                    }
                    Err(_) => {
                        // The MR went away after the request was checked: NAK instead.
                        self.resp.out.pop_front();
                        self.resp.out.push_front(RespOut::Ack {
                            psn: plan.hdr.bth.psn,
                            aeth: Aeth::nak(self.resp.msn, NakCode::RemoteAccessError),
                        });
                        return None;
                    }
                }
                self.advance_response(n as u64);
                if self.mp_active() {
                    self.mp_sent(ctx, plan, false, false);
                }
                let op = plan.hdr.bth.opcode;
                if op.is_read_response() {
                    self.cc_response_sent(
                        ctx,
                        plan.hdr.bth.psn,
                        plan.wire_len() as u64,
                        op.starts_message(),
                    );
                }
            }
            TxSource::Requester => {
                self.copy_request(ctx, payload)?;
                self.advance_request(ctx, plan);
            }
        }
        pad_bytes.fill(0);
        ctx.counters.sent_pkts += 1;
        Some(Built {
            in_buf: hl + n + pad,
            head: hl + n + pad,
            external: None,
            tail_crc,
        })
    }

    /// Whether the next `n` payload bytes of the WQE being sent lie in one SGE and can
    /// stay in registered memory; None after a bad lkey (the WQE records it: rxe
    /// `copy_data` completes it with IBV_WC_LOC_PROT_ERR).
    fn payload_in_place(&mut self, ctx: &mut Ctx<'_>, n: usize) -> Option<InPlace> {
        let pd = self.init.pd;
        let (idx, off) = self.cursor();
        let off = off as usize;
        let w = self.req.sq.get_mut(idx)?;
        let Payload::Sges(sges) = &w.wr.payload else {
            return Some(InPlace::Copy);
        };
        match ctx.mem.gather_in_place(pd, sges, off, n) {
            Ok(Some(external)) => Some(InPlace::Left(external)),
            Ok(None) => Some(InPlace::Copy), // spans SGEs
            Err(_) => {
                w.status = Some(WcStatus::LocProtErr);
                None
            }
        }
    }

    /// Copy the next READ response payload out of the responder's memory into
    /// `payload` (nothing for an ACK). Built for a gathered transmit (`with_crc`), the
    /// packet is sealed by the caller ([`crate::Transmit::seal`]): the payload is CRC'd
    /// as it is copied, and the seal hashes the headers only (see `TailCrc`).
    fn copy_read_response(
        &self,
        ctx: &Ctx<'_>,
        payload: &mut [u8],
        with_crc: bool,
    ) -> Result<Option<u32>, MemError> {
        let Some(RespOut::Read { rkey, va, .. }) = self.resp.out.front().copied() else {
            return Ok(None);
        };
        let pd = self.init.pd;
        if with_crc {
            ctx.mem
                .remote_read_crc((pd, self.qpn), rkey, va, payload)
                .map(Some)
        } else {
            ctx.mem
                .remote_read((pd, self.qpn), rkey, va, payload)
                .map(|()| None)
        }
    }

    /// Copy the next payload bytes of the WQE being sent into `payload`; None after a
    /// bad lkey (rxe: IBV_WC_LOC_PROT_ERR on the WQE, recorded here).
    fn copy_request(&mut self, ctx: &Ctx<'_>, payload: &mut [u8]) -> Option<()> {
        let pd = self.init.pd;
        let (idx, off) = self.cursor();
        let off = off as usize;
        let w = self.req.sq.get_mut(idx)?;
        match &w.wr.payload {
            _ if payload.is_empty() => {}
            Payload::Inline(b) => payload.copy_from_slice(b.get(off..off + payload.len())?),
            Payload::Sges(sges) => {
                if ctx.mem.gather(pd, sges, off, payload).is_err() {
                    w.status = Some(WcStatus::LocProtErr);
                    return None;
                }
            }
        }
        Some(())
    }

    fn advance_response(&mut self, n: u64) {
        let Some(front) = self.resp.out.front_mut() else {
            return;
        };
        match front {
            RespOut::Read {
                psn,
                va,
                remaining,
                first,
                ..
            } => {
                *psn = psn.next();
                *va = va.wrapping_add(n);
                *remaining -= n;
                *first = false;
                if *remaining == 0 {
                    self.resp.out.pop_front();
                }
            }
            _ => {
                self.resp.out.pop_front();
            }
        }
    }

    fn advance_request(&mut self, ctx: &mut Ctx<'_>, plan: &TxPlan) {
        if let Some((idx, _)) = self.req.resend_at.take() {
            // A selective resend: the send position stays.
            if let Some(w) = self.req.sq.get_mut(idx) {
                w.rtt_sample = false;
            }
            self.mp_sent(ctx, plan, true, false);
            let resent = (plan.hdr.bth.psn, plan.paced_len(), true);
            self.cc_request_sent(ctx.cfg, ctx.now, resent);
            self.req.last_retransmit_at = Some(ctx.now);
            if self.req.rto.is_none() {
                self.req.rto = self.rto_deadline(ctx.now);
            }
            return;
        }
        let ty = self.init.qp_type;
        let idx = self.req.send_idx;
        let n = plan.payload_len as u64;
        let Some(w) = self.req.sq.get_mut(idx) else {
            return;
        };
        if plan.hdr.bth.psn.is_before(self.req.max_sent) {
            w.rtt_sample = false;
        }
        // A READ request occupies the PSNs of all its responses.
        let next = if w.wr.opcode == WrOpcode::RdmaRead {
            w.last_psn().next()
        } else {
            plan.hdr.bth.psn.next()
        };
        let whole = match w.wr.opcode {
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => true,
            _ => {
                self.req.send_off += n;
                self.req.send_off >= w.len
            }
        };
        if whole {
            if ty != QpType::Rc {
                // UC/UD complete once sent (no ACKs).
                w.done = true;
            }
            self.req.send_idx += 1;
            self.req.send_off = 0;
            // A re-request (see `retransmit_from`) is out: on to the next READ with a
            // hole, or back to where sending was. A READ whose hole filled meanwhile
            // needs no re-request.
            while let Some((idx, off)) = self.req.probe_next.pop_front() {
                let last = self.req.probe_next.is_empty();
                if idx >= self.req.send_idx
                    && (last || self.req.sq.get(idx).is_some_and(|w| !w.done))
                {
                    self.req.send_idx = idx;
                    self.req.send_off = off;
                    break;
                }
            }
        }
        let ack_req = ty == QpType::Rc && plan.hdr.bth.ack_req;
        if self.mp_active() {
            // After the send position moved: whether anything is left to send.
            let app_limited = ack_req && self.req.send_idx >= self.req.sq.len();
            self.mp_sent(ctx, plan, false, app_limited);
        }
        let sent = (plan.hdr.bth.psn, plan.paced_len(), ack_req);
        self.cc_request_sent(ctx.cfg, ctx.now, sent);
        if next.is_after(self.req.max_sent) || ty != QpType::Rc {
            if self.mp.is_some() {
                self.req.held.on_new_sent(plan.hdr.bth.psn, ctx.now);
            }
            self.req.max_sent = next;
            self.req.sent_at = ctx.now;
        }
        if plan.hdr.bth.ack_req {
            self.req.pkts_since_ack_req = 0;
        } else {
            self.req.pkts_since_ack_req += 1;
        }
        if ty == QpType::Rc && self.req.rto.is_none() {
            self.req.rto = self.rto_deadline(ctx.now);
        }
        if ty != QpType::Rc && whole {
            self.complete_sends(ctx);
        }
    }

    /// Going back N, the send position passes the packets the responder said it holds
    /// (`recovery::Held`), and at the end of a pass over the holes goes back where
    /// sending was. READs and atomics always go again (a responder replays them), and
    /// a READ re-request keeps its own order.
    fn skip_held(&mut self, ctx: &mut Ctx<'_>) {
        let held = &self.req.held;
        if (held.is_empty() && held.pass_to.is_none())
            || !self.req.probe_next.is_empty()
            || self.mp_active()
        {
            return;
        }
        while let Some(w) = self.req.sq.get(self.req.send_idx) {
            let psn = w.psn_at(self.req.send_off);
            if !w.started || !psn.is_before(self.req.max_sent) {
                self.req.held.pass_to = None;
                return;
            }
            if self.req.held.pass_to.is_some_and(|to| psn.is_after(to)) {
                // Past the last PSN held. What left two round trips ago or earlier had
                // the time to be reported held: it was lost too (the tail of a flight
                // has no later packet to show it), and the pass goes on over it. What
                // left since may be in flight: sending goes on where it was.
                let rtt = self.req.srtt.max(MIN_HELD_RTT_NS);
                let recent = self.req.held.sent_since(ctx.now.saturating_sub(2 * rtt));
                match recent {
                    Some(p) if p.is_after(psn) => self.req.held.extend_pass(p.sub(1), ctx.now),
                    None => self.req.held.extend_pass(self.req.max_sent.sub(1), ctx.now),
                    Some(_) => {
                        self.req.held.pass_to = None;
                        self.resume_at(self.req.max_sent);
                        return;
                    }
                }
            }
            if w.is_rd_atomic() {
                return;
            }
            let Some(last) = self.req.held.holding(psn) else {
                return;
            };
            let next = last.next();
            if w.last_psn().is_before(next) {
                // The rest of this WQE is held.
                let skipped = w.last_psn().next().diff(psn);
                ctx.counters.held_skipped += u64::from(skipped.max(0) as u32);
                self.req.send_idx += 1;
                self.req.send_off = 0;
            } else {
                ctx.counters.held_skipped += u64::from(next.diff(psn).max(0) as u32);
                self.req.send_off = w.offset_of(next);
            }
        }
    }

    /// The send position moves to `psn`, the first PSN not sent yet (or the first
    /// WQE not started).
    fn resume_at(&mut self, psn: Psn) {
        let (idx, off) = self.position_of(psn).unwrap_or_else(|| {
            let from = self.req.send_idx;
            let unstarted = self.req.sq.iter().skip(from).position(|w| !w.started);
            (unstarted.map_or(self.req.sq.len(), |i| from + i), 0)
        });
        self.req.send_idx = idx;
        self.req.send_off = off;
    }

    /// The WQE that holds `psn` and the byte offset of its packet there (an atomic's
    /// is 0: one packet whatever its length).
    fn position_of(&self, psn: Psn) -> Option<(usize, u64)> {
        let (i, w) = self
            .req
            .sq
            .iter()
            .enumerate()
            .find(|(_, w)| w.contains(psn))?;
        let off = match w.wr.opcode {
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => 0,
            _ => w.offset_of(psn),
        };
        Some((i, off))
    }

    /// A SACK from a responder on one path reports the gap at `hole` and what it holds
    /// beyond (`ranges`). A new loss episode starts a pass over the holes up to the
    /// last PSN held (`recovery::Held`). Within one, a SACK that holds more than the
    /// passes covered shows new holes: the pass under way goes on to them, or a new
    /// one starts; a hole still reported two round trips after its pass began was lost
    /// again, and a pass starts over from it.
    pub(crate) fn on_held(&mut self, ctx: &mut Ctx<'_>, hole: Psn, ranges: &[(Psn, Psn)]) {
        let now = ctx.now;
        self.req.held.set(ranges);
        self.req.held.on_progress(self.req.una);
        let Some(top) = self.req.held.highest() else {
            return;
        };
        let rtt = self.req.srtt.max(MIN_HELD_RTT_NS);
        let held = &mut self.req.held;
        let episode = held.in_episode(self.req.una);
        let lost_again = held
            .resent_at(hole)
            .is_some_and(|at| now.saturating_sub(at) > 2 * rtt);
        let covered = held.covered().filter(|c| !hole.is_after(*c));
        let Some(covered) = covered.filter(|_| episode && !lost_again) else {
            // A new episode, a hole no pass resent yet (it was in flight when the last
            // one ended), or one resent and still missing: a pass from the hole.
            if !episode {
                held.begin(self.req.max_sent);
            }
            self.req.recovery.on_retransmission_lost();
            let cause = if lost_again {
                LossCause::ResentLost
            } else {
                LossCause::Gap
            };
            if self.retransmit_from(ctx, hole, cause) {
                self.req.held.start_pass(hole, top, now);
            }
            return;
        };
        if !top.is_after(covered) {
            return;
        }
        if self.req.held.pass_to.is_some() {
            self.req.held.extend_pass(top, now);
        } else {
            let from = covered.next();
            self.req.held.start_pass(from, top, now);
            self.rewind_to(from);
        }
    }

    /// Rewind the send position to `psn` (go-back-N).
    pub fn rewind_to(&mut self, psn: Psn) {
        self.req.probe_next.clear();
        if let Some((idx, off)) = self.position_of(psn) {
            self.req.send_idx = idx;
            self.req.send_off = off;
        }
    }

    /// Packets from `psn` are lost: retransmit per the recovery policy, spending one
    /// transport retry (rxe COMPST_ERROR_RETRY). retry_cnt counts retries as IBTA
    /// 9.7.6.1.3 and hardware do: 7 means 7, not forever. rxe alone treats 7 as infinite
    /// (`if (qp->comp.retry_cnt != 7)`), so a peer that dies never errors there; perftest
    /// and most programs set 7, and they must learn of a dead peer.
    ///
    /// Returns whether a retransmission started (not a repeated signal, not out of
    /// retries).
    pub fn retransmit_from(&mut self, ctx: &mut Ctx<'_>, psn: Psn, cause: LossCause) -> bool {
        tracing::trace!(
            ?cause,
            psn = psn.value(),
            una = self.req.una.value(),
            now = ctx.now,
            reorder_wait = self.req.reorder.wait(),
            "loss signal"
        );
        let Some(from) = self.req.recovery.on_loss(psn, cause) else {
            return false;
        };
        // Going back N resends everything not held (a pass over the holes is set up
        // by `on_held` after this).
        self.req.held.pass_to = None;
        // A resend after silence, or of a hole still reported after it was resent, is
        // our guess, not a loss the spec counts (`LossCause::is_guess`): it spends no
        // retry, so a dead peer is reported after as many timeouts as before (and it is
        // bounded, see `completer::MAX_QUIET_RESENDS`). Nor does the repair of a hole
        // behind the oldest unacknowledged PSN: the budget guards the oldest request,
        // which every retry of go-back-N starts from; selective repeat and READ
        // re-requests also fill the holes behind it, and counted, the holes of one
        // window of READ responses at 5 % loss spent it while the oldest was still
        // being repaired.
        if !cause.is_guess() && !from.is_after(self.req.una) {
            if self.req.retry_left == 0 {
                ctx.counters.retry_exceeded_err += 1;
                if let Some(w) = self.req.sq.front_mut() {
                    w.status = Some(WcStatus::RetryExcErr);
                }
                self.complete_sends(ctx);
                return false;
            }
            self.req.retry_left -= 1;
            ctx.counters.completer_retry_err += 1;
        }
        self.cc_loss(ctx, cause);
        if matches!(cause, LossCause::Timeout | LossCause::Quiet)
            && self.mp_resend_all(ctx.now, from, cause == LossCause::Timeout)
        {
            // Multipath: everything unacknowledged and not held by the responder goes
            // again, alone, on the paths that work; the send position stays.
            if cause == LossCause::Timeout {
                self.req.rto_backoff = (self.req.rto_backoff + 1).min(MAX_RTO_BACKOFF);
            }
            self.req.rto = self.rto_deadline(ctx.now);
            self.req.quiet_from = ctx.now;
            self.req.last_retransmit_at = Some(ctx.now);
            return true;
        }
        if cause == LossCause::Timeout {
            self.mp_restart();
            self.req.held.clear();
        }
        // Where sending was (before re-requests still waiting to leave, if any).
        let resume = self
            .req
            .probe_next
            .back()
            .copied()
            .unwrap_or((self.req.send_idx, self.req.send_off));
        self.rewind_to(from);
        if cause == LossCause::Timeout {
            self.req.rto_backoff = (self.req.rto_backoff + 1).min(MAX_RTO_BACKOFF);
        }
        if matches!(
            cause,
            LossCause::Timeout | LossCause::ReadHole | LossCause::Quiet
        ) && self.is_read_at(from)
            && resume.0 > self.req.send_idx
        {
            // Re-request only this READ, then carry on where sending was. A responder
            // replays every READ it is asked again (rxe `duplicate_request`), after the
            // responses it still owes: going back N at each timeout multiplied the work
            // of a responder that was only slow, until it could never catch up; and a
            // hole in one READ's responses cost a replay of every READ behind it, whose
            // responses were arriving or placed already. A READ behind this one that
            // really was lost draws a sequence NAK when a later request arrives, shows
            // a hole of its own, or times out in turn.
            ctx.counters.read_probe += 1;
            self.req.probe_next.push_back(resume);
        }
        if cause != LossCause::ResentLost || self.req.rto.is_none() {
            // Not pushed out by a resend of our own guessing: a hole that never fills
            // while the responder goes on reporting it still ends at the timeout.
            self.req.rto = self.rto_deadline(ctx.now);
        }
        self.req.quiet_from = ctx.now;
        self.req.last_retransmit_at = Some(ctx.now);
        true
    }

    /// After `retransmit_from` set up the re-request of one READ with a hole: also
    /// re-request `more` (sq index, PSN of the first missing response; in sq order,
    /// behind that READ), each from its first missing response, before sending goes on
    /// where it was. Why: each READ with a hole is then asked again once, in one pass,
    /// without replaying the READs between them (going back N) and without waiting one
    /// reorder delay per hole (one at a time).
    pub(crate) fn rerequest_reads(&mut self, ctx: &mut Ctx<'_>, more: &[(usize, Psn)]) {
        let Some(&resume) = self.req.probe_next.back() else {
            return; // went back N instead: that covers every hole
        };
        for &(idx, psn) in more {
            let Some(w) = self.req.sq.get(idx) else {
                continue;
            };
            if idx > self.req.send_idx && idx < resume.0 {
                let off = w.offset_of(psn);
                // In order, before the resume position (always last).
                let at = self.req.probe_next.len() - 1;
                self.req.probe_next.insert(at, (idx, off));
                ctx.counters.read_probe += 1;
            }
        }
    }

    /// The retransmit deadline from `now`: the Local ACK Timeout, doubled per timeout in
    /// a row without progress (IBTA 9.7.6.1.3 sets the least time to wait, not the
    /// most). Why: a peer that stalls longer than its timeout allows (kernel rxe under
    /// a loaded or emulated host stops for a second at times) would otherwise spend the
    /// whole retry budget in 8 timeouts, 0.5 s at perftest's timeout 14, and fail a
    /// connection that was only slow. Capped, so a dead peer is still reported within
    /// (1 + 2 + 4 + 8 × 5) timeouts with retry_cnt 7: 3.1 s at timeout 14.
    pub(crate) fn rto_deadline(&self, now: Nanos) -> Option<Nanos> {
        ack_timeout_ns(self.attr.timeout).map(|t| now + (t << self.req.rto_backoff))
    }

    /// Whether `psn` lies in a READ that was sent and still misses responses.
    fn is_read_at(&self, psn: Psn) -> bool {
        self.req
            .sq
            .iter()
            .find(|w| w.contains(psn))
            .is_some_and(|w| w.wr.opcode == WrOpcode::RdmaRead && !w.done)
    }
}

/// Where a request packet sits in its WQE, and what shapes it.
#[derive(Debug, Clone, Copy)]
struct PacketAt {
    /// The QP's transport.
    tr: Transport,
    /// Byte offset of the packet in the message.
    off: u64,
    /// Path MTU in bytes.
    mtu: u64,
    /// RC RDMA WRITEs go as WRITE Only packets ([`EngineConfig::split_rc_writes`]).
    split: bool,
    /// Destination QPN.
    dqpn: u32,
    /// The packet's PSN.
    psn: Psn,
}

/// A request packet, decided: its headers, payload length, and whether it ends the
/// message.
type Request = (Headers, usize, bool);

impl SendWqe {
    /// The request packet `at` this WQE; None for opcodes that send nothing.
    fn request_at(&self, at: &PacketAt) -> Option<Request> {
        match self.wr.opcode {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => self.plan_send(at),
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => self.plan_write(at),
            WrOpcode::RdmaRead => Some(self.plan_read(at)),
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => Some(self.plan_atomic(at)),
            WrOpcode::LocalInv | WrOpcode::BindMw => None,
        }
    }

    /// The payload length of the packet `at`, and whether it is the first and the last.
    fn segment(&self, at: &PacketAt) -> (u64, bool, bool) {
        let n = self.len.saturating_sub(at.off).min(at.mtu);
        (n, at.off == 0, at.off + n >= self.len)
    }

    /// A SEND packet: immediate data or the rkey to invalidate, and the solicited
    /// event bit, ride on the last one.
    fn plan_send(&self, at: &PacketAt) -> Option<Request> {
        let wr = &self.wr;
        let (n, first, last) = self.segment(at);
        let imm = wr.opcode == WrOpcode::SendWithImm;
        let inv = wr.opcode == WrOpcode::SendWithInv;
        let pos = Position::from_ends(first, last);
        let op = Opcode::send(at.tr, pos, imm && last, inv && last)?;
        let mut h = headers(op, at.dqpn, at.psn, n as usize);
        if last {
            h.bth.solicited = wr.flags.contains(SendFlags::SOLICITED);
            h.imm_dt = imm.then_some(wr.imm_data);
            h.ieth = inv.then_some(wr.imm_data);
        }
        Some((h, n as usize, last))
    }

    /// An RDMA WRITE packet: the First (or every packet, split) carries the RETH.
    fn plan_write(&self, at: &PacketAt) -> Option<Request> {
        let wr = &self.wr;
        let (n, first, last) = self.segment(at);
        let imm = wr.opcode == WrOpcode::RdmaWriteWithImm;
        // Every packet an RDMA WRITE Only for its own part, so that all of them are
        // the same size (one GSO batch).
        let split = at.split && !imm;
        let pos = if split {
            Position::Only
        } else {
            Position::from_ends(first, last)
        };
        let op = Opcode::write(at.tr, pos, imm && last)?;
        let mut h = headers(op, at.dqpn, at.psn, n as usize);
        // Split, each packet names its own part; else the First names it all.
        h.reth = (split || first).then(|| Reth {
            va: wr.remote_addr.wrapping_add(if split { at.off } else { 0 }),
            rkey: wr.rkey,
            dma_len: if split { n } else { self.len } as u32,
        });
        if last {
            h.bth.solicited = wr.flags.contains(SendFlags::SOLICITED) && imm;
            h.imm_dt = imm.then_some(wr.imm_data);
        }
        Some((h, n as usize, last))
    }

    /// An RDMA READ request. A retransmitted READ resumes at the first missing response
    /// (IBTA 9.7.5.2.x): the request names the remaining range.
    fn plan_read(&self, at: &PacketAt) -> Request {
        let wr = &self.wr;
        let mut h = headers(Opcode::RC_RDMA_READ_REQUEST, at.dqpn, at.psn, 0);
        // Responses larger than the IBTA's 4096 (agreed with a softhca peer): their size
        // in the BTH's reserved bits, so the responder cuts them as the PSNs were
        // counted here.
        if at.mtu > 4096 {
            h.bth.resv7 = (at.mtu / crate::config::JUMBO_UNIT).min(0x7f) as u8;
        }
        h.reth = Some(Reth {
            va: wr.remote_addr.wrapping_add(at.off),
            rkey: wr.rkey,
            dma_len: self.len.saturating_sub(at.off) as u32,
        });
        (h, 0, true)
    }

    /// A CmpSwap or FetchAdd request.
    fn plan_atomic(&self, at: &PacketAt) -> Request {
        let wr = &self.wr;
        let cas = wr.opcode == WrOpcode::AtomicCmpAndSwp;
        let op = if cas {
            Opcode::RC_COMPARE_SWAP
        } else {
            Opcode::RC_FETCH_ADD
        };
        let mut h = headers(op, at.dqpn, at.psn, 0);
        h.atomic_eth = Some(AtomicEth {
            va: wr.remote_addr,
            rkey: wr.rkey,
            swap_add: if cas { wr.swap } else { wr.compare_add },
            compare: if cas { wr.compare_add } else { 0 },
        });
        (h, 0, true)
    }
}
