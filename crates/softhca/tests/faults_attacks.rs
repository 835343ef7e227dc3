//! Crafted attacks on a live device. The "attacker" is a plain UDP socket on 127.0.4.1:4791
//! — the address the victim's QP is connected to, so it also receives the victim's
//! ACKs/NAKs — sending packets built with softhca-wire (Headers + emit + seal). Each attack
//! must be refused with the right NAK or dropped, counted, and leave memory unchanged.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softhca::*;
use softhca_wire::{
    emit_packet, parse, seal, Aeth, AethKind, AtomicEth, Bth, Headers, IpPseudo, NakCode, Opcode,
    Psn, Qpn as WQpn, Reth, UdpPseudo,
};

const VICTIM: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 2);
const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 1);
const STRANGER: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 3);
const ATTACKER_QPN: u32 = 0x99;
/// The tests share the victim's and attacker's addresses: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
const START_PSN: u32 = 0x100;

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

struct Victim {
    ctx: Arc<Context>,
    pd: Pd,
    cq: Cq,
    rw: Mr,
    ro: Mr,
}

fn victim() -> Victim {
    let ctx = Context::open(&Config::loopback(IpAddr::V4(VICTIM))).expect("open victim");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(256, None).expect("cq");
    let rw = pd.reg_mr(4096, ALL).expect("rw mr");
    let ro = pd.reg_mr(4096, AccessFlags::REMOTE_READ).expect("ro mr");
    rw.fill(0xaa);
    ro.fill(0xbb);
    Victim {
        ctx,
        pd,
        cq,
        rw,
        ro,
    }
}

/// A fresh victim QP connected to the attacker (a remote access error moves an RC
/// responder QP to ERR, so each attack gets its own).
fn fresh_qp(v: &Victim) -> Qp {
    let qp = v.pd.create_qp(&QpInit::new(QpType::Rc, &v.cq)).expect("qp");
    let remote = RemoteQp {
        qpn: ATTACKER_QPN,
        psn: START_PSN,
        gid: Gid::from_ip(IpAddr::V4(ATTACKER)),
    };
    qp.connect_rc(0x500, &remote, Mtu::M1024, 0)
        .expect("connect");
    qp
}

struct Attacker {
    sock: UdpSocket,
    from: Ipv4Addr,
}

impl Attacker {
    fn new(from: Ipv4Addr) -> Attacker {
        let sock = UdpSocket::bind((from, 4791)).expect("bind attacker");
        sock.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        Attacker { sock, from }
    }

    fn send(&self, h: &Headers, payload: &[u8]) {
        let mut buf = vec![0u8; 8192];
        let len = emit_packet(h, payload, &mut buf).expect("emit");
        let pseudo = UdpPseudo {
            ip: IpPseudo::V4 {
                src: self.from,
                dst: VICTIM,
                id: 0,
                dont_fragment: true,
            },
            sport: 4791,
            dport: 4791,
        };
        let total = seal(&pseudo, &mut buf, len).expect("seal");
        self.sock
            .send_to(&buf[..total], SocketAddr::from((VICTIM, 4791)))
            .expect("send");
    }

    /// The next AETH the victim sends us, if any within 300 ms.
    fn response(&self) -> Option<(Opcode, u32, Aeth)> {
        let mut buf = [0u8; 9000];
        let deadline = Instant::now() + Duration::from_millis(300);
        while Instant::now() < deadline {
            let Ok(n) = self.sock.recv(&mut buf) else {
                return None;
            };
            if let Ok((h, _)) = parse(&buf[..n]) {
                if let Some(a) = h.aeth {
                    return Some((h.bth.opcode, h.bth.psn.value(), a));
                }
            }
        }
        None
    }
}

fn bth(op: Opcode, qp: &Qp, psn: u32) -> Bth {
    let mut b = Bth::new(op, WQpn::new(qp.qpn()), Psn::new(psn));
    b.ack_req = true;
    b
}

fn write(qp: &Qp, psn: u32, va: u64, rkey: u32, data: &[u8]) -> Headers {
    let mut h = Headers::new(bth(Opcode::RC_RDMA_WRITE_ONLY, qp, psn));
    h.reth = Some(Reth {
        va,
        rkey,
        dma_len: data.len() as u32,
    });
    h
}

