//! What the job does after an attempt, as a pure function: the lifecycle loop does
//! the I/O (rendezvous, ranks, messages) and asks [`next`] where to go. Rank failures
//! count against --max-restarts (TORCHELASTIC_RESTART_COUNT); a membership change (a
//! node lost or admitted) moves to the next round only.

use crate::rendezvous::{StopKind, StopReason};
use toporun_shared::root_cause::exit_codes::class_of;

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
    /// A local rank failed: `ours` is the stop this node asked for, `won` the one
    /// every node acts on (another node may have asked first).
    RankFailed { ours: StopReason, won: StopReason },
    /// Another node, the keep-alive check or the file timer stopped the round.
    Stopped(StopReason),
    /// torch's FileTimerServer killed a rank with this signal.
    FileTimer { signal: i32 },
    /// No rank made progress for --hang-timeout, and --on-hang stop ended the job.
    Hang,
}

/// The exit code of `--on-hang stop` (timeout(1)'s "timed out").
pub const HANG_EXIT: u8 = 124;

/// Where the job goes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Run the next round; `counted` when it uses one of --max-restarts.
    Round { counted: bool, say: String },
    /// End with this exit code; `summary`: print the failure summary first.
    Exit {
        code: u8,
        say: Option<String>,
        summary: bool,
    },
}

