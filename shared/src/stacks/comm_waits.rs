//! The rank the others wait for, communicator by communicator. Under overlapping
//! NCCL groups (HSDP's shard and replicate groups, tensor beside data parallel) a
//! rank waits in several communicators, and its shares on different ones do not
//! compare: the ranks are compared where they meet. The rank the others wait for
//! waits less than they do in every communicator it shares with them, and far less
//! (by the straggler rule) in one. In FSDP2 over a 2x2 mesh with rank 3 slow (one
//! H200, tests/fixtures/device/hsdp-straggler-h200x1), rank 2 waited far less than
//! rank 0 in their replicate group, but far more than rank 3 in their shard group:
//! rank 3 alone waited less everywhere. A data-parallel job has one such group, and
//! the rule is the job-wide one.

use super::rank_window::{CommWait, WindowSummary};
use super::straggler::{far_in_waits, RankRow, Sorted, HOLD_GAP, MIN_MEDIAN};
use std::collections::BTreeMap;

/// Where a rank waits far less than the others.
#[derive(Debug, Clone, PartialEq)]
pub struct CommFar {
    pub share: f64,
    /// The others' median share in that communicator, and how many they are.
    pub median: f64,
    pub others: u32,
}

/// Each communicator's members' figures over the window.
pub struct CommShares(BTreeMap<u64, Vec<(u32, CommWait)>>);

impl CommShares {
    pub fn of(full: &[(&RankRow, &WindowSummary)]) -> CommShares {
        let mut by: BTreeMap<u64, Vec<(u32, CommWait)>> = BTreeMap::new();
        for (row, w) in full {
            for c in w.gpu_wait.iter().flat_map(|g| &g.comms) {
                by.entry(c.comm).or_default().push((row.rank, c.clone()));
            }
        }
        by.retain(|_, members| members.len() >= 2);
        CommShares(by)
    }

    /// Some communicator has two ranks or more with figures: the rule applies.
    pub fn judges(&self) -> bool {
        !self.0.is_empty()
    }

    /// Where `rank` waits far less than the others, if it waits clearly more than
    /// them in none of its communicators (there it waits for someone).
    pub fn far(&self, rank: u32, w: &WindowSummary, held: bool) -> Option<CommFar> {
        let mut best: Option<CommFar> = None;
        for own in w.gpu_wait.iter().flat_map(|g| &g.comms) {
            let Some(members) = self.0.get(&own.comm) else {
                continue;
            };
            let others = || members.iter().filter(|(r, _)| *r != rank).map(|(_, c)| c);
            let Some(m) = Sorted::of(others().map(|c| c.share)).median_without(None) else {
                continue;
            };
            if m >= MIN_MEDIAN && own.share > m + HOLD_GAP {
                return None;
            }
            let thirds_far = || {
                let far: Vec<bool> = (0..3)
                    .filter_map(|t| {
                        let mine = own.thirds[t]?;
                        let tm = Sorted::of(others().filter_map(|c| c.thirds[t]))
                            .median_without(None)?;
                        Some(far_in_waits(mine, tm, true))
                    })
                    .collect();
                far.len() >= 2 && far.iter().all(|x| *x)
            };
            if far_in_waits(own.share, m, held) && (held || thirds_far()) {
                let gap = |f: &CommFar| f.median - f.share;
                let here = CommFar {
                    share: own.share,
                    median: m,
                    others: members.len() as u32 - 1,
                };
                if best.as_ref().is_none_or(|b| gap(&here) > gap(b)) {
                    best = Some(here);
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use crate::stacks::rank_window::{CommWait, GpuWait, WindowSummary};
    use crate::stacks::straggler::{find, RankRow};

    /// Rank `rank` with its GPU share on each (communicator, share) over the window,
    /// the same in every third.
    fn row(rank: u32, comms: &[(u64, f64)]) -> RankRow {
        let comms: Vec<CommWait> = comms
            .iter()
            .map(|&(comm, share)| CommWait {
                comm,
                share,
                thirds: [Some(share); 3],
            })
            .collect();
        let share = comms.iter().map(|c| c.share).fold(0.0, f64::max);
        RankRow {
            rank,
            local_rank: rank,
            node_rank: 0,
            host: "h".into(),
            pid: 100 + rank as i32,
            gpu: Some(rank),
            gpu_uuid: None,
            now: None,
            cpu_pct: None,
            rss_bytes: None,
            gpu_now: None,
            gpu_time: None,
            window: Some(WindowSummary {
                wait: 0.0,
                thirds: [0.0; 3],
                samples: 60,
                spends: None,
                place: None,
                cpu_pct: None,
                throttled: None,
                pcie_replays: None,
                nvlink_errors: None,
                clocks: None,
                gpu_wait: Some(GpuWait {
                    share,
                    thirds: [Some(share); 3],
                    dumps: 6,
                    covered_s: 60.0,
                    busbw: Vec::new(),
                    comms,
                }),
            }),
        }
    }

    fn named(rows: &[RankRow]) -> Vec<u32> {
        find(rows, &[]).iter().map(|s| s.rank).collect()
    }

    /// HSDP on 4 ranks as the H200 capture gave it (shard groups 10 and 11,
    /// replicate groups 20 and 21, the job's 99), rank 3 slow. Rank 2 waits far less
    /// than rank 0 in their replicate group but far more than rank 3 in their shard
    /// group: only rank 3 waits less everywhere. The job's group, where nobody waits,
    /// decides nothing, though rank 3 spends a little more there.
    #[test]
    fn the_rank_waited_for_in_every_group_is_named_not_the_one_between() {
        let rows = [
            row(0, &[(10, 0.36), (20, 0.85), (99, 0.01)]),
            row(1, &[(10, 0.35), (21, 0.83), (99, 0.01)]),
            row(2, &[(11, 0.78), (20, 0.25), (99, 0.01)]),
            row(3, &[(11, 0.46), (21, 0.24), (99, 0.15)]),
        ];
        let found = find(&rows, &[]);
        assert_eq!(found.iter().map(|s| s.rank).collect::<Vec<_>>(), [3]);
        let text = found[0].text(std::time::Duration::from_secs(60));
        assert!(
            text.contains("its GPU spends 24% of the time in collectives against 83% for the other 1 of a communicator they share (and no more than its peers in any other) over 60s"),
            "{text}"
        );
        // Healthy: the pairs wait within the rule's bounds of each other.
        let healthy = [
            row(0, &[(10, 0.69), (20, 0.37)]),
            row(1, &[(10, 0.71), (21, 0.47)]),
            row(2, &[(11, 0.75), (20, 0.44)]),
            row(3, &[(11, 0.63), (21, 0.34)]),
        ];
        assert!(named(&healthy).is_empty());
    }

    /// Tensor-parallel pairs (10, 11) inside data-parallel groups (20, 21), the pair
    /// {2, 3} slow (their node): the two wait evenly in their pair, and each far less
    /// than its data-parallel peer. Both are named: near-even shares do not veto.
    #[test]
    fn a_slow_pair_is_named_both_where_they_wait_evenly_together() {
        let rows = [
            row(0, &[(10, 0.40), (20, 0.80)]),
            row(1, &[(10, 0.41), (21, 0.80)]),
            row(2, &[(11, 0.30), (20, 0.25)]),
            row(3, &[(11, 0.36), (21, 0.24)]),
        ];
        assert_eq!(named(&rows), [2, 3]);
    }
}