fn counter(ctx: &Context, name: &str) -> u64 {
    ctx.counters()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

/// Waits (up to 2 s) until counter `name` reached `at_least`.
fn wait_counter(ctx: &Context, name: &str, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let v = counter(ctx, name);
        if v >= at_least || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn unchanged(v: &Victim) {
    assert!(v.rw.to_vec().iter().all(|&b| b == 0xaa), "rw MR changed");
    assert!(v.ro.to_vec().iter().all(|&b| b == 0xbb), "ro MR changed");
}

fn expect_nak(a: &Attacker, code: NakCode, psn: u32) {
    let (op, rpsn, aeth) = a.response().expect("a NAK");
    assert_eq!(op, Opcode::RC_ACKNOWLEDGE);
    assert_eq!(aeth.kind(), AethKind::Nak(code), "NAK code");
    assert_eq!(rpsn, psn, "NAK names the offending PSN");
}

#[test]
fn crafted_attacks_are_refused_counted_and_leave_memory_unchanged() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let v = victim();
    let a = Attacker::new(ATTACKER);
    let data = [0x11u8; 64];

    // Control: a legitimate WRITE from the attacker's address works (the harness is right).
    let qp = fresh_qp(&v);
    let tmp = v.pd.reg_mr(4096, ALL).expect("scratch mr");
    a.send(&write(&qp, START_PSN, tmp.addr(), tmp.rkey(), &data), &data);
    let (_, _, aeth) = a.response().expect("ACK");
    assert!(matches!(aeth.kind(), AethKind::Ack { .. }));
    let mut got = [0u8; 64];
    tmp.read(0, &mut got).expect("read");
    assert_eq!(got, data, "control WRITE landed");

    let naks = |c: &str| counter(&v.ctx, c);
    let base = naks("sent_remote_access_err_naks");

    // 1. Bad rkey.
    let qp = fresh_qp(&v);
    a.send(
        &write(&qp, START_PSN, v.rw.addr(), v.rw.rkey() ^ 0x5a5a00, &data),
        &data,
    );
    expect_nak(&a, NakCode::RemoteAccessError, START_PSN);
    // 2. iova + length overflows u64.
    let qp = fresh_qp(&v);
    a.send(
        &write(&qp, START_PSN, u64::MAX - 10, v.rw.rkey(), &data),
        &data,
    );
    expect_nak(&a, NakCode::RemoteAccessError, START_PSN);
    // 3. READ beyond the end of the MR.
    let qp = fresh_qp(&v);
    let mut h = Headers::new(bth(Opcode::RC_RDMA_READ_REQUEST, &qp, START_PSN));
    h.reth = Some(Reth {
        va: v.rw.addr() + 4000,
        rkey: v.rw.rkey(),
        dma_len: 200,
    });
    a.send(&h, &[]);
    expect_nak(&a, NakCode::RemoteAccessError, START_PSN);
    // 4. WRITE into a read-only MR.
    let qp = fresh_qp(&v);
    a.send(
        &write(&qp, START_PSN, v.ro.addr(), v.ro.rkey(), &data),
        &data,
    );
    expect_nak(&a, NakCode::RemoteAccessError, START_PSN);
    assert_eq!(
        wait_counter(&v.ctx, "sent_remote_access_err_naks", base + 4),
        base + 4,
        "four remote access NAKs counted"
    );
    unchanged(&v);

    // 5. Atomic on a misaligned address: refused (invalid request as rxe, or access).
    let qp = fresh_qp(&v);
    let mut h = Headers::new(bth(Opcode::RC_FETCH_ADD, &qp, START_PSN));
    h.atomic_eth = Some(AtomicEth {
        va: v.rw.addr() + 3,
        rkey: v.rw.rkey(),
        swap_add: 1,
        compare: 0,
    });
    let inv_before = naks("sent_invalid_request_naks") + naks("sent_remote_access_err_naks");
    a.send(&h, &[]);
    let (_, psn, aeth) = a.response().expect("NAK for the misaligned atomic");
    assert_eq!(psn, START_PSN);
    assert!(
        matches!(
            aeth.kind(),
            AethKind::Nak(NakCode::InvalidRequest | NakCode::RemoteAccessError)
        ),
        "{:?}",
        aeth.kind()
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        naks("sent_invalid_request_naks") + naks("sent_remote_access_err_naks"),
        inv_before + 1
    );
    unchanged(&v);

    // 6. PSN far outside the window: not executed; one sequence NAK for the expected PSN.
    let qp = fresh_qp(&v);
    let oos = naks("out_of_seq_request") + naks("duplicate_request");
    let far = START_PSN + 0x40_0000;
    a.send(&write(&qp, far, v.rw.addr(), v.rw.rkey(), &data), &data);
    if let Some((_, psn, aeth)) = a.response() {
        assert_eq!(aeth.kind(), AethKind::Nak(NakCode::PsnSequenceError));
        assert_eq!(psn, START_PSN, "the NAK asks for the expected PSN");
    }
    assert!(
        wait_counter(&v.ctx, "out_of_seq_request", 0) + naks("duplicate_request") > oos,
        "counted"
    );
    unchanged(&v);
    assert_eq!(qp.state().expect("state"), QpState::Rts, "QP survives");

    // 7. Forged ACK for PSNs the victim never sent: ignored, nothing completes.
    let mut h = Headers::new(bth(Opcode::RC_ACKNOWLEDGE, &qp, 0x500 + 1000));
    h.aeth = Some(Aeth::ack(5, 0x1f));
    a.send(&h, &[]);
    std::thread::sleep(Duration::from_millis(50));
    let mut wc = [Completion::default(); 4];
    assert_eq!(v.cq.poll(&mut wc), 0, "no completion from a forged ACK");
    assert_eq!(qp.state().expect("state"), QpState::Rts);
    // The QP still works for the real peer afterwards.
    a.send(
        &write(&qp, START_PSN, tmp.addr() + 100, tmp.rkey(), &data),
        &data,
    );
    let (_, psn, aeth) = a.response().expect("ACK after the forged one");
    assert!(matches!(aeth.kind(), AethKind::Ack { .. }), "{aeth:?}");
    assert_eq!(psn, START_PSN);

    // 8. A valid-looking WRITE from an address that is not the connected peer: dropped.
    let stranger = Attacker::new(STRANGER);
    let wrong = counter(&v.ctx, "drop_wrong_peer");
    stranger.send(
        &write(&qp, START_PSN + 1, v.rw.addr(), v.rw.rkey(), &data),
        &data,
    );
    assert_eq!(
        wait_counter(&v.ctx, "drop_wrong_peer", wrong + 1),
        wrong + 1
    );
    assert!(stranger.response().is_none(), "no answer to a stranger");
    unchanged(&v);

    // 9. A flood to unknown QPNs: all dropped and counted, memory and QP untouched.
    let unknown = counter(&v.ctx, "drop_unknown_qpn");
    const FLOOD: u64 = 5000;
    for i in 0..FLOOD {
        let mut h = write(&qp, START_PSN, v.rw.addr(), v.rw.rkey(), &data);
        h.bth.dest_qp = WQpn::new(0x00ab_0000 + (i as u32 & 0xffff));
        a.send(&h, &data);
    }
    let got = wait_counter(&v.ctx, "drop_unknown_qpn", unknown + FLOOD);
    // The socket buffer may drop some of a burst before we see them; most must arrive.
    assert!(
        got - unknown >= FLOOD / 2,
        "counted {} of {FLOOD}",
        got - unknown
    );
    unchanged(&v);
    assert_eq!(qp.state().expect("state"), QpState::Rts);
}

/// Samples the victim's gauges while `f` floods it; returns the largest value of each.
fn peak_gauges(ctx: &Context, f: impl FnOnce()) -> std::collections::HashMap<&'static str, u64> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut peak = std::collections::HashMap::new();
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak: std::collections::HashMap<&'static str, u64> = Default::default();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (k, v) in ctx.counters() {
                    if k.starts_with("gauge_") {
                        let e = peak.entry(k).or_insert(0);
                        *e = (*e).max(v);
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            peak
        });
        f();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        peak = sampler.join().expect("sampler");
    });
    peak
}

