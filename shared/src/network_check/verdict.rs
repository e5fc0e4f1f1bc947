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
    /// A direction none of whose paths connected, though some were tried: the node
    /// could not be reached on its probe port, or could not reach its peers'.
    #[serde(default)]
    pub unreached: bool,
    /// A direction of which no figure came at all (a record that never came).
    #[serde(default)]
    pub unknown: bool,
}

impl NodeFigure {
    /// The weaker direction: what the node gives the job.
    pub fn gbit(&self) -> f64 {
        self.send_gbit.min(self.recv_gbit)
    }

    /// Both directions measured over connected paths: the figures can be judged.
    fn judged(&self) -> bool {
        !self.unreached && !self.unknown
    }
}

/// Why a node is called slow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SlowBy {
    /// Under [`SLOW_RATIO`] of the other nodes' median.
    Peers { median_gbit: f64 },
    /// Under [`INTERFACE_RATIO`] of its interface's rate.
    Interface { expected_gbit: f64 },
    /// No probe reached it (or left it) in one direction: a dead link, or a firewall
    /// on the probe port; named, never refused.
    Unreachable,
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

/// Whether a path's probe connected (its round trips were timed).
fn connected(p: &PathFigure) -> bool {
    p.rtt_us > 0.0
}

/// A node's figures from the paths that touch it.
fn figure(node: u32, figures: &[PathFigure], expected: Option<f64>) -> NodeFigure {
    let dir = |f: &dyn Fn(&PathFigure) -> bool| {
        let tried: Vec<&PathFigure> = figures.iter().filter(|p| f(p)).collect();
        let best = tried
            .iter()
            .filter(|p| connected(p))
            .map(|p| p.gbit)
            .reduce(f64::max);
        (best, tried.is_empty())
    };
    let (send, no_send) = dir(&|p| p.path.from == node);
    let (recv, no_recv) = dir(&|p| p.path.to == node);
    let touching = figures
        .iter()
        .filter(|f| f.path.from == node || f.path.to == node);
    NodeFigure {
        node,
        send_gbit: send.unwrap_or(0.0),
        recv_gbit: recv.unwrap_or(0.0),
        rtt_us: touching
            .map(|f| f.rtt_us)
            .filter(|r| *r > 0.0)
            .reduce(f64::min)
            .unwrap_or(0.0),
        expected_gbit: expected,
        unreached: (send.is_none() && !no_send) || (recv.is_none() && !no_recv),
        unknown: no_send || no_recv,
    }
}

/// Judges `nodes` nodes on the paths measured; `expected` is each node's interface
/// rate (Gbit/s) where known. A path whose probe never connected says the node is
/// unreachable, not slow; a path of which nothing came says nothing.
pub fn judge(nodes: u32, figures: &[PathFigure], expected: &BTreeMap<u32, f64>) -> Verdict {
    let all: Vec<NodeFigure> = (0..nodes)
        .map(|n| figure(n, figures, expected.get(&n).copied()))
        .collect();
    // No path connected at all is the probe's failure (a NetworkPolicy that lets
    // only the rendezvous port through), not every node unreachable.
    if !figures.iter().any(connected) {
        return Verdict {
            nodes: all,
            slow: Vec::new(),
        };
    }
    let mut slow: Vec<SlowNode> = all.iter().filter_map(|n| slow(n, &all)).collect();
    // Most nodes under their interface's rate is the flow cap of a cloud, not most
    // nodes degraded: only the peers' rule stands then.
    if slow.len() * 2 > all.len() {
        slow.retain(|s| !matches!(s.by, SlowBy::Interface { .. }));
    }
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
    if n.unreached {
        return by(SlowBy::Unreachable);
    }
    if n.unknown {
        return None;
    }
    if let Some(e) = n.expected_gbit.filter(|e| n.gbit() < e * INTERFACE_RATIO) {
        return by(SlowBy::Interface { expected_gbit: e });
    }
    let others: Vec<f64> = all
        .iter()
        .filter(|o| o.node != n.node && o.judged())
        .map(NodeFigure::gbit)
        .collect();
    if others.len() < 2 {
        return None;
    }
    let median = median(others.into_iter())?;
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
        // Both ends under a hundredth of 100 Gbit/s: the one path is shared, and a
        // cloud's flow cap looks the same, so nobody is named...
        let expected = [(0, 100.0), (1, 100.0)].into();
        let v = judge(2, &measured(2, 0.02, None, 0.0), &expected);
        assert!(v.slow.is_empty(), "{v:?}");
        // ...but where only one end's interface is known to be far faster, that one.
        let one = [(1, 100.0)].into();
        let v = judge(2, &measured(2, 0.02, None, 0.0), &one);
        assert_eq!(
            v.slow.iter().map(|s| s.node).collect::<Vec<_>>(),
            [1],
            "{v:?}"
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
    fn a_node_no_probe_reached_is_unreachable_and_its_peers_are_not_slow() {
        // Node 2's probe port is closed: the paths into it never connected.
        let figures: Vec<PathFigure> = rounds(4)
            .into_iter()
            .flatten()
            .map(|path| {
                let closed = path.to == 2;
                PathFigure {
                    path,
                    gbit: if closed { 0.0 } else { 9.0 },
                    rtt_us: if closed { 0.0 } else { 40.0 },
                }
            })
            .collect();
        let v = judge(4, &figures, &BTreeMap::new());
        assert_eq!(
            v.slow,
            [SlowNode {
                node: 2,
                gbit: 0.0,
                by: SlowBy::Unreachable
            }]
        );
        // A record that never came says nothing of anyone.
        let heard: Vec<PathFigure> = figures.into_iter().filter(|f| f.path.to != 2).collect();
        let v = judge(4, &heard, &BTreeMap::new());
        assert!(v.slow.is_empty() && v.nodes[2].unknown, "{v:?}");
    }

    /// Two slow nodes side by side: their healthy neighbours keep one fast path
    /// each way, and only the two are named.
    #[test]
    fn two_slow_nodes_are_named_and_their_neighbours_not() {
        let figures: Vec<PathFigure> = rounds(8)
            .into_iter()
            .flatten()
            .map(|path| {
                let slow = [3, 4].iter().any(|s| path.from == *s || path.to == *s);
                PathFigure {
                    path,
                    gbit: if slow { 0.02 } else { 9.0 },
                    rtt_us: 40.0,
                }
            })
            .collect();
        let v = judge(8, &figures, &BTreeMap::new());
        assert_eq!(
            v.slow.iter().map(|s| s.node).collect::<Vec<_>>(),
            [3, 4],
            "{v:?}"
        );
    }

    #[test]
    fn no_path_measured_at_all_names_nobody() {
        let expected = [(0, 100.0), (1, 100.0), (2, 100.0)].into();
        let mut never = measured(3, 0.0, None, 0.0);
        never.iter_mut().for_each(|f| f.rtt_us = 0.0);
        let v = judge(3, &never, &expected);
        assert!(v.slow.is_empty(), "{v:?}");
    }

    #[test]
    fn a_node_that_measured_nothing_is_slow() {
        let figures: Vec<PathFigure> = measured(5, 10.0, Some(4), 0.0);
        let v = judge(5, &figures, &BTreeMap::new());
        assert_eq!(v.slow.iter().map(|s| s.node).collect::<Vec<_>>(), [4]);
        assert_eq!(v.nodes[0].rtt_us, 50.0);
    }
}
