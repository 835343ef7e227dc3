//! The engine: QP table, packet demultiplexing and the verbs-facing API.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use std::net::{IpAddr, SocketAddr};

use crate::counters::Counters;
use crate::error::TransportError;
use crate::packet::{self, op, IcrcInfo};
use crate::path::Path;
use crate::qp::state::modify_is_ok;
use crate::qp::{psn_diff, Budget, Ctx, Qp, SendWqe, Srq, DEVICE_MAX_INFLIGHT_PSNS};
use crate::requester::External;
use crate::responder::RxMeta;
use crate::timers::Timers;
use crate::verbs::*;

/// Engine configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// GID table: the addresses this device serves.
    pub gids: Vec<Gid>,
    /// RoCEv2 UDP port (4791).
    pub udp_port: u16,
    /// Seed for randomised choices (initial values only; the datapath is deterministic).
    pub seed: u64,
    /// Largest path MTU this device supports.
    pub max_mtu: Mtu,
    /// Largest queue depth.
    pub max_qp_wr: u32,
    /// Largest scatter/gather list.
    pub max_sge: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
    /// Largest max_rd_atomic / max_dest_rd_atomic.
    pub max_qp_rd_atom: u8,
    /// Largest number of packets per [`Transmit`] (1 disables batching).
    pub max_gso_segments: usize,
    /// Send each packet of a multi-packet RC RDMA WRITE (without immediate) as an RDMA
    /// WRITE Only with a RETH for its own part, instead of First/Middle/Last.
    ///
    /// Why: a GSO batch holds equal-sized packets (the last may be shorter), and a
    /// WRITE First is 16 bytes longer than the Middles (its RETH), so a classic
    /// 64 KiB WRITE leaves as two batches, two skbs on each side. As Only packets it
    /// leaves as one, which measured +15-30 % WRITE bandwidth on loopback (64 KiB,
    /// 1 QP). The peer sees valid single-packet WRITEs in PSN order: the same bytes
    /// land at the same places, each packet's range is checked against the rkey, and
    /// the ACKs are the same (AckReq on the WR's last packet). What differs: a WRITE
    /// that runs past the end of the remote MR has its in-bounds packets placed
    /// before the NAK (a First carries the whole length and is refused whole), and a
    /// capture shows Only packets where rxe shows First/Middle/Last. UC keeps
    /// First/Middle/Last: there a lost packet must drop the whole message.
    pub split_rc_writes: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            gids: Vec::new(),
            udp_port: 4791,
            seed: 0,
            max_mtu: Mtu::M4096,
            max_qp_wr: 16384,
            max_sge: 32,
            max_inline_data: 256,
            max_qp_rd_atom: 128,
            max_gso_segments: 64,
            split_rc_writes: true,
        }
    }
}

/// Where a received datagram came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatagramInfo {
    /// Source IP and UDP port.
    pub src: SocketAddr,
    /// Destination IP (one of our GIDs).
    pub dst: IpAddr,
    /// Index within a GRO batch (the IPv4 ID candidate for the ICRC).
    pub segment_index: u16,
}

/// A batch of packets to send: `buf[..len]` holds `ceil(len / segment_size)` packets
/// (the last may be shorter), all to `dst` from `src`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination IP and UDP port.
    pub dst: SocketAddr,
    /// Source IP.
    pub src: IpAddr,
    /// Bytes used in the buffer.
    pub len: usize,
    /// Size of each packet but the last.
    pub segment_size: usize,
    /// UDP source port the packets were sealed with (the ICRC covers it): rxe's fixed
    /// per-QP port, or the one set by [`Engine::set_source_port`].
    pub src_port: u16,
}

impl Transmit {
    /// Seals packet `index` of this Transmit (again, unless [`Engine::set_late_seal`] left
    /// it unsealed), laid out back to back in `buf` (no external payload), for the UDP
    /// source port and IPv4 ID it will really leave with:
    /// the datapath's connected per-peer sockets (`softhca_io::ConnectedSender`) send
    /// from their own port, and Linux numbers their packets from a per-socket counter.
    /// Returns false when the packet is not in `buf`.
    pub fn reseal(&self, buf: &mut [u8], index: usize, sport: u16, ipv4_id: u16) -> bool {
        let seg = self.segment_size.max(1);
        let start = index.saturating_mul(seg);
        let end = (start + seg).min(self.len);
        self.seal_at(buf, start..end, sport, ipv4_id, None)
    }

    /// Seals `piece`, a packet of this Transmit built wholly in `buf` (no external
    /// payload) and left unsealed ([`Engine::set_late_seal`]), for the UDP source port and
    /// IPv4 ID it leaves with. Returns false when it is not wholly in `buf`.
    pub fn seal(&self, buf: &mut [u8], piece: &TxPiece, sport: u16, ipv4_id: u16) -> bool {
        piece.external.is_none()
            && self.seal_at(
                buf,
                piece.start..piece.start + piece.head + piece.tail,
                sport,
                ipv4_id,
                piece.tail_crc,
            )
    }

