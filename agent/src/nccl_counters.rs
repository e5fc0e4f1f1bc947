//! This node's ranks' NCCL counters, as toporun's profiler plugin writes them (one
//! file per rank in the attempt's directory), read whole at each look: 33 KB a rank,
//! no mapping to outlive the rank.

use crate::paths::Root;
use crate::probe::rank_usage;
use crate::stacks::RankPid;
use std::collections::BTreeMap;
use std::path::PathBuf;
use toporun_shared::nccl_counters::{counters_file, decode, NodeReading, RankCounters};

#[derive(Debug, Clone)]
pub struct CountersFiles {
    attempt_dir: PathBuf,
}

impl CountersFiles {
    pub fn new(attempt_dir: PathBuf) -> CountersFiles {
        CountersFiles { attempt_dir }
    }

    /// Rank `rank`'s counters; None before its NCCL made the file, or where it does
    /// not read as one.
    pub fn rank(&self, rank: u32) -> Option<RankCounters> {
        let bytes = std::fs::read(counters_file(&self.attempt_dir, rank)).ok()?;
        decode(&bytes).ok()
    }

    /// Every live rank's counters (those with a file).
    pub fn read(&self, live: &[RankPid]) -> BTreeMap<u32, RankCounters> {
        live.iter()
            .filter_map(|r| Some((r.rank, self.rank(r.rank)?)))
            .collect()
    }

    /// The node's ranks now: their counters, their main threads' CPU time and the
    /// bytes they wrote.
    pub fn node(&self, root: &Root, live: &[RankPid]) -> NodeReading {
        NodeReading {
            live: live.iter().map(|r| r.rank).collect(),
            counters: self.read(live),
            cpu: live
                .iter()
                .filter_map(|r| Some((r.rank, rank_usage::main_thread_cpu(root, r.pid)?)))
                .collect(),
            written: live
                .iter()
                .filter_map(|r| Some((r.rank, crate::stacks::written(root, r.pid)?)))
                .collect(),
            on_gpu: Default::default(),
            whole_job: false,
        }
    }
}
