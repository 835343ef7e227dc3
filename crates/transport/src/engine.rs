//! The engine: the QP table, packet demultiplexing, transmit batching, and the
//! verbs-facing API (the control plane is in `control`).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use softhca_wire::{self as wire, UdpPseudo};

use crate::config::EngineConfig;
use crate::counters::Counters;
use crate::datagram::{seal_packet, DatagramInfo, Transmit, TxPiece};
use crate::error::TransportError;
use crate::ipv4_id::{IdCheck, Ipv4IdTracker};
use crate::multipath::wire::{self as mpw, Hello};
use crate::multipath::{MpPacket, MpStats, Multipath};
use crate::qp::{Budget, Ctx, Qp, SendWqe, Srq, DEVICE_MAX_INFLIGHT_PSNS};
use crate::requester::Built;
use crate::responder::RxMeta;
use crate::timers::Timers;
use crate::verbs::*;

/// The sans-IO RoCEv2 engine: one device's QPs, CQs, SRQs and memory table.
///
/// It does no I/O and reads no clock; the caller passes the time in every call that can
/// act on it. Its methods come in four kinds, as quinn-proto's `Connection`'s do:
///
/// - **Control** (any time): `create_*`, `modify_*`, `query_*`, `destroy_*`, and
///   [`Engine::memory_mut`] for PDs and MRs. A QP goes RESET → INIT → RTR → RTS by
///   [`Engine::modify_qp`] before it sends or accepts requests.
/// - **Input**: [`Engine::post_send`], [`Engine::post_recv`], [`Engine::post_srq_recv`]
///   (work from the application); [`Engine::handle_datagram`] (a received UDP payload,
///   ICRC included); [`Engine::handle_timeout`] (the time given by `poll_timeout` has
///   come).
/// - **Output**, to be drained after every input, each until it returns `None`:
///   [`Engine::poll_transmit`] (or `poll_transmit_gather` / `poll_transmit_append`)
///   for datagrams to send, [`Engine::poll_completion`] for work completions,
///   [`Engine::poll_event`] for async events, and [`Engine::poll_timeout`] for the next
///   deadline (call `handle_timeout` when it passes; it may change after any input).
/// - **Queries**: [`Engine::has_transmit`], [`Engine::only_acks_ready`],
///   [`Engine::segment_kind`], [`Engine::has_completions`], [`Engine::counters`] and the
///   like, cheap checks that change nothing.
///
/// A datapath loop is then: feed received datagrams and expired timers, post work,
/// send what `poll_transmit` gives until `None`, deliver completions and events, and
/// sleep until `poll_timeout` or the next input.
#[derive(Debug)]
pub struct Engine {
    pub(crate) cfg: EngineConfig,
    pub(crate) memory: MemoryTable,
    pub(crate) counters: Counters,
    pub(crate) qps: HashMap<u32, Qp>,
    pub(crate) next_qpn: u32,
    pub(crate) cqs: HashSet<u32>,
    pub(crate) next_cq: u32,
    pub(crate) srqs: HashMap<u32, Srq>,
    pub(crate) next_srq: u32,
    pub(crate) completions: VecDeque<(CqId, Completion)>,
    events: VecDeque<AsyncEvent>,
    /// QPs that may have packets to send (each at most once).
    ready: VecDeque<u32>,
    timers: Timers,
    source_port: Option<u16>,
    /// Per peer flow, the IPv4 ID its packets carry (for the ICRC, see `ipv4_id`).
    pub(crate) ip_ids: Ipv4IdTracker,
    /// Peer addresses that take bundles, and the largest each takes (see
    /// [`Engine::bundles_to`]).
    bundle_peers: HashMap<IpAddr, usize>,
    /// Request PSNs in flight over all QPs, and the QPs waiting for room.
    pub(crate) budget: Budget,
    /// Multipath extension packets waiting to leave (each its own Transmit).
    mp_out: VecDeque<MpPacket>,
    /// Multicast groups and their QPs.
    pub(crate) mcast: crate::mcast::Groups,
}

/// What a received segment is, as [`Engine::segment_kind`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    /// An RC ACKNOWLEDGE (ACK or NAK) to QP `qpn`: it completes sends on its send CQ
    /// ([`Engine::send_cq`]) and nothing else.
    Ack {
        /// The QP it acknowledges to.
        qpn: Qpn,
    },
    /// A request, a READ or atomic response, or not a BTH.
    Other,
}

/// Bound on remembered bundle-taking peers (memory under a flood of spoofed MADs).
const MAX_BUNDLE_PEERS: usize = 4096;
/// The most bytes of an SRQ's next receive buffers [`Engine::warm_receives`] warms at
/// once: a few 64 KiB messages' worth, well inside a core's L2.
const WARM_MAX: usize = 256 << 10;

/// First QPN handed out (rxe: QPNs 0 and 1 are the special QPs; user QPs from 0x11).
pub(crate) const FIRST_QPN: u32 = 0x11;

/// The general services QP (IBTA 3.5.4): connection management MADs arrive at QP 1.
pub const GSI_QPN: u32 = 1;

/// Where QP numbers start: a per-device random point of the 24-bit space, so that a
/// restarted process does not reuse the QPNs a peer still remembers in timewait (the
/// CM's stale-connection check is keyed on the QPN).
fn first_qpn(seed: u64) -> u32 {
    // splitmix64 of the seed: any bits of the device's random seed will do.
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    FIRST_QPN + (z % u64::from(0x00ff_ffff - FIRST_QPN)) as u32
}

/// The engine split for handling one event: the tables a QP is found in and put back
/// on, and the context its logic runs in. Built by [`Engine::parts`] alone.
pub(crate) struct Parts<'a> {
    pub qps: &'a mut HashMap<u32, Qp>,
    pub ready: &'a mut VecDeque<u32>,
    pub timers: &'a mut Timers,
    pub ctx: Ctx<'a>,
}

