//! A job's life on this node: host or join the rendezvous, then round after round
//! start the local ranks, supervise them, report NCCL, and restart, stop or finish
//! with the other nodes, the way torchrun's elastic agent does.

use crate::job::entry::Entered;
use crate::job::error::JobError;
use crate::job::failure::causes;
use crate::job::failure::recorder::{self, flight_recorder_env, say_flight_recorder};
use crate::job::failure::{gpus_released, heard_stop, rank_failed, Failed};
use crate::job::hang::exchange;
use crate::job::hang::response::{watch_hangs, AfterHang};
use crate::job::hang::stacks_socket;
use crate::job::hang::watch::{HangReport, LiveRanks};
use crate::job::nccl_report::{self, Capture, Reporter};
use crate::job::preemption;
use crate::job::rank_events::{Heard, Seen};
use crate::job::ranks::rank_commands;
use crate::job::round_loop::{self, Attempted, Host};
use crate::job::run_dir::RunDir;
use crate::job::session::Session;
use crate::job::spec::{Job, NodePlace};
use crate::job::straggler::gpu_dumps::{DumpsPaused, GpuDumps};
use crate::job::transitions::{signal_before_round, AttemptEnd, Exit, Machine, Restarts};
use crate::paths::random_id;
use crate::probe::gpu_events::XidLog;
use crate::probe::memory_cgroup::MemoryCgroup;
use crate::probe::NvmlProbe;
use crate::rendezvous::{StopKind, StopReason};
use crate::status::JobStatus;
use crate::supervise::{self, file_timer::FileTimer, Events, Outcome, RankEvent};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::PoisonError;
use std::time::Duration;
use toporun_shared::root_cause::{Cause, CauseKind};

/// torch's FileTimerServer when `TORCHELASTIC_ENABLE_FILE_TIMER=1`.
fn file_timer(p: &Job) -> Result<Option<FileTimer>, JobError> {
    if !p.file_timer.serve {
        return Ok(None);
    }
    let path =
        p.file_timer.path.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("watchdog_timer_{}", random_id()))
        });
    FileTimer::create(&path)
        .map(Some)
        .map_err(|e| JobError::failed("TORCHELASTIC_ENABLE_FILE_TIMER=1", e))
}

/// The status endpoint, when asked for: never a reason for the job to fail (a port
/// already taken is said, and the job runs without it).
fn status_endpoint(p: &Job) -> JobStatus {
    let status = JobStatus::new("", p.nproc);
    if let Some(port) = p.status_port {
        let mut by_severity = std::collections::BTreeMap::new();
        for f in p.findings() {
            *by_severity.entry(f.severity.to_string()).or_insert(0) += 1;
        }
        status.update(|s| {
            s.findings_by_severity = by_severity;
            s.nodes_expected = p.opts.nnodes_max;
        });
        match crate::status::serve(port, status.clone()) {
            Ok(addr) => crate::console::say!(
                "toporun: status endpoint on port {}: /healthz /readyz /metrics /status",
                addr.port()
            ),
            Err(e) => crate::console::say_warning!(
                "no status endpoint: cannot listen on port {port} ({e}); the job runs without it"
            ),
        }
    }
    status
}

