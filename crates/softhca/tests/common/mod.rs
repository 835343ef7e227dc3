//! Helpers shared by the integration tests: two devices on distinct loopback addresses.
#![allow(dead_code)]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use softhca::*;

/// One side of a connection.
pub struct Side {
    pub ctx: Arc<Context>,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub mr: Mr,
}

pub const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn open(addr: &str) -> Arc<Context> {
    let mut cfg = Config::loopback(ip(addr));
    cfg.poll = Config::from_env().unwrap().poll;
    Context::open(&cfg).unwrap_or_else(|e| panic!("open {addr}: {e}"))
}

/// [`open`], with packets of at most 4096 bytes to a softhca peer too (`Config::jumbo`
/// 0): for tests of how 4 KiB packets are batched.
#[allow(dead_code)]
pub fn open_4k(addr: &str) -> Arc<Context> {
    let mut cfg = Config::loopback(ip(addr));
    cfg.poll = Config::from_env().unwrap().poll;
    cfg.jumbo = 0;
    Context::open(&cfg).unwrap_or_else(|e| panic!("open {addr}: {e}"))
}

pub fn side(ctx: Arc<Context>, qp_type: QpType, mr_len: usize) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(qp_type, &cq)).unwrap();
    let mr = pd.reg_mr(mr_len, ALL_ACCESS).unwrap();
    Side {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

/// Two RC (or UC) QPs connected to each other, on devices serving `a` and `b`.
pub fn rc_pair(a: &str, b: &str, mr_len: usize) -> (Side, Side) {
    let sa = side(open(a), QpType::Rc, mr_len);
    let sb = side(open(b), QpType::Rc, mr_len);
    connect(&sa, &sb);
    (sa, sb)
}

pub fn connect(sa: &Side, sb: &Side) {
    connect_gids(sa, 0, sb, 0);
}

/// [`connect`] with each side on the GID of the given index.
pub fn connect_gids(sa: &Side, ga: u8, sb: &Side, gb: u8) {
    let (pa, pb) = (0x1000, 0x2000);
    let ra = RemoteQp {
        qpn: sa.qp.qpn(),
        psn: pa,
        gid: sa.ctx.gids()[usize::from(ga)],
    };
    let rb = RemoteQp {
        qpn: sb.qp.qpn(),
        psn: pb,
        gid: sb.ctx.gids()[usize::from(gb)],
    };
    let mtu = sa.ctx.active_mtu().min(sb.ctx.active_mtu());
    sa.qp.connect_rc(pa, &rb, mtu, ga).unwrap();
    sb.qp.connect_rc(pb, &ra, mtu, gb).unwrap();
}

/// A device counter by name (0 when absent).
pub fn counter(ctx: &Context, name: &str) -> u64 {
    ctx.counters()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

/// Waits for exactly one completion (panics after 5 s).
pub fn one(cq: &Cq) -> Completion {
    let mut wc = [Completion::default(); 1];
    let n = cq.wait(&mut wc, Duration::from_secs(5)).unwrap();
    assert_eq!(n, 1, "no completion within 5 s");
    wc[0]
}

pub fn recv_wr(wr_id: u64, sge: Sge) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: smallvec![sge],
    }
}

pub fn send_wr(wr_id: u64, opcode: WrOpcode, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        flags: SendFlags::SIGNALED,
        payload: Payload::Sges(smallvec![sge]),
        ..SendWr::default()
    }
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(13) as u8 ^ seed)
        .collect()
}

/// One burst: `b` posts a receive per message into slot i (`slot` bytes apart), `a`
/// polls once (its polling window opens) and posts SENDs of `lens[i]` bytes from its
/// slot i, one per call, filled with the pattern seeded `seed + i`; then both sides'
/// completions are awaited (5 s) and every byte received is checked.
pub fn send_burst(a: &Side, b: &Side, lens: &[usize], slot: usize, seed: u64) {
    use std::time::Instant;
    let seed_of = |i: u64| (seed + i) as u8;
    for (i, &len) in lens.iter().enumerate() {
        let off = i * slot;
        b.qp.post_recv(recv_wr(i as u64, b.mr.sge(off, slot as u32)))
            .unwrap();
        a.mr.write(off, &pattern(len, seed_of(i as u64))).unwrap();
    }
    let mut wc = [Completion::default(); 16];
    assert_eq!(a.cq.poll(&mut wc), 0);
    for (i, &len) in lens.iter().enumerate() {
        let sge = a.mr.sge(i * slot, len as u32);
        a.qp.post_send(send_wr(i as u64, WrOpcode::Send, sge))
            .unwrap();
    }
    let (mut sent, mut received) = (0, 0);
    let t = Instant::now();
    while sent < lens.len() || received < lens.len() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "burst {seed}: {sent} sends and {received} receives completed"
        );
        let n = a.cq.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Send));
            sent += 1;
        }
        let n = b.cq.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success);
            let len = lens[c.wr_id as usize];
            assert_eq!(c.byte_len as usize, len);
            let mut got = vec![0u8; len];
            b.mr.read(c.wr_id as usize * slot, &mut got).unwrap();
            assert!(
                got == pattern(len, seed_of(c.wr_id)),
                "burst {seed}, message {}",
                c.wr_id
            );
            received += 1;
        }
    }
}

/// An address handle on `pd` towards the first GID of the device `to` (source GID 0).
pub fn ah_to(pd: &Pd, to: &Context) -> Ah {
    pd.create_ah(AddressVector {
        dgid: to.gids()[0],
        sgid_index: 0,
        ..AddressVector::default()
    })
    .unwrap()
}
