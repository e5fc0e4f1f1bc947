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

use super::rank_window::{CommWait, GpuWait, WindowSummary};
use super::wait_rule::{far_in_waits, Sorted, HOLD_GAP, MIN_MEDIAN};
use std::collections::BTreeMap;

/// Where a rank waits far less than the others.
#[derive(Debug, Clone, PartialEq)]
pub struct CommFar {
    pub share: f64,
    /// The others' median share in that communicator, and how many they are.
    pub median: f64,
    pub others: u32,
    /// Its communicators compared with others' (1: a data-parallel job's one group).
    pub groups: u32,
}

/// One communicator's members' shares over the window and in each third, sorted once
/// (the store's host judges every rank of the job at each sample).
pub struct Members {
    count: u32,
    all: Sorted,
    thirds: [Sorted; 3],
}

impl Members {
    fn of(m: &[CommWait]) -> Members {
        let third = |t: usize| Sorted::of(m.iter().filter_map(|c| c.thirds[t]));
        Members {
            count: m.len() as u32,
            all: Sorted::of(m.iter().map(|c| c.share)),
            thirds: [0, 1, 2].map(third),
        }
    }
}

/// Two members of a group share a send/recv communicator: they sit in different
/// pipeline stages (a tied embedding's group, the gradient norm's across stages),
/// where the first stage finishes its backward last by design.
fn across_stages(members: &[&GpuWait]) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    members
        .iter()
        .flat_map(|g| g.comms.iter().filter(|c| c.p2p))
        .any(|c| !seen.insert(c.comm))
}

/// How the ranks' GPU shares are compared.
pub enum CommShares {
    /// No row says its communicators (flight-recorder dumps): across the job.
    JobWide,
    /// Each communicator's members' figures, where every timed row says its
    /// communicators (NCCL's counters on every node).
    PerComm(BTreeMap<u64, Members>),
    /// Some rows say their communicators, others not, and groups overlap: shares read
    /// on different groups do not compare. Or no group is left to compare in (the
    /// ranks of each sit in different pipeline stages).
    Nobody,
}

impl CommShares {
    pub fn of(windows: &[&WindowSummary]) -> CommShares {
        let timed: Vec<_> = windows.iter().filter_map(|w| w.gpu_wait.as_ref()).collect();
        let groups = |g: &&GpuWait| g.comms.iter().filter(|c| !c.p2p).count();
        if timed.iter().all(|g| g.comms.is_empty()) {
            return CommShares::JobWide;
        }
        if timed.iter().any(|g| g.comms.is_empty()) {
            let overlap = timed.iter().any(|g| groups(g) >= 2);
            return if overlap {
                CommShares::Nobody
            } else {
                CommShares::JobWide
            };
        }
        let mut by: BTreeMap<u64, Vec<&GpuWait>> = BTreeMap::new();
        for g in &timed {
            for c in g.comms.iter().filter(|c| !c.p2p) {
                by.entry(c.comm).or_default().push(g);
            }
        }
        let members: BTreeMap<u64, Members> = by
            .into_iter()
            .filter(|(_, m)| m.len() >= 2 && !across_stages(m))
            .map(|(comm, m)| {
                let own = |g: &&GpuWait| g.comms.iter().find(|c| c.comm == comm).cloned();
                let m: Vec<CommWait> = m.iter().filter_map(own).collect();
                (comm, Members::of(&m))
            })
            .collect();
        if members.is_empty() {
            return CommShares::Nobody;
        }
        CommShares::PerComm(members)
    }

    /// Whether the shares are compared across the job (no row says its groups).
    pub fn job_wide(&self) -> bool {
        matches!(self, CommShares::JobWide)
    }

    /// Where the rank of `w` waits far less than the others, if it waits clearly more
    /// than them (there it waits for someone) in none of its communicators, and none
    /// where it waits much has nobody to compare it with; never where shares do not
    /// compare ([`CommShares::of`]).
    pub fn far(&self, w: &WindowSummary, held: bool) -> Option<CommFar> {
        let CommShares::PerComm(by) = self else {
            return None;
        };
        let g = w.gpu_wait.as_ref()?;
        let (mut best, mut groups) = (None::<CommFar>, 0);
        for own in g.comms.iter().filter(|c| !c.p2p) {
            let Some(m) = by.get(&own.comm) else {
                if own.share >= MIN_MEDIAN {
                    return None;
                }
                continue;
            };
            groups += 1;
            let Some(median) = m.all.median_without(Some(own.share)) else {
                continue;
            };
            if own.share >= MIN_MEDIAN && own.share - median >= HOLD_GAP {
                return None;
            }
            if !far_in_waits(own.share, median, held) || !(held || thirds_far(m, own, g.thirds)) {
                continue;
            }
            let here = CommFar {
                share: own.share,
                median,
                others: m.count - 1,
                groups: 0,
            };
            if best
                .as_ref()
                .is_none_or(|b| median - own.share > b.median - b.share)
            {
                best = Some(here);
            }
        }
        best.map(|b| CommFar { groups, ..b })
    }
}

