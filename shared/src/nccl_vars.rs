//! NCCL's variable names (docs/env.rst and src/, 2.18-2.30), to tell real settings
//! from folklore such as NCCL_P2P_DIRECT_WRITE, which NCCL never reads.

const KNOWN: &[&str] = &[
    "NCCL_ALGO",
    "NCCL_BUFFSIZE",
    "NCCL_CHECK_POINTERS",
    "NCCL_COLLNET_ENABLE",
    "NCCL_COLLNET_NODE_THRESHOLD",
    "NCCL_COMM_BLOCKING",
    "NCCL_COMM_ID",
    "NCCL_COMM_SPLIT_SHARE_RESOURCES",
    "NCCL_CONF_FILE",
    "NCCL_CREATE_THREAD_CONTEXT",
    "NCCL_CROSS_NIC",
    "NCCL_CTA_POLICY",
    "NCCL_CUMEM_ENABLE",
    "NCCL_CUMEM_HOST_ENABLE",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_TIMESTAMP_FORMAT",
    "NCCL_DEBUG_TIMESTAMP_LEVELS",
    "NCCL_DMABUF_ENABLE",
    "NCCL_GDRCOPY_ENABLE",
    "NCCL_GDRCOPY_FIFO_ENABLE",
    "NCCL_GDRCOPY_FLUSH_ENABLE",
    "NCCL_GDRCOPY_SYNC_ENABLE",
    "NCCL_GRAPH_DUMP_FILE",
    "NCCL_GRAPH_FILE",
    "NCCL_GRAPH_MIXING_SUPPORT",
    "NCCL_GRAPH_REGISTER",
    "NCCL_HOSTID",
    "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_AR_THRESHOLD",
    "NCCL_IB_DISABLE",
    "NCCL_IB_ECE_ENABLE",
    "NCCL_IB_FIFO_TC",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_HCA",
    "NCCL_IB_MERGE_NICS",
    "NCCL_IB_MERGE_VFS",
    "NCCL_IB_MQP_RETRY_ALL",
    "NCCL_IB_MQP_RETRY_CNT",
    "NCCL_IB_MQP_RETRY_SLEEP_MSEC",
    "NCCL_IB_OOO_RQ",
    "NCCL_IB_PCI_RELAXED_ORDERING",
    "NCCL_IB_PKEY",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_RETURN_ASYNC_EVENTS",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_SL",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_IB_TC",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_USE_INLINE",
    "NCCL_IGNORE_CPU_AFFINITY",
    "NCCL_IGNORE_DISABLED_P2P",
    "NCCL_IPC_USE_ABSTRACT_SOCKET",
    "NCCL_LAUNCH_MODE",
    "NCCL_LAUNCH_ORDER_IMPLICIT",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_LL128_NTHREADS",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LOCAL_REGISTER",
    "NCCL_MAX_CTAS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MAX_P2P_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MIN_P2P_NCHANNELS",
    "NCCL_MNNVL_CLIQUE_ID",
    "NCCL_MNNVL_ENABLE",
    "NCCL_MNNVL_UUID",
    "NCCL_NCHANNELS_PER_NET_PEER",
    "NCCL_NET",
    "NCCL_NETDEVS_POLICY",
    "NCCL_NET_DISABLE_INTRA",
    "NCCL_NET_FORCE_FLUSH",
    "NCCL_NET_GDR_C2C",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_NET_OVERHEAD",
    "NCCL_NET_PLUGIN",
    "NCCL_NET_SHARED_BUFFERS",
    "NCCL_NET_SHARED_COMMS",
    "NCCL_NTHREADS",
    "NCCL_NVB_DISABLE",
    "NCCL_NVLSTREE_MAX_CHUNKSIZE",
    "NCCL_NVLS_CHUNKSIZE",
    "NCCL_NVLS_ENABLE",
    "NCCL_NVLS_NCHANNELS",
    "NCCL_NVML_LIB",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_P2P_LL_THRESHOLD",
    "NCCL_P2P_NET_CHUNKSIZE",
    "NCCL_P2P_NVL_CHUNKSIZE",
    "NCCL_P2P_PCI_CHUNKSIZE",
    "NCCL_P2P_READ_ENABLE",
    "NCCL_P2P_USE_CUDA_MEMCPY",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_PROTO",
    "NCCL_PXN_C2C",
    "NCCL_PXN_DISABLE",
    "NCCL_RAS_ADDR",
    "NCCL_RAS_ENABLE",
    "NCCL_RAS_TIMEOUT_FACTOR",
    "NCCL_RUNTIME_CONNECT",
    "NCCL_SET_STACK_SIZE",
    "NCCL_SET_THREAD_NAME",
    "NCCL_SHARP_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_SHM_LOCALITY",
    "NCCL_SHM_MEMCPY_MODE",
    "NCCL_SHM_USE_CUDA_MEMCPY",
    "NCCL_SINGLE_RING_THRESHOLD",
    "NCCL_SOCKET_FAMILY",
    "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_SOCKET_RETRY_CNT",
    "NCCL_SOCKET_RETRY_SLEEP_MSEC",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_THREAD_THRESHOLDS",
    "NCCL_TOPO_DUMP_FILE",
    "NCCL_TOPO_FILE",
    "NCCL_TREE_THRESHOLD",
    "NCCL_TUNER_PLUGIN",
    "NCCL_WORK_FIFO_DEPTH",
    "NCCL_WORK_FIFO_BYTES",
    "NCCL_WIN_ENABLE",
    "NCCL_WIN_STRIDE",
    "NCCL_ENV_PLUGIN",
    "NCCL_MEM_SYNC_DOMAIN",
    "NCCL_NVLS_CHUNKSIZE",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS",
    "NCCL_P2P_NET_DISABLE",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_NET_MERGE_LEVEL",
    "NCCL_CHECKS_DISABLE",
    "NCCL_GDR_FLUSH_DISABLE",
    "NCCL_COLLNET_ENABLE",
];

/// Names that look like NCCL settings and circulate in job specs but do nothing.
const FOLKLORE: &[(&str, &str)] = &[
    (
        "NCCL_P2P_DIRECT_WRITE",
        "NCCL has no such variable; P2P write is its default where NVML allows it",
    ),
    (
        "NCCL_P2P_DIRECT_READ",
        "NCCL has no such variable; NCCL_P2P_READ_ENABLE is the real knob (rarely needed)",
    ),
];

/// Set by NVIDIA's container images to describe the bundled NCCL; not a setting.
const IMAGE_METADATA: &[&str] = &["NCCL_VERSION"];

/// Whether NCCL reads this variable (or it is image metadata, never worth a warning).
pub fn is_known(name: &str) -> bool {
    KNOWN.contains(&name) || IMAGE_METADATA.contains(&name)
}

/// Why a folklore variable is useless, if it is one.
pub fn folklore(name: &str) -> Option<&'static str> {
    FOLKLORE
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, why)| *why)
}

/// The known name closest to an unknown one (a typo's likely meaning).
pub fn closest(name: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_and_fake_names() {
        assert!(is_known("NCCL_P2P_LEVEL"));
        assert!(
            is_known("NCCL_VERSION"),
            "NVIDIA images set it; seen on the H200 host"
        );
        assert!(!is_known("NCCL_P2P_DIRECT_WRITE"));
        assert!(folklore("NCCL_P2P_DIRECT_WRITE").is_some());
        assert_eq!(closest("NCCL_SOCKET_IFNAM"), Some("NCCL_SOCKET_IFNAME"));
        assert_eq!(closest("NCCL_SOMETHING_ELSE_ENTIRELY"), None);
    }
}
