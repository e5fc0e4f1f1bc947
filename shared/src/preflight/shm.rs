//! `shm.size`: NCCL's SHM transport and DataLoader workers live in /dev/shm; runtimes
//! default it to 64 MiB.

use super::PreflightOptions;
use crate::facts::HostFacts;
use crate::finding::{Finding, Severity};
use crate::units::format_size;

const REMEDY: &str = "mount a memory-backed emptyDir at /dev/shm:\n  volumes: [{name: dshm, emptyDir: {medium: Memory, sizeLimit: 64Gi}}]\n  volumeMounts: [{name: dshm, mountPath: /dev/shm}]\n(docker: --shm-size=64g or --ipc=host)";

pub fn check(facts: &HostFacts, opts: &PreflightOptions) -> Option<Finding> {
    let min = format_size(opts.min_shm_bytes);
    let Some(shm) = &facts.container.shm else {
        return Some(
            Finding::new(
                "shm.size",
                Severity::Error,
                "/dev/shm is not mounted: NCCL's SHM transport and DataLoader workers will fail",
            )
            .fact("required", &min)
            .remedy(REMEDY),
        );
    };
    let f = |sev, summary: String| {
        Finding::new("shm.size", sev, summary)
            .fact("total", format_size(shm.total_bytes))
            .fact("free", format_size(shm.free_bytes))
            .fact("required", &min)
            .fact("fs_type", shm.fs_type.as_deref().unwrap_or("unknown"))
    };
    Some(if shm.total_bytes < opts.min_shm_bytes {
        f(Severity::Error, format!("/dev/shm is {}, below {min}: NCCL fails with \"unhandled system error\", DataLoader workers with \"Bus error\"", format_size(shm.total_bytes)))
            .remedy(REMEDY)
    } else if shm.free_bytes < opts.min_shm_bytes {
        f(
            Severity::Warning,
            format!(
                "/dev/shm has only {} free of {}",
                format_size(shm.free_bytes),
                format_size(shm.total_bytes)
            ),
        )
        .remedy(
            "remove stale files from /dev/shm (leftover nccl-* or torch_* segments) or enlarge it",
        )
    } else {
        f(
            Severity::Ok,
            format!("/dev/shm is {}", format_size(shm.total_bytes)),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::testutil::healthy;

    #[test]
    fn docker_default_64mib_is_an_error_with_the_pod_fix() {
        let mut f = healthy();
        f.container.shm.as_mut().unwrap().total_bytes = 64 << 20;
        let finding = check(&f, &PreflightOptions::default()).unwrap();
        assert_eq!(finding.severity, Severity::Error);
        assert_eq!(finding.facts["total"], "64 MiB");
        assert!(finding.remedy.unwrap().contains("medium: Memory"));
    }

    #[test]
    fn min_shm_option_moves_the_bar() {
        let mut f = healthy();
        f.container.shm.as_mut().unwrap().total_bytes = 2 << 30;
        let opts = PreflightOptions {
            min_shm_bytes: 16 << 30,
            ..Default::default()
        };
        assert_eq!(check(&f, &opts).unwrap().severity, Severity::Error);
        assert_eq!(
            check(&f, &PreflightOptions::default()).unwrap().severity,
            Severity::Ok
        );
    }

    #[test]
    fn missing_mount_is_an_error() {
        let mut f = healthy();
        f.container.shm = None;
        assert_eq!(
            check(&f, &PreflightOptions::default()).unwrap().severity,
            Severity::Error
        );
    }
}
