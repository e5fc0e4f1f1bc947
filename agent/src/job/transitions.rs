//! What the job does after an attempt, as a state machine: the round loop does the
//! I/O (rendezvous, ranks, messages), tells the [`Machine`] how each attempt ended,
//! once, and carries out the [`Step`] it returns. Rank failures count against
//! --max-restarts (TORCHELASTIC_RESTART_COUNT); a membership change (a node lost or
//! admitted) moves to the next round only; a GPU fault, or GPU memory the last
//! attempt never released, ends the job.

use crate::rendezvous::{StopKind, StopReason};
use toporun_shared::root_cause::exit_codes::{class_of, signalled, FAILURE, HANG, SUCCESS};
use toporun_shared::root_cause::{Cause, CauseKind};

/// --max-restarts and how many were used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restarts {
    pub used: u32,
    pub max: u32,
}

impl Restarts {
    pub fn left(&self) -> bool {
        self.used < self.max
    }
}

/// How an attempt on this node ended, with what the rendezvous said about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Every local rank succeeded; `barrier` is why the job did not, if another node
    /// stopped it while this one waited at the exit barrier.
    Succeeded { barrier: Option<StopReason> },
    /// A local rank failed: `ours` is the stop this node asked for (from
    /// [`failure_stop`]), `won` the one every node acts on (another node may have
    /// asked first), save a node whose own stop ends its part: it leaves.
    RankFailed { ours: StopReason, won: StopReason },
    /// Another node, the keep-alive check or the file timer stopped the round.
    Stopped(StopReason),
    /// torch's FileTimerServer killed a rank with this signal.
    FileTimer { signal: i32 },
    /// No rank made progress for --hang-timeout, and --on-hang stop ended the job; or
    /// NCCL's watchdog timed a collective out and toporun stopped the ranks.
    Hang { by_watchdog: bool },
}

/// The exit code of `--on-hang stop` (timeout(1)'s "timed out").
pub const HANG_EXIT: u8 = HANG.code;

/// What the round loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Say `say`, then run the next round; first, when `release_gpus`, wait until the
    /// last attempt's GPU memory is released and tell [`Machine::memory_held`] if not.
    Round { say: String, release_gpus: bool },
    /// End the job.
    Exit(Exit),
}

/// How the job ends on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub code: u8,
    pub say: Option<String>,
    /// Write torchrun's failure summary (this node's rank failed, no restart left).
    pub summary: bool,
    /// Stay until the other nodes heard the stop; the nodes it declared lost, who
    /// never will.
    pub linger: Option<usize>,
    /// A cause found after the attempt (memory never released): said, left in the
    /// termination message and in `/status`.
    pub cause: Option<Cause>,
}

/// The job's state between attempts: the restarts used, and how exits are coded.
#[derive(Debug, Clone)]
pub struct Machine {
    restarts: Restarts,
    /// `--exit-codes classified`.
    classified: bool,
    /// This node has GPUs: a round first waits for their memory.
    gpus: bool,
}

impl Machine {
    pub fn new(max_restarts: u32, classified: bool, gpus: bool) -> Machine {
        let restarts = Restarts {
            used: 0,
            max: max_restarts,
        };
        Machine {
            restarts,
            classified,
            gpus,
        }
    }

    pub fn restarts(&self) -> Restarts {
        self.restarts
    }

    /// A handled signal while this node waited in the rendezvous: see
    /// [`signal_before_round`].
    pub fn signal_in_rendezvous(&self) -> u8 {
        signal_before_round(self.classified)
    }

    /// Where the job goes after `end`, told once per attempt.
    pub fn ended(&mut self, end: &AttemptEnd) -> Step {
        match decide(end, self.restarts) {
            Next::Round { counted, say } => {
                self.restarts.used += u32::from(counted);
                Step::Round {
                    say,
                    release_gpus: self.gpus,
                }
            }
            Next::Exit { code, say, summary } => {
                // The others still alive hear why, whichever node asked for the stop.
                let linger = (code != 0).then_some(match end {
                    AttemptEnd::Stopped(r) => r.lost.len(),
                    _ => 0,
                });
                let code = if self.classified {
                    class_code(code, end)
                } else {
                    code
                };
                Step::Exit(Exit {
                    code,
                    say,
                    summary,
                    linger,
                    cause: None,
                })
            }
        }
    }

