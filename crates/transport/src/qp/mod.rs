//! A queue pair: its attributes, state machine, send/receive queues and the requester,
//! completer and responder state that hang off it.

pub mod state;

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use softhca_wire::{Aeth, Headers};

use crate::cc::QpCc;
use crate::config::EngineConfig;
use crate::counters::Counters;
use crate::multipath::{MpPacket, Multipath};
use crate::path::Path;
use crate::recovery::{GoBackN, Held, ReorderWindow};
use crate::verbs::*;

/// Everything outside the QP that QP logic touches while handling an event.
pub(crate) struct Ctx<'a> {
    pub cfg: &'a EngineConfig,
    pub mem: &'a MemoryTable,
    pub counters: &'a mut Counters,
    pub completions: &'a mut VecDeque<(CqId, Completion)>,
    pub events: &'a mut VecDeque<AsyncEvent>,
    pub srqs: &'a mut HashMap<u32, Srq>,
    pub budget: &'a mut Budget,
    /// Multipath extension packets for the engine to send.
    pub mp_out: &'a mut VecDeque<MpPacket>,
    pub now: Nanos,
}

/// Most request PSNs in flight on one device, over all its RC QPs.
///
/// Why: each QP may have `MAX_UNACKED_PSNS` (1024) in flight, so 1024 QPs could put
/// 4 GiB on the wire at once; the peer's socket buffer (16 MiB) overflowed, go-back-N
/// resent whole windows, and QPs starved into RETRY_EXC_ERR (a 1024-QP WRITE test).
/// A NIC bounds this with its hardware queues and congestion control (DCQCN); a socket
/// transport bounds it here: 2048 PSNs is 8 MiB at MTU 4096, within one socket buffer.
pub(crate) const DEVICE_MAX_INFLIGHT_PSNS: u32 = 2048;

/// The device-wide in-flight account (see [`DEVICE_MAX_INFLIGHT_PSNS`]).
#[derive(Debug, Default)]
pub(crate) struct Budget {
    /// Sum of every QP's `reported_inflight`.
    pub inflight: u32,
    /// QPs that had work but were held back by the budget: made ready again when it
    /// frees up (their own events may never come, since they have nothing in flight).
    pub blocked: std::collections::VecDeque<u32>,
    /// Set by the requester when it held a WQE back for the budget.
    pub hit: bool,
    /// Bytes of out-of-sequence requests kept by all responders (sum of every QP's
    /// `reported_ooo`), bounded by `responder::DEVICE_OOO_BYTES`.
    pub ooo_bytes: usize,
}

impl Budget {
    /// Whether a QP that reported `reported` and now has `unacked` PSNs in flight may
    /// start another WQE.
    pub fn allows(&self, reported: u32, unacked: u32) -> bool {
        self.inflight
            .saturating_sub(reported)
            .saturating_add(unacked)
            < DEVICE_MAX_INFLIGHT_PSNS
    }
}

/// A shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    /// Owning PD (receive WQEs are placed with the QP's PD, which verbs requires to be
    /// the same).
    pub pd: PdId,
    pub attr: SrqAttr,
    pub queue: VecDeque<RecvWr>,
    pub users: u32,
    /// Bytes SENDs placed in its receives since the engine last warmed the next ones
    /// (`Engine::warm_receives`).
    pub placed: usize,
}

impl Srq {
    /// Take one receive; fire the limit event when the count falls below the armed limit
    /// (IBTA 10.2.9.3: the limit disarms once it fires).
    pub fn take(&mut self, id: SrqId, events: &mut VecDeque<AsyncEvent>) -> Option<RecvWr> {
        let wr = self.queue.pop_front()?;
        if self.attr.srq_limit > 0 && (self.queue.len() as u32) < self.attr.srq_limit {
            self.attr.srq_limit = 0;
            events.push_back(AsyncEvent::SrqLimitReached(id));
        }
        Some(wr)
    }
}