    /// Writes the ICRC of the packet at `buf[at]` (its last 4 bytes); with `tail`, from
    /// its headers and the CRC its payload got as it was copied in.
    fn seal_at(
        &self,
        buf: &mut [u8],
        at: std::ops::Range<usize>,
        sport: u16,
        ipv4_id: u16,
        tail: Option<TailCrc>,
    ) -> bool {
        let Some(pkt) = buf.get_mut(at) else {
            return false;
        };
        let Some(body) = pkt.len().checked_sub(softhca_wire::ICRC_LEN) else {
            return false;
        };
        let info = IcrcInfo {
            src: self.src,
            dst: self.dst.ip(),
            sport,
            dport: self.dst.port(),
            ipv4_id,
        };
        packet::seal_with_tail(&info, pkt, body, tail).is_some()
    }

    /// Packets in this Transmit.
    pub fn packets(&self) -> usize {
        self.len.div_ceil(self.segment_size.max(1))
    }
}

/// One packet of a Transmit from [`Engine::poll_transmit_gather`]: its wire bytes are
/// `buf[start..start + head]`, then the `external` payload if any, then
/// `buf[start + head..start + head + tail]` (pad and ICRC). Without `external` the
/// packet is simply `buf[start..start + head + tail]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPiece {
    /// Where the packet starts in the transmit buffer.
    pub start: usize,
    /// Bytes in the buffer before the external payload (the headers).
    pub head: usize,
    /// The payload left in registered memory.
    pub external: Option<External>,
    /// Bytes in the buffer after the external payload (pad, ICRC).
    pub tail: usize,
    /// The CRC of the packet's payload and pad, taken as they were copied in (an RDMA
    /// READ response's payload): sealing hashes the headers only.
    pub tail_crc: Option<TailCrc>,
}

/// The CRC-32 (initial value 0) of a packet's bytes from `at` up to its ICRC, computed
/// while they were copied into the transmit buffer (`MemoryTable::remote_read_crc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailCrc {
    /// Offset in the packet of the first byte covered (the payload's).
    pub at: usize,
    /// Their CRC-32, as crc32fast computes it from the initial value 0.
    pub crc: u32,
}

impl TxPiece {
    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        self.head + self.external.map_or(0, |e| e.len) + self.tail
    }
}

/// The sans-IO RoCEv2 engine.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    memory: MemoryTable,
    counters: Counters,
    qps: HashMap<u32, Qp>,
    next_qpn: u32,
    cqs: HashMap<u32, ()>,
    next_cq: u32,
    srqs: HashMap<u32, Srq>,
    next_srq: u32,
    completions: VecDeque<(CqId, Completion)>,
    events: VecDeque<AsyncEvent>,
    /// QPs that may have packets to send (each at most once).
    ready: VecDeque<u32>,
    timers: Timers,
    source_port: Option<u16>,
    /// Leave the ICRC of packets built wholly in the transmit buffer to the caller
    /// (see [`Engine::set_late_seal`]).
    late_seal: bool,
    /// Per IPv4 peer: the IPv4 ID its last packet carried (for the ICRC).
    /// Per peer flow (IP and UDP source port, see `verify_icrc`).
    ip_ids: HashMap<SocketAddr, PeerIpId>,
    /// Request PSNs in flight over all QPs, and the QPs waiting for room.
    budget: Budget,
}

#[derive(Debug, Clone, Copy)]
struct PeerIpId {
    last: u16,
    misses: u32,
    /// The last ID that matched was its packet's GSO segment index: the peer numbers its
    /// packets per GSO send, as softhca's device socket does (0 for a plain datagram),
    /// not per packet (rxe) or per datagram (connected sockets).
    per_send: bool,
    /// The ID of segment 0 of the datagram being read: segment `k` has this plus `k`
    /// (GSO numbers segments on from the first one's ID, which is 0 for an unconnected
    /// socket and the counter for a connected one).
    base: u16,
}

/// How far ahead of the predicted IPv4 ID a solved ID is believed without more evidence.
const ID_RESYNC_WINDOW: u16 = 4096;
/// IDs this far behind the last one are tried at full strength (reordered sends).
const ID_BEHIND: u16 = 8;
/// How far behind the last ID a solved ID is believed.
const ID_RESYNC_BEHIND: u16 = 64;
/// After this many ICRC misses in a row from one peer, any solved ID is believed.
const ID_RESYNC_MISSES: u32 = 16;
/// Bound on remembered peers (memory under a flood of spoofed sources).
const MAX_ID_PEERS: usize = 4096;

/// First QPN handed out (rxe: QPNs 0 and 1 are the special QPs; user QPs from 0x11).
const FIRST_QPN: u32 = 0x11;

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

macro_rules! ctx {
    ($s:ident, $now:expr) => {
        Ctx {
            cfg: &$s.cfg,
            mem: &$s.memory,
            counters: &mut $s.counters,
            completions: &mut $s.completions,
            events: &mut $s.events,
            srqs: &mut $s.srqs,
            budget: &mut $s.budget,
            now: $now,
        }
    };
}

