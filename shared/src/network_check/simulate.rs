//! The check at a scale no test machine has: the schedule, the judgement and what the
//! store carries for N nodes, with one node's link slow. Each node writes one record
//! (the paths it sent on, as JSON) and the deciding node reads them all; each round
//! takes one probe.

use super::schedule::rounds;
use super::verdict::{judge, PathFigure, Verdict};
use std::collections::BTreeMap;
use std::time::Duration;

/// What a check of `nodes` nodes costs and finds.
#[derive(Debug)]
pub struct Simulation {
    pub rounds: usize,
    pub paths: usize,
    /// Rounds times the probe.
    pub probe_time: Duration,
    /// The largest record a node writes, and all of them together (bytes).
    pub record_bytes: usize,
    pub store_bytes: usize,
    pub verdict: Verdict,
}

/// `nodes` nodes at `gbit` on every path, node `slow` at `slow_gbit` on its own.
pub fn simulate(
    nodes: u32,
    probe: Duration,
    gbit: f64,
    (slow, slow_gbit): (u32, f64),
) -> Simulation {
    let r = rounds(nodes);
    let figures: Vec<PathFigure> = r
        .iter()
        .flatten()
        .map(|&path| PathFigure {
            path,
            gbit: if path.from == slow || path.to == slow {
                slow_gbit
            } else {
                gbit
            },
            rtt_us: 40.0,
        })
        .collect();
    let records: Vec<usize> = (0..nodes)
        .map(|n| {
            let mine: Vec<&PathFigure> = figures.iter().filter(|f| f.path.from == n).collect();
            serde_json::to_vec(&mine).map_or(0, |v| v.len())
        })
        .collect();
    Simulation {
        rounds: r.len(),
        paths: figures.len(),
        probe_time: probe * r.len() as u32,
        record_bytes: records.iter().copied().max().unwrap_or(0),
        store_bytes: records.iter().sum(),
        verdict: judge(nodes, &figures, &BTreeMap::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1024 nodes, 0.5 s probes: 2 rounds (1 s of probing), the slow node alone named,
    /// each record a few hundred bytes and the store's whole share well under 1 MB.
    #[test]
    fn a_thousand_nodes_take_two_rounds_and_name_the_slow_one() {
        let s = simulate(1024, Duration::from_millis(500), 25.0, (517, 0.02));
        assert_eq!((s.rounds, s.paths), (2, 2048));
        assert_eq!(s.probe_time, Duration::from_secs(1));
        assert_eq!(
            s.verdict.slow.iter().map(|n| n.node).collect::<Vec<_>>(),
            [517]
        );
        assert!(s.record_bytes < 200, "{}", s.record_bytes);
        assert!(s.store_bytes < 200 * 1024, "{}", s.store_bytes);
        let small = simulate(64, Duration::from_millis(500), 25.0, (3, 0.02));
        assert_eq!(small.rounds, 2, "constant in the nodes");
    }
}
