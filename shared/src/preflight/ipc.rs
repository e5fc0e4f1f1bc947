//! `ipc.namespace`: CUDA IPC between ranks needs one IPC namespace. Inside one
//! container all local ranks share it; it matters when a host's ranks span pods.

use crate::facts::HostFacts;
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};

pub fn check(facts: &HostFacts) -> Option<Finding> {
    let ns = facts.container.namespaces.get("ipc")?;
    let gpus = facts.gpus.count();
    let f = |sev, s: &str| {
        Finding::new(FindingId::IpcNamespace, sev, s)
            .fact("ipc_inode", ns.inode)
            .fact("visible_gpus", gpus)
    };
    let pod = facts.container.maybe_pod();
    Some(match ns.initial {
        Some(true) if pod => f(Severity::Info, "host IPC namespace (hostIPC: true): ranks in other pods on this host can share CUDA IPC handles"),
        Some(true) => f(Severity::Info, "host IPC namespace (what a pod gets with hostIPC: true): ranks started anywhere on this host can share CUDA IPC handles"),
        _ if gpus == 1 => f(
            Severity::Warning,
            if pod {
                "private IPC namespace and a single GPU: this host's other ranks run in other pods, so NCCL cannot use CUDA IPC or /dev/shm between them and falls back to the network"
            } else {
                "private IPC namespace and a single GPU: this host's other ranks run in other containers, so NCCL cannot use CUDA IPC or /dev/shm between them and falls back to the network"
            },
        )
        .remedy(if pod {
            "run one pod per node with all its GPUs (nvidia.com/gpu: 8, --nproc-per-node=gpu); if per-GPU pods are required, set hostIPC: true"
        } else {
            "run one container per node with all its GPUs (docker run --gpus all, --nproc-per-node=gpu); if per-GPU containers are required, share one IPC namespace (docker run --ipc=host)"
        }),
        _ => f(Severity::Ok, "private IPC namespace: fine, all local ranks run in this container and share it"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Namespace;
    use crate::preflight::testutil::healthy;

    #[test]
    fn private_ipc_is_fine_with_all_gpus_here() {
        assert_eq!(check(&healthy()).unwrap().severity, Severity::Ok);
    }

    #[test]
    fn private_ipc_with_one_gpu_warns() {
        let mut f = healthy();
        f.gpus.devices.truncate(1);
        f.gpus.links = vec![vec![crate::facts::LinkKind::Own]];
        assert_eq!(check(&f).unwrap().severity, Severity::Warning);
    }

    #[test]
    fn host_ipc_is_reported() {
        let mut f = healthy();
        f.container.namespaces.insert(
            "ipc".into(),
            Namespace {
                inode: 4026531839,
                initial: Some(true),
            },
        );
        assert!(check(&f)
            .unwrap()
            .summary
            .contains("(hostIPC: true): ranks in other pods"));
        // Off Kubernetes: the fact first, the pod word only as a comparison.
        f.container.kubernetes = Some(false);
        let s = check(&f).unwrap().summary;
        assert!(
            s.starts_with("host IPC namespace (what a pod gets with hostIPC: true)"),
            "{s}"
        );
        assert!(!s.contains("other pods"), "{s}");
    }

    #[test]
    fn one_gpu_off_kubernetes_names_containers_and_docker() {
        let mut f = healthy();
        f.gpus.devices.truncate(1);
        f.gpus.links = vec![vec![crate::facts::LinkKind::Own]];
        f.container.kubernetes = Some(false);
        let w = check(&f).unwrap();
        assert!(w.summary.contains("other containers"), "{}", w.summary);
        assert!(w.remedy.unwrap().contains("--ipc=host"));
    }
}
