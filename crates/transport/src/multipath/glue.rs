//! Where multipath hooks into a QP: negotiation, the path table, the requester's
//! scoreboard and resends, the responder's SACKs, probes and timers.

use std::net::{IpAddr, SocketAddr};

use softhca_wire::{Aeth, Bth, Headers, Opcode};

use crate::cc::{new_controller, Congestion};
use crate::path::Path;
use crate::qp::{Ctx, Qp, RespOut};
use crate::recovery::LossCause;
use crate::requester::{TxPlan, TxSource};
use crate::verbs::*;

use super::board::Found;
use super::paths::{best, paced_until};
use super::wire::{self as mpw, Hello, Probe, Sack};
use super::{
    MpPacket, MpState, MpStats, Multipath, PathState, PathStatus, HELLO_TRIES, KEEPALIVE_NS,
    MAX_PATHS, PATH_QUEUE_DELAY_NS, PROBE_MISSES,
};

/// Packets sent on one path before the scheduler looks again (one GSO batch).
const BURST: u32 = 16;
/// Early packets kept between two SACKs at most.
const SACK_EVERY: u32 = 8;

/// The UDP source port of the `k`-th port of a path set: the I/O layer's `k`-th extra
/// port, or, without those, a port spread from rxe's per-QP port within its range
/// (0xC000..=0xFFFF).
fn nth_sport(base: u16, k: u8, ports: &[u16]) -> u16 {
    if k == 0 {
        return base;
    }
    if let Some(&p) = ports.get(usize::from(k) - 1) {
        return p;
    }
    0xc000 | (base.wrapping_add(u16::from(k).wrapping_mul(0x0d31)) & 0x3fff)
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

/// Whether `a` may join a path set whose address vector goes to `primary`: same family,
/// a unicast address, and a loopback one only between loopback peers (a device also
/// serves a loopback address, which means another host's own loopback to the peer).
fn usable(a: IpAddr, primary: IpAddr) -> bool {
    same_family(a, primary)
        && !a.is_unspecified()
        && !a.is_multicast()
        && (a.is_loopback() == primary.is_loopback())
        // A link-local IPv6 address needs the interface, which a GID does not carry.
        && !matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local())
}

/// What a request-side plan for a resend came to.
// Returned by value and unpacked at once, as `Option<TxPlan>` is: boxing would allocate
// per packet.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Resend {
    Plan(TxPlan),
    /// Resends wait (no path has room): nothing else may go either.
    Blocked,
    None,
}

impl Qp {
    /// Entering RTS: start negotiating (RC and UC, when enabled).
    pub(crate) fn mp_start(&mut self, ctx: &mut Ctx<'_>) {
        if !self.negotiates() || !ctx.cfg.mp.enabled || self.mp.is_some() {
            return;
        }
        let nonce = (self.qpn ^ (ctx.now as u32).rotate_left(8)) | 1;
        self.mp = Some(Box::new(Multipath::new(ctx.now, nonce)));
    }

    /// Whether data uses the path table (negotiated, several paths).
    #[inline]
    pub(crate) fn mp_active(&self) -> bool {
        self.mp.as_ref().is_some_and(|m| m.active)
    }

    /// Whether data uses the path table with a congestion controller per path.
    #[inline]
    pub(crate) fn mp_paths_cc(&self) -> bool {
        self.mp
            .as_ref()
            .is_some_and(|m| m.active && m.paths.first().is_some_and(|p| p.cc.is_some()))
    }

    /// The least window of the active paths, in packets, with a controller per path.
    pub(crate) fn mp_least_window(&self) -> Option<u32> {
        let m = self.mp.as_deref().filter(|_| self.mp_paths_cc())?;
        m.paths
            .iter()
            .filter(|p| p.status == PathStatus::Active)
            .map(PathState::window)
            .min()
    }

    /// With a controller per path: whether one more packet on `path` fills its window.
    pub(crate) fn mp_window_closes(&self, path: u8) -> Option<bool> {
        let m = self.mp.as_deref().filter(|_| self.mp_paths_cc())?;
        let p = m.paths.get(usize::from(path))?;
        Some(p.inflight + 2 > p.window())
    }

    /// Whether a request from `src` belongs to this QP's peer by way of the extension.
    pub(crate) fn mp_accepts(&self, src: IpAddr) -> bool {
        self.mp.as_ref().is_some_and(|m| {
            m.state == MpState::On && m.peer_addrs.iter().any(|a| same_ip(*a, src))
        })
    }