/// A flood of READ requests (far beyond max_dest_rd_atomic, never acknowledged) and of
/// early WRITEs (ahead of a gap that never fills) cannot grow the victim without bound:
/// the response queue, the replay cache and the early-request buffer stay at their caps,
/// the extra requests are counted, and memory is unchanged.
#[test]
fn floods_are_capped() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let v = victim();
    let a = Attacker::new(Ipv4Addr::new(127, 0, 4, 1));
    let reads = fresh_qp(&v);
    let early = fresh_qp(&v);
    let data = [0x22u8; 1024];
    // 256 KiB READs: each request asks the victim for 256 packets, so it cannot answer as
    // fast as the attacker asks, whatever the machine's speed (with 4 KiB READs a fast
    // responder kept up and the cap was never reached).
    const READ_LEN: u32 = 256 * 1024;
    let src =
        v.pd.reg_mr(READ_LEN as usize, AccessFlags::REMOTE_READ)
            .expect("read mr");
    let pkts = READ_LEN / 1024;
    let peak = peak_gauges(&v.ctx, || {
        for i in 0..20_000u32 {
            // READs at consecutive PSNs (256 PSNs each at MTU 1024).
            let psn = START_PSN + pkts * i;
            let mut h = Headers::new(bth(Opcode::RC_RDMA_READ_REQUEST, &reads, psn));
            h.reth = Some(Reth {
                va: src.addr(),
                rkey: src.rkey(),
                dma_len: READ_LEN,
            });
            a.send(&h, &[]);
            // WRITEs ahead of a PSN never sent: kept (up to the cap), never executed.
            let psn = START_PSN + 1 + (i % 900);
            a.send(&write(&early, psn, v.rw.addr(), v.rw.rkey(), &data), &data);
        }
    });
    let g = |k: &str| peak.get(k).copied().unwrap_or(0);
    eprintln!("peak gauges under the flood: {peak:?}");
    assert!(
        counter(&v.ctx, "drop_rd_atomic_overflow") > 0,
        "no READ was refused"
    );
    // max_dest_rd_atomic is 16 (connect_rc): at most 4 x 16 READ responses queued
    // (room for a go-back-N's re-executed duplicates) + one coalesced ACK/NAK.
    assert!(g("gauge_resp_queue_max") <= 65, "{peak:?}");
    assert!(g("gauge_rd_atomic_replay_max") <= 16, "{peak:?}");
    assert!(g("gauge_ooo_kept_max") > 0, "nothing was kept: {peak:?}");
    assert!(g("gauge_ooo_kept_max") <= 1024, "{peak:?}");
    // Two QPs, each keeping at most 1024 requests of at most 1 KiB (MTU 1024).
    assert!(g("gauge_ooo_bytes") <= 2 * 1024 * 1024, "{peak:?}");
    assert!(counter(&v.ctx, "out_of_seq_request") > 256);
    unchanged(&v);
}
