//! In-memory network harness: several engines, a seeded RNG, a virtual clock and a
//! network that loses, reorders, duplicates and corrupts packets on demand.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use smallvec::SmallVec;
use softhca_transport::bringup;
use softhca_transport::*;

/// Fault model of the simulated network.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub loss: f64,
    pub reorder: f64,
    pub duplicate: f64,
    pub corrupt: f64,
    /// One-way delay.
    pub delay_ns: u64,
    /// Extra random delay for reordered packets.
    pub jitter_ns: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            delay_ns: 5_000,
            jitter_ns: 20_000,
        }
    }
}

/// A registered buffer owned by the test.
#[derive(Debug, Clone, Copy)]
pub struct Mr {
    pub node: usize,
    pub idx: usize,
    pub addr: u64,
    pub len: usize,
    pub lkey: u32,
    pub rkey: u32,
}

impl Mr {
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.addr + off as u64,
            length: len as u32,
            lkey: self.lkey,
        }
    }
    pub fn sges(&self, off: usize, len: usize) -> SmallVec<[Sge; 4]> {
        smallvec::smallvec![self.sge(off, len)]
    }
}

pub struct Node {
    pub engine: Engine,
    pub ip: IpAddr,
    /// More addresses this node serves (a multi-homed node: one per link).
    pub extra_ips: Vec<IpAddr>,
    pub pd: PdId,
    pub cq: CqId,
    bufs: Vec<Box<[u8]>>,
    pub completions: Vec<(CqId, Completion)>,
    pub events: Vec<AsyncEvent>,
}

struct InFlight {
    at: u64,
    seq: u64,
    from: usize,
    to: usize,
    info: DatagramInfo,
    bytes: Vec<u8>,
}
impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// A bottleneck link with a finite drop-tail queue in front of some nodes (a token
/// bucket's queue, a slow hop): packets to them are serialised at its rate, one after the
/// other, and dropped when its queue is full.
#[derive(Debug, Clone, Default)]
pub struct Bottleneck {
    /// Serialisation time per byte in picoseconds (8000: 1 Gb/s).
    pub ps_per_byte: u64,
    /// Bytes the queue holds (packets waiting and the one being sent).
    pub queue_bytes: u64,
    /// The nodes behind the bottleneck: packets to them go through it.
    pub to: Vec<usize>,
    /// When the link is free again.
    pub free_at: u64,
    /// Packets dropped because the queue was full.
    pub drops: u64,
    /// Packets that went through.
    pub passed: u64,
    /// Bytes that went through, by sending node.
    pub bytes_from: Vec<u64>,
}

impl Bottleneck {
    /// A bottleneck of `bits_per_s` with a queue of `queue_bytes` in front of `to`.
    pub fn new(bits_per_s: u64, queue_bytes: u64, to: Vec<usize>) -> Bottleneck {
        Bottleneck {
            ps_per_byte: 8_000_000_000_000 / bits_per_s,
            queue_bytes,
            to,
            ..Bottleneck::default()
        }
    }

    /// Change the rate (a path that slows down or speeds up).
    pub fn set_rate(&mut self, bits_per_s: u64) {
        self.ps_per_byte = 8_000_000_000_000 / bits_per_s;
    }

    /// The packet of `len` bytes from `from` reaches the bottleneck at `at`: when it leaves
    /// it, or None when the queue is full.
    fn pass(&mut self, from: usize, at: u64, len: usize) -> Option<u64> {
        let backlog = self.free_at.saturating_sub(at) * 1000 / self.ps_per_byte.max(1);
        if backlog + len as u64 > self.queue_bytes {
            self.drops += 1;
            return None;
        }
        self.free_at = self.free_at.max(at) + len as u64 * self.ps_per_byte / 1000;
        self.passed += 1;
        if self.bytes_from.len() <= from {
            self.bytes_from.resize(from + 1, 0);
        }
        self.bytes_from[from] += len as u64;
        Some(self.free_at)
    }
}

