//! Every finding's stable id, as one type: what `--format json`, JUnit, dashboards
//! and docs/findings.md name. A new finding is a new variant (and a catalogue row:
//! docs_e2e checks every id is there).

use crate::named_enum::named_enum;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

named_enum! {
    /// A finding's stable id.
    FindingId, as_str {
        ShmSize => "shm.size",
        IpcNamespace => "ipc.namespace",
        CapsIpcLock => "caps.ipc_lock",
        CapsSysNice => "caps.sys_nice",
        Memlock => "memlock",
        NetInterface => "net.interface",
        EfaDevices => "efa.devices",
        InstanceDevices => "instance.devices",
        GpuVisible => "gpu.visible",
        GpuFabric => "gpu.fabric",
        GpuP2p => "gpu.p2p",
        GpuMemory => "gpu.memory",
        GpuPcie => "gpu.pcie",
        GpuThrottle => "gpu.throttle",
        GpuNvlink => "gpu.nvlink",
        GpuMode => "gpu.mode",
        GpuProcesses => "gpu.processes",
        GpuBandwidth => "gpu.bandwidth",
        GpuHostBandwidth => "gpu.host_bandwidth",
        LaunchEntrypoint => "launch.entrypoint",
        LaunchPythonTorch => "launch.python_torch",
        NcclEnv => "nccl.env",
        RdzvColocated => "rdzv.colocated",
        NcclPrediction => "nccl.prediction",
        NcclTransport => "nccl.transport",
        NcclShmFull => "nccl.shm_full",
        NcclSplitNetns => "nccl.split_netns",
        NcclMemlock => "nccl.memlock",
        NcclPeerAccess => "nccl.peer_access",
        NcclPeerGpu => "nccl.peer_gpu",
        NcclNotPermitted => "nccl.not_permitted",
        NcclSystemNotReady => "nccl.system_not_ready",
        NcclEfaMissing => "nccl.efa_missing",
        NcclNoInterface => "nccl.no_interface",
        NcclConnect => "nccl.connect",
        NcclCumemHostOff => "nccl.cumem_host_off",
        NetworkSlowNode => "network.slow_node",
    }
}

impl FindingId {
    /// The id spelt `s`, where one is.
    pub fn parse(s: &str) -> Option<FindingId> {
        FindingId::ALL.iter().copied().find(|i| i.as_str() == s)
    }
}

impl fmt::Display for FindingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for FindingId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for FindingId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FindingId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        FindingId::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown finding id {s:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_round_trip_through_json() {
        let mut seen = std::collections::BTreeSet::new();
        for id in FindingId::ALL {
            assert!(seen.insert(id.as_str()), "{id} twice");
            let json = serde_json::to_string(id).unwrap();
            assert_eq!(json, format!("\"{id}\""));
            assert_eq!(serde_json::from_str::<FindingId>(&json).unwrap(), *id);
        }
        assert!(serde_json::from_str::<FindingId>("\"no.such\"").is_err());
        assert_eq!(FindingId::parse("shm.size"), Some(FindingId::ShmSize));
    }
}