/// The supervisor's heartbeat and the store's counters, for the endpoint.
fn status_beat(p: &Job, status: &JobStatus, session: &Session) -> Option<AbortOnDrop> {
    p.status_port?;
    let (status, store) = (status.clone(), session.store());
    Some(AbortOnDrop(tokio::spawn(async move {
        loop {
            status.beat();
            if let Some(s) = &store {
                let (c, o) = (s.connections(), s.ops());
                status.update(|x| {
                    x.store_connections = c;
                    x.store_operations = o;
                });
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })))
}

/// What stays the same from one round to the next.
struct Life {
    status: JobStatus,
    timer: Option<FileTimer>,
    timer_file: Option<String>,
    grace: Duration,
    run_dir: Option<RunDir>,
    /// The ranks running now, for the stack readers.
    live: LiveRanks,
    /// `toporun stacks`' socket, once the run directory exists.
    stacks_socket: Option<stacks_socket::Served>,
    /// The container's memory cgroup (the OOM killer's count), where readable.
    memory: Option<MemoryCgroup>,
    /// The node's GPU faults, watched for the whole job.
    xids: Option<XidLog>,
    /// NVML's process list, where this node has GPUs (memory released before a
    /// restart).
    gpus: Option<NvmlProbe>,
}

/// Runs the job to its end on this node; the exit code torchrun would give.
pub async fn run(p: &Job, events: &mut Events) -> Result<u8, JobError> {
    let status = status_endpoint(p);
    let timer = file_timer(p)?;
    let timer_file: Option<String> = timer
        .as_ref()
        .map(|t| t.path().display().to_string())
        .or_else(|| Some(p.file_timer.path.as_ref()?.display().to_string()));
    let Some(session) = Session::start(p, events).await? else {
        crate::console::say!(
            "toporun: received a signal while connecting to the rendezvous; exiting"
        );
        return Ok(signal_before_round(p.classified));
    };
    let _beat = status_beat(p, &status, &session);
    let live = LiveRanks::default();
    let (ranks, root) = (live.clone(), p.root.clone());
    status.set_stacks(std::sync::Arc::new(move |json| {
        let now = ranks.lock().unwrap_or_else(PoisonError::into_inner).clone();
        stacks_socket::answer(&root, &now, json)
    }));
    let life = Life {
        status,
        timer,
        timer_file,
        grace: p.init_grace,
        run_dir: None,
        live,
        stacks_socket: None,
        memory: MemoryCgroup::find(&p.root),
        xids: causes::watch_xids(p)?,
        gpus: (!p.facts.gpus.devices.is_empty()).then_some(NvmlProbe),
    };
    let machine = Machine::new(p.opts.max_restarts, p.classified, life.gpus.is_some());
    let mut node = LiveNode {
        p,
        life,
        session,
        events,
    };
    round_loop::drive(&mut node, machine).await
}

/// This node as the round loop's host: the rendezvous, the ranks, the GPUs.
struct LiveNode<'a> {
    p: &'a Job,
    life: Life,
    session: Session,
    events: &'a mut Events,
}

impl Host for LiveNode<'_> {
    fn round_begins(&mut self, min_round: u32, restarts: Restarts) {
        self.life.status.round(min_round, restarts.used);
    }

    async fn join(&mut self, min_round: u32) -> Result<Entered, JobError> {
        self.session.join(self.p, min_round, self.events).await
    }

    fn pending_signal(&mut self) -> Option<Signal> {
        self.events.pending_signal()
    }

    async fn attempt(
        &mut self,
        node: &NodePlace,
        restarts: Restarts,
    ) -> Result<Attempted, JobError> {
        let (p, events) = (self.p, &mut *self.events);
        attempt(p, &mut self.life, &mut self.session, node, restarts, events).await
    }

    async fn stopped_before_start(&mut self, node: &NodePlace, signal: Signal) -> Attempted {
        let host = &self.p.facts.container.hostname;
        let ours = preemption::reason(signal, node.node_rank, host, preemption::now_ms());
        let won = self.session.stop_all(node.round, ours).await;
        let ending = preemption::Ending::default();
        preempted(self.p, &won, &ending, &self.life.status);
        Attempted {
            end: AttemptEnd::Stopped(won),
            report: None,
        }
    }

    async fn gpus_released(&mut self) -> Option<Cause> {
        gpus_released(&self.p.root, self.life.gpus.as_ref()).await
    }

    fn say(&mut self, line: &str) {
        crate::console::say!("toporun: {line}");
    }

    async fn exit(&mut self, node: &NodePlace, exit: &Exit, attempted: &Attempted) {
        if let Some(say) = &exit.say {
            crate::console::say!("toporun: {say}");
        }
        if let (true, Some(report)) = (exit.summary, &attempted.report) {
            report.write(self.p);
        }
        if let Some(cause) = &exit.cause {
            crate::console::say!("{}", cause.line());
            let log = self.p.termination_log.as_deref();
            supervise::leave_termination_message(log, &cause.line());
            self.life.status.update(|x| {
                x.root_cause = Some(cause.kind);
                x.causes = vec![cause.clone()];
            });
        }
        // The others still alive hear why, whichever node asked for the stop (the
        // store's host itself, when its keep-alive watch lost a node).
        if let Some(lost) = exit.linger {
            self.session.linger(node, lost).await;
        }
    }
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

/// The NCCL report of this attempt, when on: the ranks' extra variables and the
/// reporter that reads their logs.
fn nccl_reporter(
    p: &Job,
    session: &Session,
    node: &NodePlace,
    dir: &Path,
    attempt_dir: &Path,
) -> (BTreeMap<String, String>, Option<Reporter>) {
    match nccl_report::capture(p, attempt_dir) {
        Capture::Files {
            dir: ndir,
            prefix,
            env,
        } => {
            let store = session.report_store(node.round, node);
            (
                env,
                Some(Reporter::start(p, &ndir, &prefix, p.nproc, dir, store)),
            )
        }
        Capture::Off(why) => {
            if p.nccl_report && node.round == 0 {
                crate::console::say!("toporun: nccl report off: {why}");
            }
            (BTreeMap::new(), None)
        }
    }
}

/// One attempt of this node's ranks in the round `node` placed it in, and what the
/// rendezvous said about its end.
async fn attempt(
    p: &Job,
    life: &mut Life,
    session: &mut Session,
    node: &NodePlace,
    restarts: Restarts,
    events: &mut Events,
) -> Result<Attempted, JobError> {
    let (round, status) = (node.round, life.status.clone());
    report_place(&status, node);
    let (dir, attempt_dir) = attempt_dirs(p, life, node, restarts)?;
    let _unused_removed = crate::job::run_dir::UnusedRemoved(attempt_dir.clone());
    serve_stacks(p, life, &dir);
    say_colocation(node);
    let (mut report_env, mut reporter) = nccl_reporter(p, session, node, &dir, &attempt_dir);
    if let Some(f) = &life.timer_file {
        report_env.insert("TORCHELASTIC_TIMER_FILE".into(), f.clone());
    }
    let fr_dir = flight_recorder_env(p, &dir, &attempt_dir, &mut report_env, round == 0);
    let stop_file = preemption::StopFile::armed(p, &dir, &mut report_env);
    let _stop_file_removed = preemption::RemovedAtEnd(stop_file.clone());
    let announce = session.announcer(round).await;
    let cmds = rank_commands(p, node, &dir, restarts.used, &report_env)?;
    let stop = session.stop_watch(round, node).await?;
    let world = node.places.first().map_or(0, |r| r.world_size);
    let init_watch = session.watch_init(world, life.grace);
    let live = life.live.clone();
    let hangs_before = status.snapshot().hangs;
    let memory = causes::memory_at_start(&p.root, life.memory.as_ref());
    let heard = Heard::default();
    let tails = cmds
        .iter()
        .map(|c| (c.rank, c.stderr_tail.clone()))
        .collect();
    let dumps_paused = DumpsPaused::default();
    let gpu_dumps = recorder::gpu_dump_places(p, &attempt_dir, fr_dir.as_deref())
        .map(|places| GpuDumps::new(places, dumps_paused.clone()));
    let (watcher, exchange, hangs) = watch_hangs(
        p,
        session,
        node,
        (&live, heard.leavers.shared(), tails),
        &status,
        gpu_dumps,
    );
    let _exchange: Vec<AbortOnDrop> = exchange.into_iter().map(AbortOnDrop).collect();
    let timer = &mut life.timer;
    let on_hang = AfterHang {
        root: p.root.clone(),
        watch: p.hang,
        attempt_dir: attempt_dir.clone(),
        fr_dir: fr_dir.clone(),
        store: session.workers_store(),
        ranks: live.clone(),
        monitor_polls: recorder::monitor_polls(p),
        dumps_paused: dumps_paused.clone(),
    };
    let notice = preemption::notice(p, node, announce.clone());
    let stop = async move {
        tokio::select! {
            r = stop => AttemptStop::Rendezvous(r),
            r = timer_expired(timer) => AttemptStop::Rendezvous(r),
            r = on_hang.events(hangs) => AttemptStop::Hang(r),
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
            preempted(p, &won, &seen.heard.ending, &status);
            AttemptEnd::Stopped(won)
        }
        Outcome::Failed(failures) => {
            seen.say_where_the_others_stood();
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
            preempted(p, &reason, &seen.heard.ending, &status);
            AttemptEnd::Stopped(reason)
        }
        Outcome::Stopped(AttemptStop::Hang(report)) => {
            let place = (fr_dir.as_deref(), attempt_dir.as_path());
            hang_stopped(p, session, node, &report, place, &status).await
        }
    };
    Ok(Attempted { end, report: None })
}

/// The status says which round this node runs, and where (a spare reports the round
/// it joined).
fn report_place(status: &JobStatus, node: &NodePlace) {
    status.update(|x| {
        x.round = Some(node.round);
        x.run_id = node.run_id.clone();
    });
    status.placed(node.node_rank, node.nnodes);
}

/// Another node, or the keep-alives, stopped the round: its cause is said here, and a
/// hang this node had not seen decided is printed from the job-wide view.
async fn stopped_by_others(
    session: &mut Session,
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

/// `--on-hang stop` ended this node's attempt: every node is told, the flight
/// recorder read, the hang said in the termination message.
async fn hang_stopped(
    p: &Job,
    session: &mut Session,
    node: &NodePlace,
    report: &HangReport,
    (fr_dir, attempt_dir): (Option<&Path>, &Path),
    status: &JobStatus,
) -> AttemptEnd {
    let why = format!(
        "no rank made progress for --hang-timeout: {}",
        report.hang.headline
    );
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
    supervise::leave_termination_message(p.termination_log.as_deref(), &(lead + &report.text));
    AttemptEnd::Hang
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
}

/// A preempted attempt's end, said on stderr, in the termination message and in
/// `/status` (root cause `preempted`).
fn preempted(p: &Job, reason: &StopReason, ending: &preemption::Ending, status: &JobStatus) {
    if reason.kind != StopKind::Preempt {
        return;
    }
    let text = ending.message(reason);
    crate::console::say!("toporun: {text}");
    let log = p.termination_log.as_deref();
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
            AttemptStop::Hang(_) => write!(f, "a hang (--on-hang stop)"),
        }
    }
}

