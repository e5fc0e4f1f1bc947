//! What a hang leads to on this node: sampling and the job-wide decision started for
//! the attempt, each hang recorded in the attempt directory (hang.json), and under
//! `--on-hang stop` the ranks' flight-recorder dumps asked for before they are
//! stopped.

use crate::job::failure::causes::LeftRanks;
use crate::job::hang::exchange;
use crate::job::hang::node_sample::NodeSample;
use crate::job::hang::watch::{self, Decide, HangReport, LiveRanks, Sink};
use crate::job::run_dir::write_json;
use crate::job::session::Session;
use crate::job::spec::{HangWatch, Job, NodePlace};
use crate::job::straggler;
use crate::job::straggler::gpu_dumps::DumpsPaused;
use crate::job::straggler::gpu_source::GpuSource;
use crate::job::straggler::link_watch::LinkWatch;
use crate::job::straggler::tracker::{Decide as StragglerDecide, NodeSeat, Tracker};
use crate::nccl_counters::CountersFiles;
use crate::paths::Root;
use crate::stacks::{has_thread, NCCL_MONITOR_THREAD};
use crate::status::JobStatus;
use crate::store::StoreServer;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use toporun_shared::flight_recorder::LinkModel;
use toporun_shared::link_reference;

/// Starts sampling the ranks and, on several nodes, the job-wide hang
/// (--hang-timeout) and straggler decisions; the hangs found come on the receiver.
pub fn watch_hangs(
    p: &Job,
    session: &impl Session,
    node: &NodePlace,
    (live, left, tails): (&LiveRanks, LeftRanks, watch::RankTails),
    status: &JobStatus,
    (gpu, counters): (Option<GpuSource>, Option<CountersFiles>),
) -> (
    watch::Watcher,
    Vec<tokio::task::JoinHandle<()>>,
    mpsc::UnboundedReceiver<HangReport>,
) {
    let counted = status.clone();
    let (sink, hangs) = Sink::new(move |r: &HangReport| {
        counted.update(|x| {
            x.hangs += 1;
            x.last_hang = Some(r.text.clone());
        })
    });
    let mut tasks = Vec::new();
    let decide = match p.watch.hang.zip(session.meeting(node.round, node)) {
        Some((w, x)) => {
            let (tx, rx) = tokio::sync::watch::channel(NodeSample::default());
            let host = p.facts.container.hostname.clone();
            tasks.push(exchange::start(x, host, w, rx, sink.clone()));
            Decide::Publish(tx)
        }
        None => Decide::Here,
    };
    let tracker = p.watch.straggler_window.map(|span| {
        let (t, task) = straggler_tracker(p, session, node, status, span);
        tasks.extend(task);
        let links = gpu.as_ref().and_then(|_| link_watch(p, node));
        t.with_gpu(gpu, links)
    });
    (
        watch::start(
            p.root.clone(),
            (live.clone(), left, tails),
            p.watch.hang,
            decide,
            sink,
            (tracker, counters, p.backward()),
        ),
        tasks,
        hangs,
    )
}

/// This node's straggler tracker; on several nodes, with the task exchanging its
/// rows for the job-wide decision.
fn straggler_tracker(
    p: &Job,
    session: &impl Session,
    node: &NodePlace,
    status: &JobStatus,
    span: Duration,
) -> (Tracker, Option<tokio::task::JoinHandle<()>>) {
    let seat = NodeSeat {
        node_rank: node.node_rank,
        host: p.facts.container.hostname.clone(),
        gpus: (0..p.nproc)
            .filter_map(|l| Some((l, p.gpu_of(l)?.index)))
            .collect(),
        uuids: (0..p.nproc)
            .filter_map(|l| p.gpu_of(l))
            .map(|g| (g.index, g.uuid.clone()))
            .collect(),
    };
    let (decide, task) = match session.meeting(node.round, node) {
        Some(x) => {
            let (tx, rx) = tokio::sync::watch::channel(Vec::new());
            let task = straggler::exchange::start(x, span, rx, status.clone());
            (StragglerDecide::Publish(tx), Some(task))
        }
        None => (StragglerDecide::Here(Default::default()), None),
    };
    let clocks = Box::new(crate::probe::gpu_clocks::NvmlClocks);
    let t = Tracker::new(p.root.clone(), span, seat, clocks, decide, status.clone());
    (t, task)
}

