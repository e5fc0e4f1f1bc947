//! Bandwidths measured on a 4x H200 host (NV18, NCCL 2.28.9, NVLS off; all_reduce
//! busbw, tests/fixtures/source/bench/allreduce-h200x4.json). Findings quote them so
//! a warning carries its cost.

/// P2P over NVLink (NCCL's default there), 1 GiB.
pub const NVLINK_P2P_GBPS: f64 = 353.4;
/// NCCL_P2P_DISABLE=1: staged through /dev/shm.
pub const SHM_GBPS: f64 = 27.5;
/// NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1: TCP sockets.
pub const SOCKET_GBPS: f64 = 4.6;
/// 1 MiB all_reduce, default protocols vs NCCL_PROTO=Simple.
pub const SMALL_DEFAULT_GBPS: f64 = 63.8;
pub const SMALL_SIMPLE_GBPS: f64 = 9.7;

pub fn slowdown(fast: f64, slow: f64) -> String {
    format!("{:.1}x slower", fast / slow)
}

/// Two pods on one 2x H200 host (own network, UTS, IPC namespaces, private /dev),
/// all_reduce busbw at 1 GiB: NCCL's default (sockets) and joined (shared /dev/shm,
/// same NCCL_HOSTID, NCCL_CUMEM_ENABLE=0: P2P/IPC). tests/fixtures/device/nccl-evidence.md.
pub const POD_SOCKET_GBPS: f64 = 2.6;
pub const POD_JOINED_GBPS: f64 = 327.0;