/// Drops a packet (from node, UDP payload) when it returns true.
pub type Filter = Box<dyn FnMut(usize, &[u8]) -> bool>;

/// What happens on one direction of one link: packets from `src` to `dst` (an address
/// None matches any).
#[derive(Debug, Clone, Copy, Default)]
pub struct PathFault {
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    /// Drop every packet (a silent black hole).
    pub cut: bool,
    /// Drop this share at random.
    pub loss: f64,
    /// Added one-way delay.
    pub delay_ns: u64,
}

impl PathFault {
    fn matches(&self, src: IpAddr, dst: IpAddr) -> bool {
        self.src.is_none_or(|a| a == src) && self.dst.is_none_or(|a| a == dst)
    }
}

pub struct SimNet {
    pub nodes: Vec<Node>,
    pub rng: ChaCha8Rng,
    pub now: u64,
    pub faults: Faults,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    buf: Vec<u8>,
    /// Packets sent with their payload left in registered memory (zero-copy).
    pub external_payloads: usize,
    pub delivered: u64,
    pub transmits: u64,
    /// Default path MTU for QPs.
    pub mtu: Mtu,
    pub max_batch: usize,
    /// Drop every packet for which this returns true (targeted loss in tests).
    pub filter: Option<Filter>,
    /// Packets `path_faults` dropped (cut or lost).
    pub path_fault_drops: u64,
    /// Serialization time per byte in picoseconds (800: 10 Gb/s); 0: packets of one
    /// flight all leave at the same instant.
    pub link_ps_per_byte: u64,
    /// When each node's link is free again.
    link_free_at: Vec<u64>,
    /// Per node: its process is descheduled until then (see [`SimNet::pause`]).
    paused_until: Vec<u64>,
    /// A bottleneck in front of some nodes.
    pub bottleneck: Option<Bottleneck>,
    /// A bottleneck in front of one address each (one link of a multihomed node), after
    /// `bottleneck`.
    pub addr_bottlenecks: Vec<(IpAddr, Bottleneck)>,
    /// Receive as the device's direct receive does (see [`SimNet::deliver_run`]).
    pub direct: bool,
    /// Faults of single paths (multipath tests), applied in order.
    pub path_faults: Vec<PathFault>,
    /// Packets put on the wire, by (source, destination) address.
    pub per_link: std::collections::HashMap<(IpAddr, IpAddr), u64>,
    /// When set, the (opcode, IP TOS) of every packet put on the wire.
    pub wire_tos: Option<Vec<(u8, u8)>>,
}

pub fn cfg_for(ip: IpAddr, mtu: Mtu) -> EngineConfig {
    EngineConfig {
        gids: vec![Gid::from_ip(ip)],
        max_mtu: mtu,
        max_gso_segments: 16,
        ..EngineConfig::default()
    }
}

impl SimNet {
    pub fn new(seed: u64, n: usize, mtu: Mtu) -> SimNet {
        SimNet::with_config(seed, n, mtu, |_| {})
    }

