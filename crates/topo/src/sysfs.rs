//! Reading the sysfs files below a root directory.

use std::path::{Component, Path, PathBuf};

use crate::{single_node, CpuSet, Endpoint, Kind, NumaNode, TopoError};

/// Display controllers of baseboard management controllers (ASPEED, Matrox G200):
/// the server's console, not a GPU anyone computes on.
const BMC_VGA_VENDORS: &[u32] = &[0x1a03, 0x102b];

/// How many `lower_*` links to follow (VLAN on a bond on a NIC is 2).
const MAX_LOWER_DEPTH: usize = 4;

pub(crate) struct Sysfs {
    root: PathBuf,
}

/// `pci0000:04`: a PCI host bridge (root bus) directory.
fn is_pci_root(s: &str) -> bool {
    s.strip_prefix("pci")
        .is_some_and(|r| r.len() == 7 && r.as_bytes()[4] == b':')
}

/// `0000:06:01.0`: a PCI function directory.
fn is_pci_function(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

impl Sysfs {
    pub(crate) fn new(root: &Path) -> Sysfs {
        Sysfs {
            root: root.to_path_buf(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    /// A file's contents, trimmed; `None` when it does not exist.
    fn read_opt(&self, p: &Path) -> Option<String> {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn read(&self, rel: &str) -> Result<String, TopoError> {
        let p = self.path(rel);
        std::fs::read_to_string(&p)
            .map(|s| s.trim().to_string())
            .map_err(|source| TopoError::Io {
                path: p.display().to_string(),
                source,
            })
    }

    fn list(&self, rel: &str) -> Result<Vec<String>, TopoError> {
        let p = self.path(rel);
        let rd = match std::fs::read_dir(&p) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(TopoError::Io {
                    path: p.display().to_string(),
                    source,
                })
            }
        };
        let mut v: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        v.sort();
        Ok(v)
    }

    pub(crate) fn online_cpus(&self) -> Result<CpuSet, TopoError> {
        CpuSet::parse_list(&self.read("sys/devices/system/cpu/online")?)
    }

    /// Online nodes with their CPUs and SLIT rows; a kernel without NUMA has no
    /// `node` directory and gets one node 0 holding every CPU.
    pub(crate) fn numa_nodes(&self, online: &CpuSet) -> Result<Vec<NumaNode>, TopoError> {
        let Some(list) = self.read_opt(&self.path("sys/devices/system/node/online")) else {
            return Ok(vec![NumaNode {
                id: 0,
                cpus: online.clone(),
                distances: vec![10],
            }]);
        };
        let mut nodes = Vec::new();
        for id in CpuSet::parse_list(&list)?.iter() {
            let dir = format!("sys/devices/system/node/node{id}");
            let cpus = CpuSet::parse_list(&self.read(&format!("{dir}/cpulist"))?)?;
            let distances = self
                .read(&format!("{dir}/distance"))?
                .split_whitespace()
                .map(|d| d.parse::<u32>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| TopoError::Parse(format!("{dir}/distance is not a SLIT row")))?;
            nodes.push(NumaNode {
                id,
                cpus: cpus.intersection(online),
                distances,
            });
        }
        Ok(nodes)
    }

    /// `rel` with every link resolved, as a path below the root (`sys/devices/...`).
    fn resolve(&self, rel: &str) -> Option<PathBuf> {
        let root = std::fs::canonicalize(&self.root).ok()?;
        let real = std::fs::canonicalize(self.path(rel)).ok()?;
        real.strip_prefix(&root).ok().map(Path::to_path_buf)
    }

    /// The PCI path of a resolved device directory: the host bridge, each bridge and
    /// the function nearest the device (a virtio device sits below its function).
    fn pci_path(dev: &Path) -> Vec<String> {
        let parts: Vec<String> = dev
            .components()
            .filter_map(|c| match c {
                Component::Normal(s) => s.to_str().map(str::to_string),
                _ => None,
            })
            .skip_while(|c| !is_pci_root(c))
            .collect();
        match parts.first() {
            Some(_) => {
                let n = 1 + parts[1..].iter().take_while(|c| is_pci_function(c)).count();
                parts[..n].to_vec()
            }
            None => Vec::new(),
        }
    }

    /// An endpoint placed at PCI path `path`, with the NUMA node and local CPUs of the
    /// function that ends it.
    fn placed(
        &self,
        name: String,
        kind: Kind,
        path: Vec<String>,
        online: &CpuSet,
        nodes: &[NumaNode],
    ) -> Endpoint {
        let func = path.last().filter(|c| is_pci_function(c)).cloned();
        let dir = self.path(&format!("sys/devices/{}", path.join("/")));
        let numa = func
            .as_ref()
            .and_then(|_| self.read_opt(&dir.join("numa_node")))
            .and_then(|n| n.parse::<i64>().ok())
            .and_then(|n| usize::try_from(n).ok())
            .or_else(|| single_node(nodes));
        let cpus = func
            .as_ref()
            .and_then(|_| self.read_opt(&dir.join("local_cpulist")))
            .and_then(|l| CpuSet::parse_list(&l).ok())
            .map(|c| c.intersection(online))
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| online.clone());
        Endpoint {
            name,
            kind,
            is_virtual: func.is_none(),
            pci: func,
            pci_path: if path.len() > 1 { path } else { Vec::new() },
            numa,
            cpus,
            netdev: None,
        }
    }

    pub(crate) fn netdev_names(&self) -> Result<Vec<String>, TopoError> {
        self.list("sys/class/net")
    }

    /// Interface `name`: its PCI function through `device`, else through its first
    /// `lower_*` interface (VLAN, macvlan, bond), else virtual.
    pub(crate) fn netdev(
        &self,
        name: &str,
        online: &CpuSet,
        nodes: &[NumaNode],
    ) -> Result<Endpoint, TopoError> {
        let mut cur = name.to_string();
        for _ in 0..=MAX_LOWER_DEPTH {
            let dir = format!("sys/class/net/{cur}");
            if self.resolve(&dir).is_none() {
                return Err(TopoError::NoInterface(cur));
            }
            if let Some(dev) = self.resolve(&format!("{dir}/device")) {
                let mut e =
                    self.placed(name.into(), Kind::Net, Self::pci_path(&dev), online, nodes);
                e.netdev = (cur != name).then_some(cur);
                return Ok(e);
            }
            let lower = self
                .list(&dir)?
                .into_iter()
                .find_map(|f| f.strip_prefix("lower_").map(str::to_string));
            match lower {
                Some(l) => cur = l,
                None => break,
            }
        }
        let mut e = self.placed(name.into(), Kind::Net, Vec::new(), online, nodes);
        e.netdev = (cur != name).then_some(cur);
        Ok(e)
    }

    /// GPUs: PCI functions of class 0x03 (display, 3D), but not a BMC's console.
    pub(crate) fn pci_class_endpoints(
        &self,
        online: &CpuSet,
        nodes: &[NumaNode],
    ) -> Result<Vec<Endpoint>, TopoError> {
        let mut out = Vec::new();
        for addr in self.list("sys/bus/pci/devices")? {
            let dir = self.path(&format!("sys/bus/pci/devices/{addr}"));
            let hex = |f: &str| {
                self.read_opt(&dir.join(f))
                    .and_then(|v| u32::from_str_radix(v.trim_start_matches("0x"), 16).ok())
            };
            let (Some(class), Some(vendor)) = (hex("class"), hex("vendor")) else {
                continue;
            };
            if class >> 16 != 0x03 || BMC_VGA_VENDORS.contains(&vendor) {
                continue;
            }
            let Some(dev) = self.resolve(&format!("sys/bus/pci/devices/{addr}")) else {
                continue;
            };
            let name = format!("GPU{}", out.len());
            out.push(self.placed(name, Kind::Gpu, Self::pci_path(&dev), online, nodes));
        }
        Ok(out)
    }

    /// NVMe controllers (`/sys/class/nvme`); fabrics controllers have no PCI function.
    pub(crate) fn nvme_endpoints(
        &self,
        online: &CpuSet,
        nodes: &[NumaNode],
    ) -> Result<Vec<Endpoint>, TopoError> {
        let mut out = Vec::new();
        for name in self.list("sys/class/nvme")? {
            let path = self
                .resolve(&format!("sys/class/nvme/{name}/device"))
                .map(|d| Self::pci_path(&d))
                .unwrap_or_default();
            out.push(self.placed(name, Kind::Nvme, path, online, nodes));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_paths() {
        let p = Path::new("sys/devices/pci0000:04/0000:04:00.0/0000:05:01.0/virtio3/net/eth2");
        assert_eq!(
            Sysfs::pci_path(p),
            ["pci0000:04", "0000:04:00.0", "0000:05:01.0"]
        );
        assert!(Sysfs::pci_path(Path::new("sys/devices/virtual/net/lo")).is_empty());
        assert!(is_pci_function("0000:06:01.0") && !is_pci_function("virtio3"));
        assert!(is_pci_root("pci0000:00") && !is_pci_root("pci_bus"));
    }
}