/// A posted send WR and its progress.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    pub signaled: bool,
    /// Payload length (READ: bytes to read; atomics: 8).
    pub len: u64,
    /// Has a PSN range been assigned (first transmission started)?
    pub started: bool,
    /// When that was (a round-trip sample when it completes, see `Requester::srtt`).
    pub sent_at: Nanos,
    /// Its first answer is still a round-trip sample: sent once, and nothing of it
    /// answered yet (Karn's rule per WQE: a READ whose responses were reordered and
    /// that was asked again gives none, but the READs after it still do).
    pub rtt_sample: bool,
    pub first_psn: Psn,
    /// PSNs the WQE occupies (READ: response packets).
    pub npkts: u32,
    /// The payload of each of its packets but the last, bytes (`Qp::start_mtu`), fixed
    /// when it starts: PSN and byte offset within it convert by this.
    pub mtu: u64,
    /// READ: next response PSN expected.
    pub read_next_psn: Psn,
    /// All packets sent once (UC/UD: this completes the WQE).
    pub done: bool,
    /// Error found by the requester itself (local errors), reported when it reaches the head.
    pub status: Option<WcStatus>,
}

impl SendWqe {
    pub fn is_rd_atomic(&self) -> bool {
        matches!(
            self.wr.opcode,
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    /// PSNs this WQE takes at path MTU `mtu` (bytes): one per packet, or per READ
    /// response packet; one for an atomic.
    pub fn psns_at(&self, mtu: u64) -> u32 {
        match self.wr.opcode {
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => 1,
            _ => self.len.div_ceil(mtu).max(1) as u32,
        }
    }
    /// The PSN of the packet at byte offset `off` (its size fixed when it started).
    pub fn psn_at(&self, off: u64) -> Psn {
        self.first_psn.add((off / self.mtu.max(1)) as u32)
    }
    /// The byte offset of the packet with PSN `psn`.
    pub fn offset_of(&self, psn: Psn) -> u64 {
        u64::from(psn.diff(self.first_psn) as u32) * self.mtu
    }
    pub fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.max(1) - 1)
    }
    /// A bind or local invalidation: no packet, executed when posted.
    pub fn is_local_op(&self) -> bool {
        matches!(self.wr.opcode, WrOpcode::BindMw | WrOpcode::LocalInv)
    }
    pub fn contains(&self, psn: Psn) -> bool {
        self.started
            && !self.is_local_op()
            && psn.diff(self.first_psn) >= 0
            && psn.diff(self.last_psn()) <= 0
    }
}

/// Requester state (send side: segmentation, PSNs, outstanding work).
#[derive(Debug, Default)]
pub(crate) struct Requester {
    pub sq: VecDeque<SendWqe>,
    /// Index in `sq` of the WQE whose next packet goes out next.
    pub send_idx: usize,
    /// Byte offset of that packet within the WQE.
    pub send_off: u64,
    /// PSN given to the next WQE that starts.
    pub next_psn: Psn,
    /// Oldest unacknowledged PSN.
    pub una: Psn,
    /// One past the highest PSN sent.
    pub max_sent: Psn,
    /// READ/atomic WQEs started and not completed.
    pub rd_atomic_inflight: u32,
    pub retry_left: u8,
    pub rnr_left: u8,
    /// RNR NAK received: sending paused until this time, then resume from the PSN.
    pub rnr_wait: Option<(Nanos, Psn)>,
    /// Retransmit deadline.
    pub rto: Option<Nanos>,
    /// Retransmit timeouts in a row without forward progress: each doubles the next
    /// timeout, up to `requester::MAX_RTO_BACKOFF` doublings.
    pub rto_backoff: u8,
    /// A timeout or response holes in READs re-request only those READs (see
    /// `Qp::retransmit_from`): once the request being sent has left, sending goes on
    /// from each of these (send_idx, send_off) in turn: the next READ with a hole, and
    /// last where sending was before. Empty: no re-request under way.
    pub probe_next: VecDeque<(usize, u64)>,
    /// Resends made because the responder fell silent during a retransmission, since
    /// the last progress (see `completer::MAX_QUIET_RESENDS`).
    pub quiet_resends: u8,
    /// The last response or retransmission: silence is counted from here.
    pub quiet_from: Nanos,
    /// Smoothed time from a WQE's first packet to its completion, over WQEs sent once
    /// (0: none yet). Sets how long silence means loss (`timers::quiet_wait`).
    pub srtt: Nanos,
    /// The last retransmission started.
    pub last_retransmit_at: Option<Nanos>,
    /// When a request packet with a new PSN last left (the tail-loss probe counts
    /// silence from it or from the last response, whichever is later).
    pub sent_at: Nanos,
    /// Tail-loss probes sent since the last progress (see
    /// `completer::MAX_TAIL_PROBES`).
    pub tail_probes: u8,
    pub pkts_since_ack_req: u32,
    pub recovery: GoBackN,
    /// What the responder said it holds (selective repeat with a softhca peer).
    pub held: Held,
    /// READ response PSNs placed ahead of the one expected (reordering, see
    /// `completer::on_read_response`); counted into `una` when the gap fills.
    pub read_early: VecDeque<Psn>,
    /// When to resend from the missing READ response if the gap has not filled.
    pub read_gap_at: Option<Nanos>,
    /// How long a gap in READ responses may stay open before it is a loss (see
    /// `completer::read_reorder_wait`).
    pub reorder: ReorderWindow,
    /// SQD: notify when drained.
    pub sqd_notify: bool,
    /// Multipath: the packet being planned is a selective resend of this WQE (index in
    /// `sq`) at this byte offset, not the next one at the send position.
    pub resend_at: Option<(usize, u64)>,
    /// The packet size of the WQE that started last: congestion control counts each
    /// PSN in flight as this many bytes (0: none started yet, the path MTU).
    pub pkt_bytes: u64,
}