    /// [`SimNet::new`] with each node's engine configuration adjusted by `tweak`.
    pub fn with_config(seed: u64, n: usize, mtu: Mtu, tweak: impl Fn(&mut EngineConfig)) -> SimNet {
        let mut nodes = Vec::new();
        for i in 0..n {
            let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1));
            let mut cfg = cfg_for(ip, Mtu::M4096);
            tweak(&mut cfg);
            let mut engine = Engine::new(cfg);
            let pd = engine.memory_mut().alloc_pd();
            let cq = engine.create_cq();
            nodes.push(Node {
                engine,
                ip,
                extra_ips: Vec::new(),
                pd,
                cq,
                bufs: Vec::new(),
                completions: Vec::new(),
                events: Vec::new(),
            });
        }
        SimNet {
            nodes,
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            faults: Faults::default(),
            queue: BinaryHeap::new(),
            seq: 0,
            buf: vec![0u8; 256 * 1024],
            external_payloads: 0,
            delivered: 0,
            transmits: 0,
            mtu,
            max_batch: 0,
            filter: None,
            path_fault_drops: 0,
            link_ps_per_byte: 0,
            link_free_at: vec![0; n],
            paused_until: vec![0; n],
            bottleneck: None,
            addr_bottlenecks: Vec::new(),
            direct: false,
            path_faults: Vec::new(),
            per_link: std::collections::HashMap::new(),
            wire_tos: None,
        }
    }

    /// Two nodes joined by `links` links: node i has address 10.0.k.(i+1) on link k,
    /// and serves them all; each engine runs `tweak` on its configuration last.
    pub fn multihomed(seed: u64, links: u8, mtu: Mtu, tweak: impl Fn(&mut EngineConfig)) -> SimNet {
        let ip = |node: u8, link: u8| IpAddr::V4(Ipv4Addr::new(10, 0, link, node + 1));
        let mut net = SimNet::with_config(seed, 2, mtu, |cfg| {
            // Which node: its first GID (set by `with_config`).
            let node = match cfg.gids[0].to_ip() {
                IpAddr::V4(v4) => v4.octets()[3] - 1,
                IpAddr::V6(_) => 0,
            };
            cfg.gids = (0..links).map(|k| Gid::from_ip(ip(node, k))).collect();
            tweak(cfg);
        });
        for (i, n) in net.nodes.iter_mut().enumerate() {
            n.extra_ips = (1..links).map(|k| ip(i as u8, k)).collect();
        }
        net
    }

    /// Register a zeroed buffer of `len` bytes on `node`.
    pub fn reg(&mut self, node: usize, len: usize, access: AccessFlags) -> Mr {
        let pd = self.nodes[node].pd;
        self.reg_pd(node, pd, len, access)
    }

    pub fn reg_pd(&mut self, node: usize, pd: PdId, len: usize, access: AccessFlags) -> Mr {
        let n = &mut self.nodes[node];
        let mut b = vec![0u8; len.max(1)].into_boxed_slice();
        let addr = b.as_mut_ptr() as u64;
        // SAFETY: the box lives in `n.bufs` for the whole test, never moves its heap
        // allocation, and outlives the engine's use of it.
        let keys = unsafe {
            n.engine
                .memory_mut()
                .register(pd, b.as_mut_ptr(), len.max(1), addr, access)
        }
        .expect("register");
        n.bufs.push(b);
        Mr {
            node,
            idx: n.bufs.len() - 1,
            addr,
            len,
            lkey: keys.lkey,
            rkey: keys.rkey,
        }
    }

    pub fn mem(&self, mr: &Mr) -> &[u8] {
        &self.nodes[mr.node].bufs[mr.idx][..mr.len]
    }

    pub fn mem_mut(&mut self, mr: &Mr) -> &mut [u8] {
        &mut self.nodes[mr.node].bufs[mr.idx][..mr.len]
    }

    /// Fill with pseudo-random bytes (xorshift seeded from the net's RNG: ChaCha is
    /// too slow for megabytes in debug builds).
    pub fn fill_random(&mut self, mr: &Mr) {
        let mut x: u64 = self.rng.gen::<u64>() | 1;
        for chunk in self.mem_mut(mr).chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }

    fn node_of(&self, ip: IpAddr) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.ip == ip || n.extra_ips.contains(&ip))
    }

    fn collect(&mut self) {
        for i in 0..self.nodes.len() {
            while let Some(c) = self.nodes[i].engine.poll_completion() {
                self.nodes[i].completions.push(c);
            }
            while let Some(e) = self.nodes[i].engine.poll_event() {
                self.nodes[i].events.push(e);
            }
        }
    }

    /// Move every pending transmit onto the wire. Even-numbered nodes build zero-copy
    /// transmits (`poll_transmit_gather`, payloads left in their MRs), joined here, so
    /// that every test runs both ways of building packets.
    pub fn flush_tx(&mut self) {
        let mut pieces = Vec::new();
        for i in 0..self.nodes.len() {
            if self.paused(i) {
                continue;
            }
            loop {
                let now = self.now;
                let gather = i % 2 == 0;
                let next = if gather {
                    self.nodes[i]
                        .engine
                        .poll_transmit_gather(now, &mut self.buf, &mut pieces)
                } else {
                    self.nodes[i].engine.poll_transmit(now, &mut self.buf)
                };
                let Some(t) = next else {
                    break;
                };
                self.transmits += 1;
                assert!(t.segment_size > 0 && t.len > 0);
                let npk = t.len.div_ceil(t.segment_size);
                self.max_batch = self.max_batch.max(npk);
                let bytes = if gather {
                    self.external_payloads +=
                        pieces.iter().filter(|p| p.external.is_some()).count();
                    let mem = self.nodes[i].engine.memory();
                    seal_gathered(mem, &t, &mut self.buf, &pieces);
                    join_pieces(mem, &self.buf, &pieces)
                } else {
                    self.buf[..t.len].to_vec()
                };
                assert_eq!(bytes.len(), t.len);
                for (k, pkt) in bytes.chunks(t.segment_size).enumerate() {
                    self.send_one(i, &t, k as u16, pkt);
                }
            }
        }
        self.collect();
    }

    /// Puts the packets of a transmit the test built itself on the wire, `bytes` being its
    /// wire bytes (each packet's IPv4 ID is its position, as in a GSO send).
    pub fn send_transmit(&mut self, from: usize, t: &Transmit, bytes: &[u8]) {
        assert_eq!(bytes.len(), t.len);
        for (k, pkt) in bytes.chunks(t.segment_size).enumerate() {
            self.send_one(from, t, k as u16, pkt);
        }
    }

    fn send_one(&mut self, from: usize, t: &Transmit, index: u16, pkt: &[u8]) {
        let Some(to) = self.node_of(t.dst.ip()) else {
            return;
        };
        if let Some(f) = self.filter.as_mut() {
            if f(from, pkt) {
                return;
            }
        }
        let f = self.faults;
        if f.loss > 0.0 && self.rng.gen_bool(f.loss) {
            return;
        }
        *self.per_link.entry((t.src, t.dst.ip())).or_default() += 1;
        if let Some(w) = self.wire_tos.as_mut() {
            w.push((pkt[0], t.tos));
        }
        let mut path_delay = 0;
        for pf in &self.path_faults {
            if pf.matches(t.src, t.dst.ip()) {
                if pf.cut || (pf.loss > 0.0 && self.rng.gen_bool(pf.loss)) {
                    self.path_fault_drops += 1;
                    return;
                }
                path_delay += pf.delay_ns;
            }
        }
        let copies = if f.duplicate > 0.0 && self.rng.gen_bool(f.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut bytes = pkt.to_vec();
            if f.corrupt > 0.0 && self.rng.gen_bool(f.corrupt) {
                let bit = self.rng.gen_range(0..bytes.len() * 8);
                bytes[bit / 8] ^= 1 << (bit % 8);
            }
            let depart = if self.link_ps_per_byte > 0 {
                let free = &mut self.link_free_at[from];
                *free = (*free).max(self.now) + bytes.len() as u64 * self.link_ps_per_byte / 1000;
                *free
            } else {
                self.now
            };
            let depart = match self.bottleneck.as_mut() {
                Some(b) if b.to.contains(&to) => match b.pass(from, depart, bytes.len()) {
                    Some(t) => t,
                    None => continue,
                },
                _ => depart,
            };
            let depart = match self
                .addr_bottlenecks
                .iter_mut()
                .find(|(a, _)| *a == t.dst.ip())
            {
                Some((_, b)) => match b.pass(from, depart, bytes.len()) {
                    Some(t) => t,
                    None => continue,
                },
                None => depart,
            };
            let mut at = depart + f.delay_ns + path_delay;
            if f.reorder > 0.0 && self.rng.gen_bool(f.reorder) {
                at += self.rng.gen_range(0..=f.jitter_ns);
            }
            self.seq += 1;
            let info = DatagramInfo {
                src: SocketAddr::new(t.src, t.src_port),
                dst: t.dst.ip(),
                segment_index: index,
                tos: 0,
            };
            self.queue.push(Reverse(InFlight {
                at,
                seq: self.seq,
                from,
                to,
                info,
                bytes,
            }));
        }
    }

    /// `node` stops sending for `ns` from now: what it sent and what has not arrived
    /// yet, and what it sends meanwhile, arrives `ns` later (a peer whose host stalls,
    /// as kernel rxe does for a second at times on a loaded or emulated machine).
    pub fn stall(&mut self, node: usize, ns: u64) {
        let now = self.now;
        let queue = std::mem::take(&mut self.queue);
        self.queue = queue
            .into_iter()
            .map(|Reverse(mut p)| {
                if p.from == node && p.at > now {
                    p.at += ns;
                }
                Reverse(p)
            })
            .collect();
        let free = &mut self.link_free_at[node];
        *free = (*free).max(now) + ns;
    }

    /// `node`'s process is descheduled for `ns` from now (a loaded host's scheduler):
    /// its kernel keeps receiving, but the engine sees nothing, fires no timer and sends
    /// nothing until it runs again, then finds everything at once.
    pub fn pause(&mut self, node: usize, ns: u64) {
        let until = &mut self.paused_until[node];
        *until = (*until).max(self.now + ns);
    }

    fn paused(&self, node: usize) -> bool {
        self.paused_until[node] > self.now
    }

    /// Delivers packets of one flow to one node. With `direct`, as the device's direct
    /// receive does with a GRO datagram: the engine plans from the first packet's
    /// headers, every packet's payload that fits the plan is written into registered
    /// memory first (whatever the packet turns out to be), then each is handed over
    /// (`handle_datagram_placed` for those placed).
    fn deliver_run(&mut self, run: &[InFlight]) {
        let now = self.now;
        self.delivered += run.len() as u64;
        let Some(to) = run.first().map(|p| p.to) else {
            return;
        };
        let engine = &mut self.nodes[to].engine;
        let mut placed = vec![None; run.len()];
        let plan = run
            .first()
            .filter(|_| self.direct)
            .and_then(|p| engine.direct_plan(p.info.src.ip(), &p.bytes));
        let hl = plan.map_or(0, |p| p.header_len);
        if let Some(plan) = plan {
            let (mut dst, mut room) = (plan.dst, plan.room);
            for (k, p) in run.iter().enumerate() {
                let n = p.bytes.len().saturating_sub(hl + 4);
                if n == 0 || n > room {
                    break;
                }
                // SAFETY: inside the plan's range of a buffer this test registered and
                // keeps alive; the engine is not running.
                unsafe { std::ptr::copy_nonoverlapping(p.bytes[hl..].as_ptr(), dst, n) };
                placed[k] = Some((dst, n));
                dst = dst.wrapping_add(n);
                room -= n;
            }
        }
        for (p, placed) in run.iter().zip(placed) {
            match placed {
                None => engine.handle_datagram(now, &p.info, &p.bytes),
                Some(at) => {
                    let icrc = p.bytes[p.bytes.len() - 4..].try_into().unwrap();
                    // SAFETY: `at` lies in the range of the plan made above, and no
                    // region was (de)registered since.
                    unsafe {
                        engine.handle_datagram_placed(now, &p.info, &p.bytes[..hl], at, icrc)
                    };
                }
            }
        }
    }

    /// Advance to the next event (delivery or timer). False when nothing is left.
    pub fn step(&mut self) -> bool {
        self.flush_tx();
        let next_pkt = self.queue.peek().map(|Reverse(p)| p.at);
        let next_timer = self
            .nodes
            .iter()
            .zip(&self.paused_until)
            .filter_map(|(n, &p)| n.engine.poll_timeout().map(|t| t.max(p)))
            .min();
        // A paused process runs again then (and sends what it has).
        let next_resume = self
            .paused_until
            .iter()
            .filter(|&&p| p > self.now)
            .min()
            .copied();
        let next = match (next_pkt, next_timer.or(next_resume)) {
            (None, None) => return false,
            (a, b) => a
                .into_iter()
                .chain(b)
                .chain(next_resume)
                .min()
                .unwrap_or(self.now),
        };
        self.now = self.now.max(next);
        let mut due = Vec::new();
        let mut held = Vec::new();
        while let Some(Reverse(p)) = self.queue.peek() {
            if p.at > self.now {
                break;
            }
            let Some(Reverse(mut p)) = self.queue.pop() else {
                break;
            };
            if self.paused(p.to) {
                // In the socket's buffer until the process runs again.
                p.at = self.paused_until[p.to];
                held.push(Reverse(p));
            } else {
                due.push(p);
            }
        }
        self.queue.extend(held);
        let mut rest = &due[..];
        while !rest.is_empty() {
            // A run of packets of one flow, as GRO would coalesce them (1 to 15).
            let max = if self.direct {
                self.rng.gen_range(1..=15)
            } else {
                1
            };
            let flow = |p: &InFlight| (p.to, p.info.src);
            let n = rest
                .iter()
                .take(max)
                .take_while(|p| flow(p) == flow(&rest[0]))
                .count();
            let (run, tail) = rest.split_at(n);
            self.deliver_run(run);
            rest = tail;
        }
        for i in 0..self.nodes.len() {
            if !self.paused(i)
                && self.nodes[i]
                    .engine
                    .poll_timeout()
                    .is_some_and(|t| t <= self.now)
            {
                let now = self.now;
                self.nodes[i].engine.handle_timeout(now);
            }
        }
        self.flush_tx();
        true
    }

    /// Run until `done` holds or nothing is left to do or `max_ns` passes.
    pub fn run_until(&mut self, max_ns: u64, mut done: impl FnMut(&SimNet) -> bool) -> bool {
        let end = self.now + max_ns;
        loop {
            self.collect();
            if done(self) {
                return true;
            }
            if self.now > end || !self.step() {
                self.collect();
                return done(self);
            }
        }
    }

    /// Run until quiet (no packets, no timers) or `max_ns`.
    pub fn run(&mut self, max_ns: u64) {
        self.run_until(max_ns, |_| false);
    }

    pub fn take_completions(&mut self, node: usize) -> Vec<Completion> {
        self.collect();
        std::mem::take(&mut self.nodes[node].completions)
            .into_iter()
            .map(|(_, c)| c)
            .collect()
    }

    pub fn count_completions(&self, node: usize) -> usize {
        self.nodes[node].completions.len()
    }
}