/// After any event on a QP: re-arm its timer and put it on the ready queue if it has
/// something to send.
pub(crate) fn sync(qp: &mut Qp, ctx: &mut Ctx<'_>, ready: &mut VecDeque<u32>, timers: &mut Timers) {
    qp.complete_sends(ctx);
    report_inflight(qp, ctx);
    let ooo = qp.resp.ooo_bytes;
    ctx.budget.ooo_bytes = reshare(ctx.budget.ooo_bytes, qp.reported_ooo, ooo);
    qp.reported_ooo = ooo;
    if !qp.in_ready {
        ctx.budget.hit = false;
        if qp.has_output(ctx) {
            // Planning may have started a WQE: its PSNs count before any other QP's
            // next look at the budget.
            report_inflight(qp, ctx);
            qp.in_ready = true;
            ready.push_back(qp.qpn);
        } else if ctx.budget.hit && !qp.budget_blocked {
            qp.budget_blocked = true;
            ctx.budget.blocked.push_back(qp.qpn);
        }
    }
    qp.mp_flush(ctx);
    // After planning: a pacer's wait it found is a deadline too.
    let want = qp.deadline();
    qp.timer = want;
    if let Some(t) = want {
        if qp.armed.is_none_or(|a| t < a) {
            qp.timer_gen += 1;
            qp.armed = Some(t);
            timers.push(t, qp.qpn, qp.timer_gen);
        }
    }
    // Planning may have found a local error on the next WQE (bad lkey, UD too long):
    // complete it now rather than at the next event.
    if qp.req.sq.front().is_some_and(|w| w.status.is_some()) {
        qp.complete_sends(ctx);
    }
}

/// Bring the device budget up to date with `qp`'s request PSNs in flight.
fn report_inflight(qp: &mut Qp, ctx: &mut Ctx<'_>) {
    let cur = qp.inflight_psns();
    let total = reshare(
        ctx.budget.inflight as usize,
        qp.reported_inflight as usize,
        cur as usize,
    );
    ctx.budget.inflight = u32::try_from(total).unwrap_or(u32::MAX);
    qp.reported_inflight = cur;
}

/// A device-wide sum with one QP's share replaced (`old` by `new`).
fn reshare(total: usize, old: usize, new: usize) -> usize {
    total.saturating_sub(old).saturating_add(new)
}

/// The UDP source port a packet planned with `planned` is sealed for: the I/O layer's
/// one (`set_source_port`), unless it is one of the extra ports multipath may use.
fn sealed_sport(fixed: Option<u16>, planned: u16, extra: &[u16]) -> u16 {
    match fixed {
        Some(p) if !extra.contains(&planned) => p,
        _ => planned,
    }
}

pub(crate) fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    Gid::from_ip(a) == Gid::from_ip(b)
}

/// The destination, source, packet size, UDP source port and IP TOS every packet of a
/// Transmit shares (GSO sends one datagram's segments on one flow).
#[derive(Debug, Clone, Copy)]
struct Flow {
    dst: SocketAddr,
    src: IpAddr,
    seg: usize,
    sport: u16,
    tos: u8,
}

/// A Transmit being filled by `transmit_into`.
struct Batch<'p> {
    /// Bytes of the transmit buffer used.
    off: usize,
    /// Bytes on the wire (with external payloads).
    wire_len: usize,
    /// Packets.
    count: usize,
    /// Set by the first packet.
    flow: Option<Flow>,
    /// Every packet so far is an RC ACKNOWLEDGE ([`Transmit::only_acks`]).
    only_acks: bool,
    /// For a gathered transmit: where each packet's bytes are.
    pieces: Option<&'p mut Vec<TxPiece>>,
}

/// Why a QP's run in a batch ended (see [`Batch::fill_from`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunEnd {
    /// The QP has nothing more to send now.
    Drained,
    /// The batch is complete: full, a short or mismatched packet, no room, a local error.
    Ended,
    /// Not even one packet fits the buffer.
    TooSmall,
}

impl<'p> Batch<'p> {
    /// A new batch, or one that goes on after `prev`'s packets (see
    /// `poll_transmit_append`).
    fn new(mut pieces: Option<&'p mut Vec<TxPiece>>, prev: Option<&Transmit>) -> Self {
        let mut b = Batch {
            off: 0,
            wire_len: 0,
            count: 0,
            flow: None,
            only_acks: true,
            pieces: None,
        };
        match (prev, pieces.as_deref_mut()) {
            (Some(p), Some(list)) => {
                b.off = list.last().map_or(0, |l| l.start + l.head + l.tail);
                b.wire_len = p.len;
                b.count = list.len();
                b.only_acks = p.only_acks;
                b.flow = Some(Flow {
                    dst: p.dst,
                    src: p.src,
                    seg: p.segment_size,
                    sport: p.src_port,
                    tos: p.tos,
                });
            }
            (_, Some(list)) => list.clear(),
            _ => {}
        }
        b.pieces = pieces;
        b
    }

    /// Add `qp`'s next packets, while they fit this batch.
    fn fill_from(
        &mut self,
        qp: &mut Qp,
        ctx: &mut Ctx<'_>,
        buf: &mut [u8],
        max_segs: usize,
        source_port: Option<u16>,
    ) -> RunEnd {
        while self.count < max_segs {
            let Some(plan) = qp.plan(ctx) else {
                return RunEnd::Drained;
            };
            let wl = plan.wire_len();
            let sport = sealed_sport(source_port, plan.sport, &ctx.cfg.mp.ports);
            if let Some(f) = &self.flow {
                let same = plan.dst == f.dst && plan.src == f.src && plan.tos == f.tos;
                if !same || sport != f.sport || wl > f.seg {
                    return RunEnd::Ended;
                }
            }
            if self.off + wl > buf.len() || self.wire_len + wl > buf.len() {
                return if self.count == 0 {
                    RunEnd::TooSmall
                } else {
                    RunEnd::Ended
                };
            }
            let in_place = self.pieces.is_some();
            let Some(pkt) = buf.get_mut(self.off..) else {
                return RunEnd::Ended;
            };
            let Some(built) = qp.build_placed(ctx, &plan, pkt, in_place) else {
                return RunEnd::Ended;
            };
            let (dst, src, tos) = (plan.dst, plan.src, plan.tos);
            // A gathered transmit is sealed by the caller; a copied one here, each packet
            // with the IPv4 ID of its GSO segment index.
            let pseudo = (!in_place).then(|| {
                UdpPseudo::from_addrs(src, dst.ip(), sport, dst.port(), self.count as u16)
            });
            let Some(in_buf) = seal_built(pseudo.as_ref(), pkt, &built) else {
                return RunEnd::Ended;
            };
            self.only_acks &= plan.hdr.bth.opcode.is_ack();
            let total = in_buf + built.external.map_or(0, |e| e.len);
            if let Some(list) = self.pieces.as_deref_mut() {
                list.push(TxPiece {
                    start: self.off,
                    head: built.head,
                    external: built.external,
                    tail: in_buf - built.head,
                    tail_crc: built.tail_crc,
                });
            }
            let seg = self.flow.get_or_insert(Flow {
                dst,
                src,
                seg: total,
                sport,
                tos,
            });
            let short = total < seg.seg;
            self.off += in_buf;
            self.wire_len += total;
            self.count += 1;
            if short {
                return RunEnd::Ended;
            }
        }
        RunEnd::Ended
    }
}