/// In-progress inbound message on the responder.
#[derive(Debug)]
pub(crate) enum InMsg {
    Send {
        wqe: RecvWr,
        from_srq: bool,
        off: u64,
    },
    Write {
        rkey: u32,
        va: u64,
        remaining: u64,
        total: u64,
    },
}

/// A READ/atomic responder resource (IBTA 9.7.5.1: kept to answer duplicates).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RdRes {
    Read { first_psn: Psn, last_psn: Psn },
    Atomic { psn: Psn, orig: u64 },
}

/// Something the responder has to send, in order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RespOut {
    /// ACK, NAK or RNR NAK: the AETH carries the MSN as of when it was queued.
    Ack {
        psn: Psn,
        aeth: Aeth,
    },
    Read {
        psn: Psn,
        rkey: u32,
        va: u64,
        remaining: u64,
        first: bool,
        msn: u32,
        /// The payload of each response but the last (the path MTU, or the size the
        /// request asked for).
        mtu: u64,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

/// Responder state (receive side).
#[derive(Debug, Default)]
pub(crate) struct Responder {
    pub epsn: Psn,
    pub msn: u32,
    /// A PSN-sequence or RNR NAK was sent for `epsn` (IBTA C9-88: one NAK per error).
    pub nak_sent: bool,
    /// Requests were executed since the last acknowledgement queued (none asked).
    pub ack_owed: bool,
    pub cur: Option<InMsg>,
    pub res: VecDeque<RdRes>,
    pub out: VecDeque<RespOut>,
    pub comm_est: bool,
    /// UC: drop packets until the next FIRST/ONLY.
    pub uc_resync: bool,
    /// RC requests that arrived ahead of `epsn`, kept to be executed when the gap
    /// fills (see `responder::OOO_MAX`), in PSN order (so a duplicate is a binary
    /// search and the drain pops from the front); empty (no allocation) on an in-order
    /// path.
    pub ooo: VecDeque<(Headers, Vec<u8>)>,
    /// Payload bytes in `ooo`.
    pub ooo_bytes: usize,
    /// When to NAK the gap in front of `ooo` if it has not filled by then (or, after
    /// the NAK, to repeat it, see `responder::MAX_NAK_REPEATS`).
    pub gap_nak_at: Option<Nanos>,
    /// When the gap in front of `ooo` opened.
    pub gap_since: Nanos,
    /// How long a gap may stay open before its sequence NAK.
    pub reorder: ReorderWindow,
    /// Sequence NAKs repeated for the gap at `epsn`.
    pub nak_repeats: u8,
    /// When the gap's first sequence NAK left (0: none, or an RNR NAK).
    pub nak_at: Nanos,
    /// Smoothed time from a sequence NAK to the packet it asked for (0: none yet).
    pub nak_rtt: Nanos,
    /// When the last request packet arrived.
    pub last_rx_at: Nanos,
}

/// A queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub init: QpInitAttr,
    pub attr: QpAttr,
    pub state: QpState,
    pub rq: VecDeque<RecvWr>,
    pub req: Requester,
    pub resp: Responder,
    pub path: Path,
    /// In the engine's ready queue.
    pub in_ready: bool,
    /// A lone ACK was planned behind a request packet of this QP (see `Qp::plan`).
    pub ack_behind: bool,
    /// This QP's share of [`Budget::inflight`], as of its last `sync`.
    pub reported_inflight: u32,
    /// In [`Budget::blocked`].
    pub budget_blocked: bool,
    /// This QP's share of [`Budget::ooo_bytes`], as of its last `sync`.
    pub reported_ooo: usize,
    /// Current timer deadline (what the QP wants).
    pub timer: Option<Nanos>,
    /// The time of this QP's live entry in the engine's timer heap, and its generation
    /// (older entries are ignored when they pop). A later deadline does not push a new
    /// entry: the live one fires first and re-arms for the current deadline. So a QP
    /// whose retransmit timer moves on every ACK has one heap entry, not thousands, and
    /// the engine's next deadline is a real one rather than a superseded one.
    pub armed: Option<Nanos>,
    pub timer_gen: u64,
    /// Congestion control: window, pacing, round-trip samples.
    pub cc: QpCc,
    /// The multipath extension (None: plain RC).
    pub mp: Option<Box<Multipath>>,
}

