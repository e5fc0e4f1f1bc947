//! `gpu.memory`, `gpu.pcie`, `gpu.throttle`, `gpu.nvlink`, `gpu.mode`, `gpu.processes`:
//! NVML's view of each GPU's health. A GPU can pass every configuration check and
//! still make a job crawl or die: a pending row remap, a link trained at x8, clocks
//! cut for heat, a dead NVLink, another process on it.

use crate::facts::{Gpu, GpuSource, HostFacts};
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};

/// The drain-and-report fix for faults no container setting can mend.
const DRAIN: &str = "cordon and drain the node (kubectl cordon/drain), then reset the GPU (nvidia-smi -r -i N with no process on it) or hand it to the operator for replacement";

pub fn check(facts: &HostFacts) -> Vec<Finding> {
    let g = &facts.gpus;
    if g.source != GpuSource::Nvml || g.devices.is_empty() {
        return Vec::new();
    }
    vec![
        memory(&g.devices),
        pcie(&g.devices),
        throttle(&g.devices),
        nvlink(&g.devices),
        mode(&g.devices),
        processes(&job_gpus(facts)),
    ]
}

/// The GPUs the job's ranks use (CUDA_VISIBLE_DEVICES): another job on the others
/// shares nothing with this one.
fn job_gpus(facts: &HostFacts) -> Vec<Gpu> {
    let used = crate::visible_devices::cuda_devices(facts.env("CUDA_VISIBLE_DEVICES"), &facts.gpus);
    used.into_iter()
        .filter_map(|i| facts.gpus.devices.get(i).cloned())
        .collect()
}

/// "GPU0: what, GPU3: what" for the GPUs `what` names a problem on.
fn per_gpu(devs: &[Gpu], what: impl Fn(&Gpu) -> Option<String>) -> Vec<String> {
    devs.iter()
        .filter_map(|d| what(d).map(|w| format!("GPU{}: {w}", d.index)))
        .collect()
}

fn memory(devs: &[Gpu]) -> Finding {
    let faults = per_gpu(devs, |d| d.health.memory_fault());
    if !faults.is_empty() {
        return Finding::new(FindingId::GpuMemory, Severity::Error, format!("GPU memory fault: {}; a job on it can die with Xid 48/63/94/95 or compute on bad data", faults.join("; ")))
            .fact("gpus", faults.len())
            .remedy(DRAIN);
    }
    let pending = per_gpu(devs, |d| {
        d.health
            .retirement_pending
            .filter(|p| *p)
            .map(|_| "page retirement pending".to_string())
    });
    if !pending.is_empty() {
        return Finding::new(
            FindingId::GpuMemory,
            Severity::Warning,
            format!(
                "{}: retired pages take effect only after a GPU reset",
                pending.join("; ")
            ),
        )
        .remedy("reset the GPU between jobs (nvidia-smi -r -i N) or reboot the node");
    }
    let history = per_gpu(devs, |d| {
        let n = d.health.ecc_uncorrected_aggregate.filter(|n| *n > 0)?;
        Some(format!(
            "{n} uncorrectable ECC error(s) in its lifetime{}",
            d.health
                .retired_pages
                .filter(|p| *p > 0)
                .map(|p| format!(", {p} page(s) retired"))
                .unwrap_or_default()
        ))
    });
    if !history.is_empty() {
        return Finding::new(
            FindingId::GpuMemory,
            Severity::Info,
            format!("{} (handled: no fault pending now)", history.join("; ")),
        );
    }
    let known = devs
        .iter()
        .any(|d| d.health.remapped_rows.is_some() || d.health.ecc_uncorrected_volatile.is_some());
    Finding::new(
        FindingId::GpuMemory,
        if known { Severity::Ok } else { Severity::Info },
        if known {
            "no pending or failed row remap, no uncorrectable ECC error"
        } else {
            "GPU memory health unknown (NVML reports no ECC or row-remap data: ECC off or not supported)"
        },
    )
}

fn pcie(devs: &[Gpu]) -> Finding {
    let narrow = per_gpu(devs, |d| {
        let p = d.health.pcie?;
        (p.width < p.max_width).then(|| format!("x{} of x{}", p.width, p.max_width))
    });
    if !narrow.is_empty() {
        return Finding::new(FindingId::GpuPcie, Severity::Warning, format!("PCIe link trained below its width: {}; host<->device copies (and P2P over PCIe) run at that fraction", narrow.join("; ")))
            .fact("gpus", narrow.len())
            .remedy(format!("a riser, cable or slot fault: {DRAIN}"));
    }
    let links: Vec<String> = devs
        .iter()
        .filter_map(|d| d.health.pcie)
        .map(|p| format!("Gen{} x{}", p.max_gen, p.max_width))
        .collect();
    if links.is_empty() {
        return Finding::new(
            FindingId::GpuPcie,
            Severity::Info,
            "PCIe link unknown (NVML did not say)",
        );
    }
    let mut kinds = links.clone();
    kinds.dedup();
    Finding::new(
        FindingId::GpuPcie,
        Severity::Ok,
        format!(
            "every GPU's PCIe link at its full width ({})",
            kinds.join(", ")
        ),
    )
}

