//! What the status endpoint reports, kept by the job's lifecycle as it goes: plain
//! data behind one lock, no environment values or secrets in it.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toporun_shared::root_cause::{Cause, CauseKind};
use toporun_shared::stacks::straggler::Straggler;
use toporun_shared::stacks::top_table::TopTable;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RankState {
    Running,
    Exited,
}

#[derive(Debug, Clone, Serialize)]
pub struct RankStatus {
    pub local_rank: u32,
    pub rank: u32,
    pub pid: i32,
    pub state: RankState,
    pub exit_code: Option<i32>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub run_id: String,
    pub node_rank: Option<u32>,
    pub round: Option<u32>,
    pub restarts: u32,
    pub nodes_joined: u32,
    pub nodes_expected: u32,
    /// The round closed and this node knows its place.
    pub rendezvous_complete: bool,
    pub nproc: u32,
    pub ranks: Vec<RankStatus>,
    /// Exits by code over the whole job (restarts included).
    pub exits_by_code: BTreeMap<i32, u64>,
    pub last_failure: Option<String>,
    /// Hangs reported (`--hang-timeout`), and the last report.
    pub hangs: u64,
    pub last_hang: Option<String>,
    /// The flight recorder's finding after the last failure or hang.
    pub last_collective: Option<String>,
    /// The leading cause of the last failure, and every cause known for it.
    pub root_cause: Option<CauseKind>,
    pub causes: Vec<Cause>,
    pub findings_by_severity: BTreeMap<String, u64>,
    /// The ranks the others wait for now (`--straggler-window`), job-wide where
    /// the store's host decides.
    pub stragglers: Vec<Straggler>,
    /// This node's collectives far below what its links should carry, where they are
    /// (`--gpu-timing on`, one node).
    pub slow_links: Option<String>,
    /// The network check of the current round, where it ran (`--network-check`).
    pub network: Option<toporun_shared::network_check::report::NetworkReport>,
    /// `toporun top`'s table (this node's ranks, or the job's).
    #[serde(skip)]
    pub top: TopTable,
    pub store_connections: u64,
    pub store_operations: u64,
    #[serde(skip)]
    pub started: Option<Instant>,
    #[serde(skip)]
    pub last_restart: Option<Instant>,
    #[serde(skip)]
    pub heartbeat: Option<Instant>,
}

impl Snapshot {
    /// Every local rank of the current attempt started and none has exited yet.
    pub fn ready(&self) -> bool {
        self.rendezvous_complete
            && self.nproc > 0
            && self.ranks.len() == self.nproc as usize
            && self.ranks.iter().all(|r| r.state == RankState::Running)
    }

    /// The supervisor turned within `limit`.
    pub fn alive(&self, limit: Duration) -> bool {
        self.heartbeat.is_some_and(|t| t.elapsed() <= limit)
    }
}

/// Renders every local rank's stack now (JSON when asked), for `/stacks`.
pub type StacksFn = Arc<dyn Fn(bool) -> String + Send + Sync>;

/// The lifecycle's handle on the status; cheap to clone.
#[derive(Clone, Default)]
pub struct JobStatus {
    inner: Arc<Mutex<Snapshot>>,
    stacks: Arc<Mutex<Option<StacksFn>>>,
}

impl JobStatus {
    /// Where `/stacks` reads the ranks' stacks from.
    pub fn set_stacks(&self, f: StacksFn) {
        if let Ok(mut s) = self.stacks.lock() {
            *s = Some(f);
        }
    }

    pub fn stacks(&self) -> Option<StacksFn> {
        self.stacks.lock().ok()?.clone()
    }

    pub fn new(run_id: &str, nproc: u32) -> JobStatus {
        let s = JobStatus::default();
        s.update(|x| {
            x.run_id = run_id.to_string();
            x.nproc = nproc;
            x.started = Some(Instant::now());
            x.heartbeat = Some(Instant::now());
        });
        s
    }

    pub fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        if let Ok(mut g) = self.inner.lock() {
            f(&mut g);
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        self.inner.lock().map(|g| g.clone()).unwrap_or_default()
    }

    pub fn beat(&self) {
        self.update(|x| x.heartbeat = Some(Instant::now()));
    }

    /// A new round is being formed: the ranks of the last one are gone. `restarts`
    /// counts rank-failure restarts only (a membership change forms a round without
    /// one), as TORCHELASTIC_RESTART_COUNT does.
    pub fn round(&self, round: u32, restarts: u32) {
        self.update(|x| {
            if restarts > x.restarts {
                x.restarts = restarts;
                x.last_restart = Some(Instant::now());
            }
            x.round = Some(round);
            x.rendezvous_complete = false;
            x.ranks.clear();
        });
    }

    pub fn placed(&self, node_rank: u32, nnodes: u32) {
        self.update(|x| {
            x.node_rank = Some(node_rank);
            x.nodes_joined = nnodes;
            x.rendezvous_complete = true;
        });
    }

    pub fn rank_started(&self, local_rank: u32, rank: u32, pid: i32) {
        self.update(|x| {
            x.ranks.push(RankStatus {
                local_rank,
                rank,
                pid,
                state: RankState::Running,
                exit_code: None,
            })
        });
    }

    pub fn rank_exited(&self, pid: i32, code: i32) {
        self.update(|x| {
            if let Some(r) = x.ranks.iter_mut().find(|r| r.pid == pid) {
                r.state = RankState::Exited;
                r.exit_code = Some(code);
                *x.exits_by_code.entry(code).or_default() += 1;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_with_every_rank_running_after_rendezvous() {
        let s = JobStatus::new("job", 2);
        s.round(0, 0);
        assert!(!s.snapshot().ready());
        s.placed(0, 1);
        s.rank_started(0, 0, 10);
        assert!(!s.snapshot().ready(), "one of two ranks");
        s.rank_started(1, 1, 11);
        assert!(s.snapshot().ready());
        s.rank_exited(11, 1);
        assert!(!s.snapshot().ready());
        assert_eq!(s.snapshot().exits_by_code.get(&1), Some(&1));
        s.round(1, 1);
        let x = s.snapshot();
        assert_eq!((x.restarts, x.ranks.len(), x.ready()), (1, 0, false));
        // A membership change: a new round, no restart.
        s.round(2, 1);
        let x = s.snapshot();
        assert_eq!((x.round, x.restarts), (Some(2), 1));
    }
}
