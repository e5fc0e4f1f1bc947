//! Progress as NCCL counts it: operations posted and completing. When ranks wait in
//! an NCCL operation and none has been posted or completed on this node for a while,
//! the ranks that never posted that operation hold the others up; each is busy (its
//! CPU runs: a loop that does not end, an evaluation on one rank) or stuck (its CPU
//! idles: a read, a lock). Nothing toporun does to a rank (a stack sample) moves this
//! clock. Where NCCL times only sampled operations, which operation every rank waits
//! in is known only when a timed one is open; else it is their last posted.

use super::decode::{CommCounters, PostedOp, RankCounters};
use super::mismatch::{mismatch, Mismatch};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// A rank busy at least this share of the stall on its CPU is busy, not stuck.
pub const BUSY_SHARE: f64 = 0.5;

/// This node's ranks at one reading: counters (None: no file yet, NCCL not
/// initialised), CPU time used and bytes written so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeReading {
    /// The node's live ranks (the counters' ranks where empty).
    pub live: Vec<u32>,
    pub counters: BTreeMap<u32, RankCounters>,
    pub cpu: BTreeMap<u32, Duration>,
    pub written: BTreeMap<u32, u64>,
    /// Ranks whose stacks wait on their GPU (`.item()`, `synchronize`): they posted
    /// all they will, so none of them is behind.
    pub on_gpu: BTreeSet<u32>,
    /// Every node's ranks (merged): a communicator's members missing here never
    /// created it, wherever it spans.
    pub whole_job: bool,
    /// Ranks whose counters file is there and does not read (a plugin of another
    /// layout): the counters cannot judge these ranks, so they judge nothing.
    #[serde(default)]
    pub unreadable: BTreeSet<u32>,
    /// Whether each rank's GPU ran kernels within the hang watch's window (its
    /// --hang-timeout), where NVML's samples say (the straggler tracker's; a rank
    /// absent: not known): a busy rank behind whose GPU runs has work that moves.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_busy: BTreeMap<u32, bool>,
}

impl NodeReading {
    /// What a node publishes for the job-wide decision: its live communicators,
    /// without the per-function totals, which the hang rule does not read.
    pub fn for_exchange(mut self) -> NodeReading {
        for c in self.counters.values_mut() {
            c.comms.retain(|c| c.live);
            // Point-to-point ever completed stays said (`carries_p2p`).
            c.comms
                .iter_mut()
                .for_each(|c| c.funcs.retain(|f| f.func.is_p2p() && f.count > 0));
        }
        self
    }

    /// Only the operations still open (a record over the store's bound): a wait's
    /// last posted operation may then read as unknown.
    pub fn only_open_ops(&mut self) {
        let comms = self.counters.values_mut().flat_map(|c| &mut c.comms);
        comms.for_each(|c| {
            let done = c.timed_upto;
            c.recent.retain(|o| o.index >= done);
        });
    }

    /// Posts and completions summed over every rank's communicators (each slot's
    /// generation mixed in): equal at two readings when nothing moved between.
    pub fn marks(&self) -> (u64, u64) {
        self.marks_of(|_| true)
    }

    /// The same of communicator `comm` alone: another communicator's posts (a side
    /// group's metrics, a background thread's) are not this one's progress.
    pub fn comm_marks(&self, comm: u64) -> (u64, u64) {
        self.marks_of(|c| c.hash == comm)
    }

    fn marks_of(&self, of: impl Fn(&CommCounters) -> bool) -> (u64, u64) {
        let comms = || {
            self.counters
                .values()
                .flat_map(|c| &c.comms)
                .filter(|c| of(c))
        };
        let mark = |f: fn(&CommCounters) -> u64| {
            comms()
                .map(|c| f(c).wrapping_add(c.generation << 32))
                .fold(0, u64::wrapping_add)
        };
        (mark(|c| c.posted), mark(|c| c.done))
    }

    /// Several nodes' readings as one, every node's (global ranks do not repeat across
    /// nodes).
    pub fn merge<'a>(nodes: impl IntoIterator<Item = &'a NodeReading>) -> NodeReading {
        let mut all = NodeReading::default();
        for n in nodes {
            all.live.extend(&n.live);
            all.counters
                .extend(n.counters.iter().map(|(r, c)| (*r, c.clone())));
            all.cpu.extend(&n.cpu);
            all.written.extend(&n.written);
            all.on_gpu.extend(&n.on_gpu);
            all.unreadable.extend(&n.unreadable);
            all.gpu_busy.extend(&n.gpu_busy);
        }
        all.live.sort_unstable();
        all.whole_job = true;
        all
    }
}

