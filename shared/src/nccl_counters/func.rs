//! NCCL's operation names (ncclFuncToString) and datatype sizes (ncclDatatypeToString),
//! as the profiler's event descriptors give them.

use serde::{Deserialize, Serialize};

/// An NCCL operation, by the id the counters file stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum NcclFunc {
    Unknown,
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AlltoAll,
    Send,
    Recv,
    SendRecv,
    Gather,
    Scatter,
}

const ALL: [(NcclFunc, &str, &str); NcclFunc::COUNT] = [
    (NcclFunc::Unknown, "", "unknown"),
    (NcclFunc::AllReduce, "AllReduce", "all_reduce"),
    (NcclFunc::AllGather, "AllGather", "all_gather"),
    (NcclFunc::ReduceScatter, "ReduceScatter", "reduce_scatter"),
    (NcclFunc::Broadcast, "Broadcast", "broadcast"),
    (NcclFunc::Reduce, "Reduce", "reduce"),
    (NcclFunc::AlltoAll, "AlltoAll", "all_to_all"),
    (NcclFunc::Send, "Send", "send"),
    (NcclFunc::Recv, "Recv", "recv"),
    (NcclFunc::SendRecv, "SendRecv", "send_recv"),
    (NcclFunc::Gather, "Gather", "gather"),
    (NcclFunc::Scatter, "Scatter", "scatter"),
];

impl NcclFunc {
    pub const COUNT: usize = 12;

    /// From NCCL's name (`AllReduce`), as bytes (the plugin compares without
    /// allocating).
    pub fn from_nccl(name: &[u8]) -> NcclFunc {
        ALL.iter()
            .skip(1)
            .find(|(_, n, _)| n.as_bytes() == name)
            .map_or(NcclFunc::Unknown, |(f, _, _)| *f)
    }

    pub fn id(self) -> usize {
        self as usize
    }

    pub fn from_id(id: u64) -> NcclFunc {
        ALL.get(id as usize)
            .map_or(NcclFunc::Unknown, |(f, _, _)| *f)
    }

    /// torch's name of the collective (`all_reduce`), as toporun's reports write it.
    pub fn kind(self) -> &'static str {
        ALL[self.id()].2
    }

    pub fn is_p2p(self) -> bool {
        matches!(self, NcclFunc::Send | NcclFunc::Recv | NcclFunc::SendRecv)
    }

    /// The bytes the links carry per byte of `bytes` (count x datatype size, as the
    /// descriptor gives it: per rank for AllGather's send and ReduceScatter's
    /// receive), in a group of `n`: nccl-tests' bus-bandwidth factors. None where
    /// no factor applies (point-to-point, unknown).
    pub fn bus_factor(self, n: u32) -> Option<f64> {
        let n = f64::from(n.max(1));
        Some(match self {
            NcclFunc::AllReduce => 2.0 * (n - 1.0) / n,
            NcclFunc::AllGather | NcclFunc::ReduceScatter => n - 1.0,
            NcclFunc::AlltoAll => (n - 1.0) / n,
            NcclFunc::Broadcast | NcclFunc::Reduce => 1.0,
            _ => return None,
        })
    }
}

/// The size of NCCL's datatype `name` (`ncclFloat32`) in bytes; 0 where unknown.
pub fn datatype_bytes(name: &[u8]) -> u64 {
    match name {
        b"ncclInt8" | b"ncclUint8" | b"ncclFloat8e4m3" | b"ncclFloat8e5m2" => 1,
        b"ncclFloat16" | b"ncclBfloat16" => 2,
        b"ncclInt32" | b"ncclUint32" | b"ncclFloat32" => 4,
        b"ncclInt64" | b"ncclUint64" | b"ncclFloat64" => 8,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_names_map_to_ids_and_back() {
        for (f, name, _) in ALL.iter().skip(1) {
            assert_eq!(NcclFunc::from_nccl(name.as_bytes()), *f);
            assert_eq!(NcclFunc::from_id(f.id() as u64), *f);
        }
        assert_eq!(NcclFunc::from_nccl(b"PutSignal"), NcclFunc::Unknown);
        assert_eq!(NcclFunc::from_id(99), NcclFunc::Unknown);
        assert_eq!(NcclFunc::AllReduce.kind(), "all_reduce");
    }

    #[test]
    fn bus_factors_are_nccl_tests() {
        assert_eq!(NcclFunc::AllReduce.bus_factor(4), Some(1.5));
        assert_eq!(NcclFunc::AllGather.bus_factor(4), Some(3.0));
        assert_eq!(NcclFunc::Send.bus_factor(4), None);
        assert_eq!(datatype_bytes(b"ncclBfloat16"), 2);
        assert_eq!(datatype_bytes(b"ncclFloat32"), 4);
        assert_eq!(datatype_bytes(b"Unknown"), 0);
    }
}
