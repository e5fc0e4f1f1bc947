//! Progress as NCCL counts it: operations completing. When ranks wait in an NCCL
//! operation and none has completed on this node for a while, the ranks that never
//! posted that operation hold the others up; each is busy (its CPU runs: a loop that
//! does not end, an evaluation on one rank) or stuck (its CPU idles: a read, a lock).
//! Nothing toporun does to a rank (a stack sample) moves this clock.

use super::decode::{CommCounters, OpenOp, RankCounters};
use super::func::NcclFunc;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A rank busy at least this share of the stall on its CPU is busy, not stuck.
pub const BUSY_SHARE: f64 = 0.5;

/// This node's ranks at one reading: counters (None: no file yet, NCCL not
/// initialised) and CPU time used so far.
#[derive(Debug, Clone, Default)]
pub struct NodeReading {
    /// The node's live ranks (the counters' ranks where empty).
    pub live: Vec<u32>,
    pub counters: BTreeMap<u32, RankCounters>,
    pub cpu: BTreeMap<u32, Duration>,
}

/// What the counters say at a reading.
#[derive(Debug, Clone, PartialEq)]
pub enum NcclState {
    /// No rank waits in an NCCL operation.
    Idle,
    /// Ranks wait and operations completed within the last `since`.
    Moving,
    Stalled(NcclStall),
}

/// Ranks wait in an operation and none completed for `stalled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclStall {
    pub stalled_secs: f64,
    pub comm: u64,
    pub op: OpenOp,
    /// The ranks of this node that posted it and wait.
    pub waiting: Vec<u32>,
    /// The ranks of this node that never posted it.
    pub behind: Vec<Behind>,
}

/// A rank that never posted the operation the others wait in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Behind {
    pub rank: u32,
    /// Operations it posted on that communicator; None: it has no such communicator
    /// (it never reached its creation, or NCCL is not loaded in it).
    pub posted: Option<u64>,
    /// Its CPU time over the stall, as a share of it (None: unread).
    pub cpu_share: Option<f64>,
}

impl Behind {
    pub fn busy(&self) -> Option<bool> {
        self.cpu_share.map(|s| s >= BUSY_SHARE)
    }
}

/// Follows this node's counters from reading to reading.
#[derive(Debug, Default)]
pub struct NcclWatch {
    /// Completions summed over every rank's communicators at the last reading.
    done: u64,
    /// When the last completion was seen (or the wait began), and each rank's CPU
    /// time then.
    since: Option<(Instant, BTreeMap<u32, Duration>)>,
}

impl NcclWatch {
    pub fn observe(&mut self, node: &NodeReading, now: Instant) -> NcclState {
        let done: u64 = node
            .counters
            .values()
            .flat_map(|c| &c.comms)
            .map(|c| c.completed.wrapping_add(c.generation << 32))
            .fold(0, u64::wrapping_add);
        let moved = done != self.done;
        self.done = done;
        let Some((comm, op)) = oldest_wait(node) else {
            self.since = None;
            return NcclState::Idle;
        };
        if moved || self.since.is_none() {
            self.since = Some((now, node.cpu.clone()));
            return NcclState::Moving;
        }
        let Some((since, cpu_then)) = &self.since else {
            return NcclState::Moving;
        };
        let stalled = now.saturating_duration_since(*since);
        let share = |rank: u32| {
            let (a, b) = (cpu_then.get(&rank)?, node.cpu.get(&rank)?);
            (!stalled.is_zero()).then(|| b.saturating_sub(*a).as_secs_f64() / stalled.as_secs_f64())
        };
        let (mut waiting, mut behind) = (Vec::new(), Vec::new());
        let ranks: Vec<u32> = match node.live.is_empty() {
            true => node.counters.keys().copied().collect(),
            false => node.live.clone(),
        };
        for rank in ranks {
            let found = node
                .counters
                .get(&rank)
                .and_then(|c| c.comms.iter().find(|x| x.live && x.hash == comm));
            match found {
                Some(x) if x.posted > op.index => waiting.push(rank),
                found => behind.push(Behind {
                    rank,
                    posted: found.map(|x| x.posted),
                    cpu_share: share(rank),
                }),
            }
        }
        NcclState::Stalled(NcclStall {
            stalled_secs: stalled.as_secs_f64(),
            comm,
            op,
            waiting,
            behind,
        })
    }
}

