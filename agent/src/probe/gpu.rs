//! GPU facts through NVML (nvml-wrapper dlopens libnvidia-ml.so.1 at run time: a
//! machine without it yields facts saying so, not an error).

use crate::paths::{self, Root};
use crate::probe::nvml_session;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{
    ComputeMode, EccCounter, MemoryError, P2pCapabilitiesIndex, P2pStatus, RetirementCause,
    TopologyLevel,
};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use toporun_shared::cpulist;
use toporun_shared::facts::{
    classify_link, FabricState, Gpu, GpuFacts, GpuHealth, GpuSource, LinkKind, NvlinkInfo, P2pPair,
    P2pState, PcieAncestor, PcieLink, RemappedRows, ThrottleReason,
};

/// Where GPU facts come from: NVML live, or a fixture in tests.
pub trait GpuProbe {
    fn probe(&self) -> GpuFacts;

    /// Every GPU with its health now, without the pairwise topology (read at a
    /// failure, to compare with the start).
    fn health_now(&self) -> GpuFacts {
        self.probe()
    }

    /// The processes holding memory on a GPU now (none where it cannot tell).
    fn processes(&self) -> Vec<GpuProcess> {
        Vec::new()
    }
}

/// A process holding memory on a GPU (NVML's compute processes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    pub gpu: u32,
    /// The GPU's UUID: its name on the host whatever the container sees.
    pub uuid: Option<String>,
    pub pid: u32,
    pub used_bytes: Option<u64>,
}

/// The real thing.
pub struct NvmlProbe;

/// Facts handed in as they are (tests, `--facts`).
pub struct FixedGpus(pub GpuFacts);

impl GpuProbe for FixedGpus {
    fn probe(&self) -> GpuFacts {
        self.0.clone()
    }
}

impl GpuProbe for NvmlProbe {
    fn processes(&self) -> Vec<GpuProcess> {
        let Ok(nvml) = nvml_session::nvml() else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|i| Some((i, nvml.device_by_index(i).ok()?)))
            .flat_map(|(i, d)| {
                let procs = d.running_compute_processes().unwrap_or_default();
                let uuid = d.uuid().ok();
                procs.into_iter().map(move |p| GpuProcess {
                    gpu: i,
                    uuid: uuid.clone(),
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                    },
                })
            })
            .collect()
    }

    fn probe(&self) -> GpuFacts {
        with_nvml(probe_nvml)
    }

    fn health_now(&self) -> GpuFacts {
        with_nvml(|nvml| {
            Ok(GpuFacts {
                source: GpuSource::Nvml,
                devices: devices(nvml)?.1,
                ..Default::default()
            })
        })
    }
}

/// `read` on NVML, or facts saying why NVML could not answer.
fn with_nvml(
    read: impl FnOnce(&Nvml) -> Result<GpuFacts, nvml_wrapper::error::NvmlError>,
) -> GpuFacts {
    match nvml_session::nvml() {
        Ok(nvml) => read(nvml).unwrap_or_else(|e| GpuFacts {
            nvml_error: Some(format!("NVML query failed: {e}")),
            ..Default::default()
        }),
        Err(e) => GpuFacts {
            nvml_error: Some(format!("NVML unavailable: {e}")),
            ..Default::default()
        },
    }
}

/// Every device NVML sees, and its facts: each GPU read on a thread of its own, as
/// NVML answers them side by side (a handle's first lookup alone took 6.6 ms an H100).
fn devices(nvml: &Nvml) -> Result<(Vec<Device<'_>>, Vec<Gpu>), NvmlError> {
    let count = nvml.device_count()?;
    let read = |i: u32| -> Result<(Device, Gpu), NvmlError> {
        let d = nvml.device_by_index(i)?;
        let g = gpu(nvml, i, &d);
        Ok((d, g))
    };
    let each: Vec<Result<(Device, Gpu), NvmlError>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..count).map(|i| s.spawn(move || read(i))).collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or(Err(NvmlError::Unknown)))
            .collect()
    });
    each.into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map(|v| v.into_iter().unzip())
}

/// NVLink links a GPU can have (NVML_NVLINK_MAX_LINKS).
const MAX_NVLINKS: u32 = 18;

