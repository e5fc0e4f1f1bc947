//! Rank supervision: start every local rank in its own process group, forward
//! signals, stop the rest when one fails, reap orphans, report failures.

mod events;
pub mod file_timer;
mod logs;
pub mod open_files;
mod pty;
mod spawn;
mod summary;
mod tail;
mod vfork_exec;

pub use events::{Event, Events};
pub use logs::{line_prefix, private_file, Console, Duplicate, LogPlan, Sink, StderrRead};
pub use spawn::RankCmd;
pub use summary::{
    dump_error_file, failure_summary, first_failure, leave_termination_message, record_error,
    Failure, WorkerError, TERMINATION_MESSAGE_MAX,
};
pub use tail::Tail;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::time::{Duration, Instant, SystemTime};

/// How an attempt ended; `R` is why another node stopped it.
#[derive(Debug)]
pub enum Outcome<R> {
    Succeeded,
    /// One or more ranks failed; the others were stopped.
    Failed(Vec<Failure>),
    /// toporun got a handled signal and stopped the ranks.
    Interrupted(Signal),
    /// Another node asked every node to stop (a failure elsewhere, a lost node).
    Stopped(R),
}

/// How the ranks are stopped when the attempt ends early.
#[derive(Debug, Clone, Copy)]
pub struct StopHow {
    /// `--shutdown-timeout`: from the signal to SIGKILL.
    pub timeout: Duration,
    /// `--stop-grace`: on a preemption, how long the ranks get to end by themselves
    /// (they saw the stop file) before the signal; the deadline still bounds it.
    pub grace: Duration,
    /// `--stop-signal-to group`: the signal goes to each rank's process group, as
    /// torchrun sends it; by default only to the rank, so its DataLoader workers keep
    /// serving it until it exits (the group is SIGKILLed after that, or at the deadline).
    pub group: bool,
}

/// Why an attempt is stopped from outside its ranks, and how much of the shutdown
/// deadline is already spent (a preemption's deadline runs from the first signal,
/// wherever it struck).
pub trait StopRequest: std::fmt::Display {
    fn spent(&self) -> Duration {
        Duration::ZERO
    }
    /// A preemption: the ranks get `--stop-grace` before the signal.
    fn graceful(&self) -> bool {
        false
    }
    /// At most this long from the signal to SIGKILL, below `--shutdown-timeout`.
    fn deadline(&self) -> Option<Duration> {
        None
    }
}

/// One stop: the signal, the grace before it, and the SIGKILL deadline.
struct Plan {
    signal: Signal,
    grace: Duration,
    deadline: Instant,
    group: bool,
}

impl Plan {
    fn new(how: StopHow, signal: Signal, spent: Duration, graceful: bool) -> Plan {
        Plan::within(how, signal, spent, graceful, None)
    }

    /// `new`, with the SIGKILL deadline at most `cap` away.
    fn within(
        how: StopHow,
        signal: Signal,
        spent: Duration,
        graceful: bool,
        cap: Option<Duration>,
    ) -> Plan {
        let left = how.timeout.saturating_sub(spent);
        let left = cap.map_or(left, |c| c.min(left));
        Plan {
            signal,
            // The deadline bounds the grace too.
            grace: if graceful {
                how.grace.min(left)
            } else {
                Duration::ZERO
            },
            deadline: Instant::now() + left,
            group: how.group,
        }
    }
}

/// Becomes a child subreaper, so orphaned grandchildren re-parent to toporun and are
/// reaped (PID 1's duty, and useful anywhere).
pub fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!("PR_SET_CHILD_SUBREAPER failed: {e}");
    }
}

struct Running {
    cmd: RankCmd,
    pid: Pid,
    exit: Option<WaitStatus>,
    at: Option<SystemTime>,
}

/// What happens to a rank, as it happens (for the status endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankEvent {
    Started {
        local_rank: u32,
        rank: u32,
        pid: i32,
    },
    /// The exit code, or minus the signal that killed it (as Python's returncode).
    Exited { pid: i32, code: i32 },
    /// A rank failed; the others are about to be stopped.
    StoppingOthers,
    /// The attempt is being stopped from outside (a handled signal here, `None`: a
    /// stop from another node): the stop file is made before the ranks are signalled.
    Stopping { signal: Option<Signal> },
}

/// Runs one attempt of all local ranks until they all succeed, one fails (the others
/// are stopped), or a handled signal arrives (forwarded, then the ranks are stopped).
pub async fn run_attempt<R: StopRequest>(
    cmds: Vec<RankCmd>,
    events: &mut Events,
    how: StopHow,
    stop_request: impl std::future::Future<Output = R>,
    on_rank: &dyn Fn(RankEvent),
) -> std::io::Result<Outcome<R>> {
    let console = Console::start();
    let outcome = attempt(cmds, &console, events, how, stop_request, on_rank).await;
    // Every line the ranks wrote reaches the console before anything else is said.
    console.drain(Duration::from_secs(2));
    outcome
}

