//! Known NCCL failure lines, each mapped to its cause and the fix.

use crate::finding::FindingId;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    /// Stable id, e.g. `nccl.shm_full`.
    pub id: FindingId,
    pub cause: &'static str,
    pub fix: &'static str,
    /// Whether it breaks the job (a WARN NCCL fails on) or only explains a slow path.
    pub fatal: bool,
}

struct Sig {
    all: &'static [&'static str],
    known: Known,
}

const fn sig(
    all: &'static [&'static str],
    id: FindingId,
    fatal: bool,
    cause: &'static str,
    fix: &'static str,
) -> Sig {
    Sig {
        all,
        known: Known {
            id,
            cause,
            fix,
            fatal,
        },
    }
}

const SPLIT_NETNS_CAUSE: &str = "ranks that NCCL takes for one host sit in different network namespaces (pods without hostNetwork): cuMem handles travel over abstract Unix sockets, which do not cross network namespaces";
const SPLIT_NETNS_FIX: &str = "set NCCL_CUMEM_ENABLE=0 on every rank (legacy CUDA IPC works across network namespaces, measured 322-329 GB/s on 2x H200), or run one pod per node with all its GPUs";

const SIGNATURES: &[Sig] = &[
    sig(&["failed to extend /dev/shm"], FindingId::NcclShmFull, true,
        "/dev/shm is too small for NCCL's shared-memory segments (SHM transport with its host buffers in /dev/shm files)",
        "mount a memory-backed emptyDir at /dev/shm (or hostIPC / docker --shm-size); and do not set NCCL_CUMEM_HOST_ENABLE=0, which moves NCCL's host buffers into /dev/shm"),
    sig(&["UDS: Sending data over socket", "failed"], FindingId::NcclSplitNetns, true,
        SPLIT_NETNS_CAUSE,
        SPLIT_NETNS_FIX),
    sig(&["ncclProxyClientGetFd", "failed"], FindingId::NcclSplitNetns, true,
        SPLIT_NETNS_CAUSE,
        SPLIT_NETNS_FIX),
    sig(&["ibv_reg_mr", "Cannot allocate memory"], FindingId::NcclMemlock, true,
        "RDMA memory registration failed: the locked-memory limit (ulimit -l) is too low",
        "give the container CAP_IPC_LOCK and an unlimited memlock limit (securityContext.capabilities.add: [IPC_LOCK]; docker --ulimit memlock=-1)"),
    sig(&["Cuda failure 217"], FindingId::NcclPeerAccess, true,
        "CUDA peer access is not supported between these GPUs (error 217) while NCCL tried cuMem host memory or P2P",
        "set NCCL_CUMEM_HOST_ENABLE=0 (with a /dev/shm large enough for the SHM transport), or NCCL_P2P_DISABLE=1 on hosts whose GPUs cannot reach each other"),
    sig(&["Cuda failure 'invalid argument'"], FindingId::NcclPeerGpu, true,
        "CUDA rejected NCCL's P2P setup (invalid argument): between co-located pods this is P2P to a GPU the pod cannot open (each pod sees only its own GPU)",
        "give the pods distinct NCCL_HOSTIDs (do not join them), or run one pod per node with all its GPUs"),
    sig(&["Cuda failure 800"], FindingId::NcclNotPermitted, true,
        "CUDA refused the operation (error 800, not permitted): typically importing another container's cuMem handle",
        "set NCCL_CUMEM_ENABLE=0, or run the ranks of one host in one pod"),
    sig(&["Cuda failure 802"], FindingId::NcclSystemNotReady, true,
        "CUDA reports the system not ready (error 802): on NVSwitch hosts the fabric manager is not running",
        "start nvidia-fabricmanager on the host (systemctl start nvidia-fabricmanager) and check `nvidia-smi -q | grep -A2 Fabric`"),
    sig(&["fi_getinfo", "No data available"], FindingId::NcclEfaMissing, true,
        "libfabric found no EFA provider: the container sees no EFA device",
        "request the EFA devices in the pod (resources.limits: vpc.amazonaws.com/efa: N) and run on an EFA-enabled instance"),
    sig(&["no socket interface found"], FindingId::NcclNoInterface, true,
        "NCCL found no network interface for its bootstrap",
        "set NCCL_SOCKET_IFNAME to an interface that exists in the container (`toporun topo` lists them)"),
    sig(&["Connect to", "failed"], FindingId::NcclConnect, true,
        "a rank could not open a TCP connection to another rank",
        "check that the nodes reach each other on the interface NCCL_SOCKET_IFNAME names and that no network policy blocks ephemeral ports between pods"),
    sig(&["cuMem host allocations do not appear to be working"], FindingId::NcclCumemHostOff, false,
        "cuMem host allocations failed (typically a seccomp profile refusing get_mempolicy): NCCL falls back to /dev/shm files for its host buffers",
        "give the container CAP_SYS_NICE or a seccomp profile that allows get_mempolicy, or a /dev/shm large enough for NCCL's segments"),
];

/// The known failure a line of NCCL's log shows, if any.
pub fn match_line(msg: &str) -> Option<&'static Known> {
    // Case-insensitive: NCCL versions differ ("Connect to" / "connect to"). Lowered
    // once per line, as every NCCL line comes through here.
    let msg = msg.to_ascii_lowercase();
    SIGNATURES
        .iter()
        .find(|s| s.all.iter().all(|w| msg.contains(&w.to_ascii_lowercase())))
        .map(|s| &s.known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_failure_lines_map_to_their_cause() {
        let cases = [
            ("misc/shmutils.cc:87 NCCL WARN Error: failed to extend /dev/shm/nccl-wexIdu to 9637892 bytes, error: No space left on device (28)", "nccl.shm_full"),
            ("misc/ipcsocket.cc:221 NCCL WARN UDS: Sending data over socket /tmp/nccl-socket-1-ab failed : Connection refused (111)", "nccl.split_netns"),
            ("proxy.cc:1239 NCCL WARN ncclProxyClientGetFd call to tpRank 1 handle 0x1 failed : 2", "nccl.split_netns"),
            ("NET/IB : ibv_reg_mr failed: Cannot allocate memory", "nccl.memlock"),
            ("Cuda failure 217 'peer access is not supported between these two devices'", "nccl.peer_access"),
            ("Cuda failure 802 'system not yet initialized'", "nccl.system_not_ready"),
            ("NET/OFI fi_getinfo call failed: No data available", "nccl.efa_missing"),
            ("Bootstrap : no socket interface found", "nccl.no_interface"),
            ("Cuda failure 800 'operation not permitted'", "nccl.not_permitted"),
            ("Cuda failure 'invalid argument'", "nccl.peer_gpu"),
            ("socketStartConnect: connect to 192.0.2.2<34489> failed : Network is unreachable", "nccl.connect"),
        ];
        for (msg, id) in cases {
            assert_eq!(match_line(msg).map(|k| k.id.as_str()), Some(id), "{msg}");
        }
        assert!(match_line("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM").is_none());
        assert!(
            !match_line("cuMem host allocations do not appear to be working, falling back")
                .unwrap()
                .fatal
        );
    }
}
