//! The causes of a failed attempt on this node, from what toporun saw: each failed
//! rank's end and output, the memory cgroup's OOM kills since the attempt began,
//! /dev/shm now, the GPUs' Xid events; and where those events come from.

use crate::clock::epoch_secs;
use crate::job::error::JobError;
use crate::job::spec::Job;
use crate::paths::Root;
use crate::probe::container::shm;
use crate::probe::gpu_events::{NvmlXids, ReplayXids, XidLog};
use crate::probe::memory_cgroup::MemoryCgroup;
use crate::probe::GpuProbe;
use crate::stacks::RankPid;
use crate::supervise::{self, Failure};
use std::collections::HashMap;
use std::path::Path;
use std::sync::PoisonError;
use std::time::SystemTime;
use toporun_shared::root_cause::disk::Volume;
use toporun_shared::root_cause::gpu_health::degraded;
use toporun_shared::root_cause::judge::{judge, Left, Memory, RankEnd, ShmUse};
use toporun_shared::root_cause::oom::MemoryReading;
use toporun_shared::root_cause::signal::RankSignal;
use toporun_shared::root_cause::xid::XidEvent;
use toporun_shared::root_cause::{by_precedence, Cause};
use toporun_shared::toporun_vars::ToporunVar;

/// The ranks that exited 0 while others of the attempt still ran: the cause when a
/// rank still running then fails for a lost peer.
pub struct Leavers {
    started: std::time::SystemTime,
    left: LeftRanks,
}

/// The ranks that left, shared with the hang watch (a leaver leads its report).
pub type LeftRanks = std::sync::Arc<std::sync::Mutex<Vec<Left>>>;

impl Default for Leavers {
    fn default() -> Leavers {
        Leavers::new()
    }
}

impl Leavers {
    /// As the attempt's ranks start.
    pub fn new() -> Leavers {
        Leavers {
            started: std::time::SystemTime::now(),
            left: Default::default(),
        }
    }

    /// `gone` exited with `code`; `running`: the ranks still running.
    pub fn exited(&self, gone: &RankPid, code: i32, running: &[RankPid]) {
        if code != 0 || running.is_empty() {
            return;
        }
        let now = std::time::SystemTime::now();
        let mut left = self.left.lock().unwrap_or_else(PoisonError::into_inner);
        left.push(Left {
            rank: gone.rank,
            at: epoch_secs(now),
            into_attempt: now
                .duration_since(self.started)
                .unwrap_or_default()
                .as_secs_f64(),
            running: running.iter().map(|r| r.rank).collect(),
        });
    }

    /// The list, as the hang watch reads it while the attempt runs.
    pub fn shared(&self) -> LeftRanks {
        self.left.clone()
    }

