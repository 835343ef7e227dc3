//! Packets held for the application's answer (the ACK of a SEND it just completed, see
//! `Stepper::step`) must still leave when the process exits without destroying its
//! QP or closing its device: the peer's SEND completes successfully.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::*;
use softhca::*;

const CHILD: &str = "SOFTHCA_EXIT_FLUSH_CHILD";
const PARENT_IP: &str = "127.0.0.231";
const CHILD_IP: &str = "127.0.0.232";
const PSN: u32 = 0x3000;

/// The child: receives one SEND by busy polling (no blocking wait, which would hand
/// the socket back to the datapath thread), then exits at once.
fn child() -> ! {
    let s = side(open(CHILD_IP), QpType::Rc, 4096);
    println!("{}", s.qp.qpn());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let peer: u32 = line.trim().parse().unwrap();
    let remote = RemoteQp {
        qpn: peer,
        psn: PSN,
        gid: Gid::from_ip(ip(PARENT_IP)),
    };
    s.qp.connect_rc(PSN, &remote, Mtu::M1024, 0).unwrap();
    s.qp.post_recv(recv_wr(1, s.mr.sge(0, 4096))).unwrap();
    println!("ready");
    let mut wc = [Completion::default(); 1];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while s.cq.poll(&mut wc) == 0 {
        assert!(std::time::Instant::now() < deadline, "no SEND arrived");
    }
    assert_eq!(wc[0].status, WcStatus::Success);
    // No drop of `s`: exit right after the completion, as some programs do.
    std::process::exit(0);
}

#[test]
fn exit_right_after_a_completion_still_acks() {
    if std::env::var_os(CHILD).is_some() {
        child();
    }
    let me = std::env::current_exe().unwrap();
    let mut c = Command::new(me)
        .args([
            "--exact",
            "exit_right_after_a_completion_still_acks",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut stdin = c.stdin.take().unwrap();
    // The test harness prints its own lines first: take the first number.
    let mut read_until = |want: &dyn Fn(&str) -> bool| -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
            if want(line.trim()) {
                return line.trim().to_string();
            }
        }
    };
    let child_qpn: u32 = read_until(&|l| l.parse::<u32>().is_ok()).parse().unwrap();

    let s = side(open(PARENT_IP), QpType::Rc, 4096);
    s.mr.write(0, &pattern(4096, 7)).unwrap();
    writeln!(stdin, "{}", s.qp.qpn()).unwrap();
    let remote = RemoteQp {
        qpn: child_qpn,
        psn: PSN,
        gid: Gid::from_ip(ip(CHILD_IP)),
    };
    s.qp.connect_rc(PSN, &remote, Mtu::M1024, 0).unwrap();
    read_until(&|l| l == "ready");
    s.qp.post_send(send_wr(9, WrOpcode::Send, s.mr.sge(0, 4096)))
        .unwrap();
    let wc = one(&s.cq);
    let status = c.wait().unwrap();
    assert!(status.success(), "child: {status}");
    assert_eq!(
        (wc.wr_id, wc.status),
        (9, WcStatus::Success),
        "the SEND's ACK was lost with the receiver's exit"
    );
}

/// UD sends posted right before `ibv_destroy_qp` still leave (rdma-core's `mckey`
/// sender posts its messages and destroys its QP at once): with rxe the post itself runs
/// the requester, so they are on the wire when the post returns.
#[test]
fn ud_sends_posted_right_before_destroy_still_leave() {
    const N: usize = 64;
    const LEN: usize = 512;
    let a = side(open("127.0.1.25"), QpType::Ud, N * LEN);
    let b = side(open("127.0.1.26"), QpType::Ud, N * (40 + LEN));
    let qkey = 0x0d0d_0001;
    a.qp.ready_ud(qkey, 0).unwrap();
    b.qp.ready_ud(qkey, 0).unwrap();
    for k in 0..N {
        let sge = b.mr.sge(k * (40 + LEN), (40 + LEN) as u32);
        b.qp.post_recv(recv_wr(k as u64, sge)).unwrap();
        a.mr.write(k * LEN, &pattern(LEN, k as u8)).unwrap();
    }
    let ah = ah_to(&a.pd, &b.ctx);
    // Datagrams arriving meanwhile keep the sender's datapath thread in its steps, so
    // posts find it busy and leave their work to it.
    let noise = side(b.ctx.clone(), QpType::Ud, LEN);
    noise.qp.ready_ud(qkey, 0).unwrap();
    let to_a = ah_to(&noise.pd, &a.ctx);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let Side { qp, mr, .. } = a;
    let a_qpn = qp.qpn();
    std::thread::scope(|t| {
        t.spawn(|| {
            let mut wc = [Completion::default(); 16];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut wr = send_wr(0, WrOpcode::Send, noise.mr.sge(0, LEN as u32));
                wr.ud = Some(to_a.ud_dest(a_qpn, qkey));
                let _ = noise.qp.post_send(wr);
                noise.cq.poll(&mut wc);
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        for k in 0..N {
            let mut wr = send_wr(k as u64, WrOpcode::Send, mr.sge(k * LEN, LEN as u32));
            wr.ud = Some(ah.ud_dest(b.qp.qpn(), qkey));
            qp.post_send(wr).unwrap();
        }
        drop(qp);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    for k in 0..N {
        let c = one(&b.cq);
        assert_eq!((c.wr_id, c.status), (k as u64, WcStatus::Success));
        let mut got = vec![0; LEN];
        b.mr.read(c.wr_id as usize * (40 + LEN) + 40, &mut got)
            .unwrap();
        assert_eq!(got, pattern(LEN, k as u8), "message {k}");
    }
}
