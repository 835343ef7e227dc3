//! The `DevicePlugin` service the kubelet calls.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_stream::{wrappers::WatchStream, Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::api::device_plugin_server::DevicePlugin;
use crate::api::{self, ContainerAllocateResponse, Mount};
use crate::config::PluginConfig;
use crate::inventory::{preferred, DeviceEntry};
use crate::record::{self, Allocation};

/// The plugin's state shared by every call.
pub struct Plugin {
    cfg: PluginConfig,
    devs: Vec<DeviceEntry>,
    /// The current `ListAndWatch` list; the health task replaces it on a change.
    list: watch::Receiver<Vec<api::Device>>,
}

impl Plugin {
    /// A plugin over `devs`, whose list the health task publishes on `list`.
    pub fn new(
        cfg: PluginConfig,
        devs: Vec<DeviceEntry>,
        list: watch::Receiver<Vec<api::Device>>,
    ) -> Arc<Plugin> {
        Arc::new(Plugin { cfg, devs, list })
    }

    /// What one container gets for `ids`: the environment naming the interface and the
    /// CPU policy, the drop-in libraries read-only with `LD_LIBRARY_PATH`, and the CDI
    /// device when configured. A user's own `SOFTHCA_*` in the pod spec still wins: the
    /// kubelet appends the pod's env after the plugin's.
    pub fn container_response(
        &self,
        ids: &[String],
    ) -> Result<(ContainerAllocateResponse, Allocation), Status> {
        let mut entries = Vec::new();
        for id in ids {
            let d = self.devs.iter().find(|d| &d.id == id);
            entries.push(
                d.ok_or_else(|| Status::invalid_argument(format!("unknown device ID {id:?}")))?,
            );
        }
        let first = entries
            .first()
            .ok_or_else(|| Status::invalid_argument("no device ID"))?;
        let lib = self.cfg.container_lib_dir.display().to_string();
        let envs = crate::cdi::envs(&self.cfg, &first.pool.container);
        let cdi: Vec<String> = self
            .cfg
            .cdi_kind
            .iter()
            .map(|k| format!("{k}={}", first.pool.container))
            .collect();
        let resp = ContainerAllocateResponse {
            envs: envs.clone().into_iter().collect(),
            mounts: vec![Mount {
                container_path: lib,
                host_path: self.cfg.lib_dir.display().to_string(),
                read_only: true,
            }],
            devices: Vec::new(),
            annotations: Default::default(),
            cdi_devices: cdi
                .iter()
                .map(|name| api::CdiDevice { name: name.clone() })
                .collect(),
        };
        let mut netdevs: Vec<String> = entries.iter().map(|d| d.pool.host.clone()).collect();
        netdevs.dedup();
        let mut numa_nodes: Vec<usize> = entries.iter().filter_map(|d| d.numa).collect();
        numa_nodes.sort_unstable();
        numa_nodes.dedup();
        let rec = Allocation {
            allocated_at: record::now(),
            device_ids: ids.to_vec(),
            netdevs,
            numa_nodes,
            envs,
            cdi_devices: cdi,
        };
        Ok((resp, rec))
    }
}

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Arc<Plugin> {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = ListStream;

    /// The whole list now, then again on every change of health.
    async fn list_and_watch(&self, _: Request<api::Empty>) -> Result<Response<ListStream>, Status> {
        let s = WatchStream::new(self.list.clone())
            .map(|devices| Ok(api::ListAndWatchResponse { devices }));
        Ok(Response::new(Box::pin(s)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| api::ContainerPreferredAllocationResponse {
                device_i_ds: preferred(
                    &self.devs,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        let mut recs = Vec::new();
        for c in &req.get_ref().container_requests {
            let (resp, rec) = self.container_response(&c.devices_ids)?;
            container_responses.push(resp);
            recs.push(rec);
        }
        // The answer does not depend on the record: a full disk is logged, not fatal.
        if let Err(e) = record::add(&self.cfg.run_dir, &self.cfg.resource_name, recs) {
            tracing::warn!("allocations file: {e}");
        }
        tracing::info!(containers = container_responses.len(), "allocated");
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