/// Far below the others by the hold rule in every third where the rank's GPU was
/// timed at all, at least two: a group used in one burst (an evaluation's, a
/// checkpoint's) has no figure in the other thirds, and says nothing of them.
fn thirds_far(m: &Members, own: &CommWait, timed: [Option<f64>; 3]) -> bool {
    let far: Vec<bool> = (0..3)
        .filter(|&t| timed[t].is_some())
        .map(|t| {
            own.thirds[t].is_some_and(|mine| {
                let tm = m.thirds[t].median_without(Some(mine));
                tm.is_some_and(|tm| far_in_waits(mine, tm, true))
            })
        })
        .collect();
    far.len() >= 2 && far.iter().all(|x| *x)
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
                p2p: false,
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
            text.contains("its GPU spends 24% of the time in collectives against 83% for the other 1 of a group they share (and not clearly more than its peers in any other of its groups) over 60s"),
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

    /// The same mesh where transfers are fast (NVLink, InfiniBand): the slow rank's
    /// own share is a few percent in both its groups, so its shard peer's 85% there
    /// is set against 5%. That peer waits far less than rank 0 in their replicate
    /// group, but it waits for rank 3 in their shard group: only rank 3 is named.
    #[test]
    fn the_slow_rank_s_group_mate_is_not_named_where_transfers_are_fast() {
        let rows = [
            row(0, &[(10, 0.30), (20, 0.85)]),
            row(1, &[(10, 0.31), (21, 0.84)]),
            row(2, &[(11, 0.85), (20, 0.06)]),
            row(3, &[(11, 0.05), (21, 0.04)]),
        ];
        assert_eq!(named(&rows), [3]);
    }

    /// A data-parallel job (one group): the job-wide rule and its words; a row
    /// without figures per communicator (a node timing from dumps) puts the whole
    /// job on the job-wide rule, so that rank is judged too.
    #[test]
    fn one_group_or_a_row_without_groups_is_the_job_wide_rule() {
        let rows = [
            row(0, &[(10, 0.62)]),
            row(1, &[(10, 0.08)]),
            row(2, &[(10, 0.60)]),
        ];
        let found = find(&rows, &[]);
        assert_eq!(found.iter().map(|s| s.rank).collect::<Vec<_>>(), [1]);
        let text = found[0].text(std::time::Duration::from_secs(60));
        assert!(!text.contains("group they share"), "{text}");
        let mut mixed = rows.clone();
        let g = mixed[1].window.as_mut().unwrap().gpu_wait.as_mut().unwrap();
        g.comms.clear();
        assert_eq!(named(&mixed), [1]);
    }

    /// Rank 2 waits far less than rank 0 in their group, but waits much in another
    /// whose other members have no figure yet (their window is not whole): nothing
    /// says it is not waiting for them, and it is not named.
    #[test]
    fn a_rank_waiting_much_where_nobody_compares_is_not_named() {
        let rows = [row(0, &[(20, 0.85)]), row(2, &[(11, 0.80), (20, 0.10)])];
        assert!(named(&rows).is_empty());
    }

    /// A group used in one burst (an evaluation's, 30 s of a 60 s window): its
    /// figure comes from the last two thirds alone, where rank 1 waited least; the
    /// rank's GPU was timed in every third, so the burst does not name it.
    #[test]
    fn a_group_used_in_one_burst_names_nobody() {
        let mut rows = vec![
            row(0, &[(10, 0.30), (30, 0.80)]),
            row(1, &[(10, 0.31), (30, 0.05)]),
            row(2, &[(10, 0.29), (30, 0.75)]),
        ];
        for r in &mut rows {
            let g = r.window.as_mut().unwrap().gpu_wait.as_mut().unwrap();
            let burst = g.comms.iter_mut().find(|c| c.comm == 30).unwrap();
            burst.thirds = [None, Some(burst.share), Some(burst.share)];
        }
        assert!(named(&rows).is_empty());
    }

    /// Rank `rank`'s row with `p2p` send/recv communicators beside its groups.
    fn staged(rank: u32, comms: &[(u64, f64)], p2p: &[u64]) -> RankRow {
        let mut r = row(rank, comms);
        let g = r.window.as_mut().unwrap().gpu_wait.as_mut().unwrap();
        g.comms.extend(p2p.iter().map(|&comm| CommWait {
            comm,
            share: 0.1,
            thirds: [Some(0.1); 3],
            p2p: true,
        }));
        r
    }

    /// Two pipeline stages (ranks 0-1, then 2-3) of two data-parallel replicas: the
    /// replicas' groups 10 and 11, send/recv 50 and 51 between the stages, and a tied
    /// embedding's all_reduce (60, 61) between the first and the last stage, where
    /// the last waits for the first's backward by design. Healthy: nobody named.
    #[test]
    fn groups_across_pipeline_stages_are_not_compared() {
        let rows = [
            staged(0, &[(10, 0.30), (60, 0.01)], &[50]),
            staged(1, &[(10, 0.31), (61, 0.01)], &[51]),
            staged(2, &[(11, 0.30), (60, 0.29)], &[50]),
            staged(3, &[(11, 0.29), (61, 0.30)], &[51]),
        ];
        assert!(named(&rows).is_empty(), "{:?}", find(&rows, &[]));
        // The same groups without send/recv between them: ranks 0 and 1 would be the
        // ones the others wait for.
        let flat = [
            row(0, &[(10, 0.30), (60, 0.01)]),
            row(1, &[(10, 0.31), (61, 0.01)]),
            row(2, &[(11, 0.30), (60, 0.29)]),
            row(3, &[(11, 0.29), (61, 0.30)]),
        ];
        assert_eq!(named(&flat), [0, 1]);
    }

    /// Overlapping groups with one row that does not say its groups (a node timing
    /// from dumps, which sum every group): shares read on different groups do not
    /// compare, and nobody is named by them.
    #[test]
    fn overlapping_groups_with_a_row_without_groups_name_nobody() {
        let mut rows = vec![
            row(0, &[(10, 0.60), (20, 0.62)]),
            row(1, &[(10, 0.08), (21, 0.07)]),
            row(2, &[(11, 0.61), (20, 0.60)]),
        ];
        let g = rows[1].window.as_mut().unwrap().gpu_wait.as_mut().unwrap();
        g.comms.clear();
        assert!(named(&rows).is_empty());
    }
}