async fn attempt<R: StopRequest>(
    cmds: Vec<RankCmd>,
    console: &Console,
    events: &mut Events,
    how: StopHow,
    stop_request: impl std::future::Future<Output = R>,
    on_rank: &dyn Fn(RankEvent),
) -> std::io::Result<Outcome<R>> {
    let mut stop_request = std::pin::pin!(stop_request);
    let mut ranks: Vec<Running> = Vec::with_capacity(cmds.len());
    for cmd in cmds {
        match cmd.spawn(console) {
            Ok(pid) => {
                on_rank(RankEvent::Started {
                    local_rank: cmd.local_rank,
                    rank: cmd.rank,
                    pid: pid.as_raw(),
                });
                ranks.push(Running {
                    cmd,
                    pid,
                    exit: None,
                    at: None,
                })
            }
            Err(e) => {
                let plan = Plan::new(how, Signal::SIGTERM, Duration::ZERO, false);
                stop(&mut ranks, events, plan, on_rank).await;
                let hint = if e.kind() == std::io::ErrorKind::NotFound {
                    "; check the path, or put python3 on PATH / set PYTHON_EXEC to the interpreter (for --no-python, give the program's path)"
                } else {
                    ""
                };
                return Err(std::io::Error::new(
                    e.kind(),
                    format!(
                        "could not start local rank {} ({}): {e}{hint}",
                        cmd.local_rank,
                        cmd.argv.first().map(String::as_str).unwrap_or("?")
                    ),
                ));
            }
        }
    }
    let started = Instant::now();
    loop {
        reap(&mut ranks, on_rank);
        if ranks.iter().any(|r| failed(r.exit)) {
            // The others still stand where the failure left them: a last look first.
            on_rank(RankEvent::StoppingOthers);
            settle(&mut ranks, events, on_rank, started).await;
            // As torchrun's: the ranks that failed on their own, not those stopped.
            let failures: Vec<Failure> = ranks
                .iter()
                .filter(|r| failed(r.exit))
                .map(to_failure)
                .collect();
            say_stopping_others(&failures, &ranks, how);
            let plan = Plan::new(how, Signal::SIGTERM, Duration::ZERO, false);
            stop(&mut ranks, events, plan, on_rank).await;
            return Ok(Outcome::Failed(failures));
        }
        if ranks.iter().all(|r| r.exit.is_some()) {
            kill_groups(&ranks, Signal::SIGKILL);
            return Ok(Outcome::Succeeded);
        }
        let event = tokio::select! {
            ev = events.next() => ev,
            reason = &mut stop_request => {
                tracing::warn!("stopping the ranks: {reason}");
                on_rank(RankEvent::Stopping { signal: None });
                let plan = Plan::within(
                    how,
                    Signal::SIGTERM,
                    reason.spent(),
                    reason.graceful(),
                    reason.deadline(),
                );
                stop(&mut ranks, events, plan, on_rank).await;
                return Ok(Outcome::Stopped(reason));
            }
        };
        match event {
            Event::Child => {}
            Event::Signal(sig) => {
                on_rank(RankEvent::Stopping { signal: Some(sig) });
                let plan = Plan::new(how, sig, Duration::ZERO, true);
                let live = ranks.iter().filter(|r| r.exit.is_none()).count();
                if plan.grace.is_zero() {
                    tracing::warn!(
                        "received {sig}: forwarding it to {live} rank(s), SIGKILL in {:?}",
                        how.timeout
                    );
                } else {
                    tracing::warn!("received {sig}: the stop file is made; {live} rank(s) get --stop-grace {:?} to end by themselves, then {sig}; SIGKILL in {:?}", plan.grace, how.timeout);
                }
                stop(&mut ranks, events, plan, on_rank).await;
                return Ok(Outcome::Interrupted(sig));
            }
        }
    }
}

/// How long the other ranks get after a failure before the stop signal: torchrun's
/// monitor interval, the soonest torchrun would see them.
const SETTLE: Duration = Duration::from_millis(100);
/// How long a rank whose stderr ends in its own uncaught exception gets to exit with
/// its own code (when every rank fails at import, they all are on their way out).
const SETTLE_EXITING: Duration = Duration::from_secs(2);
/// A failure this soon after the ranks started (an import, a bad argument, a missing
/// file) likely strikes the others too, a little later on a loaded machine: they get
/// SETTLE_EARLY to fail on their own. A job failing at start waits that much longer.
const EARLY: Duration = Duration::from_secs(5);
const SETTLE_EARLY: Duration = Duration::from_millis(500);

