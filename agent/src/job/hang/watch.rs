//! Samples every local rank's Python stack while the ranks run, keeping the last
//! sample (where the others stood when one fails, even if they die with it). With
//! `--hang-timeout` on a single node, when no rank has made progress for the
//! timeout, it reports where each stands (the odd ones first) and which rank differs;
//! on several nodes it hands each sample to the job-wide decision (`exchange`).
//! On its own thread: py-spy's reads are blocking.

use crate::job::failure::causes::LeftRanks;
use crate::job::hang::node_sample::NodeSample;
use crate::job::hang::workers_text::workers_text;
use crate::job::spec::HangWatch;
use crate::job::straggler::tracker::Tracker;
use crate::nccl_counters::CountersFiles;
use crate::paths::Root;
use crate::stacks::{written, RankPid, Sampler, SourceLines};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};
use toporun_shared::nccl_counters::{NcclWatch, NodeReading};
use toporun_shared::root_cause::watchdog::WatchdogTimeout;
use toporun_shared::stacks::activity::Backward;
use toporun_shared::stacks::hang_report::{Context, Gone, Hang};
use toporun_shared::stacks::progress::{Progress, Sample};
use toporun_shared::stacks::teardown::{teardown_cause, LastSaid};
use toporun_shared::stacks::{
    busy_line, counters_alone, nccl_verdict, CountersAlone, NcclVerdict, Places, RankStack,
};
use toporun_shared::untrusted::without_escapes;

/// The ranks running now (the supervisor adds and removes them).
pub type LiveRanks = Arc<Mutex<Vec<RankPid>>>;

/// How often ranks are sampled: a twentieth of the timeout, between 0.25 s and 1 s
/// (a loop over two lines must not read the same line at every sample).
pub fn interval(timeout: Duration) -> Duration {
    (timeout / 20).clamp(Duration::from_millis(250), Duration::from_secs(1))
}

/// A hang found: the finding, and the report as printed.
#[derive(Debug, Clone)]
pub struct HangReport {
    pub hang: Hang,
    pub text: String,
    /// NCCL's watchdog timed a collective out on this rank: the ranks cannot go on.
    pub watchdog: Option<(u32, WatchdogTimeout)>,
    /// NCCL's counters named the ranks behind: the dumps can only confirm it.
    pub by_counters: bool,
}

/// Where a found hang goes: stderr, the status counters, and the attempt.
#[derive(Clone)]
pub struct Sink {
    counted: Arc<dyn Fn(&HangReport) + Send + Sync>,
    tx: mpsc::UnboundedSender<HangReport>,
}

impl Sink {
    pub fn new(
        counted: impl Fn(&HangReport) + Send + Sync + 'static,
    ) -> (Sink, mpsc::UnboundedReceiver<HangReport>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let counted = Arc::new(counted);
        (Sink { counted, tx }, rx)
    }

    pub fn found(&self, r: HangReport) {
        crate::console::say_raw!("{}", r.text);
        (self.counted)(&r);
        let _ = self.tx.send(r);
    }
}

/// Who decides that the job hangs.
pub enum Decide {
    /// This node alone (a single-node job).
    Here,
    /// The job-wide exchange, which gets every sample.
    Publish(watch::Sender<NodeSample>),
}

/// How often ranks are sampled without --hang-timeout.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Stops the watcher thread when dropped (the attempt ended).
/// Each rank's last sample that had Python frames (and was not unwinding), and when it was taken, by pid
/// (kept after the rank exits: where a rank that crashed last stood).
type LastSamples = Arc<Mutex<HashMap<i32, (RankStack, SystemTime)>>>;

/// The files each rank (by pid) had open for writing at its last sample that had
/// any: where a failed write was going.
type Writes = Arc<Mutex<HashMap<i32, Vec<String>>>>;

/// The local TCP ports each rank (by rank) held at its last sample: a peer's address
/// in another rank's lost-connection error names its rank.
type Ports = Arc<Mutex<HashMap<u32, Vec<u16>>>>;

pub struct Watcher {
    done: Arc<AtomicBool>,
    /// Cleared once a rank failed and the others are being stopped: they wait for the
    /// dead one, and a hang or a straggler said then would point at the survivors.
    judging: Arc<AtomicBool>,
    last: LastSamples,
    writes: Writes,
    ports: Ports,
}