    /// A round's GPU memory was still held after the wait: a restart would fail with
    /// CUDA out of memory, so the job ends with that cause (a hardware class).
    pub fn memory_held(&self, cause: Cause) -> Exit {
        let code = if self.classified {
            class_of(CauseKind::Hardware).code
        } else {
            FAILURE
        };
        Exit {
            code,
            say: None,
            summary: false,
            linger: None,
            cause: Some(cause),
        }
    }
}

/// What [`decide`] makes of an attempt's end, before the machine codes it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    /// Run the next round; `counted` when it uses one of --max-restarts.
    Round { counted: bool, say: String },
    /// End with this exit code; `summary`: print the failure summary first.
    Exit {
        code: u8,
        say: Option<String>,
        summary: bool,
    },
}

/// The stop this node asks for when one of its ranks failed, for the leading cause
/// found: a restart while restarts are left, except after a GPU fault (a GPU that
/// fell off the bus does not come back by restarting Python).
pub fn failure_stop(restarts: Restarts, what: &str, cause: Option<CauseKind>) -> StopReason {
    let reason = if cause == Some(CauseKind::Hardware) {
        StopReason::fail(format!("{what}; no restart on this node after a GPU fault"))
    } else if restarts.left() {
        StopReason::new(StopKind::Restart, what)
    } else {
        StopReason::fail(what)
    };
    reason.caused_by(cause)
}

/// Whether a stop moves the job to another round, and what to say.
fn go_on(reason: &StopReason, what: &str, restarts: Restarts) -> Option<Next> {
    match reason.kind {
        StopKind::Membership => Some(Next::Round {
            counted: false,
            say: format!(
                "{reason}; {what} (a membership change: not counted against --max-restarts)"
            ),
        }),
        StopKind::Restart if restarts.left() => Some(Next::Round {
            counted: true,
            say: format!(
                "{reason}; {what} (restart {} of {})",
                restarts.used + 1,
                restarts.max
            ),
        }),
        _ => None,
    }
}

fn exit(code: u8, say: Option<String>) -> Next {
    Next::Exit {
        code,
        say,
        summary: false,
    }
}

/// The stop a node whose ranks failed acts on: the one that won, or its own where
/// that ends its part and the winner would restart.
pub(crate) fn acted_on<'a>(ours: &'a StopReason, won: &'a StopReason) -> &'a StopReason {
    if ours.kind == StopKind::Fail && won.kind == StopKind::Restart {
        ours
    } else {
        won
    }
}

fn decide(end: &AttemptEnd, restarts: Restarts) -> Next {
    match end {
        AttemptEnd::Succeeded { barrier: None } => exit(SUCCESS, None),
        AttemptEnd::Succeeded {
            barrier: Some(reason),
        } => go_on(reason, "running this node's ranks again too", restarts).unwrap_or_else(|| {
            exit(
                FAILURE,
                Some(format!(
                    "this node's ranks succeeded, but the job did not: {reason}"
                )),
            )
        }),
        // acted_on: the stop that won decides (a node restarting alone after another node's
        // failure ended the job would wait for the others forever), except that a node
        // whose own stop ends its part (a GPU fault here) leaves even when another
        // node's restart won: the others see it gone.
        AttemptEnd::RankFailed { ours, won } => {
            let acted = acted_on(ours, won);
            let what = if won == ours {
                "restarting every node's ranks"
            } else {
                "restarting this node's ranks"
            };
            go_on(acted, what, restarts).unwrap_or(Next::Exit {
                code: FAILURE,
                say: None,
                summary: true,
            })
        }
        AttemptEnd::Stopped(reason) if reason.kind == StopKind::Hang => {
            exit(HANG_EXIT, Some(format!("the job stopped: {reason}")))
        }
        AttemptEnd::Stopped(reason) => go_on(reason, "restarting this node's ranks", restarts)
            .unwrap_or_else(|| exit(FAILURE, Some(format!("the job stopped: {reason}")))),
        // As torch would have ended the rank: a failure, restarted while restarts are
        // left, else torchrun's 1 (the hang class, 124, under --exit-codes classified).
        AttemptEnd::Hang { by_watchdog: true } if restarts.left() => Next::Round {
            counted: true,
            say: format!(
                "NCCL's watchdog timed a collective out; restarting this node's ranks (restart {} of {})",
                restarts.used + 1,
                restarts.max
            ),
        },
        AttemptEnd::Hang { by_watchdog: true } => exit(
            FAILURE,
            Some("stopped every rank once NCCL's watchdog had timed a collective out (the ranks could not go on)".into()),
        ),
        AttemptEnd::Hang { by_watchdog: false } => exit(
            HANG_EXIT,
            Some("stopped every rank after the hang report (--on-hang stop)".into()),
        ),
        AttemptEnd::FileTimer { signal } => exit(signalled(*signal), None),
    }
}

