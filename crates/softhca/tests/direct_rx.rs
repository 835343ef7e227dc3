//! Direct receive (`Config::direct_rx`) over real loopback UDP: payload received from
//! the socket straight into registered memory arrives intact under injected loss, and
//! a receive buffer or WRITE target deregistered meanwhile is neither crashed on nor
//! written after. Addresses 127.0.65.x.

mod common;

use std::time::Duration;

use common::*;
use softhca::*;

/// A device on `addr` that receives directly and sends WRITEs as First/Middle/Last (the
/// form whose continuations are received directly), dropping `drop_ppm` of its packets.
fn direct_device(addr: &str, drop_ppm: u32) -> std::sync::Arc<Context> {
    let mut cfg = Config::loopback(ip(addr));
    cfg.direct_rx = true;
    cfg.split_writes = false;
    cfg.tx_drop_ppm = drop_ppm;
    // Packets at the path MTU: a message of many packets, most datagrams led by a
    // Middle (planned); 16 KiB packets are in the transport's jumbo tests.
    cfg.jumbo = 0;
    Context::open(&cfg).unwrap()
}

#[test]
fn writes_received_directly_arrive_intact_under_loss() {
    one_sided_received_directly(WrOpcode::RdmaWrite, ["127.0.65.1", "127.0.65.2"]);
}