/// After any event on a QP: re-arm its timer and put it on the ready queue if it has
/// something to send.
fn sync(qp: &mut Qp, ctx: &mut Ctx<'_>, ready: &mut VecDeque<u32>, timers: &mut Timers) {
    qp.complete_sends(ctx);
    let cur = qp.inflight_psns();
    ctx.budget.inflight = ctx
        .budget
        .inflight
        .saturating_sub(qp.reported_inflight)
        .saturating_add(cur);
    qp.reported_inflight = cur;
    let ooo = qp.resp.ooo_bytes;
    ctx.budget.ooo_bytes = ctx
        .budget
        .ooo_bytes
        .saturating_sub(qp.reported_ooo)
        .saturating_add(ooo);
    qp.reported_ooo = ooo;
    let want = qp.deadline();
    qp.timer = want;
    if let Some(t) = want {
        if qp.armed.is_none_or(|a| t < a) {
            qp.timer_gen += 1;
            qp.armed = Some(t);
            timers.push(t, qp.qpn, qp.timer_gen);
        }
    }
    if !qp.in_ready {
        ctx.budget.hit = false;
        if qp.has_output(ctx) {
            qp.in_ready = true;
            ready.push_back(qp.qpn);
        } else if ctx.budget.hit && !qp.budget_blocked {
            qp.budget_blocked = true;
            ctx.budget.blocked.push_back(qp.qpn);
        }
    }
    // Planning may have found a local error on the next WQE (bad lkey, UD too long):
    // complete it now rather than at the next event.
    if qp.req.sq.front().is_some_and(|w| w.status.is_some()) {
        qp.complete_sends(ctx);
    }
}

fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    Gid::from_ip(a) == Gid::from_ip(b)
}

impl Engine {
    /// A new engine.
    pub fn new(cfg: EngineConfig) -> Self {
        let next_qpn = first_qpn(cfg.seed);
        Engine {
            memory: MemoryTable::new(cfg.seed ^ 0x5eed_cafe_f00d_d00d),
            cfg,
            counters: Counters::default(),
            qps: HashMap::default(),
            next_qpn,
            cqs: HashMap::default(),
            next_cq: 1,
            srqs: HashMap::default(),
            next_srq: 1,
            completions: VecDeque::new(),
            events: VecDeque::new(),
            ready: VecDeque::new(),
            timers: Timers::default(),
            source_port: None,
            late_seal: false,
            ip_ids: HashMap::default(),
            budget: Budget::default(),
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

    /// With `on`, [`Engine::poll_transmit_gather`] and [`Engine::poll_transmit_append`]
    /// build the packets that lie wholly in the transmit buffer (no external payload)
    /// without their ICRC (left zero): the caller seals each with [`Transmit::seal`] once
    /// it knows the UDP source port and IPv4 ID it leaves with, both of which the ICRC
    /// covers (IBTA A17.4.1 masks neither).
    ///
    /// Why: softhca's datapath sends small transmits through a socket connected to the
    /// peer, from another source port and with IDs Linux counts per socket, and had to
    /// seal those packets twice (for an 8 B SEND ping-pong, the SEND and its ACK: about a
    /// tenth of the instructions of a turnaround). Packets with an external payload are
    /// always sealed here, while their memory is known to be registered.
    pub fn set_late_seal(&mut self, on: bool) {
        self.late_seal = on;
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

    /// Create a completion queue.
    pub fn create_cq(&mut self) -> CqId {
        let id = self.next_cq;
        self.next_cq += 1;
        self.cqs.insert(id, ());
        CqId(id)
    }

    /// Destroy a completion queue (Busy while QPs use it). Its pending completions go.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), TransportError> {
        if !self.cqs.contains_key(&cq.0) {
            return Err(TransportError::NotFound);
        }
        if self
            .qps
            .values()
            .any(|q| q.init.send_cq == cq || q.init.recv_cq == cq)
        {
            return Err(TransportError::Busy);
        }
        self.cqs.remove(&cq.0);
        self.completions.retain(|(c, _)| *c != cq);
        Ok(())
    }

    /// Create a shared receive queue.
    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<SrqId, TransportError> {
        if attr.max_wr == 0 || attr.max_wr > self.cfg.max_qp_wr {
            return Err(TransportError::InvalidArgument("srq max_wr"));
        }
        if attr.max_sge > self.cfg.max_sge {
            return Err(TransportError::InvalidArgument("srq max_sge"));
        }
        let id = self.next_srq;
        self.next_srq += 1;
        self.srqs.insert(
            id,
            Srq {
                pd,
                attr,
                queue: VecDeque::new(),
                users: 0,
            },
        );
        Ok(SrqId(id))
    }

    /// Modify an SRQ (`mask`: [`SRQ_MAX_WR`] | [`SRQ_LIMIT`]).
    pub fn modify_srq(
        &mut self,
        srq: SrqId,
        attr: SrqAttr,
        mask: u32,
    ) -> Result<(), TransportError> {
        let s = self.srqs.get_mut(&srq.0).ok_or(TransportError::NotFound)?;
        if mask & !(SRQ_MAX_WR | SRQ_LIMIT) != 0 {
            return Err(TransportError::InvalidArgument("srq attr mask"));
        }
        let max_wr = if mask & SRQ_MAX_WR != 0 {
            attr.max_wr
        } else {
            s.attr.max_wr
        };
        if max_wr == 0 || max_wr > self.cfg.max_qp_wr || (max_wr as usize) < s.queue.len() {
            return Err(TransportError::InvalidArgument("srq max_wr"));
        }
        if mask & SRQ_LIMIT != 0 && attr.srq_limit > max_wr {
            return Err(TransportError::InvalidArgument("srq_limit above max_wr"));
        }
        s.attr.max_wr = max_wr;
        if mask & SRQ_LIMIT != 0 {
            s.attr.srq_limit = attr.srq_limit;
        }
        Ok(())
    }

    /// Query an SRQ.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, TransportError> {
        self.srqs
            .get(&srq.0)
            .map(|s| s.attr)
            .ok_or(TransportError::NotFound)
    }

    /// Destroy an SRQ (Busy while QPs use it).
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), TransportError> {
        let s = self.srqs.get(&srq.0).ok_or(TransportError::NotFound)?;
        if s.users > 0 {
            return Err(TransportError::Busy);
        }
        self.srqs.remove(&srq.0);
        Ok(())
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

    /// Create a QP in RESET. QPNs start at 0x11 like rxe.
    pub fn create_qp(&mut self, init: &QpInitAttr) -> Result<Qpn, TransportError> {
        let init = self.admit_qp(init)?;
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) {
            qpn = (qpn + 1) & 0x00ff_ffff;
            if qpn < FIRST_QPN {
                qpn = FIRST_QPN;
            }
        }
        self.next_qpn = ((qpn + 1) & 0x00ff_ffff).max(FIRST_QPN);
        self.qps.insert(qpn, Qp::new(qpn, init));
        Ok(crate::deps::qpn(qpn))
    }