/// Write the ICRC of a packet `build_placed` wrote at the start of `pkt` for `pseudo`, or,
/// without one (a gathered transmit), zeroes for the caller to seal ([`Transmit::seal`]);
/// returns its bytes in `pkt`. Only a gathered build leaves payloads in registered
/// memory, so the engine never reads them.
fn seal_built(pseudo: Option<&UdpPseudo>, pkt: &mut [u8], built: &Built) -> Option<usize> {
    match (pseudo, built.external) {
        (Some(pseudo), None) => seal_packet(pseudo, pkt, built.in_buf, built.tail_crc),
        (Some(_), Some(_)) => None,
        (None, _) => {
            let end = built.in_buf + wire::ICRC_LEN;
            pkt.get_mut(built.in_buf..end)?.fill(0);
            Some(end)
        }
    }
}

/// A bind or local invalidation takes effect in the memory table when posted (a window
/// is usable, or revoked, no later than the WR completes); its completion comes in order
/// when the requester reaches it (rxe `rxe_do_local_ops`). The status a failure
/// completes with: `IBV_WC_MW_BIND_ERR` or `IBV_WC_LOC_QP_OP_ERR`.
fn execute_local_op(memory: &mut MemoryTable, pd: PdId, qpn: u32, wr: &SendWr) -> Option<WcStatus> {
    match wr.opcode {
        WrOpcode::BindMw => match wr.bind.map(|b| memory.bind_mw(pd, qpn, b)) {
            Some(Ok(_)) => None,
            _ => Some(WcStatus::MwBindErr),
        },
        // The WR's `invalidate_rkey` shares `imm_data`'s place, as in `ibv_send_wr`.
        WrOpcode::LocalInv => memory
            .invalidate(wr.imm_data)
            .err()
            .map(|_| WcStatus::LocQpOpErr),
        _ => None,
    }
}

/// Check a send WR against its QP (`ibv_post_send`'s EINVAL cases); returns its
/// message length (atomics: 8).
fn check_send_wr(qp: &Qp, cfg: &EngineConfig, wr: &SendWr) -> Result<u64, TransportError> {
    use TransportError::InvalidArgument as E;
    if matches!(qp.state, QpState::Reset | QpState::Init | QpState::Rtr) {
        return Err(E("QP not ready to send"));
    }
    let ty = qp.init.qp_type;
    let ok = match ty {
        QpType::Ud => matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm),
        // rxe: binds on RC and UC, local invalidation on RC only.
        QpType::Uc => matches!(
            wr.opcode,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
                | WrOpcode::BindMw
        ),
        QpType::Rc => true,
    };
    if !ok {
        return Err(E("opcode not supported on this QP type"));
    }
    if ty == QpType::Ud && wr.ud.is_none() {
        return Err(E("UD send without destination"));
    }
    let cap = &qp.init.cap;
    match &wr.payload {
        Payload::Sges(s) if s.len() > cap.max_send_sge as usize => return Err(E("too many sges")),
        Payload::Inline(b)
            if b.len()
                > cap
                    .max_inline_data
                    .max(cfg.max_inline_data.min(cap.max_inline_data))
                    as usize =>
        {
            return Err(E("inline data above max_inline_data"))
        }
        _ => {}
    }
    let mut len = wr.payload.len();
    if matches!(
        wr.opcode,
        WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
    ) {
        if len < 8 || matches!(wr.payload, Payload::Inline(_)) {
            return Err(E("atomic needs an 8-byte local buffer"));
        }
        len = 8;
    }
    if len > 1 << 31 {
        return Err(E("message larger than 2 GiB"));
    }
    Ok(len)
}

impl Engine {
    /// A new engine.
    pub fn new(cfg: EngineConfig) -> Self {
        let next_qpn = cfg
            .first_qpn
            .map_or_else(|| first_qpn(cfg.seed), |q| q.clamp(FIRST_QPN, 0x00ff_ffff));
        Engine {
            memory: MemoryTable::new(cfg.seed ^ 0x5eed_cafe_f00d_d00d),
            cfg,
            counters: Counters::default(),
            qps: HashMap::default(),
            next_qpn,
            cqs: HashSet::default(),
            next_cq: 1,
            srqs: HashMap::default(),
            next_srq: 1,
            completions: VecDeque::new(),
            events: VecDeque::new(),
            ready: VecDeque::new(),
            timers: Timers::default(),
            source_port: None,
            ip_ids: Ipv4IdTracker::default(),
            bundle_peers: HashMap::default(),
            budget: Budget::default(),
            mp_out: VecDeque::new(),
            mcast: crate::mcast::Groups::default(),
        }
    }

