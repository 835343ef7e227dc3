//! The routes: `/v1/…` (JSON), `/metrics` (Prometheus), `/openapi.yaml`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::Value;
use softhca::Snapshot;

use crate::error::ApiError;
use crate::metrics::prometheus_text;
use crate::topology::node_topology;
use crate::{ALLOCATIONS_FILE, OPENAPI_YAML};

/// What every handler reads from.
struct Dirs(Vec<PathBuf>);

type Shared = State<Arc<Dirs>>;

/// The agent's routes over the devices published in `run_dirs`.
pub fn router(run_dirs: Vec<PathBuf>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/openapi.yaml", get(openapi))
        .route("/metrics", get(metrics))
        .route("/v1/node/topology", get(topology))
        .route("/v1/allocations", get(allocations))
        .route("/v1/devices", get(devices))
        .route("/v1/devices/{pid}/{name}", get(device))
        .route("/v1/devices/{pid}/{name}/qps", get(device_qps))
        .route("/v1/devices/{pid}/{name}/counters", get(device_counters))
        .route("/v1/qps", get(qps))
        .route("/v1/counters", get(counters))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::new(Dirs(run_dirs)))
}

/// Every device's snapshot, read off the async workers (a socket read may wait).
async fn snapshots(dirs: &Arc<Dirs>) -> Vec<Snapshot> {
    let dirs = dirs.clone();
    tokio::task::spawn_blocking(move || softhca::read_all(&dirs.0))
        .await
        .unwrap_or_default()
}

/// The `pid` query parameter, the only one the listings take.
fn pid_filter(q: &HashMap<String, String>) -> Result<Option<u32>, ApiError> {
    if let Some(k) = q.keys().find(|k| *k != "pid") {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter '{k}' (known: pid)"
        )));
    }
    q.get("pid").map(|p| parse_pid(p)).transpose()
}

fn parse_pid(p: &str) -> Result<u32, ApiError> {
    p.parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| ApiError::bad_request(format!("pid '{p}' is not a process id")))
}

/// The snapshots of `pid` (all without one); 404 for a pid with no device.
async fn selected(dirs: &Arc<Dirs>, pid: Option<u32>) -> Result<Vec<Snapshot>, ApiError> {
    let all = snapshots(dirs).await;
    match pid {
        None => Ok(all),
        Some(pid) => {
            let mine: Vec<Snapshot> = all.into_iter().filter(|s| s.pid == pid).collect();
            if mine.is_empty() {
                return Err(ApiError::not_found(format!(
                    "no softhca device published by pid {pid}"
                )));
            }
            Ok(mine)
        }
    }
}

async fn one_device(dirs: &Arc<Dirs>, pid: &str, name: &str) -> Result<Snapshot, ApiError> {
    let pid = parse_pid(pid)?;
    selected(dirs, Some(pid))
        .await?
        .into_iter()
        .find(|s| s.key == name)
        .ok_or_else(|| ApiError::not_found(format!("pid {pid} has no device named '{name}'")))
}

async fn index() -> Json<Value> {
    Json(serde_json::json!({
        "service": "softhca agent",
        "version": env!("CARGO_PKG_VERSION"),
        "endpoints": [
            "/v1/node/topology", "/v1/devices", "/v1/devices/{pid}/{name}",
            "/v1/devices/{pid}/{name}/qps", "/v1/devices/{pid}/{name}/counters",
            "/v1/qps", "/v1/counters", "/v1/allocations", "/metrics", "/openapi.yaml"
        ],
    }))
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI_YAML).into_response()
}

async fn metrics(State(dirs): Shared) -> Response {
    let text = prometheus_text(&snapshots(&dirs).await);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn topology() -> Result<Json<crate::topology::Topology>, ApiError> {
    tokio::task::spawn_blocking(node_topology)
        .await
        .map(Json)
        .map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("reading the topology failed: {e}"),
        })
}

/// The device plugin's record, verbatim: the first run directory that has one.
async fn allocations(State(dirs): Shared) -> Result<Response, ApiError> {
    for dir in &dirs.0 {
        let path = dir.join(ALLOCATIONS_FILE);
        if let Ok(body) = tokio::fs::read(&path).await {
            return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
        }
    }
    Err(ApiError::not_found(format!(
        "no {ALLOCATIONS_FILE} in the run directories (the Kubernetes device plugin writes it)"
    )))
}

/// A device in the listing: the snapshot without its QPs and counters.
#[derive(Serialize)]
struct DeviceEntry {
    pid: u32,
    command: String,
    key: String,
    qp_count: usize,
    #[serde(flatten)]
    device: softhca::DeviceSnapshot,
}

async fn devices(
    State(dirs): Shared,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Vec<DeviceEntry>>, ApiError> {
    let pid = pid_filter(&q)?;
    let list = selected(&dirs, pid).await?;
    Ok(Json(
        list.into_iter()
            .map(|s| DeviceEntry {
                pid: s.pid,
                command: s.command,
                key: s.key,
                qp_count: s.qps.len(),
                device: s.device,
            })
            .collect(),
    ))
}

async fn device(
    State(dirs): Shared,
    Path((pid, name)): Path<(String, String)>,
) -> Result<Json<Snapshot>, ApiError> {
    one_device(&dirs, &pid, &name).await.map(Json)
}

async fn device_qps(
    State(dirs): Shared,
    Path((pid, name)): Path<(String, String)>,
) -> Result<Json<Vec<softhca::QpSnapshot>>, ApiError> {
    one_device(&dirs, &pid, &name).await.map(|s| Json(s.qps))
}

async fn device_counters(
    State(dirs): Shared,
    Path((pid, name)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let s = one_device(&dirs, &pid, &name).await?;
    Ok(Json(serde_json::to_value(s.counters).unwrap_or_default()))
}

/// One QP with the device and process it belongs to (`rdma res show qp`).
#[derive(Serialize)]
struct QpEntry {
    pid: u32,
    command: String,
    device: String,
    #[serde(flatten)]
    qp: softhca::QpSnapshot,
}

async fn qps(
    State(dirs): Shared,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Vec<QpEntry>>, ApiError> {
    let pid = pid_filter(&q)?;
    let list = selected(&dirs, pid).await?;
    Ok(Json(
        list.into_iter()
            .flat_map(|s| {
                let (pid, command, device) = (s.pid, s.command, s.key);
                s.qps.into_iter().map(move |qp| QpEntry {
                    pid,
                    command: command.clone(),
                    device: device.clone(),
                    qp,
                })
            })
            .collect(),
    ))
}

/// Every device's counters (`rdma statistic`).
async fn counters(
    State(dirs): Shared,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let pid = pid_filter(&q)?;
    let list = selected(&dirs, pid).await?;
    Ok(Json(
        list.into_iter()
            .map(|s| {
                serde_json::json!({
                    "pid": s.pid,
                    "command": s.command,
                    "device": s.key,
                    "counters": s.counters,
                })
            })
            .collect(),
    ))
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!(
        "no such resource: {} (see /openapi.yaml)",
        uri.path()
    ))
}

async fn method_not_allowed() -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: "only GET is served".to_string(),
    }
}
