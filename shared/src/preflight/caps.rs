//! `caps.ipc_lock`, `memlock`: RDMA memory registration (EFA, InfiniBand) pins memory
//! and fails ("ibv_reg_mr failed") without IPC_LOCK or an unlimited memlock.
//! `caps.sys_nice`: NCCL's cuMem host allocations call get_mempolicy, which Docker's
//! seccomp profile allows only with SYS_NICE.

use crate::facts::{cap, HostFacts};
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};
use crate::host_buffers::{cumem_host, CumemHost};
use crate::units::format_size;
use std::collections::BTreeMap;

const SYS_NICE_ID: FindingId = FindingId::CapsSysNice;

/// The fix for a missing capability, in the words of the place: the pod spec's
/// securityContext, or docker's flag.
fn add_cap(facts: &HostFacts, cap: &str) -> String {
    if facts.container.maybe_pod() {
        format!("securityContext:\n  capabilities:\n    add: [{cap}]")
    } else {
        format!("docker run --cap-add {cap}\n(in a Kubernetes pod: securityContext.capabilities.add: [{cap}])")
    }
}

fn memlock_text(limit: Option<u64>) -> String {
    limit.map_or("unlimited".to_string(), format_size)
}

pub fn check(facts: &HostFacts) -> Vec<Finding> {
    let c = &facts.container;
    let ipc_lock = c.caps.has_effective(cap::IPC_LOCK);
    let memlock_unlimited = c.rlimits.memlock.soft.is_none();
    let rdma = facts.rdma.len();
    let pinning_ok = ipc_lock || memlock_unlimited;
    let sev = |good: bool| match (rdma > 0, good, pinning_ok) {
        (_, true, _) => Severity::Ok,
        (false, false, _) => Severity::Info,
        (true, false, true) => Severity::Info,
        (true, false, false) => Severity::Error,
    };
    let ipc_summary = match (ipc_lock, rdma > 0, pinning_ok) {
        (true, _, _) => "CAP_IPC_LOCK is effective".to_string(),
        (false, true, false) => format!("{rdma} RDMA device(s) but no CAP_IPC_LOCK and memlock is {}: RDMA memory registration will fail (ibv_reg_mr)", memlock_text(c.rlimits.memlock.soft)),
        (false, true, true) => "no CAP_IPC_LOCK, but memlock is unlimited, which is enough for RDMA".to_string(),
        (false, false, _) => "no CAP_IPC_LOCK; not needed without RDMA devices".to_string(),
    };
    let mut ipc = Finding::new(FindingId::CapsIpcLock, sev(ipc_lock), ipc_summary)
        .fact("cap_eff", format!("{:016x}", c.caps.effective))
        .fact("rdma_devices", rdma);
    if ipc.severity == Severity::Error {
        ipc = ipc.remedy(add_cap(facts, "IPC_LOCK"));
    }
    let memlock_summary = if memlock_unlimited {
        "memlock is unlimited".to_string()
    } else if rdma > 0 && !pinning_ok {
        format!("memlock is {} with {rdma} RDMA device(s) and no CAP_IPC_LOCK: registration of NCCL's buffers will fail", memlock_text(c.rlimits.memlock.soft))
    } else {
        format!("memlock is {}", memlock_text(c.rlimits.memlock.soft))
    };
    let mut memlock = Finding::new(FindingId::Memlock, sev(memlock_unlimited), memlock_summary)
        .fact("soft", memlock_text(c.rlimits.memlock.soft))
        .fact("hard", memlock_text(c.rlimits.memlock.hard));
    if memlock.severity == Severity::Error {
        let how = if c.maybe_pod() {
            "securityContext.capabilities.add: [IPC_LOCK]"
        } else {
            "docker run --cap-add IPC_LOCK"
        };
        memlock = memlock.remedy(format!(
            "add IPC_LOCK ({how}), or start the container with an unlimited memlock (docker --ulimit memlock=-1; containerd: LimitMEMLOCK=infinity for the runtime)"
        ));
    }
    let mut out = vec![ipc, memlock];
    if facts.gpus.count() > 0 {
        out.push(sys_nice(facts));
    }
    out
}

