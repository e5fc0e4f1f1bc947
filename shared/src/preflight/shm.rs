//! `shm.size`: an error only where NCCL will need /dev/shm files (some local pair on
//! the SHM transport with cuMem host allocations off or refused) and they will not
//! fit, or below an explicit --min-shm; otherwise a small /dev/shm is a warning for
//! DataLoader workers. Measured on 2x H200, NCCL 2.28.9: a 64 MiB /dev/shm ran at
//! full speed with P2P, and at SHM speed with cuMem host memory.

use super::options::PreflightOptions;
use crate::facts::HostFacts;
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};
use crate::host_buffers::{cumem_host, shm_needed, shm_transport, CumemHost, ShmTransport};
use crate::units::format_size;

const POD_REMEDY: &str = "mount a memory-backed emptyDir at /dev/shm:\n  volumes: [{name: dshm, emptyDir: {medium: Memory, sizeLimit: 64Gi}}]\n  volumeMounts: [{name: dshm, mountPath: /dev/shm}]\n(docker: --shm-size=64g or --ipc=host)";
const HOST_REMEDY: &str = "docker run --shm-size=64g (or --ipc=host); on a host without a container: mount -o remount,size=64G /dev/shm\n(in a Kubernetes pod: a memory-backed emptyDir at /dev/shm)";

/// The fix in the words of the place: a pod spec, or docker and mount.
fn remedy(facts: &HostFacts) -> &'static str {
    if facts.container.maybe_pod() {
        POD_REMEDY
    } else {
        HOST_REMEDY
    }
}

pub fn check(facts: &HostFacts, opts: &PreflightOptions) -> Option<Finding> {
    let remedy_text = remedy(facts);
    let min = format_size(opts.min_shm_bytes);
    let Some(shm) = &facts.container.shm else {
        return Some(
            Finding::new(
                FindingId::ShmSize,
                Severity::Error,
                "/dev/shm is not mounted: NCCL's SHM transport and DataLoader workers will fail",
            )
            .fact("required", &min)
            .remedy(remedy_text),
        );
    };
    let env = &facts.container.env;
    let local = facts.gpus.count().max(1) as u32;
    let f = |sev, summary: String| {
        Finding::new(FindingId::ShmSize, sev, summary)
            .fact("total", format_size(shm.total_bytes))
            .fact("free", format_size(shm.free_bytes))
            .fact("fs_type", shm.fs_type.as_deref().unwrap_or("unknown"))
    };
    let transport = shm_transport(facts, env);
    let cumem = cumem_host(facts, env);
    let need = shm_needed(local);
    if let (Some(ShmTransport { why, .. }), true) = (&transport, cumem.uses_shm_files()) {
        if shm.total_bytes < need {
            let files = match &cumem {
                CumemHost::Off(v) => format!("{v} puts NCCL's host buffers in /dev/shm files"),
                _ => "cuMem host allocations are refused (get_mempolicy blocked), so NCCL's host buffers are /dev/shm files".into(),
            };
            return Some(
                f(Severity::Error, format!("/dev/shm is {}, but NCCL needs about {} here: {why} (SHM transport) and {files}; NCCL fails with \"failed to extend /dev/shm\" / \"unhandled system error\"", format_size(shm.total_bytes), format_size(need)))
                    .fact("needed", format_size(need))
                    .fact("shm_transport", why)
                    .remedy(format!("{remedy_text}\nor keep NCCL's host buffers out of /dev/shm: unset NCCL_CUMEM_HOST_ENABLE=0 / allow get_mempolicy (CAP_SYS_NICE)")),
            );
        }
    }
    Some(
        if opts.min_shm_explicit && shm.total_bytes < opts.min_shm_bytes {
            f(
                Severity::Error,
                format!(
                    "/dev/shm is {}, below --min-shm {min}",
                    format_size(shm.total_bytes)
                ),
            )
            .fact("required", &min)
            .remedy(remedy_text)
        } else if shm.total_bytes < opts.min_shm_bytes {
            let nccl = match (&transport, &cumem) {
                (None, _) => {
                    "NCCL does not need it here (P2P between every local pair)".to_string()
                }
                (Some(_), CumemHost::Works(_)) => {
                    "NCCL does not need it here (its SHM buffers are cuMem host memory)".to_string()
                }
                (Some(_), _) => format!("NCCL's SHM segments fit (about {})", format_size(need)),
            };
            f(Severity::Warning, format!("/dev/shm is {}, below the recommended {min}: {nccl}, but PyTorch DataLoader workers (num_workers > 0) pass batches through /dev/shm and die with \"Bus error\" when it fills", format_size(shm.total_bytes)))
            .fact("recommended", &min)
            .remedy(remedy_text)
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
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::testutil::healthy;

    fn small(f: &mut HostFacts) {
        f.container.shm.as_mut().unwrap().total_bytes = 64 << 20;
        f.container.shm.as_mut().unwrap().free_bytes = 64 << 20;
    }

    #[test]
    fn the_fix_fits_the_place() {
        let mut f = healthy();
        f.container.shm.as_mut().unwrap().total_bytes = 64 << 20;
        let pod = check(&f, &PreflightOptions::default()).unwrap();
        assert!(pod
            .remedy
            .unwrap()
            .starts_with("mount a memory-backed emptyDir"));
        f.container.kubernetes = Some(false);
        let host = check(&f, &PreflightOptions::default()).unwrap();
        assert!(host.remedy.unwrap().starts_with("docker run --shm-size"));
    }

    #[test]
    fn small_shm_with_p2p_is_a_warning_for_dataloaders() {
        let mut f = healthy();
        small(&mut f);
        let finding = check(&f, &PreflightOptions::default()).unwrap();
        assert_eq!(finding.severity, Severity::Warning);
        assert!(finding.summary.contains("DataLoader"));
        assert!(finding.remedy.unwrap().contains("medium: Memory"));
    }

    #[test]
    fn small_shm_is_fatal_only_with_shm_transport_and_shm_files() {
        let mut f = healthy();
        small(&mut f);
        f.container
            .env
            .insert("NCCL_P2P_DISABLE".into(), "1".into());
        // cuMem host works: SHM transport in cuMem memory (measured 27.5 GB/s in 64 MiB).
        assert_eq!(
            check(&f, &PreflightOptions::default()).unwrap().severity,
            Severity::Warning
        );
        f.container
            .env
            .insert("NCCL_CUMEM_HOST_ENABLE".into(), "0".into());
        let e = check(&f, &PreflightOptions::default()).unwrap();
        assert_eq!(e.severity, Severity::Error, "{}", e.summary);
        assert!(e.summary.contains("failed to extend /dev/shm"));
    }

    #[test]
    fn explicit_min_shm_is_a_hard_floor() {
        let mut f = healthy();
        f.container.shm.as_mut().unwrap().total_bytes = 2 << 30;
        let opts = PreflightOptions {
            min_shm_bytes: 16 << 30,
            min_shm_explicit: true,
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