/// The file timer's expiry as a stop reason (never, without a timer).
async fn timer_expired(timer: &mut Option<FileTimer>) -> StopReason {
    match timer.as_mut() {
        Some(t) => {
            let e = t.expired().await;
            // The killed rank's exit normally ends the attempt first (and names its
            // rank); a pid that is no rank of ours stops it here.
            tokio::time::sleep(Duration::from_secs(2)).await;
            StopReason::fail(format!(
                "the file timer of pid {} (scope {}) expired",
                e.pid, e.scope_id
            ))
        }
        None => std::future::pending().await,
    }
}

/// torchrun's FileTimerServer kills the worker, then its own agent with the same
/// signal: no restart, exit 128 + signal.
async fn file_timer_fired(
    session: &mut Session,
    node: &NodePlace,
    outcome: &Outcome<AttemptStop>,
    e: supervise::file_timer::Expired,
) -> AttemptEnd {
    let who = match outcome {
        Outcome::Failed(fs) => fs.iter().find(|f| f.pid == e.pid).map(|f| {
            format!(
                "rank {} (local rank {}, pid {})",
                f.rank, f.local_rank, f.pid
            )
        }),
        _ => None,
    }
    .unwrap_or_else(|| format!("pid {}", e.pid));
    let sig = Signal::try_from(e.signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| e.signal.to_string());
    crate::console::say!("toporun: file timer: scope '{}' of {who} expired {:.1}s ago; killed it with {sig} and stopped every rank, as torchrun's FileTimerServer does", e.scope_id, e.overrun.as_secs_f64());
    let why = format!("file timer expired on node {}", node.node_rank);
    session.stop_all(node.round, StopReason::fail(why)).await;
    AttemptEnd::FileTimer { signal: e.signal }
}

/// Aborts a background task when the job ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
