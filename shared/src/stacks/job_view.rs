//! Hangs across nodes: each node publishes how long its ranks have made no progress
//! and where they stand ([`NodeStacks`], bounded in size), and the node hosting the
//! workers' store decides: the job hangs when every node has stood still for the
//! timeout ([`job_hung`]), or, with NCCL's counters (each node's [`NodeStacks::nccl`]),
//! when they stall; one view names each rank's node, host and local rank.

use super::hang_report::{Context, Gone};
use super::merge::{Place, Places};
use super::model::{RankStack, ThreadStack};
use super::teardown::LastSaid;
use crate::nccl_counters::NodeReading;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// At most this many bytes per node on the store.
pub const MAX_BYTES: usize = 64 * 1024;

/// Frames kept per rank, and fewer when a node's record would exceed [`MAX_BYTES`].
const FRAMES_KEPT: [usize; 3] = [24, 6, 1];

/// One node's ranks, as it publishes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStacks {
    pub node_rank: u32,
    pub host: String,
    /// How long every local rank has made no progress, in ms (0: one makes some).
    pub stalled_ms: u64,
    /// Each rank's main thread only (empty while the ranks make progress).
    pub ranks: Vec<RankStack>,
    /// Its ranks that left (exited 0 while others ran), and the text of each shown
    /// rank's innermost line: what the deciding node's report is made of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<Gone>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lines: BTreeMap<u32, String>,
    /// Its ranks whose process is stopped (state T).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped: Vec<u32>,
    /// Its ranks' NCCL counters, where they load toporun's profiler plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<NodeReading>,
    /// What its shown ranks last said on stderr (a teardown's cause, at the
    /// deciding node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub said: BTreeMap<u32, LastSaid>,
    /// None of its ranks' stacks can be read (a C, C++ or JAX program): its ranks
    /// are there only for their places, and the counters alone judge.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_stacks: bool,
}

impl NodeStacks {
    pub fn new(node_rank: u32, host: &str, stalled: Duration, stacks: &[RankStack]) -> Self {
        NodeStacks {
            node_rank,
            host: host.to_string(),
            stalled_ms: u64::try_from(stalled.as_millis()).unwrap_or(u64::MAX),
            ranks: stacks.iter().map(main_thread_only).collect(),
            left: Vec::new(),
            stopped: Vec::new(),
            lines: BTreeMap::new(),
            said: BTreeMap::new(),
            nccl: None,
            no_stacks: false,
        }
    }

    /// With what its shown ranks last said, each cut to 300 characters.
    pub fn with_said(mut self, said: &BTreeMap<u32, LastSaid>) -> Self {
        self.said = said
            .iter()
            .filter(|(r, _)| self.ranks.iter().any(|s| s.rank == **r))
            .map(|(r, l)| (*r, l.clone().cut(300)))
            .collect();
        self
    }

    /// With its ranks' NCCL counters.
    pub fn with_nccl(mut self, nccl: Option<NodeReading>) -> Self {
        self.nccl = nccl;
        self
    }

    /// With what the node knows besides its stacks (lines only for the ranks shown).
    pub fn with_context(mut self, ctx: &Context) -> Self {
        self.left = ctx.left.clone();
        self.stopped = ctx.stopped.clone();
        self.lines = ctx
            .lines
            .iter()
            .filter(|(r, _)| self.ranks.iter().any(|s| s.rank == **r))
            .map(|(r, l)| (*r, l.chars().take(200).collect()))
            .collect();
        self
    }

    pub fn stalled(&self) -> Duration {
        Duration::from_millis(self.stalled_ms)
    }

    /// JSON of at most [`MAX_BYTES`]: fewer frames, then only the counters' open
    /// operations, then no stacks, then no counters (the stack rule decides then),
    /// where needed.
    pub fn encode(&self) -> Vec<u8> {
        let fits = |n: &NodeStacks| {
            let bytes = serde_json::to_vec(n).unwrap_or_default();
            (bytes.len() <= MAX_BYTES).then_some(bytes)
        };
        let mut n = self.clone();
        for keep in FRAMES_KEPT {
            for r in &mut n.ranks {
                for t in &mut r.threads {
                    t.frames.truncate(keep);
                }
            }
            if let Some(bytes) = fits(&n) {
                return bytes;
            }
        }
        if let Some(reading) = &mut n.nccl {
            reading.only_open_ops();
            if let Some(bytes) = fits(&n) {
                return bytes;
            }
        }
        let ranks = std::mem::take(&mut n.ranks);
        if let Some(bytes) = fits(&n) {
            return bytes;
        }
        // Without counters the stack rule decides, which needs the stacks back.
        n.nccl = None;
        n.ranks = ranks;
        if let Some(bytes) = fits(&n) {
            return bytes;
        }
        n.ranks.clear();
        serde_json::to_vec(&n).unwrap_or_default()
    }
}