impl Qp {
    pub fn new(qpn: u32, init: QpInitAttr) -> Qp {
        let attr = QpAttr {
            cap: init.cap,
            ..QpAttr::default()
        };
        Qp {
            qpn,
            init,
            attr,
            state: QpState::Reset,
            rq: VecDeque::new(),
            req: Requester::default(),
            resp: Responder::default(),
            path: Path::default(),
            in_ready: false,
            ack_behind: false,
            reported_inflight: 0,
            budget_blocked: false,
            reported_ooo: 0,
            timer: None,
            armed: None,
            timer_gen: 0,
            cc: QpCc::default(),
            mp: None,
        }
    }

    pub fn qpn_t(&self) -> Qpn {
        Qpn::new(self.qpn)
    }

    /// The MTU packets of this QP use: min(path MTU, its source GID's interface MTU);
    /// UD uses the device MTU.
    pub fn mtu(&self, cfg: &EngineConfig) -> u64 {
        let m = if self.init.qp_type == QpType::Ud {
            cfg.max_mtu
        } else {
            self.attr
                .path_mtu
                .min(cfg.gid_mtu(self.attr.ah_attr.sgid_index))
        };
        m.bytes() as u64
    }

    /// The packet size above the path MTU this QP's softhca peer agreed to
    /// (the multipath negotiation's `packet_max`), if any.
    pub fn jumbo(&self) -> Option<u64> {
        self.mp
            .as_deref()
            .filter(|m| m.state == crate::multipath::MpState::On && m.jumbo > 0)
            .map(|m| m.jumbo)
    }

    /// The packet size to use with a peer that offered `offer` bytes: the smaller of
    /// that and this device's, when both exceed the path MTU and the application asked
    /// for the largest IBTA MTU (a smaller one it chose is kept); 0: none.
    pub fn jumbo_with(&self, cfg: &EngineConfig, offer: u64) -> u64 {
        let size = cfg.jumbo_mtu.min(offer);
        let fits = self.negotiates()
            && self.attr.path_mtu == Mtu::M4096
            && cfg.gid_mtu(self.attr.ah_attr.sgid_index) == Mtu::M4096;
        if fits && size > self.mtu(cfg) && size.is_multiple_of(crate::config::JUMBO_UNIT) {
            size
        } else {
            0
        }
    }

    /// The packet size a WQE that starts now is cut into (each keeps its own, see
    /// `SendWqe::mtu`): the agreed larger size (a READ's responses too: its request
    /// names it, see `Bth::resv7`), else the path MTU.
    pub fn start_mtu(&self, cfg: &EngineConfig) -> u64 {
        self.jumbo().unwrap_or_else(|| self.mtu(cfg))
    }

    /// Whether an RDMA WRITE goes as one WRITE Only per packet
    /// (`EngineConfig::split_rc_writes`), in packets above the path MTU too: First,
    /// Middle and Last would spare 16 bytes of RETH a packet (0.2 % of a 8704-byte one),
    /// but the First, longer than the rest, leaves in a datagram of its own, and an
    /// application posting one WRITE per call (ib_write_bw) then sent two datagrams per
    /// 64 KiB WRITE where a run of WRITE Onlys shares them (0.8x on loopback).
    pub fn splits_writes(&self, cfg: &EngineConfig) -> bool {
        self.is_rc() && cfg.split_rc_writes
    }

