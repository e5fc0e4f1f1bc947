//! Fed by the sampler thread: one reading per rank per sample, a window per rank,
//! this node's rows for `toporun top`, `/status` and `/metrics`, and (on one node)
//! the straggler finding said as it changes.

use super::gpu_source::GpuSource;
use super::link_watch::LinkWatch;
use crate::paths::Root;
use crate::probe::gpu_clocks::GpuClocks;
use crate::probe::rank_usage;
use crate::stacks::RankPid;
use crate::stacks::{has_thread, SourceLines, NCCL_MONITOR_THREAD};
use crate::status::JobStatus;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use toporun_shared::root_cause::native_crash::where_sampled;
use toporun_shared::stacks::activity::{classify, Activity, Backward};
use toporun_shared::stacks::progress::Sample;
use toporun_shared::stacks::rank_window::{GpuNow, GpuReading, RankWindow, Reading, Throttling};
use toporun_shared::stacks::standing::{standing, Standing};
use toporun_shared::stacks::straggler::{RankRow, Verdicts};
use toporun_shared::stacks::{RankStack, ThreadStack};

/// Who decides: this node alone, or the store's host from every node's rows.
pub enum Decide {
    Here(Verdicts),
    Publish(watch::Sender<Vec<RankRow>>),
}

/// Where this node and its ranks are.
pub struct NodeSeat {
    pub node_rank: u32,
    pub host: String,
    /// The GPU (NVML index) each local rank uses.
    pub gpus: HashMap<u32, u32>,
    /// Each of those GPUs' UUID, by NVML index.
    pub uuids: HashMap<u32, String>,
}

pub struct Tracker {
    span: Duration,
    start: Instant,
    seat: NodeSeat,
    clocks: Box<dyn GpuClocks>,
    windows: HashMap<u32, RankWindow>,
    /// Each rank's cpu.stat (by pid) and when it was found: found again every
    /// [`CGROUP_RECHECK`] (a rank moved to another cgroup), read once a sample per
    /// cgroup (ranks mostly share one).
    cpu_stats: HashMap<i32, (Option<PathBuf>, Instant)>,
    decide: Decide,
    status: JobStatus,
    root: Root,
    /// Whether each rank (by pid) runs ProcessGroupNCCL, and when that was read.
    nccl: HashMap<i32, (bool, Instant)>,
    /// Lines of the ranks' code, read once each.
    lines: SourceLines,
    /// Each rank's GPU time while it trains (NCCL): its counters or its dumps.
    gpu: Option<GpuSource>,
    /// This node's links, judged from the same readings (one node, GPUs on known links).
    links: Option<LinkWatch>,
    /// Each rank's last stack signature: the dumps are asked only once one moved.
    signatures: HashMap<u32, u64>,
    /// No rank's stack could be read at this sample (a program that is not Python).
    no_stacks: bool,
}

/// How often a rank not yet seen with ProcessGroupNCCL is looked at again.
const NCCL_RECHECK: Duration = Duration::from_secs(5);

/// How often a rank's CPU cgroup is found again.
const CGROUP_RECHECK: Duration = Duration::from_secs(10);

impl Tracker {
    /// How often ranks are sampled for the window: 120 samples a window (40 a third:
    /// the thirds rule needs them), 8 to 1 a second.
    pub fn interval(&self) -> Duration {
        (self.span / 120).clamp(Duration::from_millis(125), Duration::from_secs(1))
    }

    pub fn new(
        root: Root,
        span: Duration,
        seat: NodeSeat,
        clocks: Box<dyn GpuClocks>,
        decide: Decide,
        status: JobStatus,
    ) -> Tracker {
        Tracker {
            span,
            start: Instant::now(),
            seat,
            clocks,
            windows: HashMap::new(),
            cpu_stats: HashMap::new(),
            decide,
            status,
            root,
            nccl: HashMap::new(),
            lines: SourceLines::default(),
            gpu: None,
            links: None,
            signatures: HashMap::new(),
            no_stacks: false,
        }
    }

