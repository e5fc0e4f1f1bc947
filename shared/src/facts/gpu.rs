//! GPU facts: devices, the link matrix and P2P status between pairs.

use super::gpu_health::GpuHealth;
use super::link::LinkKind;
use serde::{Deserialize, Serialize};

/// PCI id NVML gives for an NVLink whose remote end is not visible (an NVSwitch seen
/// from a VM or container).
pub const INVISIBLE_REMOTE: &str = "FFFFFFFF:FF:FF.0";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuSource {
    /// Probed through NVML.
    Nvml,
    /// Links read from a `nvidia-smi topo -m` capture.
    NvidiaSmiTopo,
    /// No GPU information (no driver, or NVML failed: see `nvml_error`).
    #[default]
    None,
}

impl std::fmt::Display for GpuSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GpuSource::Nvml => "NVML",
            GpuSource::NvidiaSmiTopo => "nvidia-smi topo capture",
            GpuSource::None => "none",
        })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuFacts {
    pub source: GpuSource,
    /// Why NVML gave nothing (library missing, init failed); a fact, not an error.
    pub nvml_error: Option<String>,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub devices: Vec<Gpu>,
    /// `links[i][j]`: how GPU i reaches GPU j, in GPU index order.
    pub links: Vec<Vec<LinkKind>>,
    /// P2P read/write status for each unordered pair (i < j).
    pub p2p: Vec<P2pPair>,
    /// /dev/nvidia* nodes present.
    pub device_nodes: Vec<String>,
}

impl GpuFacts {
    pub fn count(&self) -> usize {
        self.devices.len().max(self.links.len())
    }

    pub fn link(&self, a: usize, b: usize) -> Option<LinkKind> {
        self.links.get(a)?.get(b).copied()
    }

