//! Data and management networks apart: two network namespaces joined by two veth pairs,
//! a data network and a management network, where each side's routing table sends the
//! peer's data address over the management network (a host route, as a default route
//! through the management interface does in a pod). A device given the data interface
//! (`SOFTHCA_NETDEV`, [`Config::netdev`]) must move its RDMA traffic over the data
//! interface all the same, like rxe, which routes with its netdev as output interface:
//! the management interfaces' statistics (`/sys/class/net/*/statistics`) do not move
//! while 4 MiB of verified RDMA WRITEs cross. The same transfer with devices given only
//! the data addresses (`SOFTHCA_ADDR`) follows the routing table over the management
//! network, which shows the test would see a leak. Needs root and iproute2; skipped
//! with a message otherwise.

use std::net::IpAddr;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use softhca::*;

const MSG: usize = 64 * 1024;
const COUNT: usize = 64;
const TOTAL: usize = MSG * COUNT;

fn ip(args: &[&str]) -> bool {
    softhca_testbed::ip(args).is_ok()
}

/// Two namespaces, each with a data and a management veth end; removed on drop.
struct Net {
    ns: [String; 2],
    data: [String; 2],
    mgmt: [String; 2],
}

const DATA_IP: [&str; 2] = ["10.58.2.1", "10.58.2.2"];
const MGMT_IP: [&str; 2] = ["10.58.1.1", "10.58.1.2"];

impl Net {
    fn new() -> Option<Net> {
        if let Err(e) = softhca_testbed::check_available() {
            eprintln!("skipped: {e}");
            return None;
        }
        let id = std::process::id() % 10_000;
        let end = |kind: &str| [format!("shag{kind}{id}a"), format!("shag{kind}{id}b")];
        let net = Net {
            ns: end("n"),
            data: end("d"),
            mgmt: end("m"),
        };
        if !net.build() {
            eprintln!("skipped: could not create network namespaces and veth pairs");
            return None;
        }
        Some(net)
    }

    fn build(&self) -> bool {
        let quiet = [
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ];
        for ns in &self.ns {
            // No IPv6 (router and neighbour solicitations would move the counters) and
            // no reverse-path filter (the peer's data address is routed the other way).
            let ok = ip(&["netns", "add", ns])
                && Command::new("ip")
                    .args(["netns", "exec", ns, "sysctl", "-qw"])
                    .args(quiet)
                    .status()
                    .is_ok_and(|s| s.success())
                && ip(&["-n", ns, "link", "set", "lo", "up"]);
            if !ok {
                return false;
            }
        }
        for (pair, addrs) in [(&self.data, DATA_IP), (&self.mgmt, MGMT_IP)] {
            let ok = ip(&[
                "link", "add", &pair[0], "type", "veth", "peer", "name", &pair[1],
            ]);
            if !ok {
                return false;
            }
            for s in 0..2 {
                let cidr = format!("{}/24", addrs[s]);
                let ok = ip(&["link", "set", &pair[s], "netns", &self.ns[s]])
                    && ip(&["-n", &self.ns[s], "addr", "add", &cidr, "dev", &pair[s]])
                    && ip(&["-n", &self.ns[s], "link", "set", &pair[s], "up"]);
                if !ok {
                    return false;
                }
            }
        }
        // Each side reaches the other's data address through the management network.
        (0..2).all(|s| {
            let peer_data = format!("{}/32", DATA_IP[1 - s]);
            ip(&[
                "-n",
                &self.ns[s],
                "route",
                "add",
                &peer_data,
                "via",
                MGMT_IP[1 - s],
                "dev",
                &self.mgmt[s],
            ])
        })
    }

    /// `/sys/class/net/<dev>/statistics/<name>` as seen inside namespace `s`.
    fn stat(&self, s: usize, dev: &str, name: &str) -> u64 {
        let path = format!("/sys/class/net/{dev}/statistics/{name}");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns[s], "cat", &path])
            .output()
            .expect("run ip netns exec cat");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("read {path} in {}", self.ns[s]))
    }

    /// tx and rx bytes of the data and management interfaces of both sides.
    fn bytes(&self) -> Bytes {
        let both = |devs: &[String; 2]| {
            [0, 1].map(|s| {
                [
                    self.stat(s, &devs[s], "tx_bytes"),
                    self.stat(s, &devs[s], "rx_bytes"),
                ]
            })
        };
        Bytes {
            data: both(&self.data),
            mgmt: both(&self.mgmt),
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends inside it, and with them the pairs.
        for ns in &self.ns {
            ip(&["netns", "del", ns]);
        }
    }
}

/// `[side][tx, rx]` bytes.
#[derive(Debug, Clone, Copy)]
struct Bytes {
    data: [[u64; 2]; 2],
    mgmt: [[u64; 2]; 2],
}

impl Bytes {
    fn since(&self, before: &Bytes) -> Bytes {
        let d = |a: [[u64; 2]; 2], b: [[u64; 2]; 2]| {
            [0, 1].map(|s| [0, 1].map(|k| a[s][k].saturating_sub(b[s][k])))
        };
        Bytes {
            data: d(self.data, before.data),
            mgmt: d(self.mgmt, before.mgmt),
        }
    }
}