    /// The checks of a QP's creation attributes, with its SRQ counted and its
    /// capabilities rounded as rxe does.
    fn admit_qp(&mut self, init: &QpInitAttr) -> Result<QpInitAttr, TransportError> {
        if !self.cqs.contains_key(&init.send_cq.0) || !self.cqs.contains_key(&init.recv_cq.0) {
            return Err(TransportError::InvalidArgument("no such cq"));
        }
        let c = &init.cap;
        if c.max_send_wr > self.cfg.max_qp_wr
            || c.max_recv_wr > self.cfg.max_qp_wr
            || c.max_send_sge > self.cfg.max_sge
            || c.max_recv_sge > self.cfg.max_sge
            || c.max_inline_data > self.cfg.max_inline_data
        {
            return Err(TransportError::InvalidArgument(
                "qp capabilities above device limits",
            ));
        }
        if let Some(srq) = init.srq {
            let s = self
                .srqs
                .get_mut(&srq.0)
                .ok_or(TransportError::InvalidArgument("no such srq"))?;
            s.users += 1;
        }
        let mut init = *init;
        // Like rxe, a zero capability still allows one entry.
        init.cap.max_send_wr = init.cap.max_send_wr.max(1);
        init.cap.max_recv_wr = init.cap.max_recv_wr.max(1);
        init.cap.max_send_sge = init.cap.max_send_sge.max(1);
        init.cap.max_recv_sge = init.cap.max_recv_sge.max(1);
        Ok(init)
    }

    /// Create the device's GSI QP (`IB_QPT_GSI`, QPN 1): a UD QP through which CM MADs
    /// are sent and received. One per device: [`TransportError::Busy`] if it exists.
    pub fn create_gsi_qp(&mut self, init: &QpInitAttr) -> Result<Qpn, TransportError> {
        if init.qp_type != QpType::Ud {
            return Err(TransportError::InvalidArgument("the GSI QP is a UD QP"));
        }
        if self.qps.contains_key(&GSI_QPN) {
            return Err(TransportError::Busy);
        }
        let init = self.admit_qp(init)?;
        self.qps.insert(GSI_QPN, Qp::new(GSI_QPN, init));
        Ok(crate::deps::qpn(GSI_QPN))
    }

    fn check_attr_values(&self, qp: &Qp, a: &QpAttr, m: QpAttrMask) -> Result<(), TransportError> {
        use TransportError::InvalidArgument as E;
        if m.contains(QpAttrMask::PORT) && a.port_num != 1 {
            return Err(E("port_num"));
        }
        if m.contains(QpAttrMask::PKEY_INDEX) && a.pkey_index != 0 {
            return Err(E("pkey_index"));
        }
        if m.contains(QpAttrMask::PATH_MTU) && a.path_mtu > self.cfg.max_mtu {
            return Err(E("path_mtu above port MTU"));
        }
        if m.contains(QpAttrMask::TIMEOUT) && a.timeout > 31 {
            return Err(E("timeout"));
        }
        if m.contains(QpAttrMask::RETRY_CNT) && a.retry_cnt > 7 {
            return Err(E("retry_cnt"));
        }
        if m.contains(QpAttrMask::RNR_RETRY) && a.rnr_retry > 7 {
            return Err(E("rnr_retry"));
        }
        if m.contains(QpAttrMask::MIN_RNR_TIMER) && a.min_rnr_timer > 31 {
            return Err(E("min_rnr_timer"));
        }
        if m.contains(QpAttrMask::MAX_QP_RD_ATOMIC) && a.max_rd_atomic > self.cfg.max_qp_rd_atom {
            return Err(E("max_rd_atomic"));
        }
        // max_dest_rd_atomic is not checked (rxe_qp_chk_attr takes any value): the
        // responder's queue of READ/atomic responses is bounded on its own.
        if m.contains(QpAttrMask::AV) && Path::resolve(&self.cfg, &a.ah_attr, qp.qpn).is_none() {
            return Err(E("address vector: bad sgid_index or address family"));
        }
        if m.contains(QpAttrMask::CAP) {
            return Err(E("cap cannot be modified"));
        }
        Ok(())
    }