    /// Every distinct pair (i < j) with its link.
    pub fn pairs(&self) -> impl Iterator<Item = (usize, usize, LinkKind)> + '_ {
        let n = self.links.len();
        (0..n).flat_map(move |a| ((a + 1)..n).filter_map(move |b| Some((a, b, self.link(a, b)?))))
    }

    pub fn p2p(&self, a: usize, b: usize) -> Option<&P2pPair> {
        let (a, b) = (a.min(b), a.max(b));
        self.p2p.iter().find(|p| p.a == a && p.b == b)
    }

    /// NVLink-connected pairs whose NVML P2P read/write is not OK: NCCL aborts on them.
    pub fn nvlink_pairs_without_p2p(&self) -> Vec<(usize, usize, LinkKind)> {
        self.pairs()
            .filter(|(a, b, l)| l.is_nvlink() && !self.p2p_ok(*a, *b))
            .collect()
    }

    /// Whether P2P read and write are both OK, unknown counting as OK (no evidence).
    pub fn p2p_ok(&self, a: usize, b: usize) -> bool {
        self.p2p(a, b)
            .is_none_or(|p| p.read.ok_or_unknown() && p.write.ok_or_unknown())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Gpu {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    /// NVML's form: 00000000:18:00.0.
    pub pci_bus_id: String,
    pub mig_enabled: Option<bool>,
    /// "default", "exclusive-process", "prohibited".
    pub compute_mode: Option<String>,
    pub persistence_mode: Option<bool>,
    pub numa_node: Option<u32>,
    /// CPUs near this GPU (NVML's ideal affinity).
    pub cpu_affinity: Vec<u32>,
    pub fabric: Option<FabricState>,
    pub nvlink: NvlinkInfo,
    pub health: GpuHealth,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NvlinkInfo {
    pub active_links: u32,
    /// Remote PCI bus id of each active link (INVISIBLE_REMOTE for a hidden NVSwitch).
    pub remotes: Vec<String>,
}

/// nvmlDeviceGetGpuFabricInfoV's state: whether the NVSwitch fabric manager has
/// brought this GPU into the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricState {
    NotSupported,
    NotStarted,
    InProgress,
    Completed,
}

impl FabricState {
    pub fn from_nvml(state: u8) -> Option<Self> {
        Some(match state {
            0 => FabricState::NotSupported,
            1 => FabricState::NotStarted,
            2 => FabricState::InProgress,
            3 => FabricState::Completed,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum P2pState {
    Ok,
    ChipsetNotSupported,
    GpuNotSupported,
    TopologyNotSupported,
    DisabledByRegkey,
    NotSupported,
    #[default]
    Unknown,
}

impl P2pState {
    /// From nvidia-smi's `topo -p2p` legend (OK, CNS, GNS, TNS, NS, U).
    pub fn from_smi(code: &str) -> Option<Self> {
        Some(match code.trim() {
            "OK" => P2pState::Ok,
            "CNS" => P2pState::ChipsetNotSupported,
            "GNS" => P2pState::GpuNotSupported,
            "TNS" => P2pState::TopologyNotSupported,
            "NS" => P2pState::NotSupported,
            "U" => P2pState::Unknown,
            _ => return None,
        })
    }

    /// From NVML's nvmlGpuP2PStatus_t.
    pub fn from_nvml(status: u32) -> Self {
        match status {
            0 => P2pState::Ok,
            1 | 2 => P2pState::ChipsetNotSupported,
            3 => P2pState::GpuNotSupported,
            4 => P2pState::TopologyNotSupported,
            5 => P2pState::DisabledByRegkey,
            6 => P2pState::NotSupported,
            _ => P2pState::Unknown,
        }
    }

    pub fn ok_or_unknown(self) -> bool {
        matches!(self, P2pState::Ok | P2pState::Unknown)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct P2pPair {
    pub a: usize,
    pub b: usize,
    pub read: P2pState,
    pub write: P2pState,
}

/// What NVML says of one pair before the links are classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcieAncestor {
    Internal,
    Single,
    Multiple,
    HostBridge,
    Node,
    System,
}

impl PcieAncestor {
    pub fn link(self) -> LinkKind {
        match self {
            PcieAncestor::Internal | PcieAncestor::Single => LinkKind::Pix,
            PcieAncestor::Multiple => LinkKind::Pxb,
            PcieAncestor::HostBridge => LinkKind::Phb,
            PcieAncestor::Node => LinkKind::Node,
            PcieAncestor::System => LinkKind::Sys,
        }
    }
}

/// The link between two GPUs from their NVLink remotes and PCIe common ancestor, as
/// nvidia-smi and NCCL classify it: links whose remote is the peer count directly;
/// when both GPUs have links into something that is not a visible GPU (an NVSwitch,
/// invisible from a VM/container), they are NV<min(links)>-connected through it.
pub fn classify_link(
    a: &Gpu,
    b: &Gpu,
    gpu_bus_ids: &[String],
    ancestor: Option<PcieAncestor>,
) -> LinkKind {
    let direct = a
        .nvlink
        .remotes
        .iter()
        .filter(|r| same_bus(r, &b.pci_bus_id))
        .count() as u32;
    if direct > 0 {
        return LinkKind::NvLink(direct);
    }
    let to_switch = |g: &Gpu| {
        g.nvlink
            .remotes
            .iter()
            .filter(|r| !gpu_bus_ids.iter().any(|id| same_bus(r, id)))
            .count() as u32
    };
    let (sa, sb) = (to_switch(a), to_switch(b));
    if sa > 0 && sb > 0 {
        return LinkKind::NvLink(sa.min(sb));
    }
    ancestor.map_or(LinkKind::Sys, PcieAncestor::link)
}

/// Compares PCI bus ids ignoring the domain width (NVML: 00000000:18:00.0, sysfs:
/// 0000:18:00.0) and case.
pub fn same_bus(x: &str, y: &str) -> bool {
    fn norm(s: &str) -> String {
        let s = s.to_ascii_lowercase();
        match s.split_once(':') {
            Some((dom, rest)) => format!("{:0>8}:{rest}", dom.trim_start_matches('0')),
            None => s,
        }
    }
    norm(x) == norm(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(bus: &str, remotes: &[&str]) -> Gpu {
        Gpu {
            pci_bus_id: bus.into(),
            nvlink: NvlinkInfo {
                active_links: remotes.len() as u32,
                remotes: remotes.iter().map(|s| s.to_string()).collect(),
            },
            ..Default::default()
        }
    }

    #[test]
    fn hidden_nvswitch_pairs_are_nv18_like_nvidia_smi() {
        // Measured on the 4x H200 host: every remote is FFFFFFFF:FF:FF.0, ancestor HOSTBRIDGE.
        let a = gpu("00000000:00:06.0", &[INVISIBLE_REMOTE; 18]);
        let b = gpu("00000000:00:07.0", &[INVISIBLE_REMOTE; 18]);
        let ids = vec![a.pci_bus_id.clone(), b.pci_bus_id.clone()];
        assert_eq!(
            classify_link(&a, &b, &ids, Some(PcieAncestor::HostBridge)),
            LinkKind::NvLink(18)
        );
    }

    #[test]
    fn direct_links_count_only_those_to_the_peer() {
        let a = gpu(
            "0000:01:00.0",
            &["0000:02:00.0", "0000:02:00.0", "0000:03:00.0"],
        );
        let b = gpu("0000:02:00.0", &["0000:01:00.0", "0000:01:00.0"]);
        let c = gpu("0000:04:00.0", &[]);
        let ids: Vec<String> = [
            "0000:01:00.0",
            "0000:02:00.0",
            "0000:03:00.0",
            "0000:04:00.0",
        ]
        .map(String::from)
        .into();
        assert_eq!(classify_link(&a, &b, &ids, None), LinkKind::NvLink(2));
        assert_eq!(
            classify_link(&a, &c, &ids, Some(PcieAncestor::Node)),
            LinkKind::Node
        );
    }

    #[test]
    fn bus_ids_compare_across_domain_widths() {
        assert!(same_bus("00000000:18:00.0", "0000:18:00.0"));
        assert!(!same_bus("00000000:18:00.0", "0000:19:00.0"));
    }

    #[test]
    fn unknown_p2p_counts_as_ok_but_not_supported_does_not() {
        let facts = GpuFacts {
            links: vec![
                vec![LinkKind::Own, LinkKind::NvLink(4)],
                vec![LinkKind::NvLink(4), LinkKind::Own],
            ],
            p2p: vec![P2pPair {
                a: 0,
                b: 1,
                read: P2pState::Ok,
                write: P2pState::NotSupported,
            }],
            ..Default::default()
        };
        assert!(!facts.p2p_ok(1, 0));
        let unknown = GpuFacts {
            p2p: vec![],
            ..facts
        };
        assert!(unknown.p2p_ok(0, 1));
    }
}
