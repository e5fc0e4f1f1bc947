//! The job's rounds on this node, over any [`Host`]: join a round, run an attempt,
//! tell the state machine how it ended, and carry out its step. The live host
//! (rendezvous, ranks, GPUs) is `lifecycle`'s; the unit tests drive this loop with a
//! scripted one.

use crate::job::entry::Entered;
use crate::job::error::JobError;
use crate::job::failure::FailureReport;
use crate::job::spec::NodePlace;
use crate::job::transitions::{AttemptEnd, Exit, Machine, Restarts, Step};
use nix::sys::signal::Signal;
use toporun_shared::root_cause::Cause;

/// An attempt's end, and the failure report to write if the job ends with it.
#[derive(Debug)]
pub struct Attempted {
    pub end: AttemptEnd,
    pub report: Option<FailureReport>,
}

/// What the round loop needs from the node it runs on.
pub(crate) trait Host {
    /// A round is about to be joined (the status says so).
    fn round_begins(&mut self, min_round: u32, restarts: Restarts);
    /// Joins the next round, at `min_round` or later.
    async fn join(&mut self, min_round: u32) -> Result<Entered, JobError>;
    /// A handled signal that arrived since the last look.
    fn pending_signal(&mut self) -> Option<Signal>;
    /// Runs this node's ranks in the round `node` placed it in.
    async fn attempt(
        &mut self,
        node: &NodePlace,
        restarts: Restarts,
    ) -> Result<Attempted, JobError>;
    /// A signal came after the round placed this node, before its ranks started:
    /// every node is told, as a preemption (the end of an attempt that never ran).
    async fn stopped_before_start(&mut self, node: &NodePlace, signal: Signal) -> Attempted;
    /// Waits until the last attempt's GPU memory is released: the cause, if not.
    async fn gpus_released(&mut self) -> Option<Cause>;
    /// Says a line on the console (the `toporun: ` prefix added).
    fn say(&mut self, line: &str);
    /// Carries out the job's end on this node: messages, summary, lingering.
    async fn exit(&mut self, node: &NodePlace, exit: &Exit, attempted: &Attempted);
}