    /// Modify a QP (`ibv_modify_qp`): the transition and masks are checked against the
    /// IBTA / kernel table; illegal ones are EINVAL.
    pub fn modify_qp(
        &mut self,
        now: Nanos,
        qpn: Qpn,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), TransportError> {
        let n = crate::deps::qpn_value(qpn);
        let qp = self.qps.get(&n).ok_or(TransportError::NotFound)?;
        let cur = if mask.contains(QpAttrMask::CUR_STATE) {
            if attr.cur_qp_state != qp.state {
                return Err(TransportError::InvalidArgument(
                    "cur_qp_state does not match",
                ));
            }
            attr.cur_qp_state
        } else {
            qp.state
        };
        let next = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            cur
        };
        if !modify_is_ok(cur, next, qp.init.qp_type, mask) {
            return Err(TransportError::InvalidArgument(
                "illegal QP transition or attribute mask",
            ));
        }
        self.check_attr_values(qp, attr, mask)?;
        let Engine {
            qps, ready, timers, ..
        } = self;
        let Some(qp) = qps.get_mut(&n) else {
            return Err(TransportError::NotFound);
        };
        let mut ctx = Ctx {
            cfg: &self.cfg,
            mem: &self.memory,
            counters: &mut self.counters,
            completions: &mut self.completions,
            events: &mut self.events,
            srqs: &mut self.srqs,
            budget: &mut self.budget,
            now,
        };
        let a = &mut qp.attr;
        use QpAttrMask as M;
        if mask.contains(M::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(M::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(M::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(M::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(M::AV) {
            a.ah_attr = attr.ah_attr;
            if let Some(p) = Path::resolve(ctx.cfg, &attr.ah_attr, n) {
                qp.path = p;
            }
        }
        let a = &mut qp.attr;
        if mask.contains(M::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(M::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            qp.req.retry_left = attr.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            qp.req.rnr_left = attr.rnr_retry;
        }
        if mask.contains(M::RQ_PSN) {
            a.rq_psn = attr.rq_psn & 0x00ff_ffff;
            qp.resp.epsn = a.rq_psn;
        }
        if mask.contains(M::SQ_PSN) {
            a.sq_psn = attr.sq_psn & 0x00ff_ffff;
            qp.req.next_psn = a.sq_psn;
            qp.req.una = a.sq_psn;
            qp.req.max_sent = a.sq_psn;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(M::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num & 0x00ff_ffff;
        }
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if next != cur || mask.contains(M::STATE) {
            match next {
                QpState::Reset => {
                    qp.reset();
                    qp.attr.qp_state = QpState::Reset;
                }
                QpState::Err => qp.enter_error(&mut ctx),
                QpState::Sqd => {
                    qp.state = QpState::Sqd;
                    qp.req.sqd_notify = qp.attr.en_sqd_async_notify;
                }
                s => {
                    if s == QpState::Rts && cur != QpState::Rts {
                        qp.req.retry_left = qp.attr.retry_cnt;
                        qp.req.rnr_left = qp.attr.rnr_retry;
                    }
                    qp.state = s;
                }
            }
            qp.attr.qp_state = qp.state;
        }
        sync(qp, &mut ctx, ready, timers);
        Ok(())
    }

    /// Query a QP.
    pub fn query_qp(&self, qpn: Qpn) -> Result<(QpAttr, QpInitAttr), TransportError> {
        let qp = self
            .qps
            .get(&crate::deps::qpn_value(qpn))
            .ok_or(TransportError::NotFound)?;
        let mut a = qp.attr;
        a.qp_state = qp.state;
        a.cur_qp_state = qp.state;
        a.cap = qp.init.cap;
        a.sq_draining = qp.state == QpState::Sqd && qp.req.sq.iter().any(|w| w.started);
        Ok((a, qp.init))
    }

    /// Destroy a QP. Its queued work disappears without completions (like rxe).
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), TransportError> {
        let qp = self
            .qps
            .remove(&crate::deps::qpn_value(qpn))
            .ok_or(TransportError::NotFound)?;
        self.budget.inflight = self.budget.inflight.saturating_sub(qp.reported_inflight);
        self.budget.ooo_bytes = self.budget.ooo_bytes.saturating_sub(qp.reported_ooo);
        if let Some(s) = qp.init.srq.and_then(|s| self.srqs.get_mut(&s.0)) {
            s.users = s.users.saturating_sub(1);
        }
        Ok(())
    }

    /// Post a send WR. EINVAL in RESET/INIT/RTR (like rxe); in ERR the WR completes at
    /// once with WR_FLUSH_ERR.
    pub fn post_send(&mut self, now: Nanos, qpn: Qpn, wr: SendWr) -> Result<(), TransportError> {
        use TransportError::InvalidArgument as E;
        let n = crate::deps::qpn_value(qpn);
        let Engine {
            qps, ready, timers, ..
        } = self;
        let qp = qps.get_mut(&n).ok_or(TransportError::NotFound)?;
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
        match &wr.payload {
            Payload::Sges(s) if s.len() > qp.init.cap.max_send_sge as usize => {
                return Err(E("too many sges"))
            }
            Payload::Inline(b)
                if b.len()
                    > qp.init
                        .cap
                        .max_inline_data
                        .max(self.cfg.max_inline_data.min(qp.init.cap.max_inline_data))
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
        if qp.req.sq.len() >= qp.init.cap.max_send_wr as usize {
            return Err(TransportError::NoMemory);
        }
        let signaled = qp.init.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let local = if qp.state == QpState::Err {
            None
        } else {
            Self::execute_local_op(&mut self.memory, qp.init.pd, n, &wr)
        };
        let mut ctx = Ctx {
            cfg: &self.cfg,
            mem: &self.memory,
            counters: &mut self.counters,
            completions: &mut self.completions,
            events: &mut self.events,
            srqs: &mut self.srqs,
            budget: &mut self.budget,
            now,
        };
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
        qp.req.sq.push_back(SendWqe {
            wr,
            signaled,
            len,
            started: false,
            sent_at: 0,
            first_psn: 0,
            npkts: 0,
            read_next_psn: 0,
            done: false,
            status: local,
        });
        sync(qp, &mut ctx, ready, timers);
        Ok(())
    }

    /// A bind or local invalidation takes effect in the memory table when posted (a
    /// window is usable, or revoked, no later than the WR completes); its completion
    /// comes in order when the requester reaches it (rxe `rxe_do_local_ops`). The
    /// status a failure completes with: `IBV_WC_MW_BIND_ERR` or `IBV_WC_LOC_QP_OP_ERR`.
    fn execute_local_op(
        memory: &mut MemoryTable,
        pd: PdId,
        qpn: u32,
        wr: &SendWr,
    ) -> Option<WcStatus> {
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

    /// Post a receive WR. EINVAL in RESET or on an SRQ-attached QP; in ERR it completes
    /// at once with WR_FLUSH_ERR.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), TransportError> {
        use TransportError::InvalidArgument as E;
        let n = crate::deps::qpn_value(qpn);
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
        let icrc = IcrcInfo {
            src: info.src.ip(),
            dst: info.dst,
            sport: info.src.port(),
            dport: self.cfg.udp_port,
            ipv4_id: 0,
        };
        if !self.verify_icrc(&icrc, info, udp_payload) {
            self.counters.drop_bad_icrc += 1;
            return;
        }
        let Some((h, range)) = packet::parse(udp_payload) else {
            self.counters.drop_malformed += 1;
            return;
        };
        if !packet::pkey_ok(h.pkey) {
            self.counters.drop_bad_pkey += 1;
            return;
        }
        let Engine {
            qps, ready, timers, ..
        } = self;
        let dqpn = h.dqpn;
        let Some(qp) = qps.get_mut(&h.dqpn) else {
            self.counters.drop_unknown_qpn += 1;
            return;
        };
        let want = match qp.init.qp_type {
            QpType::Rc => op::RC,
            QpType::Uc => op::UC,
            QpType::Ud => op::UD,
        };
        if h.opcode & 0xe0 != want {
            self.counters.drop_bad_opcode += 1;
            return;
        }
        if matches!(qp.state, QpState::Reset | QpState::Init) {
            self.counters.drop_bad_state += 1;
            return;
        }
        if qp.init.qp_type != QpType::Ud && !same_ip(info.src.ip(), qp.path.dst.ip()) {
            self.counters.drop_wrong_peer += 1;
            return;
        }
        self.counters.rcvd_pkts += 1;
        let payload = udp_payload.get(range).unwrap_or(&[]);
        let mut ctx = Ctx {
            cfg: &self.cfg,
            mem: &self.memory,
            counters: &mut self.counters,
            completions: &mut self.completions,
            events: &mut self.events,
            srqs: &mut self.srqs,
            budget: &mut self.budget,
            now,
        };
        let is_response = qp.init.qp_type == QpType::Rc
            && (op::READ_RESP_FIRST..=op::ATOMIC_ACK).contains(&h.opcode);
        if is_response {
            qp.on_response(&mut ctx, &h, payload);
        } else {
            let meta = RxMeta {
                src: info.src.ip(),
                dst: info.dst,
                udp_len: udp_payload.len(),
            };
            let before = ctx.completions.len();
            qp.on_request(&mut ctx, &h, payload, &meta);
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
                    self.invalidate_for_send(now, crate::deps::qpn(dqpn), i, rkey);
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

    /// The ICRC covers the IPv4 ID, which a UDP socket does not show. A softhca peer
    /// sends bulk from its device socket (unconnected, DF: ID 0, or 0, 1, 2.. per GSO
    /// segment, which arrive as separate datagrams where the path cuts GSO sends) and
    /// small transmits from a socket connected to us, which counts per datagram from a
    /// random start (a GSO datagram's segments carry its ID plus their position); Linux rxe numbers packets per destination (`__ip_select_ident`) and
    /// sends from 0xC000 + a QPN hash. So per flow (peer IP and UDP source port) we
    /// remember the last ID that matched and try the IDs around it, and solve for the ID
    /// (first contact, or after a jump) when that fails. Per IP alone, every switch
    /// between a peer's two sockets would look like a jump of thousands, and a restarted
    /// peer's new connected socket (a new port, a new random start) like a corrupted
    /// packet until `ID_RESYNC_MISSES` of them had been dropped.
    fn verify_icrc(&mut self, icrc: &IcrcInfo, info: &DatagramInfo, p: &[u8]) -> bool {
        let key = info.src;
        let seg = info.segment_index;
        let Some(state) = (if key.is_ipv4() {
            Some(self.ip_ids.get(&key).copied())
        } else {
            None
        }) else {
            return packet::verify(icrc, p, std::iter::empty()).is_some();
        };
        let near = state.map(|s: PeerIpId| s.last);
        // The most likely ID is checked first, in one pass (a miss costs a failed check
        // and a CRC combine): within a GSO datagram, its first segment's ID plus the
        // position; else the peer's next ID when it counts per packet (rxe, a connected
        // socket, or a device socket's GSO send cut into datagrams on the way), and 0 when
        // it numbers per send (after a batch that ended at ID 14 the next starts at 0).
        // A counting peer's GSO datagram took one ID for all its segments (Linux numbers
        // a connected socket's datagrams): the next datagram follows its first segment.
        let predicted = match state {
            Some(s) if seg > 0 => s.base.wrapping_add(seg),
            _ if seg > 0 => seg,
            Some(s) if s.last != 0 && !s.per_send && s.last != s.base => s.base.wrapping_add(1),
            Some(s) if s.last != 0 && !s.per_send => s.last.wrapping_add(1),
            _ => 0,
        };
        let icrc = &IcrcInfo {
            ipv4_id: predicted,
            ..*icrc
        };
        // rxe takes an ID when it builds a packet, not when it sends it, so an ACK built
        // later can leave first: IDs arrive slightly out of order (seen against kernel
        // 6.1: ACK 0x7d23, then the next SEND First 0x7d22). Look a little behind too.
        let cands = std::iter::once(seg).chain(near.into_iter().flat_map(|l| {
            // From `l` itself: a counting peer's GSO datagram cut on the way gives the
            // next datagram the ID of its own second segment.
            (0..=32u16)
                .map(move |d| l.wrapping_add(d))
                .chain((1..=ID_BEHIND).map(move |d| l.wrapping_sub(d)))
        }));
        if let Some(id) = packet::verify(icrc, p, cands) {
            if id != predicted {
                self.counters.icrc_ipv4_id_mispredicted += 1;
            }
            if state.is_some() || self.ip_ids.len() < MAX_ID_PEERS {
                self.ip_ids.insert(
                    key,
                    PeerIpId {
                        last: id,
                        misses: 0,
                        per_send: id == seg,
                        base: id.wrapping_sub(seg),
                    },
                );
            }
            return true;
        }
        let mut st = state.unwrap_or(PeerIpId {
            last: 0,
            misses: 0,
            per_send: false,
            base: 0,
        });
        st.misses = st.misses.saturating_add(1);
        // Solving the affine CRC system finds the one ID that fits, at the strength of a
        // 16-bit check (a full scan of all IDs would be no stronger and 4000x slower). So a
        // solution is taken on first contact, when it lies a little ahead of the predicted
        // ID (rxe's per-destination counter also counts the host's other traffic: a
        // corrupted packet lands in that window with probability 2^-20), or to resync after
        // a run of misses.
        let found = packet::solve_ipv4_id(icrc, p).filter(|&id| {
            state.is_none()
                || id.wrapping_sub(st.last) <= ID_RESYNC_WINDOW
                || st.last.wrapping_sub(id) <= ID_RESYNC_BEHIND
                || st.misses >= ID_RESYNC_MISSES
        });
        if let Some(id) = found {
            st.last = id;
            st.misses = 0;
            st.per_send = id == seg;
            st.base = id.wrapping_sub(seg);
            self.counters.icrc_ipv4_id_resync += 1;
        }
        if self.ip_ids.len() < MAX_ID_PEERS || self.ip_ids.contains_key(&key) {
            self.ip_ids.insert(key, st);
        }
        found.is_some()
    }

    /// Fill `buf` with packets for one destination (a GSO batch: equal-sized packets,
    /// the last may be shorter), ICRC-sealed. None when nothing is ready.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        self.transmit_into(now, buf, None, None)
    }

    /// [`Engine::poll_transmit`] without copying request payloads: a packet whose payload
    /// lies in one SGE of registered memory leaves it there, and `pieces` (cleared
    /// first) says, packet by packet, where the bytes are: [`TxPiece`]. The Transmit's
    /// `len` and `segment_size` count the wire bytes as with `poll_transmit`, but `buf`
    /// holds only headers, pads and ICRCs of such packets.
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
        mut pieces: Option<&mut Vec<TxPiece>>,
        prev: Option<&Transmit>,
    ) -> Option<Transmit> {
        let max_segs = self.cfg.max_gso_segments.max(1);
        // Room in the device budget again (below 3/4, so that a freed PSN does not wake
        // every blocked QP for one packet each): blocked QPs get another look, first
        // blocked first, as many as the room takes by the PSNs of each one's next WQE.
        // Waking all of them made each plan, find the budget gone after the first few
        // and go back: with 1024 QPs writing 64 KiB, about 28 plans per WRITE, and
        // `plan_request` was 9 % of the sender's profile.
        if !self.budget.blocked.is_empty()
            && self.budget.inflight < DEVICE_MAX_INFLIGHT_PSNS / 4 * 3
        {
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
        // One Transmit may take packets from several QPs, one after the other: all
        // that GSO needs is one destination, source and UDP source port, and equal
        // sizes (the last may be shorter). With 1024 QPs writing to one peer, each QP
        // has about one WRITE in flight (the device budget): per-QP batches would hand
        // the kernel one short datagram per WRITE, and a responder one ACK datagram per
        // QP. A QP's packets stay in order and each QP still goes to the back of the
        // ready queue once drawn from (round robin as before).
        let mut off = 0usize;
        let mut wire_len = 0usize;
        let mut count = 0usize;
        // Destination, source, segment size and UDP source port of the batch.
        let mut first: Option<(SocketAddr, IpAddr, usize, u16)> = None;
        match (prev, pieces.as_deref_mut()) {
            (Some(p), Some(list)) => {
                // Go on after `prev`'s packets (see `poll_transmit_append`).
                off = list.last().map_or(0, |l| l.start + l.head + l.tail);
                wire_len = p.len;
                count = list.len();
                first = Some((p.dst, p.src, p.segment_size, p.src_port));
            }
            (_, Some(list)) => list.clear(),
            _ => {}
        }
        // At most one pass over the QPs ready now (a QP put back by `sync` is not
        // drawn from twice).
        let mut visits = self.ready.len();
        while let Some(&qpn) = self.ready.front() {
            if visits == 0 {
                break;
            }
            visits -= 1;
            let Engine {
                qps,
                ready,
                timers,
                source_port,
                late_seal,
                ..
            } = self;
            let Some(qp) = qps.get_mut(&qpn) else {
                ready.pop_front();
                continue;
            };
            let mut ctx = ctx!(self, now);
            let before = count;
            // Why this QP's run ended: `drained` when it has nothing more to send now;
            // otherwise the batch is complete (full, a short or mismatched packet, no
            // room, a local error).
            let mut drained = false;
            let mut too_small = false;
            while count < max_segs {
                let Some(plan) = qp.plan(&mut ctx) else {
                    drained = true;
                    break;
                };
                let wl = plan.wire_len();
                let sport = source_port.unwrap_or(plan.sport);
                if let Some((dst0, src0, seg, sport0)) = &first {
                    if plan.dst != *dst0 || plan.src != *src0 || sport != *sport0 || wl > *seg {
                        break;
                    }
                }
                if off + wl > buf.len() || wire_len + wl > buf.len() {
                    too_small = count == 0;
                    break;
                }
                let in_place = pieces.is_some();
                let Some(built) = qp.build_placed(&mut ctx, &plan, &mut buf[off..], in_place)
                else {
                    break;
                };
                let ic = IcrcInfo {
                    src: plan.src,
                    dst: plan.dst.ip(),
                    sport,
                    dport: plan.dst.port(),
                    ipv4_id: count as u16,
                };
                let sealed = match built.external {
                    // Sealed by the caller (`set_late_seal`); its ICRC bytes zeroed.
                    None if *late_seal && pieces.is_some() => {
                        let end = built.in_buf + softhca_wire::ICRC_LEN;
                        buf.get_mut(off + built.in_buf..off + end).map(|icrc| {
                            icrc.fill(0);
                            end
                        })
                    }
                    None => {
                        packet::seal_with_tail(&ic, &mut buf[off..], built.in_buf, built.tail_crc)
                    }
                    Some(ext) => {
                        // SAFETY: `ext` was resolved by `gather_in_place` on
                        // `self.memory` during this call; deregistration needs
                        // `&mut self`, so the range is still a live registered region.
                        // Registered memory may be written by the application while it
                        // is read here only if it breaks the verbs contract (a send
                        // buffer is the application's again at its completion); the
                        // CRC and the data are then both garbage, as on any NIC.
                        let payload =
                            unsafe { std::slice::from_raw_parts(ext.addr as *const u8, ext.len) };
                        packet::seal_pieces(&ic, &mut buf[off..], built.head, payload, built.in_buf)
                    }
                };
                let Some(in_buf) = sealed else {
                    break;
                };
                let total = in_buf + built.external.map_or(0, |e| e.len);
                if let Some(list) = pieces.as_deref_mut() {
                    list.push(TxPiece {
                        start: off,
                        head: built.head,
                        external: built.external,
                        tail: in_buf - built.head,
                        tail_crc: built.tail_crc,
                    });
                }
                if first.is_none() {
                    first = Some((plan.dst, plan.src, total, sport));
                }
                off += in_buf;
                wire_len += total;
                count += 1;
                if first.as_ref().is_some_and(|(_, _, seg, _)| total < *seg) {
                    break;
                }
            }
            if too_small {
                return None;
            }
            if count == before && count > 0 && !drained {
                // Its next packet does not fit this batch: it opens the next one.
                break;
            }
            ready.pop_front();
            qp.in_ready = false;
            sync(qp, &mut ctx, ready, timers);
            if first.is_none() {
                continue;
            }
            // Go on to the next QP only while the batch can still grow: this QP has
            // nothing more, and its last packet was full-sized (a shorter one ends the
            // run with `drained` false).
            if !drained || count >= max_segs {
                break;
            }
        }
        let (dst, src, seg, sport) = first?;
        Some(Transmit {
            dst,
            src,
            len: wire_len,
            segment_size: seg,
            src_port: sport,
        })
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
            let Engine {
                qps, ready, timers, ..
            } = self;
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
            let mut ctx = ctx!(self, now);
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

    /// The CQ where an ACK (or any response) in `udp_payload` would complete sends: the
    /// send CQ of the QP its BTH names. None when it names no QP here or does not parse.
    /// Lets a caller decide, before feeding a packet, whether the application it serves
    /// waits for what the packet completes.
    pub fn send_cq_for(&self, udp_payload: &[u8]) -> Option<CqId> {
        let bth = softhca_wire::Bth::parse(udp_payload).ok()?;
        self.qps.get(&bth.dest_qp.value()).map(|qp| qp.init.send_cq)
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

    /// Gauges of what a flood could try to grow (issue 5, bounded resources): the
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
        !self.ready.is_empty()
    }

    /// Outstanding PSN span of a QP's requester (diagnostics and tests).
    pub fn inflight_psns(&self, qpn: Qpn) -> Option<u32> {
        let qp = self.qps.get(&crate::deps::qpn_value(qpn))?;
        Some(psn_diff(qp.req.max_sent, qp.req.una).max(0) as u32)
    }
}
