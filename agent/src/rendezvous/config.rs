//! What a rendezvous is configured with (its shape and timeouts) and what each node
//! tells the others.

use super::keys::{RoundKeys, RunKeys};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use toporun_shared::colocation;
use toporun_shared::root_cause::peer::{names_a_node, NodeAddrs, MAX_ADDRS};
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
    /// Its interfaces' addresses (no loopback or link-local): a peer's address in a
    /// rank's error names the node even where it advertised a host name.
    #[serde(default)]
    pub ips: Vec<String>,
}

impl NodeInfo {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Exactly `nnodes`, ranks given on the command line.
    Static { nnodes: u32 },
    /// Between min and max nodes; ranks by join order.
    Elastic { min: u32, max: u32 },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub run_id: String,
    pub shape: Shape,
    pub join_timeout: Duration,
    pub last_call: Duration,
    /// How long a node waits, beyond the join timeout and last call, for the host to
    /// close the round.
    pub close_timeout: Duration,
    /// Bound on single store reads (the round's layout).
    pub read_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_misses: u32,
    /// Whether co-located nodes are joined onto one NCCL host or only reported.
    pub colocated: colocation::Mode,
    /// With a shared secret (`--rdzv-conf token=`, `TOPORUN_RDZV_TOKEN`), the
    /// rendezvous keys live under a name derived from it.
    pub key_space: Option<String>,
}

/// The key space a token opens: TCPStore has no operation that lists keys, so a
/// client without the token can neither read nor poison the rendezvous (workers'
/// own keys are unaffected). It does not stop an observer of the network traffic.
pub fn key_space(run_id: &str, token: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"toporun rendezvous\0")
        .chain_update(run_id.as_bytes())
        .chain_update(b"\0")
        .chain_update(token.as_bytes())
        .finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

impl Config {
    /// The --nnodes this shape came from, as (min, max).
    pub fn nnodes(&self) -> (u32, u32) {
        match self.shape {
            Shape::Static { nnodes } => (nnodes, nnodes),
            Shape::Elastic { min, max } => (min, max),
        }
    }

    /// The run's keys (under the key space a token opens).
    pub fn keys(&self) -> RunKeys {
        RunKeys::new(&self.run_id, self.key_space.as_deref())
    }

    /// The keys of round `round`.
    pub fn round_keys(&self, round: u32) -> RoundKeys {
        self.keys().round(round)
    }

    /// The fewest nodes a round runs with.
    pub fn min_nodes(&self) -> u32 {
        self.nnodes().0
    }

    pub fn max_nodes(&self) -> u32 {
        match self.shape {
            Shape::Static { nnodes } => nnodes,
            Shape::Elastic { max, .. } => max,
        }
    }
}
