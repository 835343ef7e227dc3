//! Regression guards for the engine's hot paths, no sockets involved:
//!
//! - `place/*`: the receive path alone: a stream of RC RDMA WRITE packets (valid ICRC,
//!   in-order PSNs, 64 KiB messages cut at the path MTU) fed to `Engine::handle_datagram`
//!   of a connected RC QP, which checks the ICRC, parses, and places the payload in a
//!   registered MR; the ACKs it queues are drained with `poll_transmit` inside the timing.
//!   `place/rc_write_socket` adds the socket's copy of each packet into a receive buffer;
//!   `place/rc_write_direct` instead copies what `Engine::direct_plan` allows straight
//!   into the MR and feeds it to `handle_datagram_placed` (direct receive, the socket's
//!   copy emulated by a memcpy: whether that copy costs more into the MR than into a
//!   cache-hot buffer is for a socket run to show).
//! - `pair/*`: two engines back to back, every `poll_transmit` batch cut into its GSO
//!   segments and fed to the other side's `handle_datagram` (as tests/sim does, minus the
//!   fault model and the event queue): RC WRITE 64 KiB and SEND 4 KiB streams with 16 WRs
//!   outstanding, and 8-byte SEND ping-pong round trips.
//!
//! Run: `cargo bench -p softhca-transport --bench engine` (add `-- --quick` or
//! `-- --warm-up-time 1 --measurement-time 2` for a short check).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use smallvec::smallvec;
use softhca_transport::*;
use softhca_wire as wire;

const IP_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const IP_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
/// Room for the largest GSO batch (64 segments of a 4096-byte MTU packet plus headers).
const TX_BUF: usize = 64 * 4200;
/// Message size of the WRITE streams.
const WRITE_LEN: usize = 64 * 1024;
/// WRs kept outstanding by the streaming pair benches (perftest's `--tx-depth` idea).
const WINDOW: usize = 16;

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// A zeroed buffer registered with an engine. Only raw pointers to it are kept: the
/// engine writes through its own copy of the pointer, so the bench must hold no Rust
/// reference to the bytes across an engine call.
struct Region {
    ptr: *mut u8,
    len: usize,
    keys: MrKeys,
}

impl Region {
    fn new(engine: &mut Engine, pd: PdId, len: usize) -> Region {
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>();
        // SAFETY: the allocation stays valid for reads and writes until `Drop` below, which
        // runs only after the benchmark stops calling into the engine that holds it; the
        // bench keeps no reference to the bytes while the engine may touch them.
        let keys = unsafe {
            engine
                .memory_mut()
                .register(pd, ptr, len, ptr as u64, access())
        }
        .expect("register MR");
        Region { ptr, len, keys }
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.addr() + off as u64,
            length: len as u32,
            lkey: self.keys.lkey,
        }
    }

    /// Copy of the bytes (between engine calls only).
    fn snapshot(&self) -> Vec<u8> {
        // SAFETY: `ptr..ptr + len` is the live allocation made in `new`; no engine call
        // runs while this short-lived slice exists, so nothing writes to it meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }.to_vec()
    }

    fn fill(&self, seed: u8) {
        // SAFETY: as in `snapshot`: the allocation is live and no engine call runs while
        // this exclusive slice exists.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` come from `Box::into_raw` of a boxed slice of `len` bytes in
        // `new` and are freed only here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// One side: an engine with a PD, a CQ and one RC QP.
struct Side {
    engine: Engine,
    pd: PdId,
    qpn: Qpn,
}

impl Side {
    fn new(ip: IpAddr) -> Side {
        let mut engine = Engine::new(EngineConfig {
            gids: vec![Gid::from_ip(ip)],
            max_mtu: Mtu::M4096,
            ..EngineConfig::default()
        });
        let pd = engine.memory_mut().alloc_pd();
        let cq = engine.create_cq();
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        };
        let qpn = engine.create_qp(&init).expect("create_qp");
        Side { engine, pd, qpn }
    }

    /// INIT → RTR → RTS towards `peer_ip`/`peer_qpn`, with perftest-like attributes.
    fn connect(&mut self, mtu: Mtu, peer_ip: IpAddr, peer_qpn: u32, sq_psn: u32, rq_psn: u32) {
        let c = bringup::Connect {
            dest_qp_num: peer_qpn,
            rq_psn,
            sq_psn,
            av: AddressVector {
                dgid: Gid::from_ip(peer_ip),
                hop_limit: 64,
                port_num: 1,
                ..AddressVector::default()
            },
            path_mtu: mtu,
            rd_atomic: 16,
            min_rnr_timer: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        };
        self.engine
            .connect_qp(0, self.qpn, access(), &c)
            .expect("INIT, RTR, RTS");
    }
}

