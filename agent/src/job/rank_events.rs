//! What an attempt's rank events feed, as they come from the supervisor: the status,
//! the live ranks (for the stack readers), the ranks that left while others ran,
//! the preemption announced at the signal, and where the other ranks stood when one
//! failed.

use crate::job::failure::causes;
use crate::job::hang::watch::{self, LiveRanks};
use crate::job::preemption;
use crate::job::spec::{Job, NodePlace};
use crate::rendezvous::StopReason;
use crate::stacks::RankPid;
use crate::status::JobStatus;
use crate::supervise::RankEvent;
use nix::sys::signal::Signal;
use std::sync::{Mutex, PoisonError};
use toporun_shared::stacks::activity::Backward;
use toporun_shared::stacks::standing::standing_with;
use toporun_shared::stacks::RankStack;

/// What an attempt's rank events feed: the status, the live ranks, the ranks that
/// left, the preemption's evidence, and the others' stacks at a failure.
pub(super) struct Seen<'a> {
    pub(super) p: &'a Job,
    pub(super) node: &'a NodePlace,
    pub(super) status: &'a JobStatus,
    pub(super) live: &'a LiveRanks,
    pub(super) watcher: &'a watch::Watcher,
    pub(super) stop_file: &'a preemption::StopFile,
    pub(super) announce: Option<tokio::sync::mpsc::UnboundedSender<StopReason>>,
    pub(super) heard: Heard,
}

/// What the rank events of an attempt told, nothing at first.
#[derive(Default)]
pub(super) struct Heard {
    pub(super) leavers: causes::Leavers,
    pub(super) ending: preemption::Ending,
    /// This node's preemption, made when the signal came.
    pub(super) ours: Mutex<Option<StopReason>>,
    /// Where the other ranks stood when one failed: their samples from before it,
    /// and the oldest one's age.
    pub(super) snapshot: Mutex<Option<(Vec<RankStack>, Option<f64>)>>,
}

impl Seen<'_> {
    pub(super) fn on(&self, e: RankEvent) {
        match e {
            RankEvent::Started {
                local_rank,
                rank,
                pid,
            } => {
                self.status.rank_started(local_rank, rank, pid);
                let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
                live.push(RankPid {
                    rank,
                    local_rank,
                    pid,
                });
            }
            RankEvent::Exited { pid, code } => {
                self.status.rank_exited(pid, code);
                self.heard.ending.exited(code);
                let mut running = self.live.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(gone) = running.iter().find(|r| r.pid == pid).copied() {
                    running.retain(|r| r.pid != pid);
                    self.heard.leavers.exited(&gone, code, &running);
                }
            }
            RankEvent::Stopping { signal } => self.stopping(signal),
            RankEvent::StoppingOthers => {
                self.watcher.stop_judging();
                let others = self
                    .live
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                *self
                    .heard
                    .snapshot
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = others_stacks(self.watcher, &others);
            }
        }
    }

    /// Where the other ranks stood when one failed, as read at the failure.
    /// Where the ranks still running when one failed stood; not those that failed on
    /// their own meanwhile (`failed`, their pids) outside any collective: their
    /// sample was their own way out (the same error raised on two ranks), not a wait.
    pub(super) fn say_where_the_others_stood(&self, failed: &[i32]) {
        let snapshot = self
            .heard
            .snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let backward = self.p.backward();
        let text = snapshot.and_then(|(stacks, age)| others_text(stacks, age, failed, backward));
        if let Some(text) = text {
            crate::console::say_raw!("{text}");
        }
    }

    /// A stop from outside: the stop file first; a signal here is a preemption every
    /// node hears now, before this node's ranks are stopped.
    fn stopping(&self, signal: Option<Signal>) {
        self.stop_file.make();
        if let Some(sig) = signal {
            let r = self.preemption(sig);
            if let Some(tx) = &self.announce {
                let _ = tx.send(r.clone());
            }
            *self
                .heard
                .ours
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(r);
        }
    }

    fn preemption(&self, sig: Signal) -> StopReason {
        let host = &self.p.facts.container.hostname;
        preemption::reason(sig, self.node.node_rank, host, preemption::now_ms())
    }

    /// This node's preemption as announced (made now if the signal's event was missed).
    pub(super) fn our_preemption(&self, sig: Signal) -> StopReason {
        let mine = self
            .heard
            .ours
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        mine.unwrap_or_else(|| self.preemption(sig))
    }
}

