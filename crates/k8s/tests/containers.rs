//! Each `Allocate` answer becomes a real container, as a kubelet's CRI call would make
//! it: the envs become `-e`, the mounts `-v …:ro`, on an image built locally with
//! debootstrap and `podman import` (no registry), run by podman with runc. Two such
//! containers run unmodified `ib_send_bw` and `ib_write_bw` against each other; a
//! container without an allocation sees no RDMA device; `SOFTHCA_CPU=auto` stays in a
//! container's cpuset.
//!
//! Like a pod, each container joins the network namespace of a sandbox container
//! started first (the kubelet's pause container), on an internal podman network.
//! Only the kubelet's bookkeeping is played by the test.
//!
//! Two pods on a management (`eth0`) and a data network (`net1`), whose routing tables
//! send the peer's data address over management: `ib_write_bw` between containers
//! allocated the data interface moves its payload over `net1` and none of it over
//! `eth0` (`/sys/class/net/*/statistics` before and after).
//!
//! Opt-in (slow, root): `SOFTHCA_K8S_CONTAINERS=1`, with podman, runc and debootstrap
//! installed and the drop-in libraries and the `softhca` binary built in the same
//! target directory (`cargo build --release`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{first_list, plugin_client, plugin_cmd, start_kubelet, temp_dir, PluginProc};
use softhca_k8s::api::{self, ContainerAllocateResponse};

const IMAGE: &str = "localhost/softhca-edge-test:1";
const NETWORK: &str = "shedk8s";
const SUBNET: &str = "10.89.40.0/24";
/// The CDI kind, and the directory podman reads specs from (removed afterwards).
const CDI_KIND: &str = "softhca.io/rdma";
const CDI_DIR: &str = "/var/run/cdi";
const SERVER_IP: &str = "10.89.40.20";
const CLIENT_IP: &str = "10.89.40.21";

/// The tests share the CPUs, the CDI spec file and podman: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every container: runc (crun refuses hybrid cgroups), and rlimits below the hard
/// limits (no CAP_SYS_RESOURCE to raise them).
const BASE: [&str; 7] = [
    "--rm",
    "--runtime",
    "runc",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1000:1000",
];

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .expect("run podman")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn skip_reason() -> Option<String> {
    if std::env::var_os("SOFTHCA_K8S_CONTAINERS").is_none() {
        return Some("opt-in: set SOFTHCA_K8S_CONTAINERS=1".into());
    }
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root".into());
    }
    for tool in ["podman", "runc", "debootstrap"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map_or(true, |o| !o.status.success())
        {
            return Some(format!(
                "needs {tool} (apt-get install podman runc debootstrap)"
            ));
        }
    }
    None
}

/// The image: Debian bookworm minbase with Debian's unmodified ibverbs-utils and
/// perftest, built once and kept.
fn ensure_image() {
    if podman(&["image", "exists", IMAGE]).status.success() {
        return;
    }
    let root = temp_dir("rootfs").join("rootfs");
    let ok = Command::new("debootstrap")
        .args([
            "--variant=minbase",
            "--include=ibverbs-utils,perftest",
            "bookworm",
        ])
        .arg(&root)
        .arg("http://deb.debian.org/debian")
        .status()
        .unwrap();
    assert!(ok.success(), "debootstrap failed");
    let import = format!("tar -C {} -c . | podman import - {IMAGE}", root.display());
    assert!(Command::new("sh")
        .args(["-c", &import])
        .status()
        .unwrap()
        .success());
    let _ = std::fs::remove_dir_all(root.parent().unwrap());
}

/// The drop-in libraries and the CLI from this build.
fn build_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_softhca-k8s"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn lib_dir(dir: &Path) -> PathBuf {
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    for so in ["libibverbs.so", "librdmacm.so"] {
        // `cargo build` puts the cdylib in target/<profile>/, `cargo test` (a
        // dev-dependency) only in its deps/.
        let src = [build_dir(), build_dir().join("deps")]
            .into_iter()
            .map(|d| d.join(so))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{so} not built under {}", build_dir().display()));
        std::fs::copy(&src, lib.join(format!("{so}.1"))).unwrap();
    }
    lib
}

/// An internal podman network (no way out of the host), created once and kept.
fn ensure_network(name: &str, subnet: &str) {
    if !podman(&["network", "exists", name]).status.success() {
        let o = podman(&["network", "create", "--internal", "--subnet", subnet, name]);
        assert!(o.status.success(), "{}", text(&o));
    }
}