// ---------------------------------------------------------------------------------------
// place: handle_datagram alone
// ---------------------------------------------------------------------------------------

/// Builds the RC RDMA WRITE packets a requester at `IP_A` would send: 64 KiB messages to
/// the same remote buffer, First/Middle/Last at the path MTU, AckReq on the Last and every
/// 32nd packet (as our requester and rxe do), ICRC sealed with IPv4 ID 0 (what the
/// receiver predicts for a peer that does not number its packets).
struct WriteStream {
    flow: wire::UdpPseudo,
    dqpn: u32,
    psn: u32,
    mtu: usize,
    off: usize,
    va: u64,
    rkey: u32,
    data: Vec<u8>,
    since_ack_req: u32,
}

impl WriteStream {
    /// Writes the next packet into `buf`; returns its length.
    fn next_packet(&mut self, buf: &mut [u8]) -> usize {
        let n = self.mtu.min(WRITE_LEN - self.off);
        let first = self.off == 0;
        let last = self.off + n == WRITE_LEN;
        let opcode = match (first, last) {
            (true, true) => wire::Opcode::RC_RDMA_WRITE_ONLY,
            (true, false) => wire::Opcode::RC_RDMA_WRITE_FIRST,
            (false, false) => wire::Opcode::RC_RDMA_WRITE_MIDDLE,
            (false, true) => wire::Opcode::RC_RDMA_WRITE_LAST,
        };
        let mut h = wire::Headers::new(wire::Bth::new(
            opcode,
            wire::Qpn::new(self.dqpn),
            wire::Psn::new(self.psn),
        ));
        self.since_ack_req += 1;
        h.bth.ack_req = last || self.since_ack_req >= 32;
        if h.bth.ack_req {
            self.since_ack_req = 0;
        }
        if first {
            h.reth = Some(wire::Reth {
                va: self.va,
                rkey: self.rkey,
                dma_len: WRITE_LEN as u32,
            });
        }
        let payload = &self.data[self.off..self.off + n];
        let len = wire::emit_packet(&h, payload, buf).expect("emit");
        let len = wire::seal(&self.flow, buf, len).expect("seal");
        self.psn = (self.psn + 1) & 0x00ff_ffff;
        self.off = if last { 0 } else { self.off + n };
        len
    }
}

/// A receiver engine with a connected RC QP and a 64 KiB MR, and the stream that feeds it.
struct PlaceBench {
    rx: Side,
    mr: Region,
    stream: WriteStream,
    info: DatagramInfo,
    now: u64,
    /// Pre-built packets of one batch, back to back, and their lengths.
    arena: Vec<u8>,
    lens: Vec<usize>,
    /// The receive buffer of `feed_from_socket`.
    staging: Vec<u8>,
    tx: Vec<u8>,
}

/// Packets built per timed batch.
const PLACE_BATCH: usize = 64;

