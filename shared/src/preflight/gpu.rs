//! `gpu.visible`, `gpu.fabric`, `gpu.p2p`: are the GPUs there, joined into the
//! NVSwitch fabric, and able to talk P2P?

use super::options::{PreflightOptions, Requirement};
use crate::facts::{FabricState, GpuSource, HostFacts, LinkKind};
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};
use crate::measured;
use crate::visible_devices::{self, VisibleDevices};

pub fn check(facts: &HostFacts, opts: &PreflightOptions) -> Vec<Finding> {
    let mut out = vec![visible(facts, opts)];
    out.extend(fabric(facts));
    out.extend(p2p(facts, opts));
    out
}

fn visible(facts: &HostFacts, opts: &PreflightOptions) -> Finding {
    let g = &facts.gpus;
    let n = g.count();
    let nvd = facts.env("NVIDIA_VISIBLE_DEVICES");
    let cvd = facts.env("CUDA_VISIBLE_DEVICES");
    let f = |sev, s: String| {
        Finding::new(FindingId::GpuVisible, sev, s)
            .fact("visible_gpus", n)
            .fact("NVIDIA_VISIBLE_DEVICES", nvd.unwrap_or("(unset)"))
            .fact("CUDA_VISIBLE_DEVICES", cvd.unwrap_or("(unset)"))
    };
    let want = opts.expect_gpus.filter(|e| *e > 0).unwrap_or(8);
    let gpu_remedy = format!("request the GPUs in the container spec: resources.limits: {{nvidia.com/gpu: {want}}}, and leave NVIDIA_VISIBLE_DEVICES to the device plugin");
    let gpu_remedy = gpu_remedy.as_str();
    if n == 0 {
        let wanted = opts.expect_gpus.is_some_and(|e| e > 0)
            || opts.requires(Requirement::Nvlink)
            || nvd.is_some_and(|v| !matches!(v, "void" | "none" | ""));
        let why = g
            .nvml_error
            .as_deref()
            .map(|e| format!(" (NVML: {e})"))
            .unwrap_or_default();
        return if wanted {
            f(Severity::Error, format!("no GPU visible{why}")).remedy(format!(
                "{gpu_remedy}; check that the NVIDIA container runtime is the pod's runtimeClass"
            ))
        } else {
            f(Severity::Warning, format!("no GPU visible{why}: ranks will run on CPU (gloo); pass --expect-gpus N to make this an error"))
        };
    }
    if let Some(expect) = opts.expect_gpus.filter(|e| (n as u32) < *e) {
        return f(
            Severity::Error,
            format!("{n} of {expect} expected GPUs visible"),
        )
        .fact("expected", expect)
        .remedy(gpu_remedy);
    }
    if let Some(problem) =
        cvd.and_then(|c| visible_devices::mismatch(VisibleDevices::parse(c), n, g))
    {
        return f(Severity::Error, format!("CUDA_VISIBLE_DEVICES does not match the GPUs this container has: {problem}"))
            .remedy("unset CUDA_VISIBLE_DEVICES in the pod spec: the device plugin already exposes exactly the allocated GPUs, renumbered from 0");
    }
    if g.source == GpuSource::Nvml {
        let has = |p: &str| g.device_nodes.iter().any(|d| d == p);
        let missing: Vec<String> = std::iter::once("/dev/nvidiactl".to_string())
            .chain(
                (0..n)
                    .map(|i| format!("/dev/nvidia{i}"))
                    .filter(|_| !g.device_nodes.is_empty()),
            )
            .filter(|p| !has(p))
            .collect();
        let per_gpu_nodes = g
            .device_nodes
            .iter()
            .filter(|d| d.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok())
            .count();
        if !has("/dev/nvidiactl") || per_gpu_nodes < n {
            return f(Severity::Error, format!("NVML sees {n} GPU(s) but only {per_gpu_nodes} /dev/nvidiaN node(s) exist{}", if has("/dev/nvidiactl") { String::new() } else { " and /dev/nvidiactl is missing".into() }))
                .fact("missing_example", missing.first().cloned().unwrap_or_default())
                .remedy("run the container with the NVIDIA runtime (runtimeClassName: nvidia) so it mounts the device nodes");
        }
    }
    let exclusive: Vec<String> = g
        .devices
        .iter()
        .filter(|d| {
            d.compute_mode
                .as_deref()
                .is_some_and(|m| m.starts_with("exclusive"))
        })
        .map(|d| format!("GPU{}", d.index))
        .collect();
    if !exclusive.is_empty() {
        return f(Severity::Warning, format!("{} in exclusive-process compute mode: only one process may use each (fine with one rank per GPU, fatal for tools that open every GPU)", exclusive.join(",")))
            .remedy("nvidia-smi -c DEFAULT on the host, or a node pool whose GPUs are in default compute mode");
    }
    f(Severity::Ok, format!("{n} GPU(s) visible"))
}