/// Defaults like perftest's connect: timeout 14 is too slow for virtual-time tests, so 10.
pub struct RcOpts {
    /// Path MTU; None: the net's default.
    pub mtu: Option<Mtu>,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub access: AccessFlags,
    pub sq_sig_all: bool,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    /// The AV's GRH traffic class (the IP TOS of the QP's packets).
    pub traffic_class: u8,
}

impl Default for RcOpts {
    fn default() -> Self {
        RcOpts {
            mtu: None,
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            sq_sig_all: false,
            max_send_wr: 4096,
            max_recv_wr: 4096,
            traffic_class: 0,
        }
    }
}

pub fn full_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

pub fn create(net: &mut SimNet, node: usize, ty: QpType, o: &RcOpts, srq: Option<SrqId>) -> Qpn {
    let n = &mut net.nodes[node];
    let init = QpInitAttr {
        qp_type: ty,
        pd: n.pd,
        send_cq: n.cq,
        recv_cq: n.cq,
        srq,
        cap: QpCap {
            max_send_wr: o.max_send_wr,
            max_recv_wr: o.max_recv_wr,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        },
        sq_sig_all: o.sq_sig_all,
    };
    n.engine.create_qp(&init).expect("create_qp")
}

pub fn qpn_u32(q: Qpn) -> u32 {
    q.value()
}