/// What the counters say at a reading.
#[derive(Debug, Clone, PartialEq)]
pub enum NcclState {
    /// No rank waits in an NCCL operation.
    Idle,
    /// Some rank's counters file did not decode: this reading says nothing (the file
    /// is reported once where it is read).
    Unreadable,
    /// Ranks wait and operations were posted or completed (or a rank behind wrote)
    /// since the last reading: the clock starts again. Also where a communicator
    /// stands beside one that moves, waiting only where the counters cannot tell a
    /// hang from work (its last posted operation, or a point-to-point one): a side
    /// group left stale reads the same, and the stack rule would take a loop sampled
    /// at `.item()` for a stand, so neither rule judges then (NCCL's watchdog still
    /// ends a collective that never completes).
    Moving,
    Stalled(NcclStall),
}

/// Ranks wait in an operation and none was posted or completed for `stalled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclStall {
    pub stalled_secs: f64,
    pub comm: u64,
    pub op: PostedOp,
    /// The ranks of this node that posted it and wait.
    pub waiting: Vec<u32>,
    /// The ranks of this node in the communicator that never posted it.
    pub behind: Vec<Behind>,
    /// Ranks of the communicator that should be on this node (all of it is: one
    /// node) and have no such communicator yet.
    #[serde(default)]
    pub missing: u32,
    /// Where every member posted `op` and none completed it: the members' operations
    /// there, where they differ.
    #[serde(default)]
    pub mismatch: Option<Mismatch>,
    /// How `op` is known to be the one waited in.
    #[serde(default)]
    pub which: WaitedOp,
    /// Other communicators of the node moved at this reading: only this one stands.
    #[serde(default)]
    pub others_moving: bool,
}

/// How the operation of a stall was found, surest first (the order ranks
/// communicators: `awaited`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WaitedOp {
    /// The oldest one not completed: NCCL timed it, and every one before completed.
    #[default]
    Oldest,
    /// The first one some member never posted (and that member's stack does not wait
    /// on its GPU); NCCL did not time the ones before it (sampling).
    FirstNotPosted,
    /// Every member's last posted; which one they wait in is not known.
    LastPosted,
}

/// A rank that never posted the operation the others wait in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Behind {
    pub rank: u32,
    /// Operations it posted on that communicator.
    pub posted: u64,
    /// Its main thread's CPU time over the stall, as a share of it (None: unread).
    pub cpu_share: Option<f64>,
    /// An operation it posted on another communicator and waits in, which some of
    /// that communicator's members never posted.
    #[serde(default)]
    pub waits_in: Option<WaitsElsewhere>,
}

impl Behind {
    pub fn busy(&self) -> Option<bool> {
        self.cpu_share.map(|s| s >= BUSY_SHARE)
    }
}

/// A rank behind on one communicator that waits in an operation of another, which
/// other members of that one never posted: the ranks called the two communicators'
/// collectives in different orders (one skipped or added a collective). Its CPU may
/// spin there (a copy queued behind NCCL's kernel on its stream): not work of its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitsElsewhere {
    pub comm: u64,
    pub op: PostedOp,
    /// The members of `comm` on this node that never posted `op`.
    pub behind: Vec<u32>,
}

/// When the stall began, and each rank's CPU time and bytes written then, and each
/// communicator's marks (another one still moving holds no one).
#[derive(Debug, Clone)]
struct Since {
    at: Instant,
    cpu: BTreeMap<u32, Duration>,
    written: BTreeMap<u32, u64>,
    comms: BTreeMap<u64, (u64, u64)>,
}

/// Follows this node's counters from reading to reading, each communicator with an
/// operation open on its own clock: a side group that keeps posting (a metrics
/// thread) is not the stuck group's progress.
#[derive(Debug, Default)]
pub struct NcclWatch {
    /// Each communicator waited in: its members' posts and completions summed at the
    /// last reading, and when they last moved.
    comms: BTreeMap<u64, ((u64, u64), Since)>,
}

impl NcclWatch {
    /// `comm`'s clock starts again at the next reading (the caller saw no rank
    /// waiting where the counters say they wait); the others' run on.
    pub fn hold_off(&mut self, comm: u64) {
        self.comms.remove(&comm);
    }

    /// Stalled where a communicator waited in stood still since an earlier reading:
    /// while another moves, only one of collectives whose wait names its operation
    /// (timed open, or a member that never posted it); with nothing moving, the one
    /// whose wait says most ([`awaited`]'s order).
    pub fn observe(&mut self, node: &NodeReading, now: Instant) -> NcclState {
        if !node.unreadable.is_empty() {
            self.comms.clear();
            return NcclState::Unreadable;
        }
        let waits = awaited(node);
        if waits.is_empty() {
            self.comms.clear();
            return NcclState::Idle;
        }
        self.comms.retain(|h, _| waits.iter().any(|w| w.comm == *h));
        let (mut stalls, mut restarted) = (Vec::new(), Vec::new());
        for w in &waits {
            let marks = node.comm_marks(w.comm);
            let stall = match self.comms.get(&w.comm) {
                Some((m, since)) if *m == marks => stall_of(node, since, *w, now),
                _ => None,
            };
            match stall {
                Some(s) => stalls.push(s),
                None => restarted.push(w.comm),
            }
        }
        let moved = !restarted.is_empty();
        // While another communicator moves, a last posted operation (which one they
        // wait in is not known) or a point-to-point one (a receive posted long before
        // its send) says nothing of a hang: its clock starts again, so that it never
        // stands for time the others were moving.
        let p2p = p2p_comms(node);
        let (counted, held): (Vec<NcclStall>, Vec<NcclStall>) = stalls
            .into_iter()
            .partition(|s| !moved || (s.which != WaitedOp::LastPosted && !p2p.contains(&s.comm)));
        restarted.extend(held.iter().map(|s| s.comm));
        self.restart(node, &restarted, now);
        match counted.into_iter().next() {
            Some(mut s) => {
                s.others_moving = moved;
                NcclState::Stalled(s)
            }
            None => NcclState::Moving,
        }
    }