    /// Our local addresses for multipath: every GID's, or those of them configured (a
    /// configured address the device does not serve is not ours to advertise).
    fn mp_local_addrs(&self, ctx: &Ctx<'_>) -> Vec<IpAddr> {
        let allowed = &ctx.cfg.mp.addrs;
        // An address whose interface carries less than this QP's MTU cannot carry its
        // packets (the peer leaves out its own such addresses: both use one path MTU).
        let mtu = self.mtu(ctx.cfg);
        let mut v: Vec<IpAddr> = (0..=u8::MAX)
            .zip(&ctx.cfg.gids)
            .filter(|&(i, _)| ctx.cfg.gid_mtu(i).bytes() as u64 >= mtu)
            .map(|(_, g)| g.to_ip())
            .filter(|ip| allowed.is_empty() || allowed.iter().any(|a| same_ip(*a, *ip)))
            .collect();
        let primary = self.path.src;
        v.retain(|a| usable(*a, primary));
        // The address vector's own source first.
        v.retain(|a| !same_ip(*a, self.path.src));
        v.insert(0, self.path.src);
        v.dedup();
        v
    }

    /// The negotiation MAD to the peer's QP 1.
    pub(crate) fn mp_hello(
        &self,
        ctx: &Ctx<'_>,
        answer: bool,
        status: u16,
        nonce: u32,
    ) -> Option<MpPacket> {
        let h = Hello {
            answer,
            status,
            from_qpn: self.qpn,
            to_qpn: self.attr.dest_qp_num,
            nonce,
            addrs: self.mp_local_addrs(ctx),
            sports: ctx.cfg.mp.sports.max(1),
            bundle_max: ctx.cfg.bundle_max,
            packet_max: u32::try_from(ctx.cfg.jumbo_mtu).unwrap_or(0),
        };
        Some(MpPacket {
            src: self.path.src,
            dst: SocketAddr::new(self.path.dst.ip(), ctx.cfg.udp_port),
            sport: self.path.sport,
            tos: self.path.tos,
            bytes: h.encode()?,
        })
    }