fn main_thread_only(s: &RankStack) -> RankStack {
    let threads: Vec<ThreadStack> = s.main_thread().cloned().into_iter().collect();
    RankStack {
        threads,
        ..s.clone()
    }
}

/// How long the job has hung when every one of `nnodes` nodes has published and
/// stood still for `timeout`: the least of their stalls.
pub fn job_hung(nodes: &[NodeStacks], nnodes: u32, timeout: Duration) -> Option<Duration> {
    let all = (0..nnodes).all(|n| nodes.iter().any(|s| s.node_rank == n));
    let least = nodes.iter().map(NodeStacks::stalled).min()?;
    (all && least >= timeout).then_some(least)
}

/// Every node's context as one: the ranks that left anywhere, every shown line.
pub fn context(nodes: &[NodeStacks]) -> Context {
    let mut ctx = Context::default();
    for n in nodes {
        ctx.left.extend(n.left.iter().cloned());
        ctx.stopped.extend(&n.stopped);
        ctx.lines
            .extend(n.lines.iter().map(|(r, l)| (*r, l.clone())));
    }
    ctx
}

/// Every node's ranks in one list, and where each global rank runs.
pub fn flatten(nodes: &[NodeStacks]) -> (Vec<RankStack>, Places) {
    let mut stacks = Vec::new();
    let mut places = Places::new();
    for n in nodes {
        for r in &n.ranks {
            let place = Place {
                node_rank: n.node_rank,
                host: n.host.clone(),
            };
            places.insert(r.rank, (place, r.local_rank));
            stacks.push(r.clone());
        }
    }
    stacks.sort_by_key(|s| s.rank);
    (stacks, places)
}

#[cfg(test)]
mod tests {
    use super::super::model::build::{main_thread, rank_with};
    use super::super::model::Frame;
    use super::*;

    fn at(rank: u32, function: &str, file: &str) -> RankStack {
        rank_with(rank, main_thread(false, &[(function, file, 7)]))
    }

    /// A node of 8 ranks, each in `comms` live communicators with 300 operations
    /// posted and `completed` completed, deep stacks, as it publishes its record.
    fn big_node(comms: usize, completed: u64) -> NodeStacks {
        use crate::nccl_counters::words::Words;
        use crate::nccl_counters::{decode, NcclFunc, NodeReading};
        let file = "/opt/venv/lib/python3.12/site-packages/pkg/module.py";
        let frames: Vec<(&str, &str, i32)> = (0..40).map(|_| ("a_function", file, 7)).collect();
        let stacks: Vec<RankStack> = (0..8)
            .map(|r| rank_with(r, main_thread(false, &frames)))
            .collect();
        let counters = (0..8u32)
            .map(|r| {
                let mut w = Words::default();
                for slot in 0..comms {
                    w.comm(slot, 0x1000 + slot as u64, r, 64).ops(
                        slot,
                        NcclFunc::AllReduce,
                        4 << 20,
                        300,
                        completed,
                        1000,
                    );
                }
                (r, decode(&w.bytes()).unwrap())
            })
            .collect();
        let reading = NodeReading {
            live: (0..8).collect(),
            counters,
            ..Default::default()
        };
        NodeStacks::new(0, "trainer-0", Duration::ZERO, &stacks)
            .with_nccl(Some(reading.for_exchange()))
    }

    fn decoded(n: &NodeStacks) -> NodeStacks {
        let bytes = n.encode();
        assert!(bytes.len() <= MAX_BYTES, "{} bytes", bytes.len());
        serde_json::from_slice(&bytes).unwrap()
    }

    /// A record stays within the store's bound: 8 ranks in 4 communicators keep their
    /// counters whole and their stacks; in 16, the counters keep their open operations
    /// only; in all 32 a rank may hold, the counters stay home (the stack rule
    /// decides) and the stacks travel.
    #[test]
    fn a_record_with_counters_stays_within_the_bound() {
        let four = big_node(4, 292);
        let d = decoded(&four);
        assert_eq!(d.nccl, four.nccl, "4 communicators travel whole");
        assert_eq!(d.ranks[0].threads[0].frames.len(), 24);
        let d = decoded(&big_node(16, 299));
        let open = |c: &crate::nccl_counters::CommCounters| c.recent.len();
        let comms = &d
            .nccl
            .as_ref()
            .expect("16 communicators' counters")
            .counters[&0]
            .comms;
        assert_eq!(comms.len(), 16);
        assert!(
            comms.iter().all(|c| open(c) == 1),
            "only the open operation"
        );
        assert_eq!(d.ranks.len(), 8);
        let d = decoded(&big_node(32, 299));
        assert_eq!(d.nccl, None);
        assert_eq!(d.ranks.len(), 8, "the stacks travel for the stack rule");
    }