    /// Reads each rank's GPU time inside collectives from `source` too, and where
    /// `links` is given, watches this node's links from the same readings.
    pub fn with_gpu(mut self, source: Option<GpuSource>, links: Option<LinkWatch>) -> Tracker {
        self.gpu = source;
        self.links = links;
        self
    }

    /// Whether some rank's stack differs from its last sample.
    fn moved(&mut self, stacks: &[RankStack]) -> bool {
        let mut moved = false;
        for s in stacks {
            let sig = Sample::of(s, 0).signature;
            moved |= self.signatures.insert(s.rank, sig) != Some(sig);
        }
        moved
    }

    /// The GPU times of the dumps that came in, into each rank's window; the links
    /// judged from them.
    fn take_gpu_times(&mut self, at: Duration, live: &[RankPid], stacks: &[RankStack]) {
        if self.gpu.is_none() {
            return;
        }
        let moved = self.moved(stacks);
        let Some(g) = self.gpu.as_mut() else { return };
        let (times, line) = g.tick(live, moved, self.links.as_mut());
        if let Some(line) = line {
            crate::console::say!("{line}");
            let now = self.links.as_ref().and_then(LinkWatch::current);
            self.status.update(|x| x.slow_links = now);
        }
        for time in times {
            let span = self.span;
            self.windows
                .entry(time.rank)
                .or_insert_with(|| RankWindow::new(span))
                .push_gpu(GpuReading { at, time });
        }
    }

    /// The rank runs ProcessGroupNCCL (its monitor thread is there): a wait on its
    /// GPU then waits for the peers' collectives too.
    fn uses_nccl(&mut self, pid: i32) -> bool {
        let root = &self.root;
        let (yes, at) = self
            .nccl
            .entry(pid)
            .or_insert_with(|| (has_thread(root, pid, NCCL_MONITOR_THREAD), Instant::now()));
        if !*yes && at.elapsed() >= NCCL_RECHECK {
            (*yes, *at) = (has_thread(root, pid, NCCL_MONITOR_THREAD), Instant::now());
        }
        *yes
    }

    /// What the rank does at this sample. Under NCCL a rank at `loss.item()` (its
    /// innermost line synchronises with the GPU) waits for its peers' kernels: the
    /// fast rank of an uneven job spins there while the slow one's CPU blocks in the
    /// collective's launch, and counting it as compute named the fast rank (2x H100,
    /// tests/fixtures/device/nccl-straggler-h100x2). Under gloo that wait is the
    /// rank's own GPU work and stays compute.
    fn activity(&mut self, pid: i32, main: &ThreadStack, backward: Backward) -> Activity {
        let activity = classify(main, backward);
        if !matches!(activity, Activity::Compute | Activity::Blocked) || !self.uses_nccl(pid) {
            return activity;
        }
        let Some(f) = main.frames.first() else {
            return activity;
        };
        match standing(main, self.lines.of(&self.root, f)) {
            Standing::GpuWait { .. } => Activity::GpuWait,
            _ => activity,
        }
    }

    /// One sample of every live rank.
    pub fn observe(&mut self, live: &[RankPid], stacks: &[RankStack]) {
        let at = self.start.elapsed();
        self.no_stacks = !stacks.is_empty() && stacks.iter().all(|s| s.error.is_some());
        self.windows
            .retain(|rank, _| live.iter().any(|r| r.rank == *rank));
        self.cpu_stats
            .retain(|pid, _| live.iter().any(|r| r.pid == *pid));
        self.signatures
            .retain(|rank, _| live.iter().any(|r| r.rank == *rank));
        self.take_gpu_times(at, live, stacks);
        let throttling = self.throttling(live);
        let gpus: Vec<u32> = live
            .iter()
            .filter_map(|r| self.seat.gpus.get(&r.local_rank).copied())
            .collect();
        let readings = self.clocks.read(&gpus);
        let mut rows = Vec::with_capacity(live.len());
        for r in live {
            let stack = stacks.iter().find(|s| s.pid == r.pid);
            let gpu = self.seat.gpus.get(&r.local_rank).copied();
            let gpu_now = gpu.and_then(|g| readings.iter().find(|x| x.index == g).cloned());
            let cgroup = self.cpu_stats.get(&r.pid).and_then(|(f, _)| f.clone());
            let throttled = cgroup.and_then(|c| throttling.get(&c).copied());
            // Without a GPU the rank runs its own backward (DDP waits inside it).
            let backward = match gpu {
                None => Backward::OnCaller,
                Some(_) => Backward::OnDevice,
            };
            let reading = self.reading(at, r, stack, backward, gpu_now, throttled);
            let window = self
                .windows
                .entry(r.rank)
                .or_insert_with(|| RankWindow::new(self.span));
            if let Some(x) = reading {
                window.push(x);
            }
            rows.push(row(&self.seat, r, gpu, window));
        }
        self.judge(at, rows);
    }