/// A handled signal (SIGTERM of a drain, SIGINT) before this node joined a round, or
/// while it connected to the rendezvous: nothing ran. torchrun exits 1; classified, it
/// is a preemption (85, ignored by the podFailurePolicy), as the same drain a second
/// later, once the ranks run, is: a pod drained during the rendezvous must not count
/// as a failure.
pub fn signal_before_round(classified: bool) -> u8 {
    if classified {
        toporun_shared::root_cause::exit_codes::PREEMPTED.code
    } else {
        FAILURE
    }
}

/// The exit code under `--exit-codes classified`: a failure's is its leading
/// cause's class (that cause travels with the stop to every node); the others stay.
fn class_code(code: u8, end: &AttemptEnd) -> u8 {
    if code != FAILURE {
        return code;
    }
    let cause = match end {
        AttemptEnd::Hang { by_watchdog: true } => Some(CauseKind::Hang),
        AttemptEnd::RankFailed { ours, won } => acted_on(ours, won).cause,
        AttemptEnd::Stopped(r) => r.cause,
        AttemptEnd::Succeeded { barrier: Some(r) } => r.cause,
        _ => None,
    };
    cause.map_or(code, |k| class_of(k).code)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE_LEFT: Restarts = Restarts { used: 0, max: 0 };
    const ONE_LEFT: Restarts = Restarts { used: 0, max: 1 };

    fn stop(kind: StopKind) -> StopReason {
        StopReason::new(kind, "node 1 local rank 0 (rank 2) failed with exit code 1")
    }

    fn machine(restarts: Restarts, classified: bool) -> Machine {
        Machine {
            restarts,
            classified,
            gpus: false,
        }
    }

    /// The step after `end`, and whether it used a restart.
    fn after(end: &AttemptEnd, restarts: Restarts, classified: bool) -> (Step, bool) {
        let mut m = machine(restarts, classified);
        let step = m.ended(end);
        (step, m.restarts().used > restarts.used)
    }

    fn exit_of(step: Step) -> Exit {
        match step {
            Step::Exit(e) => e,
            other => panic!("not an exit: {other:?}"),
        }
    }

    fn failed(ours: StopReason) -> AttemptEnd {
        AttemptEnd::RankFailed {
            ours: ours.clone(),
            won: ours,
        }
    }

    #[test]
    fn success_everywhere_exits_0_without_lingering() {
        let (step, _) = after(&AttemptEnd::Succeeded { barrier: None }, NONE_LEFT, false);
        let e = exit_of(step);
        assert_eq!((e.code, e.linger, e.summary), (0, None, false));
    }

    #[test]
    fn a_rank_failure_restarts_while_restarts_are_left_then_ends_with_a_summary() {
        let ours = failure_stop(ONE_LEFT, "rank failed", None);
        assert_eq!(ours.kind, StopKind::Restart);
        let (step, counted) = after(&failed(ours), ONE_LEFT, false);
        assert!(counted);
        let Step::Round { say, .. } = step else {
            panic!("{step:?}")
        };
        assert!(say.contains("(restart 1 of 1)"), "{say}");
        let spent = Restarts { used: 1, max: 1 };
        let ours = failure_stop(spent, "rank failed", None);
        assert_eq!(ours.kind, StopKind::Fail);
        let e = exit_of(after(&failed(ours), spent, false).0);
        assert_eq!((e.code, e.summary, e.linger), (1, true, Some(0)));
    }

    #[test]
    fn a_gpu_fault_stops_without_a_restart_even_with_restarts_left() {
        let ours = failure_stop(ONE_LEFT, "rank 0 failed", Some(CauseKind::Hardware));
        assert_eq!(ours.kind, StopKind::Fail);
        assert!(ours
            .detail
            .ends_with("no restart on this node after a GPU fault"));
        assert_eq!(ours.cause, Some(CauseKind::Hardware));
        let e = exit_of(after(&failed(ours.clone()), ONE_LEFT, false).0);
        assert_eq!((e.code, e.summary), (1, true));
        let hardware = class_of(CauseKind::Hardware).code;
        assert_eq!(
            exit_of(after(&failed(ours), ONE_LEFT, true).0).code,
            hardware
        );
        // Any other cause restarts, and travels with the stop.
        let oom = failure_stop(ONE_LEFT, "rank 0 failed", Some(CauseKind::Oom));
        assert_eq!(
            (oom.kind, oom.cause),
            (StopKind::Restart, Some(CauseKind::Oom))
        );
    }

    #[test]
    fn a_round_waits_for_gpu_memory_where_there_are_gpus_and_ends_when_it_stays_held() {
        let mut m = Machine::new(1, true, true);
        let step = m.ended(&failed(failure_stop(ONE_LEFT, "rank failed", None)));
        assert!(
            matches!(
                step,
                Step::Round {
                    release_gpus: true,
                    ..
                }
            ),
            "{step:?}"
        );
        let cause = Cause::new(CauseKind::Hardware, None, "GPU memory still held");
        let e = m.memory_held(cause.clone());
        let hardware = class_of(CauseKind::Hardware).code;
        assert_eq!((e.code, e.summary, e.linger), (hardware, false, None));
        assert_eq!(e.cause, Some(cause));
        assert_eq!(
            Machine::new(1, false, true)
                .memory_held(e.cause.unwrap())
                .code,
            1
        );
        let mut m = Machine::new(1, false, false);
        let step = m.ended(&AttemptEnd::Stopped(stop(StopKind::Membership)));
        assert!(
            matches!(
                step,
                Step::Round {
                    release_gpus: false,
                    ..
                }
            ),
            "{step:?}"
        );
    }

    #[test]
    fn a_rank_failure_after_a_membership_change_is_not_counted() {
        // Another node was lost first: the ranks here failed because of it.
        let end = AttemptEnd::RankFailed {
            ours: failure_stop(NONE_LEFT, "rank failed", None),
            won: stop(StopKind::Membership),
        };
        let (step, counted) = after(&end, NONE_LEFT, false);
        assert!(matches!(step, Step::Round { .. }) && !counted, "{step:?}");
    }

    /// A node whose ranks failed while another node's stop won acts on that stop, as
    /// every other node does; a node that must not restart leaves.
    #[test]
    fn a_rank_failure_follows_the_stop_that_won() {
        // Ours would restart; another node's failure ended the job first.
        let end = AttemptEnd::RankFailed {
            ours: failure_stop(ONE_LEFT, "rank failed", None),
            won: stop(StopKind::Fail),
        };
        let (step, counted) = after(&end, ONE_LEFT, false);
        let e = exit_of(step);
        assert_eq!((e.code, e.summary, counted), (1, true, false));
        // Ours ends this node's part (a GPU fault here); another node's restart won:
        // this node leaves rather than restart on the faulty GPU.
        let end = AttemptEnd::RankFailed {
            ours: failure_stop(ONE_LEFT, "rank failed", Some(CauseKind::Hardware)),
            won: stop(StopKind::Restart),
        };
        let e = exit_of(after(&end, ONE_LEFT, true).0);
        assert_eq!(
            e.code,
            class_of(CauseKind::Hardware).code,
            "its own cause's class"
        );
        // Both restart: the one that won is said.
        let end = AttemptEnd::RankFailed {
            ours: failure_stop(ONE_LEFT, "rank failed", None),
            won: stop(StopKind::Restart),
        };
        let (step, counted) = after(&end, ONE_LEFT, false);
        assert!(matches!(&step, Step::Round { say, .. } if say.contains("node 1")) && counted);
    }

    #[test]
    fn a_stop_from_another_node_follows_its_kind() {
        let (step, counted) = after(
            &AttemptEnd::Stopped(stop(StopKind::Membership)),
            NONE_LEFT,
            false,
        );
        assert!(matches!(step, Step::Round { .. }) && !counted);
        let (step, counted) = after(
            &AttemptEnd::Stopped(stop(StopKind::Restart)),
            ONE_LEFT,
            false,
        );
        assert!(matches!(step, Step::Round { .. }) && counted);
        // A restart asked for when this node has none left ends the job here too.
        let e = exit_of(
            after(
                &AttemptEnd::Stopped(stop(StopKind::Restart)),
                NONE_LEFT,
                false,
            )
            .0,
        );
        assert_eq!((e.code, e.summary), (1, false));
        let e = exit_of(after(&AttemptEnd::Stopped(stop(StopKind::Fail)), ONE_LEFT, false).0);
        let say = e.say.unwrap_or_default();
        assert!(say.starts_with("the job stopped: fail: "), "{say}");
    }

    #[test]
    fn a_stop_that_declares_nodes_lost_lingers_without_waiting_for_them() {
        let mut lost = StopReason::fail("nodes 2 and 3 lost").caused_by(Some(CauseKind::Peer));
        lost.lost = vec![2, 3];
        let e = exit_of(after(&AttemptEnd::Stopped(lost), ONE_LEFT, false).0);
        assert_eq!((e.code, e.linger), (1, Some(2)));
    }

    #[test]
    fn a_failure_elsewhere_after_this_node_finished_runs_it_again_or_ends() {
        let end = AttemptEnd::Succeeded {
            barrier: Some(stop(StopKind::Restart)),
        };
        assert!(after(&end, ONE_LEFT, false).1);
        let e = exit_of(after(&end, NONE_LEFT, false).0);
        assert_eq!(e.code, 1);
        let say = e.say.unwrap_or_default();
        assert!(say.contains("succeeded, but the job did not"), "{say}");
    }

    #[test]
    fn a_hang_stopped_by_on_hang_ends_with_its_own_code_never_a_restart() {
        // Here, or on another node that stopped every node for it.
        let elsewhere = AttemptEnd::Stopped(StopReason::new(StopKind::Hang, "no progress"));
        for end in [AttemptEnd::Hang { by_watchdog: false }, elsewhere] {
            let e = exit_of(after(&end, ONE_LEFT, false).0);
            assert_eq!((e.code, e.summary), (HANG_EXIT, false), "{end:?}");
        }
    }

    /// NCCL's watchdog ended the attempt: as torch would have ended the rank, a
    /// failure (restarted while restarts are left; torchrun's 1, or the hang class).
    #[test]
    fn a_watchdog_stop_is_a_failure_restarted_while_restarts_are_left() {
        let end = AttemptEnd::Hang { by_watchdog: true };
        let (step, counted) = after(&end, ONE_LEFT, false);
        assert!(matches!(step, Step::Round { .. }) && counted, "{step:?}");
        assert_eq!(exit_of(after(&end, NONE_LEFT, false).0).code, FAILURE);
        assert_eq!(exit_of(after(&end, NONE_LEFT, true).0).code, HANG_EXIT);
    }

    #[test]
    fn a_preemption_ends_with_1_or_its_class_and_the_file_timer_with_its_signal() {
        use nix::sys::signal::Signal;
        let r = crate::job::preemption::reason(Signal::SIGTERM, 1, "trainer-1", 0);
        let end = AttemptEnd::Stopped(r);
        assert_eq!(exit_of(after(&end, ONE_LEFT, false).0).code, 1);
        assert_eq!(exit_of(after(&end, ONE_LEFT, true).0).code, 85);
        let e = exit_of(after(&AttemptEnd::FileTimer { signal: 9 }, ONE_LEFT, true).0);
        assert_eq!((e.code, e.say), (137, None));
    }

    #[test]
    fn classified_codes_follow_the_cause_that_travelled_with_the_stop() {
        let lost = StopReason::fail("node 2 lost").caused_by(Some(CauseKind::Peer));
        assert_eq!(class_code(1, &AttemptEnd::Stopped(lost.clone())), 82);
        // A stop that moves on to another round is no exit: no class.
        let restart = StopReason::new(StopKind::Restart, "rank 1").caused_by(Some(CauseKind::Oom));
        assert!(after(&AttemptEnd::Stopped(restart), ONE_LEFT, true).1);
        assert_eq!(
            exit_of(after(&AttemptEnd::Stopped(lost), ONE_LEFT, true).0).code,
            82
        );
        let oom = StopReason::fail("rank 1").caused_by(Some(CauseKind::Oom));
        assert_eq!(class_code(1, &failed(oom)), 81);
        // Unknown cause, a hang, a signal: as they are.
        assert_eq!(
            class_code(1, &AttemptEnd::Stopped(StopReason::fail("x"))),
            1
        );
        assert_eq!(
            class_code(HANG_EXIT, &AttemptEnd::Hang { by_watchdog: false }),
            HANG_EXIT
        );
    }
}