impl PlaceBench {
    fn new(mtu: Mtu) -> PlaceBench {
        let peer_qpn = 0x99;
        let sq_psn = 0x00ff_ff00; // the stream wraps the 24-bit PSN early on
        let mut rx = Side::new(IP_B);
        rx.connect(mtu, IP_A, peer_qpn, 1, sq_psn);
        let pd = rx.pd;
        let mr = Region::new(&mut rx.engine, pd, WRITE_LEN);
        let sport = wire::rxe_udp_sport(wire::Qpn::new(peer_qpn));
        let flow = wire::UdpPseudo {
            ip: wire::IpPseudo::V4 {
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
                id: 0,
                dont_fragment: true,
            },
            sport,
            dport: wire::ROCE_V2_UDP_PORT,
        };
        let stream = WriteStream {
            flow,
            dqpn: rx.qpn.value(),
            psn: sq_psn,
            mtu: mtu.bytes(),
            off: 0,
            va: mr.addr(),
            rkey: mr.keys.rkey,
            data: (0..WRITE_LEN).map(|i| (i as u8).wrapping_mul(7)).collect(),
            since_ack_req: 0,
        };
        PlaceBench {
            rx,
            mr,
            stream,
            info: DatagramInfo {
                src: SocketAddr::new(IP_A, sport),
                dst: IP_B,
                segment_index: 0,
                tos: 0,
            },
            now: 0,
            arena: vec![0u8; PLACE_BATCH * (mtu.bytes() + 64)],
            staging: vec![0u8; mtu.bytes() + 64],
            lens: Vec::with_capacity(PLACE_BATCH),
            tx: vec![0u8; TX_BUF],
        }
    }

    fn build(&mut self, count: usize) {
        let stride = self.stream.mtu + 64;
        self.lens.clear();
        for k in 0..count {
            let at = k * stride;
            let len = self.stream.next_packet(&mut self.arena[at..at + stride]);
            self.lens.push(len);
        }
    }

    /// Feed the built batch as a socket receive would deliver it: each packet copied
    /// into a receive buffer first (`direct`: false), or its payload straight into the
    /// MR where the engine plans it, run by run, placed before the run is fed, as the
    /// datapath's direct receive does with a GRO datagram (`direct`: true).
    fn feed_from_socket(&mut self, direct: bool) {
        let stride = self.stream.mtu + 64;
        self.now += 1_000;
        let mut k = 0;
        while k < self.lens.len() {
            let pkt = |k: usize| &self.arena[k * stride..k * stride + self.lens[k]];
            let plan = direct
                .then(|| self.rx.engine.direct_plan(IP_A, pkt(k)))
                .flatten();
            let Some(plan) = plan else {
                let p = pkt(k);
                self.staging[..p.len()].copy_from_slice(p);
                let p = &self.staging[..p.len()];
                self.rx.engine.handle_datagram(self.now, &self.info, p);
                k += 1;
                continue;
            };
            let hl = plan.header_len;
            let (mut dst, mut room) = (plan.dst, plan.room);
            let mut run = Vec::new();
            while k < self.lens.len() {
                let p = pkt(k);
                let n = p.len() - hl - 4;
                if n > room {
                    break;
                }
                // SAFETY: inside the plan's range of the bench's registered MR.
                unsafe { std::ptr::copy_nonoverlapping(p[hl..].as_ptr(), dst, n) };
                run.push((k, dst, n));
                dst = dst.wrapping_add(n);
                room -= n;
                k += 1;
            }
            if run.is_empty() {
                // Planned but it does not fit: as a buffered packet.
                let p = pkt(k);
                self.staging[..p.len()].copy_from_slice(p);
                let p = &self.staging[..p.len()];
                self.rx.engine.handle_datagram(self.now, &self.info, p);
                k += 1;
            }
            for (j, at, n) in run {
                let p = pkt(j);
                let icrc = p[p.len() - 4..].try_into().expect("icrc");
                // SAFETY: `at..at + n` lies in the plan made above; nothing was
                // (de)registered since.
                unsafe {
                    self.rx.engine.handle_datagram_placed(
                        self.now,
                        &self.info,
                        &p[..hl],
                        (at, n),
                        icrc,
                    )
                };
            }
        }
        while self
            .rx
            .engine
            .poll_transmit(self.now, &mut self.tx)
            .is_some()
        {}
    }

