//! One rank's recent samples over a rolling window: what it was doing at each
//! stack sample, with the counters read beside it (its CPU time, its CPU cgroup's
//! throttling, its GPU's clocks and error counters). From the window come the
//! rank's wait share and what it spends its time on.

use super::activity::Activity;
use crate::flight_recorder::{GpuTime, KindBusbw};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Why a GPU's clocks are below their maximum (NVML's clocks event reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClockLimit {
    Idle,
    ApplicationClocks,
    PowerCap,
    HwSlowdown,
    SyncBoost,
    SwThermal,
    HwThermal,
    HwPowerBrake,
    DisplayClock,
}

impl ClockLimit {
    /// A limit that slows a busy GPU (not idling or following a setting).
    pub fn slows(self) -> bool {
        matches!(
            self,
            ClockLimit::PowerCap
                | ClockLimit::HwSlowdown
                | ClockLimit::SwThermal
                | ClockLimit::HwThermal
                | ClockLimit::HwPowerBrake
        )
    }
}

/// A GPU as read at one sample (NVML).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuNow {
    pub index: u32,
    pub util_pct: Option<u32>,
    pub sm_mhz: Option<u32>,
    pub sm_max_mhz: Option<u32>,
    #[serde(default)]
    pub limits: Vec<ClockLimit>,
    pub pcie_replays: Option<u64>,
    pub nvlink_errors: Option<u64>,
}

/// A CPU cgroup's throttling counters (cpu.stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Throttling {
    pub periods: u64,
    pub throttled: u64,
    pub throttled_us: u64,
}

impl Throttling {
    /// A cgroup's `cpu.stat`: v2's `nr_periods`, `nr_throttled`, `throttled_usec`;
    /// v1's `throttled_time` in nanoseconds.
    pub fn parse(cpu_stat: &str) -> Option<Throttling> {
        let field = |name: &str| {
            cpu_stat.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == name).then(|| v.trim().parse::<u64>().ok())?
            })
        };
        let throttled_us =
            field("throttled_usec").or_else(|| Some(field("throttled_time")? / 1000))?;
        Some(Throttling {
            periods: field("nr_periods")?,
            throttled: field("nr_throttled")?,
            throttled_us,
        })
    }
}

/// One sample of one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub at: Duration,
    pub activity: Activity,
    /// Its innermost user frame, as `function (file:line)`.
    pub place: Option<String>,
    /// CPU time of the rank's process so far.
    pub cpu: Option<Duration>,
    pub rss_bytes: Option<u64>,
    pub throttling: Option<Throttling>,
    pub gpu: Option<GpuNow>,
}

/// A rank's GPU time inside collectives as one flight-recorder dump showed it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    pub at: Duration,
    pub time: GpuTime,
}

/// A rank's samples over the last `span`.
#[derive(Debug, Clone)]
pub struct RankWindow {
    span: Duration,
    first: Option<Duration>,
    readings: VecDeque<Reading>,
    gpu: VecDeque<GpuReading>,
}

/// A rank's GPU time inside collectives over a window, from the dumps taken in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuWait {
    /// Share of the time the dumps covered that its GPU spent in collectives (0..=1).
    pub share: f64,
    /// The share in each third of the window, oldest first (none: no dump then).
    pub thirds: [Option<f64>; 3],
    pub dumps: u32,
    /// Seconds of training the dumps covered.
    pub covered_s: f64,
    /// Each collective kind's bus bandwidth over the dumps.
    pub busbw: Vec<KindBusbw>,
    /// The share on each communicator its GPU time was read from (NCCL's counters).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comms: Vec<CommWait>,
}

/// A rank's GPU time on one communicator over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommWait {
    /// NCCL's communicator hash: the same on every member.
    pub comm: u64,
    pub share: f64,
    pub thirds: [Option<f64>; 3],
    /// It carries send/recv (`CommTime::p2p`): not compared, it says the stages.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub p2p: bool,
}

/// Fewest samples a share is computed from.
pub const MIN_SAMPLES: usize = 20;

/// What a full window says of a rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowSummary {
    /// Share of samples in collectives (0..=1).
    pub wait: f64,
    /// The wait share in each third of the window, oldest first: a slowdown shorter
    /// than a third of the window leaves at least one third untouched.
    #[serde(default)]
    pub thirds: [f64; 3],
    pub samples: u32,
    /// What it does most when not in a collective, and where.
    pub spends: Option<Activity>,
    pub place: Option<String>,
    /// CPU time over wall time, in % of one core.
    pub cpu_pct: Option<f64>,
    /// Its CPU cgroup's throttling during the window.
    pub throttled: Option<Throttling>,
    /// PCIe replays and NVLink errors its GPU counted during the window.
    pub pcie_replays: Option<u64>,
    pub nvlink_errors: Option<u64>,
    /// Its GPU's clocks over the window, where NVML read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clocks: Option<GpuClocks>,
    /// Its GPU's time inside collectives, where the ranks time them (NCCL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_wait: Option<GpuWait>,
}

