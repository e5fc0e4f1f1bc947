//! Host facts: everything toporun knows about the machine and container it runs in.
//!
//! Facts are plain data. The agent probes them live; `--facts FILE` replays a captured
//! copy; every decision (findings, NCCL plan, rank layout) is a pure function of them.

mod bandwidth;
mod gpu;
mod gpu_health;
mod link;

pub use bandwidth::{HostCopy, LinkBandwidth, PairCopy};
pub use gpu::{
    classify_link, same_bus, FabricState, Gpu, GpuFacts, GpuSource, NvlinkInfo, P2pPair, P2pState,
    PcieAncestor, INVISIBLE_REMOTE,
};
pub use gpu_health::{GpuHealth, PcieLink, RemappedRows, ThrottleReason};
pub use link::{LinkKind, LinkParseError};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the facts file layout; bumped on incompatible changes.
pub const FACTS_SCHEMA: u32 = 1;

/// GPUs one host can have, with room to spare (8 today, 72 in a whole NVL72 rack);
/// a bound so that a forged capture cannot make quadratic work unbounded.
pub const MAX_GPUS: usize = 128;

/// Largest facts file read (a real one is tens of KB).
pub const MAX_FACTS_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostFacts {
    pub schema: u32,
    /// Where these facts came from: "probe", "fixture: ...", and the toporun version.
    pub source: String,
    pub container: ContainerFacts,
    pub gpus: GpuFacts,
    pub nics: Vec<Nic>,
    pub rdma: Vec<RdmaDevice>,
    pub platform: PlatformFacts,
    /// Link bandwidth measured by `preflight --measure`; absent when not asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<LinkBandwidth>,
    /// The instance as the cloud's metadata service names it; absent off-cloud, or
    /// when not asked (`--no-metadata`, a launch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud: Option<CloudInstance>,
}

/// What a cloud's metadata service said about this machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CloudInstance {
    /// "aws", "gcp" or "azure".
    pub provider: String,
    pub instance_type: String,
    /// The request that answered: "AWS IMDSv2 (token) http://169.254.169.254".
    pub source: String,
    pub millis: u64,
}

impl HostFacts {
    /// Parses a facts file, checking its schema version.
    pub fn from_json(text: &str) -> Result<Self, FactsError> {
        let facts: HostFacts = serde_json::from_str(text).map_err(FactsError::Json)?;
        if facts.schema != FACTS_SCHEMA {
            return Err(FactsError::Schema(facts.schema));
        }
        if facts.gpus.devices.len() > MAX_GPUS {
            return Err(FactsError::TooMany(format!(
                "{} GPUs (at most {MAX_GPUS} per host)",
                facts.gpus.devices.len()
            )));
        }
        if facts.container.cpu_count > crate::cpulist::MAX_CPU + 1 {
            return Err(FactsError::TooMany(format!(
                "cpu_count {} (at most {})",
                facts.container.cpu_count,
                crate::cpulist::MAX_CPU + 1
            )));
        }
        Ok(facts)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("facts serialize to JSON")
    }

    /// A variable from the environment toporun was started with, as probed.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.container.env.get(name).map(String::as_str)
    }

    pub fn has_rdma(&self) -> bool {
        !self.rdma.is_empty()
    }

    pub fn efa_devices(&self) -> impl Iterator<Item = &RdmaDevice> {
        self.rdma.iter().filter(|d| d.kind == RdmaKind::Efa)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    #[error("not a valid toporun facts file: {0}")]
    Json(serde_json::Error),
    #[error("facts file describes an impossible host: {0}")]
    TooMany(String),
    #[error("facts file has schema {0}, this toporun reads schema {FACTS_SCHEMA}; capture it again with `toporun probe --format json`")]
    Schema(u32),
}

/// One Linux namespace of the toporun process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Namespace {
    pub inode: u64,
    /// Whether the inode is the kernel's initial one (host namespace); None where the
    /// kernel has no fixed number for this kind (net and mnt before Linux 6.18).
    pub initial: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerFacts {
    /// Namespaces by kind: ipc, pid, net, uts, mnt, cgroup, user.
    pub namespaces: BTreeMap<String, Namespace>,
    pub pid: u32,
    pub is_pid1: bool,
    /// `comm` of PID 1 (e.g. "pause" with shareProcessNamespace).
    pub pid1_comm: Option<String>,
    pub shm: Option<ShmFacts>,
    pub caps: CapsFacts,
    pub rlimits: Rlimits,
    pub cgroup_memory_limit: Option<u64>,
    pub boot_id: Option<String>,
    /// Seccomp mode from /proc/self/status (0 none, 1 strict, 2 filter).
    pub seccomp: Option<u32>,
    /// Whether the get_mempolicy syscall is allowed (NCCL's cuMem host allocations
    /// need it; Docker's default seccomp profile refuses it without CAP_SYS_NICE).
    pub get_mempolicy: Option<bool>,
    pub hostname: String,
    pub cpu_count: u32,
    pub cpu_affinity: Vec<u32>,
    /// CPUs sharing one L3 cache (core complexes), for --numa-binding=core-complex.
    pub l3_groups: Vec<Vec<u32>>,
    /// The environment variables that matter to a launch: NVIDIA_VISIBLE_DEVICES,
    /// CUDA_VISIBLE_DEVICES, NCCL_*, FI_*, PET_*, the torchrun contract's.
    pub env: BTreeMap<String, String>,
    /// Whether this runs in a Kubernetes pod (a service-account mount or
    /// KUBERNETES_SERVICE_HOST); None in captures made before toporun asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<bool>,
}