fn throttle(devs: &[Gpu]) -> Finding {
    let hot = per_gpu(devs, |d| {
        (!d.health.throttle.is_empty()).then(|| {
            d.health
                .throttle
                .iter()
                .map(|r| r.describe())
                .collect::<Vec<_>>()
                .join(", ")
        })
    });
    if hot.is_empty() {
        return Finding::new(
            FindingId::GpuThrottle,
            Severity::Ok,
            "no clock throttling for hardware reasons",
        );
    }
    Finding::new(FindingId::GpuThrottle, Severity::Warning, format!("clocks throttled: {}; every collective waits for the slowest GPU", hot.join("; ")))
        .fact("gpus", hot.len())
        .remedy("check cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER); if it persists at rest, drain the node and report it")
}

fn nvlink(devs: &[Gpu]) -> Finding {
    let most = devs
        .iter()
        .map(|d| d.nvlink.active_links)
        .max()
        .unwrap_or(0);
    let down = per_gpu(devs, |d| {
        let active = d.nvlink.active_links;
        let supported = d.health.nvlink_supported.unwrap_or(0);
        if most > 0 && active < most {
            Some(format!("{active} of {most} links up"))
        } else if active > 0 && active < supported {
            Some(format!("{active} of {supported} links up"))
        } else {
            None
        }
    });
    if !down.is_empty() {
        return Finding::new(
            FindingId::GpuNvlink,
            Severity::Warning,
            format!(
                "NVLink degraded: {}; traffic through the missing links goes slower or over PCIe",
                down.join("; ")
            ),
        )
        .fact("gpus", down.len())
        .remedy(format!("nvidia-smi nvlink -s shows each link; {DRAIN}"));
    }
    if most == 0 {
        return Finding::new(
            FindingId::GpuNvlink,
            Severity::Ok,
            "no NVLink on these GPUs",
        );
    }
    Finding::new(
        FindingId::GpuNvlink,
        Severity::Ok,
        format!("all {most} NVLink links up on every GPU"),
    )
}

fn mode(devs: &[Gpu]) -> Finding {
    let mig: Vec<bool> = devs.iter().filter_map(|d| d.mig_enabled).collect();
    let mig_on: Vec<String> = devs
        .iter()
        .filter(|d| d.mig_enabled == Some(true))
        .map(|d| format!("GPU{}", d.index))
        .collect();
    if mig.contains(&true) && mig.contains(&false) {
        return Finding::new(FindingId::GpuMode, Severity::Error, format!("MIG mode differs across GPUs (on for {}): ranks on MIG instances see a slice of a GPU, with no NVLink/P2P between instances", mig_on.join(", ")))
            .remedy("give the job GPUs of one MIG mode: nvidia-smi -mig 0 on the host, or a node pool with MIG disabled (nvidia.com/mig.config: all-disabled)");
    }
    let no_persistence = per_gpu(devs, |d| {
        (d.persistence_mode == Some(false)).then(|| "persistence mode off".to_string())
    });
    if !no_persistence.is_empty() {
        return Finding::new(
            FindingId::GpuMode,
            Severity::Info,
            format!(
                "{}: each job's CUDA start pays the driver's GPU initialisation",
                no_persistence.join("; ")
            ),
        )
        .remedy("run nvidia-persistenced on the host (the GPU operator does)");
    }
    Finding::new(
        FindingId::GpuMode,
        Severity::Ok,
        if mig_on.is_empty() {
            "MIG off, persistence on"
        } else {
            "MIG on for every GPU"
        },
    )
}