    /// The clocks of `comms` start at this reading (one snapshot for all of them).
    fn restart(&mut self, node: &NodeReading, comms: &[u64], now: Instant) {
        if comms.is_empty() {
            return;
        }
        let since = Since {
            at: now,
            cpu: node.cpu.clone(),
            written: node.written.clone(),
            comms: every_comm_marks(node),
        };
        for &comm in comms {
            self.comms
                .insert(comm, (node.comm_marks(comm), since.clone()));
        }
    }
}

/// The communicators that carry point-to-point traffic on some rank.
fn p2p_comms(node: &NodeReading) -> BTreeSet<u64> {
    node.counters
        .values()
        .flat_map(|c| &c.comms)
        .filter(|c| c.carries_p2p())
        .map(|c| c.hash)
        .collect()
}

/// The stall since `since` on `comm`'s open `op`; None where a rank behind wrote
/// meanwhile (a checkpoint only it saves is progress, as in the stack rule).
fn stall_of(node: &NodeReading, since: &Since, wait: Awaited, now: Instant) -> Option<NcclStall> {
    let Awaited { comm, op, which } = wait;
    let stalled = now.saturating_duration_since(since.at);
    let share = |rank: u32| {
        let (a, b) = (since.cpu.get(&rank)?, node.cpu.get(&rank)?);
        (!stalled.is_zero()).then(|| b.saturating_sub(*a).as_secs_f64() / stalled.as_secs_f64())
    };
    let wrote = |rank: u32| match (since.written.get(&rank), node.written.get(&rank)) {
        (Some(a), Some(b)) => b > a,
        _ => false,
    };
    let members = members(node, comm);
    let (mut waiting, mut behind, mut group) = (Vec::new(), Vec::new(), None);
    for &(rank, x) in &members {
        group = Some((x.nranks, x.nnodes));
        if x.posted > op.index {
            waiting.push(rank);
        } else if which != WaitedOp::Oldest && node.on_gpu.contains(&rank) {
            continue; // posted all it will: neither behind nor in this operation
        } else if wrote(rank) {
            return None;
        } else {
            behind.push(Behind {
                rank,
                posted: x.posted,
                cpu_share: share(rank),
                waits_in: waits_elsewhere(node, since, rank, comm),
            });
        }
    }
    let missing = match group {
        Some((nranks, nnodes)) if nnodes == 1 || node.whole_job => {
            nranks.saturating_sub(members.len() as u32)
        }
        _ => 0,
    };
    // Point-to-point: a send and its recv are different operations under one index.
    let p2p = members.iter().any(|(_, c)| c.carries_p2p());
    let mismatch = match behind.is_empty() && missing == 0 && !p2p {
        true => mismatch(&members, op.index),
        false => None,
    };
    Some(NcclStall {
        stalled_secs: stalled.as_secs_f64(),
        comm,
        op,
        waiting,
        behind,
        missing,
        mismatch,
        which,
        others_moving: false,
    })
}

/// Each live communicator's marks at this reading.
fn every_comm_marks(node: &NodeReading) -> BTreeMap<u64, (u64, u64)> {
    let hashes: BTreeSet<u64> = node
        .counters
        .values()
        .flat_map(|c| &c.comms)
        .filter(|c| c.live)
        .map(|c| c.hash)
        .collect();
    hashes
        .into_iter()
        .map(|h| (h, node.comm_marks(h)))
        .collect()
}

/// The operation `rank` waits in on a communicator other than `stalled`: the first
/// one it posted that another member never did, on a communicator where nothing moved
/// since the stall began (ranks queue operations ahead of each other on a moving one),
/// and not point-to-point (stages post different counts by design).
fn waits_elsewhere(
    node: &NodeReading,
    since: &Since,
    rank: u32,
    stalled: u64,
) -> Option<WaitsElsewhere> {
    let own = node.counters.get(&rank)?;
    let still = |c: &CommCounters| since.comms.get(&c.hash) == Some(&node.comm_marks(c.hash));
    own.comms
        .iter()
        .filter(|c| c.live && c.hash != stalled && c.past_timed() > 0 && still(c))
        .find_map(|c| {
            let members = members(node, c.hash);
            if members.iter().any(|(_, m)| m.carries_p2p()) {
                return None;
            }
            let least = members.iter().map(|(_, m)| m.posted).min()?;
            let behind: Vec<u32> = members
                .iter()
                .filter(|(_, m)| m.posted == least)
                .map(|(r, _)| *r)
                .collect();
            (c.posted > least && c.timed_upto <= least).then(|| WaitsElsewhere {
                comm: c.hash,
                op: c.op(least).unwrap_or_else(|| PostedOp::unknown(least)),
                behind,
            })
        })
}