    /// Feed the built batch and drain the ACKs it produced.
    fn feed(&mut self) {
        let stride = self.stream.mtu + 64;
        self.now += 1_000;
        for (k, &len) in self.lens.iter().enumerate() {
            let at = k * stride;
            self.rx
                .engine
                .handle_datagram(self.now, &self.info, &self.arena[at..at + len]);
        }
        while self
            .rx
            .engine
            .poll_transmit(self.now, &mut self.tx)
            .is_some()
        {}
    }

    /// Time `packets` packets, built in untimed batches, fed by `how` (`feed`, or
    /// `feed_from_socket`).
    fn run_with(&mut self, packets: u64, how: impl Fn(&mut Self)) -> Duration {
        let mut left = packets;
        let mut total = Duration::ZERO;
        while left > 0 {
            let n = left.min(PLACE_BATCH as u64) as usize;
            self.build(n);
            let t = Instant::now();
            how(self);
            total += t.elapsed();
            left -= n as u64;
        }
        total
    }

    fn run(&mut self, packets: u64) -> Duration {
        self.run_with(packets, Self::feed)
    }

    /// Every packet fed so far was accepted and placed, none dropped.
    fn check(&self, fed: u64) {
        let c = self.rx.engine.counters();
        let drops = c.drop_bad_icrc
            + c.drop_malformed
            + c.drop_unknown_qpn
            + c.drop_bad_opcode
            + c.drop_wrong_peer
            + c.duplicate_request;
        assert_eq!(
            (c.rcvd_pkts, drops),
            (fed, 0),
            "place stream rejected: {c:?}"
        );
    }
}

fn bench_place(c: &mut Criterion) {
    let mut g = c.benchmark_group("place");
    for mtu in [Mtu::M256, Mtu::M1024, Mtu::M4096] {
        let mut b = PlaceBench::new(mtu);
        // One whole message first: it must land byte for byte.
        let per_msg = WRITE_LEN.div_ceil(mtu.bytes()) as u64;
        b.run(per_msg);
        b.check(per_msg);
        assert!(b.mr.snapshot() == b.stream.data, "WRITE payload not placed");
        let mut fed = per_msg;
        g.throughput(Throughput::Bytes(mtu.bytes() as u64));
        g.bench_function(BenchmarkId::new("rc_write", mtu.bytes()), |bn| {
            bn.iter_custom(|iters| {
                fed += iters;
                b.run(iters)
            })
        });
        for (name, direct) in [("rc_write_socket", false), ("rc_write_direct", true)] {
            g.bench_function(BenchmarkId::new(name, mtu.bytes()), |bn| {
                bn.iter_custom(|iters| {
                    fed += iters;
                    b.run_with(iters, |b| b.feed_from_socket(direct))
                })
            });
        }
        b.check(fed);
        assert!(b.mr.snapshot() == b.stream.data, "WRITE payload not placed");
    }
    g.finish();
}

// ---------------------------------------------------------------------------------------
// pair: two engines back to back
// ---------------------------------------------------------------------------------------

struct Pair {
    a: Side,
    b: Side,
    now: u64,
    buf: Vec<u8>,
    /// a's source buffer and b's target / receive buffer (WINDOW slots of the message size).
    src: Region,
    dst: Region,
    /// Receive buffer on a (ping-pong replies).
    back: Region,
    msg: usize,
}

