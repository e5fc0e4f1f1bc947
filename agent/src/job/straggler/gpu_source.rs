//! Where each rank's GPU time inside collectives comes from while the job trains:
//! NCCL's own counters (toporun's profiler plugin loaded: read every twelfth of the
//! window, nothing asked of the ranks), else flight-recorder dumps asked through
//! each rank's pipe.

use super::gpu_dumps::GpuDumps;
use super::link_watch::LinkWatch;
use crate::nccl_counters::CountersFiles;
use crate::stacks::RankPid;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use toporun_shared::flight_recorder::{gpu_times, GpuTime};
use toporun_shared::nccl_counters::{window, RankCounters};

pub enum GpuSource {
    Dumps(GpuDumps),
    Counters(CounterWindows),
}

/// Each rank's counters at the last look, and when.
pub struct CounterWindows {
    files: CountersFiles,
    every: Duration,
    last: HashMap<u32, (Instant, RankCounters)>,
    due: Option<Instant>,
    /// When the first look was taken, and whether their absence was said.
    first: Option<Instant>,
    said_none: bool,
}

/// How long the ranks may train before a missing counters file is said.
const NONE_SAID_AFTER: Duration = Duration::from_secs(60);

impl CounterWindows {
    pub fn new(files: CountersFiles, every: Duration) -> CounterWindows {
        CounterWindows {
            files,
            every,
            last: HashMap::new(),
            due: None,
            first: None,
            said_none: false,
        }
    }

    /// When due: each rank's GPU time since its last reading, and the window's link
    /// speeds said to `links`.
    fn tick(
        &mut self,
        live: &[RankPid],
        links: Option<&mut LinkWatch>,
    ) -> (Vec<GpuTime>, Option<String>) {
        let now = Instant::now();
        if self.due.is_some_and(|d| now < d) {
            return (Vec::new(), None);
        }
        self.due = Some(now + self.every);
        self.last.retain(|r, _| live.iter().any(|l| l.rank == *r));
        let (read, unreadable) = self.files.read(live);
        self.say_if_none(read.is_empty() && unreadable.is_empty(), now);
        // Each rank's last reading and this one, the window between them.
        let pairs: Vec<(u32, Duration, &RankCounters, &RankCounters)> = read
            .iter()
            .filter_map(|(r, c)| self.last.get(r).map(|(at, b)| (*r, now - *at, b, c)))
            .collect();
        let judged = window::judged_comms(
            &pairs
                .iter()
                .map(|(r, _, b, c)| (*r, *b, *c))
                .collect::<Vec<_>>(),
        );
        let times = pairs
            .iter()
            .filter_map(|(r, span, b, c)| window::gpu_time(*r, b, c, *span, *judged.get(r)?))
            .collect();
        let line = links.and_then(|w| {
            let refs: Vec<(&RankCounters, &RankCounters)> =
                pairs.iter().map(|(_, _, b, c)| (*b, *c)).collect();
            w.judge(&window::link_speeds(&refs, w.model()))
        });
        self.last
            .extend(read.into_iter().map(|(r, c)| (r, (now, c))));
        (times, line)
    }
}

impl CounterWindows {
    /// Says once that no rank wrote counters a minute into the job: their NCCL did
    /// not load the plugin, and nothing times their GPUs.
    fn say_if_none(&mut self, none: bool, now: Instant) {
        let first = *self.first.get_or_insert(now);
        if !none || self.said_none || now - first < NONE_SAID_AFTER {
            return;
        }
        self.said_none = true;
        crate::console::say_warning!(
            "no rank has written NCCL counters after {}s: their NCCL did not load toporun's profiler plugin (an NCCL before 2.28.3 has no profiler v5), made no communicator, or the plugin could not make its file (NCCL_DEBUG=INFO shows its 'toporun profiler' lines); nothing times their GPUs: --nccl-profiler off gives the flight-recorder timing",
            NONE_SAID_AFTER.as_secs()
        );
    }
}

impl GpuSource {
    /// The GPU times that came in at this sample, and a slow-links line to say.
    /// `moved`: some rank's stack moved since the last sample (dumps are asked only
    /// then).
    pub fn tick(
        &mut self,
        live: &[RankPid],
        moved: bool,
        links: Option<&mut LinkWatch>,
    ) -> (Vec<GpuTime>, Option<String>) {
        match self {
            GpuSource::Dumps(g) => {
                let dumps = g.tick(live, moved);
                let line = links.and_then(|w| w.observe(&dumps));
                (gpu_times(&dumps), line)
            }
            GpuSource::Counters(c) => c.tick(live, links),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toporun_shared::nccl_counters::words::Words;
    use toporun_shared::nccl_counters::{counters_file, NcclFunc};

    fn live(rank: u32) -> RankPid {
        RankPid {
            rank,
            local_rank: rank,
            pid: 1,
        }
    }

    /// Rank `rank`'s file after `n` all_reduces of 4 MiB of `gpu_us` each.
    fn write(dir: &std::path::Path, rank: u32, n: u64, gpu_us: u64) {
        let f = counters_file(dir, rank);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        let mut w = Words::default();
        w.comm(0, 9, rank, 2)
            .ops(0, NcclFunc::AllReduce, 4 << 20, n, n, gpu_us * 1000);
        std::fs::write(f, w.bytes()).unwrap();
    }

    /// Two readings of the counters make each rank's GPU time over the window between
    /// them: the rank that waited (600 us an all_reduce) against the one it waited for.
    #[test]
    fn counters_read_twice_give_each_rank_its_window() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = CounterWindows::new(
            CountersFiles::new(dir.path().into()),
            Duration::from_secs(5),
        );
        let ranks = [live(0), live(1)];
        write(dir.path(), 0, 100, 600);
        write(dir.path(), 1, 100, 150);
        assert!(
            c.tick(&ranks, None).0.is_empty(),
            "one reading: no window yet"
        );
        write(dir.path(), 0, 110, 600);
        write(dir.path(), 1, 110, 150);
        assert!(c.tick(&ranks, None).0.is_empty(), "not due");
        c.due = None;
        std::thread::sleep(Duration::from_millis(50));
        let (times, _) = c.tick(&ranks, None);
        assert_eq!(times.len(), 2);
        assert_eq!((times[0].rank, times[0].timed), (0, 10));
        assert_eq!((times[0].busy_ns, times[1].busy_ns), (6_000_000, 1_500_000));
        assert!(times[0].span_ns >= 50_000_000, "{times:?}");
        assert_eq!(times[1].busbw[0].count, 10);
    }

    /// A file that does not read (a plugin of another toporun) is said as such where
    /// it is read, never as NCCL not loading the plugin: past the minute, with only
    /// unreadable files, "no rank has written NCCL counters" stays unsaid.
    #[test]
    fn an_unreadable_file_is_not_a_plugin_that_did_not_load() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = CounterWindows::new(CountersFiles::new(dir.path().into()), Duration::ZERO);
        let f = counters_file(dir.path(), 0);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        let mut other = Words::default();
        other.0[toporun_shared::nccl_counters::layout::H_VERSION] = 99;
        std::fs::write(&f, other.bytes()).unwrap();
        c.first = Some(Instant::now() - NONE_SAID_AFTER * 2);
        let (times, _) = c.tick(&[live(0)], None);
        assert!(times.is_empty());
        assert!(
            !c.said_none,
            "an unreadable file was called a plugin that did not load"
        );
        std::fs::remove_file(&f).unwrap();
        c.due = None;
        c.tick(&[live(0)], None);
        assert!(c.said_none, "no file at all, a minute in: said");
    }
}