/// A GPU's SM clock over a window, and what held it down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuClocks {
    pub sm_mhz_mean: f64,
    /// Share of samples with a limit that slows a busy GPU (thermal, power cap,
    /// hardware slowdown, power brake).
    pub slowed: f64,
    /// Those limits, as seen during the window.
    pub slowed_by: Vec<ClockLimit>,
}

impl RankWindow {
    pub fn new(span: Duration) -> Self {
        RankWindow {
            span,
            first: None,
            readings: VecDeque::new(),
            gpu: VecDeque::new(),
        }
    }

    /// A dump's GPU time for this rank.
    pub fn push_gpu(&mut self, g: GpuReading) {
        let keep_from = g.at.saturating_sub(self.span);
        self.gpu.push_back(g);
        while self.gpu.front().is_some_and(|x| x.at < keep_from) {
            self.gpu.pop_front();
        }
    }

    /// The last dump's GPU time.
    pub fn gpu_last(&self) -> Option<&GpuTime> {
        self.gpu.back().map(|g| &g.time)
    }

    /// The GPU wait over the window ending at `end`, from the dumps in it.
    fn gpu_wait(&self, end: Duration) -> Option<GpuWait> {
        let (share, thirds) = self.shares(end, |t| Some(t.busy_ns))?;
        let mut hashes: Vec<u64> = self
            .gpu
            .iter()
            .flat_map(|g| g.time.comms.iter().map(|c| c.comm))
            .collect();
        hashes.sort_unstable();
        hashes.dedup();
        let comms = hashes
            .into_iter()
            .filter_map(|comm| {
                let of = |t: &GpuTime| t.comms.iter().find(|c| c.comm == comm).copied();
                let p2p = self.gpu.iter().any(|g| of(&g.time).is_some_and(|c| c.p2p));
                let (share, thirds) = self.shares(end, |t| Some(of(t)?.busy_ns))?;
                Some(CommWait {
                    comm,
                    share,
                    thirds,
                    p2p,
                })
            })
            .collect();
        Some(GpuWait {
            share,
            thirds,
            dumps: self.gpu.len() as u32,
            covered_s: self.gpu.iter().map(|g| g.time.span_ns).sum::<u64>() as f64 / 1e9,
            busbw: merged_busbw(self.gpu.iter().map(|g| &g.time)),
            comms,
        })
    }

    /// The share of the spans that `busy` gives time for (None: not that reading's),
    /// over the whole window ending at `end` and in each third of it.
    fn shares(
        &self,
        end: Duration,
        busy: impl Fn(&GpuTime) -> Option<u64>,
    ) -> Option<(f64, [Option<f64>; 3])> {
        let share = |g: &mut dyn Iterator<Item = &GpuReading>| {
            let (b, s) = g.fold((0u64, 0u64), |(b, s), x| match busy(&x.time) {
                Some(ns) => (b + ns, s + x.time.span_ns),
                None => (b, s),
            });
            (s > 0).then(|| b as f64 / s as f64)
        };
        let all = share(&mut self.gpu.iter())?;
        let third = self.span / 3;
        let thirds = [0u32, 1, 2].map(|k| {
            let (from, to) = (
                end.saturating_sub(third * (3 - k)),
                end.saturating_sub(third * (2 - k)),
            );
            let last = k == 2;
            share(
                &mut self
                    .gpu
                    .iter()
                    .filter(|g| g.at > from && (g.at <= to || last)),
            )
        });
        Some((all, thirds))
    }

    pub fn push(&mut self, r: Reading) {
        self.first.get_or_insert(r.at);
        let keep_from = r.at.saturating_sub(self.span);
        self.readings.push_back(r);
        while self.readings.front().is_some_and(|x| x.at < keep_from) {
            self.readings.pop_front();
        }
    }

    pub fn last(&self) -> Option<&Reading> {
        self.readings.back()
    }

    /// CPU % of one core between the last two samples (what `top` shows now).
    pub fn cpu_now(&self) -> Option<f64> {
        let n = self.readings.len();
        let (a, b) = (self.readings.get(n.checked_sub(2)?)?, self.readings.back()?);
        cpu_pct(a, b)
    }