/// The watch on this node's links, where the job is this node alone (a collective
/// across nodes is bounded by links toporun cannot see from here) and its GPUs are
/// joined by links of a known class.
fn link_watch(p: &Job, node: &NodePlace) -> Option<LinkWatch> {
    if node.nnodes != 1 {
        return None;
    }
    let mut gpus: Vec<usize> = (0..p.nproc).filter_map(|l| p.cuda_index(l)).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let (r, a, b) = link_reference::slowest_pair(&p.facts.gpus, &gpus)?;
    let model = LinkModel {
        class: format!("{} between GPU {a} and GPU {b}", r.class),
        gbps: r.gbps,
    };
    let host = &p.facts.container.hostname;
    Some(LinkWatch::new(
        model,
        format!("node {} on {host}", node.node_rank),
    ))
}

/// What a hang found during the attempt leads to, before any rank is stopped.
pub struct AfterHang {
    /// Where /proc is read (the ranks' threads).
    pub root: Root,
    pub watch: Option<HangWatch>,
    pub attempt_dir: PathBuf,
    pub fr_dir: Option<PathBuf>,
    /// The workers' store, where this node hosts it.
    pub store: Option<StoreServer>,
    /// The ranks running (those with stock ProcessGroupNCCL are asked).
    pub ranks: LiveRanks,
    /// Stock ProcessGroupNCCL's monitor looks for `exception_dump`.
    pub monitor_polls: bool,
    /// Stops the straggler's dumps while the ranks dump for the hang.
    pub dumps_paused: DumpsPaused,
    /// torch ends a rank whose collective timed out (TORCH_NCCL_ASYNC_ERROR_HANDLING
    /// 1, toporun's default, or 3): toporun may end the job first. With 0 or 2 the
    /// user handles the timeout in the rank, and toporun leaves it to them.
    pub watchdog_ends_ranks: bool,
}

/// Whether torch ends a rank once NCCL's watchdog timed a collective out, by the
/// ranks' TORCH_NCCL_ASYNC_ERROR_HANDLING (`user`: theirs, where they set it).
pub fn watchdog_ends_ranks(user: Option<&str>) -> bool {
    !matches!(user.map(str::trim), Some("0" | "2"))
}

/// How long a hang stop waits for the ranks' flight-recorder dumps: as long as torch
/// waits for its own (TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC); a dump that takes C++
/// stack traces can take seconds.
const DUMP_WAIT: Duration = Duration::from_secs(60);

/// How long a hang stop waits for the dumps where NCCL's counters or the stacks
/// already named the ranks to blame: the dumps can only confirm it, and a rank spinning in Python (it
/// holds the GIL) took 15.5-16.3 s to write its own (2x H200). The ranks' dumps took
/// 6.6-7.6 s where they came at all quickly; the job then ends within
/// --hang-timeout + 10 s of the hold.
const DECIDED_DUMP_WAIT: Duration = Duration::from_secs(7);

/// How long the ranks may dump once NCCL's watchdog has fired, before toporun stops
/// them: torch then waits 60 s on its own dump before it aborts (measured on 2x H100:
/// the watchdog at 31.6 s, its abort at 97.8 s), but nothing more comes from ranks
/// whose communicator timed out. The dumps took 6.6-7.4 s in the hang stops measured
/// (tests/fixtures/device/nccl-failures-h100x2); with the report's second of sampling
/// and the stop, the job ends within the watchdog's timeout + 15 s.
const WATCHDOG_DUMP_WAIT: Duration = Duration::from_secs(11);

/// How long a hang stop waits for the dumps: short where the report already names
/// the ranks to blame (by the counters, or by the stacks: a rank that left, stopped,
/// or in no collective), the whole of torch's own wait where only the dumps can tell
/// which collective differs.
fn dump_wait(r: &HangReport) -> Duration {
    match r.by_counters || r.hang.named {
        true => DECIDED_DUMP_WAIT,
        false => DUMP_WAIT,
    }
}

impl AfterHang {
    /// Records each hang in the attempt directory (hang.json); once NCCL's watchdog has
    /// fired, or under `--on-hang stop`, asks the ranks for their flight-recorder
    /// dumps and resolves (the ranks are then stopped).
    pub async fn events(self, mut hangs: mpsc::UnboundedReceiver<HangReport>) -> HangReport {
        while let Some(r) = hangs.recv().await {
            write_json(&self.attempt_dir.join("hang.json"), &r.hang);
            if r.watchdog.is_some() && self.watchdog_ends_ranks {
                self.ask_for_dumps(&r, WATCHDOG_DUMP_WAIT).await;
                return r;
            }
            if self.watch.is_some_and(|w| w.stop) {
                self.ask_for_dumps(&r, dump_wait(&r)).await;
                return r;
            }
        }
        std::future::pending().await
    }

