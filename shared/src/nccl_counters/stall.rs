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
/// initialised), CPU time used and bytes written so far.
#[derive(Debug, Clone, Default)]
pub struct NodeReading {
    /// The node's live ranks (the counters' ranks where empty).
    pub live: Vec<u32>,
    pub counters: BTreeMap<u32, RankCounters>,
    pub cpu: BTreeMap<u32, Duration>,
    pub written: BTreeMap<u32, u64>,
}

/// What the counters say at a reading.
#[derive(Debug, Clone, PartialEq)]
pub enum NcclState {
    /// No rank waits in an NCCL operation.
    Idle,
    /// Ranks wait and operations completed (or a rank behind wrote) since the last
    /// reading: the clock starts again.
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
    /// The ranks of this node in the communicator that never posted it.
    pub behind: Vec<Behind>,
    /// Ranks of the communicator that should be on this node (all of it is: one
    /// node) and have no such communicator yet.
    #[serde(default)]
    pub missing: u32,
}

/// A rank that never posted the operation the others wait in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Behind {
    pub rank: u32,
    /// Operations it posted on that communicator.
    pub posted: u64,
    /// Its main thread's CPU time over the stall, as a share of it (None: unread).
    pub cpu_share: Option<f64>,
}

impl Behind {
    pub fn busy(&self) -> Option<bool> {
        self.cpu_share.map(|s| s >= BUSY_SHARE)
    }
}

/// When the stall began, and each rank's CPU time and bytes written then.
#[derive(Debug, Clone)]
struct Since {
    at: Instant,
    cpu: BTreeMap<u32, Duration>,
    written: BTreeMap<u32, u64>,
}

/// Follows this node's counters from reading to reading.
#[derive(Debug, Default)]
pub struct NcclWatch {
    /// Completions summed over every rank's communicators at the last reading.
    done: u64,
    since: Option<Since>,
}

impl NcclWatch {
    /// The stall's clock starts again at the next reading (the caller saw no rank
    /// waiting where the counters say they wait).
    pub fn hold_off(&mut self) {
        self.since = None;
    }

    pub fn observe(&mut self, node: &NodeReading, now: Instant) -> NcclState {
        let done: u64 = node
            .counters
            .values()
            .flat_map(|c| &c.comms)
            .map(|c| c.done.wrapping_add(c.generation << 32))
            .fold(0, u64::wrapping_add);
        let moved = done != self.done;
        self.done = done;
        let Some((comm, op)) = oldest_wait(node) else {
            self.since = None;
            return NcclState::Idle;
        };
        let stall = match &self.since {
            Some(since) if !moved => stall_of(node, since, (comm, op), now),
            _ => None,
        };
        match stall {
            Some(s) => NcclState::Stalled(s),
            None => {
                self.since = Some(Since {
                    at: now,
                    cpu: node.cpu.clone(),
                    written: node.written.clone(),
                });
                NcclState::Moving
            }
        }
    }
}

/// The stall since `since` on `comm`'s open `op`; None where a rank behind wrote
/// meanwhile (a checkpoint only it saves is progress, as in the stack rule).
fn stall_of(
    node: &NodeReading,
    since: &Since,
    (comm, op): (u64, OpenOp),
    now: Instant,
) -> Option<NcclStall> {
    let stalled = now.saturating_duration_since(since.at);
    let share = |rank: u32| {
        let (a, b) = (since.cpu.get(&rank)?, node.cpu.get(&rank)?);
        (!stalled.is_zero()).then(|| b.saturating_sub(*a).as_secs_f64() / stalled.as_secs_f64())
    };
    let wrote = |rank: u32| match (since.written.get(&rank), node.written.get(&rank)) {
        (Some(a), Some(b)) => b > a,
        _ => false,
    };
    let ranks: Vec<u32> = match node.live.is_empty() {
        true => node.counters.keys().copied().collect(),
        false => node.live.clone(),
    };
    let (mut waiting, mut behind, mut members, mut group) = (Vec::new(), Vec::new(), 0, None);
    for rank in ranks {
        let Some(x) = node
            .counters
            .get(&rank)
            .and_then(|c| c.comms.iter().find(|x| x.live && x.hash == comm))
        else {
            continue; // not in the communicator (or not there yet)
        };
        members += 1;
        group = Some((x.nranks, x.nnodes));
        if x.posted > op.index {
            waiting.push(rank);
        } else if wrote(rank) {
            return None;
        } else {
            behind.push(Behind {
                rank,
                posted: x.posted,
                cpu_share: share(rank),
            });
        }
    }
    let missing = match group {
        Some((nranks, 1)) => nranks.saturating_sub(members),
        _ => 0,
    };
    Some(NcclStall {
        stalled_secs: stalled.as_secs_f64(),
        comm,
        op,
        waiting,
        behind,
        missing,
    })
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
            written: BTreeMap::new(),
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
        assert_eq!((s.behind[0].rank, s.behind[0].posted), (1, 5));
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

    /// A rank of another subgroup is not blamed; a member not there yet is counted.
    #[test]
    fn only_the_communicator_s_members_are_behind() {
        let t0 = Instant::now();
        let mut w = NcclWatch::default();
        let mut r = reading(&[(0, 6, 5)], &[]);
        let mut other = Words::default();
        other
            .comm(0, 8, 0, 1)
            .ops(0, NcclFunc::AllReduce, 64, 3, 3, 10);
        r.counters.insert(2, decode(&other.bytes()).unwrap());
        r.live = vec![0, 1, 2];
        w.observe(&r, t0);
        let NcclState::Stalled(s) = w.observe(&r, t0 + Duration::from_secs(5)) else {
            panic!("stalled");
        };
        assert!(s.behind.is_empty(), "{s:?}");
        assert_eq!(
            (s.waiting.clone(), s.missing),
            (vec![0], 1),
            "rank 1 of 2 has no communicator 7"
        );
    }

    /// A rank behind that writes (a checkpoint only it saves) is progress.
    #[test]
    fn a_rank_behind_that_writes_restarts_the_clock() {
        let t0 = Instant::now();
        let mut w = NcclWatch::default();
        let mut r = reading(&[(0, 6, 5), (1, 5, 5)], &[]);
        r.written = [(0, 10), (1, 100)].into();
        w.observe(&r, t0);
        r.written = [(0, 10), (1, 900)].into();
        assert_eq!(
            w.observe(&r, t0 + Duration::from_secs(5)),
            NcclState::Moving
        );
        assert!(
            matches!(w.observe(&r, t0 + Duration::from_secs(9)), NcclState::Stalled(s) if s.stalled_secs == 4.0)
        );
        w.hold_off();
        assert_eq!(
            w.observe(&r, t0 + Duration::from_secs(10)),
            NcclState::Moving,
            "held off"
        );
    }
}
