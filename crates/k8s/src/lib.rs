//! softhca-k8s: a Kubernetes device plugin (deviceplugin v1beta1) for softhca.
//!
//! softhca needs no device node: a container gets an RDMA device by getting the drop-in
//! libraries (a read-only mount and `LD_LIBRARY_PATH`) and the environment naming the
//! interface to serve (`SOFTHCA_NETDEV`) and the CPU policy (`SOFTHCA_CPU=auto`, which
//! picks a CPU inside the container's cpuset; the plugin cannot see that cpuset). The
//! plugin advertises a number of shares of each selected host interface as device IDs
//! with the interface's NUMA node, so the kubelet's Topology Manager can align them
//! with the CPUs it gives the pod.
//!
//! * [`inventory`]: the device IDs, their interfaces, NUMA nodes and health;
//! * [`service`]: the `DevicePlugin` gRPC service the kubelet calls;
//! * [`kubelet`]: serving on the socket directory, registering, and re-registering
//!   when the kubelet restarts;
//! * [`record`]: the allocations file other tools (the node agent) read;
//! * [`cdi`]: the same container edits as a CDI spec, for runtimes given CDI names.

pub mod api {
    //! The device-plugin API generated from kubelet's `api.proto`.
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("v1beta1");
}

pub mod cdi;
pub mod config;
pub mod inventory;
pub mod kubelet;
pub mod record;
pub mod service;

pub use config::{NetdevPool, PluginConfig};

/// Why the plugin cannot run.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// A bad option.
    #[error("{0}")]
    Config(String),
    /// The topology of an interface could not be read.
    #[error(transparent)]
    Topo(#[from] softhca_topo::TopoError),
    /// A socket or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The kubelet refused the registration or could not be reached.
    #[error("registration with the kubelet at {socket}: {msg}")]
    Register {
        /// The kubelet socket.
        socket: String,
        /// What went wrong.
        msg: String,
    },
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Serve(String),
}

impl PluginError {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PluginError {
        let what = what.into();
        move |source| PluginError::Io { what, source }
    }
}