    /// Whether each rank's GPU ran kernels within `within` (NVML's utilization, at the
    /// samples taken; a rank without samples is left out): a rank that alone computes
    /// while the others wait is moving.
    pub fn gpu_busy(&self, within: Duration) -> std::collections::BTreeMap<u32, bool> {
        let from = self.start.elapsed().saturating_sub(within);
        self.windows
            .iter()
            .filter_map(|(r, w)| Some((*r, w.gpu_busy_since(from)?)))
            .collect()
    }

    /// A rank's reading, where its stack could be read (a sample the reader missed
    /// counts for nothing rather than as time spent somewhere).
    fn reading(
        &mut self,
        at: Duration,
        r: &RankPid,
        stack: Option<&RankStack>,
        backward: Backward,
        gpu: Option<GpuNow>,
        throttling: Option<Throttling>,
    ) -> Option<Reading> {
        let usage = rank_usage::read(&self.root, r.pid);
        let (activity, place) = match stack?.main_thread() {
            Some(main) => (self.activity(r.pid, main, backward), where_sampled(main)),
            // Not Python (its stack read failed, not just this time): where the ranks'
            // GPUs are timed, their windows still fill; nothing counts as a wait.
            None if stack?.error.is_some() && self.gpu.is_some() && self.no_stacks => {
                (Activity::Unseen, None)
            }
            None => return None,
        };
        Some(Reading {
            at,
            activity,
            place,
            cpu: usage.map(|u| u.cpu),
            rss_bytes: usage.and_then(|u| u.rss_bytes),
            throttling,
            gpu,
        })
    }

    /// Each live rank's CPU cgroup's counters now, each cgroup read once.
    fn throttling(&mut self, live: &[RankPid]) -> HashMap<PathBuf, Throttling> {
        let mut read = HashMap::new();
        for r in live {
            let root = &self.root;
            let found = self
                .cpu_stats
                .entry(r.pid)
                .and_modify(|(f, at)| {
                    if at.elapsed() >= CGROUP_RECHECK {
                        (*f, *at) = (rank_usage::cpu_stat_of(root, r.pid), Instant::now());
                    }
                })
                .or_insert_with(|| (rank_usage::cpu_stat_of(root, r.pid), Instant::now()));
            if let Some(f) = found.0.as_ref().filter(|f| !read.contains_key(*f)) {
                if let Some(t) = rank_usage::throttling(root, f) {
                    read.insert(f.clone(), t);
                }
            }
        }
        read
    }

    fn judge(&mut self, at: Duration, rows: Vec<RankRow>) {
        let span = self.span;
        match &mut self.decide {
            Decide::Here(v) => {
                for line in v.step(at, &rows, span) {
                    crate::console::say!("{line}");
                }
                let stragglers = v.current.clone();
                self.status.update(|x| {
                    x.top = toporun_shared::stacks::top_table::TopTable {
                        window_s: span.as_secs(),
                        job_wide: false,
                        ranks: rows,
                        stragglers: stragglers.clone(),
                        hidden: 0,
                    };
                    x.stragglers = stragglers;
                });
            }
            Decide::Publish(tx) => {
                self.status.update(|x| {
                    x.top.window_s = span.as_secs();
                    if !x.top.job_wide {
                        x.top.ranks = rows.clone();
                    }
                });
                let _ = tx.send(rows);
            }
        }
    }
}