impl ContainerFacts {
    /// Findings speak of pods and pod specs unless toporun could tell this is no pod.
    pub fn maybe_pod(&self) -> bool {
        self.kubernetes != Some(false)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShmFacts {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// File system type from the mount table ("tmpfs"), if mounted.
    pub fs_type: Option<String>,
    /// Device number of the mount: equal on two nodes when they share one /dev/shm.
    pub dev: Option<u64>,
}

/// Capability bit numbers (linux/capability.h) used by the checks.
pub mod cap {
    pub const NET_ADMIN: u32 = 12;
    pub const IPC_LOCK: u32 = 14;
    pub const SYS_PTRACE: u32 = 19;
    pub const SYS_NICE: u32 = 23;
    pub const SYS_RESOURCE: u32 = 24;
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CapsFacts {
    /// Masks as in /proc/self/status (CapEff, CapPrm, CapBnd).
    pub effective: u64,
    pub permitted: u64,
    pub bounding: u64,
}

impl CapsFacts {
    pub fn has_effective(&self, bit: u32) -> bool {
        self.effective & (1u64 << bit) != 0
    }
}

/// A resource limit; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limit {
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rlimits {
    pub memlock: Limit,
    pub nofile: Limit,
    pub stack: Limit,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Nic {
    pub name: String,
    /// operstate: up, down, unknown...
    pub state: String,
    pub speed_mbps: Option<u64>,
    pub mtu: Option<u32>,
    pub mac: Option<String>,
    pub addresses: Vec<NicAddress>,
    pub default_route: bool,
    /// Virtual interfaces (lo, docker, veth, cni...) never carry NCCL traffic.
    pub virtual_iface: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NicAddress {
    /// Textual address ("10.0.0.5" or "fe80::1").
    pub addr: String,
    pub prefix_len: u8,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RdmaKind {
    Efa,
    Infiniband,
    Roce,
    #[default]
    Unknown,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RdmaPort {
    pub port: u32,
    /// "ACTIVE", "DOWN"... (the word of /sys/class/infiniband/<dev>/ports/<p>/state).
    pub state: String,
    pub link_layer: String,
    /// GID indices whose type is "RoCE v2".
    pub roce_v2_gid_indices: Vec<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RdmaDevice {
    pub name: String,
    pub kind: RdmaKind,
    pub pci_vendor: Option<String>,
    pub pci_device: Option<String>,
    pub ports: Vec<RdmaPort>,
    /// Its /dev/infiniband/uverbsN node, if one exists.
    pub uverbs: Option<String>,
    pub uverbs_openable: bool,
}

impl RdmaDevice {
    pub fn is_active(&self) -> bool {
        self.ports
            .iter()
            .any(|p| p.state.eq_ignore_ascii_case("ACTIVE"))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlatformFacts {
    /// DMI product name: the EC2 instance type (p4d.24xlarge) on AWS.
    pub product_name: Option<String>,
    pub sys_vendor: Option<String>,
    /// NCCL topology XML files found on disk (aws-ofi-nccl, Azure).
    pub topology_files: Vec<String>,
    /// aws-ofi-nccl plugin libraries found on disk.
    pub ofi_nccl_plugins: Vec<String>,
    pub nccl_version: Option<String>,
    /// Where the version was read: a libnccl.so.X.Y.Z name, or pip's nvidia-nccl-cu*.
    pub nccl_version_from: Option<String>,
    /// The system's libnccl.so.X.Y.Z where the ranks load another NCCL (pip's, which
    /// their torch requires): a second fact, never the one toporun states.
    pub nccl_on_disk: Option<String>,
    /// The ranks' torch (`torch-X.Y.Z.dist-info` beside their Python), where found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_version: Option<String>,
    /// The settings of NCCL's config files (NCCL_CONF_FILE or ~/.nccl.conf, then
    /// /etc/nccl.conf), NAME=VALUE as NCCL reads them, each name's value the first
    /// file's (NCCL applies them where the environment leaves a name unset).
    pub nccl_conf: BTreeMap<String, String>,
    /// Those files, where they exist, in NCCL's order.
    pub nccl_conf_files: Vec<String>,
    /// The file each of those settings comes from.
    pub nccl_conf_from: BTreeMap<String, String>,
}
