//! One attempt of this node's ranks, in the round the rendezvous placed it in: its
//! directories and the ranks' commands (`prepare`), the watches on them, their
//! supervision, and how the attempt ended (a rank's failure, a hang, a stop from
//! another node, a preemption), for the machine to decide what follows.

use crate::job::attempt_timer::{file_timer_fired, timer_expired};
use crate::job::attempt_watches::{hang_watch, nccl_reporter};
use crate::job::counters_dir::CountersDir;
use crate::job::error::JobError;
use crate::job::failure::causes;
use crate::job::failure::recorder::{self, say_flight_recorder};
use crate::job::failure::{heard_stop, rank_failed, Failed};
use crate::job::hang::exchange;
use crate::job::hang::stacks_socket;
use crate::job::hang::watch::{HangReport, LiveRanks, Watcher};
use crate::job::nccl_report::Reporter;
use crate::job::preemption;
use crate::job::rank_events::{Heard, Seen};
use crate::job::ranks::rank_commands;
use crate::job::round_loop::Attempted;
use crate::job::run_dir::RunDir;
use crate::job::session::Session;
use crate::job::spec::{Job, NodePlace, ReportSettings};
use crate::job::transitions::{AttemptEnd, Restarts};
use crate::probe::gpu_events::XidLog;
use crate::probe::memory_cgroup::MemoryCgroup;
use crate::probe::NvmlProbe;
use crate::rendezvous::{StopKind, StopReason};
use crate::status::JobStatus;
use crate::supervise::{self, file_timer::FileTimer, Events, Outcome, RankEvent};
use std::path::{Path, PathBuf};
use std::time::Duration;
use toporun_shared::flight_recorder::dump_dir;
use toporun_shared::nccl_counters::PluginPlaces;
use toporun_shared::rank_env::AttemptPlaces;
use toporun_shared::root_cause::judge::{watchdog_cause, Left};
use toporun_shared::root_cause::CauseKind;

/// What stays the same from one round to the next.
pub(super) struct Life {
    pub(super) status: JobStatus,
    pub(super) timer: Option<FileTimer>,
    pub(super) timer_file: Option<String>,
    pub(super) grace: Duration,
    pub(super) run_dir: Option<RunDir>,
    /// The ranks running now, for the stack readers.
    pub(super) live: LiveRanks,
    /// `toporun stacks`' socket, once the run directory exists.
    pub(super) stacks_socket: Option<stacks_socket::Served>,
    /// The container's memory cgroup (the OOM killer's count), where readable.
    pub(super) memory: Option<MemoryCgroup>,
    /// The node's GPU faults, watched for the whole job.
    pub(super) xids: Option<XidLog>,
    /// NVML's process list, where this node has GPUs (memory released before a
    /// restart).
    pub(super) gpus: Option<NvmlProbe>,
}

/// Says the co-location variables this node's ranks get.
fn say_colocation(node: &NodePlace) {
    if node.extra_env.vars.is_empty() {
        return;
    }
    let vars: Vec<String> = node
        .extra_env
        .vars
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    crate::console::say!(
        "toporun: co-location: {} on this node's ranks: {}",
        vars.join(" "),
        node.extra_env.reason
    );
}

/// The run directory (made at the first round), with this attempt's emptied.
fn attempt_dirs(
    p: &Job,
    life: &mut Life,
    node: &NodePlace,
    restarts: Restarts,
) -> Result<(PathBuf, PathBuf), JobError> {
    let dir = match &life.run_dir {
        Some(d) => d.path.clone(),
        None => life
            .run_dir
            .insert(RunDir::create(p.opts.log_dir.as_deref(), &node.run_id)?)
            .path
            .clone(),
    };
    let attempt_dir = PathBuf::from(p.job_env(node, restarts.used, &dir).attempt_dir);
    // torchrun reuses attempt_<restart count> after a membership change, emptied.
    if attempt_dir.exists() {
        let _ = std::fs::remove_dir_all(&attempt_dir);
    }
    Ok((dir, attempt_dir))
}

