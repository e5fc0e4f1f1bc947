//! Nodes of one job on one physical host (same boot_id): what NCCL 2.28.9 will make
//! of them, measured on 2x H200 (tests/fixtures/device/nccl-evidence.md), and the
//! variables that join them onto NVLink where the pod spec allows it.
//!
//! NCCL's host identity is NCCL_HOSTID, else hostname + boot_id; a private /dev/shm
//! mount also splits hosts; the IPC namespace does not. Ranks that NCCL groups into
//! one host but that sit in different network namespaces crash at their first
//! collective with cuMem (its handles travel over abstract Unix sockets), and work at
//! full speed over legacy CUDA IPC with NCCL_CUMEM_ENABLE=0.

use crate::finding::FindingId;
use crate::finding::{Finding, Severity};
use crate::measured;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The variables that decide what NCCL makes of co-located nodes.
pub const VARS: &[&str] = &[
    "NCCL_HOSTID",
    "NCCL_CUMEM_ENABLE",
    "NCCL_CUMEM_HOST_ENABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
];

/// What one node tells the others about where it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Node {
    pub hostname: String,
    pub boot_id: Option<String>,
    pub net_ns: Option<u64>,
    pub ipc_ns: Option<u64>,
    /// Device number of its /dev/shm mount.
    pub shm_dev: Option<u64>,
    /// Its GPU device nodes (/dev/nvidiaN): pods of the device plugin see only their
    /// own, and CUDA cannot map a GPU it cannot open.
    pub gpu_nodes: Vec<String>,
    /// The values of `VARS` its ranks will see.
    pub env: BTreeMap<String, String>,
}

impl Node {
    fn is(&self, var: &str, value: &str) -> bool {
        self.env.get(var).map(|v| v.trim()) == Some(value)
    }

    fn nccl_host(&self) -> String {
        self.env.get("NCCL_HOSTID").cloned().unwrap_or_else(|| {
            format!("{}{}", self.hostname, self.boot_id.as_deref().unwrap_or(""))
        })
    }
}

/// What NCCL does between two nodes on one physical host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// NCCL sees one host; the transport it uses.
    OneHost(&'static str),
    /// NCCL sees two hosts: sockets (or RDMA) between GPUs of one machine.
    Network,
    /// NCCL sees one host and the job fails at the first collective; why.
    Crash(&'static str),
}

/// cuMem handles over a Unix socket that does not cross network namespaces.
pub const CRASH_UDS: &str =
    "cuMem across network namespaces: \"unhandled system error\" (UDS: connection refused)";
/// CUDA IPC to a GPU whose device node this container lacks.
pub const CRASH_PEER_GPU: &str = "P2P to a GPU this container cannot open: \"Cuda failure 'invalid argument'\" (transport/p2p.cc)";

/// Two nodes, same boot_id.
pub fn predict(a: &Node, b: &Node) -> Outcome {
    let shm_split = matches!((a.shm_dev, b.shm_dev), (Some(x), Some(y)) if x != y);
    if a.nccl_host() != b.nccl_host() || shm_split {
        return Outcome::Network;
    }
    let both = |var, v| a.is(var, v) && b.is(var, v);
    let p2p_off = a.is("NCCL_P2P_DISABLE", "1") || b.is("NCCL_P2P_DISABLE", "1");
    let cumem_off = both("NCCL_CUMEM_ENABLE", "0");
    let cumem_host_off = cumem_off || both("NCCL_CUMEM_HOST_ENABLE", "0");
    let split_net = a.net_ns != b.net_ns;
    if p2p_off && (a.is("NCCL_SHM_DISABLE", "1") || b.is("NCCL_SHM_DISABLE", "1")) {
        return Outcome::Network;
    }
    let peers_hidden =
        !a.gpu_nodes.is_empty() && !b.gpu_nodes.is_empty() && a.gpu_nodes != b.gpu_nodes;
    match (p2p_off, split_net) {
        (false, _) if peers_hidden => Outcome::Crash(CRASH_PEER_GPU),
        (false, false) if cumem_off => Outcome::OneHost("P2P/IPC"),
        (false, false) => Outcome::OneHost("P2P/CUMEM"),
        (false, true) if cumem_off => Outcome::OneHost("P2P/IPC"),
        (true, false) => Outcome::OneHost("SHM/direct/direct"),
        (true, true) if cumem_host_off => Outcome::OneHost("SHM/direct/direct"),
        _ => Outcome::Crash(CRASH_UDS),
    }
}

/// How many hosts NCCL will count among these nodes once `extra` is applied (nodes
/// it takes for one host form one).
pub fn nccl_hosts(nodes: &[Node], extra: &[NodeEnv]) -> u32 {
    let nodes: Vec<Node> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut n = n.clone();
            if let Some(e) = extra.get(i) {
                for (k, v) in &e.vars {
                    n.env.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            n
        })
        .collect();
    let mut leader: Vec<usize> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let same = leader
            .iter()
            .any(|&l| predict(&nodes[l], n) != Outcome::Network);
        if !same {
            leader.push(i);
        }
    }
    leader.len() as u32
}