/// The node's live ranks in communicator `comm`, with their counters of it.
fn members(node: &NodeReading, comm: u64) -> Vec<(u32, &CommCounters)> {
    let ranks: Vec<u32> = match node.live.is_empty() {
        true => node.counters.keys().copied().collect(),
        false => node.live.clone(),
    };
    ranks
        .into_iter()
        .filter_map(|rank| {
            let c = node.counters.get(&rank)?;
            Some((rank, c.comms.iter().find(|x| x.live && x.hash == comm)?))
        })
        .collect()
}

/// What ranks wait in: a communicator and its operation.
#[derive(Debug, Clone, Copy)]
struct Awaited {
    comm: u64,
    op: PostedOp,
    which: WaitedOp,
}

/// The operation the members wait in: the oldest not completed where NCCL timed it
/// on every member that completed no further (so every operation before it
/// completed); else the first one some member never posted (where that member does
/// not wait on its GPU, and the communicator is not point-to-point: pipeline stages
/// post different counts by design); else the last one they all posted.
fn waited_in(
    members: &[(u32, &CommCounters)],
    on_gpu: &BTreeSet<u32>,
) -> Option<(PostedOp, WaitedOp)> {
    let unknown = PostedOp::unknown;
    let find = |index| members.iter().find_map(|(_, c)| c.op(index));
    let oldest = members.iter().map(|(_, c)| c.timed_upto).min()?;
    let every_op_timed = members.iter().all(|(_, c)| c.every_op_timed);
    // The members that completed no further and have it open: each must time it.
    let mut lagging = members
        .iter()
        .filter(|(_, c)| c.timed_upto == oldest && c.posted > oldest)
        .peekable();
    let lagging_timed =
        lagging.peek().is_some() && lagging.all(|(_, c)| c.op(oldest).is_some_and(|o| o.timed));
    if every_op_timed || lagging_timed {
        return Some((find(oldest).unwrap_or(unknown(oldest)), WaitedOp::Oldest));
    }
    let posted = members.iter().map(|(_, c)| c.posted);
    let (least, most) = (posted.clone().min()?, posted.max()?);
    let p2p = members.iter().any(|(_, c)| c.carries_p2p());
    let behind = members
        .iter()
        .any(|(r, c)| c.posted == least && !on_gpu.contains(r));
    if least < most && !p2p && behind {
        return Some((
            find(least).unwrap_or(unknown(least)),
            WaitedOp::FirstNotPosted,
        ));
    }
    let last = least.saturating_sub(1);
    Some((find(last).unwrap_or(unknown(last)), WaitedOp::LastPosted))
}