/// What [`connect_one`] asks of node `node`'s engine for a QP to `peer_qpn` on `peer`.
pub fn connect_params(
    net: &SimNet,
    peer: usize,
    peer_qpn: Qpn,
    o: &RcOpts,
    sq_psn: u32,
    rq_psn: u32,
) -> bringup::Connect {
    bringup::Connect {
        dest_qp_num: qpn_u32(peer_qpn),
        rq_psn,
        sq_psn,
        av: AddressVector {
            dgid: Gid::from_ip(net.nodes[peer].ip),
            hop_limit: 64,
            port_num: 1,
            traffic_class: o.traffic_class,
            ..AddressVector::default()
        },
        path_mtu: o.mtu.unwrap_or(net.mtu),
        rd_atomic: o.max_rd_atomic,
        min_rnr_timer: o.min_rnr_timer,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
    }
}

/// Bring a connected (RC/UC) QP to RTS.
#[allow(clippy::too_many_arguments)]
pub fn connect_one(
    net: &mut SimNet,
    node: usize,
    qpn: Qpn,
    ty: QpType,
    peer: usize,
    peer_qpn: Qpn,
    o: &RcOpts,
    sq_psn: u32,
    rq_psn: u32,
) {
    let now = net.now;
    let c = connect_params(net, peer, peer_qpn, o, sq_psn, rq_psn);
    let e = &mut net.nodes[node].engine;
    assert_eq!(e.query_qp(qpn).expect("qp").1.qp_type, ty);
    e.connect_qp(now, qpn, o.access, &c)
        .expect("INIT, RTR, RTS");
}