fn processes(devs: &[Gpu]) -> Finding {
    let busy = per_gpu(devs, |d| {
        d.health
            .compute_processes
            .filter(|n| *n > 0)
            .map(|n| format!("{n} process(es)"))
    });
    if busy.is_empty() {
        return Finding::new(
            FindingId::GpuProcesses,
            Severity::Ok,
            "no other process holds a GPU",
        );
    }
    Finding::new(FindingId::GpuProcesses, Severity::Warning, format!("GPUs already in use: {}; their memory and compute are shared with this job (a leftover rank of an earlier job, or another pod given the same GPU)", busy.join("; ")))
        .fact("gpus", busy.len())
        .remedy("nvidia-smi shows the processes; end the leftover job, or check that the device plugin does not share GPUs (time-slicing/MPS) with this pod")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{PcieLink, RemappedRows, ThrottleReason};
    use crate::preflight::testutil::healthy;

    fn find(f: &HostFacts, id: &str) -> Finding {
        check(f)
            .into_iter()
            .find(|x| x.id == id)
            .unwrap_or_else(|| panic!("no {id}"))
    }

    fn healthy_nvml() -> HostFacts {
        let mut f = healthy();
        for d in &mut f.gpus.devices {
            d.persistence_mode = Some(true);
            d.mig_enabled = Some(false);
            d.nvlink.active_links = 18;
            d.health.nvlink_supported = Some(18);
            d.health.remapped_rows = Some(RemappedRows::default());
            d.health.ecc_uncorrected_volatile = Some(0);
            d.health.compute_processes = Some(0);
            d.health.pcie = Some(PcieLink {
                gen: 1,
                max_gen: 5,
                width: 16,
                max_width: 16,
            });
        }
        f
    }

    #[test]
    fn a_healthy_host_is_ok_on_every_check_even_with_idle_pcie_gen1() {
        let f = healthy_nvml();
        for x in check(&f) {
            assert_eq!(x.severity, Severity::Ok, "{x:?}");
        }
        assert!(find(&f, "gpu.pcie").summary.contains("Gen5 x16"));
    }

    /// Two jobs on one 4-GPU host, each given two GPUs by CUDA_VISIBLE_DEVICES: the
    /// other job's ranks are on GPUs this one does not use (seen on 4x H200).
    #[test]
    fn processes_on_gpus_the_job_does_not_use_are_not_its_concern() {
        let mut f = healthy_nvml();
        f.gpus.devices[2].health.compute_processes = Some(1);
        f.gpus.devices[3].health.compute_processes = Some(1);
        f.container
            .env
            .insert("CUDA_VISIBLE_DEVICES".into(), "0,1".into());
        assert_eq!(find(&f, "gpu.processes").severity, Severity::Ok);
        f.container
            .env
            .insert("CUDA_VISIBLE_DEVICES".into(), "1,3".into());
        let x = find(&f, "gpu.processes");
        assert_eq!(x.severity, Severity::Warning, "{x:?}");
        assert!(
            x.summary.contains("GPU3: 1 process") && !x.summary.contains("GPU2"),
            "{x:?}"
        );
    }

    #[test]
    fn pending_or_failed_remap_and_volatile_ecc_are_errors() {
        let mut f = healthy_nvml();
        f.gpus.devices[2].health.remapped_rows = Some(RemappedRows {
            pending: true,
            ..Default::default()
        });
        let x = find(&f, "gpu.memory");
        assert_eq!(x.severity, Severity::Error);
        assert!(x.summary.contains("GPU2: a row remap is pending"), "{x:?}");
        let mut f = healthy_nvml();
        f.gpus.devices[1].health.ecc_uncorrected_volatile = Some(3);
        assert!(find(&f, "gpu.memory")
            .summary
            .contains("GPU1: 3 uncorrectable"));
        let mut f = healthy_nvml();
        f.gpus.devices[0].health.ecc_uncorrected_aggregate = Some(2);
        assert_eq!(find(&f, "gpu.memory").severity, Severity::Info);
    }

    #[test]
    fn narrow_pcie_throttle_nvlink_down_and_busy_gpus_are_warnings() {
        let mut f = healthy_nvml();
        f.gpus.devices[3].health.pcie = Some(PcieLink {
            gen: 5,
            max_gen: 5,
            width: 8,
            max_width: 16,
        });
        f.gpus.devices[1].health.throttle = vec![ThrottleReason::HwThermal];
        f.gpus.devices[0].nvlink.active_links = 16;
        f.gpus.devices[2].health.compute_processes = Some(1);
        for (id, needle) in [
            ("gpu.pcie", "GPU3: x8 of x16"),
            ("gpu.throttle", "GPU1: hardware thermal"),
            ("gpu.nvlink", "GPU0: 16 of 18 links up"),
            ("gpu.processes", "GPU2: 1 process"),
        ] {
            let x = find(&f, id);
            assert_eq!(x.severity, Severity::Warning, "{x:?}");
            assert!(x.summary.contains(needle), "{x:?}");
            assert!(x.remedy.is_some());
        }
    }

    #[test]
    fn mixed_mig_is_an_error_and_persistence_off_is_info() {
        let mut f = healthy_nvml();
        f.gpus.devices[1].mig_enabled = Some(true);
        let x = find(&f, "gpu.mode");
        assert_eq!(x.severity, Severity::Error);
        assert!(x.summary.contains("on for GPU1"), "{x:?}");
        let mut f = healthy_nvml();
        f.gpus.devices[0].persistence_mode = Some(false);
        assert_eq!(find(&f, "gpu.mode").severity, Severity::Info);
    }

    #[test]
    fn pcie_only_gpus_without_links_are_not_degraded() {
        let mut f = healthy_nvml();
        for d in &mut f.gpus.devices {
            d.nvlink.active_links = 0;
            d.health.nvlink_supported = Some(12);
        }
        assert_eq!(find(&f, "gpu.nvlink").severity, Severity::Ok);
    }

    #[test]
    fn no_nvml_means_no_health_findings() {
        let mut f = healthy();
        f.gpus.source = GpuSource::NvidiaSmiTopo;
        assert!(check(&f).is_empty());
    }
}
