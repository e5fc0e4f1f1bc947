//! What toporun expects NCCL to choose, before any rank starts (`launch --dry-run`);
//! the live report then says what NCCL did.

use crate::facts::{HostFacts, LinkKind, RdmaKind};
use crate::host_buffers::shm_transport;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Expected {
    /// Between this node's ranks.
    pub local: String,
    /// Between nodes (None for one node).
    pub between_nodes: Option<String>,
}

fn on(env: &BTreeMap<String, String>, k: &str) -> bool {
    env.get(k).map(|v| v.trim()) == Some("1")
}

/// `gpus`: the GPU each local rank uses, in local-rank order (empty when no GPU is
/// visible); `env`: the variables the ranks will see (the user's and the plan's).
pub fn expect(
    facts: &HostFacts,
    gpus: &[usize],
    env: &BTreeMap<String, String>,
    nnodes: u32,
) -> Expected {
    if gpus.is_empty() {
        return Expected {
            local: "no NCCL: the ranks will use gloo on CPU (no GPU visible)".to_string(),
            between_nodes: (nnodes > 1)
                .then(|| "gloo over TCP (no GPU visible on this node)".to_string()),
        };
    }
    Expected {
        local: local(facts, gpus, env, nnodes),
        between_nodes: between_nodes(facts, env, nnodes),
    }
}

/// Between this node's ranks, each on `gpus[local_rank]`.
fn local(facts: &HostFacts, gpus: &[usize], env: &BTreeMap<String, String>, nnodes: u32) -> String {
    let mut distinct = gpus.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if gpus.len() == 1 {
        return if nnodes > 1 {
            format!("one local rank (GPU{}): no transport inside this node; its peers are on the other nodes", gpus[0])
        } else {
            format!(
                "one rank in the job (GPU{}): NCCL has no peer and uses no transport",
                gpus[0]
            )
        };
    }
    if distinct.len() < gpus.len() {
        let shared: Vec<String> = distinct.iter().map(|g| format!("GPU{g}")).collect();
        return format!(
            "{} local ranks on {} GPU(s) ({}): NCCL refuses two ranks of one communicator on one GPU (\"Duplicate GPU detected\"); give each rank its own GPU, or use gloo",
            gpus.len(),
            distinct.len(),
            shared.join(", ")
        );
    }
    between_local_gpus(facts, gpus, env)
}

/// Between local ranks on distinct GPUs: the transport NCCL picks for each pair.
fn between_local_gpus(facts: &HostFacts, gpus: &[usize], env: &BTreeMap<String, String>) -> String {
    let g = &facts.gpus;
    if on(env, "NCCL_P2P_DISABLE") && on(env, "NCCL_SHM_DISABLE") {
        return "NET/Socket between local ranks (NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1)"
            .to_string();
    }
    if let Some(t) = shm_transport(facts, env).filter(|t| !t.no_peer_access) {
        return format!("SHM between local ranks ({})", t.why);
    }
    let pairs: Vec<(usize, usize)> = gpus
        .iter()
        .enumerate()
        .flat_map(|(i, &a)| gpus[i + 1..].iter().map(move |&b| (a, b)))
        .collect();
    let no_p2p: Vec<String> = pairs
        .iter()
        .filter(|(a, b)| g.p2p(*a, *b).is_some() && !g.p2p_ok(*a, *b))
        .map(|(a, b)| format!("{a}-{b}"))
        .collect();
    let nvlink: Vec<u32> = pairs
        .iter()
        .filter_map(|(a, b)| match g.link(*a, *b) {
            Some(LinkKind::NvLink(n)) => Some(n),
            _ => None,
        })
        .collect();
    if !no_p2p.is_empty() {
        format!(
            "SHM between GPU pairs without P2P ({}), P2P elsewhere",
            no_p2p.join(", ")
        )
    } else if nvlink.len() == pairs.len() {
        format!(
            "P2P over NVLink (NV{}) between every local pair",
            nvlink.iter().min().unwrap_or(&0)
        )
    } else if nvlink.is_empty() {
        "P2P over PCIe between local ranks".to_string()
    } else {
        "P2P over NVLink where linked, over PCIe elsewhere".to_string()
    }
}