/// Runs rounds until the job ends on this node; its exit code.
pub(crate) async fn drive(host: &mut impl Host, mut machine: Machine) -> Result<u8, JobError> {
    let mut min_round: u32 = 0;
    loop {
        host.round_begins(min_round, machine.restarts());
        let node = match host.join(min_round).await? {
            Entered::Placed(node) => node,
            Entered::Signal => {
                host.say("received a signal during the rendezvous; exiting");
                return Ok(machine.signal_in_rendezvous());
            }
            Entered::JobFinished => {
                host.say("the job finished while this node waited as a spare; nothing to do");
                return Ok(0);
            }
        };
        min_round = node.round + 1;
        let attempted = match host.pending_signal() {
            Some(sig) => {
                host.say(&format!(
                    "received {sig} before the ranks started: stopping the job"
                ));
                host.stopped_before_start(&node, sig).await
            }
            None => host.attempt(&node, machine.restarts()).await?,
        };
        let exit = match machine.ended(&attempted.end) {
            Step::Exit(exit) => exit,
            Step::Round { say, release_gpus } => {
                host.say(&say);
                let held = if release_gpus {
                    host.gpus_released().await
                } else {
                    None
                };
                match held {
                    Some(cause) => machine.memory_held(cause),
                    None => continue,
                }
            }
        };
        host.exit(&node, &exit, &attempted).await;
        return Ok(exit.code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::transitions::failure_stop;
    use crate::rendezvous::{StopKind, StopReason};
    use std::collections::VecDeque;
    use toporun_shared::root_cause::CauseKind;

    /// A node whose rounds and attempts end as scripted; it records what the loop
    /// asked of it.
    #[derive(Default)]
    struct Scripted {
        entries: VecDeque<Entered>,
        ends: VecDeque<AttemptEnd>,
        signal: Option<Signal>,
        memory_held: Option<Cause>,
        /// (min_round, restarts used) at each round's start.
        began: Vec<(u32, u32)>,
        /// TORCHELASTIC_RESTART_COUNT of each attempt.
        attempts: Vec<u32>,
        gpu_waits: u32,
        said: Vec<String>,
        exits: Vec<Exit>,
    }

    fn node(round: u32) -> NodePlace {
        NodePlace {
            round,
            ..NodePlace::default()
        }
    }

    impl Host for Scripted {
        fn round_begins(&mut self, min_round: u32, restarts: Restarts) {
            self.began.push((min_round, restarts.used));
        }
        async fn join(&mut self, min_round: u32) -> Result<Entered, JobError> {
            Ok(self
                .entries
                .pop_front()
                .unwrap_or(Entered::Placed(node(min_round))))
        }
        fn pending_signal(&mut self) -> Option<Signal> {
            self.signal.take()
        }
        async fn stopped_before_start(&mut self, node: &NodePlace, sig: Signal) -> Attempted {
            let r = crate::job::preemption::reason(sig, node.node_rank, "trainer-0", 0);
            Attempted {
                end: AttemptEnd::Stopped(r),
                report: None,
            }
        }
        async fn attempt(&mut self, _: &NodePlace, r: Restarts) -> Result<Attempted, JobError> {
            self.attempts.push(r.used);
            let end = self
                .ends
                .pop_front()
                .expect("an attempt more than scripted");
            Ok(Attempted { end, report: None })
        }
        async fn gpus_released(&mut self) -> Option<Cause> {
            self.gpu_waits += 1;
            self.memory_held.take()
        }
        fn say(&mut self, line: &str) {
            self.said.push(line.to_string());
        }
        async fn exit(&mut self, _: &NodePlace, exit: &Exit, _: &Attempted) {
            self.exits.push(exit.clone());
        }
    }

    fn run(host: &mut Scripted, machine: Machine) -> u8 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(drive(host, machine)).unwrap()
    }

    fn rank_failed(kind: StopKind) -> AttemptEnd {
        let ours = StopReason::new(kind, "node 0 local rank 1 (rank 1) failed");
        AttemptEnd::RankFailed {
            ours: ours.clone(),
            won: ours,
        }
    }

    const OK: AttemptEnd = AttemptEnd::Succeeded { barrier: None };

    #[test]
    fn failures_restart_with_the_count_in_the_ranks_env_until_one_succeeds() {
        let mut host = Scripted {
            ends: [
                rank_failed(StopKind::Restart),
                rank_failed(StopKind::Restart),
                OK,
            ]
            .into(),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(2, false, true)), 0);
        assert_eq!(host.attempts, [0, 1, 2]);
        assert_eq!(host.began, [(0, 0), (1, 1), (2, 2)]);
        assert_eq!(host.gpu_waits, 2, "each restart waits for the GPUs' memory");
        assert!(host.said[1].contains("(restart 2 of 2)"), "{:?}", host.said);
        assert_eq!(host.exits.len(), 1);
        assert_eq!(host.exits[0].linger, None, "success does not linger");
    }

    #[test]
    fn restarts_spent_end_with_the_summary_and_linger_for_the_others() {
        let spent = Restarts { used: 0, max: 0 };
        let ours = failure_stop(spent, "rank 1 failed", Some(CauseKind::Oom));
        let mut host = Scripted {
            ends: [AttemptEnd::RankFailed {
                ours: ours.clone(),
                won: ours,
            }]
            .into(),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(0, true, true)), 81);
        let e = &host.exits[0];
        assert!(
            e.summary && e.linger == Some(0) && e.cause.is_none(),
            "{e:?}"
        );
        assert_eq!(host.gpu_waits, 0);
    }

    #[test]
    fn membership_changes_move_rounds_without_using_restarts() {
        // A node lost, then one admitted, then a failure of the survivors: the
        // membership rounds keep the count at 0, and the failure finds none left.
        let lost = AttemptEnd::Stopped(StopReason::new(StopKind::Membership, "node 2 lost"));
        let joined = AttemptEnd::RankFailed {
            ours: failure_stop(Restarts { used: 0, max: 0 }, "rank 3 failed", None),
            won: StopReason::new(StopKind::Membership, "node 3 admitted"),
        };
        let mut host = Scripted {
            ends: [lost, joined, rank_failed(StopKind::Fail)].into(),
            entries: [Entered::Placed(node(4))].into(),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(0, false, false)), 1);
        assert_eq!(host.attempts, [0, 0, 0]);
        // A later round than asked (round 4) sets the next one's minimum.
        assert_eq!(host.began, [(0, 0), (5, 0), (6, 0)]);
    }

    #[test]
    fn gpu_memory_still_held_ends_the_job_with_its_cause_instead_of_a_round() {
        let held = Cause::new(CauseKind::Hardware, None, "GPU memory still held 30s after");
        let mut host = Scripted {
            ends: [rank_failed(StopKind::Restart)].into(),
            memory_held: Some(held.clone()),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(3, false, true)), 1);
        assert_eq!(host.attempts.len(), 1, "no second attempt");
        assert_eq!(host.exits[0].cause, Some(held));
        assert_eq!(host.exits[0].linger, None);
    }

    #[test]
    fn a_stop_declaring_nodes_lost_lingers_for_the_rest_only() {
        let mut lost = StopReason::fail("node 1 lost").caused_by(Some(CauseKind::Peer));
        lost.lost = vec![1];
        let mut host = Scripted {
            ends: [AttemptEnd::Stopped(lost)].into(),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(3, true, false)), 82);
        assert_eq!(host.exits[0].linger, Some(1));
        assert!(host.exits[0]
            .say
            .as_deref()
            .unwrap()
            .contains("node 1 lost"));
    }

    #[test]
    fn signals_and_a_finished_job_end_before_any_attempt() {
        let mut host = Scripted {
            entries: [Entered::Signal].into(),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(1, false, false)), 1);
        // Classified, a drain during the rendezvous is a preemption, not a failure.
        let mut host = Scripted {
            entries: [Entered::Signal].into(),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(1, true, false)), 85);
        let mut host = Scripted {
            entries: [Entered::JobFinished].into(),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(1, false, false)), 0);
        assert!(host.attempts.is_empty() && host.exits.is_empty());
    }

    #[test]
    fn a_signal_before_the_ranks_start_stops_the_job_as_a_preemption() {
        // The other nodes are told, and wait for nobody lost: 85 under classified
        // codes, no restart though restarts are left.
        let mut host = Scripted {
            signal: Some(Signal::SIGTERM),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(3, true, true)), 85);
        assert!(host.said[0].contains("SIGTERM before the ranks started"));
        assert!(host.attempts.is_empty() && host.gpu_waits == 0);
        assert_eq!(host.exits[0].linger, Some(0));
        let mut host = Scripted {
            signal: Some(Signal::SIGTERM),
            ..Scripted::default()
        };
        assert_eq!(run(&mut host, Machine::new(3, false, false)), 1);
    }
}