fn row(seat: &NodeSeat, r: &RankPid, gpu: Option<u32>, w: &RankWindow) -> RankRow {
    let last = w.last();
    RankRow {
        rank: r.rank,
        local_rank: r.local_rank,
        node_rank: seat.node_rank,
        host: seat.host.clone(),
        pid: r.pid,
        gpu,
        gpu_uuid: gpu.and_then(|g| seat.uuids.get(&g).cloned()),
        now: last.map(|x| x.activity),
        cpu_pct: w.cpu_now(),
        rss_bytes: last.and_then(|x| x.rss_bytes),
        gpu_now: last.and_then(|x| x.gpu.clone()),
        window: w.summary(),
        gpu_time: w.gpu_last().cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use toporun_shared::stacks::Frame;

    struct NoGpus;
    impl GpuClocks for NoGpus {
        fn read(&mut self, _: &[u32]) -> Vec<GpuNow> {
            Vec::new()
        }
    }

    /// Node 0's tracker over a 10 s window, reading /proc under `root`, no GPUs.
    fn tracker(root: &std::path::Path) -> Tracker {
        let seat = NodeSeat {
            node_rank: 0,
            host: "h".into(),
            gpus: HashMap::new(),
            uuids: HashMap::new(),
        };
        Tracker::new(
            Root::at(root),
            Duration::from_secs(10),
            seat,
            Box::new(NoGpus),
            Decide::Here(Default::default()),
            JobStatus::default(),
        )
    }

    #[test]
    fn a_window_is_sampled_120_times_within_bounds() {
        let every = |secs| {
            let mut t = tracker(std::path::Path::new("/"));
            t.span = Duration::from_secs(secs);
            t.interval()
        };
        assert_eq!(every(60), Duration::from_millis(500));
        assert_eq!(every(20), Duration::from_nanos(166_666_666));
        assert_eq!(every(15), Duration::from_millis(125));
        assert_eq!(every(600), Duration::from_secs(1));
    }

    /// A rank spinning at `.item()` (the fast rank of the 2x H100 uneven job): with
    /// ProcessGroupNCCL's monitor thread it waits for its peers; without (gloo) it
    /// computes, as before.
    #[test]
    fn a_gpu_wait_under_nccl_is_waiting_for_the_peers() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("app")).unwrap();
        fs::write(
            d.path().join("app/train.py"),
            "a = 1\n    out.float().mean().item()\n",
        )
        .unwrap();
        for (pid, comm) in [(7, "python3"), (8, "pt_nccl_heartbt")] {
            let task = d.path().join(format!("proc/{pid}/task/{pid}"));
            fs::create_dir_all(&task).unwrap();
            fs::write(task.join("comm"), format!("{comm}\n")).unwrap();
        }
        // pid 8 is a rank whose task list holds the monitor thread.
        let mut t = tracker(d.path());
        let main = ThreadStack {
            thread: Some("MainThread".into()),
            frames: vec![Frame {
                function: "<module>".into(),
                file: "/app/train.py".into(),
                line: 2,
            }],
            idle: false,
        };
        assert_eq!(t.activity(8, &main, Backward::OnDevice), Activity::GpuWait);
        assert_eq!(t.activity(7, &main, Backward::OnDevice), Activity::Compute);
    }

    /// The dumps are asked only while some rank's stack moves: a hung rank's dump
    /// would read as output to the hang watch.
    #[test]
    fn a_rank_standing_still_has_not_moved() {
        let d = tempfile::tempdir().unwrap();
        let mut t = tracker(d.path());
        let at = |line: i32| RankStack {
            rank: 0,
            local_rank: 0,
            pid: 7,
            threads: vec![ThreadStack {
                thread: Some("MainThread".into()),
                frames: vec![Frame {
                    function: "read_next_shard".into(),
                    file: "/app/train.py".into(),
                    line,
                }],
                idle: false,
            }],
            error: None,
        };
        assert!(t.moved(&[at(47)]), "first seen");
        assert!(!t.moved(&[at(47)]), "the same place");
        assert!(t.moved(&[at(48)]), "another line");
    }
}