/// An attempt's directories, rank commands and what reads their output, before the
/// ranks start.
struct Prepared {
    attempt_dir: PathBuf,
    reporter: Option<Reporter>,
    fr_dir: Option<PathBuf>,
    stop_file: preemption::StopFile,
    cmds: Vec<crate::supervise::RankCmd>,
    /// The ranks' NCCL counters, on /dev/shm, where they load toporun's plugin.
    counters: Option<CountersDir>,
    /// The attempt directory if unused, the stop file: removed when the attempt ends.
    _left_at_end: (crate::job::run_dir::UnusedRemoved, preemption::RemovedAtEnd),
}

fn prepare(
    p: &Job,
    life: &mut Life,
    session: &impl Session,
    node: &NodePlace,
    restarts: Restarts,
) -> Result<Prepared, JobError> {
    let (dir, attempt_dir) = attempt_dirs(p, life, node, restarts)?;
    report_place(&life.status, node, &dir);
    let unused_removed = crate::job::run_dir::UnusedRemoved(attempt_dir.clone());
    serve_stacks(p, life, &dir);
    say_colocation(node);
    if node.round == 0 && restarts.used == 0 && p.gpu_of(0).is_some() {
        crate::console::say!("toporun: {}", p.watch.nccl_profiler.line());
        if p.profiler_plugin().is_none() {
            let timing = crate::job::failure::recorder::gpu_timing_line(p, &attempt_dir);
            crate::console::say!("toporun: GPU timing: {timing}");
        }
    }
    let (report_env, reporter) = nccl_reporter(p, session, node, &dir, &attempt_dir);
    let stop_file = preemption::StopFile::armed(&p.stop, &dir);
    let user = &p.inherited_env;
    let sw = p.rank_switches();
    let first = node.round == 0 && restarts.used == 0;
    let counters_at = (dir.as_path(), attempt_dir.as_path());
    let counters = CountersDir::make(p, counters_at, restarts.used, node.places.len(), first);
    let places = AttemptPlaces {
        attempt_dir: &attempt_dir,
        stop_file: stop_file.path(),
        timer_file: life.timer_file.clone(),
        cache_home: recorder::prepare_dumps(user, sw.recorder, &dir, &attempt_dir, node.round == 0),
        profiler: p
            .profiler_plugin()
            .zip(counters.as_ref())
            .map(|(plugin, c)| PluginPlaces {
                plugin,
                counters: c.path(),
            }),
    };
    let cmds = rank_commands(p, node, (restarts.used, &dir), &places, &report_env)?;
    Ok(Prepared {
        counters,
        fr_dir: dump_dir(user, sw.recorder.on, &attempt_dir),
        _left_at_end: (unused_removed, preemption::RemovedAtEnd(stop_file.clone())),
        attempt_dir,
        reporter,
        stop_file,
        cmds,
    })
}