/// Where the ranks still running stood when one failed: their last samples from
/// before the failure, with the oldest one's age.
fn others_stacks(
    watcher: &watch::Watcher,
    others: &[RankPid],
) -> Option<(Vec<RankStack>, Option<f64>)> {
    (!others.is_empty()).then(|| watcher.stacks_before_failure(others))
}

/// The text of `others_stacks`, without the ranks in `failed` (pids) sampled where
/// they did not wait (a rank in a collective failed because the first one did).
fn others_text(
    mut stacks: Vec<RankStack>,
    age: Option<f64>,
    failed: &[i32],
    backward: Backward,
) -> Option<String> {
    let waited = |s: &RankStack| {
        s.main_thread()
            .is_some_and(|t| standing_with(t, None, backward).waits())
    };
    stacks.retain(|s| !failed.contains(&s.pid) || waited(s));
    if stacks.is_empty() {
        return None;
    }
    let groups = toporun_shared::stacks::merge(&stacks);
    let when = age.map_or(" (read as it failed)".to_string(), |a| {
        format!(" (last sampled at most {a:.1}s before it failed)")
    });
    Some(format!(
        "toporun: where the other ranks stood when it failed{when}:\n{}",
        toporun_shared::stacks::render_text(&groups, 6)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use toporun_shared::stacks::{Frame, ThreadStack};

    fn at(rank: u32, (function, file): (&str, &str)) -> RankStack {
        RankStack {
            rank,
            local_rank: rank,
            pid: 100 + rank as i32,
            threads: vec![ThreadStack {
                thread: Some("MainThread".into()),
                frames: vec![Frame {
                    function: function.into(),
                    file: file.into(),
                    line: 12,
                }],
                idle: false,
            }],
            error: None,
        }
    }

    /// Both ranks raised the same FileNotFoundError; rank 0 was sampled mid-raise, in
    /// dataclasses.py: it failed on its own, so it is no "other" that stood anywhere.
    #[test]
    fn ranks_that_failed_on_their_own_are_not_where_the_others_stood() {
        let c10d = ("all_reduce", "torch/distributed/distributed_c10d.py");
        let own = ("__init__", "/usr/lib/python3.12/dataclasses.py");
        let stacks = vec![at(0, own), at(1, c10d), at(2, c10d)];
        let on = Backward::OnDevice;
        let text = others_text(stacks.clone(), Some(0.4), &[100], on).unwrap();
        assert!(text.contains("ranks 1-2: all_reduce"), "{text}");
        assert!(!text.contains("__init__"), "{text}");
        assert_eq!(others_text(stacks[..1].to_vec(), None, &[100], on), None);
        // Gloo peers that died of rank 3's failure within milliseconds still stood in
        // their all_reduce: shown.
        let text = others_text(stacks, None, &[101, 102], on).unwrap();
        assert!(text.contains("ranks 1-2: all_reduce"), "{text}");
        // On the CPU a rank idle in its backward waited there for its peers (gloo).
        let graph = ("_engine_run_backward", "torch/autograd/graph.py");
        let mut idle = at(1, graph);
        idle.threads[0].idle = true;
        let cpu = Backward::OnCaller;
        assert!(others_text(vec![idle.clone()], None, &[101], cpu).is_some());
        assert!(others_text(vec![idle], None, &[101], on).is_none());
    }
}