    pub fn list(&self) -> Vec<Left> {
        self.left
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The memory cgroup and its reading when the attempt began.
pub type MemoryAtStart = Option<(MemoryCgroup, MemoryReading)>;

/// Reads the memory cgroup as an attempt begins.
pub fn memory_at_start(root: &Root, cgroup: Option<&MemoryCgroup>) -> MemoryAtStart {
    cgroup.map(|c| (c.clone(), c.read(root)))
}

/// Every cause known for `failures`, the leading one first; `xids`: the node's GPU
/// faults so far; `gpus`: NVML, to read the GPUs' health again (not their topology).
/// What toporun saw of the ranks besides the failures: those that left, and where
/// each was last sampled.
pub struct Evidence<'a> {
    pub left: &'a [Left],
    pub last_seen: &'a HashMap<i32, (String, SystemTime)>,
    /// The files each rank (by pid) was last seen writing.
    pub writing: &'a HashMap<i32, Vec<String>>,
    /// The TCP ports each rank (by rank) held.
    pub ports: &'a HashMap<u32, Vec<u16>>,
    /// The headline of this attempt's hang report, where one was made.
    pub hang: Option<&'a str>,
}

/// The rank of this node that held the loopback address a lost-peer line names.
fn peer_rank(f: &Failure, ports: &HashMap<u32, Vec<u16>>) -> Option<u32> {
    let addr = f.peer_lost.as_ref()?.1.as_deref()?;
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    if !toporun_shared::root_cause::peer::is_loopback(host) {
        return None;
    }
    // gloo (torch 2.11) prints the port in network byte order: `[127.0.0.1]:45292`
    // for the socket /proc shows on port 60592. Either order names the holder.
    let swapped = port.swap_bytes();
    ports
        .iter()
        .find(|(rank, held)| **rank != f.rank && (held.contains(&port) || held.contains(&swapped)))
        .map(|(rank, _)| *rank)
}

pub fn of(
    p: &Job,
    failures: &[Failure],
    seen: Evidence<'_>,
    memory: &MemoryAtStart,
    xids: &[XidEvent],
    gpus: Option<&dyn GpuProbe>,
) -> Vec<Cause> {
    let root = &p.root;
    let first = supervise::first_failure(failures).map(|f| f.pid);
    let volumes: Vec<Option<Volume>> = failures
        .iter()
        .map(|f| {
            let open = seen.writing.get(&f.pid).into_iter().flatten();
            let paths: Vec<String> = f.paths.iter().chain(open).cloned().collect();
            f.write_failed.as_ref().and_then(|_| volume_of(&paths))
        })
        .collect();
    let ends: Vec<RankEnd> = failures
        .iter()
        .zip(&volumes)
        .map(|(f, volume)| RankEnd {
            rank: f.rank,
            exitcode: f.exitcode,
            signal: f
                .signal
                .is_some()
                .then(|| RankSignal::from_number(-f.exitcode)),
            exception: f.exception.as_ref(),
            stderr_read: f.stderr_read,
            shm_line: f.shm.as_deref(),
            lost_peer: f.peer_lost.as_ref().map(|(line, _)| line.as_str()),
            peer_rank: peer_rank(f, seen.ports),
            native: f.native.as_ref(),
            write_failed: f.write_failed.as_deref(),
            volume: volume.as_ref(),
            cuda_oom: f.cuda_oom.as_ref(),
            last_words: f.last_words.as_deref(),
            watchdog: f.watchdog.as_ref(),
            watchdog_error: f.watchdog_error.as_ref(),
            hang: seen.hang,
            last_seen: seen.last_seen.get(&f.pid).map(|(line, at)| {
                let age = f.at.duration_since(*at).unwrap_or_default();
                (line.as_str(), age.as_secs_f64())
            }),
            first: Some(f.pid) == first,
            gpu: p.gpu_of(f.local_rank).map(|g| g.index),
            at: epoch_secs(f.at),
        })
        .collect();
    let memory = memory.as_ref().map(|(cg, before)| Memory {
        before: *before,
        now: cg.read(root),
    });
    let shm = shm(root).map(|s| ShmUse {
        total: s.total_bytes,
        free: s.free_bytes,
    });
    let mut causes = judge(&ends, seen.left, memory, shm, xids);
    if let Some(g) = gpus {
        causes.extend(degraded(&p.facts.gpus, &g.health_now()));
    }
    by_precedence(causes)
}

/// The volume of the first path a failed write names (its nearest existing parent:
/// the file itself may not have been created), as statvfs reads it now.
fn volume_of(paths: &[String]) -> Option<Volume> {
    paths.iter().find_map(|p| {
        let at = std::path::Path::new(p)
            .ancestors()
            .find(|a| a.exists() && *a != std::path::Path::new("/"))?;
        let st = nix::sys::statvfs::statvfs(at).ok()?;
        let block = st.fragment_size() as u64;
        Some(Volume {
            path: p.clone(),
            total: st.blocks() as u64 * block,
            free: st.blocks_available() as u64 * block,
            read_only: st.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY),
        })
    })
}

/// The node's GPU faults for the whole job: a replay file where
/// `TOPORUN_XID_REPLAY` names one, else NVML's events where there are GPUs.
/// `replay`: the replay file; `gpus`: the node has GPUs.
pub fn watch_xids(replay: Option<&Path>, gpus: bool) -> Result<Option<XidLog>, JobError> {
    if let Some(path) = replay {
        let source = ReplayXids::open(path)
            .map_err(|e| JobError::bad_input(format!("{XID_REPLAY_VAR}={}", path.display()), e))?;
        return Ok(Some(XidLog::watch(Box::new(source))));
    }
    if !gpus {
        return Ok(None);
    }
    Ok(Some(XidLog::watch(Box::new(NvmlXids::start()))))
}

/// A file of Xid events (JSON lines) toporun follows instead of NVML's.
pub const XID_REPLAY_VAR: &str = ToporunVar::XidReplay.name();