/// One attempt of this node's ranks in the round `node` placed it in, and what the
/// rendezvous said about its end.
pub(super) async fn attempt(
    p: &Job,
    life: &mut Life,
    session: &mut impl Session,
    node: &NodePlace,
    restarts: Restarts,
    events: &mut Events,
) -> Result<Attempted, JobError> {
    let (round, status) = (node.round, life.status.clone());
    let Prepared {
        attempt_dir,
        mut reporter,
        fr_dir,
        stop_file,
        cmds,
        counters,
        _left_at_end,
    } = prepare(p, life, session, node, restarts)?;
    let announce = session.announcer(round).await;
    let stop = session.stop_watch(round, node).await?;
    let world = node.places.first().map_or(0, |r| r.world_size);
    let init_watch = session.watch_init(world, life.grace);
    let live = life.live.clone();
    let hangs_before = status.snapshot().hangs;
    let memory = causes::memory_at_start(&p.root, life.memory.as_ref());
    let heard = Heard::default();
    let counters_dir = counters.as_ref().map(CountersDir::path);
    let place = (attempt_dir.as_path(), fr_dir.as_deref(), counters_dir);
    let (watcher, _exchange, hangs, on_hang) =
        hang_watch(p, session, node, (&live, &heard, &cmds), &status, place);
    let timer = &mut life.timer;
    let dumps_paused = on_hang.dumps_paused.clone();
    let notice = preemption::notice(
        p.stop.watch_preemption.clone(),
        (node, &p.facts.container.hostname),
        announce.clone(),
    );
    let judged = &watcher;
    let stop = async move {
        tokio::select! {
            r = stop => AttemptStop::rendezvous(judged, r),
            r = timer_expired(timer) => AttemptStop::Rendezvous(r),
            r = on_hang.events(hangs) => AttemptStop::hang(judged, r),
            r = notice => AttemptStop::Rendezvous(r),
        }
    };
    let seen = Seen {
        p,
        node,
        status: &status,
        live: &live,
        watcher: &watcher,
        stop_file: &stop_file,
        announce,
        heard,
    };
    let on_rank = |e: RankEvent| seen.on(e);
    let outcome = supervise::run_attempt(cmds, events, p.stop_how(), stop, &on_rank)
        .await
        .map_err(|e| JobError::failed("supervising the ranks", e))?;
    if let Some(w) = init_watch {
        w.abort();
    }
    // The dumps the ranks leave now are the failure's or the stop's.
    dumps_paused.pause();
    if let Some(e) = life.timer.as_mut().and_then(|t| t.fired.take()) {
        let end = file_timer_fired(session, node, &outcome, e).await;
        return Ok(Attempted { end, report: None });
    }
    if let Some(r) = reporter.as_mut() {
        r.finish().await;
    }
    let end = match outcome {
        Outcome::Succeeded => AttemptEnd::Succeeded {
            barrier: session.finish(round, node).await?,
        },
        Outcome::Interrupted(sig) => {
            let won = session.stop_all(round, seen.our_preemption(sig)).await;
            crate::console::say!("toporun: stopped the ranks after {sig}");
            preempted(&p.report, &won, &seen.heard.ending, &status);
            AttemptEnd::Stopped(won)
        }
        Outcome::Failed(failures) => {
            let pids: Vec<i32> = failures.iter().map(|f| f.pid).collect();
            seen.say_where_the_others_stood(&pids);
            let failed = Failed {
                failures: &failures,
                left: &seen.heard.leavers.list(),
                last_seen: &watcher.last_seen(),
                writing: &watcher.writing(),
                ports: &watcher.ports(),
                fr_dir: fr_dir.as_deref(),
                attempt_dir: &attempt_dir,
                memory,
                xids: life.xids.as_ref(),
                gpus: life.gpus.as_ref(),
            };
            let reporter = reporter.as_ref();
            let (end, report) =
                rank_failed(p, session, node, restarts, reporter, failed, &life.status).await;
            return Ok(Attempted { end, report });
        }
        Outcome::Stopped(AttemptStop::Rendezvous(reason)) => {
            // Stopped for a hang before this node read the view: it prints it too.
            let unseen_hang = status.snapshot().hangs == hangs_before;
            let place = (fr_dir.as_deref(), attempt_dir.as_path());
            stopped_by_others(session, node, &reason, unseen_hang, place, &status).await;
            preempted(&p.report, &reason, &seen.heard.ending, &status);
            AttemptEnd::Stopped(reason)
        }
        Outcome::Stopped(AttemptStop::Hang(report)) => {
            let place = (fr_dir.as_deref(), attempt_dir.as_path());
            let left = seen.heard.leavers.list();
            hang_stopped(&p.report, session, node, (&report, &left), place, &status).await
        }
    };
    Ok(Attempted { end, report: None })
}

/// The status says which round this node runs, and where (a spare reports the round
/// it joined).
fn report_place(status: &JobStatus, node: &NodePlace, run_dir: &Path) {
    status.update(|x| {
        x.round = Some(node.round);
        x.run_id = node.run_id.clone();
        x.network = node.network.as_deref().cloned();
    });
    if let Some(r) = &node.network {
        crate::job::run_dir::write_json(&run_dir.join("network-check.json"), r.as_ref());
    }
    status.placed(node.node_rank, node.nnodes);
}

