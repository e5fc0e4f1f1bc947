//! Live probing: the machine and container as `HostFacts`.

mod container;
pub mod fqdn;
pub mod gpu;
mod net;
pub mod platform;
mod rdma;

pub use gpu::{GpuProbe, NvmlProbe};

use crate::paths::Root;
use toporun_shared::facts::{HostFacts, FACTS_SCHEMA};

/// Probes everything. GPU facts come from `gpus` (NVML live, a fixture in tests).
pub fn probe_host(
    root: &Root,
    gpus: &dyn GpuProbe,
    env: impl Iterator<Item = (String, String)>,
) -> HostFacts {
    let env: Vec<(String, String)> = env.collect();
    let python = platform::rank_python(root, &env);
    let mut facts = HostFacts {
        schema: FACTS_SCHEMA,
        source: format!("probe (toporun {})", env!("CARGO_PKG_VERSION")),
        container: container::probe(root, env.into_iter()),
        gpus: gpus.probe(),
        nics: net::probe(root),
        rdma: rdma::probe(root),
        platform: platform::probe(root, python.as_deref()),
    };
    facts.gpus.device_nodes = gpu::device_nodes(root);
    facts
}
