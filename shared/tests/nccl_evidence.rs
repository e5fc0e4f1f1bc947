//! One test per measured row of tests/fixtures/device/nccl-evidence.md (2x H200,
//! NCCL 2.28.9): toporun's predictions must agree with what NCCL did.

use std::collections::BTreeMap;
use toporun_shared::colocation::{predict, Node, Outcome, CRASH_PEER_GPU, CRASH_UDS};
use toporun_shared::facts::{cap, HostFacts, ShmFacts, FACTS_SCHEMA};
use toporun_shared::finding::Severity;
use toporun_shared::plan::{self, LaunchShape, PlanMode};
use toporun_shared::preflight::{self, PreflightOptions};

// ---- /dev/shm of 64 MiB (rows S1-S6) ----

fn h200x2_small_shm(sys_nice: bool, env: &[(&str, &str)]) -> HostFacts {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/hosts/h200x4.json"
    ))
    .unwrap();
    let mut f = HostFacts::from_json(&text).unwrap();
    assert_eq!(f.schema, FACTS_SCHEMA);
    f.container.shm = Some(ShmFacts {
        total_bytes: 64 << 20,
        free_bytes: 64 << 20,
        fs_type: Some("tmpfs".into()),
        dev: Some(1),
    });
    if !sys_nice {
        f.container.caps.effective &= !(1 << cap::SYS_NICE);
    }
    // That host had no seccomp filter: get_mempolicy worked with or without SYS_NICE.
    f.container.get_mempolicy = Some(true);
    f.platform.nccl_version = Some("2.28.9".into());
    for (k, v) in env {
        f.container.env.insert(k.to_string(), v.to_string());
    }
    f
}

fn shm_severity(f: &HostFacts) -> Severity {
    preflight::run(f, &PreflightOptions::default())
        .into_iter()
        .find(|x| x.id == "shm.size")
        .unwrap()
        .severity
}

#[test]
fn s1_defaults_work_in_64mib() {
    assert!(shm_severity(&h200x2_small_shm(true, &[])) < Severity::Error);
}

#[test]
fn s2_p2p_off_works_on_cumem_host_memory() {
    assert!(shm_severity(&h200x2_small_shm(true, &[("NCCL_P2P_DISABLE", "1")])) < Severity::Error);
}

#[test]
fn s3_sys_nice_dropped_defaults_work() {
    assert!(shm_severity(&h200x2_small_shm(false, &[])) < Severity::Error);
}

#[test]
fn s4_sys_nice_dropped_p2p_off_works_without_seccomp() {
    assert!(shm_severity(&h200x2_small_shm(false, &[("NCCL_P2P_DISABLE", "1")])) < Severity::Error);
}

#[test]
fn s5_cumem_host_off_with_p2p_works() {
    assert!(
        shm_severity(&h200x2_small_shm(false, &[("NCCL_CUMEM_HOST_ENABLE", "0")]))
            < Severity::Error
    );
}

#[test]
fn s6_cumem_host_off_and_p2p_off_fails() {
    let f = h200x2_small_shm(
        false,
        &[("NCCL_CUMEM_HOST_ENABLE", "0"), ("NCCL_P2P_DISABLE", "1")],
    );
    assert_eq!(shm_severity(&f), Severity::Error);
}

#[test]
fn s7_the_plan_never_forces_shm_files_on_the_g6e_pod() {
    // g6e: all pairs NODE (no P2P: SHM transport), no SYS_NICE, pip NCCL of unknown
    // version, 64 MiB /dev/shm: setting NCCL_CUMEM_HOST_ENABLE=0 would be S6's failure.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/hosts/g6e.12xlarge.json"
    ))
    .unwrap();
    let mut f = HostFacts::from_json(&text).unwrap();
    f.container.caps.effective &= !(1 << cap::SYS_NICE);
    f.platform.nccl_version = None;
    f.container.shm = Some(ShmFacts {
        total_bytes: 64 << 20,
        free_bytes: 64 << 20,
        fs_type: Some("tmpfs".into()),
        dev: None,
    });
    let shape = LaunchShape {
        nnodes: 1,
        nproc_per_node: 4,
        master_addr: None,
    };
    let p = plan::plan(&f, &BTreeMap::new(), &shape, PlanMode::On);
    let v = p
        .variables
        .iter()
        .find(|v| v.name == "NCCL_CUMEM_HOST_ENABLE")
        .unwrap();
    assert_eq!(v.value, None, "{}", v.reason);
    assert!(shm_severity(&f) < Severity::Error);
}

