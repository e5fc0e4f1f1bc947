//! Link bandwidth measured by `preflight --measure`: copies between every GPU pair
//! and between each GPU and pinned host memory, timed with CUDA events.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkBandwidth {
    /// Why nothing (or not everything) was measured: no driver, a CUDA error.
    pub error: Option<String>,
    /// The CUDA driver's version as it reports it (12080 = 12.8).
    pub cuda_driver: Option<u32>,
    /// Bytes per copy between GPUs.
    pub buffer_bytes: u64,
    /// Bytes per copy between a GPU and pinned host memory (0: `buffer_bytes`, as
    /// measurements before this field).
    pub host_buffer_bytes: u64,
    /// Driver load, contexts on every GPU and buffers, in seconds.
    pub init_seconds: f64,
    /// Of which the driver's load and cuInit.
    pub driver_seconds: f64,
    /// Turning on peer access between the GPUs (the driver maps each peer's memory).
    pub peer_seconds: f64,
    /// All of it, initialisation included.
    pub seconds: f64,
    /// One entry per ordered pair (src, dst), in GPU index order (NVML's, as facts).
    pub pairs: Vec<PairCopy>,
    pub host: Vec<HostCopy>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairCopy {
    pub src: u32,
    pub dst: u32,
    /// GB/s (10^9 bytes per second).
    pub gbps: f64,
    /// Whether CUDA peer access was on (cuDeviceCanAccessPeer): off, the driver
    /// stages the copy through host memory.
    pub peer_access: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostCopy {
    pub gpu: u32,
    pub h2d_gbps: f64,
    pub d2h_gbps: f64,
    /// CPUs the pinned buffer was allocated from (the GPU's NUMA-near CPUs), as a list.
    pub cpus: String,
}