/// `--colocated join|warn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Join,
    Warn,
}

/// Variables toporun adds to one node's ranks, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeEnv {
    pub vars: BTreeMap<String, String>,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// One entry per node, in node order.
    pub env: Vec<NodeEnv>,
    pub findings: Vec<Finding>,
}

fn worst(nodes: &[&Node]) -> Outcome {
    let mut out = Outcome::OneHost("P2P/CUMEM");
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            match predict(a, b) {
                c @ Outcome::Crash(_) => return c,
                Outcome::Network => out = Outcome::Network,
                o @ Outcome::OneHost(_) if matches!(out, Outcome::OneHost(_)) => out = o,
                _ => {}
            }
        }
    }
    out
}

const POD_FIX: &str = "one pod per node with all its GPUs (--nproc-per-node=gpu); where pods must stay separate and each can open every GPU of the node, give them one /dev/shm (hostIPC: true, or a hostPath volume of the host's /dev/shm) and toporun joins them (--colocated join: the same NCCL_HOSTID and NCCL_CUMEM_ENABLE=0, measured 320-327 GB/s over P2P/IPC)";

/// The co-location decision for a closed round: nodes grouped by boot_id.
pub fn decide(nodes: &[Node], mode: Mode) -> Decision {
    let mut d = Decision {
        env: vec![NodeEnv::default(); nodes.len()],
        findings: Vec::new(),
    };
    let mut boots: Vec<&str> = nodes.iter().filter_map(|n| n.boot_id.as_deref()).collect();
    boots.sort_unstable();
    boots.dedup();
    for boot in boots {
        let idx: Vec<usize> = (0..nodes.len())
            .filter(|&i| nodes[i].boot_id.as_deref() == Some(boot))
            .collect();
        if idx.len() < 2 {
            continue;
        }
        let group: Vec<&Node> = idx.iter().map(|&i| &nodes[i]).collect();
        let shared_shm =
            group[0].shm_dev.is_some() && group.iter().all(|n| n.shm_dev == group[0].shm_dev);
        let split_net = group.iter().any(|n| n.net_ns != group[0].net_ns);
        // Each node sees the GPUs of the others (one container split by
        // CUDA_VISIBLE_DEVICES), not only its own (device-plugin pods).
        let sees_peers = group
            .iter()
            .all(|n| n.gpu_nodes.is_empty() || n.gpu_nodes == group[0].gpu_nodes);
        let before = worst(&group);
        let finding = |sev, s: String| {
            Finding::new(FindingId::RdzvColocated, sev, s)
                .fact("node_ranks", format!("{idx:?}"))
                .fact("boot_id", boot)
                .fact("shared_dev_shm", shared_shm)
                .fact(
                    "network_namespaces",
                    if split_net { "different" } else { "same" },
                )
        };
        let user_hostids: Vec<&String> = group
            .iter()
            .filter_map(|n| n.env.get("NCCL_HOSTID"))
            .collect();
        let can_join = mode == Mode::Join
            && shared_shm
            && sees_peers
            && !matches!(before, Outcome::OneHost(_))
            && (user_hostids.is_empty() || user_hostids.len() == group.len());
        // What the nodes will carry: the joined host id and, across network
        // namespaces, cuMem off; never over a value the user set.
        let mut after: Vec<Node> = group.iter().map(|n| (*n).clone()).collect();
        let mut added: BTreeMap<&str, String> = BTreeMap::new();
        if can_join && user_hostids.is_empty() {
            let id = format!(
                "toporun-{}-{:x}",
                boot.chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(8)
                    .collect::<String>(),
                group[0].shm_dev.unwrap_or(0)
            );
            added.insert("NCCL_HOSTID", id);
        }
        let crosses = split_net && (can_join || before == Outcome::Crash(CRASH_UDS));
        if crosses
            && !group
                .iter()
                .any(|n| n.env.contains_key("NCCL_CUMEM_ENABLE"))
        {
            added.insert("NCCL_CUMEM_ENABLE", "0".into());
        }
        for n in &mut after {
            for (k, v) in &added {
                n.env.entry(k.to_string()).or_insert_with(|| v.clone());
            }
        }
        let refs: Vec<&Node> = after.iter().collect();
        let result = worst(&refs);
        let reason = match (before, result) {
            (Outcome::Crash(_), Outcome::OneHost(via)) => format!("nodes {idx:?} share this host and NCCL takes them for one host across network namespaces: cuMem would crash (\"unhandled system error\", UDS connection refused); with NCCL_CUMEM_ENABLE=0 NCCL uses {via} (measured 329 GB/s on H200)"),
            (Outcome::Network, Outcome::OneHost(via)) => format!("nodes {idx:?} share this host and /dev/shm but NCCL would take them for separate hosts and use sockets ({} GB/s measured between two such pods); joined as one NCCL host they use {via} ({} GB/s, about {:.0}x as fast)", measured::POD_SOCKET_GBPS, measured::POD_JOINED_GBPS, measured::POD_JOINED_GBPS / measured::POD_SOCKET_GBPS),
            _ => String::new(),
        };
        if !added.is_empty() {
            for &i in &idx {
                d.env[i] = NodeEnv {
                    vars: added
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.clone()))
                        .collect(),
                    reason: reason.clone(),
                };
            }
        }
        let vars = added
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        d.findings.push(match result {
            Outcome::OneHost(via) if added.is_empty() => finding(Severity::Info, format!("node ranks {idx:?} run on one host (boot_id {boot}) and NCCL sees one host: {via} between them")),
            Outcome::OneHost(via) => finding(Severity::Info, format!("node ranks {idx:?} run on one host (boot_id {boot}): toporun set {vars} on their ranks so NCCL uses {via} between them")).fact("why", &reason),
            Outcome::Crash(why) => finding(Severity::Error, format!("node ranks {idx:?} run on one host (boot_id {boot}) and NCCL takes them for one host, but the job will fail at the first collective: {why}")).remedy(if why == CRASH_UDS { "set NCCL_CUMEM_ENABLE=0 on every rank, or give the nodes distinct NCCL_HOSTIDs" } else { "give the nodes distinct NCCL_HOSTIDs (or unset the one you set), or run one pod per node with all its GPUs" }),
            Outcome::Network if shared_shm && !sees_peers => finding(Severity::Warning, format!("node ranks {idx:?} run on one physical host (boot_id {boot}) but each sees only its own GPUs (device-plugin pods): NCCL sends their traffic over the network ({} GB/s measured between two such pods); toporun does not join them, because P2P to a GPU a pod cannot open fails (measured on 2x H200)", measured::POD_SOCKET_GBPS)).remedy("one pod per node with all its GPUs (--nproc-per-node=gpu)"),
            Outcome::Network if shared_shm => finding(Severity::Warning, format!("node ranks {idx:?} run on one physical host (boot_id {boot}) but NCCL takes them for separate hosts and sends their traffic over the network ({} GB/s measured between two such pods, {} GB/s joined)", measured::POD_SOCKET_GBPS, measured::POD_JOINED_GBPS)).remedy(if mode == Mode::Warn { "run with --colocated join (the default): they share /dev/shm, so the same NCCL_HOSTID and NCCL_CUMEM_ENABLE=0 put them on P2P" } else { POD_FIX }),
            Outcome::Network => finding(Severity::Warning, format!("node ranks {idx:?} run on one physical host (boot_id {boot}) but each has its own /dev/shm, so NCCL keeps them apart (even with one NCCL_HOSTID) and sends their traffic over the network ({} GB/s measured between two such pods instead of {} GB/s)", measured::POD_SOCKET_GBPS, measured::POD_JOINED_GBPS)).remedy(POD_FIX),
        });
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(host: &str, net: u64, shm: u64) -> Node {
        Node {
            hostname: host.into(),
            boot_id: Some("9143fd18-0034".into()),
            net_ns: Some(net),
            ipc_ns: Some(net),
            shm_dev: Some(shm),
            gpu_nodes: Vec::new(),
            env: BTreeMap::new(),
        }
    }

    #[test]
    fn join_gives_pods_sharing_dev_shm_one_host_id_and_cumem_off() {
        let d = decide(&[pod("a", 1, 7), pod("b", 2, 7)], Mode::Join);
        for e in &d.env {
            assert_eq!(e.vars["NCCL_CUMEM_ENABLE"], "0");
            assert!(e.vars["NCCL_HOSTID"].starts_with("toporun-9143fd18"));
        }
        assert_eq!(d.env[0].vars, d.env[1].vars);
        assert_eq!(d.findings[0].severity, Severity::Info);
        assert!(d.findings[0].summary.contains("P2P/IPC"));
        // A forged boot id (the descriptions come from the store) whose eighth byte
        // falls inside a character, or with a NUL (no rank could be started with it),
        // still gives a host id of letters and digits, not a panic.
        let odd = |host| Node {
            boot_id: Some("abc\0defé-g1".into()),
            ..pod(host, 1, 7)
        };
        let d = decide(
            &[
                odd("a"),
                Node {
                    net_ns: Some(2),
                    ..odd("b")
                },
            ],
            Mode::Join,
        );
        let id = &d.env[0].vars["NCCL_HOSTID"];
        assert!(id.starts_with("toporun-abcdefg1-"), "{id}");
    }

    #[test]
    fn warn_only_reports_and_own_dev_shm_cannot_be_joined() {
        let d = decide(&[pod("a", 1, 7), pod("b", 2, 7)], Mode::Warn);
        assert!(d.env.iter().all(|e| e.vars.is_empty()));
        assert_eq!(d.findings[0].severity, Severity::Warning);
        assert!(d.findings[0]
            .remedy
            .as_deref()
            .unwrap()
            .contains("--colocated join"));
        let d = decide(&[pod("a", 1, 7), pod("b", 2, 8)], Mode::Join);
        assert!(d.env.iter().all(|e| e.vars.is_empty()));
        assert!(d.findings[0].summary.contains("own /dev/shm"));
        assert!(d.findings[0].remedy.as_deref().unwrap().contains("hostIPC"));
    }

    #[test]
    fn one_nccl_host_across_network_namespaces_gets_cumem_off_in_any_mode() {
        let d = decide(&[pod("same", 1, 7), pod("same", 2, 7)], Mode::Warn);
        assert_eq!(
            d.env[1].vars.get("NCCL_CUMEM_ENABLE").map(String::as_str),
            Some("0")
        );
        assert!(!d.env[1].vars.contains_key("NCCL_HOSTID"));
        assert!(d.env[1].reason.contains("crash"));
        let mut a = pod("same", 1, 7);
        a.env.insert("NCCL_CUMEM_ENABLE".into(), "1".into());
        let mut b = pod("same", 2, 7);
        b.env.insert("NCCL_CUMEM_ENABLE".into(), "1".into());
        let d = decide(&[a, b], Mode::Join);
        assert_eq!(d.findings[0].severity, Severity::Error);
    }

    #[test]
    fn device_plugin_pods_that_cannot_open_each_others_gpus_are_not_joined() {
        let mut a = pod("a", 1, 7);
        a.gpu_nodes = vec!["/dev/nvidia0".into()];
        let mut b = pod("b", 2, 7);
        b.gpu_nodes = vec!["/dev/nvidia1".into()];
        let d = decide(&[a, b], Mode::Join);
        assert!(d.env.iter().all(|e| e.vars.is_empty()));
        assert!(
            d.findings[0].summary.contains("own GPUs"),
            "{}",
            d.findings[0].summary
        );
    }

    #[test]
    fn nccl_counts_hosts_as_the_model_predicts() {
        let nodes = [pod("a", 1, 7), pod("b", 2, 7)];
        assert_eq!(nccl_hosts(&nodes, &[]), 2);
        let d = decide(&nodes, Mode::Join);
        assert_eq!(nccl_hosts(&nodes, &d.env), 1);
        assert_eq!(
            nccl_hosts(&[pod("h", 1, 7), pod("h", 1, 7), pod("x", 3, 9)], &[]),
            2
        );
    }

    #[test]
    fn same_container_and_other_hosts_add_nothing() {
        let d = decide(&[pod("h", 1, 7), pod("h", 1, 7)], Mode::Join);
        assert!(d.env.iter().all(|e| e.vars.is_empty()));
        assert_eq!(d.findings[0].severity, Severity::Info);
        let mut other = pod("x", 1, 7);
        other.boot_id = Some("other".into());
        assert!(decide(&[pod("h", 1, 7), other], Mode::Join)
            .findings
            .is_empty());
    }

    #[test]
    fn uts_only_split_joins_with_host_id_alone() {
        // Measured: own hostname + the same NCCL_HOSTID, one network namespace:
        // P2P/CUMEM at full speed, no need to turn cuMem off.
        let d = decide(&[pod("a", 1, 7), pod("b", 1, 7)], Mode::Join);
        assert!(d.env[0].vars.contains_key("NCCL_HOSTID"));
        assert!(!d.env[0].vars.contains_key("NCCL_CUMEM_ENABLE"));
        assert!(d.findings[0].summary.contains("P2P/CUMEM"));
    }
}