/// 8 MiB of 64 KiB WRITEs or READs between devices on `addrs`, the one sending the data
/// dropping 0.3 % of its packets: the data arrives intact, mostly received directly.
fn one_sided_received_directly(op: WrOpcode, addrs: [&str; 2]) {
    const LEN: usize = 8 << 20;
    const MSG: usize = 64 << 10;
    let write = op == WrOpcode::RdmaWrite;
    let drops = |sends_data: bool| if sends_data { 3_000 } else { 0 };
    let sa = side(direct_device(addrs[0], drops(write)), QpType::Rc, LEN);
    let sb = side(direct_device(addrs[1], drops(!write)), QpType::Rc, LEN);
    connect(&sa, &sb);
    let data = pattern(LEN, 0x5d);
    let (from, to) = if write { (&sa, &sb) } else { (&sb, &sa) };
    from.mr.write(0, &data).unwrap();
    for (i, off) in (0..LEN).step_by(MSG).enumerate() {
        let mut wr = send_wr(i as u64, op, sa.mr.sge(off, MSG as u32));
        wr.remote_addr = sb.mr.addr() + off as u64;
        wr.rkey = sb.mr.rkey();
        wr.flags = if off + MSG == LEN {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        sa.qp.post_send(wr).unwrap();
    }
    let mut wc = [Completion::default(); 1];
    assert_eq!(sa.cq.wait(&mut wc, Duration::from_secs(60)).unwrap(), 1);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert!(to.mr.to_vec() == data, "8 MiB of {op:?}s arrived intact");
    let direct = counter(&to.ctx, "rx_direct");
    // A loss sends the rest of the window the out-of-order way (kept, then copied).
    assert!(direct > 100, "received directly: {direct} packets");
    assert!(counter(&from.ctx, "io_tx_injected_drops") > 0);
}

#[test]
fn sends_received_directly_arrive_intact_under_loss() {
    const MSG: usize = 60_000;
    const N: usize = 96;
    let sa = side(direct_device("127.0.65.3", 3_000), QpType::Rc, MSG * N);
    let sb = side(direct_device("127.0.65.4", 0), QpType::Rc, MSG * N);
    connect(&sa, &sb);
    let data = pattern(MSG * N, 0x2b);
    sa.mr.write(0, &data).unwrap();
    for i in 0..N {
        let wr = recv_wr(i as u64, sb.mr.sge(i * MSG, MSG as u32));
        sb.qp.post_recv(wr).unwrap();
    }
    // A few messages first, received in full: bulk datagrams arm direct receive, so
    // that the rest is received directly however much of it the sender had queued
    // before the receiver's first look (on a loaded machine, all of it).
    let mut got = 0;
    let mut wc = [Completion::default(); 16];
    for (from, to) in [(0, 6), (6, N)] {
        for i in from..to {
            let wr = send_wr(i as u64, WrOpcode::Send, sa.mr.sge(i * MSG, MSG as u32));
            sa.qp.post_send(wr).unwrap();
        }
        while got < to {
            let n = sb.cq.wait(&mut wc, Duration::from_secs(60)).unwrap();
            assert!(n > 0, "receives stopped after {got}");
            for c in &wc[..n] {
                assert_eq!((c.status, c.byte_len), (WcStatus::Success, MSG as u32));
            }
            got += n;
        }
    }
    assert!(sb.mr.to_vec() == data, "SENDs arrived intact");
    let direct = counter(&sb.ctx, "rx_direct");
    // A loss sends the rest of the window the out-of-order way (kept, then copied).
    assert!(direct > 100, "received directly: {direct} packets");
    assert!(counter(&sa.ctx, "io_tx_injected_drops") > 0);
}

#[test]
fn reads_received_directly_arrive_intact_under_loss() {
    // The responder drops some of its READ responses: the READ is asked for again from
    // the lost one, and what the lost one's successors left is rewritten.
    one_sided_received_directly(WrOpcode::RdmaRead, ["127.0.65.7", "127.0.65.8"]);
}

/// The WRITE target is deregistered (and freed) while WRITEs into it stream in: the receiver plans
/// only under the engine lock that deregistration takes, so the process neither
/// crashes nor writes freed memory, and the requester sees its WRITE fail or complete.
#[test]
fn deregistering_a_direct_target_mid_stream_is_safe() {
    const LEN: usize = 32 << 20;
    let sa = side(direct_device("127.0.65.5", 0), QpType::Rc, LEN);
    let sb = side(direct_device("127.0.65.6", 0), QpType::Rc, 4096);
    connect(&sa, &sb);
    let dst = sb.pd.reg_mr(LEN, ALL_ACCESS).unwrap();
    let mut wr = send_wr(1, WrOpcode::RdmaWrite, sa.mr.sge(0, LEN as u32));
    wr.remote_addr = dst.addr();
    wr.rkey = dst.rkey();
    sa.qp.post_send(wr).unwrap();
    std::thread::sleep(Duration::from_millis(3));
    drop(dst);
    let mut wc = [Completion::default(); 1];
    assert_eq!(sa.cq.wait(&mut wc, Duration::from_secs(60)).unwrap(), 1);
    assert!(
        matches!(
            wc[0].status,
            WcStatus::Success | WcStatus::RemAccessErr | WcStatus::RetryExcErr
        ),
        "{:?}",
        wc[0].status
    );
}

/// A camera's stream: each frame one UC WRITE, then a WRITE with immediate of no
/// payload that announces it. The short datagram between two frames does not stop
/// direct receive: the frames' continuations land straight in memory, each frame
/// intact and announced once.
#[test]
fn frames_announced_by_an_empty_write_stay_received_directly() {
    const FRAME: usize = 1 << 20;
    const FRAMES: usize = 16;
    let sa = side(direct_device("127.0.65.9", 0), QpType::Uc, FRAME * FRAMES);
    let sb = side(direct_device("127.0.65.10", 0), QpType::Uc, FRAME * FRAMES);
    connect(&sa, &sb);
    let data = pattern(FRAME * FRAMES, 0x71);
    sa.mr.write(0, &data).unwrap();
    for f in 0..FRAMES {
        sb.qp.post_recv(recv_wr(f as u64, sb.mr.sge(0, 0))).unwrap();
    }
    for f in 0..FRAMES {
        let off = f * FRAME;
        let mut wr = send_wr(f as u64, WrOpcode::RdmaWrite, sa.mr.sge(off, FRAME as u32));
        wr.remote_addr = sb.mr.addr() + off as u64;
        wr.rkey = sb.mr.rkey();
        wr.flags = SendFlags::empty();
        sa.qp.post_send(wr).unwrap();
        let mut imm = send_wr(f as u64, WrOpcode::RdmaWriteWithImm, sa.mr.sge(off, 0));
        imm.payload = Payload::Sges(Default::default());
        imm.remote_addr = sb.mr.addr() + off as u64;
        imm.rkey = sb.mr.rkey();
        imm.imm_data = f as u32;
        sa.qp.post_send(imm).unwrap();
    }
    let mut wc = [Completion::default(); 4];
    let mut announced = Vec::new();
    while announced.len() < FRAMES {
        let n = sb.cq.wait(&mut wc, Duration::from_secs(20)).unwrap();
        assert!(n > 0, "frames announced: {announced:?}");
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success);
            announced.push(c.imm_data as usize);
        }
    }
    assert_eq!(announced, (0..FRAMES).collect::<Vec<_>>());
    assert!(sb.mr.to_vec() == data, "every frame intact");
    // Each frame's first datagram (its First) and its Last are fed from buffers.
    let (direct, all) = (counter(&sb.ctx, "rx_direct"), counter(&sb.ctx, "rcvd_pkts"));
    assert!(
        4 * direct >= 3 * all,
        "received directly: {direct} of {all} packets"
    );
    // Within a frame the next datagram is guessed, not peeked at; each frame's end,
    // shorter than guessed, is put together from the pieces (the data check above).
    let guessed = counter(&sb.ctx, "dp_rx_direct_guessed");
    let missed = counter(&sb.ctx, "dp_rx_direct_guess_missed");
    assert!(guessed > missed, "guessed {guessed}, missed {missed}");
}