    /// The window's summary once the rank has been watched a whole window.
    /// Whether its GPU ran kernels (NVML's utilization above 0) at a reading since
    /// `from`; None where no reading since had its GPU's utilization.
    pub fn gpu_busy_since(&self, from: Duration) -> Option<bool> {
        let utils: Vec<u32> = self
            .readings
            .iter()
            .filter(|r| r.at >= from)
            .filter_map(|r| r.gpu.as_ref()?.util_pct)
            .collect();
        (!utils.is_empty()).then(|| utils.iter().any(|u| *u > 0))
    }

    pub fn summary(&self) -> Option<WindowSummary> {
        let (first, last) = (self.readings.front()?, self.readings.back()?);
        let watched = last.at.saturating_sub(self.first?);
        if watched < self.span || self.readings.len() < MIN_SAMPLES {
            return None;
        }
        let n = self.readings.len();
        let count = |a: Activity| self.readings.iter().filter(|r| r.activity == a).count();
        let spends = [
            Activity::GpuWait,
            Activity::Backward,
            Activity::Compute,
            Activity::Data,
            Activity::Checkpoint,
            Activity::Blocked,
        ]
        .into_iter()
        .filter(|a| count(*a) > 0)
        .max_by_key(|a| count(*a));
        let delta = |f: fn(&Reading) -> Option<u64>| Some(f(last)?.saturating_sub(f(first)?));
        Some(WindowSummary {
            wait: self.readings.iter().filter(|r| r.activity.waits()).count() as f64 / n as f64,
            thirds: self.thirds(last.at),
            samples: n as u32,
            spends,
            place: spends.and_then(|a| self.commonest_place(a)),
            cpu_pct: cpu_pct(first, last),
            throttled: first
                .throttling
                .zip(last.throttling)
                .map(|(a, b)| Throttling {
                    periods: b.periods.saturating_sub(a.periods),
                    throttled: b.throttled.saturating_sub(a.throttled),
                    throttled_us: b.throttled_us.saturating_sub(a.throttled_us),
                }),
            pcie_replays: delta(|r| r.gpu.as_ref()?.pcie_replays),
            nvlink_errors: delta(|r| r.gpu.as_ref()?.nvlink_errors),
            clocks: self.clocks(),
            gpu_wait: self.gpu_wait(last.at),
        })
    }

    /// The wait share in each third of the window ending at `end`.
    fn thirds(&self, end: Duration) -> [f64; 3] {
        let third = self.span / 3;
        let mut counts = [(0usize, 0usize); 3];
        for r in &self.readings {
            let back = end.saturating_sub(r.at);
            let k = 2 - (back.as_nanos() / third.as_nanos().max(1)).min(2) as usize;
            counts[k].0 += 1;
            counts[k].1 += usize::from(r.activity.waits());
        }
        counts.map(|(n, waits)| if n == 0 { 0.0 } else { waits as f64 / n as f64 })
    }

    /// The GPU's mean SM clock and slowing limits over the window.
    fn clocks(&self) -> Option<GpuClocks> {
        let read: Vec<&GpuNow> = self
            .readings
            .iter()
            .filter_map(|r| r.gpu.as_ref())
            .collect();
        let mhz: Vec<u32> = read.iter().filter_map(|g| g.sm_mhz).collect();
        if mhz.is_empty() {
            return None;
        }
        let slowing = |g: &&&GpuNow| g.limits.iter().any(|l| l.slows());
        let mut slowed_by: Vec<ClockLimit> = read
            .iter()
            .flat_map(|g| g.limits.iter().copied().filter(|l| l.slows()))
            .collect();
        slowed_by.sort();
        slowed_by.dedup();
        Some(GpuClocks {
            sm_mhz_mean: mhz.iter().map(|m| f64::from(*m)).sum::<f64>() / mhz.len() as f64,
            slowed: read.iter().filter(slowing).count() as f64 / read.len() as f64,
            slowed_by,
        })
    }

    fn commonest_place(&self, a: Activity) -> Option<String> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for r in self.readings.iter().filter(|r| r.activity == a) {
            if let Some(p) = &r.place {
                *counts.entry(p).or_default() += 1;
            }
        }
        let top = counts.into_iter().max_by_key(|(_, n)| *n)?;
        Some(top.0.to_string())
    }
}