/// Two nodes with a connected pair of QPs: returns (qp on node 0, qp on node 1).
pub fn pair(net: &mut SimNet, ty: QpType, o: &RcOpts) -> (Qpn, Qpn) {
    let a = create(net, 0, ty, o, None);
    let b = create(net, 1, ty, o, None);
    let (pa, pb) = (0x00ff_fff0, 0x123); // exercise PSN wrap on one side
    connect_one(net, 0, a, ty, 1, b, o, pa, pb);
    connect_one(net, 1, b, ty, 0, a, o, pb, pa);
    (a, b)
}

pub fn send_wr(wr_id: u64, opcode: WrOpcode, sges: SmallVec<[Sge; 4]>) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        flags: SendFlags::SIGNALED,
        payload: Payload::Sges(sges),
        ..SendWr::default()
    }
}

pub fn recv_wr(wr_id: u64, sges: SmallVec<[Sge; 4]>) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: sges,
    }
}

/// The wire bytes of a zero-copy transmit: headers from `buf`, payloads from registered
/// memory.
pub fn join_pieces(mem: &MemoryTable, buf: &[u8], pieces: &[TxPiece]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        out.extend_from_slice(&buf[p.start..p.start + p.head]);
        if let Some(e) = p.external {
            out.extend_from_slice(mem.external_payload(&e).expect("registered"));
        }
        out.extend_from_slice(&buf[p.start + p.head..p.start + p.head + p.tail]);
    }
    out
}

/// Seals the packets of a gathered transmit as a GSO send from its `src_port` would
/// carry them: packet `i` with IPv4 ID `i`.
pub fn seal_gathered(mem: &MemoryTable, t: &Transmit, buf: &mut [u8], pieces: &[TxPiece]) {
    for (i, p) in pieces.iter().enumerate() {
        let payload = match p.external {
            Some(e) => mem.external_payload(&e).expect("registered"),
            None => &[],
        };
        assert!(
            t.seal(buf, p, payload, t.src_port, i as u16),
            "piece {i} sealed"
        );
    }
}
