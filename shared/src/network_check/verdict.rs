//! Which node is slow, from the paths' figures. Each direction of a node counts on
//! its own, at its best path: a shaped link or a degraded NIC slows every path it
//! sends (or receives) on, while a healthy node keeps a fast path beside the one it
//! shares with a slow peer (the schedule gives every node two different peers each
//! way from three nodes on). A node is slow where its weaker direction falls well
//! below the other nodes' median, or far below what its interface should give. With
//! two nodes both share the one path each way: which end is slow only the interface
//! can say.

use super::schedule::Path;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A node whose weaker direction is under this share of the nodes' median is slow...
pub const SLOW_RATIO: f64 = 0.5;
/// ...or under this share of its interface's rate. One TCP stream is all the check
/// runs, and clouds cap a single flow (AWS: 5 Gbit/s outside a placement group, on
/// NICs of 100-200 Gbit/s), so only a path at a hundredth of the link is called slow.
pub const INTERFACE_RATIO: f64 = 0.01;

/// What the receiving node measured on one path.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PathFigure {
    pub path: Path,
    /// Bandwidth (Gbit/s); 0 where the probe failed or timed out.
    pub gbit: f64,
    /// One small message's round trip (microseconds); 0 where none came back.
    pub rtt_us: f64,
}

/// A node's figures: its best path each way, and its quickest round trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeFigure {
    pub node: u32,
    pub send_gbit: f64,
    pub recv_gbit: f64,
    /// Its quickest round trip (microseconds); 0 where none came back.
    pub rtt_us: f64,
    /// What its interface should give (its link speed), where the facts know it.
    pub expected_gbit: Option<f64>,
}

impl NodeFigure {
    /// The weaker direction: what the node gives the job.
    pub fn gbit(&self) -> f64 {
        self.send_gbit.min(self.recv_gbit)
    }
}