    /// The peer speaks the extension and serves `hello.addrs`: build the path table,
    /// and agree on the packet size above the path MTU.
    pub(crate) fn mp_turn_on(&mut self, ctx: &mut Ctx<'_>, hello: &Hello) {
        let (addrs, sports) = (&hello.addrs, hello.sports);
        let jumbo = self.jumbo_with(ctx.cfg, hello.packet_max.into());
        let local = self.mp_local_addrs(ctx);
        let primary = self.path;
        let now = ctx.now;
        let cc = self.cc_on(ctx).then_some(ctx.cfg.cc);
        let mtu = self.mtu(ctx.cfg);
        let is_rc = self.is_rc();
        let Some(m) = self.mp.as_deref_mut() else {
            return;
        };
        if m.state == MpState::On {
            return;
        }
        ctx.counters.mp_negotiated += 1;
        m.state = MpState::On;
        m.hello_at = None;
        if !is_rc {
            // UC: the larger packets only. Paths need acknowledgements to be judged by.
            m.peer_addrs = vec![primary.dst.ip()];
            m.jumbo = jumbo;
            return;
        }
        let mut peer: Vec<IpAddr> = vec![primary.dst.ip()];
        for a in addrs {
            if usable(*a, primary.dst.ip()) && !peer.iter().any(|p| same_ip(*p, *a)) {
                peer.push(*a);
            }
        }
        m.peer_addrs = peer.clone();
        m.peer_sports = sports;
        let ports = &ctx.cfg.mp.ports;
        let mut nsports = ctx.cfg.mp.sports.max(1);
        if !ports.is_empty() {
            nsports = nsports.min(u8::try_from(ports.len() + 1).unwrap_or(u8::MAX));
        }
        let mut paths = vec![PathState::new(primary, PathStatus::Active, now)];
        'all: for k in 0..nsports {
            for l in &local {
                for r in &peer {
                    let p = Path {
                        src: *l,
                        dst: SocketAddr::new(*r, primary.dst.port()),
                        sport: nth_sport(primary.sport, k, ports),
                        tos: primary.tos,
                    };
                    if paths.iter().any(|q| q.path == p) {
                        continue;
                    }
                    if paths.len() >= MAX_PATHS {
                        break 'all;
                    }
                    paths.push(PathState::new(p, PathStatus::Probing, now));
                }
            }
        }
        m.active = paths.len() > 1;
        // One size for the QP's life, on one path only: the scoreboard's and the paths'
        // byte counts are per PSN at the path MTU.
        m.jumbo = if m.active { 0 } else { jumbo };
        if let Some(alg) = cc.filter(|_| m.active) {
            // Each path its own window and pacing from its own round trips and losses:
            // one controller for the QP held the sum of the paths to one path's rate.
            for p in &mut paths {
                p.mtu = mtu;
                p.cc = new_controller(alg.for_path(PATH_QUEUE_DELAY_NS), mtu);
            }
        }
        m.paths = paths;
    }

    /// The negotiation said no (or never answered): plain RC for good.
    pub(crate) fn mp_turn_off(&mut self, ctx: &mut Ctx<'_>) {
        if self.mp.take().is_some() {
            ctx.counters.mp_fallback += 1;
        }
    }

    /// The deadline multipath wants (negotiation retry, loss by time, probes).
    pub(crate) fn mp_deadline(&self) -> Option<Nanos> {
        let m = self.mp.as_deref()?;
        let mut t = m.hello_at;
        let mut min = |x: Nanos| t = Some(t.map_or(x, |y: Nanos| y.min(x)));
        if m.active {
            if let Some(l) = m.loss_at {
                min(l);
            }
            if let Some(l) = m.pace_at {
                min(l);
            }
            for p in &m.paths {
                if let Some(at) = p.silent_at() {
                    min(at);
                }
            }
            for p in &m.paths {
                match p.probe {
                    Some((_, at)) => min(at + p.probe_timeout()),
                    None => min(p.probe_at),
                }
            }
        }
        t
    }

    /// Multipath's share of the QP timer.
    pub(crate) fn mp_on_timer(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let Some(m) = self.mp.as_deref_mut() else {
            return;
        };
        if let Some(at) = m.hello_at.filter(|&at| at <= now) {
            let _ = at;
            if m.hello_tries >= HELLO_TRIES {
                self.mp_turn_off(ctx);
                return;
            }
            m.hello_tries += 1;
            m.hello_at = Some(now + Multipath::hello_wait(m.hello_tries));
            let nonce = m.nonce;
            if let Some(pkt) = self.mp_hello(ctx, false, 0, nonce) {
                ctx.counters.mp_hello_sent += 1;
                if let Some(m) = self.mp.as_deref_mut() {
                    m.out.push(pkt);
                }
            }
            return;
        }
        if !m.active {
            return;
        }
        if m.pace_at.is_some_and(|t| t <= now) {
            m.pace_at = None;
        }
        let silent = m
            .paths
            .iter()
            .any(|p| p.silent_at().is_some_and(|t| t <= now));
        if m.loss_at.is_some_and(|t| t <= now) {
            m.loss_at = None;
            self.mp_detect(ctx);
        }
        if silent {
            self.mp_find_silent(ctx);
        }
        self.mp_probe_paths(ctx);
    }

    /// Probe timeouts, keepalives and readmission probes.
    fn mp_probe_paths(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let dqpn = self.attr.dest_qp_num;
        let port = ctx.cfg.udp_port;
        let mut failed = Vec::new();
        let Some(m) = self.mp.as_deref_mut() else {
            return;
        };
        let mut active = m
            .paths
            .iter()
            .filter(|p| p.status == PathStatus::Active)
            .count();
        // The newest send time of anything delivered or answered, on any path.
        let news = m
            .paths
            .iter()
            .map(|p| p.probe_answered_sent)
            .fold(m.board.delivered_sent_at, Nanos::max);
        let mut ask_all = false;
        for (i, p) in m.paths.iter_mut().enumerate() {
            let mut missed = p.probe_unjudged.filter(|&at| news >= at).is_some();
            if missed {
                p.probe_unjudged = None;
            }
            if let Some((_, at)) = p.probe.filter(|&(_, at)| now >= at + p.probe_timeout()) {
                p.probe = None;
                if news >= at || p.status != PathStatus::Active {
                    missed = true;
                } else {
                    // Nothing sent since this probe came through anywhere: the peer's
                    // host may be paused, which says nothing of this path. It counts
                    // once a probe sent as late is answered on another path (asked
                    // now) or data sent as late is delivered.
                    p.probe_unjudged = Some(p.probe_unjudged.unwrap_or(at));
                    p.probe_at = p.probe_at.min(now);
                    ask_all = true;
                }
            }
            if missed {
                p.probe_misses = p.probe_misses.saturating_add(1);
                // The last active path is not failed for silence alone: with nothing
                // else to send on, the retransmit timer and the retry budget judge it.
                let last = p.status == PathStatus::Active && active <= 1;
                if p.probe_misses >= PROBE_MISSES && p.status != PathStatus::Failed && !last {
                    if p.status == PathStatus::Active {
                        active -= 1;
                    }
                    failed.push(i);
                }
            }
            if p.probe.is_none() && p.probe_at <= now {
                m.nonce = m.nonce.wrapping_mul(0x9e37_79b9).wrapping_add(1);
                let probe = Probe {
                    nonce: m.nonce,
                    path: i as u8,
                };
                if let Some(bytes) = mpw::encode_probe(dqpn, false, probe) {
                    m.out.push(MpPacket {
                        src: p.path.src,
                        dst: SocketAddr::new(p.path.dst.ip(), port),
                        sport: p.path.sport,
                        tos: p.path.tos,
                        bytes,
                    });
                    ctx.counters.mp_probe_sent += 1;
                }
                p.probe_sent(m.nonce, now, KEEPALIVE_NS);
            }
        }
        if ask_all {
            for p in m
                .paths
                .iter_mut()
                .filter(|p| p.status == PathStatus::Active)
            {
                p.want_probe(now);
            }
        }
        for i in failed {
            self.mp_fail_path(ctx, i);
        }
    }

    /// Path `i` failed: its packets in flight go to the others.
    fn mp_fail_path(&mut self, ctx: &mut Ctx<'_>, i: usize) {
        let now = ctx.now;
        let Some(m) = self.mp.as_deref_mut() else {
            return;
        };
        let Some(p) = m.paths.get_mut(i) else {
            return;
        };
        if p.status == PathStatus::Failed {
            return;
        }
        if p.suspect {
            // Its silence was real: the allowance added after false ones shrinks.
            p.silence_extra /= 2;
        }
        p.set_status(PathStatus::Failed, now);
        ctx.counters.mp_path_failed += 1;
        let lost = m.board.fail_path(i as u8, &mut m.paths);
        m.resend.extend(lost);
        if m.cur == Some(i) {
            m.cur = None;
        }
    }

    /// Run loss detection over the scoreboard and act on what it found.
    fn mp_detect(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let Some(m) = self.mp.as_deref_mut() else {
            return;
        };
        let found: Found = m.board.detect(&mut m.paths, now);
        m.loss_at = found.next_check;
        ctx.counters.mp_lost += found.lost.len() as u64;
        m.resend.extend(found.lost.iter().copied());
    }

    /// Paths silent while another delivers: their packets move to the others at once,
    /// and they carry no new ones until they deliver or answer a probe (sent now);
    /// unanswered probes fail them. Judged at the timer only, after the step's
    /// received datagrams were all fed: after a pause of the hosts, the deliveries of
    /// every path arrive in one burst, and one path's ACKs must not make another look
    /// silent before its own are in. Losses alone never do: a token bucket's queue drops
    /// runs of packets, its controller's business; failing the path for them failed
    /// and readmitted it over and over, each time with a new controller.
    fn mp_find_silent(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let Some(m) = self.mp.as_deref_mut() else {
            return;
        };
        let delivered = m.board.delivered_sent_at;
        let mut silent = Vec::new();
        let mut alone = Vec::new();
        for (i, p) in m.paths.iter().enumerate() {
            if p.silent_at().is_none_or(|t| t > now) {
                continue;
            }
            // A packet sent after this one's oldest expected packet was delivered (on
            // another path: this one's own would have moved it): the peer and the
            // hosts work, this path does not. When they came in matters not: after a
            // pause of the peer's host, every path delivers late, in one burst.
            let others = p.sent_at.front().is_some_and(|&(_, at)| delivered > at);
            if others {
                silent.push(i);
            } else {
                alone.push(i);
            }
        }
        // Silent with no other path delivering either: the retransmit timer's
        // business; judged again later, not at a deadline in the past.
        for i in alone {
            if let Some(p) = m.paths.get_mut(i) {
                p.silence_recheck = now + p.silence_allow();
            }
        }
        for i in silent {
            let lost = m.board.fail_path(i as u8, &mut m.paths);
            if let Some(p) = m.paths.get_mut(i) {
                p.on_silent(now);
            }
            ctx.counters.mp_path_silent += 1;
            ctx.counters.mp_lost += lost.len() as u64;
            m.resend.extend(lost);
            if m.cur == Some(i) {
                m.cur = None;
            }
        }
    }

    /// The oldest unacknowledged PSN moved on: retire records, look for losses.
    pub(crate) fn mp_progress(&mut self, ctx: &mut Ctx<'_>) {
        let una = self.req.una;
        let now = ctx.now;
        if !self.mp_active() {
            return;
        }
        let Some(m) = self.mp.as_deref_mut() else {
            return;
        };
        m.board.ack_to(una, &mut m.paths, now);
        self.mp_detect(ctx);
    }

    /// The responder acknowledged every request up to `psn`: the scoreboard marks them
    /// held (a READ's responses may still be missing; the completer judges those).
    pub(crate) fn mp_held_through(&mut self, now: Nanos, psn: Psn) {
        if let Some(m) = self.mp.as_deref_mut().filter(|m| m.active) {
            let base = m.board.base;
            if !psn.is_before(base) {
                m.board.sack(base, psn, &mut m.paths, now);
            }
        }
    }

    /// Choose the path of the next new request packet: None when every active path's
    /// window is full.
    fn mp_pick(&mut self, avoid: Option<usize>, now: Nanos) -> Option<usize> {
        let m = self.mp.as_deref_mut()?;
        if let Some(c) = m.cur.filter(|_| avoid.is_none() && m.burst_left > 0) {
            if m.paths.get(c).is_some_and(|p| p.sendable(now)) {
                return Some(c);
            }
        }
        if let Some(i) = best(&m.paths, avoid, now) {
            if avoid.is_none() {
                m.cur = Some(i);
                m.burst_left = BURST;
            }
            m.pace_at = None;
            return Some(i);
        }
        if m.paths.iter().any(|p| p.status == PathStatus::Active) {
            // Windows full (an acknowledgement reopens one) or pacers waiting.
            m.pace_at = paced_until(&m.paths, now);
            return None;
        }
        // No path works: go on trying each in turn (the retransmit timer and the retry
        // budget decide, as in plain RC).
        let n = m.paths.len().max(1);
        if m.burst_left == 0 || m.cur.is_none() {
            m.resp_rr = (m.resp_rr + 1) % n;
            m.cur = Some(m.resp_rr);
            m.burst_left = BURST;
        }
        m.cur
    }

    /// The path of the next new request packet, or None to wait for room.
    pub(crate) fn mp_request_path(&mut self, now: Nanos) -> Option<(u8, Path)> {
        let i = self.mp_pick(None, now)?;
        let m = self.mp.as_deref()?;
        Some((i as u8, m.paths.get(i)?.path))
    }

    /// The path of the next responder packet: rotating over the active paths, by bursts
    /// of READ responses (one GSO batch each), and at every ACK or SACK (`each`): a
    /// path whose ACK direction died then costs only some of many cumulative ACKs.
    pub(crate) fn mp_response_path(&mut self, each: bool) -> Path {
        let primary = self.path;
        let Some(m) = self.mp.as_deref_mut().filter(|m| m.active) else {
            return primary;
        };
        let n = m.paths.len();
        if each {
            // Back the way the last request came, while that path is active: the
            // reverse of a working path most likely works, and the requester's round
            // trip samples then belong to one pair of addresses.
            let back = m.last_rx.and_then(|(l, r)| {
                m.paths.iter().find(|p| {
                    p.status == PathStatus::Active && p.path.src == l && same_ip(p.path.dst.ip(), r)
                })
            });
            if let Some(p) = back {
                return p.path;
            }
        }
        let ok = |m: &Multipath, i: usize| {
            m.paths
                .get(i)
                .is_some_and(|p| p.status == PathStatus::Active)
        };
        if !(0..n).any(|i| ok(m, i)) {
            // No path known to work: each packet tries the next one.
            m.resp_rr = (m.resp_rr + 1) % n.max(1);
            return m.paths.get(m.resp_rr).map_or(primary, |p| p.path);
        }
        if each || m.burst_left == 0 || !ok(m, m.resp_rr) {
            for k in 1..=n {
                let i = (m.resp_rr + k) % n;
                if ok(m, i) {
                    m.resp_rr = i;
                    break;
                }
            }
            m.burst_left = BURST;
        }
        m.paths.get(m.resp_rr).map_or(primary, |p| p.path)
    }

    /// A packet of this QP's was built: count it to its path (requests: record it;
    /// `app_limited`: the last the requester had to send).
    pub(crate) fn mp_sent(
        &mut self,
        ctx: &mut Ctx<'_>,
        plan: &TxPlan,
        resend: bool,
        app_limited: bool,
    ) {
        let now = ctx.now;
        let Some(m) = self.mp.as_deref_mut().filter(|m| m.active) else {
            return;
        };
        m.burst_left = m.burst_left.saturating_sub(1);
        if plan.source != TxSource::Requester {
            return;
        }
        let i = usize::from(plan.path);
        let Some(p) = m.paths.get_mut(i) else {
            return;
        };
        p.pkts += 1;
        p.bytes += plan.wire_len() as u64;
        if resend {
            p.retransmits += 1;
            m.resends += 1;
            ctx.counters.mp_resent += 1;
        }
        let seq = p.next_seq;
        let psn = plan.hdr.bth.psn;
        let op = plan.hdr.bth.opcode;
        let rd_atomic = op.is_read_request() || op.is_atomic();
        p.on_sent(seq, now, plan.wire_len() as u64, !rd_atomic);
        if let Some(prev) = m
            .board
            .record(psn, plan.path, seq, now, app_limited, rd_atomic)
        {
            p.next_seq += 1;
            p.inflight += 1;
            // The path's window grows only while it is used, as a single-path QP's.
            let in_flight = u64::from(p.inflight) * p.mtu;
            if let Some(ctl) = p.cc.as_mut() {
                ctl.on_sent(in_flight);
            }
            if let Some(q) = prev.and_then(|q| m.paths.get_mut(usize::from(q))) {
                q.inflight = q.inflight.saturating_sub(1);
            }
        }
    }

    /// The next selective resend, planned (its WQE position in `req.resend_at`).
    pub(crate) fn mp_plan_resend(&mut self, ctx: &mut Ctx<'_>) -> Resend {
        loop {
            let Some(m) = self.mp.as_deref_mut().filter(|m| m.active) else {
                return Resend::None;
            };
            let Some(&psn) = m.resend.front() else {
                return Resend::None;
            };
            if psn.is_before(self.req.una) || !m.board.needs_resend(psn) {
                m.resend.pop_front();
                continue;
            }
            let orig = m.board.get(psn).map(|s| usize::from(s.path));
            let Some(idx) = self.req.sq.iter().position(|w| w.contains(psn)) else {
                if let Some(m) = self.mp.as_deref_mut() {
                    m.resend.pop_front();
                }
                continue;
            };
            let Some(w) = self.req.sq.get(idx) else {
                return Resend::None;
            };
            if w.is_rd_atomic() {
                // A READ or atomic request: re-requested as plain RC does (a READ
                // alone), spending no retry.
                if let Some(m) = self.mp.as_deref_mut() {
                    m.resend.pop_front();
                }
                self.retransmit_from(ctx, psn, LossCause::Quiet);
                return Resend::None;
            }
            let Some(path) = self.mp_pick(orig, ctx.now) else {
                return Resend::Blocked;
            };
            return match self.plan_at(ctx, idx, psn, path) {
                Some(p) => Resend::Plan(p),
                None => Resend::None,
            };
        }
    }

    /// Build the SACK owed, if any (responder).
    fn mp_build_sack(&mut self, ctx: &mut Ctx<'_>) {
        let due = self.mp.as_deref().is_some_and(|m| m.sack_due);
        if !due {
            return;
        }
        let path = self.mp_response_path(true);
        let bytes = self.mp_encode_sack();
        // The SACK acknowledges everything in order too.
        self.resp.ack_owed = false;
        let Some(m) = self.mp.as_deref_mut() else {
            return;
        };
        m.sack_due = false;
        m.kept_since_sack = 0;
        if let Some(bytes) = bytes {
            m.sacks_sent += 1;
            ctx.counters.mp_sack_sent += 1;
            m.out.push(MpPacket {
                src: path.src,
                dst: path.dst,
                sport: path.sport,
                tos: path.tos,
                bytes,
            });
        }
    }

    /// Whether an ACK or sequence NAK the responder is about to queue goes as a SACK.
    /// On one path, only once the gap was reported (a sequence NAK would have gone):
    /// the requester takes a SACK with a hole for a loss (selective repeat, see
    /// `recovery::Held`), so one sent during the reordering wait would have cost it.
    pub(crate) fn mp_sack_instead(&mut self) -> bool {
        let gap = !self.resp.ooo.is_empty();
        let reported = self.resp.nak_sent;
        match self.mp.as_deref_mut().filter(|m| m.sacks(reported)) {
            Some(m) if gap => {
                m.sack_due = true;
                true
            }
            _ => false,
        }
    }

    /// A SACK of what the responder holds: the cumulative part and the first ranges
    /// held beyond it.
    fn mp_encode_sack(&self) -> Option<Vec<u8>> {
        let mut ranges: Vec<(Psn, Psn)> = Vec::new();
        for (h, _) in &self.resp.ooo {
            let p = h.bth.psn;
            let full = ranges.len() >= mpw::MAX_SACK_RANGES;
            match ranges.last_mut() {
                Some((_, b)) if b.next() == p => *b = p,
                _ if full => break,
                _ => ranges.push((p, p)),
            }
        }
        let sack = Sack {
            msn: self.resp.msn,
            ranges,
        };
        mpw::encode_sack(self.attr.dest_qp_num, self.resp.epsn.sub(1), &sack)
    }

    /// The responder kept an early packet (`ack_req`: the requester asked for an ACK).
    pub(crate) fn mp_kept(&mut self, ack_req: bool) {
        let reported = self.resp.nak_sent;
        if let Some(m) = self.mp.as_deref_mut().filter(|m| m.sacks(reported)) {
            m.kept_since_sack += 1;
            if ack_req || m.kept_since_sack >= SACK_EVERY {
                m.sack_due = true;
            }
        }
    }

    /// After an event: hand built extension packets to the engine.
    pub(crate) fn mp_flush(&mut self, ctx: &mut Ctx<'_>) {
        if self.mp.is_none() {
            return;
        }
        self.mp_build_sack(ctx);
        if let Some(m) = self.mp.as_deref_mut() {
            ctx.mp_out.extend(m.out.drain(..));
        }
    }

    /// An extension packet for this QP: SACK, probe or probe answer.
    pub(crate) fn mp_on_packet(
        &mut self,
        ctx: &mut Ctx<'_>,
        src: SocketAddr,
        dst: IpAddr,
        bth: &Bth,
        body: &[u8],
    ) {
        if !self.mp_accepts(src.ip()) {
            ctx.counters.drop_wrong_peer += 1;
            return;
        }
        match bth.opcode.0 {
            mpw::OP_SACK => {
                if let Some(s) = mpw::decode_sack(body) {
                    self.mp_on_sack(ctx, bth.psn, &s);
                }
            }
            mpw::OP_PROBE => {
                if let Some(p) = mpw::decode_probe(body) {
                    self.mp_answer_probe(ctx, src, dst, p);
                }
            }
            mpw::OP_PROBE_ACK => {
                let Some(p) = mpw::decode_probe(body) else {
                    return;
                };
                let now = ctx.now;
                let Some(m) = self.mp.as_deref_mut() else {
                    return;
                };
                let slowest = m.paths.iter().map(|q| q.srtt).max().unwrap_or(0);
                if let Some(path) = m.paths.get_mut(usize::from(p.path)) {
                    if path.on_probe_ack(p.nonce, now) && path.status != PathStatus::Active {
                        if path.status == PathStatus::Failed {
                            ctx.counters.mp_path_readmitted += 1;
                            // What it measured before it failed may be stale: start
                            // from the slowest path's round trip, so its first packets
                            // are not taken for lost while it proves itself.
                            path.srtt = path.srtt.max(slowest);
                            path.rttvar = path.rttvar.max(path.srtt / 2);
                            // Its controller starts over: what it knew of the path's
                            // queue may be stale too.
                            if path.cc.is_some() {
                                let alg = ctx.cfg.cc.for_path(PATH_QUEUE_DELAY_NS);
                                path.cc = new_controller(alg, path.mtu);
                            }
                        }
                        path.set_status(PathStatus::Active, now);
                    }
                }
                // An answer may be the news a lost tail waits for: judged at the
                // timer, after every datagram of this step was fed.
                m.loss_at = Some(m.loss_at.map_or(now, |t| t.min(now)));
            }
            _ => ctx.counters.drop_bad_opcode += 1,
        }
    }

    /// Answer a probe that came from `src` to our `dst`, back on the reverse pair.
    /// What came on that path before the probe came before it (a path is FIFO): with
    /// nothing missing and an acknowledgement owed, a cumulative SACK goes ahead of the
    /// answer. Requests are acknowledged only when one asks, the answer at once (and
    /// extension packets leave before queued ACKs); it is the news a lost tail waits
    /// for (`board::detect`), and overtaking the acknowledgement it made the prober
    /// take every packet sent during a pause of this host for lost. With a gap, the
    /// SACKs of the packets kept say what is held (one here, limited to the first
    /// ranges, hid a working path's newest deliveries).
    fn mp_answer_probe(&mut self, ctx: &mut Ctx<'_>, src: SocketAddr, dst: IpAddr, p: Probe) {
        let (sport, tos, port) = (self.path.sport, self.path.tos, ctx.cfg.udp_port);
        let back = |bytes| MpPacket {
            src: dst,
            dst: SocketAddr::new(src.ip(), port),
            sport,
            tos,
            bytes,
        };
        let on = self.mp.as_deref().is_some_and(|m| m.active);
        let queued = self
            .resp
            .out
            .iter()
            .any(|o| matches!(o, RespOut::Ack { .. }));
        if on && (self.resp.ack_owed || queued) && self.resp.ooo.is_empty() {
            if let Some(bytes) = self.mp_encode_sack() {
                self.resp.ack_owed = false;
                ctx.counters.mp_sack_sent += 1;
                ctx.mp_out.push_back(back(bytes));
            }
        }
        if let Some(bytes) = mpw::encode_probe(self.attr.dest_qp_num, true, p) {
            ctx.counters.mp_probe_answered += 1;
            ctx.mp_out.push_back(back(bytes));
        }
    }

    /// A SACK: its cumulative part is an ACK; its ranges mark packets held.
    fn mp_on_sack(&mut self, ctx: &mut Ctx<'_>, cum: Psn, s: &Sack) {
        let now = ctx.now;
        let active = self.mp_active();
        if active {
            // The ranges first: the cumulative part's loss detection then sees every
            // delivery this SACK reports (a path whose packets are only in the ranges
            // is not silent).
            if let Some(m) = self.mp.as_deref_mut() {
                for &(a, b) in &s.ranges {
                    m.board.sack(a, b, &mut m.paths, now);
                }
            }
        }
        let mut h = Headers::new(Bth::new(Opcode::RC_ACKNOWLEDGE, self.qpn_t(), cum));
        h.aeth = Some(Aeth::ack(s.msn, Aeth::CREDITS_INVALID));
        self.on_response(ctx, &h, &[]);
        let Some(m) = self.mp.as_deref_mut() else {
            return;
        };
        m.sacks_rcvd += 1;
        ctx.counters.mp_sack_rcvd += 1;
        if !active {
            // No scoreboard here: a hole means what a sequence NAK means, and going
            // back N passes over what the responder holds.
            if !s.ranges.is_empty() && self.req.rnr_wait.is_none() {
                self.on_held(ctx, cum.next(), &s.ranges);
            }
            return;
        }
        self.mp_detect(ctx);
    }

    /// A retransmit timeout or silence with multipath: resend every packet from `from`
    /// on that the responder does not hold, selectively. False when that cannot be
    /// done (not active, `from` before the scoreboard, or a READ or atomic there):
    /// then plain RC's go-back-N.
    pub(crate) fn mp_resend_all(&mut self, now: Nanos, from: Psn, timeout: bool) -> bool {
        let rd_atomic = self
            .req
            .sq
            .iter()
            .any(|w| w.contains(from) && w.is_rd_atomic());
        let Some(m) = self.mp.as_deref_mut().filter(|m| m.active) else {
            return false;
        };
        if rd_atomic || from.is_before(m.board.base) || m.board.sent.is_empty() {
            return false;
        }
        let lost = m.board.all_lost(from, &mut m.paths);
        if timeout {
            // Nothing came back on any path for a whole timeout: every path's
            // controller starts low again.
            for c in m.paths.iter_mut().filter_map(|p| p.cc.as_mut()) {
                c.on_congestion(now, Congestion::Timeout);
            }
        }
        m.resend.clear();
        m.resend.extend(lost);
        m.cur = None;
        true
    }

    /// A go-back-N restart (every path silent for a whole timeout): the scoreboard
    /// starts over with what is sent from now on.
    pub(crate) fn mp_restart(&mut self) {
        if let Some(m) = self.mp.as_deref_mut() {
            m.resend.clear();
            m.board.clear(&mut m.paths);
            for p in &mut m.paths {
                p.sent_at.clear();
            }
            m.cur = None;
        }
    }

    /// This QP's figures.
    pub(crate) fn mp_stats(&self) -> Option<MpStats> {
        let m = self.mp.as_deref()?;
        Some(MpStats {
            state: m.state,
            active: m.active,
            paths: m.paths.iter().map(PathState::stats).collect(),
            sacks_sent: m.sacks_sent,
            sacks_rcvd: m.sacks_rcvd,
            resends: m.resends,
            packet_bytes: m.jumbo,
        })
    }
}

fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    Gid::from_ip(a) == Gid::from_ip(b)
}
