//! `toporun preflight`: is this container fit to run a distributed PyTorch job?
//! Every check is a pure function of the host facts and the options.

mod bandwidth;
mod caps;
pub mod entrypoint;
mod gpu;
mod gpu_health;
mod instance;
mod ipc;
mod net;
mod options;
mod rdma;
mod shm;

use crate::facts::HostFacts;
use crate::finding::Finding;
pub use bandwidth::check as bandwidth_findings;
pub use instance::instance_type;
pub use options::{PreflightOptions, Requirement, DEFAULT_MIN_SHM};

/// All findings, in a stable order.
pub fn run(facts: &HostFacts, opts: &PreflightOptions) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(shm::check(facts, opts));
    out.extend(ipc::check(facts));
    out.extend(caps::check(facts));
    out.extend(gpu::check(facts, opts));
    out.extend(gpu_health::check(facts));
    out.extend(bandwidth::check(facts));
    out.extend(rdma::check(facts, opts));
    out.extend(instance::check(facts));
    out.push(net::check(facts));
    out.extend(crate::nccl_env_check::check_as_nccl_sees(
        facts,
        &facts.container.env,
    ));
    out
}

#[cfg(test)]
pub(crate) mod testutil {
    use crate::facts::*;

    /// GPUs a and b report no P2P (both directions).
    pub fn without_p2p(f: &mut HostFacts, a: usize, b: usize) {
        f.gpus.p2p = vec![P2pPair {
            a,
            b,
            read: P2pState::NotSupported,
            write: P2pState::NotSupported,
        }];
    }

    /// A healthy 4-GPU NVLink host, the base the unit tests break one fact at a time.
    pub fn healthy() -> HostFacts {
        let n = 4;
        let mut f = HostFacts {
            schema: FACTS_SCHEMA,
            ..Default::default()
        };
        f.container.shm = Some(ShmFacts {
            total_bytes: 64 << 30,
            free_bytes: 64 << 30,
            fs_type: Some("tmpfs".into()),
            dev: None,
        });
        f.container.caps.effective = (1 << cap::IPC_LOCK) | (1 << cap::SYS_NICE);
        f.container.rlimits.memlock = Limit {
            soft: None,
            hard: None,
        };
        f.container.namespaces.insert(
            "ipc".into(),
            Namespace {
                inode: 4026532000,
                initial: Some(false),
            },
        );
        f.gpus.source = GpuSource::Nvml;
        f.gpus.devices = (0..n)
            .map(|i| Gpu {
                index: i,
                fabric: Some(FabricState::Completed),
                ..Default::default()
            })
            .collect();
        f.gpus.links = LinkKind::mesh(n as usize, LinkKind::NvLink(18));
        f.gpus.device_nodes = [
            "/dev/nvidiactl",
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidia2",
            "/dev/nvidia3",
        ]
        .map(String::from)
        .into();
        f.nics = vec![Nic {
            name: "eth0".into(),
            state: "up".into(),
            default_route: true,
            addresses: vec![NicAddress {
                addr: "10.0.0.5".into(),
                prefix_len: 24,
            }],
            ..Default::default()
        }];
        f
    }

    pub fn env(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    pub fn ids(findings: &[crate::finding::Finding], sev: crate::finding::Severity) -> Vec<String> {
        findings
            .iter()
            .filter(|f| f.severity == sev)
            .map(|f| f.id.to_string())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;
    use crate::finding::Severity;

    #[test]
    fn healthy_host_has_no_error_or_warning() {
        let findings = run(&healthy(), &PreflightOptions::default());
        assert!(ids(&findings, Severity::Error).is_empty(), "{findings:#?}");
        assert!(
            ids(&findings, Severity::Warning).is_empty(),
            "{findings:#?}"
        );
        for id in [
            "shm.size",
            "ipc.namespace",
            "gpu.visible",
            "gpu.p2p",
            "gpu.fabric",
            "net.interface",
        ] {
            assert!(findings.iter().any(|f| f.id == id), "missing {id}");
        }
    }
}