    /// Stock ProcessGroupNCCL makes every rank dump when `exception_dump` (the
    /// int32 rank that saw the failure) appears at the root of the workers' store,
    /// and then ends the ranks: only done when they are to be stopped anyway.
    async fn ask_for_dumps(&self, r: &HangReport, wait: Duration) {
        let Some(dir) = &self.fr_dir else { return };
        self.dumps_paused.pause();
        if !self.monitor_polls {
            return;
        }
        // Set even where no rank here has the monitor: other nodes' ranks may.
        if let Some(store) = &self.store {
            let rank = r.hang.odd.first().copied().unwrap_or(0);
            let rank = i32::try_from(rank).unwrap_or(0);
            store.set(EXCEPTION_DUMP_KEY.as_bytes(), rank.to_ne_bytes().to_vec());
        }
        let root = &self.root;
        let ranks = self.ranks.lock().map(|l| l.clone()).unwrap_or_default();
        // A stopped rank writes nothing until continued: not waited for.
        let monitored = ranks
            .iter()
            .filter(|r| has_thread(root, r.pid, NCCL_MONITOR_THREAD))
            .filter(|r| !crate::probe::rank_usage::stopped(root, r.pid))
            .count();
        if monitored == 0 {
            return;
        }
        let then = if r.watchdog.is_some() {
            ", then stopping the ranks: NCCL's watchdog has fired, nothing more can come from them"
        } else {
            ""
        };
        crate::console::say!(
            "toporun: hang: asked the ranks for their flight-recorder dumps (exception_dump); waiting up to {}s for them{then}",
            wait.as_secs()
        );
        let start = std::time::Instant::now();
        let mut sizes = BTreeMap::new();
        let mut done = 0;
        while start.elapsed() < wait && done < monitored {
            tokio::time::sleep(Duration::from_millis(200)).await;
            (done, sizes) = dumps_done(dir, &sizes);
        }
        crate::console::say!(
            "toporun: hang: {done} of {monitored} flight-recorder dumps here after {:.1}s",
            start.elapsed().as_secs_f64()
        );
    }
}

/// The workers' store key stock ProcessGroupNCCL watches to dump on another rank's
/// failure, as the server holds it (torch's clients put "/" before every key).
const EXCEPTION_DUMP_KEY: &str = "/exception_dump";

/// Dumps whose writing is over: files of the same nonzero size as `before` saw
/// (torch writes the file in place); the sizes seen now.
fn dumps_done(dir: &Path, before: &BTreeMap<PathBuf, u64>) -> (usize, BTreeMap<PathBuf, u64>) {
    let now: BTreeMap<PathBuf, u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.len())))
        .collect();
    let done = now
        .iter()
        .filter(|(p, n)| **n > 0 && before.get(*p) == Some(n))
        .count();
    (done, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_ends_ranks_unless_the_user_handles_timeouts() {
        assert!(watchdog_ends_ranks(None));
        assert!(watchdog_ends_ranks(Some("1")));
        assert!(watchdog_ends_ranks(Some("3")));
        assert!(!watchdog_ends_ranks(Some("0")));
        assert!(!watchdog_ends_ranks(Some(" 2")));
    }

    /// A stop waits the whole 60 s only where the dumps are what tells the cause:
    /// a rank the stacks or the counters named already (a spinning rank among them,
    /// slow to dump) ends the job within --hang-timeout + 10 s.
    #[test]
    fn only_an_undecided_hang_waits_the_whole_dump_timeout() {
        let report = |odd: Vec<u32>, named, by_counters| HangReport {
            hang: toporun_shared::stacks::hang_report::Hang {
                stalled_secs: 20.0,
                timeout_secs: 15.0,
                groups: Vec::new(),
                odd,
                headline: String::new(),
                trigger: None,
                named,
            },
            text: String::new(),
            watchdog: None,
            by_counters,
        };
        assert_eq!(dump_wait(&report(vec![1], true, false)), DECIDED_DUMP_WAIT);
        assert_eq!(
            dump_wait(&report(Vec::new(), false, true)),
            DECIDED_DUMP_WAIT
        );
        assert_eq!(dump_wait(&report(Vec::new(), false, false)), DUMP_WAIT);
        // A rank apart from a group that all wait: which collective differs is the
        // dumps' to say.
        assert_eq!(dump_wait(&report(vec![3], false, false)), DUMP_WAIT);
    }
}
