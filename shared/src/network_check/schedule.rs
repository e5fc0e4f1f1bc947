//! Which paths the nodes measure, round by round. In a round every node sends to one
//! peer and receives from another, all at once (a NIC is full duplex), so a round
//! takes one probe's time whatever the nodes. Two rounds: a ring (each node to the
//! next), then the ring shifted by about half the nodes. Each node is then measured on four
//! paths to different peers (from five nodes on), and one slow peer cannot make a
//! healthy node look slow: a node's figure is its best path ([`super::verdict`]).

use serde::{Deserialize, Serialize};

/// One measured direction: `from` sends to `to` (node ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Path {
    pub from: u32,
    pub to: u32,
}

/// The rounds for `nodes` nodes: none for fewer than two; one for two (the ring and
/// its shift are the same pair); two from three on.
pub fn rounds(nodes: u32) -> Vec<Vec<Path>> {
    if nodes < 2 {
        return Vec::new();
    }
    let shifted = |by: u32| {
        (0..nodes)
            .map(|from| Path {
                from,
                to: (from + by) % nodes,
            })
            .collect::<Vec<_>>()
    };
    // Half the ring on; with an even count one more, or each node would pair both
    // ways with the same peer (i and i + n/2).
    let half = match nodes % 2 {
        0 if nodes >= 6 => nodes / 2 + 1,
        _ => nodes.div_ceil(2).max(2),
    };
    match nodes {
        2 => vec![shifted(1)],
        _ => vec![shifted(1), shifted(half)],
    }
}

/// The paths `node` takes part in over every round (it sends or receives).
pub fn paths_of(rounds: &[Vec<Path>], node: u32) -> Vec<Path> {
    rounds
        .iter()
        .flatten()
        .filter(|p| p.from == node || p.to == node)
        .copied()
        .collect()
}

/// A round's paths in phases where each node only sends or only receives, at most
/// once: a path measured over a collective library (NCCL) runs alone at each end,
/// its time not shared with the node's other direction. A round is a permutation:
/// each of its cycles gives its paths in turn to phase 0 and 1, and an odd cycle's
/// last path (which closes on the cycle's first node) to phase 2.
pub fn phases(round: &[Path]) -> Vec<Vec<Path>> {
    let next: std::collections::BTreeMap<u32, Path> = round.iter().map(|p| (p.from, *p)).collect();
    let mut placed = std::collections::BTreeSet::new();
    let mut out: Vec<Vec<Path>> = vec![Vec::new(); 3];
    for start in round {
        let mut at = Some(*start);
        let mut cycle = Vec::new();
        while let Some(p) = at.filter(|p| placed.insert(*p)) {
            cycle.push(p);
            at = next.get(&p.to).copied();
        }
        let odd = cycle.len() % 2 == 1;
        for (i, p) in cycle.iter().enumerate() {
            let phase = match (odd && i + 1 == cycle.len() && i > 0, i % 2) {
                (true, _) => 2,
                (false, k) => k,
            };
            out[phase].push(*p);
        }
    }
    out.retain(|phase| !phase.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every node sends once and receives once a round, never to itself: a round's
    /// paths run at once without two sharing a node's direction.
    #[test]
    fn each_round_gives_every_node_one_send_and_one_receive() {
        for nodes in [2, 3, 4, 5, 8, 63, 64, 1024] {
            let r = rounds(nodes);
            assert_eq!(r.len(), if nodes == 2 { 1 } else { 2 }, "{nodes}");
            for round in &r {
                let senders: BTreeSet<u32> = round.iter().map(|p| p.from).collect();
                let receivers: BTreeSet<u32> = round.iter().map(|p| p.to).collect();
                assert_eq!(
                    (senders.len(), receivers.len()),
                    (nodes as usize, nodes as usize)
                );
                assert!(round.iter().all(|p| p.from != p.to), "{nodes}: {round:?}");
            }
        }
        assert!(rounds(1).is_empty() && rounds(0).is_empty());
    }

    /// From five nodes on, a node's four paths reach four different peers: a slow
    /// peer is one of four.
    #[test]
    fn a_node_meets_four_different_peers_from_five_nodes_on() {
        for nodes in [5, 6, 7, 64, 1024] {
            let r = rounds(nodes);
            for node in 0..nodes {
                let peers: BTreeSet<u32> = paths_of(&r, node)
                    .iter()
                    .map(|p| if p.from == node { p.to } else { p.from })
                    .collect();
                assert_eq!(peers.len(), 4, "{nodes} nodes, node {node}");
            }
        }
        // Three and four nodes: every other node is a peer.
        for nodes in [3, 4] {
            let r = rounds(nodes);
            let peers: BTreeSet<u32> = paths_of(&r, 0)
                .iter()
                .map(|p| if p.from == 0 { p.to } else { p.from })
                .collect();
            assert_eq!(peers.len(), nodes as usize - 1, "{nodes}");
        }
    }

    /// Each phase has each node at most once (it only sends or only receives), every
    /// path of the round is in exactly one phase, and no round needs more than three.
    #[test]
    fn phases_give_each_node_one_direction_and_cover_the_round() {
        for nodes in [2, 3, 4, 5, 7, 8, 63, 64, 1024] {
            for round in rounds(nodes) {
                let ph = phases(&round);
                assert!(ph.len() <= 3 && !ph.is_empty(), "{nodes}: {}", ph.len());
                for phase in &ph {
                    let mut ends = BTreeSet::new();
                    for p in phase {
                        assert!(
                            ends.insert(p.from) && ends.insert(p.to),
                            "{nodes}: {phase:?}"
                        );
                    }
                }
                let mut all: Vec<Path> = ph.concat();
                all.sort();
                let mut want = round.clone();
                want.sort();
                assert_eq!(all, want, "{nodes}");
            }
        }
        // Two nodes: one path each way, one phase each.
        assert_eq!(phases(&rounds(2)[0]).len(), 2);
        // An odd ring needs the third phase; an even one does not.
        assert_eq!(phases(&rounds(3)[0]).len(), 3);
        assert_eq!(phases(&rounds(4)[0]).len(), 2);
    }
}
