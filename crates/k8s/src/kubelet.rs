//! Serving on the kubelet's socket directory and registering with the kubelet.
//!
//! The kubelet requires the plugin to serve before it registers, and on restart it
//! recreates `kubelet.sock` and removes the plugins' sockets; the plugin then serves
//! on a fresh socket and registers again. Both are noticed by polling the two sockets'
//! identities (device, inode) every [`WATCH_INTERVAL`], well inside the 5 s the
//! kubelet's restart tolerates.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Endpoint, Server};

use crate::api::device_plugin_server::DevicePluginServer;
use crate::api::registration_client::RegistrationClient;
use crate::api::{self, DevicePluginOptions, RegisterRequest};
use crate::config::{PluginConfig, API_VERSION};
use crate::inventory::{device_list, inventory};
use crate::service::Plugin;
use crate::PluginError;

/// How often the sockets are checked.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(200);

/// A socket file's identity: a new one (same path) is another file. The inode number
/// alone is not enough: tmpfs reuses it at once for the next file.
type Identity = (u64, u64, i64, i64);

fn identity(p: &Path) -> Option<Identity> {
    std::fs::metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// A gRPC channel over the Unix socket `path` (the URI is required but unused).
pub async fn unix_channel(
    path: PathBuf,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    Endpoint::from_static("http://[::1]:1")
        .connect_with_connector(tower::service_fn(move |_| {
            let p = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(p).await?)) }
        }))
        .await
}

/// Sends `Register` to the kubelet.
pub async fn register(cfg: &PluginConfig) -> Result<(), PluginError> {
    let socket = cfg.kubelet_socket();
    let err = |msg: String| PluginError::Register {
        socket: socket.display().to_string(),
        msg,
    };
    let ch = unix_channel(socket.clone())
        .await
        .map_err(|e| err(e.to_string()))?;
    let req = RegisterRequest {
        version: API_VERSION.to_string(),
        endpoint: cfg.endpoint.clone(),
        resource_name: cfg.resource_name.clone(),
        options: Some(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    };
    RegistrationClient::new(ch)
        .register(req)
        .await
        .map_err(|s| err(s.message().to_string()))?;
    Ok(())
}

/// A running gRPC server on the plugin socket.
struct Serving {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    socket: Option<Identity>,
}

fn serve(cfg: &PluginConfig, plugin: &Arc<Plugin>) -> Result<Serving, PluginError> {
    let path = cfg.plugin_socket();
    // A socket left by an earlier run would make bind fail.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(PluginError::io(format!("listen on {}", path.display())))?;
    let (stop, stopped) = oneshot::channel::<()>();
    let svc = DevicePluginServer::new(plugin.clone());
    let task = tokio::spawn(
        Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    Ok(Serving {
        stop,
        task,
        socket: identity(&path),
    })
}

impl Serving {
    async fn shut(self) {
        let _ = self.stop.send(());
        // A graceful shutdown waits for every connection, and a ListAndWatch stream
        // never ends by itself: give in-flight calls a moment, then cut them.
        let abort = self.task.abort_handle();
        if tokio::time::timeout(Duration::from_millis(200), self.task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

/// Publishes the device list on `tx` whenever a health changes.
fn spawn_health(
    cfg: PluginConfig,
    devs: Vec<crate::inventory::DeviceEntry>,
    tx: watch::Sender<Vec<api::Device>>,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(cfg.health_interval);
        loop {
            tick.tick().await;
            let list = device_list(&devs, &cfg.sysfs_root);
            tx.send_if_modified(|cur| {
                let changed = *cur != list;
                if changed {
                    tracing::info!("device health changed");
                    *cur = list;
                }
                changed
            });
        }
    });
}

/// Serves, registers, and keeps both alive until `shutdown` resolves.
pub async fn run(
    cfg: PluginConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), PluginError> {
    cfg.validate()?;
    let devs = inventory(&cfg)?;
    if let (Some(kind), Some(dir)) = (&cfg.cdi_kind, &cfg.cdi_spec_dir) {
        let path = crate::cdi::write_spec(&cfg, kind, dir)?;
        tracing::info!("CDI spec {}", path.display());
    }
    let (tx, rx) = watch::channel(device_list(&devs, &cfg.sysfs_root));
    spawn_health(cfg.clone(), devs.clone(), tx);
    let plugin = Plugin::new(cfg.clone(), devs, rx);
    tokio::pin!(shutdown);
    let mut server = serve(&cfg, &plugin)?;
    let mut registered: Option<Identity> = None;
    loop {
        let kubelet = identity(&cfg.kubelet_socket());
        if server.socket.is_none() || identity(&cfg.plugin_socket()) != server.socket {
            tracing::info!("plugin socket gone: serving again");
            server.shut().await;
            server = serve(&cfg, &plugin)?;
            registered = None;
        }
        if kubelet.is_some() && kubelet != registered {
            match register(&cfg).await {
                Ok(()) => {
                    tracing::info!(resource = %cfg.resource_name, "registered with the kubelet");
                    registered = kubelet;
                }
                Err(e) => tracing::warn!("{e}; retrying"),
            }
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(WATCH_INTERVAL) => {}
        }
    }
    server.shut().await;
    let _ = std::fs::remove_file(cfg.plugin_socket());
    Ok(())
}
