//! What each node tells the others when it joins a round: its host, addresses,
//! ranks, GPUs and namespaces (for co-location), written under `node/<ticket>`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use toporun_shared::colocation;
use toporun_shared::root_cause::peer::{names_a_node, NodeAddrs, MAX_ADDRS};
use toporun_shared::torchrun::MAX_NPROC;
use toporun_shared::untrusted::printable;

/// What each node tells the others.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Static rendezvous: the node rank it was given; c10d: None.
    pub node_rank: Option<u32>,
    pub hostname: String,
    pub addr: String,
    pub nproc: u32,
    pub gpus: usize,
    pub boot_id: Option<String>,
    pub ipc_ns: Option<u64>,
    pub net_ns: Option<u64>,
    /// Device number of its /dev/shm (equal when nodes share one).
    #[serde(default)]
    pub shm_dev: Option<u64>,
    /// The co-location variables (NCCL_HOSTID, NCCL_CUMEM_ENABLE...) its ranks see.
    #[serde(default)]
    pub nccl: BTreeMap<String, String>,
    /// Its GPU device nodes (/dev/nvidiaN).
    #[serde(default)]
    pub gpu_nodes: Vec<String>,
    /// The --nnodes it was started with (min, max), to catch nodes that disagree.
    #[serde(default)]
    pub nnodes: Option<(u32, u32)>,
    /// Its `--network-check`: the round runs the least any node asks for.
    #[serde(default)]
    pub network_check: Option<toporun_shared::network_check::CheckMode>,
    /// Its interfaces' addresses (no loopback or link-local): a peer's address in a
    /// rank's error names the node even where it advertised a host name.
    #[serde(default)]
    pub ips: Vec<String>,
}

/// The machine a node runs on (its boot id, where read) and how many ranks it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMachine {
    pub boot_id: Option<String>,
    pub nproc: u32,
}

impl NodeMachine {
    /// Each global rank's machine, from the nodes in node-rank order, for the
    /// `world` ranks of the round (each node's count bounded as a description's is:
    /// the table may come from the store).
    pub fn per_rank(nodes: &[NodeMachine], world: u32) -> Vec<Option<String>> {
        let count = |n: &NodeMachine| n.nproc.min(MAX_NPROC) as usize;
        nodes
            .iter()
            .flat_map(|n| std::iter::repeat_n(n.boot_id.clone(), count(n)))
            .take(world as usize)
            .collect()
    }
}

impl NodeInfo {
    pub fn machine(&self) -> NodeMachine {
        NodeMachine {
            boot_id: self.boot_id.clone(),
            nproc: self.nproc,
        }
    }

    /// The node as a peer's address names it (the addresses bounded: a forged
    /// description may list any number).
    pub fn addrs(&self) -> NodeAddrs {
        let addrs = std::iter::once(&self.addr)
            .chain(self.ips.iter().filter(|a| names_a_node(a)))
            .take(MAX_ADDRS)
            .map(|a| printable(a))
            .collect();
        NodeAddrs {
            name: format!("{}, {}", printable(&self.hostname), printable(&self.addr)),
            addrs,
        }
    }

    /// What the co-location decision needs of this node.
    pub fn colocation(&self) -> colocation::Node {
        colocation::Node {
            hostname: self.hostname.clone(),
            boot_id: self.boot_id.clone(),
            net_ns: self.net_ns,
            ipc_ns: self.ipc_ns,
            shm_dev: self.shm_dev,
            gpu_nodes: self.gpu_nodes.clone(),
            env: self.nccl.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The machines' table is read from the store: a node claiming 4 billion ranks
    /// gets no more than a description may say (MAX_NPROC), and the table no more
    /// than the round's ranks: never one that fills the memory.
    #[test]
    fn each_node_s_ranks_are_bounded_in_the_table() {
        let node = |boot: &str, nproc| NodeMachine {
            boot_id: Some(boot.into()),
            nproc,
        };
        let per = NodeMachine::per_rank(&[node("a", 2), node("b", 1)], 3);
        assert_eq!(per, [Some("a".into()), Some("a".into()), Some("b".into())]);
        let forged = NodeMachine::per_rank(&[node("x", u32::MAX)], u32::MAX);
        assert_eq!(forged.len(), MAX_NPROC as usize);
        // A table of many such nodes gives no more than the round's ranks.
        let many = vec![node("y", MAX_NPROC); 100_000];
        assert_eq!(NodeMachine::per_rank(&many, 16).len(), 16);
    }
}