/// Sends everything `from` has queued to `to`, segment by segment as GRO would deliver
/// it. Returns the number of packets moved.
fn deliver(from: &mut Side, to: &mut Side, now: u64, buf: &mut [u8]) -> usize {
    let mut moved = 0;
    while let Some(t) = from.engine.poll_transmit(now, buf) {
        for (k, pkt) in buf[..t.len].chunks(t.segment_size).enumerate() {
            let info = DatagramInfo {
                src: SocketAddr::new(t.src, t.src_port),
                dst: t.dst.ip(),
                segment_index: k as u16,
                tos: 0,
            };
            to.engine.handle_datagram(now, &info, pkt);
            moved += 1;
        }
    }
    moved
}

impl Pair {
    fn new(mtu: Mtu, msg: usize) -> Pair {
        let mut a = Side::new(IP_A);
        let mut b = Side::new(IP_B);
        let (pa, pb) = (0x00ff_fff0, 0x123);
        let (qa, qb) = (a.qpn.value(), b.qpn.value());
        a.connect(mtu, IP_B, qb, pa, pb);
        b.connect(mtu, IP_A, qa, pb, pa);
        let (pda, pdb) = (a.pd, b.pd);
        let src = Region::new(&mut a.engine, pda, msg * WINDOW);
        let back = Region::new(&mut a.engine, pda, msg.max(64));
        let dst = Region::new(&mut b.engine, pdb, msg * WINDOW);
        src.fill(3);
        Pair {
            a,
            b,
            now: 0,
            buf: vec![0u8; TX_BUF],
            src,
            dst,
            back,
            msg,
        }
    }

    /// One round of the wire both ways; fires due timers (none on a clean run: the ACK
    /// timeout is 4.096 µs × 2^14 and each round advances 1 µs of virtual time).
    fn pump(&mut self) -> usize {
        self.now += 1_000;
        let moved = deliver(&mut self.a, &mut self.b, self.now, &mut self.buf)
            + deliver(&mut self.b, &mut self.a, self.now, &mut self.buf);
        for s in [&mut self.a, &mut self.b] {
            if s.engine.poll_timeout().is_some_and(|t| t <= self.now) {
                s.engine.handle_timeout(self.now);
            }
        }
        moved
    }

    /// Completions as (on a, on b); panics on an error completion (a broken engine must
    /// not pass as a fast one).
    fn reap(&mut self) -> (usize, usize) {
        let mut n = [0usize; 2];
        for (i, s) in [&mut self.a, &mut self.b].into_iter().enumerate() {
            while let Some((_, wc)) = s.engine.poll_completion() {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                n[i] += 1;
            }
        }
        (n[0], n[1])
    }

    fn post_write(&mut self, slot: usize, wr_id: u64) {
        let off = slot * self.msg;
        let wr = SendWr {
            wr_id,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED,
            payload: Payload::Sges(smallvec![self.src.sge(off, self.msg)]),
            remote_addr: self.dst.addr() + off as u64,
            rkey: self.dst.keys.rkey,
            ..SendWr::default()
        };
        self.a
            .engine
            .post_send(self.now, self.a.qpn, wr)
            .expect("post WRITE");
    }

    fn post_send(&mut self, slot: usize, wr_id: u64) {
        let off = slot * self.msg;
        let rwr = RecvWr {
            wr_id,
            sg_list: smallvec![self.dst.sge(off, self.msg)],
        };
        self.b.engine.post_recv(self.b.qpn, rwr).expect("post RECV");
        let wr = SendWr {
            wr_id,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            payload: Payload::Sges(smallvec![self.src.sge(off, self.msg)]),
            ..SendWr::default()
        };
        self.a
            .engine
            .post_send(self.now, self.a.qpn, wr)
            .expect("post SEND");
    }

