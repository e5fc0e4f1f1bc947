//! Live probing: the machine and container as `HostFacts`.

pub mod cloud_metadata;
pub mod container;
pub mod entrypoint;
pub mod fqdn;
pub mod gpu;
pub mod gpu_clocks;
pub mod gpu_events;
pub mod link_bandwidth;
pub mod memory_cgroup;
mod net;
pub mod nvml_session;
pub mod open_writes;
pub mod platform;
pub mod port_owner;
pub mod preemption_notice;
pub mod rank_usage;
mod rdma;

pub use gpu::{GpuProbe, GpuProcess, NvmlProbe};

use crate::paths::Root;
use toporun_shared::facts::{GpuFacts, HostFacts, FACTS_SCHEMA};

/// Probes everything. GPU facts come from `gpus` (NVML live, a fixture in tests),
/// read on a thread of their own while the rest is: NVML takes most of the time on
/// a GPU host (70 ms of a 75 ms launch on 2x H100).
pub fn probe_host(
    root: &Root,
    gpus: &(dyn GpuProbe + Sync),
    env: impl Iterator<Item = (String, String)>,
) -> HostFacts {
    let env: Vec<(String, String)> = env.collect();
    std::thread::scope(|s| {
        let gpu_facts = s.spawn(|| gpus.probe());
        let python = platform::rank_python(root, &env);
        let mut facts = HostFacts {
            schema: FACTS_SCHEMA,
            source: format!("probe (toporun {})", env!("CARGO_PKG_VERSION")),
            container: container::probe(root, env.iter().cloned()),
            gpus: Default::default(),
            nics: net::probe(root),
            rdma: rdma::probe(root),
            platform: platform::probe(root, python.as_deref(), &nccl_conf_files(&env)),
            bandwidth: None,
            cloud: None,
        };
        facts.gpus = gpu_facts.join().unwrap_or_else(|_| GpuFacts {
            nvml_error: Some("the GPU probe failed".into()),
            ..Default::default()
        });
        facts.gpus.device_nodes = gpu::device_nodes(root);
        facts
    })
}

/// NCCL's config files for this process's user (NCCL looks its home up by uid); a
/// relative NCCL_CONF_FILE from the working directory the ranks start in (this one).
fn nccl_conf_files(env: &[(String, String)]) -> Vec<std::path::PathBuf> {
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten();
    let files = platform::nccl_conf_files(env, user.as_ref().map(|u| u.dir.as_path()));
    let cwd = std::env::current_dir().unwrap_or_default();
    files.into_iter().map(|f| cwd.join(f)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use toporun_shared::facts::{GpuFacts, GpuSource, PcieLink, RemappedRows, ThrottleReason};
    use toporun_shared::finding::Severity;

    /// GPU facts of two healthy H100s, as NVML gives them.
    fn two_gpus() -> GpuFacts {
        let mut g = GpuFacts {
            source: GpuSource::Nvml,
            ..Default::default()
        };
        for i in 0..2 {
            let mut d = toporun_shared::facts::Gpu {
                index: i,
                mig_enabled: Some(false),
                persistence_mode: Some(true),
                ..Default::default()
            };
            d.health.remapped_rows = Some(RemappedRows::default());
            d.health.ecc_uncorrected_volatile = Some(0);
            d.health.compute_processes = Some(0);
            d.health.pcie = Some(PcieLink {
                gen: 5,
                max_gen: 5,
                width: 16,
                max_width: 16,
            });
            g.devices.push(d);
        }
        g
    }

    /// Each fault injected through the probe trait reaches preflight as its finding.
    #[test]
    fn gpu_faults_given_by_the_probe_become_findings() {
        type Inject = fn(&mut GpuFacts);
        let faults: [(Inject, &str, Severity); 6] = [
            (
                |g| g.devices[1].health.remapped_rows.as_mut().unwrap().failed = true,
                "gpu.memory",
                Severity::Error,
            ),
            (
                |g| g.devices[0].health.ecc_uncorrected_volatile = Some(1),
                "gpu.memory",
                Severity::Error,
            ),
            (
                |g| g.devices[1].health.pcie.as_mut().unwrap().width = 4,
                "gpu.pcie",
                Severity::Warning,
            ),
            (
                |g| g.devices[0].health.throttle = vec![ThrottleReason::HwPowerBrake],
                "gpu.throttle",
                Severity::Warning,
            ),
            (
                |g| g.devices[1].mig_enabled = Some(true),
                "gpu.mode",
                Severity::Error,
            ),
            (
                |g| g.devices[0].health.compute_processes = Some(2),
                "gpu.processes",
                Severity::Warning,
            ),
        ];
        let dir = tempfile::tempdir().unwrap();
        let root = Root::at(dir.path());
        let clean = probe_host(&root, &gpu::FixedGpus(two_gpus()), std::iter::empty());
        let opts = toporun_shared::preflight::PreflightOptions::default();
        let before = toporun_shared::preflight::run(&clean, &opts);
        for (inject, id, severity) in faults {
            assert_eq!(
                before.iter().find(|f| f.id == id).unwrap().severity,
                Severity::Ok,
                "{id} before the fault"
            );
            let mut g = two_gpus();
            inject(&mut g);
            let facts = probe_host(&root, &gpu::FixedGpus(g), std::iter::empty());
            let after = toporun_shared::preflight::run(&facts, &opts);
            let f = after.iter().find(|f| f.id == id).unwrap();
            assert_eq!(f.severity, severity, "{f:?}");
            assert!(f.remedy.is_some(), "{f:?}");
        }
    }
}