fn probe_nvml(nvml: &Nvml) -> Result<GpuFacts, nvml_wrapper::error::NvmlError> {
    let (devices, gpus) = devices(nvml)?;
    let bus_ids: Vec<String> = gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    let n = devices.len();
    let mut links = vec![vec![LinkKind::Own; n]; n];
    let mut p2p = Vec::new();
    for a in 0..n {
        for b in (a + 1)..n {
            let ancestor = nvml
                .topology_common_ancestor(&devices[a], &devices[b])
                .ok()
                .map(ancestor);
            let link = classify_link(&gpus[a], &gpus[b], &bus_ids, ancestor);
            links[a][b] = link;
            links[b][a] = link;
            let status = |idx| {
                devices[a]
                    .p2p_status(&devices[b], idx)
                    .map_or(P2pState::Unknown, p2p_state)
            };
            p2p.push(P2pPair {
                a,
                b,
                read: status(P2pCapabilitiesIndex::Read),
                write: status(P2pCapabilitiesIndex::Write),
            });
        }
    }
    Ok(GpuFacts {
        source: GpuSource::Nvml,
        nvml_error: None,
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml
            .sys_cuda_driver_version()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        devices: gpus,
        links,
        p2p,
        device_nodes: Vec::new(),
    })
}

fn gpu(nvml: &Nvml, index: u32, d: &Device) -> Gpu {
    let words = 16; // affinity words of 64 CPUs: up to 1024 CPUs
    let link_states: Vec<(u32, bool)> = (0..MAX_NVLINKS)
        .filter_map(|l| Some((l, d.link_wrapper_for(l).is_active().ok()?)))
        .collect();
    let remotes: Vec<String> = link_states
        .iter()
        .filter(|(_, active)| *active)
        .map(|(l, _)| {
            d.link_wrapper_for(*l)
                .remote_pci_info()
                .map(|p| p.bus_id)
                .unwrap_or_else(|_| toporun_shared::facts::INVISIBLE_REMOTE.to_string())
        })
        .collect();
    Gpu {
        index,
        name: d.name().unwrap_or_default(),
        uuid: d.uuid().unwrap_or_default(),
        pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
        mig_enabled: d.mig_mode().ok().map(|m| m.current == 1),
        compute_mode: d.compute_mode().ok().map(|m| {
            match m {
                ComputeMode::Default => "default",
                ComputeMode::ExclusiveThread => "exclusive-thread",
                ComputeMode::ExclusiveProcess => "exclusive-process",
                ComputeMode::Prohibited => "prohibited",
            }
            .to_string()
        }),
        persistence_mode: d.is_in_persistent_mode().ok(),
        numa_node: d.numa_node_id().ok(),
        cpu_affinity: d
            .cpu_affinity(words)
            // c_ulong is u64 on the 64-bit Linux targets toporun supports.
            .map(|w| cpulist::from_mask_words(&w))
            .unwrap_or_default(),
        fabric: fabric_state(nvml, d),
        nvlink: NvlinkInfo {
            active_links: remotes.len() as u32,
            remotes,
        },
        health: health(nvml, d, link_states.len()),
    }
}

/// NVML's health answers; "not supported" leaves a field empty.
/// `links`: the NVLink links that answered.
fn health(nvml: &Nvml, d: &Device, links: usize) -> GpuHealth {
    let retired = [
        RetirementCause::MultipleSingleBitEccErrors,
        RetirementCause::DoubleBitEccError,
    ]
    .iter()
    .map(|c| d.retired_pages(*c).map(|p| p.len() as u32))
    .collect::<Result<Vec<u32>, _>>()
    .ok()
    .map(|v| v.iter().sum());
    let pcie = (|| {
        Some(PcieLink {
            gen: d.current_pcie_link_gen().ok()?,
            max_gen: d.max_pcie_link_gen().ok()?,
            width: d.current_pcie_link_width().ok()?,
            max_width: d.max_pcie_link_width().ok()?,
        })
    })();
    GpuHealth {
        remapped_rows: remapped_rows(nvml, d),
        retired_pages: retired,
        retirement_pending: d.are_pages_pending_retired().ok(),
        ecc_uncorrected_volatile: d
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok(),
        ecc_uncorrected_aggregate: d
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            .ok(),
        pcie,
        throttle: d
            .current_throttle_reasons()
            .map(throttle_reasons)
            .unwrap_or_default(),
        nvlink_supported: (links > 0).then_some(links as u32),
        compute_processes: d.running_compute_processes().ok().map(|p| p.len() as u32),
    }
}