    /// Stream `count` messages with up to WINDOW outstanding; `recv_side` says whether b
    /// sees a completion per message (SEND) or not (WRITE). Returns the time taken.
    fn stream(&mut self, count: u64, send: bool) -> Duration {
        let t = Instant::now();
        let (mut posted, mut done_a, mut done_b) = (0u64, 0u64, 0u64);
        let want_b = if send { count } else { 0 };
        let mut idle = 0;
        while done_a < count || done_b < want_b {
            while posted < count && posted - done_a < WINDOW as u64 {
                let slot = (posted % WINDOW as u64) as usize;
                if send {
                    self.post_send(slot, posted);
                } else {
                    self.post_write(slot, posted);
                }
                posted += 1;
            }
            let moved = self.pump();
            let (ca, cb) = self.reap();
            done_a += ca as u64;
            done_b += cb as u64;
            idle = if moved == 0 && ca + cb == 0 {
                idle + 1
            } else {
                0
            };
            assert!(
                idle < 1000,
                "pair stalled: {done_a}/{count} sent, {done_b} received"
            );
        }
        t.elapsed()
    }

    /// One 8-byte SEND a → b and the 8-byte reply b → a, each side waiting for the
    /// other's receive completion (perftest `ib_send_lat`).
    fn ping_pong(&mut self, i: u64) {
        let small = 8;
        let post_recv = |s: &mut Side, sge: Sge| {
            s.engine
                .post_recv(
                    s.qpn,
                    RecvWr {
                        wr_id: i,
                        sg_list: smallvec![sge],
                    },
                )
                .expect("post RECV");
        };
        post_recv(&mut self.b, self.dst.sge(0, small));
        post_recv(&mut self.a, self.back.sge(0, small));
        let send = |s: &mut Side, sge: Sge, now: u64| {
            let wr = SendWr {
                wr_id: i,
                opcode: WrOpcode::Send,
                flags: SendFlags::SIGNALED,
                payload: Payload::Sges(smallvec![sge]),
                ..SendWr::default()
            };
            s.engine.post_send(now, s.qpn, wr).expect("post SEND");
        };
        send(&mut self.a, self.src.sge(0, small), self.now);
        self.wait_recv(false);
        send(&mut self.b, self.dst.sge(0, small), self.now);
        self.wait_recv(true);
    }

    /// Pump until a receive completion shows up on a (`on_a`) or b; send completions on
    /// the way are counted off too.
    fn wait_recv(&mut self, on_a: bool) {
        for _ in 0..1000 {
            self.pump();
            for (is_a, s) in [(true, &mut self.a), (false, &mut self.b)] {
                let mut got = false;
                while let Some((_, wc)) = s.engine.poll_completion() {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    got |= wc.opcode == WcOpcode::Recv;
                }
                if got && is_a == on_a {
                    return;
                }
            }
        }
        panic!("ping-pong stalled");
    }
}

fn bench_pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    for (name, mtu, msg, send) in [
        ("rc_write_64k", Mtu::M4096, WRITE_LEN, false),
        ("rc_write_64k", Mtu::M1024, WRITE_LEN, false),
        ("rc_send_4k", Mtu::M4096, 4096, true),
    ] {
        let mut p = Pair::new(mtu, msg);
        // A first window must land byte for byte.
        p.stream(WINDOW as u64, send);
        assert!(p.dst.snapshot() == p.src.snapshot(), "{name}: data differs");
        g.throughput(Throughput::Bytes(msg as u64));
        g.bench_function(BenchmarkId::new(name, mtu.bytes()), |bn| {
            bn.iter_custom(|iters| p.stream(iters, send))
        });
    }
    g.throughput(Throughput::Elements(1));
    let mut p = Pair::new(Mtu::M4096, 64);
    p.ping_pong(0);
    let mut i = 1;
    g.bench_function("rc_send_8b_round_trip", |bn| {
        bn.iter(|| {
            p.ping_pong(i);
            i += 1;
        })
    });
    let c = p.b.engine.counters();
    assert_eq!(c.drop_bad_icrc + c.drop_malformed + c.duplicate_request, 0);
    g.finish();
}

criterion_group!(benches, bench_place, bench_pair);
criterion_main!(benches);
