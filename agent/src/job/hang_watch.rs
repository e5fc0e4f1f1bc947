//! Samples every local rank's Python stack while the ranks run, keeping the last
//! sample (where the others stood when one fails, even if they die with it); with
//! `--hang-timeout`, when no rank has made progress for the timeout, says where each
//! one stands (the odd ones first) and which rank differs. On its own thread: py-spy's
//! reads are blocking.

use super::spec::HangWatch;
use crate::paths::Root;
use crate::stacks::{written, RankPid, Sampler};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use toporun_shared::stacks::progress::{Progress, Sample};
use toporun_shared::stacks::{merge, render_text, RankStack};

/// The ranks running now (the supervisor adds and removes them).
pub type LiveRanks = Arc<Mutex<Vec<RankPid>>>;

/// How often ranks are sampled: a twentieth of the timeout, between 0.25 s and 1 s
/// (a loop over two lines must not read the same line at every sample).
pub fn interval(timeout: Duration) -> Duration {
    (timeout / 20).clamp(Duration::from_millis(250), Duration::from_secs(1))
}

/// Most frames a group's line shows.
const FRAMES_SHOWN: usize = 6;

/// The report for a hang: every rank's stack grouped, and the rank(s) that differ.
pub fn report(stacks: &[RankStack], stalled: Duration, timeout: Duration) -> String {
    let groups = merge(stacks);
    let mut out = format!(
        "toporun: hang: no rank has made progress for {:.0}s (--hang-timeout {:.0}s); where each stands, the odd ones first:\n",
        stalled.as_secs_f64(),
        timeout.as_secs_f64()
    );
    out.push_str(&render_text(&groups, FRAMES_SHOWN));
    match groups.as_slice() {
        [odd, .., most] if odd.ranks.len() < most.ranks.len() => {
            let who = odd.ranks.iter().map(u32::to_string).collect::<Vec<_>>();
            let (what, where_) = match most.frames.first() {
                Some(f) => ("wait in", f.function.as_str()),
                None => ("stand", "elsewhere"),
            };
            out.push_str(&format!(
                "toporun: hang: rank {} is not where the other {} {what} {where_}: it most likely holds them up\n",
                who.join(","),
                most.ranks.len(),
            ));
        }
        [_] => out.push_str("toporun: hang: every rank stands at the same place: look for a peer on another node, a dead data-loader worker, or a step longer than --hang-timeout\n"),
        _ => {}
    }
    out
}

/// How often ranks are sampled without --hang-timeout.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Stops the watcher thread when dropped (the attempt ended).
pub struct Watcher {
    done: Arc<AtomicBool>,
    /// Each rank's last sample that had Python frames, by pid.
    last: Arc<Mutex<HashMap<i32, RankStack>>>,
}

impl Watcher {
    /// The stacks of `ranks` now, each rank with no Python frame left (exiting, as
    /// gloo peers do within milliseconds of a failure) shown as last sampled.
    pub fn stacks_now(&self, ranks: &[RankPid]) -> Vec<RankStack> {
        let fresh = Sampler::default().capture(ranks, Duration::from_secs(1));
        let last = self.last.lock().map(|l| l.clone()).unwrap_or_default();
        fresh
            .into_iter()
            .map(|s| match last.get(&s.pid) {
                Some(seen) if s.main_thread().is_none() => seen.clone(),
                _ => s,
            })
            .collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// Starts sampling `ranks`; with `watch`, each hang's report is printed, counted in
/// `on_hang`, and sent on the returned channel.
pub fn start(
    ranks: LiveRanks,
    watch: Option<HangWatch>,
    on_hang: impl Fn(&str) + Send + 'static,
) -> (Watcher, mpsc::UnboundedReceiver<String>) {
    let done = Arc::new(AtomicBool::new(false));
    let last: Arc<Mutex<HashMap<i32, RankStack>>> = Default::default();
    let (tx, rx) = mpsc::unbounded_channel();
    let (stop, keep) = (done.clone(), last.clone());
    let every = watch.map_or(DEFAULT_INTERVAL, |w| interval(w.timeout));
    std::thread::spawn(move || {
        let mut sampler = Sampler::default();
        let mut progress = Progress::new();
        let (mut reported, mut refused) = (false, false);
        let root = Root::live();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(every);
            let live: Vec<RankPid> = ranks.lock().map(|r| r.clone()).unwrap_or_default();
            if live.is_empty() || stop.load(Ordering::Relaxed) {
                continue;
            }
            let stacks = sampler.capture(&live, Duration::from_secs(1));
            if let Ok(mut l) = keep.lock() {
                l.retain(|pid, _| live.iter().any(|r| r.pid == *pid));
                for s in stacks.iter().filter(|s| s.main_thread().is_some()) {
                    l.insert(s.pid, s.clone());
                }
            }
            let Some(watch) = watch else {
                continue;
            };
            // Without stacks a compute loop would look hung: watch nothing then.
            if let Some(e) = stacks
                .iter()
                .find_map(|s| s.error.as_ref())
                .filter(|_| stacks.iter().all(|s| s.error.is_some()))
            {
                if !refused {
                    eprintln!(
                        "toporun: warning: hang detection off: cannot read the ranks' stacks ({e})"
                    );
                    refused = true;
                }
                continue;
            }
            let now = Instant::now();
            for s in &stacks {
                let w = written(&root, s.pid).unwrap_or(0);
                progress.observe(s.rank, Sample::of(s, w), now);
            }
            let ids: Vec<u32> = live.iter().map(|r| r.rank).collect();
            match progress.hung(&ids, watch.timeout, now) {
                Some(stalled) if !reported => {
                    let text = report(&stacks, stalled, watch.timeout);
                    eprint!("{text}");
                    on_hang(&text);
                    let _ = tx.send(text);
                    reported = true;
                }
                Some(_) => {}
                // Progress again: a later hang is reported anew.
                None => reported = false,
            }
        }
    });
    (Watcher { done, last }, rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use toporun_shared::stacks::{Frame, ThreadStack};

    fn rank(rank: u32, function: &str) -> RankStack {
        RankStack {
            rank,
            local_rank: rank,
            pid: 1,
            threads: vec![ThreadStack {
                thread: None,
                frames: vec![Frame {
                    function: function.into(),
                    file: "train.py".into(),
                    line: 7,
                }],
            }],
            error: None,
        }
    }

    #[test]
    fn the_report_names_the_odd_rank_and_the_others_call() {
        let stacks = [
            rank(0, "all_reduce"),
            rank(1, "all_reduce"),
            rank(2, "all_reduce"),
            rank(3, "wait_for_data"),
        ];
        let text = report(&stacks, Duration::from_secs(10), Duration::from_secs(10));
        assert!(
            text.contains("rank 3: wait_for_data (train.py:7)"),
            "{text}"
        );
        assert!(
            text.contains("rank 3 is not where the other 3 wait in all_reduce"),
            "{text}"
        );
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
