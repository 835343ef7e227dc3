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
    for so in ["libibverbs.so.1", "librdmacm.so.1"] {
        let src = build_dir().join(so);
        assert!(
            src.exists(),
            "{} not built (cargo build --release)",
            src.display()
        );
        std::fs::copy(&src, lib.join(so)).unwrap();
    }
    lib
}

/// A pod sandbox on the test network: its netns is what the app containers join.
fn sandbox(name: &str, ip: &str) {
    let _ = podman(&["rm", "-f", "-t", "0", name]);
    let o = podman(&[
        "run",
        "-d",
        "--name",
        name,
        "--runtime",
        "runc",
        "--network",
        NETWORK,
        "--ip",
        ip,
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1000:1000",
        IMAGE,
        "sleep",
        "900",
    ]);
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

/// Server container (detached) and client container running `tool`; returns both
/// outputs.
fn perftest(tool: &str, srv: &[String], cli: &[String]) -> (String, String) {
    let name = format!("shedk8s-{tool}-srv");
    let _ = podman(&["rm", "-f", "-t", "0", &name]);
    let args = [
        tool,
        "-F",
        "--report_gbits",
        "-x",
        "0",
        "-s",
        "65536",
        "-n",
        "2000",
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
        c.push(SERVER_IP.into());
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

async fn allocate_two(dir: &Path, bridge: &str) -> (PluginProc, Vec<ContainerAllocateResponse>) {
    let mut kubelet = start_kubelet(dir);
    let netdev = format!("{bridge}:eth0");
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
    ensure_image();
    if !podman(&["network", "exists", NETWORK]).status.success() {
        let o = podman(&[
            "network",
            "create",
            "--internal",
            "--subnet",
            SUBNET,
            NETWORK,
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let (srv_sbx, cli_sbx) = ("shedk8s-sbx-srv", "shedk8s-sbx-cli");
    sandbox(srv_sbx, SERVER_IP);
    sandbox(cli_sbx, CLIENT_IP);
    let bridge = text(&podman(&[
        "network",
        "inspect",
        NETWORK,
        "--format",
        "{{.NetworkInterface}}",
    ]));
    let dir = temp_dir("containers");
    let (_plugin, resps) = allocate_two(&dir, bridge.trim()).await;
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
        let (server, client) = perftest(tool, &srv, &cli);
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
