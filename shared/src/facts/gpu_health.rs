//! What NVML says of a GPU's health: memory faults, its PCIe link, clock throttling
//! for hardware reasons, NVLink links, other processes. Every field is optional: an
//! older driver or a GPU without the feature answers "not supported".

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuHealth {
    /// Row remapping (A100 and later): nvmlDeviceGetRemappedRows.
    pub remapped_rows: Option<RemappedRows>,
    /// Pages retired for ECC errors (before A100), both causes together.
    pub retired_pages: Option<u32>,
    /// A page retirement waits for the next GPU reset.
    pub retirement_pending: Option<bool>,
    /// Uncorrected ECC errors since the driver loaded (volatile counter).
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Uncorrected ECC errors over the GPU's lifetime (aggregate counter).
    pub ecc_uncorrected_aggregate: Option<u64>,
    pub pcie: Option<PcieLink>,
    /// Throttle reasons that mean hardware trouble, as named by `ThrottleReason`.
    pub throttle: Vec<ThrottleReason>,
    /// NVLink links that answer (active or not); active ones are in `Gpu::nvlink`.
    pub nvlink_supported: Option<u32>,
    /// Compute processes holding this GPU when probed (this toporun holds none then).
    pub compute_processes: Option<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remap waits for a GPU reset: until then the bad row is still in use.
    pub pending: bool,
    /// A remap failed: the GPU has run out of spare rows.
    pub failed: bool,
}

/// The PCIe link as trained now and at most. The generation drops while a GPU idles
/// (power saving), so only a narrower width is a fault seen at rest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PcieLink {
    pub gen: u32,
    pub max_gen: u32,
    pub width: u32,
    pub max_width: u32,
}

/// nvmlClocksThrottleReason bits that are not the GPU idling or obeying a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThrottleReason {
    /// HW slowdown: overheating or the power supply's brake signal.
    HwSlowdown,
    HwThermal,
    SwThermal,
    HwPowerBrake,
}

impl ThrottleReason {
    pub fn describe(self) -> &'static str {
        match self {
            ThrottleReason::HwSlowdown => "hardware slowdown (clocks cut by half or more)",
            ThrottleReason::HwThermal => "hardware thermal slowdown (GPU too hot)",
            ThrottleReason::SwThermal => "driver thermal slowdown (GPU or memory too hot)",
            ThrottleReason::HwPowerBrake => "power brake (the power supply asked for less)",
        }
    }
}

impl GpuHealth {
    /// Uncorrectable memory state that needs the GPU reset or replaced.
    pub fn memory_fault(&self) -> Option<String> {
        let mut out = Vec::new();
        if let Some(r) = self.remapped_rows {
            if r.failed {
                out.push("a row remap failed (no spare rows left)".to_string());
            }
            if r.pending {
                out.push("a row remap is pending (needs a GPU reset)".to_string());
            }
        }
        if let Some(n) = self.ecc_uncorrected_volatile.filter(|n| *n > 0) {
            out.push(format!(
                "{n} uncorrectable ECC error(s) since the driver loaded"
            ));
        }
        (!out.is_empty()).then(|| out.join(", "))
    }
}