fn throttle_reasons(r: ThrottleReasons) -> Vec<ThrottleReason> {
    [
        (ThrottleReasons::HW_SLOWDOWN, ThrottleReason::HwSlowdown),
        (
            ThrottleReasons::HW_THERMAL_SLOWDOWN,
            ThrottleReason::HwThermal,
        ),
        (
            ThrottleReasons::SW_THERMAL_SLOWDOWN,
            ThrottleReason::SwThermal,
        ),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            ThrottleReason::HwPowerBrake,
        ),
    ]
    .into_iter()
    .filter(|(bit, _)| r.contains(*bit))
    .map(|(_, reason)| reason)
    .collect()
}

/// nvmlDeviceGetRemappedRows is not wrapped: call it raw.
fn remapped_rows(nvml: &Nvml, d: &Device) -> Option<RemappedRows> {
    let lib = nvml.lib();
    let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: a valid device handle and four out-parameters NVML writes.
    let rc = unsafe {
        lib.nvmlDeviceGetRemappedRows.as_ref().ok().map(|_| {
            lib.nvmlDeviceGetRemappedRows(
                d.handle(),
                &mut corr,
                &mut unc,
                &mut pending,
                &mut failed,
            )
        })
    }?;
    (rc == 0).then_some(RemappedRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failed: failed != 0,
    })
}

/// nvmlDeviceGetGpuFabricInfoV is not wrapped: call it raw (v3 struct, then the
/// unversioned call for older drivers).
fn fabric_state(nvml: &Nvml, d: &Device) -> Option<FabricState> {
    use nvml_wrapper_sys::bindings::{nvmlGpuFabricInfoV_t, nvmlGpuFabricInfo_t};
    let lib = nvml.lib();
    // SAFETY: the handle is valid for the life of `d`; the structs are plain C data
    // NVML fills in; the version field follows NVML_STRUCT_VERSION(GpuFabricInfo, 3).
    unsafe {
        let handle = d.handle();
        if lib.nvmlDeviceGetGpuFabricInfoV.is_ok() {
            let mut info: nvmlGpuFabricInfoV_t = std::mem::zeroed();
            info.version = std::mem::size_of::<nvmlGpuFabricInfoV_t>() as u32 | (3 << 24);
            if lib.nvmlDeviceGetGpuFabricInfoV(handle, &mut info) == 0 {
                return FabricState::from_nvml(info.state);
            }
        }
        if lib.nvmlDeviceGetGpuFabricInfo.is_ok() {
            let mut info: nvmlGpuFabricInfo_t = std::mem::zeroed();
            if lib.nvmlDeviceGetGpuFabricInfo(handle, &mut info) == 0 {
                return FabricState::from_nvml(info.state);
            }
        }
    }
    None
}

fn ancestor(level: TopologyLevel) -> PcieAncestor {
    match level {
        TopologyLevel::Internal => PcieAncestor::Internal,
        TopologyLevel::Single => PcieAncestor::Single,
        TopologyLevel::Multiple => PcieAncestor::Multiple,
        TopologyLevel::HostBridge => PcieAncestor::HostBridge,
        TopologyLevel::Node => PcieAncestor::Node,
        TopologyLevel::System => PcieAncestor::System,
    }
}

fn p2p_state(s: P2pStatus) -> P2pState {
    match s {
        P2pStatus::Ok => P2pState::Ok,
        P2pStatus::ChipsetNotSupported => P2pState::ChipsetNotSupported,
        P2pStatus::GpuNotSupported => P2pState::GpuNotSupported,
        P2pStatus::IohTopologyNotSupported => P2pState::TopologyNotSupported,
        P2pStatus::DisabledByRegkey => P2pState::DisabledByRegkey,
        P2pStatus::NotSupported => P2pState::NotSupported,
        P2pStatus::Unknown => P2pState::Unknown,
    }
}

/// /dev/nvidia* nodes (nvidiactl, nvidia-uvm, nvidiaN).
pub fn device_nodes(root: &Root) -> Vec<String> {
    root.list(paths::DEV)
        .into_iter()
        .filter(|n| n.starts_with("nvidia") && n != "nvidia-caps")
        .map(|n| format!("/dev/{n}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_nvml_absence_is_a_fact() {
        // This machine has no NVIDIA driver; on a GPU machine the probe must find GPUs.
        let facts = NvmlProbe.probe();
        if std::path::Path::new("/dev/nvidiactl").exists() {
            assert!(facts.count() > 0, "{facts:?}");
        } else {
            assert_eq!(facts.source, GpuSource::None);
            assert!(facts.nvml_error.unwrap().contains("NVML"));
        }
    }
}