/// The communicator whose open operation most ranks wait in, and that operation.
fn oldest_wait(node: &NodeReading) -> Option<(u64, OpenOp)> {
    let mut by: BTreeMap<u64, (u32, Option<OpenOp>)> = BTreeMap::new();
    for c in node.counters.values().flat_map(|c| &c.comms) {
        if !c.live || c.in_flight() == 0 {
            continue;
        }
        let e = by.entry(c.hash).or_insert((0, None));
        e.0 += 1;
        e.1 = e.1.or(Some(open_of(c)));
    }
    by.into_iter()
        .max_by_key(|(_, (n, _))| *n)
        .and_then(|(hash, (_, op))| Some((hash, op?)))
}

/// The open operation, or what is known of it where the ring moved on.
fn open_of(c: &CommCounters) -> OpenOp {
    c.open.unwrap_or(OpenOp {
        index: c.completed,
        func: NcclFunc::Unknown,
        bytes: 0,
        kernel_start_ns: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl_counters::decode::decode;
    use crate::nccl_counters::words::Words;

    /// Rank `rank` of 2 on communicator 7: `posted` all_reduces, `done` completed.
    fn rank(r: u32, posted: u64, done: u64) -> RankCounters {
        let mut w = Words::default();
        w.comm(0, 7, r, 2)
            .ops(0, NcclFunc::AllReduce, 4 << 20, posted, done, 1000);
        decode(&w.bytes()).unwrap()
    }

    fn reading(ranks: &[(u32, u64, u64)], cpu: &[(u32, u64)]) -> NodeReading {
        NodeReading {
            live: Vec::new(),
            counters: ranks.iter().map(|&(r, p, d)| (r, rank(r, p, d))).collect(),
            cpu: cpu
                .iter()
                .map(|&(r, ms)| (r, Duration::from_millis(ms)))
                .collect(),
        }
    }

    #[test]
    fn a_rank_that_never_posted_is_behind_and_busy_when_its_cpu_runs() {
        let t0 = Instant::now();
        let mut w = NcclWatch::default();
        assert_eq!(
            w.observe(&reading(&[(0, 5, 5), (1, 5, 5)], &[]), t0),
            NcclState::Idle
        );
        // Rank 0 posts the 6th all_reduce; rank 1 spins in Python.
        let r = reading(&[(0, 6, 5), (1, 5, 5)], &[(0, 100), (1, 100)]);
        assert_eq!(
            w.observe(&r, t0 + Duration::from_secs(1)),
            NcclState::Moving
        );
        let later = reading(&[(0, 6, 5), (1, 5, 5)], &[(0, 150), (1, 9_100)]);
        let NcclState::Stalled(s) = w.observe(&later, t0 + Duration::from_secs(10)) else {
            panic!("stalled");
        };
        assert_eq!(s.stalled_secs, 9.0);
        assert_eq!(
            (s.op.index, s.op.func, s.op.bytes),
            (5, NcclFunc::AllReduce, 4 << 20)
        );
        assert_eq!(s.waiting, vec![0]);
        assert_eq!(s.behind.len(), 1);
        assert_eq!((s.behind[0].rank, s.behind[0].posted), (1, Some(5)));
        assert_eq!(s.behind[0].busy(), Some(true));
    }

    #[test]
    fn completions_restart_the_clock_and_an_idle_cpu_is_stuck() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let mut w = NcclWatch::default();
        w.observe(&reading(&[(0, 6, 5), (1, 6, 5)], &[]), at(0));
        // Both posted the 6th and it completes: moving.
        let moved = reading(&[(0, 7, 6), (1, 6, 6)], &[(0, 0), (1, 0)]);
        assert_eq!(w.observe(&moved, at(5)), NcclState::Moving);
        let stuck = reading(&[(0, 7, 6), (1, 6, 6)], &[(0, 10), (1, 20)]);
        let NcclState::Stalled(s) = w.observe(&stuck, at(25)) else {
            panic!("stalled");
        };
        assert_eq!(s.stalled_secs, 20.0);
        assert_eq!(s.behind[0].busy(), Some(false));
    }

    #[test]
    fn every_rank_posted_names_nobody_behind() {
        let t0 = Instant::now();
        let mut w = NcclWatch::default();
        let r = reading(&[(0, 6, 5), (1, 6, 5)], &[]);
        w.observe(&r, t0);
        let NcclState::Stalled(s) = w.observe(&r, t0 + Duration::from_secs(3)) else {
            panic!("stalled");
        };
        assert_eq!(s.waiting, vec![0, 1]);
        assert!(s.behind.is_empty());
    }
}