/// Reaps the ranks that exit by themselves just after a failure, so each is reported
/// with its own exit code and traceback, not as stopped by toporun's signal.
async fn settle(
    ranks: &mut [Running],
    events: &mut Events,
    on_rank: &dyn Fn(RankEvent),
    started: Instant,
) {
    let start = Instant::now();
    let base = if start.duration_since(started) < EARLY {
        SETTLE_EARLY
    } else {
        SETTLE
    };
    loop {
        reap(ranks, on_rank);
        let exiting = ranks.iter().filter(|r| r.exit.is_none()).map(|r| {
            toporun_shared::root_cause::python_error::ends_in_exception(&r.cmd.stderr_tail.text())
        });
        let limit = match exiting.reduce(|a, b| a || b) {
            None => return,
            Some(true) => SETTLE_EXITING,
            Some(false) => base,
        };
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return;
        }
        let _ =
            tokio::time::timeout(left.min(Duration::from_millis(20)), events.next_child()).await;
    }
}

fn failed(exit: Option<WaitStatus>) -> bool {
    match exit {
        Some(WaitStatus::Exited(_, code)) => code != 0,
        Some(WaitStatus::Signaled(..)) => true,
        _ => false,
    }
}

fn to_failure(r: &Running) -> Failure {
    Failure::new(
        &r.cmd,
        r.pid.as_raw(),
        r.exit.expect("failed ranks have exited"),
        r.at.unwrap_or_else(SystemTime::now),
    )
}

/// Collects every exited child: our ranks' statuses, and orphans (just reaped).
fn reap(ranks: &mut [Running], on_rank: &dyn Fn(RankEvent)) {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(status @ (WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _))) => {
                if let Some(r) = ranks.iter_mut().find(|r| r.pid == pid) {
                    r.exit = Some(status);
                    r.at = Some(SystemTime::now());
                    let code = match status {
                        WaitStatus::Exited(_, c) => c,
                        WaitStatus::Signaled(_, sig, _) => -(sig as i32),
                        _ => 0,
                    };
                    on_rank(RankEvent::Exited {
                        pid: pid.as_raw(),
                        code,
                    });
                }
            }
            Ok(_) => {}
        }
    }
}

/// Said when a rank failed and others still run: they may take up to the shutdown
/// timeout to stop (ranks blocked in NCCL act on no SIGTERM), and the cause is said
/// only once they have; nothing should look hung meanwhile.
fn say_stopping_others(failures: &[Failure], ranks: &[Running], how: StopHow) {
    let live = ranks.iter().filter(|r| r.exit.is_none()).count();
    let Some(first) = failures.first().filter(|_| live > 0) else {
        return;
    };
    let how_ended = match &first.signal {
        Some(sig) => format!("was killed by {sig}"),
        None => format!("exited with code {}", first.exitcode),
    };
    tracing::warn!(
        "rank {} (local rank {}, pid {}) {how_ended}: stopping the other {live} rank(s) (SIGTERM, SIGKILL after {}s); the cause follows",
        first.rank,
        first.local_rank,
        first.pid,
        how.timeout.as_secs()
    );
}

fn kill_groups(ranks: &[Running], sig: Signal) {
    for r in ranks {
        // ESRCH when the whole group is gone already.
        let _ = killpg(r.pid, sig);
    }
}

/// Waits while the ranks end by themselves, until `until` (the grace after the stop
/// file); true when all ended.
async fn wait_exits(
    ranks: &mut [Running],
    events: &mut Events,
    until: Instant,
    on_rank: &dyn Fn(RankEvent),
) -> bool {
    loop {
        reap(ranks, on_rank);
        if ranks.iter().all(|r| r.exit.is_some()) {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        // A second handled signal during shutdown changes nothing; children wake us.
        let _ =
            tokio::time::timeout(left.min(Duration::from_millis(200)), events.next_child()).await;
    }
}

/// After the grace, sends the plan's signal to every live rank (its main process, or
/// its whole group), waits until the deadline, then SIGKILLs them and whatever is
/// left in their groups.
async fn stop(ranks: &mut [Running], events: &mut Events, plan: Plan, on_rank: &dyn Fn(RankEvent)) {
    let grace_end = (Instant::now() + plan.grace).min(plan.deadline);
    if !wait_exits(ranks, events, grace_end, on_rank).await {
        for r in ranks.iter().filter(|r| r.exit.is_none()) {
            let send = |sig| match plan.group {
                true => killpg(r.pid, sig),
                false => nix::sys::signal::kill(r.pid, sig),
            };
            let _ = send(plan.signal);
            // A stopped rank (SIGSTOP, Ctrl-Z) acts on no signal until continued.
            let _ = send(Signal::SIGCONT);
        }
        if !wait_exits(ranks, events, plan.deadline, on_rank).await {
            let alive: Vec<String> = ranks
                .iter()
                .filter(|r| r.exit.is_none())
                .map(|r| format!("local rank {} (pid {})", r.cmd.local_rank, r.pid))
                .collect();
            tracing::warn!(
                "{} did not stop by the shutdown deadline after {}: sending SIGKILL",
                alive.join(", "),
                plan.signal
            );
            kill_groups(ranks, Signal::SIGKILL);
            while ranks.iter().any(|r| r.exit.is_none()) {
                let _ = tokio::time::timeout(Duration::from_millis(100), events.next_child()).await;
                reap(ranks, on_rank);
            }
        }
    }
    kill_groups(ranks, Signal::SIGKILL);
}
