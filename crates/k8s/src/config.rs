//! What the plugin advertises and hands to containers.

use std::path::PathBuf;
use std::time::Duration;

use crate::PluginError;

/// The kubelet's device-plugin directory (`DevicePluginPath` in the API's constants).
pub const KUBELET_DIR: &str = "/var/lib/kubelet/device-plugins";

/// The kubelet's registration socket in that directory (`KubeletSocket`).
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// The API version registered (`Version`).
pub const API_VERSION: &str = "v1beta1";

/// A host interface whose shares the plugin advertises, and the name the same network
/// has inside the container (`eth0` on the pod network, `net1` for a second network
/// attached by Multus; the host name itself for `hostNetwork` pods).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetdevPool {
    /// Interface on the node.
    pub host: String,
    /// Interface inside the container (`SOFTHCA_NETDEV`).
    pub container: String,
}

impl NetdevPool {
    /// Parses `HOST` or `HOST:CONTAINER`.
    pub fn parse(s: &str) -> Result<NetdevPool, PluginError> {
        let (host, container) = s.split_once(':').unwrap_or((s, s));
        let ok = |n: &str| !n.is_empty() && n.len() < 16 && !n.contains('/');
        if !ok(host) || !ok(container) {
            return Err(PluginError::Config(format!(
                "--netdev {s:?} is not HOST or HOST:CONTAINER interface names"
            )));
        }
        Ok(NetdevPool {
            host: host.to_string(),
            container: container.to_string(),
        })
    }
}

/// Everything the plugin is told.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// Extended resource name (`softhca.io/rdma`).
    pub resource_name: String,
    /// The kubelet's device-plugin directory, where both sockets live.
    pub socket_dir: PathBuf,
    /// The plugin's socket name in that directory.
    pub endpoint: String,
    /// Interfaces whose shares are advertised.
    pub netdevs: Vec<NetdevPool>,
    /// Device IDs per interface: how many containers may use it at once.
    pub devices_per_netdev: usize,
    /// Host directory holding the drop-in `libibverbs.so.1` and `librdmacm.so.1`.
    pub lib_dir: PathBuf,
    /// Where containers see that directory (read-only), and their `LD_LIBRARY_PATH`.
    pub container_lib_dir: PathBuf,
    /// CDI kind (`softhca.io/rdma`): also answer a CDI device `<kind>=<interface>`.
    pub cdi_kind: Option<String>,
    /// Where to write the CDI spec of that kind (`/etc/cdi`, `/var/run/cdi`).
    pub cdi_spec_dir: Option<PathBuf>,
    /// Where the allocations file is written.
    pub run_dir: PathBuf,
    /// Root of the sysfs tree read for NUMA nodes and link state.
    pub sysfs_root: PathBuf,
    /// How often interface health is checked.
    pub health_interval: Duration,
}

impl PluginConfig {
    /// Checks what the kubelet would reject later, with a message naming the option.
    pub fn validate(&self) -> Result<(), PluginError> {
        let (domain, name) = self.resource_name.split_once('/').unwrap_or(("", ""));
        if domain.is_empty() || name.is_empty() || domain.starts_with("kubernetes.io") {
            return Err(PluginError::Config(format!(
                "--resource-name {:?} is not <domain>/<name> outside kubernetes.io",
                self.resource_name
            )));
        }
        if self.netdevs.is_empty() {
            return Err(PluginError::Config(
                "no interface to advertise (--netdev)".into(),
            ));
        }
        if self.devices_per_netdev == 0 {
            return Err(PluginError::Config(
                "--devices-per-netdev must be at least 1".into(),
            ));
        }
        if self.cdi_spec_dir.is_some() && self.cdi_kind.is_none() {
            return Err(PluginError::Config(
                "--cdi-spec-dir needs --cdi-kind".into(),
            ));
        }
        if self.endpoint.contains('/') || self.endpoint == KUBELET_SOCKET {
            return Err(PluginError::Config(format!(
                "--endpoint {:?} must be a plain socket name other than {KUBELET_SOCKET}",
                self.endpoint
            )));
        }
        Ok(())
    }

    /// The kubelet's registration socket.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.socket_dir.join(KUBELET_SOCKET)
    }

    /// The plugin's socket.
    pub fn plugin_socket(&self) -> PathBuf {
        self.socket_dir.join(&self.endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_pools() {
        let p = NetdevPool::parse("eth1:net1").unwrap();
        assert_eq!((p.host.as_str(), p.container.as_str()), ("eth1", "net1"));
        assert_eq!(NetdevPool::parse("eth0").unwrap().container, "eth0");
        for bad in ["", ":net1", "eth0:", "a/b", "averyveryverylongname"] {
            assert!(NetdevPool::parse(bad).is_err(), "{bad}");
        }
    }
}
