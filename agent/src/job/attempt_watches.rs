//! What reads an attempt's ranks while they run: the NCCL report of their logs, and
//! the hang watch with the straggler's GPU dumps and what a hang then does.

use crate::job::failure::recorder;
use crate::job::hang::response::{watch_hangs, AfterHang};
use crate::job::hang::watch::{HangReport, LiveRanks, Watcher};
use crate::job::nccl_report::Reporter;
use crate::job::rank_events::Heard;
use crate::job::session::Session;
use crate::job::spec::{Job, NodePlace};
use crate::job::straggler::gpu_dumps::{DumpsPaused, GpuDumps};
use crate::job::straggler::gpu_source::{CounterWindows, GpuSource};
use crate::job::task_guard::AbortOnDrop;
use crate::nccl_counters::CountersFiles;
use crate::status::JobStatus;
use crate::supervise::RankCmd;
use std::collections::BTreeMap;
use std::path::Path;
use tokio::sync::mpsc::UnboundedReceiver;
use toporun_shared::nccl_log::{capture, Capture};

/// The NCCL report of this attempt, when on: the ranks' extra variables and the
/// reporter that reads their logs.
pub(super) fn nccl_reporter(
    p: &Job,
    session: &impl Session,
    node: &NodePlace,
    dir: &Path,
    attempt_dir: &Path,
) -> (BTreeMap<String, String>, Option<Reporter>) {
    match capture(p.watch.nccl_report, &p.nccl_seen_env(), attempt_dir) {
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
            if p.watch.nccl_report && node.round == 0 {
                crate::console::say!("toporun: nccl report off: {why}");
            }
            (BTreeMap::new(), None)
        }
    }
}

/// The attempt's hang watch (its exchange with the other nodes stops with the
/// attempt), fed NCCL's counters where the ranks load toporun's profiler plugin, else
/// the straggler's GPU dumps where the ranks are timed; and what a hang does once
/// reported.
pub(super) fn hang_watch(
    p: &Job,
    session: &impl Session,
    node: &NodePlace,
    (live, heard, cmds): (&LiveRanks, &Heard, &[RankCmd]),
    status: &JobStatus,
    (attempt_dir, fr_dir, counters_dir): (&Path, Option<&Path>, Option<&Path>),
) -> (
    Watcher,
    Vec<AbortOnDrop>,
    UnboundedReceiver<HangReport>,
    AfterHang,
) {
    let tails = cmds
        .iter()
        .map(|c| (c.rank, c.stderr_tail.clone()))
        .collect();
    let dumps_paused = DumpsPaused::default();
    let counters = counters_dir.map(|d| CountersFiles::new(d.to_path_buf()));
    let gpu = match (&counters, p.watch.straggler_window) {
        (Some(files), Some(window)) => Some(GpuSource::Counters(CounterWindows::new(
            files.clone(),
            recorder::dump_every(window),
        ))),
        _ => recorder::gpu_dump_places(
            &p.inherited_env,
            p.recorder_switches(),
            p.watch.straggler_window,
            attempt_dir,
            fr_dir,
        )
        .map(|places| GpuSource::Dumps(GpuDumps::new(places, dumps_paused.clone()))),
    };
    let (watcher, exchange, hangs) = watch_hangs(
        p,
        session,
        node,
        (live, heard.leavers.shared(), tails),
        status,
        (gpu, counters),
    );
    let on_hang = AfterHang {
        root: p.root.clone(),
        watch: p.watch.hang,
        attempt_dir: attempt_dir.to_path_buf(),
        fr_dir: fr_dir.map(Path::to_path_buf),
        store: session.workers_store(),
        ranks: live.clone(),
        monitor_polls: toporun_shared::flight_recorder::monitor_polls(&p.inherited_env),
        dumps_paused,
        watchdog_ends_ranks: crate::job::hang::response::watchdog_ends_ranks(
            p.inherited_env
                .get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
                .map(String::as_str),
        ),
    };
    let exchange = exchange.into_iter().map(AbortOnDrop).collect();
    (watcher, exchange, hangs, on_hang)
}
