//! What carries a check's probes: the choice (`--network-check-path`), each node's
//! word on it and the round's decision (torch only where every node can), and what
//! carried them, as the report says.

/// `--network-check-path`: what carries the probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PathChoice {
    /// Through the ranks' torch where they use GPUs (NCCL over the job's transport),
    /// else TCP between the agents.
    #[default]
    Auto,
    /// Through the ranks' torch whatever they use: NCCL on GPUs, gloo without.
    Torch,
    /// TCP between the agents.
    Tcp,
}

/// What carried a check's probes.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DataPath {
    /// One TCP stream between the node agents.
    #[default]
    Tcp,
    /// torch.distributed's send and receive, one process per node: `backend` (nccl,
    /// gloo), and for NCCL the network plugin it chose (Socket, IB, AWS Libfabric).
    Torch {
        backend: String,
        net: Option<String>,
        /// How long the deciding node's process group took to start (s).
        #[serde(default)]
        start_s: Option<f64>,
    },
}

impl DataPath {
    /// Whether this is the job's own data path over RDMA (NCCL's IB or a plugin's).
    pub fn rdma(&self) -> bool {
        match self {
            DataPath::Torch { net: Some(n), .. } => !n.eq_ignore_ascii_case("socket"),
            _ => false,
        }
    }

    /// As the summary says it.
    pub fn said(&self) -> String {
        match self {
            DataPath::Tcp => "TCP between the agents".into(),
            DataPath::Torch {
                backend,
                net,
                start_s,
            } => {
                let p = crate::untrusted::printable;
                let over = net.as_deref().map(|n| format!(" over {}", p(n)));
                let start = start_s
                    .filter(|s| *s >= 0.1)
                    .map(|s| format!(", {s:.1}s of it starting {}", p(backend)));
                format!(
                    "{}{}{}",
                    p(backend),
                    over.unwrap_or_default(),
                    start.unwrap_or_default()
                )
            }
        }
    }
}

/// A node's word on measuring through torch, and the round's decision from every
/// node's: torch only where all can, with one backend.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PathVote {
    Torch {
        backend: String,
    },
    /// TCP between the agents, and why not torch.
    Tcp {
        why: String,
    },
}

impl PathVote {
    /// The round's path from the votes of nodes `0..nnodes` that came (by node).
    pub fn decide(nnodes: u32, votes: &std::collections::BTreeMap<u32, PathVote>) -> PathVote {
        let mut backend: Option<&str> = None;
        for node in 0..nnodes {
            match votes.get(&node) {
                None => {
                    return PathVote::Tcp {
                        why: format!("node {node} did not say whether it can"),
                    }
                }
                Some(PathVote::Tcp { why }) => {
                    return PathVote::Tcp {
                        why: format!("node {node}: {}", crate::untrusted::printable(why)),
                    }
                }
                Some(PathVote::Torch { backend: b }) => match backend {
                    Some(first) if first != b => {
                        return PathVote::Tcp {
                            why: format!(
                                "the nodes' ranks use different backends ({} and {})",
                                crate::untrusted::printable(first),
                                crate::untrusted::printable(b)
                            ),
                        }
                    }
                    _ => backend = Some(b),
                },
            }
        }
        match backend {
            Some(b) => PathVote::Torch {
                backend: b.to_string(),
            },
            None => PathVote::Tcp {
                why: "no node".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn torch_carries_the_probes_only_where_every_node_can_with_one_backend() {
        let torch = |b: &str| PathVote::Torch { backend: b.into() };
        let all: BTreeMap<u32, PathVote> = (0..3).map(|n| (n, torch("nccl"))).collect();
        assert_eq!(PathVote::decide(3, &all), torch("nccl"));
        let mut one_cannot = all.clone();
        one_cannot.insert(
            1,
            PathVote::Tcp {
                why: "cannot import torch.distributed".into(),
            },
        );
        assert!(
            matches!(PathVote::decide(3, &one_cannot), PathVote::Tcp { why } if why == "node 1: cannot import torch.distributed")
        );
        let mut missing = all.clone();
        missing.remove(&2);
        assert!(
            matches!(PathVote::decide(3, &missing), PathVote::Tcp { why } if why.contains("node 2 did not say"))
        );
        let mut mixed = all;
        mixed.insert(2, torch("gloo"));
        assert!(
            matches!(PathVote::decide(3, &mixed), PathVote::Tcp { why } if why.contains("nccl and gloo"))
        );
    }
}