    /// Node 1's rank left; node 0's rank waits on its GPU: the view built from both
    /// records names the leaver with its node, as every node prints it.
    #[test]
    fn a_rank_that_left_on_another_node_leads_the_job_wide_view() {
        let waiting = [at(0, "main", "/app/train.py")];
        let ctx0 = Context {
            left: Vec::new(),
            lines: [(0, "    loss.item()".to_string())].into(),
            stopped: Vec::new(),
            ..Context::default()
        };
        let n0 =
            NodeStacks::new(0, "trainer-0", Duration::from_secs(6), &waiting).with_context(&ctx0);
        let ctx1 = Context {
            left: vec![Gone {
                rank: 1,
                into_attempt: 12.3,
            }],
            lines: BTreeMap::new(),
            stopped: Vec::new(),
            ..Context::default()
        };
        let n1 = NodeStacks::new(1, "trainer-1", Duration::from_secs(6), &[]).with_context(&ctx1);
        let decoded: Vec<NodeStacks> = [n0, n1]
            .iter()
            .map(|n| serde_json::from_slice(&n.encode()).unwrap())
            .collect();
        let (stacks, places) = flatten(&decoded);
        let ctx = context(&decoded);
        assert!(ctx.left_while_others_wait(&stacks));
        let secs = Duration::from_secs(6);
        let h = super::super::hang_report::Hang::with(&stacks, &places, secs, secs, &ctx);
        assert_eq!(h.odd, vec![1]);
        assert!(
            h.headline.starts_with("rank 1 left the job (exit 0 at 12.3s into the attempt) while rank 0 still needed it: rank 0 (node 0 on trainer-0, local rank 0) waits on its GPU at .item()"),
            "{}",
            h.headline
        );
    }

    fn rank(rank: u32, frames: usize) -> RankStack {
        let frame = |i| Frame {
            function: format!("f{i}"),
            file: "x".repeat(200),
            line: 1,
        };
        let thread = |name: &str| ThreadStack {
            thread: Some(name.into()),
            frames: (0..frames).map(frame).collect(),
            idle: false,
        };
        RankStack {
            rank,
            local_rank: rank % 2,
            pid: 1,
            threads: vec![thread("loader"), thread("MainThread")],
            error: None,
        }
    }

    fn node(n: u32, stalled_s: u64) -> NodeStacks {
        let ranks = [rank(2 * n, 3), rank(2 * n + 1, 3)];
        NodeStacks::new(n, &format!("h{n}"), Duration::from_secs(stalled_s), &ranks)
    }

    #[test]
    fn the_job_hangs_only_when_every_node_stood_still() {
        let t = Duration::from_secs(10);
        assert_eq!(
            job_hung(&[node(0, 12), node(1, 11)], 2, t),
            Some(Duration::from_secs(11))
        );
        assert_eq!(job_hung(&[node(0, 12), node(1, 3)], 2, t), None);
        // A node that has not published makes progress as far as anyone knows.
        assert_eq!(job_hung(&[node(0, 12)], 2, t), None);
    }

    #[test]
    fn a_record_keeps_the_main_thread_and_stays_bounded() {
        let ranks: Vec<RankStack> = (0..64).map(|r| rank(r, 100)).collect();
        let big = NodeStacks::new(0, "h", Duration::ZERO, &ranks);
        assert!(big.ranks.iter().all(|r| r.threads.len() == 1));
        let bytes = big.encode();
        assert!(bytes.len() <= MAX_BYTES, "{}", bytes.len());
        let back: NodeStacks = serde_json::from_slice(&bytes).expect("decodes");
        assert_eq!(back.ranks.len(), 64);
        assert!(back.ranks[0].threads[0].frames.len() < 100);
    }

    #[test]
    fn flattening_places_every_rank_on_its_node() {
        let (stacks, places) = flatten(&[node(1, 0), node(0, 0)]);
        assert_eq!(
            stacks.iter().map(|s| s.rank).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        let (place, local) = &places[&3];
        assert_eq!((place.node_rank, place.host.as_str(), *local), (1, "h1", 1));
    }
}