/// The host bridge of a podman network (what the plugin's `--netdev` names).
fn bridge_of(network: &str) -> String {
    let o = podman(&[
        "network",
        "inspect",
        network,
        "--format",
        "{{.NetworkInterface}}",
    ]);
    text(&o).trim().to_string()
}

/// A pod sandbox on the test networks (`--network` values, `name:ip=…`): its netns is
/// what the app containers join.
fn sandbox(name: &str, networks: &[&str]) {
    let _ = podman(&["rm", "-f", "-t", "0", name]);
    let nets: Vec<String> = networks.iter().map(|n| format!("--network={n}")).collect();
    let nets: Vec<&str> = nets.iter().map(String::as_str).collect();
    let o = podman(
        &[
            &["run", "-d", "--name", name, "--runtime", "runc"][..],
            &nets[..],
            &[
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1000:1000",
                IMAGE,
                "sleep",
                "900",
            ][..],
        ]
        .concat(),
    );
    assert!(o.status.success(), "sandbox {name}: {}", text(&o));
}

/// `podman run` arguments for an allocation, as CRI turns a ContainerAllocateResponse
/// into a container: envs, mounts (read-only), devices; `--cpuset-cpus` plays the CPU
/// Manager's exclusive CPUs.
fn run_args(resp: &ContainerAllocateResponse, sandbox: &str, cpus: &str) -> Vec<String> {
    let mut a: Vec<String> = BASE.map(String::from).to_vec();
    a.push(format!("--network=container:{sandbox}"));
    a.push(format!("--cpuset-cpus={cpus}"));
    for (k, v) in &resp.envs {
        a.push(format!("--env={k}={v}"));
    }
    for m in &resp.mounts {
        let ro = if m.read_only { ":ro" } else { "" };
        a.push(format!("--volume={}:{}{ro}", m.host_path, m.container_path));
    }
    for d in &resp.devices {
        a.push(format!(
            "--device={}:{}:{}",
            d.host_path, d.container_path, d.permissions
        ));
    }
    a
}

/// The `#bytes #iterations BW peak BW average MsgRate` line of a perftest report.
fn bw_line(out: &str) -> Option<Vec<f64>> {
    out.lines()
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .find(|v| v.len() == 5 && v[0] == 65536.0)
}

/// Server container (detached, named `{prefix}-{tool}-srv`) and client container
/// running `tool` for `iters` messages of 64 KiB, the client reaching the server at
/// `server_ip`; returns both outputs.
fn perftest(
    tool: &str,
    (srv, cli): (&[String], &[String]),
    prefix: &str,
    server_ip: &str,
    iters: u32,
) -> (String, String) {
    let name = format!("{prefix}-{tool}-srv");
    let _ = podman(&["rm", "-f", "-t", "0", &name]);
    let iters = iters.to_string();
    let args = [
        tool,
        "-F",
        "--report_gbits",
        "-x",
        "0",
        "-s",
        "65536",
        "-n",
        &iters,
    ];
    let mut s: Vec<String> = vec!["run".into(), "-d".into(), format!("--name={name}")];
    s.extend(srv.iter().filter(|a| *a != "--rm").cloned());
    s.push(IMAGE.into());
    s.extend(args.map(String::from));
    let o = Command::new("podman").args(&s).output().unwrap();
    assert!(o.status.success(), "server: {}", text(&o));
    let mut client = String::new();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_secs(1));
        let mut c: Vec<String> = vec!["run".into()];
        c.extend(cli.iter().cloned());
        c.push(IMAGE.into());
        c.extend(args.map(String::from));
        c.push(server_ip.into());
        let o = Command::new("podman").args(&c).output().unwrap();
        client = text(&o);
        if o.status.success() {
            break;
        }
    }
    let _ = podman(&["wait", &name]);
    let server = text(&podman(&["logs", &name]));
    let _ = podman(&["rm", "-f", "-t", "0", &name]);
    (server, client)
}

