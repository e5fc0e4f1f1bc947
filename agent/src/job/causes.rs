//! The causes of a failed attempt on this node, from what toporun saw: each failed
//! rank's end and output, the memory cgroup's OOM kills since the attempt began,
//! /dev/shm now.

use crate::paths::Root;
use crate::probe::container::shm;
use crate::probe::memory_cgroup::MemoryCgroup;
use crate::supervise::{self, Failure};
use toporun_shared::root_cause::judge::{judge, Memory, RankEnd, ShmUse};
use toporun_shared::root_cause::oom::MemoryReading;
use toporun_shared::root_cause::Cause;

/// The memory cgroup and its reading when the attempt began.
pub type MemoryAtStart = Option<(MemoryCgroup, MemoryReading)>;

/// Reads the memory cgroup as an attempt begins.
pub fn memory_at_start(cgroup: Option<&MemoryCgroup>) -> MemoryAtStart {
    cgroup.map(|c| (c.clone(), c.read(&Root::live())))
}

/// Every cause known for `failures`, the leading one first.
pub fn of(failures: &[Failure], memory: &MemoryAtStart) -> Vec<Cause> {
    let root = Root::live();
    let first = supervise::root_cause(failures).map(|f| f.pid);
    let ends: Vec<RankEnd> = failures
        .iter()
        .map(|f| RankEnd {
            rank: f.rank,
            exitcode: f.exitcode,
            signal: f.signal.as_deref(),
            exception: f.exception.as_ref(),
            shm_line: f.shm.as_deref(),
            first: Some(f.pid) == first,
        })
        .collect();
    let memory = memory.as_ref().map(|(cg, before)| Memory {
        before: *before,
        now: cg.read(&root),
    });
    let shm = shm(&root).map(|s| ShmUse {
        total: s.total_bytes,
        free: s.free_bytes,
    });
    judge(&ends, memory, shm)
}