/// The communicators with operations open, the one whose wait says most first: a
/// timed operation open, then one a member never posted, then a last posted (with
/// sampling every communicator has untimed operations open); then the one most ranks
/// are in.
fn awaited(node: &NodeReading) -> Vec<Awaited> {
    let open: BTreeSet<u64> = node
        .counters
        .values()
        .flat_map(|c| &c.comms)
        .filter(|c| c.live && c.past_timed() > 0)
        .map(|c| c.hash)
        .collect();
    let mut waits: Vec<(std::cmp::Reverse<usize>, Awaited)> = open
        .into_iter()
        .filter_map(|comm| {
            let members = members(node, comm);
            let (op, which) = waited_in(&members, &node.on_gpu)?;
            Some((
                std::cmp::Reverse(members.len()),
                Awaited { comm, op, which },
            ))
        })
        .collect();
    waits.sort_by_key(|(n, a)| (a.which, *n, a.comm));
    waits.into_iter().map(|(_, a)| a).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl_counters::decode::decode;
    use crate::nccl_counters::func::NcclFunc;
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
            ..Default::default()
        }
    }

    /// The stall `node` shows when read twice `secs` apart with nothing moving.
    fn still(node: &NodeReading, secs: u64) -> NcclStall {
        let t0 = Instant::now();
        let mut w = NcclWatch::default();
        w.observe(node, t0);
        match w.observe(node, t0 + Duration::from_secs(secs)) {
            NcclState::Stalled(s) => s,
            other => panic!("not stalled: {other:?}"),
        }
    }

    /// Lightning on 2x H200 (issue 61), rank 1 skipping an all_reduce on a side group:
    /// rank 0 posted it (side op 2) and its next copy to the GPU queued behind NCCL's
    /// kernel, so it never posted the default group's op 474 that rank 1 waits in, its
    /// CPU spinning at 100%. It waits in NCCL, on rank 1: not work of its own. Either
    /// communicator may be the one judged; each names the other's wait.
    #[test]
    fn a_rank_behind_that_waits_in_another_communicator_is_not_busy() {
        for (default, side) in [(0x5, 0xd), (0xd, 0x5)] {
            let rank = |r: u32, default_posted: u64, side_posted: u64| {
                let mut w = Words::default();
                w.comm(0, default, r, 2)
                    .ops(0, NcclFunc::AllReduce, 4, default_posted, 473, 1000)
                    .comm(1, side, r, 2)
                    .ops(1, NcclFunc::AllReduce, 4, side_posted, 1, 1000);
                decode(&w.bytes()).unwrap()
            };
            let node = NodeReading {
                counters: [(0, rank(0, 473, 2)), (1, rank(1, 474, 1))].into(),
                cpu: [(0, Duration::ZERO), (1, Duration::ZERO)].into(),
                ..Default::default()
            };
            let mut later = node.clone();
            later.cpu = [(0, Duration::from_secs(30)), (1, Duration::ZERO)].into();
            let (mut w, t0) = (NcclWatch::default(), Instant::now());
            w.observe(&node, t0);
            let NcclState::Stalled(s) = w.observe(&later, t0 + Duration::from_secs(30)) else {
                panic!("not stalled")
            };
            let b = &s.behind[0];
            let waits = b
                .waits_in
                .as_ref()
                .map(|x| (x.comm, x.op.index, x.behind.clone()));
            match s.comm == default {
                true => assert_eq!(
                    (b.rank, b.busy(), waits),
                    (0, Some(true), Some((side, 1, vec![1])))
                ),
                false => assert_eq!(
                    (b.rank, b.busy(), waits),
                    (1, Some(false), Some((default, 473, vec![0])))
                ),
            }
        }
    }

    /// Rank 0 evaluates alone on a communicator it shares with rank 1 (both moving,
    /// rank 0 a post ahead at each reading) while rank 1 waits in the default one: the
    /// other communicator moves, so rank 0 waits in nothing there: busy.
    #[test]
    fn a_communicator_still_moving_holds_no_one() {
        let rank = |r: u32, a: u64, b: u64| {
            let mut w = Words::default();
            w.comm(0, 0x5, r, 2)
                .ops(0, NcclFunc::AllReduce, 4, a, 5, 1000)
                .comm(1, 0xd, r, 2)
                .ops(1, NcclFunc::AllReduce, 4 << 20, b, b - 1, 1000);
            decode(&w.bytes()).unwrap()
        };
        let at = |b: u64, cpu: u64| NodeReading {
            counters: [(0, rank(0, 5, b + 1)), (1, rank(1, 6, b))].into(),
            cpu: [(0, Duration::from_secs(cpu)), (1, Duration::ZERO)].into(),
            ..Default::default()
        };
        let (mut w, t0) = (NcclWatch::default(), Instant::now());
        w.observe(&at(10, 0), t0);
        let NcclState::Stalled(s) = w.observe(&at(20, 30), t0 + Duration::from_secs(30)) else {
            panic!("not stalled")
        };
        assert_eq!((s.comm, s.behind[0].rank), (0x5, 0));
        assert_eq!(
            (s.behind[0].busy(), &s.behind[0].waits_in),
            (Some(true), &None)
        );
    }

    /// A metrics thread all_reduces on a side group (0x2) every 10 ms on both ranks
    /// while rank 1 is stuck outside NCCL and rank 0 waits in the gradients' group's
    /// operation 30. The side group's waits say as much (an operation open) and its
    /// hash is lower: judged alone it moved at every reading and the stuck group was
    /// never said. Each communicator keeps its own clock.
    #[test]
    fn a_side_group_that_keeps_posting_does_not_hide_the_stuck_one() {
        let rank = |r: u32, main: u64, side: u64| {
            let mut w = Words::default();
            w.comm(0, 0x5, r, 2)
                .ops(0, NcclFunc::AllReduce, 16 << 20, main, 30, 1000)
                .comm(1, 0x2, r, 2)
                .ops(1, NcclFunc::AllReduce, 4, side + 1, side, 1000);
            decode(&w.bytes()).unwrap()
        };
        let at = |side: u64| NodeReading {
            counters: [(0, rank(0, 31, side)), (1, rank(1, 30, side))].into(),
            cpu: [(0, Duration::ZERO), (1, Duration::ZERO)].into(),
            ..Default::default()
        };
        let (mut w, t0) = (NcclWatch::default(), Instant::now());
        assert_eq!(w.observe(&at(100), t0), NcclState::Moving);
        for (i, side) in (200..2000).step_by(100).enumerate() {
            let now = t0 + Duration::from_secs(i as u64 + 1);
            let NcclState::Stalled(s) = w.observe(&at(side), now) else {
                panic!("the side group's progress hid the stall at {i}s")
            };
            assert_eq!((s.comm, s.op.index, s.waiting.clone()), (0x5, 30, vec![0]));
            assert_eq!(s.behind[0].rank, 1);
            assert!(
                (s.stalled_secs - (i + 1) as f64).abs() < 1e-6,
                "{}",
                s.stalled_secs
            );
        }
    }

    /// A side group (0x2) whose last operations differ between the ranks (so its wait
    /// is "last posted" with a mismatch) stands for 100 s while the gradients' group
    /// (0x5) trains on; then both stand. Its clock must start when the other stopped,
    /// not 100 s earlier: else the hang is said a second after a pause begins. And a
    /// receive posted long before its send (point-to-point, a timed operation open)
    /// holds no one while the others move.
    #[test]
    fn a_stall_held_back_while_others_move_starts_its_clock_again() {
        let rank = |r: u32, main: u64, side_last: u64| {
            let mut w = Words::default();
            // Under sampling a training group always has operations past the last
            // timed one.
            w.comm(0, 0x5, r, 2)
                .ops(0, NcclFunc::AllReduce, 16 << 20, main, main, 1000)
                .untimed(0, NcclFunc::AllReduce, 16 << 20, 2)
                .comm(1, 0x2, r, 2)
                .untimed(1, NcclFunc::AllReduce, 4, 3)
                .untimed(1, NcclFunc::AllReduce, side_last, 1);
            decode(&w.bytes()).unwrap()
        };
        let at = |main: u64| NodeReading {
            counters: [(0, rank(0, main, 4)), (1, rank(1, main, 8))].into(),
            on_gpu: [0, 1].into(),
            ..Default::default()
        };
        let (mut w, t0) = (NcclWatch::default(), Instant::now());
        let secs = |s: u64| t0 + Duration::from_secs(s);
        for s in 0..100 {
            assert_eq!(
                w.observe(&at(10 + s), secs(s)),
                NcclState::Moving,
                "at {s}s"
            );
        }
        // Every communicator stands from 100 s on.
        w.observe(&at(200), secs(100));
        match w.observe(&at(200), secs(101)) {
            NcclState::Stalled(s) => assert!(s.stalled_secs <= 1.0, "{s:?}"),
            other => panic!("{other:?}"),
        }
        // A receive open on a point-to-point pair while the main group moves.
        let p2p = |r: u32, main: u64| {
            let mut w = Words::default();
            w.comm(0, 0x5, r, 2)
                .ops(0, NcclFunc::AllReduce, 16 << 20, main, main, 1000)
                .untimed(0, NcclFunc::AllReduce, 16 << 20, 2)
                .comm(1, 0x9, r, 2);
            match r {
                0 => w.ops(1, NcclFunc::Recv, 4, 1, 0, 1000),
                _ => w.ops(1, NcclFunc::Send, 4, 0, 0, 1000),
            };
            decode(&w.bytes()).unwrap()
        };
        let at = |main: u64| NodeReading {
            counters: [(0, p2p(0, main)), (1, p2p(1, main))].into(),
            ..Default::default()
        };
        let mut w = NcclWatch::default();
        for s in 0..100 {
            assert_eq!(
                w.observe(&at(10 + s), secs(s)),
                NcclState::Moving,
                "p2p at {s}s"
            );
        }
    }

    /// A rank behind whose other communicator differs in counts only by point-to-point
    /// traffic (a pipeline's stages, by design) waits in nothing elsewhere.
    #[test]
    fn point_to_point_counts_are_no_wait_elsewhere() {
        let rank = |r: u32, collectives: u64, p2p: u64| {
            let mut w = Words::default();
            w.comm(0, 0x5, r, 2)
                .ops(0, NcclFunc::AllReduce, 4, collectives, 10, 1000)
                .comm(1, 0xd, r, 2)
                .ops(1, NcclFunc::Send, 4 << 20, p2p, 1, 1000);
            decode(&w.bytes()).unwrap()
        };
        let node = NodeReading {
            counters: [(0, rank(0, 11, 2)), (1, rank(1, 10, 5))].into(),
            ..Default::default()
        };
        let s = still(&node, 30);
        assert_eq!((s.comm, s.behind.len()), (0x5, 1), "{s:?}");
        assert_eq!((s.behind[0].rank, &s.behind[0].waits_in), (1, &None));
    }

    /// A pipeline's communicator whose ring holds only collectives lately: its sends,
    /// completed earlier, still say it carries point-to-point traffic, where stages
    /// post different counts by design: nobody is taken for behind by counts alone.
    #[test]
    fn point_to_point_is_known_after_the_ring_forgot_it() {
        let rank = |r: u32, collectives: u64| {
            let mut w = Words::default();
            w.comm(0, 7, r, 2)
                .ops(0, NcclFunc::Send, 4 << 20, 5, 5, 1000)
                .untimed(0, NcclFunc::AllReduce, 4, collectives);
            decode(&w.bytes()).unwrap()
        };
        let node = NodeReading {
            counters: [(0, rank(0, 9)), (1, rank(1, 8))].into(),
            ..Default::default()
        };
        assert!(node.counters[&1].comms[0]
            .recent
            .iter()
            .all(|o| !o.func.is_p2p()));
        assert_eq!(still(&node, 30).which, WaitedOp::LastPosted);
    }

    /// A rank whose file does not read (a plugin of another layout) would read as
    /// missing, its peers waiting on it: the counters judge nothing then.
    #[test]
    fn an_unreadable_rank_makes_the_counters_stand_aside() {
        let mut node = reading(&[(0, 11, 10), (1, 11, 10)], &[]);
        still(&node, 30);
        node.unreadable.insert(2);
        let mut w = NcclWatch::default();
        assert_eq!(w.observe(&node, Instant::now()), NcclState::Unreadable);
        // A member whose file does not read is not a member that never posted: rank 1
        // of communicator 7 unreadable leaves rank 0 waiting alone, and no one is
        // named behind or missing, at any reading.
        let mut node = reading(&[(0, 11, 10)], &[]);
        node.unreadable.insert(1);
        let (mut w, t0) = (NcclWatch::default(), Instant::now());
        for s in [0, 30, 60] {
            let state = w.observe(&node, t0 + Duration::from_secs(s));
            assert_eq!(state, NcclState::Unreadable, "at {s}s");
        }
        node.unreadable.clear();
        w.observe(&node, t0 + Duration::from_secs(90));
        let NcclState::Stalled(s) = w.observe(&node, t0 + Duration::from_secs(120)) else {
            panic!("read again: judged again")
        };
        assert_eq!(
            (s.waiting, s.stalled_secs),
            (vec![0], 30.0),
            "its clock from the read"
        );
    }

    /// A communicator of 3 ranks over 2 nodes that rank 2 never created: one node's
    /// reading cannot tell it is missing (its other members may be elsewhere); every
    /// node's readings merged can.
    #[test]
    fn merged_nodes_count_the_members_that_never_created_a_communicator() {
        use crate::nccl_counters::layout::{slot_word, S_NNODES};
        let rank = |r: u32| {
            let mut w = Words::default();
            w.comm(0, 9, r, 3)
                .ops(0, NcclFunc::AllReduce, 64, 11, 10, 1000);
            w.0[slot_word(0, S_NNODES)] = 2;
            decode(&w.bytes()).unwrap()
        };
        let node0 = NodeReading {
            live: vec![0, 1],
            counters: [(0, rank(0)), (1, rank(1))].into(),
            ..Default::default()
        };
        assert_eq!(still(&node0, 5).missing, 0);
        let node1 = NodeReading {
            live: vec![2],
            ..Default::default()
        };
        let job = NodeReading::merge([&node0, &node1]);
        assert!(job.whole_job);
        let s = still(&job, 5);
        assert_eq!((s.missing, s.waiting.clone()), (1, vec![0, 1]));
    }

    fn node_of(ranks: impl IntoIterator<Item = (u32, RankCounters)>) -> NodeReading {
        NodeReading {
            counters: ranks.into_iter().collect(),
            ..Default::default()
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

    /// Sampled: ranks 0 and 1 posted 3 operations NCCL does not time after the last
    /// one seen completing; rank 1 then stops posting while rank 0 waits in the 4th.
    /// Posts are progress; the wait is the 4th from rank 0's ring, not the first open.
    #[test]
    fn with_sampling_posts_are_progress_and_the_wait_is_the_first_op_not_posted() {
        let t0 = Instant::now();
        let sampled = |r: u32, untimed: u64| {
            let mut w = Words::default();
            w.comm(0, 7, r, 2)
                .ops(0, NcclFunc::AllReduce, 4 << 20, 10, 10, 1000)
                .untimed(0, NcclFunc::Broadcast, 64, untimed);
            decode(&w.bytes()).unwrap()
        };
        let node = |a: u64, b: u64| NodeReading {
            counters: [(0, sampled(0, a)), (1, sampled(1, b))].into(),
            ..Default::default()
        };
        let on_gpu = |a: u64, b: u64| NodeReading {
            on_gpu: [1].into(),
            ..node(a, b)
        };
        let mut w = NcclWatch::default();
        assert_eq!(w.observe(&node(3, 3), t0), NcclState::Moving);
        let secs = |s| t0 + Duration::from_secs(s);
        assert_eq!(w.observe(&node(4, 3), secs(1)), NcclState::Moving, "posted");
        let NcclState::Stalled(s) = w.observe(&node(4, 3), secs(30)) else {
            panic!("stalled");
        };
        assert_eq!(
            (s.op.index, s.op.func, s.which),
            (13, NcclFunc::Broadcast, WaitedOp::FirstNotPosted)
        );
        assert_eq!((s.waiting.clone(), s.behind[0].rank), (vec![0], 1));
        // Rank 1 waits on its GPU: it posted all it will; both wait in the 13th or
        // before (a mismatch, a GPU hang): not pinned down, nobody behind.
        let mut w = NcclWatch::default();
        w.observe(&on_gpu(4, 3), t0);
        let NcclState::Stalled(s) = w.observe(&on_gpu(4, 3), secs(30)) else {
            panic!("stalled");
        };
        assert!(s.behind.is_empty(), "{s:?}");
        assert_eq!((s.which, s.op.index), (WaitedOp::LastPosted, 12));
        // All posted alike: the last posted, said not to be pinned down.
        let mut w = NcclWatch::default();
        w.observe(&node(4, 4), t0);
        let NcclState::Stalled(s) = w.observe(&node(4, 4), secs(30)) else {
            panic!("stalled");
        };
        assert_eq!(
            (s.op.index, s.which, s.behind.len()),
            (13, WaitedOp::LastPosted, 0)
        );
    }

    /// Sampled, each rank times its own bursts: operation 10 is timed on rank 0 only.
    /// Rank 2 completed no further than 10 and did not time it, so 10 is not known to
    /// be the one they wait in: the rank that never posted the 13th is named.
    #[test]
    fn the_oldest_open_counts_only_where_the_ranks_that_reached_it_timed_it() {
        let rank = |r: u32, posted: u64, timed_10: bool| {
            let mut w = Words::default();
            w.comm(0, 7, r, 3)
                .ops(0, NcclFunc::AllReduce, 64, 10, 10, 1000)
                .untimed(0, NcclFunc::AllReduce, 64, posted - 10);
            if timed_10 {
                w.started(0, 10, 5);
            }
            decode(&w.bytes()).unwrap()
        };
        let s = still(
            &node_of([
                (0, rank(0, 13, true)),
                (1, rank(1, 12, false)),
                (2, rank(2, 13, false)),
            ]),
            9,
        );
        assert_eq!((s.which, s.op.index), (WaitedOp::FirstNotPosted, 12));
        assert_eq!((s.waiting.clone(), s.behind[0].rank), (vec![0, 2], 1));
        // Timed on every rank that reached it: that one is the wait, exactly.
        let s = still(
            &node_of([
                (0, rank(0, 13, true)),
                (1, rank(1, 12, true)),
                (2, rank(2, 13, true)),
            ]),
            9,
        );
        assert_eq!(
            (s.which, s.op.index, s.behind.len()),
            (WaitedOp::Oldest, 10, 0)
        );
    }

    /// Sampled, a side communicator (a metrics group) always has untimed operations
    /// open: the one whose member never posted is the wait, whatever the hashes.
    #[test]
    fn the_communicator_a_member_never_posted_in_wins_over_one_merely_open() {
        let rank = |r: u32, posted: u64| {
            let mut w = Words::default();
            w.comm(0, 7, r, 2)
                .ops(0, NcclFunc::AllReduce, 64, 10, 10, 1000)
                .untimed(0, NcclFunc::AllReduce, 64, posted - 10);
            w.comm(1, 3, r, 2)
                .ops(1, NcclFunc::AllGather, 64, 5, 5, 1000)
                .untimed(1, NcclFunc::AllGather, 64, 2);
            decode(&w.bytes()).unwrap()
        };
        let s = still(&node_of([(0, rank(0, 13)), (1, rank(1, 12))]), 9);
        assert_eq!(
            (s.comm, s.which, s.behind[0].rank),
            (7, WaitedOp::FirstNotPosted, 1)
        );
    }

    /// A side group that keeps posting (metrics every step, a background thread)
    /// while the main group hangs: its posts are its own progress, not the stuck
    /// group's, whose rank behind is still named.
    #[test]
    fn a_busy_side_group_does_not_hide_a_stuck_one() {
        let rank = |r: u32, posted: u64, side: u64| {
            let mut w = Words::default();
            w.comm(0, 7, r, 2)
                .ops(0, NcclFunc::AllReduce, 64, 10, 10, 1000)
                .untimed(0, NcclFunc::AllReduce, 64, posted - 10);
            w.comm(1, 3, r, 2)
                .ops(1, NcclFunc::AllGather, 64, side, side, 1000);
            decode(&w.bytes()).unwrap()
        };
        let at = |side| node_of([(0, rank(0, 13, side)), (1, rank(1, 12, side))]);
        let (mut w, t0) = (NcclWatch::default(), Instant::now());
        assert_eq!(w.observe(&at(5), t0), NcclState::Moving);
        let later = w.observe(&at(50), t0 + Duration::from_secs(9));
        let NcclState::Stalled(s) = later else {
            panic!("the side group's 45 all_gathers hid the hang: {later:?}")
        };
        assert_eq!((s.comm, s.behind[0].rank, s.stalled_secs), (7, 1, 9.0));
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
        w.hold_off(7);
        assert_eq!(
            w.observe(&r, t0 + Duration::from_secs(10)),
            NcclState::Moving,
            "held off"
        );
    }
}