    /// The bytes congestion control counts per PSN in flight: the size the last
    /// started WQE's packets have.
    pub fn cc_mtu(&self, cfg: &EngineConfig) -> u64 {
        match self.req.pkt_bytes {
            0 => self.mtu(cfg),
            n => n,
        }
    }

    /// The most payload a request packet of this QP may carry: the path MTU, or this
    /// device's jumbo size while the peer may be a softhca device that agreed to it
    /// (negotiating, or agreed; never after a "no": rxe is held to the IBTA's rule).
    pub fn max_request_payload(&self, cfg: &EngineConfig) -> u64 {
        // A "no" drops the QP's multipath state (`mp_turn_off`).
        match self
            .mp
            .is_some()
            .then(|| self.jumbo_with(cfg, cfg.jumbo_mtu))
        {
            Some(n) if n > 0 => n,
            _ => self.mtu(cfg),
        }
    }

    pub fn is_rc(&self) -> bool {
        self.init.qp_type == QpType::Rc
    }

    /// Whether this QP asks a softhca peer for the extension (RC: multipath and larger
    /// packets; UC, which has no acknowledgements to run paths on: larger packets only).
    pub fn negotiates(&self) -> bool {
        matches!(self.init.qp_type, QpType::Rc | QpType::Uc)
    }

    pub fn post_completion(&self, ctx: &mut Ctx<'_>, send: bool, wc: Completion) {
        let cq = if send {
            self.init.send_cq
        } else {
            self.init.recv_cq
        };
        ctx.completions.push_back((cq, wc));
    }

    /// Move to ERR: flush every posted WR with WR_FLUSH_ERR (IBTA 10.3.1 / rxe flush).
    pub fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        self.attr.qp_state = QpState::Err;
        self.mp = None;
        // Kept early requests will never execute now.
        self.resp.ooo = VecDeque::new();
        self.resp.ooo_bytes = 0;
        self.flush(ctx);
    }

    pub fn flush(&mut self, ctx: &mut Ctx<'_>) {
        let qp_num = self.qpn;
        for w in std::mem::take(&mut self.req.sq) {
            let wc = Completion {
                wr_id: w.wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: wc_opcode(w.wr.opcode),
                qp_num,
                ..Completion::default()
            };
            self.post_completion(ctx, true, wc);
        }
        self.req.send_idx = 0;
        self.req.send_off = 0;
        self.req.rd_atomic_inflight = 0;
        self.req.rnr_wait = None;
        self.req.rto = None;
        self.req.probe_next.clear();
        let mut recvs: Vec<RecvWr> = self.rq.drain(..).collect();
        if let Some(InMsg::Send {
            wqe,
            from_srq: false,
            ..
        }) = self.resp.cur.take()
        {
            recvs.insert(0, wqe);
        }
        for r in recvs {
            let wc = Completion {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num,
                ..Completion::default()
            };
            self.post_completion(ctx, false, wc);
        }
        self.resp.out.clear();
        if self.init.srq.is_some() {
            // IBTA 11.5.3.3: a QP on an SRQ reports the last WQE once in error.
            ctx.events
                .push_back(AsyncEvent::QpLastWqeReached(self.qpn_t()));
        }
    }

    /// Back to RESET: queues emptied without completions (IBTA 10.3.1: RESET discards).
    pub fn reset(&mut self) {
        self.rq.clear();
        self.req = Requester::default();
        self.resp = Responder::default();
        self.cc = QpCc::default();
        self.mp = None;
        self.state = QpState::Reset;
        self.timer = None;
    }
}

/// The completion opcode reported for a send WR opcode.
pub(crate) fn wc_opcode(op: WrOpcode) -> WcOpcode {
    match op {
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
        WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
        WrOpcode::RdmaRead => WcOpcode::RdmaRead,
        WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
        WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
        WrOpcode::LocalInv => WcOpcode::LocalInv,
        WrOpcode::BindMw => WcOpcode::BindMw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_a_qps_own_share_once() {
        let mut b = Budget {
            inflight: DEVICE_MAX_INFLIGHT_PSNS - 10,
            ..Budget::default()
        };
        // This QP reported 10 of those: it may grow to just under the device cap.
        assert!(b.allows(10, 19));
        assert!(!b.allows(10, 20));
        // Another QP, with nothing in flight, may not start.
        assert!(b.allows(0, 9));
        assert!(!b.allows(0, 10));
        b.inflight = 0;
        assert!(b.allows(0, DEVICE_MAX_INFLIGHT_PSNS - 1));
    }
}
