//! `softhca agent`: a node's softhca devices over HTTP.
//!
//! Every softhca device publishes a read-only snapshot of itself on a Unix socket in a
//! run directory (`softhca::Publish`); the agent reads them when asked and serves:
//!
//! * a JSON REST API under `/v1`: the node's topology, the devices, their QPs and
//!   counters, and the Kubernetes device plugin's allocations;
//! * `/metrics`, the same counters in the Prometheus text format;
//! * `/openapi.yaml`, the API's OpenAPI 3 description.
//!
//! Requests it cannot answer get a JSON body `{"error": …, "status": …}` with a 4xx
//! status. The agent keeps no state: each request reads the devices afresh, so its
//! values are the devices' own at that moment.

mod api;
mod error;
mod metrics;
pub mod topology;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use api::router;
pub use error::AgentError;

/// The agent's OpenAPI description, served at `/openapi.yaml`.
pub const OPENAPI_YAML: &str = include_str!("../openapi.yaml");

/// The device plugin's allocation record, looked for in each run directory.
pub const ALLOCATIONS_FILE: &str = "k8s-allocations.json";

/// What the agent serves and where.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Run directories to read devices (and the allocation record) from, in order.
    pub run_dirs: Vec<PathBuf>,
}

/// Serves until interrupted (Ctrl-C or SIGTERM). Prints the address it listens on
/// (with the port the kernel chose when asked for port 0) to stdout.
pub fn run(cfg: AgentConfig) -> Result<(), AgentError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| AgentError::Listen {
                addr: cfg.listen,
                source,
            })?;
        let local = listener.local_addr().map_err(AgentError::Runtime)?;
        println!("softhca agent listening on http://{local}");
        let app = router(cfg.run_dirs);
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .map_err(AgentError::Runtime)
    })
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