fn fabric(facts: &HostFacts) -> Option<Finding> {
    let devs = &facts.gpus.devices;
    let not_ready: Vec<String> = devs
        .iter()
        .filter(|d| {
            matches!(
                d.fabric,
                Some(FabricState::NotStarted | FabricState::InProgress)
            )
        })
        .map(|d| {
            format!(
                "GPU{} ({})",
                d.index,
                serde_json::to_value(d.fabric)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default()
            )
        })
        .collect();
    if !not_ready.is_empty() {
        return Some(
            Finding::new(FindingId::GpuFabric, Severity::Error, format!("NVSwitch fabric not ready on {}: CUDA reports \"system not ready\" (error 802) and NVLink is unusable", not_ready.join(", ")))
                .fact("gpus_not_ready", not_ready.len())
                .remedy("start the fabric manager on the host (systemctl enable --now nvidia-fabricmanager; the GPU operator's fabric-manager daemonset) and wait for `nvidia-smi -q` to show Fabric State: Completed"),
        );
    }
    let completed = devs
        .iter()
        .filter(|d| d.fabric == Some(FabricState::Completed))
        .count();
    (completed > 0).then(|| {
        Finding::new(
            FindingId::GpuFabric,
            Severity::Ok,
            format!("NVSwitch fabric completed on {completed} GPU(s)"),
        )
    })
}

