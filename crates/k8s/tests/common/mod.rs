//! The stand-in kubelet and plugin process the tests share.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use softhca_k8s::api::device_plugin_client::DevicePluginClient;
use softhca_k8s::api::registration_server::{Registration, RegistrationServer};
use softhca_k8s::api::{self, Empty, RegisterRequest};
use softhca_k8s::kubelet::unix_channel;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// The kubelet's `Registration` service: passes each request to the test.
struct Kubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument(format!(
                "unsupported version {}",
                r.version
            )));
        }
        let _ = self.0.send(r);
        Ok(Response::new(Empty {}))
    }
}

/// A running stand-in kubelet; dropping `stop` ends it.
pub struct FakeKubelet {
    pub registered: mpsc::UnboundedReceiver<RegisterRequest>,
    pub stop: Option<oneshot::Sender<()>>,
}

pub fn start_kubelet(dir: &Path) -> FakeKubelet {
    let sock = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).unwrap();
    let (tx, registered) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        Server::builder()
            .add_service(RegistrationServer::new(Kubelet(tx)))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    FakeKubelet {
        registered,
        stop: Some(stop),
    }
}

impl FakeKubelet {
    pub async fn next_register(&mut self, within: Duration) -> RegisterRequest {
        tokio::time::timeout(within, self.registered.recv())
            .await
            .expect("no Register in time")
            .expect("kubelet channel closed")
    }

    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// The plugin process, killed on drop.
pub struct PluginProc(pub Child);

impl Drop for PluginProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shedk8s-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn plugin_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softhca-k8s"));
    c.arg("--socket-dir")
        .arg(dir)
        .arg("--run-dir")
        .arg(dir.join("run"))
        .arg("--lib-dir")
        .arg(dir.join("lib"))
        .args(["--health-interval-ms", "100"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    c
}

pub async fn plugin_client(dir: &Path, endpoint: &str) -> DevicePluginClient<Channel> {
    DevicePluginClient::new(
        unix_channel(dir.join(endpoint))
            .await
            .expect("plugin socket serves"),
    )
}

pub async fn first_list(
    c: &mut DevicePluginClient<Channel>,
) -> (
    Vec<api::Device>,
    tonic::Streaming<api::ListAndWatchResponse>,
) {
    let mut s = c.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), s.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    (first.devices, s)
}
