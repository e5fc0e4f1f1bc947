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

/// `gpus`: the GPU indices the local ranks use, in order; `env`: the variables the
/// ranks will see (the user's and the plan's).
pub fn expect(
    facts: &HostFacts,
    gpus: &[usize],
    env: &BTreeMap<String, String>,
    nnodes: u32,
) -> Expected {
    let g = &facts.gpus;
    let local = if gpus.len() < 2 {
        "one local rank: no local transport".to_string()
    } else if on(env, "NCCL_P2P_DISABLE") && on(env, "NCCL_SHM_DISABLE") {
        "NET/Socket between local ranks (NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1)".to_string()
    } else if let Some(t) = shm_transport(facts, env).filter(|t| !t.no_peer_access) {
        format!("SHM between local ranks ({})", t.why)
    } else {
        let pairs: Vec<(usize, usize)> = gpus
            .iter()
            .enumerate()
            .flat_map(|(i, &a)| gpus[i + 1..].iter().map(move |&b| (a, b)))
            .filter(|(a, b)| a != b)
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
        if pairs.is_empty() {
            "local ranks share one GPU".to_string()
        } else if !no_p2p.is_empty() {
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
    };
    let between_nodes = (nnodes > 1).then(|| {
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
    });
    Expected {
        local,
        between_nodes,
    }
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
}