/// Another node, or the keep-alives, stopped the round: its cause is said here, and a
/// hang this node had not seen decided is printed from the job-wide view.
async fn stopped_by_others(
    session: &mut impl Session,
    node: &NodePlace,
    reason: &StopReason,
    unseen_hang: bool,
    place: (Option<&Path>, &Path),
    status: &JobStatus,
) {
    if reason.kind == StopKind::Hang && unseen_hang {
        if let Some(m) = session.meeting(node.round, node) {
            exchange::print_decided(&m).await;
        }
    }
    heard_stop(session, node, reason, "", place, status).await;
}

/// `--on-hang stop`, or NCCL's watchdog, ended this node's attempt: every node is
/// told, the flight recorder read, the hang said in the termination message (and,
/// after the watchdog, as the root cause, as when the rank it stopped dies of it).
async fn hang_stopped(
    report_to: &ReportSettings,
    session: &mut impl Session,
    node: &NodePlace,
    (report, left): (&HangReport, &[Left]),
    (fr_dir, attempt_dir): (Option<&Path>, &Path),
    status: &JobStatus,
) -> AttemptEnd {
    let why = match &report.watchdog {
        Some((victim, w)) => format!(
            "NCCL's watchdog stopped rank {victim} in {}: {}",
            w.what(),
            report.hang.headline
        ),
        None => format!(
            "no rank made progress for --hang-timeout: {}",
            report.hang.headline
        ),
    };
    session
        .stop_all(node.round, StopReason::new(StopKind::Hang, why))
        .await;
    let meeting = session.meeting(node.round, node);
    let collective = say_flight_recorder(fr_dir, meeting, attempt_dir, status).await;
    let mut lead = format!("toporun: hang: {}\n", report.hang.headline);
    match collective {
        // No rank stood apart in the stacks: the collective that did not match is
        // the cause, said last on the console and first in the message.
        Some(c) if report.hang.odd.is_empty() => {
            crate::console::say!("toporun: hang: cause: {c}");
            lead = format!("toporun: hang: cause: {c}\n{lead}");
        }
        Some(c) => lead.push_str(&format!("toporun: flight recorder: {c}\n")),
        None => {}
    }
    if let Some((victim, w)) = &report.watchdog {
        let cause = watchdog_cause(*victim, w, Some(&report.hang.headline), left);
        crate::console::say!("{}", cause.line());
        lead = format!("{}\n{lead}", cause.line());
        status.update(|x| x.root_cause = Some(CauseKind::Hang));
    }
    supervise::leave_termination_message(
        report_to.termination_log.as_deref(),
        &(lead + &report.text),
    );
    AttemptEnd::Hang {
        by_watchdog: report.watchdog.is_some(),
    }
}

/// Serves `toporun stacks` from the run directory, once per job.
fn serve_stacks(p: &Job, life: &mut Life, dir: &Path) {
    if life.stacks_socket.is_some() {
        return;
    }
    match stacks_socket::serve(p.root.clone(), dir, life.live.clone(), life.status.clone()) {
        Ok(s) => life.stacks_socket = Some(s),
        Err(e) => {
            crate::console::say_warning!("no `toporun stacks` socket in {}: {e}", dir.display())
        }
    }
}

/// What stopped an attempt from outside its ranks.
enum AttemptStop {
    /// Another node, the keep-alive check or the file timer.
    Rendezvous(StopReason),
    /// `--on-hang stop`, with the hang report.
    Hang(HangReport),
}

impl AttemptStop {
    /// The ranks stop for this hang: a second report while they go (a rank slow to
    /// die reads as "every rank stands at the same place") would only mislead.
    fn hang(watcher: &Watcher, r: HangReport) -> AttemptStop {
        watcher.stop_judging();
        AttemptStop::Hang(r)
    }