impl Watcher {
    /// No hang or straggler is judged from now on; stacks are still sampled.
    pub fn stop_judging(&self) {
        self.judging.store(false, Ordering::Relaxed);
    }

    fn samples(&self) -> HashMap<i32, (RankStack, SystemTime)> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Where `ranks` stood before a failure: their last samples (taken before it:
    /// frames read after it began show ranks already unwinding), and the oldest
    /// one's age; a rank never sampled is read now.
    pub fn stacks_before_failure(&self, ranks: &[RankPid]) -> (Vec<RankStack>, Option<f64>) {
        let now = SystemTime::now();
        let last = self.samples();
        let unseen: Vec<RankPid> = ranks
            .iter()
            .filter(|r| !last.contains_key(&r.pid))
            .copied()
            .collect();
        let mut stacks = Sampler::default().capture(&unseen, Duration::from_secs(1));
        let mut oldest: Option<f64> = None;
        for r in ranks {
            if let Some((stack, at)) = last.get(&r.pid) {
                let age = now.duration_since(*at).unwrap_or_default().as_secs_f64();
                oldest = Some(oldest.map_or(age, |o| o.max(age)));
                stacks.push(stack.clone());
            }
        }
        stacks.sort_by_key(|s| s.rank);
        (stacks, oldest)
    }

    /// The TCP ports each rank held at its last sample.
    pub fn ports(&self) -> HashMap<u32, Vec<u16>> {
        self.ports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The files each rank (by pid) was last seen writing.
    pub fn writing(&self) -> HashMap<i32, Vec<String>> {
        self.writes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Where each rank (by pid) was last sampled, as a frame line, and when.
    pub fn last_seen(&self) -> HashMap<i32, (String, SystemTime)> {
        self.samples()
            .into_iter()
            .filter_map(|(pid, (stack, at))| {
                let line =
                    toporun_shared::root_cause::native_crash::where_sampled(stack.main_thread()?)?;
                Some((pid, (line, at)))
            })
            .collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// The watching state of the sampler thread.
struct Judge {
    watch: HangWatch,
    decide: Decide,
    sink: Sink,
    progress: Progress,
    reported: bool,
    /// Samples in a row where no rank's stack could be read.
    unreadable: u32,
    root: Root,
    /// The ranks that exited 0 while others ran.
    left: LeftRanks,
    /// Each rank's stderr tail, where NCCL's watchdog says it timed out.
    tails: RankTails,
    watchdog_said: bool,
    lines: SourceLines,
    /// NCCL's counters, where the ranks load toporun's profiler plugin.
    nccl: Option<(CountersFiles, NcclWatch)>,
    /// The counters' marks at the last sample handed on (several nodes).
    handed_marks: (u64, u64),
    /// A rank behind was said to be busy, from the counters alone (said once a stall).
    busy_said: bool,
    /// Where the ranks run their backward (on their own thread without a GPU).
    backward: Backward,
    nccl_errors: super::nccl_errors::NcclErrorsSaid,
}

/// Each rank's stderr tail, by global rank.
pub type RankTails = Vec<(u32, crate::supervise::Tail)>;

/// How long the ranks still here may stand still, every one waiting for its peers,
/// once a rank has left, before the hang is said: a collective over NVLink or the
/// network completes in milliseconds, so ranks that wait seconds for a rank that is
/// gone wait forever (measured: tests/fixtures/device/nccl-failures-h100x2).
pub const LEFT_STALL: Duration = Duration::from_secs(5);

/// Without --hang-timeout, how recently a busy rank's GPU must have run kernels for
/// its work to count as moving. With it, the timeout itself: a busy rank is the hang
/// only once its GPU, too, stayed idle that long (as far as the straggler window keeps
/// readings), so an evaluation that ends with seconds of CPU work (metrics, logging)
/// is not stopped there, while a rank spinning in Python, whose GPU drains within a
/// second, is said about a second later than its stall alone would be.
const GPU_ACTIVE_WITHIN: Duration = Duration::from_secs(5);

/// Unreadable samples in a row before detection is said to be paused.
const UNREADABLE_SAID: u32 = 5;

impl Judge {
    /// The ranks that left, and each rank's innermost line of code.
    fn context(&mut self, stacks: &[RankStack]) -> Context {
        let left = self
            .left
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|l| Gone {
                rank: l.rank,
                into_attempt: l.into_attempt,
            })
            .collect();
        Context {
            left,
            lines: self.lines.innermost(&self.root, stacks),
            stopped: stacks
                .iter()
                .filter(|s| crate::probe::rank_usage::stopped(&self.root, s.pid))
                .map(|s| s.rank)
                .collect(),
            backward: self.backward,
        }
    }

    /// NCCL's watchdog timed a collective out on a rank of this node: the hang is
    /// said at its line (the rank it stops waited for a peer), not when it dies.
    fn watchdog(&mut self, live: &[RankPid], stacks: &[RankStack]) -> bool {
        if self.watchdog_said || matches!(self.decide, Decide::Publish(_)) {
            return self.watchdog_said;
        }
        let Some((victim, w)) = self
            .tails
            .iter()
            .find_map(|(r, t)| Some((*r, t.watchdog()?)))
        else {
            return false;
        };
        self.watchdog_said = true;
        let ctx = self.context(stacks);
        let hang = Hang::watchdog(stacks, &Places::new(), victim, &w.what(), &ctx);
        let text = hang.text(&Places::new()) + &workers_text(&self.root, live);
        self.sink.found(HangReport {
            hang,
            text,
            watchdog: Some((victim, w)),
            by_counters: false,
        });
        self.reported = true;
        true
    }

    /// On one node with NCCL's counters: whether ranks wait in an NCCL operation and
    /// the counters decide (true: a hang is said or stands; false: operations
    /// complete), or None where the stacks decide ([`NcclVerdict::StackRule`]).
    fn nccl_decides(
        &mut self,
        live: &[RankPid],
        stacks: &[RankStack],
        now: Instant,
        gpu_busy: &BTreeMap<u32, bool>,
    ) -> Option<bool> {
        self.nccl.as_ref()?;
        let ctx = self.context(stacks);
        let (files, watch) = self.nccl.as_mut()?;
        let reading = files.node(&self.root, live, gpu_busy);
        let timeout = self.watch.timeout;
        match nccl_verdict(watch, reading, stacks, &Places::new(), &ctx, timeout, now) {
            NcclVerdict::StackRule => None,
            NcclVerdict::Moving => {
                // Operations move again: a later busy rank is said anew.
                self.busy_said = false;
                Some(false)
            }
            NcclVerdict::Waiting => Some(self.reported),
            NcclVerdict::Busy { hang, gpu, .. } => {
                if !self.busy_said && !self.reported {
                    crate::console::say!("toporun: no hang said: {}", busy_line(&hang, gpu));
                }
                self.busy_said = true;
                Some(self.reported)
            }
            NcclVerdict::Hang(hang) => {
                if !self.reported {
                    self.say(hang, live, true);
                }
                Some(true)
            }
        }
    }

    /// Where no stack can be read, with NCCL's counters: the counters alone decide,
    /// here on one node, at the store's host on several (false: no counters to
    /// judge by).
    fn counters_alone(
        &mut self,
        live: &[RankPid],
        stacks: &[RankStack],
        gpu_busy: &BTreeMap<u32, bool>,
    ) -> bool {
        let Some((files, watch)) = self.nccl.as_mut() else {
            return false;
        };
        let reading = files.node(&self.root, live, gpu_busy);
        if let Decide::Publish(tx) = &self.decide {
            let _ = tx.send(NodeSample::counters_alone(reading.for_exchange(), stacks));
            return true;
        }
        let places = Places::new();
        match counters_alone(watch, reading, &places, self.watch.timeout, Instant::now()) {
            CountersAlone::Quiet | CountersAlone::Moving => {
                self.reported = false;
                self.busy_said = false;
            }
            CountersAlone::Waiting => {}
            CountersAlone::Busy(line) => {
                if !self.busy_said && !self.reported {
                    crate::console::say!("toporun: no hang said: {line}");
                }
                self.busy_said = true;
            }
            CountersAlone::Hang(hang) => {
                if !self.reported {
                    self.say(hang, live, true);
                }
            }
        }
        true
    }

    /// Says the hang found here (with the ranks' workers, and what an odd rank in its
    /// teardown said before), once.
    fn say(&mut self, mut hang: Hang, live: &[RankPid], by_counters: bool) {
        if let Some(cause) = teardown_cause(&hang, &self.last_said()) {
            hang.headline.push_str(&cause);
        }
        let text = hang.text(&Places::new()) + &workers_text(&self.root, live);
        self.sink.found(HangReport {
            hang,
            text,
            watchdog: None,
            by_counters,
        });
        self.reported = true;
    }

    /// What each rank last said on stderr, from its output's tail.
    fn last_said(&self) -> BTreeMap<u32, LastSaid> {
        self.tails
            .iter()
            .filter_map(|(r, t)| Some((*r, LastSaid::of(&without_escapes(&t.text()))?)))
            .collect()
    }

    /// `gpu_busy`: whether each rank's GPU ran kernels within the timeout, where known.
    fn judge(&mut self, live: &[RankPid], stacks: &[RankStack], gpu_busy: &BTreeMap<u32, bool>) {
        // Without stacks a compute loop would look hung: watch nothing then, or the
        // counters alone. A read fails now and then (a thread exiting under the
        // reader): only a failure that keeps on counts, and is said.
        if let Some(e) = stacks
            .iter()
            .find_map(|s| s.error.as_ref())
            .filter(|_| stacks.iter().all(|s| s.error.is_some()))
        {
            self.unreadable += 1;
            let alone =
                self.unreadable >= UNREADABLE_SAID && self.counters_alone(live, stacks, gpu_busy);
            if self.unreadable == UNREADABLE_SAID {
                if alone {
                    crate::console::say!(
                        "toporun: the ranks' stacks cannot be read ({e}): hangs are judged from NCCL's counters alone"
                    );
                } else {
                    crate::console::say_warning!(
                        "hang detection paused: cannot read the ranks' stacks ({e})"
                    );
                }
            }
            return;
        }
        if self.unreadable >= UNREADABLE_SAID {
            crate::console::say!(
                "toporun: hang detection resumed: the ranks' stacks can be read again"
            );
        }
        self.unreadable = 0;
        self.nccl_errors.say_new(&self.tails);
        if self.watchdog(live, stacks) {
            return;
        }
        let now = Instant::now();
        for s in stacks {
            let w = written(&self.root, s.pid).unwrap_or(0);
            self.progress.observe(s.rank, Sample::of(s, w), now);
        }
        let ids: Vec<u32> = live.iter().map(|r| r.rank).collect();
        let timeout = self.watch.timeout;
        if matches!(self.decide, Decide::Publish(_)) {
            let stalled = self
                .progress
                .hung(&ids, Duration::ZERO, now)
                .unwrap_or_default();
            let nccl = self
                .nccl
                .as_ref()
                .map(|(files, _)| files.node(&self.root, live, gpu_busy).for_exchange());
            let marks = nccl.as_ref().map(NodeReading::marks);
            let nccl_still = marks.is_some_and(|m| m == self.handed_marks);
            self.handed_marks = marks.unwrap_or_default();
            // The context travels only once the ranks stand still, or NCCL's
            // counters do (a hang whose stacks move).
            let (context, said) = if stalled >= timeout.min(LEFT_STALL) / 2 || nccl_still {
                (self.context(stacks), self.last_said())
            } else {
                Default::default()
            };
            if let Decide::Publish(tx) = &self.decide {
                let _ = tx.send(NodeSample {
                    stalled,
                    stacks: stacks.to_vec(),
                    context,
                    nccl,
                    nccl_still,
                    said,
                    no_stacks: false,
                });
            }
            return;
        }
        if let Some(decided) = self.nccl_decides(live, stacks, now, gpu_busy) {
            if !decided {
                self.reported = false;
            }
            return;
        }
        let Some(stalled) = self.progress.hung(&ids, timeout.min(LEFT_STALL), now) else {
            // Progress again: a later hang is reported anew.
            self.reported = false;
            return;
        };
        if self.reported {
            return;
        }
        // A rank gone and every rank here waiting for its peers: said at LEFT_STALL,
        // not at the whole timeout.
        let ctx = self.context(stacks);
        if stalled < timeout && !ctx.left_while_others_wait(stacks) {
            return;
        }
        self.say(
            Hang::with(stacks, &Places::new(), stalled, timeout, &ctx),
            live,
            false,
        );
    }
}

/// Starts sampling `ranks`; with `watch`, a hang is decided as `decide` says (on one
/// node, from NCCL's `counters` first where given), and a hang found here goes to
/// `sink`.
/// Each sample also feeds `tracker` (the straggler windows), which may sample faster.
pub fn start(
    root: Root,
    (ranks, left, tails): (LiveRanks, LeftRanks, RankTails),
    watch: Option<HangWatch>,
    decide: Decide,
    sink: Sink,
    (mut tracker, counters, backward): (Option<Tracker>, Option<CountersFiles>, Backward),
) -> Watcher {
    let done = Arc::new(AtomicBool::new(false));
    let last: LastSamples = Default::default();
    let writes: Writes = Default::default();
    let ports: Ports = Default::default();
    let (stop, keep, files, held) = (done.clone(), last.clone(), writes.clone(), ports.clone());
    let judging = Arc::new(AtomicBool::new(true));
    let judges = judging.clone();
    let every = watch.map_or(DEFAULT_INTERVAL, |w| interval(w.timeout));
    let gpu_within = watch.map_or(GPU_ACTIVE_WITHIN, |w| w.timeout);
    let every = tracker.as_ref().map_or(every, |t| every.min(t.interval()));
    let mut judge = watch.map(|watch| Judge {
        watch,
        decide,
        sink,
        progress: Progress::new(),
        reported: false,
        unreadable: 0,
        root: root.clone(),
        left,
        tails,
        watchdog_said: false,
        lines: SourceLines::default(),
        nccl: counters.map(|c| (c, NcclWatch::default())),
        handed_marks: (0, 0),
        busy_said: false,
        backward,
        nccl_errors: Default::default(),
    });
    std::thread::spawn(move || {
        let mut sampler = Sampler::default();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(every);
            let live: Vec<RankPid> = ranks.lock().map(|r| r.clone()).unwrap_or_default();
            if live.is_empty() || stop.load(Ordering::Relaxed) {
                continue;
            }
            let stacks = sampler.capture(&live, Duration::from_secs(1));
            let at = SystemTime::now();
            let mut l = keep
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // A rank printing its exception keeps the sample from before it.
            let stood = |s: &&RankStack| s.main_thread().is_some() && !s.unwinding();
            for s in stacks.iter().filter(stood) {
                l.insert(s.pid, (s.clone(), at));
            }
            drop(l);
            for r in &live {
                let open = crate::probe::open_writes::open_for_writing(&root, r.pid);
                if !open.is_empty() {
                    files
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(r.pid, open);
                }
            }
            note_ports(&root, &held, &live);
            let gpu_busy = tracker
                .as_ref()
                .map(|t| t.gpu_busy(gpu_within))
                .unwrap_or_default();
            if !judges.load(Ordering::Relaxed) {
                continue;
            }
            let hang_said = judge.as_mut().is_some_and(|j| {
                j.judge(&live, &stacks, &gpu_busy);
                j.reported
            });
            // A hang said here stands until a rank moves again: the rank it names
            // waits least, which the straggler windows would name again as slow.
            if let Some(t) = tracker.as_mut().filter(|_| !hang_said) {
                t.observe(&live, &stacks);
            }
        }
    });
    Watcher {
        done,
        judging,
        last,
        writes,
        ports,
    }
}

/// Records the ports each live rank holds (kept after it exits).
fn note_ports(root: &Root, held: &Ports, live: &[RankPid]) {
    let pids: Vec<i32> = live.iter().map(|r| r.pid).collect();
    let now = crate::probe::port_owner::ports_held(root, &pids);
    let mut held = held
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for r in live {
        if let Some(p) = now.get(&r.pid).filter(|p| !p.is_empty()) {
            held.insert(r.rank, p.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Watcher {
        /// A watcher of no ranks, judging until told to stop.
        pub(crate) fn idle() -> Watcher {
            Watcher {
                done: Arc::new(AtomicBool::new(true)),
                judging: Arc::new(AtomicBool::new(true)),
                last: Default::default(),
                writes: Default::default(),
                ports: Default::default(),
            }
        }

        pub(crate) fn judging(&self) -> bool {
            self.judging.load(Ordering::Relaxed)
        }
    }

    #[test]
    fn sampling_is_a_twentieth_of_the_timeout_within_bounds() {
        assert_eq!(
            interval(Duration::from_secs(10)),
            Duration::from_millis(500)
        );
        assert_eq!(interval(Duration::from_secs(1)), Duration::from_millis(250));
        assert_eq!(interval(Duration::from_secs(600)), Duration::from_secs(1));
    }
}