// ---- Two nodes of 1 GPU on one host (rows N1-N4, V1-V11, P1-P5) ----

#[derive(Clone, Copy)]
struct Split {
    hostname: bool,
    net: bool,
    ipc: bool,
    shm: bool,
    /// A private /dev holding only the node's own GPU (a device-plugin pod).
    own_gpu: bool,
}

const NONE: Split = Split {
    hostname: false,
    net: false,
    ipc: false,
    shm: false,
    own_gpu: false,
};

fn pair(split: Split, env: &[(&str, &str)]) -> Outcome {
    let node = |i: u64| Node {
        hostname: if split.hostname && i == 1 {
            "otherpod".into()
        } else {
            "vm".into()
        },
        boot_id: Some("9143fd18".into()),
        net_ns: Some(if split.net { 100 + i } else { 100 }),
        ipc_ns: Some(if split.ipc { 200 + i } else { 200 }),
        shm_dev: Some(if split.shm { 300 + i } else { 300 }),
        gpu_nodes: if split.own_gpu {
            vec![format!("/dev/nvidia{i}")]
        } else {
            vec!["/dev/nvidia0".into(), "/dev/nvidia1".into()]
        },
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    predict(&node(0), &node(1))
}

const HOSTID: (&str, &str) = ("NCCL_HOSTID", "samehost");
const CUMEM_OFF: (&str, &str) = ("NCCL_CUMEM_ENABLE", "0");

#[test]
fn n1_same_container_p2p_cumem() {
    assert_eq!(pair(NONE, &[]), Outcome::OneHost("P2P/CUMEM"));
}
#[test]
fn n2_other_hostname_goes_over_sockets() {
    assert_eq!(
        pair(
            Split {
                hostname: true,
                ..NONE
            },
            &[]
        ),
        Outcome::Network
    );
}
#[test]
fn n3_own_ipc_namespace_alone_stays_p2p_cumem() {
    assert_eq!(
        pair(Split { ipc: true, ..NONE }, &[]),
        Outcome::OneHost("P2P/CUMEM")
    );
}
#[test]
fn n4_other_hostname_same_hostid_is_one_host() {
    assert_eq!(
        pair(
            Split {
                hostname: true,
                ..NONE
            },
            &[HOSTID]
        ),
        Outcome::OneHost("P2P/CUMEM")
    );
}
#[test]
fn v1_network_namespace_only_crashes() {
    assert_eq!(
        pair(Split { net: true, ..NONE }, &[]),
        Outcome::Crash(CRASH_UDS)
    );
}
#[test]
fn v2_network_namespace_and_hostname_go_over_sockets() {
    assert_eq!(
        pair(
            Split {
                net: true,
                hostname: true,
                ..NONE
            },
            &[]
        ),
        Outcome::Network
    );
}
#[test]
fn v3_network_namespace_same_hostid_crashes() {
    assert_eq!(
        pair(
            Split {
                net: true,
                hostname: true,
                ..NONE
            },
            &[HOSTID]
        ),
        Outcome::Crash(CRASH_UDS)
    );
}
#[test]
fn v4_same_hostid_and_cumem_off_run_p2p_ipc() {
    assert_eq!(
        pair(
            Split {
                net: true,
                hostname: true,
                ..NONE
            },
            &[HOSTID, CUMEM_OFF]
        ),
        Outcome::OneHost("P2P/IPC")
    );
}
#[test]
fn v5_network_namespace_cumem_off_runs_p2p_ipc() {
    assert_eq!(
        pair(Split { net: true, ..NONE }, &[CUMEM_OFF]),
        Outcome::OneHost("P2P/IPC")
    );
}
#[test]
fn v6_network_namespace_p2p_off_crashes_on_cumem_host() {
    assert_eq!(
        pair(Split { net: true, ..NONE }, &[("NCCL_P2P_DISABLE", "1")]),
        Outcome::Crash(CRASH_UDS)
    );
}
#[test]
fn v7_network_namespace_p2p_off_cumem_host_off_runs_shm() {
    assert_eq!(
        pair(
            Split { net: true, ..NONE },
            &[("NCCL_P2P_DISABLE", "1"), ("NCCL_CUMEM_HOST_ENABLE", "0")]
        ),
        Outcome::OneHost("SHM/direct/direct")
    );
}
#[test]
fn v8_own_dev_shm_splits_hosts() {
    assert_eq!(
        pair(
            Split {
                net: true,
                shm: true,
                ..NONE
            },
            &[("NCCL_P2P_DISABLE", "1")]
        ),
        Outcome::Network
    );
}
#[test]
fn v9_all_namespaces_same_hostid_cumem_off_p2p_ipc() {
    assert_eq!(
        pair(
            Split {
                net: true,
                hostname: true,
                ipc: true,
                ..NONE
            },
            &[HOSTID, CUMEM_OFF]
        ),
        Outcome::OneHost("P2P/IPC")
    );
}
#[test]
fn v10_network_and_ipc_namespaces_cumem_off_p2p_ipc() {
    assert_eq!(
        pair(
            Split {
                net: true,
                ipc: true,
                ..NONE
            },
            &[CUMEM_OFF]
        ),
        Outcome::OneHost("P2P/IPC")
    );
}
#[test]
fn v11_network_and_ipc_namespaces_defaults_crash() {
    assert_eq!(
        pair(
            Split {
                net: true,
                ipc: true,
                ..NONE
            },
            &[]
        ),
        Outcome::Crash(CRASH_UDS)
    );
}

const POD: Split = Split {
    hostname: true,
    net: true,
    ipc: true,
    shm: false,
    own_gpu: true,
};

#[test]
fn p1_pods_sharing_dev_shm_default_to_sockets() {
    assert_eq!(pair(POD, &[]), Outcome::Network);
}
#[test]
fn p2_pods_with_one_hostid_crash() {
    assert!(matches!(pair(POD, &[HOSTID]), Outcome::Crash(_)));
}
#[test]
fn p3_pods_that_see_only_their_own_gpu_fail_joined() {
    // Measured this session (run3/run4): read-only private /dev with only the pod's
    // GPU, HOSTID + NCCL_CUMEM_ENABLE=0: P2P/IPC chosen, then transport/p2p.cc
    // "Cuda failure 'invalid argument'". The reference table's 327 GB/s row had a /dev
    // in which CUDA could reach the peer GPU (see nccl-evidence.md).
    assert_eq!(
        pair(POD, &[HOSTID, CUMEM_OFF]),
        Outcome::Crash(CRASH_PEER_GPU)
    );
}
#[test]
fn p4_pods_that_see_every_gpu_run_p2p_ipc_joined() {
    assert_eq!(
        pair(
            Split {
                own_gpu: false,
                ..POD
            },
            &[HOSTID, CUMEM_OFF]
        ),
        Outcome::OneHost("P2P/IPC")
    );
    assert_eq!(
        pair(
            Split {
                own_gpu: false,
                ipc: false,
                ..POD
            },
            &[HOSTID, CUMEM_OFF]
        ),
        Outcome::OneHost("P2P/IPC")
    );
}
#[test]
fn p5_pods_with_own_dev_shm_stay_apart_even_joined() {
    assert_eq!(
        pair(Split { shm: true, ..POD }, &[HOSTID, CUMEM_OFF]),
        Outcome::Network
    );
}