    /// The engine split for one event at `now` (the one place a [`Ctx`] is built).
    pub(crate) fn parts(&mut self, now: Nanos) -> Parts<'_> {
        Parts {
            qps: &mut self.qps,
            ready: &mut self.ready,
            timers: &mut self.timers,
            ctx: Ctx {
                cfg: &self.cfg,
                mem: &self.memory,
                counters: &mut self.counters,
                completions: &mut self.completions,
                events: &mut self.events,
                srqs: &mut self.srqs,
                budget: &mut self.budget,
                mp_out: &mut self.mp_out,
                now,
            },
        }
    }

    /// Request PSNs in flight over all RC QPs (bounded by the device budget, see
    /// `qp::DEVICE_MAX_INFLIGHT_PSNS`), and the most any device may have.
    pub fn device_inflight_psns(&self) -> (u32, u32) {
        (self.budget.inflight, DEVICE_MAX_INFLIGHT_PSNS)
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Seal every packet with this UDP source port instead of rxe's per-QP port (for an
    /// I/O layer that cannot choose the source port per datagram). None restores rxe's.
    pub fn set_source_port(&mut self, port: Option<u16>) {
        self.source_port = port;
    }

    /// The memory table (PDs and MRs).
    pub fn memory(&self) -> &MemoryTable {
        &self.memory
    }

    /// The memory table, mutable (PD/MR control).
    pub fn memory_mut(&mut self) -> &mut MemoryTable {
        &mut self.memory
    }

    /// The GID table.
    pub fn gids(&self) -> &[Gid] {
        &self.cfg.gids
    }

    /// Replace the GID table.
    pub fn set_gids(&mut self, gids: Vec<Gid>) {
        self.cfg.gids = gids;
    }

    /// Brings the buffers of the receives each SRQ hands out next into this CPU's
    /// cache, as many bytes as its receives took since the last call (at most
    /// [`WARM_MAX`]), and returns the bytes warmed: a datapath calls it when it goes
    /// idle after receiving.
    ///
    /// Why: UCX keeps 4095 receives of 8 KiB on its SRQ and the SRQ hands them out in
    /// the order posted (IBTA, and rxe), so each SEND lands in memory last touched 32 MiB
    /// ago, and its copy waits for every line to come from DRAM; a NIC's DMA does not
    /// stall the CPU. Warmed while the application waits for the message, they are in
    /// cache when it comes.
    pub fn warm_receives(&mut self) -> usize {
        let mut warmed = 0;
        for srq in self.srqs.values_mut() {
            let mut left = std::mem::take(&mut srq.placed).min(WARM_MAX);
            for wr in &srq.queue {
                if left == 0 {
                    break;
                }
                let n = self.memory.warm(srq.pd, &wr.sg_list, left);
                left -= n;
                warmed += n;
            }
        }
        warmed
    }

    /// Post a receive to an SRQ.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> Result<(), TransportError> {
        let s = self.srqs.get_mut(&srq.0).ok_or(TransportError::NotFound)?;
        if wr.sg_list.len() > s.attr.max_sge.max(1) as usize {
            return Err(TransportError::InvalidArgument("too many sges"));
        }
        if s.queue.len() >= s.attr.max_wr as usize {
            return Err(TransportError::NoMemory);
        }
        s.queue.push_back(wr);
        Ok(())
    }

    /// Post a send WR. EINVAL in RESET/INIT/RTR (like rxe); in ERR the WR completes at
    /// once with WR_FLUSH_ERR.
    pub fn post_send(&mut self, now: Nanos, qpn: Qpn, wr: SendWr) -> Result<(), TransportError> {
        let n = qpn.value();
        let qp = self.qps.get(&n).ok_or(TransportError::NotFound)?;
        let len = check_send_wr(qp, &self.cfg, &wr)?;
        if qp.req.sq.len() >= qp.init.cap.max_send_wr as usize {
            return Err(TransportError::NoMemory);
        }
        let local = if qp.state == QpState::Err {
            None
        } else {
            let pd = qp.init.pd;
            execute_local_op(&mut self.memory, pd, n, &wr)
        };
        let Parts {
            qps,
            ready,
            timers,
            mut ctx,
        } = self.parts(now);
        let qp = qps.get_mut(&n).ok_or(TransportError::NotFound)?;
        if qp.state == QpState::Err {
            let wc = Completion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: crate::qp::wc_opcode(wr.opcode),
                qp_num: n,
                ..Completion::default()
            };
            qp.post_completion(&mut ctx, true, wc);
            return Ok(());
        }
        let signaled = qp.init.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        qp.req.sq.push_back(SendWqe {
            wr,
            signaled,
            len,
            started: false,
            sent_at: 0,
            first_psn: Psn::default(),
            npkts: 0,
            mtu: 0,
            read_next_psn: Psn::default(),
            done: false,
            rtt_sample: false,
            status: local,
        });
        sync(qp, &mut ctx, ready, timers);
        Ok(())
    }

    /// Post a receive WR. EINVAL in RESET or on an SRQ-attached QP; in ERR it completes
    /// at once with WR_FLUSH_ERR.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), TransportError> {
        use TransportError::InvalidArgument as E;
        let n = qpn.value();
        let qp = self.qps.get_mut(&n).ok_or(TransportError::NotFound)?;
        if qp.state == QpState::Reset {
            return Err(E("QP in RESET"));
        }
        if qp.init.srq.is_some() {
            return Err(E("QP uses an SRQ"));
        }
        if wr.sg_list.len() > qp.init.cap.max_recv_sge as usize {
            return Err(E("too many sges"));
        }
        if qp.rq.len() >= qp.init.cap.max_recv_wr as usize {
            return Err(TransportError::NoMemory);
        }
        if qp.state == QpState::Err {
            let wc = Completion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: n,
                ..Completion::default()
            };
            self.completions.push_back((qp.init.recv_cq, wc));
            return Ok(());
        }
        qp.rq.push_back(wr);
        Ok(())
    }

    /// Handle one received RoCEv2 UDP payload (BTH .. ICRC). Anything invalid is
    /// dropped and counted, never a panic.
    pub fn handle_datagram(&mut self, now: Nanos, info: &DatagramInfo, udp_payload: &[u8]) {
        if wire::is_bundle(udp_payload) {
            self.handle_bundle(now, info, udp_payload);
        } else {
            self.handle_packet(now, info, udp_payload, false);
        }
    }

    /// A bundle: each of its packets as if it had come alone (accepted from any peer:
    /// each packet still passes its own ICRC and every check of a plain one).
    fn handle_bundle(&mut self, now: Nanos, info: &DatagramInfo, udp_payload: &[u8]) {
        self.counters.rx_bundles += 1;
        let mut packets = wire::bundle_packets(udp_payload);
        for p in packets.by_ref() {
            self.handle_packet(now, info, p, true);
        }
        if packets.malformed() {
            self.counters.drop_malformed += 1;
        }
    }

    /// One packet (BTH .. ICRC), alone in its datagram or `bundled`.
    fn handle_packet(
        &mut self,
        now: Nanos,
        info: &DatagramInfo,
        udp_payload: &[u8],
        bundled: bool,
    ) {
        let (src, sport) = (info.src.ip(), info.src.port());
        let pseudo = UdpPseudo::from_addrs(src, info.dst, sport, self.cfg.udp_port, 0);
        match self.check_icrc(info, &pseudo, udp_payload, bundled) {
            IdCheck::Matched { mispredicted } => {
                self.counters.icrc_ipv4_id_mispredicted += u64::from(mispredicted);
            }
            IdCheck::Resynced => self.counters.icrc_ipv4_id_resync += 1,
            IdCheck::Failed => {
                self.counters.drop_bad_icrc += 1;
                return;
            }
        }
        if udp_payload.first().is_some_and(|&op| mpw::is_mp_opcode(op)) {
            self.on_mp_packet(now, info, udp_payload);
            return;
        }
        let Ok((h, range)) = wire::parse(udp_payload) else {
            self.counters.drop_malformed += 1;
            return;
        };
        let payload = udp_payload.get(range).unwrap_or(&[]);
        self.dispatch(now, info, &h, payload, udp_payload.len());
    }

    /// Checks a received packet's ICRC, whose `pseudo` header is right but for the IPv4
    /// ID: a bundled packet was sealed with ID 0 (see `softhca_wire::bundle`), any other
    /// with the ID its datagram carried, which the tracker predicts.
    pub(crate) fn check_icrc(
        &mut self,
        info: &DatagramInfo,
        pseudo: &UdpPseudo,
        udp_payload: &[u8],
        bundled: bool,
    ) -> IdCheck {
        if !bundled {
            return self
                .ip_ids
                .verify(pseudo, info.src, info.segment_index, udp_payload);
        }
        if wire::verify(pseudo, udp_payload) {
            IdCheck::Matched {
                mispredicted: false,
            }
        } else {
            IdCheck::Failed
        }
    }

    /// A received packet whose ICRC matched, parsed: `payload` between its headers and
    /// its pad; `udp_len` the whole UDP payload's length.
    pub(crate) fn dispatch(
        &mut self,
        now: Nanos,
        info: &DatagramInfo,
        h: &wire::Headers,
        payload: &[u8],
        udp_len: usize,
    ) {
        if !wire::pkey_ok(h.bth.pkey) {
            self.counters.drop_bad_pkey += 1;
            return;
        }
        let dest = h.bth.dest_qp.value();
        if dest == GSI_QPN && h.bth.opcode == wire::Opcode::UD_SEND_ONLY {
            if let Some(hello) = Hello::decode(payload) {
                self.on_hello(now, info, hello);
                return;
            }
        }
        if dest != crate::mcast::MULTICAST_QPN {
            self.deliver(now, info, h, payload, udp_len, dest);
            return;
        }
        // To a multicast group: each UD QP attached to the group of the destination
        // address takes it as if it were its own (rxe `rxe_rcv_mcast_pkt`: type, state
        // and Q_Key checked per QP, a QP that fails them skipped).
        let Some(members) = self.mcast.members(&Gid::from_ip(info.dst)).cloned() else {
            self.counters.drop_unknown_qpn += 1;
            return;
        };
        for qpn in members {
            self.deliver(now, info, h, payload, udp_len, qpn);
        }
    }

    /// [`Engine::dispatch`] of a packet to QP `qpn`.
    fn deliver(
        &mut self,
        now: Nanos,
        info: &DatagramInfo,
        h: &wire::Headers,
        payload: &[u8],
        udp_len: usize,
        qpn: u32,
    ) {
        let src = info.src.ip();
        let Parts {
            qps,
            ready,
            timers,
            mut ctx,
        } = self.parts(now);
        let Some(qp) = qps.get_mut(&qpn) else {
            ctx.counters.drop_unknown_qpn += 1;
            return;
        };
        let ty = qp.init.qp_type;
        if h.bth.opcode.transport() != ty.transport() {
            ctx.counters.drop_bad_opcode += 1;
            return;
        }
        if matches!(qp.state, QpState::Reset | QpState::Init) {
            ctx.counters.drop_bad_state += 1;
            return;
        }
        if ty != QpType::Ud && !same_ip(src, qp.path.dst.ip()) && !qp.mp_accepts(src) {
            ctx.counters.drop_wrong_peer += 1;
            return;
        }
        ctx.counters.rcvd_pkts += 1;
        if ty == QpType::Rc && h.bth.opcode.is_response() {
            qp.on_response(&mut ctx, h, payload);
        } else {
            let meta = RxMeta::of(info, udp_len);
            let before = ctx.completions.len();
            qp.on_request(&mut ctx, h, payload, &meta);
            if h.ieth.is_some() {
                let inv = ctx
                    .completions
                    .iter()
                    .enumerate()
                    .skip(before)
                    .find(|(_, (_, c))| c.wc_flags.contains(WcFlags::WITH_INV))
                    .map(|(i, (_, c))| (i, c.imm_data));
                sync(qp, &mut ctx, ready, timers);
                if let Some((i, rkey)) = inv {
                    self.invalidate_for_send(now, Qpn::new(qpn), i, rkey);
                }
                return;
            }
        }
        sync(qp, &mut ctx, ready, timers);
    }

    /// The IETH of a SEND with invalidate, after its message completed (rxe
    /// `invalidate_rkey` in `execute`): the window (or region) is invalidated, or the
    /// receive completes with `IBV_WC_REM_INV_REQ_ERR` and the QP moves to ERR.
    fn invalidate_for_send(&mut self, now: Nanos, qpn: Qpn, completion: usize, rkey: u32) {
        if self.memory.invalidate(rkey).is_ok() {
            return;
        }
        if let Some((_, c)) = self.completions.get_mut(completion) {
            c.status = WcStatus::RemInvReqErr;
            c.wc_flags.remove(WcFlags::WITH_INV);
        }
        let to_err = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        if let Err(e) = self.modify_qp(now, qpn, &to_err, QpAttrMask::STATE) {
            tracing::debug!("SEND with invalidate: moving the QP to ERR failed: {e}");
        }
    }

    /// Fill `buf` with packets for one destination (a GSO batch: equal-sized packets,
    /// the last may be shorter), ICRC-sealed. None when nothing is ready.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        self.transmit_into(now, buf, None, None)
    }

    /// [`Engine::poll_transmit`] without copying request payloads and without sealing: a
    /// packet whose payload lies in one SGE of registered memory leaves it there, and
    /// `pieces` (cleared first) says, packet by packet, where the bytes are: [`TxPiece`].
    /// The Transmit's `len` and `segment_size` count the wire bytes as with
    /// `poll_transmit`, but `buf` holds only headers, pads and ICRC slots of such packets.
    /// The caller seals every piece with [`Transmit::seal`] once it knows the UDP source
    /// port and IPv4 ID the packet leaves with.
    ///
    /// The external payloads stay valid until their MR is deregistered: the caller must
    /// keep deregistration out until it has sent them (softhca's datapath holds its
    /// transmit lock across the send, and deregistration takes that lock).
    pub fn poll_transmit_gather(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        pieces: &mut Vec<TxPiece>,
    ) -> Option<Transmit> {
        self.transmit_into(now, buf, Some(pieces), None)
    }

    /// [`Engine::poll_transmit_gather`] that goes on filling `prev`, a Transmit it
    /// returned earlier (still in `buf` and `pieces`, not yet sent), with packets of the
    /// same size to the same destination. None when nothing was added (`prev` stands as
    /// it was), or when `prev` cannot grow: its last packet is shorter than the others.
    ///
    /// Why: a 64 KiB message at path MTU 4096 is 16 packets, one more than a GSO send
    /// holds (64 KiB of UDP payload), so an application that posts one WR per call
    /// (perftest) had each message leave as a 15-packet datagram and a 1-packet one;
    /// the datapath keeps that last one back until the next post and fills it up.
    pub fn poll_transmit_append(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        pieces: &mut Vec<TxPiece>,
        prev: &Transmit,
    ) -> Option<Transmit> {
        let seg = prev.segment_size.max(1);
        if !prev.len.is_multiple_of(seg) || prev.packets() != pieces.len() {
            return None;
        }
        let t = self.transmit_into(now, buf, Some(pieces), Some(prev))?;
        (t.len > prev.len).then_some(t)
    }

    fn transmit_into(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        pieces: Option<&mut Vec<TxPiece>>,
        prev: Option<&Transmit>,
    ) -> Option<Transmit> {
        if prev.is_none() {
            if let Some(p) = self.mp_out.pop_front() {
                return self.emit_mp(p, buf, pieces);
            }
        }
        let max_segs = self.cfg.max_gso_segments.max(1);
        self.wake_blocked_qps();
        // One Transmit may take packets from several QPs, one after the other: all
        // that GSO needs is one destination, source and UDP source port, and equal
        // sizes (the last may be shorter). With 1024 QPs writing to one peer, each QP
        // has about one WRITE in flight (the device budget): per-QP batches would hand
        // the kernel one short datagram per WRITE, and a responder one ACK datagram per
        // QP. A QP's packets stay in order and each QP still goes to the back of the
        // ready queue once drawn from (round robin as before).
        let mut batch = Batch::new(pieces, prev);
        let source_port = self.source_port;
        // At most one pass over the QPs ready now (a QP put back by `sync` is not
        // drawn from twice).
        let mut visits = self.ready.len();
        while let Some(&qpn) = self.ready.front() {
            if visits == 0 {
                break;
            }
            visits -= 1;
            let Parts {
                qps,
                ready,
                timers,
                mut ctx,
            } = self.parts(now);
            let Some(qp) = qps.get_mut(&qpn) else {
                ready.pop_front();
                continue;
            };
            let before = batch.count;
            let end = batch.fill_from(qp, &mut ctx, buf, max_segs, source_port);
            if end == RunEnd::TooSmall {
                return None;
            }
            let drained = end == RunEnd::Drained;
            if batch.count == before && batch.count > 0 && !drained {
                // Its next packet does not fit this batch: it opens the next one.
                break;
            }
            ready.pop_front();
            qp.in_ready = false;
            sync(qp, &mut ctx, ready, timers);
            if batch.flow.is_none() {
                continue;
            }
            // Go on to the next QP only while the batch can still grow: this QP has
            // nothing more, and its last packet was full-sized (a shorter one ends the
            // run with `Ended`).
            if !drained || batch.count >= max_segs {
                break;
            }
        }
        let f = batch.flow?;
        Some(Transmit {
            dst: f.dst,
            src: f.src,
            len: batch.wire_len,
            segment_size: f.seg,
            src_port: f.sport,
            tos: f.tos,
            only_acks: batch.only_acks,
        })
    }

    /// With room in the device budget again (below 3/4, so that a freed PSN does not
    /// wake every blocked QP for one packet each), blocked QPs get another look, first
    /// blocked first, as many as the room takes by the PSNs of each one's next WQE.
    /// Waking all of them made each plan, find the budget gone after the first few and
    /// go back.
    fn wake_blocked_qps(&mut self) {
        if self.budget.blocked.is_empty()
            || self.budget.inflight >= DEVICE_MAX_INFLIGHT_PSNS / 4 * 3
        {
            return;
        }
        let mut room = DEVICE_MAX_INFLIGHT_PSNS - self.budget.inflight;
        while room > 0 {
            let Some(qpn) = self.budget.blocked.pop_front() else {
                break;
            };
            if let Some(qp) = self.qps.get_mut(&qpn) {
                qp.budget_blocked = false;
                room = room.saturating_sub(qp.next_wqe_psns(&self.cfg));
                if !qp.in_ready {
                    qp.in_ready = true;
                    self.ready.push_back(qpn);
                }
            }
        }
    }

    /// Whether something is ready to send and all of it is ACKs: no request packet, no
    /// READ or atomic response. What a datapath may leave unbuilt for a moment, for the
    /// application's answer to take along (see softhca's `datapath`).
    pub fn only_acks_ready(&self) -> bool {
        !self.ready.is_empty()
            && self
                .ready
                .iter()
                .all(|q| self.qps.get(q).is_none_or(Qp::only_acks_to_send))
    }

    /// Run expired timers (retransmit, RNR wait).
    pub fn handle_timeout(&mut self, now: Nanos) {
        while let Some((qpn, gen)) = self.timers.pop_due(now) {
            let Parts {
                qps,
                ready,
                timers,
                mut ctx,
            } = self.parts(now);
            let Some(qp) = qps.get_mut(&qpn) else {
                continue;
            };
            if qp.timer_gen != gen {
                continue; // superseded by an earlier deadline
            }
            qp.armed = None;
            match qp.timer {
                None => continue,
                Some(t) if t > now => {
                    // The deadline moved on since this entry was pushed.
                    qp.timer_gen += 1;
                    qp.armed = Some(t);
                    timers.push(t, qp.qpn, qp.timer_gen);
                    continue;
                }
                Some(_) => {}
            }
            qp.timer = None;
            qp.on_timer(&mut ctx);
            sync(qp, &mut ctx, ready, timers);
        }
    }

    /// The earliest timer deadline (at most one per QP: it may be earlier than the QP's
    /// current deadline, then handling it re-arms and does nothing else).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.timers.peek()
    }

    /// Whether completions wait to be delivered.
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Whether a completion waiting to be taken is for `cq`.
    pub fn has_completion_on(&self, cq: CqId) -> bool {
        self.completions.iter().any(|(c, _)| *c == cq)
    }

    /// What a received segment (a UDP payload, BTH first) is, from its BTH alone: not
    /// checked, for a caller deciding in which order to feed what it received.
    pub fn segment_kind(udp_payload: &[u8]) -> SegmentKind {
        match softhca_wire::Bth::parse(udp_payload) {
            Ok(bth) if bth.opcode.is_ack() => SegmentKind::Ack { qpn: bth.dest_qp },
            _ => SegmentKind::Other,
        }
    }

    /// The send CQ of QP `qpn` (where an ACK to it completes work), if it is here.
    pub fn send_cq(&self, qpn: Qpn) -> Option<CqId> {
        self.qps.get(&qpn.value()).map(|qp| qp.init.send_cq)
    }

    /// Take one completion.
    pub fn poll_completion(&mut self) -> Option<(CqId, Completion)> {
        self.completions.pop_front()
    }

    /// Take one async event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// Protocol counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Gauges of what a flood could try to grow (bounded resources): the
    /// longest response queue, READ/atomic replay cache, early-request buffer and
    /// receive queue of any QP, and the device's kept bytes and request PSNs in flight.
    /// Each has a cap: max_dest_rd_atomic (+ coalesced ACKs), max_dest_rd_atomic,
    /// `responder::OOO_MAX`, max_recv_wr, `responder::DEVICE_OOO_BYTES` and
    /// `qp::DEVICE_MAX_INFLIGHT_PSNS`.
    pub fn resource_gauges(&self) -> [(&'static str, u64); 6] {
        let (mut out, mut res, mut ooo, mut rq) = (0usize, 0usize, 0usize, 0usize);
        for qp in self.qps.values() {
            out = out.max(qp.resp.out.len());
            res = res.max(qp.resp.res.len());
            ooo = ooo.max(qp.resp.ooo.len());
            rq = rq.max(qp.rq.len());
        }
        [
            ("gauge_resp_queue_max", out as u64),
            ("gauge_rd_atomic_replay_max", res as u64),
            ("gauge_ooo_kept_max", ooo as u64),
            ("gauge_ooo_bytes", self.budget.ooo_bytes as u64),
            ("gauge_recv_queue_max", rq as u64),
            ("gauge_inflight_psns", u64::from(self.budget.inflight)),
        ]
    }

    /// Is any QP ready to transmit? (Cheap check for the datapath loop.)
    pub fn has_transmit(&self) -> bool {
        !self.ready.is_empty() || !self.mp_out.is_empty()
    }

    /// A QP's multipath figures (None: no such QP, or plain RC).
    pub fn mp_stats(&self, qpn: Qpn) -> Option<MpStats> {
        self.qps.get(&qpn.value())?.mp_stats()
    }

    /// Every QP's multipath figures, in QPN order.
    pub fn mp_all(&self) -> Vec<(Qpn, MpStats)> {
        self.per_qp(Qp::mp_stats)
    }

    /// `figures` of every QP that has them, in QPN order.
    fn per_qp<T>(&self, figures: impl Fn(&Qp) -> Option<T>) -> Vec<(Qpn, T)> {
        let mut v: Vec<_> = self
            .qps
            .values()
            .filter_map(|qp| Some((qp.qpn_t(), figures(qp)?)))
            .collect();
        v.sort_by_key(|(q, _)| q.value());
        v
    }

    /// An extension packet (its own Transmit, one packet).
    fn emit_mp(
        &mut self,
        p: MpPacket,
        buf: &mut [u8],
        pieces: Option<&mut Vec<TxPiece>>,
    ) -> Option<Transmit> {
        let n = p.bytes.len();
        let total = n + wire::ICRC_LEN;
        let pkt = buf.get_mut(..total)?;
        pkt.get_mut(..n)?.copy_from_slice(&p.bytes);
        let sport = sealed_sport(self.source_port, p.sport, &self.cfg.mp.ports);
        match pieces {
            Some(list) => {
                list.clear();
                pkt.get_mut(n..)?.fill(0);
                list.push(TxPiece {
                    start: 0,
                    head: n,
                    external: None,
                    tail: wire::ICRC_LEN,
                    tail_crc: None,
                });
            }
            None => {
                let pseudo = UdpPseudo::from_addrs(p.src, p.dst.ip(), sport, p.dst.port(), 0);
                seal_packet(&pseudo, pkt, n, None)?;
            }
        }
        self.counters.sent_pkts += 1;
        Some(Transmit {
            dst: p.dst,
            src: p.src,
            len: total,
            segment_size: total,
            src_port: sport,
            tos: p.tos,
            only_acks: false,
        })
    }

    /// A multipath extension packet (SACK, probe, probe answer) for one of our QPs.
    fn on_mp_packet(&mut self, now: Nanos, info: &DatagramInfo, udp_payload: &[u8]) {
        let Ok(bth) = wire::Bth::parse(udp_payload) else {
            self.counters.drop_malformed += 1;
            return;
        };
        let end = udp_payload.len().saturating_sub(wire::ICRC_LEN);
        let body = udp_payload.get(wire::BTH_LEN..end).unwrap_or(&[]);
        let Parts {
            qps,
            ready,
            timers,
            mut ctx,
        } = self.parts(now);
        let Some(qp) = qps.get_mut(&bth.dest_qp.value()).filter(|q| q.mp.is_some()) else {
            ctx.counters.drop_bad_opcode += 1;
            return;
        };
        ctx.counters.rcvd_pkts += 1;
        qp.mp_on_packet(&mut ctx, info.src, info.dst, &bth, body);
        sync(qp, &mut ctx, ready, timers);
    }

    /// Whether a negotiation MAD belongs to a negotiation of ours: an answer with the
    /// nonce one of our QPs asked with, or a question from the peer one of our QPs is
    /// connected to, about that QP. What it says is believed only then: a forged MAD
    /// must guess a QPN pair or a nonce to make us send bundles to a peer (rxe) that
    /// drops them.
    fn hello_is_for_us(&self, peer: IpAddr, hello: &Hello) -> bool {
        if hello.answer {
            return self.qps.values().any(|q| {
                q.mp.as_ref().is_some_and(|m| {
                    m.nonce == hello.nonce && m.state == crate::multipath::MpState::Negotiating
                }) && same_ip(peer, q.path.dst.ip())
            });
        }
        self.qps.get(&hello.to_qpn).is_some_and(|q| {
            q.is_rc() && q.attr.dest_qp_num == hello.from_qpn && same_ip(peer, q.path.dst.ip())
        })
    }

    /// What a negotiation MAD says of its sender's bundles: each of its addresses takes
    /// them up to a size, or (a Linux host's answer, an older softhca) none does. Every
    /// MAD says it again, so a peer restarted as something else is believed at its first.
    fn note_bundles(&mut self, src: IpAddr, hello: &Hello) {
        let max = if self.cfg.bundle_max > 0 {
            hello.bundle_max
        } else {
            0
        };
        for ip in std::iter::once(src).chain(hello.addrs.iter().copied()) {
            if max == 0 {
                self.bundle_peers.remove(&ip);
            } else if self.bundle_peers.len() < MAX_BUNDLE_PEERS {
                self.bundle_peers.insert(ip, max);
            }
        }
    }

    /// The largest bundle (`softhca_wire::bundle`) packets to `dst` may leave in, as its
    /// device said in multipath's negotiation; 0: none.
    pub fn bundles_to(&self, dst: SocketAddr) -> usize {
        if dst.port() != self.cfg.udp_port {
            return 0;
        }
        self.bundle_peers.get(&dst.ip()).copied().unwrap_or(0)
    }

    /// A multipath negotiation MAD: a peer asks about one of our QPs, or answers us.
    fn on_hello(&mut self, now: Nanos, info: &DatagramInfo, hello: Hello) {
        let enabled = self.cfg.mp.enabled;
        let port = self.cfg.udp_port;
        let bundle_max = self.cfg.bundle_max;
        if self.hello_is_for_us(info.src.ip(), &hello) {
            self.note_bundles(info.src.ip(), &hello);
        }
        let Parts {
            qps,
            ready,
            timers,
            mut ctx,
        } = self.parts(now);
        let peer = info.src.ip();
        if hello.answer {
            let found = qps.values_mut().find(|q| {
                q.mp.as_ref().is_some_and(|m| {
                    m.nonce == hello.nonce && m.state == crate::multipath::MpState::Negotiating
                }) && same_ip(peer, q.path.dst.ip())
            });
            let Some(qp) = found else {
                return;
            };
            if hello.status == 0 && hello.to_qpn == qp.qpn && enabled {
                qp.mp_turn_on(&mut ctx, &hello);
            } else {
                qp.mp_turn_off(&mut ctx);
            }
            sync(qp, &mut ctx, ready, timers);
            return;
        }
        let qp = qps.get_mut(&hello.to_qpn);
        let qp = qp.filter(|q| q.negotiates() && q.attr.dest_qp_num == hello.from_qpn);
        let Some(qp) = qp.filter(|_| enabled) else {
            // Multipath off here: say no at once. No such QP (yet, or connected
            // elsewhere): silence; a QP not created yet is asked again.
            if !enabled {
                let no = Hello {
                    answer: true,
                    status: mpw::STATUS_UNSUPPORTED,
                    from_qpn: hello.to_qpn,
                    to_qpn: hello.from_qpn,
                    nonce: hello.nonce,
                    addrs: Vec::new(),
                    sports: 1,
                    bundle_max,
                    packet_max: 0,
                };
                if let Some(bytes) = no.encode() {
                    ctx.mp_out.push_back(MpPacket {
                        src: info.dst,
                        dst: SocketAddr::new(peer, port),
                        sport: info.src.port(),
                        tos: info.tos,
                        bytes,
                    });
                }
            }
            return;
        };
        let ready_state = matches!(
            qp.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        if !enabled || !ready_state || !same_ip(peer, qp.path.dst.ip()) {
            return;
        }
        if qp.mp.is_none() {
            qp.mp = Some(Box::new(Multipath::new(now, hello.nonce)));
        }
        qp.mp_turn_on(&mut ctx, &hello);
        if let Some(pkt) = qp.mp_hello(&ctx, true, 0, hello.nonce) {
            ctx.mp_out.push_back(pkt);
        }
        sync(qp, &mut ctx, ready, timers);
    }

    /// Every QP as `rdma res show qp` lists a kernel device's (plus its queues), in QPN
    /// order: for diagnostics from outside the process, so a copy, never a reference.
    pub fn qp_resources(&self) -> Vec<QpResource> {
        let mut v: Vec<QpResource> = self
            .qps
            .values()
            .map(|qp| QpResource {
                qpn: qp.qpn,
                qp_type: qp.init.qp_type,
                state: qp.state,
                pd: qp.init.pd.0,
                dest_qpn: qp.attr.dest_qp_num,
                dest: (!qp.path.dst.ip().is_unspecified()).then_some(qp.path.dst),
                path_mtu: qp.attr.path_mtu,
                sq_psn: qp.req.next_psn.value(),
                una_psn: qp.req.una.value(),
                rq_psn: qp.resp.epsn.value(),
                send_queued: qp.req.sq.len() as u32,
                recv_posted: qp.rq.len() as u32,
                inflight_psns: qp.req.max_sent.diff(qp.req.una).max(0) as u32,
                rd_atomic_inflight: qp.req.rd_atomic_inflight,
            })
            .collect();
        v.sort_by_key(|q| q.qpn);
        v
    }

    /// Every RC QP's congestion control figures (those whose controller started).
    pub fn cc_stats(&self) -> Vec<(Qpn, crate::cc::CcStats)> {
        self.per_qp(Qp::cc_stats)
    }

    /// A QP's congestion control figures (None: no such QP, or no controller yet).
    pub fn qp_cc_stats(&self, qpn: Qpn) -> Option<crate::cc::CcStats> {
        self.qps.get(&qpn.value())?.cc_stats()
    }

    /// Outstanding PSN span of a QP's requester (diagnostics and tests).
    pub fn inflight_psns(&self, qpn: Qpn) -> Option<u32> {
        let qp = self.qps.get(&qpn.value())?;
        Some(qp.req.max_sent.diff(qp.req.una).max(0) as u32)
    }
}