fn between_nodes(facts: &HostFacts, env: &BTreeMap<String, String>, nnodes: u32) -> Option<String> {
    (nnodes > 1).then(|| {
        let active: Vec<_> = facts.rdma.iter().filter(|d| d.is_active()).collect();
        let efa = active.iter().any(|d| d.kind == RdmaKind::Efa);
        let colo = "; nodes on one physical host: decided at the rendezvous (rdzv.colocated)";
        if efa && !facts.platform.ofi_nccl_plugins.is_empty() {
            format!("NET/Libfabric over {} EFA device(s) (aws-ofi-nccl){colo}", active.len())
        } else if efa {
            format!("NET/Socket: {} EFA device(s) but no aws-ofi-nccl plugin found, so NCCL cannot use them{colo}", active.len())
        } else if !active.is_empty() && !on(env, "NCCL_IB_DISABLE") {
            format!("NET/IB over {} RDMA device(s){colo}", active.len())
        } else {
            format!("NET/Socket (no active RDMA device){colo}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::testutil::healthy;

    #[test]
    fn nvlink_host_expects_p2p_and_p2p_off_expects_shm() {
        let f = healthy();
        let e = expect(&f, &[0, 1, 2, 3], &BTreeMap::new(), 1);
        assert!(e.local.starts_with("P2P over NVLink"), "{}", e.local);
        assert_eq!(e.between_nodes, None);
        let env = BTreeMap::from([("NCCL_P2P_DISABLE".to_string(), "1".to_string())]);
        assert!(expect(&f, &[0, 1], &env, 2).local.starts_with("SHM"));
        assert!(expect(&f, &[0, 1], &env, 2)
            .between_nodes
            .unwrap()
            .starts_with("NET/Socket"));
    }

    #[test]
    fn no_gpu_means_gloo_not_nccl() {
        let f = healthy();
        let e = expect(&f, &[], &BTreeMap::new(), 1);
        assert_eq!(
            e.local,
            "no NCCL: the ranks will use gloo on CPU (no GPU visible)"
        );
        assert_eq!(e.between_nodes, None);
        let e = expect(&f, &[], &BTreeMap::new(), 2);
        assert!(e.between_nodes.unwrap().starts_with("gloo over TCP"));
    }

    #[test]
    fn one_rank_alone_and_one_rank_per_node() {
        let f = healthy();
        let alone = expect(&f, &[2], &BTreeMap::new(), 1);
        assert!(
            alone.local.contains("one rank in the job (GPU2)"),
            "{}",
            alone.local
        );
        let per_node = expect(&f, &[0], &BTreeMap::new(), 4);
        assert!(per_node.local.contains("peers are on the other nodes"));
        assert!(per_node.between_nodes.is_some());
    }

    #[test]
    fn ranks_sharing_a_gpu_are_refused_by_nccl() {
        let f = healthy();
        let e = expect(&f, &[0, 0, 0, 0], &BTreeMap::new(), 1);
        assert!(
            e.local.starts_with("4 local ranks on 1 GPU(s) (GPU0)"),
            "{}",
            e.local
        );
        assert!(e.local.contains("Duplicate GPU detected"));
        let e = expect(&f, &[0, 1, 0, 1], &BTreeMap::new(), 1);
        assert!(
            e.local
                .starts_with("4 local ranks on 2 GPU(s) (GPU0, GPU1)"),
            "{}",
            e.local
        );
    }

    #[test]
    fn pcie_only_pairs() {
        let mut f = healthy();
        for row in f.gpus.links.iter_mut() {
            for l in row.iter_mut() {
                if matches!(l, LinkKind::NvLink(_)) {
                    *l = LinkKind::Pix;
                }
            }
        }
        let e = expect(&f, &[0, 1], &BTreeMap::new(), 1);
        assert_eq!(e.local, "P2P over PCIe between local ranks");
    }
}