/// Why a node is called slow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SlowBy {
    /// Under [`SLOW_RATIO`] of the other nodes' median.
    Peers { median_gbit: f64 },
    /// Under [`INTERFACE_RATIO`] of its interface's rate.
    Interface { expected_gbit: f64 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlowNode {
    pub node: u32,
    pub gbit: f64,
    pub by: SlowBy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub nodes: Vec<NodeFigure>,
    pub slow: Vec<SlowNode>,
}

/// Judges `nodes` nodes on the paths measured; `expected` is each node's interface
/// rate (Gbit/s) where known. A path not measured counts as nothing.
pub fn judge(nodes: u32, figures: &[PathFigure], expected: &BTreeMap<u32, f64>) -> Verdict {
    let best = |f: &dyn Fn(&PathFigure) -> bool| {
        figures
            .iter()
            .filter(|p| f(p))
            .map(|p| p.gbit)
            .fold(0.0, f64::max)
    };
    let of = |node: u32| NodeFigure {
        node,
        send_gbit: best(&|p| p.path.from == node),
        recv_gbit: best(&|p| p.path.to == node),
        rtt_us: figures
            .iter()
            .filter(|f| f.path.from == node || f.path.to == node)
            .map(|f| f.rtt_us)
            .filter(|r| *r > 0.0)
            .reduce(f64::min)
            .unwrap_or(0.0),
        expected_gbit: expected.get(&node).copied(),
    };
    let all: Vec<NodeFigure> = (0..nodes).map(of).collect();
    let slow = all.iter().filter_map(|n| slow(n, &all)).collect();
    Verdict { nodes: all, slow }
}

fn slow(n: &NodeFigure, all: &[NodeFigure]) -> Option<SlowNode> {
    let by = |by| {
        Some(SlowNode {
            node: n.node,
            gbit: n.gbit(),
            by,
        })
    };
    if let Some(e) = n.expected_gbit.filter(|e| n.gbit() < e * INTERFACE_RATIO) {
        return by(SlowBy::Interface { expected_gbit: e });
    }
    if all.len() < 3 {
        return None;
    }
    let median = median(
        all.iter()
            .filter(|o| o.node != n.node)
            .map(NodeFigure::gbit),
    )?;
    (n.gbit() < median * SLOW_RATIO).then(|| {
        by(SlowBy::Peers {
            median_gbit: median,
        })
    })?
}

fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    let m = v.len();
    match m {
        0 => None,
        _ if m % 2 == 1 => Some(v[m / 2]),
        _ => Some((v[m / 2 - 1] + v[m / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network_check::schedule::rounds;

    /// Every path of the schedule at `gbit`, those touching `shaped` at `slow_gbit`.
    fn measured(nodes: u32, gbit: f64, shaped: Option<u32>, slow_gbit: f64) -> Vec<PathFigure> {
        rounds(nodes)
            .into_iter()
            .flatten()
            .map(|path| {
                let touched = shaped.is_some_and(|s| path.from == s || path.to == s);
                PathFigure {
                    path,
                    gbit: if touched { slow_gbit } else { gbit },
                    rtt_us: 50.0,
                }
            })
            .collect()
    }

    /// One node's link shaped to 20 Mbit/s among healthy 10 Gbit/s ones: it alone is
    /// named; its peers each kept a fast path. Unshaped, nobody is.
    #[test]
    fn the_shaped_node_alone_is_slow() {
        for nodes in [3, 4, 5, 64] {
            let v = judge(
                nodes,
                &measured(nodes, 10.0, Some(2), 0.02),
                &BTreeMap::new(),
            );
            assert_eq!(v.slow.len(), 1, "{nodes}: {v:?}");
            assert_eq!(v.slow[0].node, 2);
            assert_eq!(v.slow[0].by, SlowBy::Peers { median_gbit: 10.0 });
            let healthy = judge(nodes, &measured(nodes, 10.0, None, 0.0), &BTreeMap::new());
            assert!(healthy.slow.is_empty(), "{nodes}: {healthy:?}");
        }
    }

    /// Two nodes share their path: only the interface's rate can name the slow end.
    #[test]
    fn with_two_nodes_only_the_interface_names_the_slow_end() {
        let v = judge(2, &measured(2, 0.02, None, 0.0), &BTreeMap::new());
        assert!(v.slow.is_empty(), "{v:?}");
        let expected = [(0, 100.0), (1, 100.0)].into();
        let v = judge(2, &measured(2, 0.02, None, 0.0), &expected);
        assert_eq!(
            v.slow.len(),
            2,
            "both ends under a tenth of 100 Gbit/s: {v:?}"
        );
        let v = judge(2, &measured(2, 30.0, None, 0.0), &expected);
        assert!(
            v.slow.is_empty(),
            "a single stream's 30 of 100 is healthy: {v:?}"
        );
    }

    /// A node whose probes all failed (0) is slow; one lower round trip does not
    /// change a node's figure.
    #[test]
    fn a_node_that_sends_slowly_is_named_though_it_receives_fast() {
        // Only node 1's egress is shaped: the paths it sends on.
        let figures: Vec<PathFigure> = rounds(4)
            .into_iter()
            .flatten()
            .map(|path| PathFigure {
                path,
                gbit: if path.from == 1 { 0.02 } else { 9.0 },
                rtt_us: 50.0,
            })
            .collect();
        let v = judge(4, &figures, &BTreeMap::new());
        assert_eq!(v.slow.iter().map(|s| s.node).collect::<Vec<_>>(), [1]);
        assert_eq!((v.nodes[1].send_gbit, v.nodes[1].recv_gbit), (0.02, 9.0));
    }

    #[test]
    fn a_node_that_measured_nothing_is_slow() {
        let figures: Vec<PathFigure> = measured(5, 10.0, Some(4), 0.0);
        let v = judge(5, &figures, &BTreeMap::new());
        assert_eq!(v.slow.iter().map(|s| s.node).collect::<Vec<_>>(), [4]);
        assert_eq!(v.nodes[0].rtt_us, 50.0);
    }
}
