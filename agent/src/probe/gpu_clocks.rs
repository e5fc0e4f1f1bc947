//! A GPU's state at one stack sample, for `toporun top` and the straggler finding:
//! utilisation, SM clock against its maximum, why the clocks are held down, and the
//! PCIe replay and NVLink error counters (which a failing link grows).

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::Device;
use toporun_shared::stacks::rank_window::{ClockLimit, GpuNow};

/// NVML behind a trait: the sampler thread reads through it; tests hand in readings.
pub trait GpuClocks: Send {
    /// The GPUs of `indices` that could be read.
    fn read(&mut self, indices: &[u32]) -> Vec<GpuNow>;
}

/// The process's NVML (none where it cannot be: no GPU here).
pub struct NvmlClocks;

impl GpuClocks for NvmlClocks {
    fn read(&mut self, indices: &[u32]) -> Vec<GpuNow> {
        if indices.is_empty() {
            return Vec::new();
        }
        let Ok(nvml) = crate::probe::nvml_session::nvml() else {
            return Vec::new();
        };
        indices
            .iter()
            .filter_map(|i| Some(now(*i, &nvml.device_by_index(*i).ok()?)))
            .collect()
    }
}

/// NVLink links a GPU can have (NVML_NVLINK_MAX_LINKS).
const MAX_NVLINKS: u32 = 18;

fn now(index: u32, d: &Device) -> GpuNow {
    let nvlink_errors: u64 = (0..MAX_NVLINKS)
        .map(|l| d.link_wrapper_for(l))
        .filter(|l| l.is_active().unwrap_or(false))
        .flat_map(|l| {
            [
                ErrorCounter::DlReplay,
                ErrorCounter::DlRecovery,
                ErrorCounter::DlCrcFlit,
            ]
            .map(|c| l.error_counter(c).unwrap_or(0))
        })
        .sum();
    GpuNow {
        index,
        util_pct: d.utilization_rates().ok().map(|u| u.gpu),
        sm_mhz: d.clock_info(Clock::SM).ok(),
        sm_max_mhz: d.max_clock_info(Clock::SM).ok(),
        limits: d.current_throttle_reasons().map(limits).unwrap_or_default(),
        pcie_replays: d.pcie_replay_counter().ok().map(u64::from),
        nvlink_errors: Some(nvlink_errors),
    }
}

fn limits(r: ThrottleReasons) -> Vec<ClockLimit> {
    [
        (ThrottleReasons::GPU_IDLE, ClockLimit::Idle),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            ClockLimit::ApplicationClocks,
        ),
        (ThrottleReasons::SW_POWER_CAP, ClockLimit::PowerCap),
        (ThrottleReasons::HW_SLOWDOWN, ClockLimit::HwSlowdown),
        (ThrottleReasons::SYNC_BOOST, ClockLimit::SyncBoost),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, ClockLimit::SwThermal),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, ClockLimit::HwThermal),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            ClockLimit::HwPowerBrake,
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            ClockLimit::DisplayClock,
        ),
    ]
    .into_iter()
    .filter(|(bit, _)| r.contains(*bit))
    .map(|(_, l)| l)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_bits_become_clock_limits() {
        let r = ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_THERMAL_SLOWDOWN;
        assert_eq!(limits(r), vec![ClockLimit::PowerCap, ClockLimit::HwThermal]);
        assert!(limits(ThrottleReasons::empty()).is_empty());
    }

    #[test]
    fn no_nvml_reads_no_gpu() {
        // This machine has no driver: nothing is read, nothing fails.
        let mut c = NvmlClocks;
        if crate::probe::nvml_session::nvml().is_err() {
            assert!(c.read(&[0, 1]).is_empty());
        }
        assert!(c.read(&[]).is_empty());
    }
}
