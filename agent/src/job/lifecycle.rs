//! A job's life on this node: host or join the rendezvous, then round after round
//! start the local ranks, supervise them, report NCCL, and restart, stop or finish
//! with the other nodes, the way torchrun's elastic agent does.

use crate::job::attempt::{attempt, preempted, Life};
use crate::job::attempt_timer::file_timer;
use crate::job::entry::Entered;
use crate::job::error::JobError;
use crate::job::failure::causes;
use crate::job::failure::gpus_released;
use crate::job::hang::stacks_socket;
use crate::job::hang::watch::LiveRanks;
use crate::job::preemption;
use crate::job::round_loop::{self, Attempted, Host};
use crate::job::session::{Session, Started};
use crate::job::spec::{Job, NodePlace, ReportSettings};
use crate::job::task_guard::AbortOnDrop;
use crate::job::transitions::{signal_before_round, AttemptEnd, Exit, Machine, Restarts};
use crate::probe::memory_cgroup::MemoryCgroup;
use crate::probe::NvmlProbe;
use crate::status::JobStatus;
use crate::supervise::{self, file_timer::FileTimer, Events};
use nix::sys::signal::Signal;
use std::sync::PoisonError;
use std::time::Duration;
use toporun_shared::root_cause::Cause;

/// The status endpoint, when asked for: never a reason for the job to fail (a port
/// already taken is said, and the job runs without it).
fn status_endpoint(p: &Job) -> JobStatus {
    let status = JobStatus::new("", p.nproc);
    if let Some(port) = p.report.status_port {
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
fn status_beat(
    report: &ReportSettings,
    status: &JobStatus,
    session: &impl Session,
) -> Option<AbortOnDrop> {
    report.status_port?;
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

/// Runs the job to its end on this node; the exit code torchrun would give.
pub async fn run(p: &Job, events: &mut Events) -> Result<u8, JobError> {
    let status = status_endpoint(p);
    let timer = file_timer(&p.file_timer)?;
    let timer_file: Option<String> = timer
        .as_ref()
        .map(|t| t.path().display().to_string())
        .or_else(|| Some(p.file_timer.path.as_ref()?.display().to_string()));
    let Some(started) = Started::start(p, events).await? else {
        crate::console::say!(
            "toporun: received a signal while connecting to the rendezvous; exiting"
        );
        return Ok(signal_before_round(p.report.classified));
    };
    match started {
        Started::Single(s) => run_with(p, events, status, timer, timer_file, s).await,
        Started::Multi(m) => run_with(p, events, status, timer, timer_file, *m).await,
    }
}

/// The job on this node, with the session it started.
async fn run_with(
    p: &Job,
    events: &mut Events,
    status: JobStatus,
    timer: Option<FileTimer>,
    timer_file: Option<String>,
    session: impl Session,
) -> Result<u8, JobError> {
    let _beat = status_beat(&p.report, &status, &session);
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
        grace: p.watch.init_grace,
        run_dir: None,
        live,
        stacks_socket: None,
        memory: MemoryCgroup::find(&p.root),
        xids: causes::watch_xids(
            p.watch.xid_replay.as_deref(),
            !p.facts.gpus.devices.is_empty(),
        )?,
        gpus: (!p.facts.gpus.devices.is_empty()).then_some(NvmlProbe),
    };
    let machine = Machine::new(
        p.opts.max_restarts,
        p.report.classified,
        life.gpus.is_some(),
    );
    let mut node = LiveNode {
        p,
        life,
        session,
        events,
    };
    round_loop::drive(&mut node, machine).await
}

/// This node as the round loop's host: the rendezvous, the ranks, the GPUs.
struct LiveNode<'a, S> {
    p: &'a Job,
    life: Life,
    session: S,
    events: &'a mut Events,
}

impl<S: Session> Host for LiveNode<'_, S> {
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
        preempted(&self.p.report, &won, &ending, &self.life.status);
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
            report.write(
                &self.p.opts.entrypoint,
                &self.p.facts.container.hostname,
                &self.p.report,
            );
        }
        if let Some(cause) = &exit.cause {
            crate::console::say!("{}", cause.line());
            let log = self.p.report.termination_log.as_deref();
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