/// Each kind's bus bandwidth over several dumps, weighted by their collectives.
fn merged_busbw<'a>(times: impl Iterator<Item = &'a GpuTime>) -> Vec<KindBusbw> {
    let mut by: BTreeMap<&str, (f64, u32, u64)> = BTreeMap::new();
    for b in times.flat_map(|t| t.busbw.iter()) {
        let k = by.entry(&b.kind).or_default();
        let n = u64::from(b.count);
        (k.0, k.1, k.2) = (
            k.0 + b.gbps * f64::from(b.count),
            k.1 + b.count,
            k.2 + b.mean_bytes * n,
        );
    }
    by.into_iter()
        .filter(|(_, (_, n, _))| *n > 0)
        .map(|(kind, (sum, n, bytes))| KindBusbw {
            kind: kind.to_string(),
            gbps: sum / f64::from(n),
            count: n,
            mean_bytes: bytes / u64::from(n),
        })
        .collect()
}

fn cpu_pct(a: &Reading, b: &Reading) -> Option<f64> {
    let wall = b.at.checked_sub(a.at)?.as_secs_f64();
    let cpu = b.cpu?.checked_sub(a.cpu?)?.as_secs_f64();
    (wall > 0.0).then(|| 100.0 * cpu / wall)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_of_both_cgroup_versions_parses() {
        let v1 = "nr_periods 120\nnr_throttled 80\nthrottled_time 4000000000\nnr_bursts 0\n";
        let v2 = "usage_usec 9\nnr_periods 10\nnr_throttled 2\nthrottled_usec 1500\n";
        let t = |periods, throttled, throttled_us| Throttling {
            periods,
            throttled,
            throttled_us,
        };
        assert_eq!(Throttling::parse(v1), Some(t(120, 80, 4_000_000)));
        assert_eq!(Throttling::parse(v2), Some(t(10, 2, 1500)));
        assert_eq!(Throttling::parse("usage_usec 9\n"), None);
    }

    /// The GPU wait share weighs each dump by the span it covered, and each third
    /// of the window has its own (none where no dump fell in it).
    #[test]
    fn gpu_wait_is_weighed_by_span_and_kept_per_third() {
        let mut w = RankWindow::new(Duration::from_secs(30));
        for s in 0..=30 {
            w.push(reading(s * 1000, Activity::Compute, "f (a.py:1)", s * 900));
        }
        let gpu = |s: u64, span_ms: u64, busy_ms: u64| GpuReading {
            at: Duration::from_secs(s),
            time: GpuTime {
                rank: 0,
                span_ns: span_ms * 1_000_000,
                busy_ns: busy_ms * 1_000_000,
                timed: 100,
                busbw: Vec::new(),
                comms: Vec::new(),
            },
        };
        // First third: none; second: 60% over 1 s; last: 10% over 3 s.
        w.push_gpu(gpu(15, 1000, 600));
        w.push_gpu(gpu(25, 3000, 300));
        let g = w.summary().unwrap().gpu_wait.unwrap();
        assert!((g.share - 0.225).abs() < 1e-9, "{g:?}");
        assert_eq!(g.thirds[0], None);
        assert!((g.thirds[1].unwrap() - 0.6).abs() < 1e-9, "{g:?}");
        assert!((g.thirds[2].unwrap() - 0.1).abs() < 1e-9, "{g:?}");
        assert_eq!((g.dumps, g.covered_s), (2, 4.0));
        // A dump older than the window leaves it.
        w.push_gpu(gpu(50, 1000, 500));
        assert_eq!(w.gpu.len(), 2);
    }

    /// Each communicator's share is over the readings that timed it: one missing
    /// from a reading (too few of its operations timed then) is not read as idle.
    #[test]
    fn each_communicators_share_is_over_the_readings_that_timed_it() {
        use crate::flight_recorder::CommTime;
        let mut w = RankWindow::new(Duration::from_secs(30));
        for s in 0..=30 {
            w.push(reading(s * 1000, Activity::Compute, "f (a.py:1)", s * 900));
        }
        let gpu = |s: u64, span_ms: u64, comms: &[(u64, u64)]| GpuReading {
            at: Duration::from_secs(s),
            time: GpuTime {
                rank: 0,
                span_ns: span_ms * 1_000_000,
                busy_ns: comms.iter().map(|c| c.1).max().unwrap_or(0) * 1_000_000,
                timed: 100,
                busbw: Vec::new(),
                comms: comms
                    .iter()
                    .map(|&(comm, ms)| CommTime {
                        comm,
                        busy_ns: ms * 1_000_000,
                        p2p: false,
                    })
                    .collect(),
            },
        };
        w.push_gpu(gpu(15, 1000, &[(7, 600), (9, 100)]));
        w.push_gpu(gpu(25, 3000, &[(7, 300)]));
        let g = w.summary().unwrap().gpu_wait.unwrap();
        let on = |comm| g.comms.iter().find(|c| c.comm == comm).unwrap();
        assert!((on(7).share - 0.225).abs() < 1e-9, "{g:?}");
        assert!((on(9).share - 0.1).abs() < 1e-9, "{g:?}");
        assert_eq!(on(9).thirds[2], None);
        assert!((on(7).thirds[2].unwrap() - 0.1).abs() < 1e-9, "{g:?}");
    }

    fn reading(ms: u64, activity: Activity, place: &str, cpu_ms: u64) -> Reading {
        Reading {
            at: Duration::from_millis(ms),
            activity,
            place: Some(place.into()),
            cpu: Some(Duration::from_millis(cpu_ms)),
            rss_bytes: None,
            throttling: Some(Throttling {
                periods: ms / 100,
                throttled: ms / 200,
                throttled_us: ms * 10,
            }),
            gpu: None,
        }
    }

    #[test]
    fn a_share_comes_only_from_a_whole_window() {
        let mut w = RankWindow::new(Duration::from_secs(10));
        // One sample every 250 ms, one in four in a collective, CPU busy half the time.
        for i in 0..40u64 {
            let a = if i % 4 == 0 {
                Activity::Collective
            } else {
                Activity::Compute
            };
            w.push(reading(i * 250, a, "step (train.py:9)", i * 125));
            assert!(w.summary().is_none(), "only {i} samples over {}ms", i * 250);
        }
        w.push(reading(
            10_000,
            Activity::Data,
            "__getitem__ (data.py:4)",
            5000,
        ));
        let s = w.summary().unwrap();
        assert_eq!(s.samples, 41);
        assert!((s.wait - 10.0 / 41.0).abs() < 1e-9, "{}", s.wait);
        assert_eq!(s.spends, Some(Activity::Compute));
        assert_eq!(s.place.as_deref(), Some("step (train.py:9)"));
        assert!((s.cpu_pct.unwrap() - 50.0).abs() < 1e-9);
        assert_eq!(s.throttled.unwrap().throttled, 50);
    }

    #[test]
    fn each_third_of_the_window_has_its_own_share() {
        let mut w = RankWindow::new(Duration::from_secs(12));
        // Samples at 0..=12 s, every 250 ms: waits in the oldest third only, half the
        // time in the middle one, never in the newest.
        for i in 0..=48u64 {
            let a = match i {
                0..=16 => Activity::Collective,
                17..=32 if i % 2 == 0 => Activity::Collective,
                _ => Activity::Compute,
            };
            w.push(reading(i * 250, a, "step (t.py:1)", 0));
        }
        let s = w.summary().unwrap();
        // By age: [8, 12] s ago holds 0..=16, [4, 8) holds 17..=32, [0, 4) the rest.
        assert_eq!(s.thirds, [1.0, 0.5, 0.0], "{:?}", s.thirds);
        assert!((s.wait - 25.0 / 49.0).abs() < 1e-9, "{}", s.wait);
    }

    #[test]
    fn old_samples_leave_the_window() {
        let mut w = RankWindow::new(Duration::from_secs(10));
        for i in 0..40u64 {
            w.push(reading(i * 250, Activity::Collective, "x", 0));
        }
        for i in 40..120u64 {
            w.push(reading(i * 250, Activity::Compute, "y (t.py:1)", 0));
        }
        let s = w.summary().unwrap();
        assert_eq!(s.wait, 0.0, "the collective samples are older than 10 s");
        assert_eq!(s.samples, 41);
        assert_eq!(w.cpu_now(), Some(0.0));
    }

    #[test]
    fn a_gpus_clock_and_its_slowing_limits_are_kept_over_the_window() {
        let mut w = RankWindow::new(Duration::from_secs(10));
        for i in 0..=40u64 {
            let mut r = reading(i * 250, Activity::Compute, "step (t.py:1)", 0);
            let hot = i % 2 == 0;
            r.gpu = Some(GpuNow {
                index: 3,
                sm_mhz: Some(if hot { 1200 } else { 1800 }),
                limits: if hot {
                    vec![ClockLimit::HwThermal, ClockLimit::Idle]
                } else {
                    vec![ClockLimit::Idle]
                },
                ..Default::default()
            });
            w.push(r);
        }
        let c = w.summary().unwrap().clocks.unwrap();
        assert!((c.sm_mhz_mean - (21.0 * 1200.0 + 20.0 * 1800.0) / 41.0).abs() < 1e-9);
        assert!((c.slowed - 21.0 / 41.0).abs() < 1e-9, "{}", c.slowed);
        assert_eq!(
            c.slowed_by,
            vec![ClockLimit::HwThermal],
            "idling does not slow"
        );
    }
}