/// The stop this node asks for when one of its ranks failed.
pub fn failure_stop(restarts: Restarts, what: &str) -> StopReason {
    let kind = if restarts.left() {
        StopKind::Restart
    } else {
        StopKind::Fail
    };
    StopReason::new(kind, what)
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

/// Where the job goes after `end`; an exit's code is its class under
/// `--exit-codes classified` (`classified`), from the cause that travelled with the
/// stop.
pub fn next(end: &AttemptEnd, restarts: Restarts, classified: bool) -> Next {
    match decide(end, restarts) {
        Next::Exit { code, say, summary } if classified => Next::Exit {
            code: class_code(code, end),
            say,
            summary,
        },
        n => n,
    }
}

fn decide(end: &AttemptEnd, restarts: Restarts) -> Next {
    match end {
        AttemptEnd::Succeeded { barrier: None } => exit(0, None),
        AttemptEnd::Succeeded {
            barrier: Some(reason),
        } => go_on(reason, "running this node's ranks again too", restarts).unwrap_or_else(|| {
            exit(
                1,
                Some(format!(
                    "this node's ranks succeeded, but the job did not: {reason}"
                )),
            )
        }),
        AttemptEnd::RankFailed { ours, won } => {
            if won != ours && won.kind == StopKind::Membership {
                return go_on(won, "restarting this node's ranks", restarts)
                    .unwrap_or_else(|| exit(1, None));
            }
            go_on(ours, "restarting every node's ranks", restarts).unwrap_or(Next::Exit {
                code: 1,
                say: None,
                summary: true,
            })
        }
        AttemptEnd::Stopped(reason) if reason.kind == StopKind::Hang => {
            exit(HANG_EXIT, Some(format!("the job stopped: {reason}")))
        }
        AttemptEnd::Stopped(reason) => go_on(reason, "restarting this node's ranks", restarts)
            .unwrap_or_else(|| exit(1, Some(format!("the job stopped: {reason}")))),
        AttemptEnd::Hang => exit(
            HANG_EXIT,
            Some("stopped every rank after the hang report (--on-hang stop)".into()),
        ),
        AttemptEnd::FileTimer { signal } => exit(
            u8::try_from((128 + signal).clamp(0, 255)).unwrap_or(255),
            None,
        ),
    }
}

/// The exit code under `--exit-codes classified`: a failure's is its leading
/// cause's class (that cause travels with the stop to every node); the others stay.
fn class_code(code: u8, end: &AttemptEnd) -> u8 {
    if code != 1 {
        return code;
    }
    let cause = match end {
        AttemptEnd::RankFailed { won, .. } => won.cause,
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

    fn counted(n: &Next) -> Option<bool> {
        match n {
            Next::Round { counted, .. } => Some(*counted),
            Next::Exit { .. } => None,
        }
    }

    #[test]
    fn success_everywhere_exits_0() {
        let n = next(&AttemptEnd::Succeeded { barrier: None }, NONE_LEFT, false);
        assert_eq!(n, exit(0, None));
    }

    #[test]
    fn a_rank_failure_restarts_while_restarts_are_left_then_ends_with_a_summary() {
        let ours = failure_stop(ONE_LEFT, "rank failed");
        assert_eq!(ours.kind, StopKind::Restart);
        let end = AttemptEnd::RankFailed {
            ours: ours.clone(),
            won: ours,
        };
        let n = next(&end, ONE_LEFT, false);
        assert_eq!(counted(&n), Some(true));
        let Next::Round { say, .. } = n else {
            unreachable!()
        };
        assert!(say.contains("(restart 1 of 1)"), "{say}");
        let spent = Restarts { used: 1, max: 1 };
        let ours = failure_stop(spent, "rank failed");
        assert_eq!(ours.kind, StopKind::Fail);
        let end = AttemptEnd::RankFailed {
            ours: ours.clone(),
            won: ours,
        };
        assert!(matches!(
            next(&end, spent, false),
            Next::Exit {
                code: 1,
                summary: true,
                ..
            }
        ));
    }

    #[test]
    fn a_rank_failure_after_a_membership_change_is_not_counted() {
        // Another node was lost first: the ranks here failed because of it.
        let end = AttemptEnd::RankFailed {
            ours: failure_stop(NONE_LEFT, "rank failed"),
            won: stop(StopKind::Membership),
        };
        assert_eq!(counted(&next(&end, NONE_LEFT, false)), Some(false));
    }

    #[test]
    fn a_stop_from_another_node_follows_its_kind() {
        let n = next(
            &AttemptEnd::Stopped(stop(StopKind::Membership)),
            NONE_LEFT,
            false,
        );
        assert_eq!(counted(&n), Some(false));
        let n = next(
            &AttemptEnd::Stopped(stop(StopKind::Restart)),
            ONE_LEFT,
            false,
        );
        assert_eq!(counted(&n), Some(true));
        // A restart asked for when this node has none left ends the job here too.
        let n = next(
            &AttemptEnd::Stopped(stop(StopKind::Restart)),
            NONE_LEFT,
            false,
        );
        assert!(
            matches!(
                n,
                Next::Exit {
                    code: 1,
                    summary: false,
                    ..
                }
            ),
            "{n:?}"
        );
        let n = next(&AttemptEnd::Stopped(stop(StopKind::Fail)), ONE_LEFT, false);
        let Next::Exit { say: Some(say), .. } = n else {
            panic!("{n:?}")
        };
        assert!(say.starts_with("the job stopped: fail: "), "{say}");
    }

    #[test]
    fn a_failure_elsewhere_after_this_node_finished_runs_it_again_or_ends() {
        let end = AttemptEnd::Succeeded {
            barrier: Some(stop(StopKind::Restart)),
        };
        assert_eq!(counted(&next(&end, ONE_LEFT, false)), Some(true));
        let Next::Exit {
            code: 1,
            say: Some(say),
            ..
        } = next(&end, NONE_LEFT, false)
        else {
            panic!()
        };
        assert!(say.contains("succeeded, but the job did not"), "{say}");
    }

    #[test]
    fn a_hang_stopped_by_on_hang_ends_with_its_own_code_never_a_restart() {
        // Here, or on another node that stopped every node for it.
        let elsewhere = AttemptEnd::Stopped(StopReason::new(StopKind::Hang, "no progress"));
        for end in [AttemptEnd::Hang, elsewhere] {
            let n = next(&end, ONE_LEFT, false);
            assert!(
                matches!(
                    n,
                    Next::Exit {
                        code: HANG_EXIT,
                        summary: false,
                        ..
                    }
                ),
                "{n:?}"
            );
        }
    }

    #[test]
    fn a_preemption_ends_with_1_or_its_class_and_the_file_timer_with_its_signal() {
        use nix::sys::signal::Signal;
        let r = crate::job::preemption::reason(Signal::SIGTERM, 1, "trainer-1", 0);
        let end = AttemptEnd::Stopped(r);
        let n = next(&end, ONE_LEFT, false);
        assert!(matches!(n, Next::Exit { code: 1, .. }), "{n:?}");
        let n = next(&end, ONE_LEFT, true);
        assert!(matches!(n, Next::Exit { code: 85, .. }), "{n:?}");
        let n = next(&AttemptEnd::FileTimer { signal: 9 }, ONE_LEFT, false);
        assert_eq!(n, exit(137, None));
    }

    #[test]
    fn classified_codes_follow_the_cause_that_travelled_with_the_stop() {
        use toporun_shared::root_cause::CauseKind;
        let lost = StopReason::fail("node 2 lost").caused_by(Some(CauseKind::Peer));
        assert_eq!(class_code(1, &AttemptEnd::Stopped(lost.clone())), 82);
        // A stop that moves on to another round is no exit: no class.
        let restart = StopReason::new(StopKind::Restart, "rank 1").caused_by(Some(CauseKind::Oom));
        let n = next(&AttemptEnd::Stopped(restart), ONE_LEFT, true);
        assert_eq!(counted(&n), Some(true));
        let n = next(&AttemptEnd::Stopped(lost), ONE_LEFT, true);
        assert!(matches!(n, Next::Exit { code: 82, .. }), "{n:?}");
        let oom = StopReason::fail("rank 1").caused_by(Some(CauseKind::Oom));
        let end = AttemptEnd::RankFailed {
            ours: oom.clone(),
            won: oom,
        };
        assert_eq!(class_code(1, &end), 81);
        // Unknown cause, a hang, a signal: as they are.
        assert_eq!(
            class_code(1, &AttemptEnd::Stopped(StopReason::fail("x"))),
            1
        );
        assert_eq!(class_code(HANG_EXIT, &AttemptEnd::Hang), HANG_EXIT);
    }
}
