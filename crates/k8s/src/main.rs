//! `softhca-k8s`: the Kubernetes device plugin for softhca (see the crate docs).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use softhca_k8s::config::KUBELET_DIR;
use softhca_k8s::{kubelet, NetdevPool, PluginConfig, PluginError};

/// Kubernetes device plugin: advertises softhca RDMA devices (shares of host
/// interfaces, with their NUMA nodes) and hands containers the drop-in libraries and
/// environment that make unmodified RDMA programs run.
#[derive(Debug, Parser)]
#[command(name = "softhca-k8s", version)]
struct Args {
    /// Extended resource name pods request.
    #[arg(long, default_value = "softhca.io/rdma")]
    resource_name: String,
    /// The kubelet's device-plugin directory (kubelet.sock and the plugin's socket).
    #[arg(long, default_value = KUBELET_DIR)]
    socket_dir: PathBuf,
    /// The plugin's socket name in that directory.
    #[arg(long, default_value = "softhca-rdma.sock")]
    endpoint: String,
    /// Host interface to advertise, as HOST or HOST:CONTAINER when the container
    /// reaches the same network under another name (e.g. eth1:net1); repeatable.
    #[arg(long, value_name = "HOST[:CONTAINER]", required = true)]
    netdev: Vec<String>,
    /// Device IDs per interface: how many containers may use one at once.
    #[arg(long, default_value_t = 8)]
    devices_per_netdev: usize,
    /// Host directory with the drop-in libibverbs.so.1 and librdmacm.so.1.
    #[arg(long, default_value = "/opt/softhca/lib")]
    lib_dir: PathBuf,
    /// Where containers see that directory (read-only; their LD_LIBRARY_PATH).
    #[arg(long, default_value = "/opt/softhca/lib")]
    container_lib_dir: PathBuf,
    /// Also answer a CDI device KIND=<interface> (e.g. softhca.io/rdma), for runtimes
    /// with a CDI spec in /etc/cdi.
    #[arg(long, value_name = "KIND")]
    cdi_kind: Option<String>,
    /// Write the CDI spec of --cdi-kind into DIR at start (e.g. /etc/cdi).
    #[arg(long, value_name = "DIR")]
    cdi_spec_dir: Option<PathBuf>,
    /// Directory for k8s-allocations.json.
    #[arg(long, env = "SOFTHCA_RUN_DIR", default_value = "/run/softhca")]
    run_dir: PathBuf,
    /// Read interface NUMA nodes and link state below DIR instead of /.
    #[arg(long, value_name = "DIR", default_value = "/")]
    sysfs_root: PathBuf,
    /// Milliseconds between interface health checks.
    #[arg(long, default_value_t = 500)]
    health_interval_ms: u64,
}

fn config(a: Args) -> Result<PluginConfig, PluginError> {
    Ok(PluginConfig {
        resource_name: a.resource_name,
        socket_dir: a.socket_dir,
        endpoint: a.endpoint,
        netdevs: a
            .netdev
            .iter()
            .map(|s| NetdevPool::parse(s))
            .collect::<Result<_, _>>()?,
        devices_per_netdev: a.devices_per_netdev,
        lib_dir: a.lib_dir,
        container_lib_dir: a.container_lib_dir,
        cdi_kind: a.cdi_kind,
        cdi_spec_dir: a.cdi_spec_dir,
        run_dir: a.run_dir,
        sysfs_root: a.sysfs_root,
        health_interval: Duration::from_millis(a.health_interval_ms.max(10)),
    })
}

/// SIGINT or SIGTERM (what the kubelet's DaemonSet sends).
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = config(Args::parse()).and_then(|cfg| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(PluginError::io("start the runtime"))?;
        rt.block_on(kubelet::run(cfg, stop_signal()))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softhca-k8s: {e}");
            ExitCode::from(1)
        }
    }
}
