//! The test plays the kubelet over the real device-plugin API (the same api.proto): it
//! serves `Registration` on a `kubelet.sock`, takes the plugin's `Register`, then calls
//! the plugin's socket as the kubelet does (`GetDevicePluginOptions`, `ListAndWatch`,
//! `GetPreferredAllocation`, `Allocate`), recreates `kubelet.sock` as a restarting
//! kubelet does, and (as root) takes an interface down and up.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{first_list, plugin_client, plugin_cmd, start_kubelet, temp_dir, PluginProc};
use softhca_k8s::api::device_plugin_client::DevicePluginClient;
use softhca_k8s::api::{self, Empty};
use tonic::transport::Channel;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../topo/tests/fixtures/qemu-2numa")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_lists_allocates_and_reregisters() {
    let dir = temp_dir("api");
    let mut kubelet = start_kubelet(&dir);
    let args = [
        "--netdev",
        "eth3:net1",
        "--netdev",
        "eth0",
        "--devices-per-netdev",
        "3",
        "--cdi-kind",
        "softhca.io/rdma",
    ];
    let _p = PluginProc(
        plugin_cmd(&dir, &args)
            .arg("--sysfs-root")
            .arg(fixture())
            .spawn()
            .unwrap(),
    );
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    assert_eq!(
        (reg.version.as_str(), reg.resource_name.as_str()),
        ("v1beta1", "softhca.io/rdma")
    );
    assert_eq!(reg.endpoint, "softhca-rdma.sock");
    assert!(reg.options.unwrap().get_preferred_allocation_available);
    // Serving before registering: the endpoint answers at once.
    let mut c = plugin_client(&dir, &reg.endpoint).await;
    let opts = c
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);

    let (devs, _stream) = first_list(&mut c).await;
    let ids: Vec<&str> = devs.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        ["eth3-0", "eth3-1", "eth3-2", "eth0-0", "eth0-1", "eth0-2"]
    );
    assert!(devs.iter().all(|d| d.health == "Healthy"));
    // eth3 is on node 1 of the captured guest; eth0 (root bus, numa_node -1) has none.
    assert_eq!(devs[0].topology.as_ref().unwrap().nodes[0].id, 1);
    assert!(devs[3].topology.is_none());

    check_allocation(&mut c, &dir).await;
    check_reregistration(&dir, kubelet).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_options_are_one_line() {
    let dir = temp_dir("opts");
    let out = plugin_cmd(&dir, &["--netdev", "nosuchif0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        err.trim(),
        "softhca-k8s: no network interface \"nosuchif0\""
    );
    let out = plugin_cmd(&dir, &["--netdev", "lo", "--resource-name", "rdma"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("softhca-k8s: --resource-name \"rdma\" is not"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// An interface going down shows as Unhealthy in ListAndWatch within 2 s, and Healthy
/// again when it comes back. Root only: a veth pair in a private namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_down_turns_unhealthy() {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (a network namespace with a veth pair)");
        return;
    }
    let ns = format!("shedk8s{}", std::process::id() % 100000);
    if Path::new("/run/netns").join(&ns).exists() {
        let _ = ip(&["netns", "del", &ns]);
    }
    assert!(ip(&["netns", "add", &ns]));
    let _ns = Netns(ns.clone());
    let in_ns = |args: &[&str]| ip(&[&["netns", "exec", &ns, "ip"][..], args].concat());
    assert!(in_ns(&[
        "link", "add", "shd0", "type", "veth", "peer", "name", "shd1"
    ]));
    assert!(in_ns(&["link", "set", "shd0", "up"]) && in_ns(&["link", "set", "shd1", "up"]));
    let dir = temp_dir("health");
    let mut kubelet = start_kubelet(&dir);
    // `ip netns exec` mounts the namespace's own /sys: the plugin sees shd0.
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns]);
    let plugin = plugin_cmd(&dir, &["--netdev", "shd0", "--devices-per-netdev", "2"]);
    cmd.arg(plugin.get_program())
        .args(plugin.get_args())
        .env("RUST_LOG", "warn");
    let _p = PluginProc(cmd.spawn().unwrap());
    let reg = kubelet.next_register(Duration::from_secs(10)).await;
    let mut c = plugin_client(&dir, &reg.endpoint).await;
    let (devs, mut stream) = first_list(&mut c).await;
    assert!(devs.iter().all(|d| d.health == "Healthy"), "{devs:?}");
    for (state, want) in [("down", "Unhealthy"), ("up", "Healthy")] {
        let t = Instant::now();
        assert!(in_ns(&["link", "set", "shd0", state]));
        let msg = tokio::time::timeout(Duration::from_secs(2), stream.message())
            .await
            .unwrap_or_else(|_| panic!("no update within 2 s of link {state}"))
            .unwrap()
            .unwrap();
        eprintln!("link {state}: ListAndWatch update after {:?}", t.elapsed());
        assert_eq!(msg.devices.len(), 2);
        assert!(
            msg.devices.iter().all(|d| d.health == want),
            "{:?}",
            msg.devices
        );
    }
    drop(_p);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Deletes the namespace (and its veth pair) even when the test fails.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

/// Preferred allocation, Allocate (good and bad IDs) and the allocations file.
async fn check_allocation(c: &mut DevicePluginClient<Channel>, dir: &Path) {
    let pref = c
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["eth0-0".into(), "eth3-1".into(), "eth3-2".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pref.container_responses[0].device_i_ds,
        ["eth3-1", "eth3-2"],
        "one NUMA node"
    );

    let resp = c
        .allocate(api::AllocateRequest {
            container_requests: vec![
                api::ContainerAllocateRequest {
                    devices_ids: vec!["eth3-1".into()],
                },
                api::ContainerAllocateRequest {
                    devices_ids: vec!["eth0-0".into()],
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let r0 = &resp.container_responses[0];
    assert_eq!(r0.envs["SOFTHCA_NETDEV"], "net1");
    assert_eq!(r0.envs["SOFTHCA_CPU"], "auto");
    assert_eq!(r0.envs["LD_LIBRARY_PATH"], "/opt/softhca/lib");
    assert_eq!(r0.mounts.len(), 1);
    assert_eq!(r0.mounts[0].container_path, "/opt/softhca/lib");
    assert_eq!(Path::new(&r0.mounts[0].host_path), dir.join("lib"));
    assert!(r0.mounts[0].read_only && r0.devices.is_empty());
    assert_eq!(r0.cdi_devices[0].name, "softhca.io/rdma=net1");
    assert_eq!(resp.container_responses[1].envs["SOFTHCA_NETDEV"], "eth0");

    let bad = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["eth9-0".into()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("eth9-0"), "{}", bad.message());

    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run/k8s-allocations.json")).unwrap())
            .unwrap();
    assert_eq!(file["resource_name"], "softhca.io/rdma");
    let a = &file["allocations"];
    assert_eq!(a.as_array().unwrap().len(), 2);
    assert_eq!(a[0]["device_ids"], serde_json::json!(["eth3-1"]));
    assert_eq!(a[0]["netdevs"], serde_json::json!(["eth3"]));
    assert_eq!(a[0]["numa_nodes"], serde_json::json!([1]));
    assert_eq!(a[0]["envs"]["SOFTHCA_NETDEV"], "net1");
}

/// The kubelet restarts: its socket goes away and comes back as a new file.
async fn check_reregistration(dir: &Path, mut kubelet: common::FakeKubelet) {
    kubelet.stop();
    std::fs::remove_file(dir.join("kubelet.sock")).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let mut kubelet = start_kubelet(dir);
    let again = kubelet.next_register(Duration::from_secs(5)).await;
    eprintln!(
        "re-registered {:?} after kubelet.sock was recreated",
        t.elapsed()
    );
    assert_eq!(again.resource_name, "softhca.io/rdma");
    // ... and a kubelet that also removed the plugin's socket gets a fresh one.
    std::fs::remove_file(dir.join("softhca-rdma.sock")).unwrap();
    kubelet.stop();
    std::fs::remove_file(dir.join("kubelet.sock")).unwrap();
    let mut kubelet = start_kubelet(dir);
    let t = Instant::now();
    kubelet.next_register(Duration::from_secs(5)).await;
    eprintln!(
        "re-registered on a new plugin socket after {:?}",
        t.elapsed()
    );
    let mut c = plugin_client(dir, "softhca-rdma.sock").await;
    assert_eq!(first_list(&mut c).await.0.len(), 6);
}