/// What one side tells the other to connect and write.
#[derive(Debug, Clone, Copy)]
struct Hello {
    qp: RemoteQp,
    addr: u64,
    rkey: u32,
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(11) as u8)
        .collect()
}

/// One side: opens its device with `cfg`, swaps [`Hello`]s, then side 0 writes
/// [`TOTAL`] bytes into side 1, which checks them once side 0 says it is done.
fn side(
    s: usize,
    cfg: Config,
    tx: mpsc::Sender<Hello>,
    rx: mpsc::Receiver<Hello>,
    done: (mpsc::Sender<()>, mpsc::Receiver<()>),
) {
    let ctx = Context::open(&cfg).unwrap_or_else(|e| panic!("open side {s}: {e}"));
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.reg_mr(TOTAL, access).unwrap();
    let psn = 0x100 * (s as u32 + 1);
    let me = RemoteQp {
        qpn: qp.qpn(),
        psn,
        gid: ctx.gids()[0],
    };
    tx.send(Hello {
        qp: me,
        addr: mr.addr(),
        rkey: mr.rkey(),
    })
    .unwrap();
    let peer = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("peer hello");
    qp.connect_rc(psn, &peer.qp, ctx.active_mtu(), 0).unwrap();
    if s == 0 {
        mr.write(0, &pattern(TOTAL)).unwrap();
        for i in 0..COUNT {
            let off = i * MSG;
            let wr = SendWr {
                wr_id: i as u64,
                opcode: WrOpcode::RdmaWrite,
                flags: SendFlags::SIGNALED,
                payload: Payload::Sges(smallvec![mr.sge(off, MSG as u32)]),
                remote_addr: peer.addr + off as u64,
                rkey: peer.rkey,
                ..SendWr::default()
            };
            qp.post_send(wr).unwrap();
            let mut wc = [Completion::default(); 1];
            let n = cq.wait(&mut wc, Duration::from_secs(10)).unwrap();
            assert_eq!(n, 1, "WRITE {i}: no completion within 10 s");
            assert_eq!(wc[0].status, WcStatus::Success, "WRITE {i}");
        }
        done.0.send(()).unwrap();
    } else {
        done.1
            .recv_timeout(Duration::from_secs(60))
            .expect("writer done");
        let mut got = vec![0u8; TOTAL];
        mr.read(0, &mut got).unwrap();
        assert!(got == pattern(TOTAL), "the WRITEs placed the bytes");
    }
}

/// The transfer between the two namespaces, with devices built by `cfg(side)`; returns
/// the interface byte counts it moved.
fn transfer(net: &Net, cfg: impl Fn(usize) -> Config) -> Bytes {
    let before = net.bytes();
    let (h0, r1) = mpsc::channel();
    let (h1, r0) = mpsc::channel();
    let (d0, d1) = (mpsc::channel(), mpsc::channel());
    let a = {
        let c = cfg(0);
        softhca_testbed::spawn_in_netns(&net.ns[0], move || side(0, c, h0, r0, (d0.0, d1.1)))
    };
    let b = {
        let c = cfg(1);
        softhca_testbed::spawn_in_netns(&net.ns[1], move || side(1, c, h1, r1, (d1.0, d0.1)))
    };
    a.join().expect("side 0");
    b.join().expect("side 1");
    net.bytes().since(&before)
}

fn base_config() -> Config {
    Config {
        // The threads' namespaces are not the mount namespace's: sysfs here shows the
        // host's interfaces, so the veths' MTU (1500 → 1024) is given, not read.
        mtu: Mtu::M1024,
        poll: PollMode::Blocking,
        ..Config::default()
    }
}

#[test]
fn netdev_device_sends_nothing_on_the_management_network() {
    let Some(net) = Net::new() else { return };
    let data = net.data.clone();
    let bound = transfer(&net, |s| Config {
        netdev: Some(data[s].clone()),
        ..base_config()
    });
    println!(
        "bound to the data interface: data [tx, rx] {:?}, management {:?} ({TOTAL} bytes written)",
        bound.data, bound.mgmt
    );
    assert_eq!(
        bound.mgmt,
        [[0, 0], [0, 0]],
        "RDMA bytes on the management network"
    );
    assert!(bound.data[0][0] >= TOTAL as u64, "{:?}", bound.data);
    assert!(bound.data[1][1] >= TOTAL as u64, "{:?}", bound.data);

    // Bound to the address only, the routing table's choice wins: the test sees a leak.
    let by_addr = transfer(&net, |s| Config {
        addrs: vec![DATA_IP[s].parse::<IpAddr>().unwrap()],
        ..base_config()
    });
    println!(
        "bound to the data address only: data {:?}, management {:?}",
        by_addr.data, by_addr.mgmt
    );
    assert!(by_addr.mgmt[0][0] >= TOTAL as u64, "{:?}", by_addr.mgmt);
}