fn sys_nice(facts: &HostFacts) -> Finding {
    let f = |sev, s: String| {
        Finding::new(SYS_NICE_ID, sev, s)
            .fact(
                "nccl_version",
                facts.platform.nccl_version.as_deref().unwrap_or("unknown"),
            )
            .fact(
                "get_mempolicy",
                match facts.container.get_mempolicy {
                    Some(true) => "allowed",
                    Some(false) => "refused",
                    None => "not probed",
                },
            )
    };
    let nice = facts.container.caps.has_effective(cap::SYS_NICE);
    match cumem_host(facts, &BTreeMap::new()) {
        CumemHost::Works(why) => f(
            Severity::Ok,
            format!("{why}: NCCL's cuMem host allocations work{}", if nice { "" } else { " (without CAP_SYS_NICE: no seccomp filter refuses get_mempolicy)" }),
        ),
        CumemHost::Blocked { old_nccl: true } => f(
            Severity::Warning,
            "get_mempolicy is refused (a seccomp profile without CAP_SYS_NICE) and this NCCL (< 2.26.5) does not fall back by itself: toporun's plan sets NCCL_CUMEM_HOST_ENABLE=0, which puts NCCL's host buffers in /dev/shm".into(),
        )
        .remedy(add_cap(facts, "SYS_NICE") + "\n(or a seccomp profile that allows get_mempolicy)"),
        _ => f(
            Severity::Info,
            "get_mempolicy is refused (or not probed, and CAP_SYS_NICE is missing): NCCL >= 2.26.5 falls back to /dev/shm files for its host buffers, which matters only where a pair of local ranks uses the SHM transport (see shm.size)".into(),
        )
        .remedy(add_cap(facts, "SYS_NICE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{Limit, RdmaDevice, RdmaKind};
    use crate::preflight::testutil::healthy;

    fn efa_without_pinning() -> HostFacts {
        let mut f = healthy();
        f.container.caps.effective = 0;
        f.container.rlimits.memlock = Limit {
            soft: Some(8 << 20),
            hard: Some(8 << 20),
        };
        f.rdma = vec![RdmaDevice {
            name: "rdmap16s27".into(),
            kind: RdmaKind::Efa,
            ..Default::default()
        }];
        f
    }

    #[test]
    fn rdma_without_ipc_lock_or_unlimited_memlock_is_two_errors() {
        let out = check(&efa_without_pinning());
        assert_eq!(out[0].id, "caps.ipc_lock");
        assert_eq!(out[0].severity, Severity::Error);
        assert!(out[0].remedy.as_ref().unwrap().contains("IPC_LOCK"));
        assert_eq!(out[1].id, "memlock");
        assert_eq!(out[1].severity, Severity::Error);
        assert_eq!(out[1].facts["soft"], "8 MiB");
    }

    #[test]
    fn off_kubernetes_the_fix_is_dockers_flag() {
        let mut f = efa_without_pinning();
        let pod = check(&f);
        assert!(pod[0]
            .remedy
            .as_ref()
            .unwrap()
            .starts_with("securityContext:"));
        f.container.kubernetes = Some(false);
        let out = check(&f);
        let fix = out[0].remedy.as_ref().unwrap();
        assert!(fix.starts_with("docker run --cap-add IPC_LOCK"), "{fix}");
        assert!(out[1]
            .remedy
            .as_ref()
            .unwrap()
            .contains("(docker run --cap-add IPC_LOCK)"));
    }

    #[test]
    fn unlimited_memlock_alone_is_enough() {
        let mut f = efa_without_pinning();
        f.container.rlimits.memlock = Limit::default();
        let out = check(&f);
        assert_eq!(out[0].severity, Severity::Info);
        assert_eq!(out[1].severity, Severity::Ok);
    }

    #[test]
    fn no_rdma_means_no_error() {
        let mut f = efa_without_pinning();
        f.rdma.clear();
        assert!(check(&f)
            .iter()
            .filter(|x| x.id != SYS_NICE_ID)
            .all(|x| x.severity < Severity::Warning));
    }

    #[test]
    fn sys_nice_follows_the_get_mempolicy_probe_and_nccl_version() {
        let mut f = healthy();
        f.container.caps.effective = 0;
        // Measured: SYS_NICE dropped, no seccomp filter: cuMem host works.
        f.container.get_mempolicy = Some(true);
        assert_eq!(sys_nice(&f).severity, Severity::Ok);
        f.container.get_mempolicy = Some(false);
        assert_eq!(
            sys_nice(&f).severity,
            Severity::Info,
            "unknown NCCL: its own fallback"
        );
        f.platform.nccl_version = Some("2.28.9".into());
        assert_eq!(sys_nice(&f).severity, Severity::Info);
        f.platform.nccl_version = Some("2.21.5".into());
        assert_eq!(sys_nice(&f).severity, Severity::Warning);
    }
}