    /// The same for any stop the store said (another node's hang, a rank failed on
    /// another node, a node lost, a preemption): the ranks here stop for that cause,
    /// and those blocked in NCCL waiting for a peer gone would read as a new hang
    /// while they wait out the shutdown (Lightning on two nodes: a hang said 15 s
    /// after node 1's rank exited, while node 0 stopped its rank).
    fn rendezvous(watcher: &Watcher, r: StopReason) -> AttemptStop {
        watcher.stop_judging();
        AttemptStop::Rendezvous(r)
    }
}

impl supervise::StopRequest for AttemptStop {
    fn spent(&self) -> Duration {
        match self {
            AttemptStop::Rendezvous(r) => preemption::spent(r),
            AttemptStop::Hang(_) => Duration::ZERO,
        }
    }

    fn graceful(&self) -> bool {
        matches!(self, AttemptStop::Rendezvous(r) if r.kind == StopKind::Preempt)
    }

    /// Ranks hung in NCCL wait in C, where no signal handler runs, and a handler that
    /// does run waits on the same peers (Lightning's SIGTERM handler broadcasts to
    /// them: a Lightning job whose DataLoader worker died exited 30 s after its hang
    /// report on 2x H200): SIGKILL follows soon.
    fn deadline(&self) -> Option<Duration> {
        match self {
            AttemptStop::Hang(_) => Some(HANG_STOP_DEADLINE),
            AttemptStop::Rendezvous(r) if r.kind == StopKind::Hang => Some(HANG_STOP_DEADLINE),
            _ => None,
        }
    }
}

/// From SIGTERM to SIGKILL when `--on-hang stop` ends a hung attempt.
pub const HANG_STOP_DEADLINE: Duration = Duration::from_secs(5);

/// A preempted attempt's end, said on stderr, in the termination message and in
/// `/status` (root cause `preempted`).
pub(super) fn preempted(
    report: &ReportSettings,
    reason: &StopReason,
    ending: &preemption::Ending,
    status: &JobStatus,
) {
    if reason.kind != StopKind::Preempt {
        return;
    }
    let text = ending.message(reason);
    crate::console::say!("toporun: {text}");
    let log = report.termination_log.as_deref();
    supervise::leave_termination_message(log, &format!("toporun: {text}"));
    status.update(|x| {
        x.root_cause = Some(CauseKind::Preempted);
        x.last_failure = Some(reason.to_string());
    });
}

impl std::fmt::Display for AttemptStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttemptStop::Rendezvous(r) => write!(f, "{r}"),
            AttemptStop::Hang(r) if r.watchdog.is_some() => {
                write!(f, "NCCL's watchdog timed a collective out")
            }
            AttemptStop::Hang(_) => write!(f, "a hang (--on-hang stop)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervise::StopRequest;

    /// A hang decided on another node arrives as the store's stop: this node stops
    /// judging (a rank slow to die would read as a new hang) and SIGKILLs 5 s after
    /// SIGTERM, as for its own hang. Any other stop also ends the judging (the ranks
    /// stop for that cause) and keeps the whole shutdown deadline.
    #[test]
    fn a_stop_from_the_store_ends_judging_and_only_a_hang_kills_after_five_seconds() {
        let w = Watcher::idle();
        let stop = AttemptStop::rendezvous(&w, StopReason::new(StopKind::Hang, "rank 3 hangs"));
        assert!(!w.judging());
        assert_eq!(stop.deadline(), Some(HANG_STOP_DEADLINE));
        let others = [
            StopKind::Fail,
            StopKind::Restart,
            StopKind::Membership,
            StopKind::Preempt,
        ];
        for kind in others {
            let w = Watcher::idle();
            let stop = AttemptStop::rendezvous(&w, StopReason::new(kind, "a rank failed"));
            assert!(!w.judging(), "{kind:?}");
            assert_eq!(stop.deadline(), None, "{kind:?}");
        }
    }
}