fn p2p(facts: &HostFacts, opts: &PreflightOptions) -> Option<Finding> {
    let g = &facts.gpus;
    if g.count() < 2 {
        return None;
    }
    let pairs: Vec<(usize, usize, LinkKind)> = g.pairs().collect();
    let broken: Vec<String> = g
        .nvlink_pairs_without_p2p()
        .iter()
        .map(|(a, b, l)| format!("GPU{a}-GPU{b} ({l})"))
        .collect();
    if !broken.is_empty() {
        return Some(
            Finding::new(FindingId::GpuP2p, Severity::Error, format!("NVLink-connected GPUs report P2P read/write not supported: {}; NCCL aborts (\"P2P is disabled between NVLINK connected GPUs\") unless told to ignore it, and then stages through /dev/shm", broken.join(", ")))
                .fact("pairs", broken.len())
                .fact("cost", format!("SHM {} GB/s vs NVLink {} GB/s ({})", measured::SHM_GBPS, measured::NVLINK_P2P_GBPS, measured::slowdown(measured::NVLINK_P2P_GBPS, measured::SHM_GBPS)))
                .remedy("the hypervisor or driver blocks P2P: ask the platform for a passthrough with P2P enabled (check `nvidia-smi topo -p2p rw`); toporun's plan sets NCCL_P2P_DISABLE=1 so the job runs, slowly"),
        );
    }
    let all_nvlink = pairs.iter().all(|(_, _, l)| l.is_nvlink());
    let any_nvlink = pairs.iter().any(|(_, _, l)| l.is_nvlink());
    let no_p2p: Vec<String> = pairs
        .iter()
        .filter(|(_, _, l)| !l.p2p_by_default())
        .map(|(a, b, l)| format!("GPU{a}-GPU{b} ({l})"))
        .collect();
    let sev_if_required = if opts.requires(Requirement::Nvlink) {
        Severity::Error
    } else {
        Severity::Warning
    };
    Some(if all_nvlink {
        Finding::new(
            FindingId::GpuP2p,
            Severity::Ok,
            format!(
                "all {} GPU pairs NVLink-connected with P2P read/write OK",
                pairs.len()
            ),
        )
    } else if !no_p2p.is_empty() {
        Finding::new(
            FindingId::GpuP2p,
            sev_if_required,
            format!("{} GPU pair(s) cross a host bridge or socket, where NCCL uses no P2P and stages through host memory: {}", no_p2p.len(), no_p2p.join(", ")),
        )
        .fact("nvlink_pairs", pairs.iter().filter(|(_, _, l)| l.is_nvlink()).count())
        .remedy(if any_nvlink { "place the job on GPUs of one NVLink domain" } else { "PCIe-only host: expect SHM-speed collectives; choose an NVLink instance type for tensor parallelism" })
    } else if opts.requires(Requirement::Nvlink) {
        Finding::new(
            FindingId::GpuP2p,
            Severity::Error,
            "not every GPU pair is NVLink-connected (P2P over PCIe switches only)",
        )
        .remedy("schedule on an NVLink host")
    } else {
        Finding::new(
            FindingId::GpuP2p,
            Severity::Info,
            "PCIe host: P2P through PCIe switches (PIX/PXB) only",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::testutil::healthy;

    #[test]
    fn fewer_gpus_than_expected_is_an_error() {
        let opts = PreflightOptions {
            expect_gpus: Some(8),
            ..Default::default()
        };
        let out = check(&healthy(), &opts);
        assert_eq!(out[0].severity, Severity::Error);
        assert!(out[0].summary.contains("4 of 8"));
    }

    #[test]
    fn cuda_visible_devices_beyond_the_container_is_an_error() {
        let mut f = healthy();
        f.container
            .env
            .insert("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3,4,5,6,7".into());
        assert_eq!(
            visible(&f, &PreflightOptions::default()).severity,
            Severity::Error
        );
        f.container
            .env
            .insert("CUDA_VISIBLE_DEVICES".into(), "0,1".into());
        assert_eq!(
            visible(&f, &PreflightOptions::default()).severity,
            Severity::Ok
        );
    }

    #[test]
    fn missing_device_nodes_are_an_error() {
        let mut f = healthy();
        f.gpus.device_nodes.retain(|d| d != "/dev/nvidia3");
        assert_eq!(
            visible(&f, &PreflightOptions::default()).severity,
            Severity::Error
        );
    }

    #[test]
    fn no_gpu_is_a_warning_unless_expected() {
        let mut f = healthy();
        f.gpus = Default::default();
        assert_eq!(
            visible(&f, &PreflightOptions::default()).severity,
            Severity::Warning
        );
        let opts = PreflightOptions {
            expect_gpus: Some(1),
            ..Default::default()
        };
        assert_eq!(visible(&f, &opts).severity, Severity::Error);
    }

    #[test]
    fn fabric_manager_not_started_is_an_error() {
        let mut f = healthy();
        f.gpus.devices[2].fabric = Some(FabricState::NotStarted);
        let out = fabric(&f).unwrap();
        assert_eq!(out.severity, Severity::Error);
        assert!(out.summary.contains("GPU2"));
    }

    #[test]
    fn nvlink_pair_without_p2p_is_an_error_with_cost() {
        let mut f = healthy();
        crate::preflight::testutil::without_p2p(&mut f, 0, 1);
        let out = p2p(&f, &PreflightOptions::default()).unwrap();
        assert_eq!(out.severity, Severity::Error);
        assert!(out.facts["cost"].contains("27.5"));
    }

    #[test]
    fn pcie_node_host_warns_and_require_nvlink_errors() {
        let mut f = healthy();
        for (i, row) in f.gpus.links.iter_mut().enumerate() {
            for (j, l) in row.iter_mut().enumerate() {
                if i != j {
                    *l = LinkKind::Node;
                }
            }
        }
        assert_eq!(
            p2p(&f, &PreflightOptions::default()).unwrap().severity,
            Severity::Warning
        );
        let opts = PreflightOptions {
            require: vec![Requirement::Nvlink],
            ..Default::default()
        };
        assert_eq!(p2p(&f, &opts).unwrap().severity, Severity::Error);
    }
}
