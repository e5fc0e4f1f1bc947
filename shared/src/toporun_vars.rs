//! Every `TOPORUN_*` variable toporun reads, as one table: an option's fallback (the
//! launcher's `Extra::var` names its entry here) or a setting of its own. The README's
//! table documents each (docs_e2e checks `ToporunVar::ALL` against it).

use crate::named_enum::named_enum;

named_enum! {
    /// A `TOPORUN_*` variable.
    ToporunVar, name {
        Preflight => "TOPORUN_PREFLIGHT",
        PreflightMeasure => "TOPORUN_PREFLIGHT_MEASURE",
        NcclReport => "TOPORUN_NCCL_REPORT",
        Colocated => "TOPORUN_COLOCATED",
        NetworkCheck => "TOPORUN_NETWORK_CHECK",
        NetworkCheckPath => "TOPORUN_NETWORK_CHECK_PATH",
        TerminationLog => "TOPORUN_TERMINATION_LOG",
        RdzvToken => "TOPORUN_RDZV_TOKEN",
        FlightRecorder => "TOPORUN_FLIGHT_RECORDER",
        GpuTiming => "TOPORUN_GPU_TIMING",
        NcclProfiler => "TOPORUN_NCCL_PROFILER",
        NcclCounters => "TOPORUN_NCCL_COUNTERS",
        NcclKernelSampling => "TOPORUN_NCCL_KERNEL_SAMPLING",
        ExitCodes => "TOPORUN_EXIT_CODES",
        XidReplay => "TOPORUN_XID_REPLAY",
        StopFile => "TOPORUN_STOP_FILE",
        StopGrace => "TOPORUN_STOP_GRACE",
        WatchPreemption => "TOPORUN_WATCH_PREEMPTION",
        StopSignalTo => "TOPORUN_STOP_SIGNAL_TO",
        Faulthandler => "TOPORUN_FAULTHANDLER",
        ReadStderr => "TOPORUN_READ_STDERR",
        HangTimeout => "TOPORUN_HANG_TIMEOUT",
        Stragglers => "TOPORUN_STRAGGLERS",
        StragglerWindow => "TOPORUN_STRAGGLER_WINDOW",
        OnHang => "TOPORUN_ON_HANG",
        InitWarnSecs => "TOPORUN_INIT_WARN_SECS",
        NoMetadata => "TOPORUN_NO_METADATA",
        AzureMetadataEndpoint => "TOPORUN_AZURE_METADATA_ENDPOINT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prefixed() {
        let mut seen = std::collections::BTreeSet::new();
        for v in ToporunVar::ALL {
            assert!(v.name().starts_with("TOPORUN_"), "{v:?}");
            assert!(seen.insert(v.name()), "{v:?} twice");
        }
    }
}