/// The plugin advertising host interface `bridge` as `container_netdev`, and its
/// answer to an Allocate of two devices, one per container.
async fn allocate_two(
    dir: &Path,
    bridge: &str,
    container_netdev: &str,
) -> (PluginProc, Vec<ContainerAllocateResponse>) {
    let mut kubelet = start_kubelet(dir);
    let netdev = format!("{bridge}:{container_netdev}");
    // plugin_cmd hands out `<dir>/lib`.
    lib_dir(dir);
    let args = [
        "--netdev",
        &netdev,
        "--devices-per-netdev",
        "4",
        "--cdi-kind",
        CDI_KIND,
        "--cdi-spec-dir",
        CDI_DIR,
    ];
    let mut cmd = plugin_cmd(dir, &args);
    let p = PluginProc(cmd.spawn().unwrap());
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut c = plugin_client(dir, &reg.endpoint).await;
    let (devs, _) = first_list(&mut c).await;
    assert_eq!(devs.len(), 4);
    assert!(devs.iter().all(|d| d.health == "Healthy"), "{devs:?}");
    let container_requests = ["0", "1"]
        .iter()
        .map(|n| api::ContainerAllocateRequest {
            devices_ids: vec![format!("{bridge}-{n}")],
        })
        .collect();
    let resp = c
        .allocate(api::AllocateRequest { container_requests })
        .await
        .unwrap()
        .into_inner();
    kubelet.stop();
    (p, resp.container_responses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perftest_between_allocated_containers() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _serial = SERIAL.lock().await;
    ensure_image();
    ensure_network(NETWORK, SUBNET);
    let (srv_sbx, cli_sbx) = ("shedk8s-sbx-srv", "shedk8s-sbx-cli");
    sandbox(srv_sbx, &[&format!("{NETWORK}:ip={SERVER_IP}")]);
    sandbox(cli_sbx, &[&format!("{NETWORK}:ip={CLIENT_IP}")]);
    let dir = temp_dir("containers");
    let (_plugin, resps) = allocate_two(&dir, &bridge_of(NETWORK), "eth0").await;
    let last_cpu = allowed_cpus().last().copied().unwrap_or(0).to_string();
    let srv = run_args(&resps[0], srv_sbx, "0");
    let cli = run_args(&resps[1], cli_sbx, &last_cpu);

    check_device_seen(&srv, &resps[0], srv_sbx);

    // SOFTHCA_CPU=auto inside a one-CPU cpuset: the softhca CLI, mounted read-only.
    let cli_bin = format!(
        "--volume={}:/usr/local/bin/softhca:ro",
        build_dir().join("softhca").display()
    );
    let o = Command::new("podman")
        .arg("run")
        .args(&cli)
        .arg(&cli_bin)
        .args([IMAGE, "softhca", "devinfo", "-v"])
        .output()
        .unwrap();
    let line = text(&o)
        .lines()
        .find(|l| l.contains("datapath_cpu:"))
        .map(str::to_string);
    assert_eq!(
        line.as_deref()
            .map(|l| l.split_once(':').unwrap().1.trim().to_string()),
        Some(format!(
            "{last_cpu} (auto: allowed {last_cpu}, eth0 has no NUMA locality)"
        )),
        "{}",
        text(&o)
    );

    for tool in ["ib_send_bw", "ib_write_bw"] {
        let (server, client) = perftest(tool, (&srv, &cli), "shedk8s", SERVER_IP, 2000);
        let c = bw_line(&client)
            .unwrap_or_else(|| panic!("{tool} client:\n{client}\nserver:\n{server}"));
        assert_eq!(c[1], 2000.0, "{client}");
        assert!(c[3] > 0.0, "{client}");
        eprintln!(
            "{tool} between two containers: {} Gb/s average (client), 64 KiB x 2000",
            c[3]
        );
        if tool == "ib_send_bw" {
            let s = bw_line(&server).unwrap_or_else(|| panic!("{tool} server:\n{server}"));
            eprintln!("{tool} server side: {} Gb/s average", s[3]);
        }
    }
    for name in [srv_sbx, cli_sbx] {
        let _ = podman(&["rm", "-f", "-t", "0", name]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The allocated container sees the device, by envs and mounts and by the CDI name
/// alone (what a CDI-aware runtime gets instead); one without an allocation sees none.
fn check_device_seen(srv: &[String], resp: &ContainerAllocateResponse, srv_sbx: &str) {
    let o = Command::new("podman")
        .arg("run")
        .args(srv)
        .args([IMAGE, "ibv_devinfo"])
        .output()
        .unwrap();
    assert!(
        o.status.success() && text(&o).contains("hca_id:\tsofthca0"),
        "{}",
        text(&o)
    );
    let net = format!("--network=container:{srv_sbx}");
    let bare = podman(&[&["run"][..], &BASE[..], &[&net, IMAGE, "ibv_devinfo"]].concat());
    assert!(!bare.status.success(), "{}", text(&bare));
    assert!(
        text(&bare).contains("No IB devices found")
            || text(&bare).contains("Failed to get IB devices list"),
        "{}",
        text(&bare)
    );

    let cdi = &resp.cdi_devices[0].name;
    assert_eq!(cdi, "softhca.io/rdma=eth0");
    let dev = format!("--device={cdi}");
    let o = podman(&[&["run"][..], &BASE[..], &[&net, &dev, IMAGE, "ibv_devinfo"]].concat());
    assert!(
        o.status.success() && text(&o).contains("hca_id:\tsofthca0"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_file(softhca_k8s::cdi::spec_path(Path::new(CDI_DIR), CDI_KIND));
}

/// The CPUs this test may use (the containers' cpusets are chosen among them).
fn allowed_cpus() -> Vec<usize> {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = s
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    softhca_topo::CpuSet::parse_list(&list)
        .unwrap()
        .iter()
        .collect()
}

const MGMT_NET: &str = "shed2m";
const MGMT_SUBNET: &str = "10.89.41.0/24";
const DATA_NET: &str = "shed2d";
const DATA_SUBNET: &str = "10.89.42.0/24";
/// Server and client sandbox addresses.
const MGMT_IP: [&str; 2] = ["10.89.41.20", "10.89.41.21"];
const DATA_IP: [&str; 2] = ["10.89.42.20", "10.89.42.21"];
/// The pod's primary network is `eth0`; the data network is attached as `net1`, the
/// name Multus gives a pod's first extra network.
const MGMT_IF: &str = "eth0";
const DATA_IF: &str = "net1";
/// 64 KiB RDMA WRITEs: 13 MB across.
const WRITES: u32 = 200;
/// Management bytes allowed each way during the run: perftest's own TCP exchange
/// (about 2 KB), which is management traffic, and ARP; below one 64 KiB message and
/// below the RoCE ACKs of the run (8 KB and more), so a leak of either shows.
const MGMT_ALLOWANCE: u64 = 6 * 1024;

fn nsenter(pid: &str, args: &[&str]) -> String {
    let o = Command::new("nsenter")
        .args(["-t", pid, "-n"])
        .args(args)
        .output()
        .expect("run nsenter");
    assert!(o.status.success(), "nsenter {args:?}: {}", text(&o));
    text(&o)
}

/// Sandbox `s` (0 server, 1 client) reaches the peer's data address through the
/// management network, as a default route through `eth0` would for an address off
/// the data subnet: unbound, RDMA would leave through `eth0`. Set from the host, as a
/// CNI plugin would (the sandbox has no CAP_NET_ADMIN). No IPv6 (router and
/// neighbour solicitations would move the counters), no reverse-path filter (the
/// peer's data address is routed the other way).
fn route_peer_data_over_mgmt(sbx: &str, s: usize) {
    let pid = text(&podman(&["inspect", "--format", "{{.State.Pid}}", sbx]));
    let pid = pid.trim();
    let all = format!("net.ipv4.conf.{MGMT_IF}.rp_filter=0");
    let data = format!("net.ipv4.conf.{DATA_IF}.rp_filter=0");
    nsenter(
        pid,
        &[
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
            "net.ipv4.conf.all.rp_filter=0",
            &all,
            &data,
        ],
    );
    let peer = format!("{}/32", DATA_IP[1 - s]);
    nsenter(
        pid,
        &[
            "ip",
            "route",
            "add",
            &peer,
            "via",
            MGMT_IP[1 - s],
            "dev",
            MGMT_IF,
        ],
    );
    let got = nsenter(pid, &["ip", "route", "get", DATA_IP[1 - s]]);
    assert!(got.contains(&format!("dev {MGMT_IF}")), "{got}");
}

/// `[data tx, data rx, management tx, management rx]` bytes as sandbox `sbx` sees
/// its interfaces (`/sys/class/net/*/statistics`).
fn if_bytes(sbx: &str) -> [u64; 4] {
    let files: Vec<String> = [DATA_IF, MGMT_IF]
        .iter()
        .flat_map(|i| ["tx", "rx"].map(|d| format!("/sys/class/net/{i}/statistics/{d}_bytes")))
        .collect();
    let mut args = vec!["exec", sbx, "cat"];
    args.extend(files.iter().map(String::as_str));
    let o = podman(&args);
    assert!(o.status.success(), "{}", text(&o));
    let v: Vec<u64> = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    v.try_into().unwrap()
}

/// Two pods on a management and a data network, the device plugin advertising the data
/// network's bridge as `net1`: unmodified `ib_write_bw` between the allocated
/// containers moves its payload over `net1` and nothing of it over `eth0`, though the
/// routing table sends the peer's data address over `eth0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_stays_on_the_data_network() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _serial = SERIAL.lock().await;
    ensure_image();
    ensure_network(MGMT_NET, MGMT_SUBNET);
    ensure_network(DATA_NET, DATA_SUBNET);
    let sbx = ["shed2-sbx-srv", "shed2-sbx-cli"];
    for (s, name) in sbx.iter().enumerate() {
        let mgmt = format!("{MGMT_NET}:ip={}", MGMT_IP[s]);
        let data = format!("{DATA_NET}:ip={},interface_name={DATA_IF}", DATA_IP[s]);
        sandbox(name, &[&mgmt, &data]);
        route_peer_data_over_mgmt(name, s);
    }
    let dir = temp_dir("two-networks");
    let (plugin, resps) = allocate_two(&dir, &bridge_of(DATA_NET), DATA_IF).await;
    for r in &resps {
        assert_eq!(
            r.envs.get("SOFTHCA_NETDEV").map(String::as_str),
            Some(DATA_IF)
        );
    }
    let last_cpu = allowed_cpus().last().copied().unwrap_or(0).to_string();
    let srv = run_args(&resps[0], sbx[0], "0");
    let cli = run_args(&resps[1], sbx[1], &last_cpu);

    let bound = write_and_count(&sbx, &srv, &cli);
    // The control: the same run with devices given only the data addresses follows the
    // routing table over management, so a leak would show.
    let by_addr = |args: &[String], s: usize| -> Vec<String> {
        let netdev = format!("--env=SOFTHCA_NETDEV={DATA_IF}");
        args.iter()
            .map(|a| {
                if *a == netdev {
                    format!("--env=SOFTHCA_ADDR={}", DATA_IP[s])
                } else {
                    a.clone()
                }
            })
            .collect()
    };
    let unbound = write_and_count(&sbx, &by_addr(&srv, 0), &by_addr(&cli, 1));
    drop(plugin);
    for name in sbx {
        let _ = podman(&["rm", "-f", "-t", "0", name]);
    }
    let _ = std::fs::remove_file(softhca_k8s::cdi::spec_path(Path::new(CDI_DIR), CDI_KIND));
    let _ = std::fs::remove_dir_all(&dir);

    let bound = bound.unwrap_or_else(|e| panic!("{e}"));
    let unbound = unbound.unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "ib_write_bw 64 KiB x {WRITES}, [data tx, data rx, mgmt tx, mgmt rx] [server, client]: \
         SOFTHCA_NETDEV={DATA_IF} {bound:?}, SOFTHCA_ADDR=<data address> {unbound:?}"
    );
    let payload = 65536 * u64::from(WRITES);
    assert!(
        bound[1][0] >= payload && bound[0][1] >= payload,
        "{bound:?}"
    );
    for m in &bound {
        assert!(m[2] < MGMT_ALLOWANCE && m[3] < MGMT_ALLOWANCE, "{bound:?}");
    }
    assert!(
        unbound[1][2] >= payload && unbound[0][3] >= payload,
        "{unbound:?}"
    );
}

/// Interface byte counts each sandbox saw (see [`if_bytes`]) while `ib_write_bw` moved
/// [`WRITES`] messages from the client to the server, or the perftest output if it
/// failed.
fn write_and_count(
    sbx: &[&str; 2],
    srv: &[String],
    cli: &[String],
) -> Result<[[u64; 4]; 2], String> {
    let before = sbx.map(if_bytes);
    // The client finds the server on the management network, as perftest's TCP
    // exchange would in a pod; the RDMA peer is the server's data address (its GID).
    let (server, client) = perftest("ib_write_bw", (srv, cli), "shed2", MGMT_IP[0], WRITES);
    let after = sbx.map(if_bytes);
    match bw_line(&client) {
        Some(c) if c[1] == f64::from(WRITES) => Ok(std::array::from_fn(|s| {
            std::array::from_fn(|i| after[s][i] - before[s][i])
        })),
        _ => Err(format!("client:\n{client}\nserver:\n{server}")),
    }
}
