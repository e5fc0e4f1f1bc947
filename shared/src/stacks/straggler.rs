//! Which rank holds the job back. In synchronous training every rank waits in the
//! collectives for the slowest, so the straggler is the rank that waits least: its
//! wait share far below the others' median over a whole window. Each rank's row is
//! what `toporun top` shows and what a node publishes for the job-wide decision.
//!
//! The rule (measured on 4-rank gloo jobs, docs/stragglers.md): a rank is a
//! straggler when the median wait share of the other ranks is at least
//! [`MIN_MEDIAN`] (the job does wait on someone), and its own is at most half of
//! that median and [`MIN_GAP`] below it; in each third of the window it must also be
//! below the others by the hold rule, so that a slowdown shorter than a third of the
//! window (rank 0 logging for a few seconds), which leaves one third untouched, names
//! nobody (a third holds 40 samples: with 20, sampling alone put a rank ten points
//! below the others there and CI named rank 0 of a balanced job after its logging). A rank named stays named until its share
//! comes back within [`HOLD_RATIO`] of the median or [`HOLD_GAP`] of it (shares
//! wander by ten points from window to window). A change is said once it has held
//! for a quarter of the window, so a few seconds of extra work on one rank says
//! nothing.

use super::activity::Activity;
use super::comm_waits::{CommFar, CommShares};
use super::rank_window::{ClockLimit, GpuNow, GpuWait, WindowSummary};
use super::wait_rule::{far_in_waits, Sorted};
pub use super::wait_rule::{HOLD_GAP, HOLD_RATIO, MAX_RATIO, MIN_GAP, MIN_MEDIAN};
use crate::flight_recorder::{GpuTime, KindBusbw};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A GPU straggler's mean SM clock is at most this fraction of the others' median...
pub const MAX_CLOCK_RATIO: f64 = 0.85;
/// ...with a slowing limit (thermal, power, hardware slowdown) in at least this share
/// of its samples.
pub const MIN_SLOWED: f64 = 0.5;

/// One rank as a node sees it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankRow {
    pub rank: u32,
    pub local_rank: u32,
    pub node_rank: u32,
    pub host: String,
    pub pid: i32,
    /// The GPU (NVML index) the rank uses, where there are GPUs.
    pub gpu: Option<u32>,
    /// That GPU's UUID: what names it on any host view (nvidia-smi -L, the Xid log),
    /// whatever subset of GPUs the container sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    /// What it was doing at the last sample.
    pub now: Option<Activity>,
    pub cpu_pct: Option<f64>,
    pub rss_bytes: Option<u64>,
    pub gpu_now: Option<GpuNow>,
    /// None until the rank has been watched a whole window.
    pub window: Option<WindowSummary>,
    /// Its GPU's time in collectives as the last flight-recorder dump showed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_time: Option<GpuTime>,
}

impl RankRow {
    /// Its GPU wait share over the window, else as the last dump showed it.
    pub fn gpu_wait_share(&self) -> Option<f64> {
        match self.window.as_ref().and_then(|w| w.gpu_wait.as_ref()) {
            Some(g) => Some(g.share),
            None => self.gpu_time.as_ref().map(GpuTime::share),
        }
    }

    /// Each collective kind's bus bandwidth over the window, else the last dump's.
    pub fn busbw_kinds(&self) -> &[KindBusbw] {
        match self.window.as_ref().and_then(|w| w.gpu_wait.as_ref()) {
            Some(g) => &g.busbw,
            None => self.gpu_time.as_ref().map_or(&[], |t| &t.busbw),
        }
    }

    /// One kind's bus bandwidth (GB/s), as [`RankRow::busbw_kinds`].
    pub fn busbw(&self, kind: &str) -> Option<f64> {
        let k = self.busbw_kinds().iter().find(|b| b.kind == kind)?;
        Some(k.gbps)
    }
}

/// A rank the others wait for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    pub rank: u32,
    pub node_rank: u32,
    pub host: String,
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    pub wait: f64,
    /// The other ranks' median wait share, and how many they are.
    pub median: f64,
    pub others: u32,
    pub spends: Option<Activity>,
    pub place: Option<String>,
    pub evidence: Vec<String>,
    pub basis: Basis,
}

/// What the finding rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "kebab-case")]
pub enum Basis {
    /// It waits far less than the others in collectives.
    WaitShare,
    /// Its GPU spends far less time inside collectives than the others' (NCCL: their
    /// kernels wait there for its own); `wait` and `median` are those GPU shares.
    GpuWaitShare {
        /// Seconds of training the dumps covered, in all.
        covered_s: f64,
        /// Compared in one communicator it shares with `others` ranks (overlapping
        /// groups: `comm_waits`), not across the job.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        in_group: bool,
    },
    /// Its GPU runs far slower than the others', held down by a limit: with NCCL the
    /// CPU does not wait in the collective, so the wait shares cannot tell.
    GpuClock {
        mhz: f64,
        median_mhz: f64,
        limits: Vec<ClockLimit>,
    },
}

/// The ranks whose whole-window wait share is far below the others' median, and
/// below theirs by the hold rule in each third of the window too (a few seconds of
/// extra work leave a third untouched); or whose GPU runs far slower than the
/// others' held down by a limit. Those in `held` (named already) by the looser hold
/// rules over the whole window.
pub fn find(rows: &[RankRow], held: &[u32]) -> Vec<Straggler> {
    let full: Vec<(&RankRow, &WindowSummary)> = rows
        .iter()
        .filter_map(|r| Some((r, r.window.as_ref()?)))
        .collect();
    let waits = Sorted::of(full.iter().map(|(_, w)| w.wait));
    let thirds = [0, 1, 2].map(|t| Sorted::of(full.iter().map(|(_, w)| w.thirds[t])));
    let clocks = Sorted::of(
        full.iter()
            .filter_map(|(_, w)| Some(w.clocks.as_ref()?.sm_mhz_mean)),
    );
    let gpu = GpuShares::of(&full);
    let comms = CommShares::of(&full.iter().map(|(_, w)| *w).collect::<Vec<_>>());
    full.iter()
        .filter_map(|(row, w)| {
            let held = held.contains(&row.rank);
            let (basis, wait, m, others) = match w.gpu_wait.as_ref().filter(|_| gpu.judges()) {
                // Under NCCL the stacks cannot tell who waits: the GPUs can, compared
                // where the ranks meet when their communicators are known.
                Some(g) => match gpu_far(&gpu, &comms, full.len(), w, held) {
                    Some(f) => {
                        // Said where it was compared in a group, not across the job.
                        let subset = (f.others as usize + 1) < gpu.all.len();
                        let (covered_s, in_group) = (g.covered_s, f.groups >= 2 || subset);
                        let basis = Basis::GpuWaitShare {
                            covered_s,
                            in_group,
                        };
                        (basis, f.share, f.median, f.others)
                    }
                    None => {
                        let own = w.clocks.as_ref().map(|c| c.sm_mhz_mean);
                        let m = gpu.all.median_without(Some(g.share))?;
                        let basis = slow_gpu(w, clocks.median_without(own)?, held)?;
                        (basis, g.share, m, full.len() as u32 - 1)
                    }
                },
                None => {
                    let m = waits.median_without(Some(w.wait))?;
                    let in_every_third = || {
                        (0..3).all(|t| {
                            let tm = thirds[t].median_without(Some(w.thirds[t]));
                            tm.is_some_and(|tm| far_in_waits(w.thirds[t], tm, true))
                        })
                    };
                    let basis = if far_in_waits(w.wait, m, held) && (held || in_every_third()) {
                        Basis::WaitShare
                    } else {
                        let own = w.clocks.as_ref().map(|c| c.sm_mhz_mean);
                        slow_gpu(w, clocks.median_without(own)?, held)?
                    };
                    (basis, w.wait, m, full.len() as u32 - 1)
                }
            };
            Some(Straggler {
                rank: row.rank,
                node_rank: row.node_rank,
                host: row.host.clone(),
                gpu: row.gpu,
                gpu_uuid: row.gpu_uuid.clone(),
                wait,
                median: m,
                others,
                spends: w.spends,
                place: w.place.clone(),
                evidence: evidence(row, w),
                basis,
            })
        })
        .collect()
}

/// Where the rank's GPU waits far less than the others': in a communicator it shares
/// with them where the rows say which (NCCL's counters), else against the job's.
/// `rows`: how many ranks have a whole window.
fn gpu_far(
    gpu: &GpuShares,
    comms: &CommShares,
    rows: usize,
    w: &WindowSummary,
    held: bool,
) -> Option<CommFar> {
    if !comms.job_wide() {
        return comms.far(w, held);
    }
    let g = w.gpu_wait.as_ref()?;
    let median = gpu.far(g, held)?;
    Some(CommFar {
        share: g.share,
        median,
        others: rows as u32 - 1,
        groups: 1,
    })
}

/// The GPU shares of the ranks whose collectives were timed, whole window and thirds.
struct GpuShares {
    all: Sorted,
    thirds: [Sorted; 3],
}

impl GpuShares {
    fn of(full: &[(&RankRow, &WindowSummary)]) -> GpuShares {
        let waits = || full.iter().filter_map(|(_, w)| w.gpu_wait.as_ref());
        GpuShares {
            all: Sorted::of(waits().map(|g| g.share)),
            thirds: [0, 1, 2].map(|t| Sorted::of(waits().filter_map(|g| g.thirds[t]))),
        }
    }

    /// Two ranks or more were timed.
    fn judges(&self) -> bool {
        self.all.len() >= 2
    }

    /// The others' median where `g` is far below it by the same rule as the CPU's
    /// (and, for a rank not yet named, by the hold rule in every third a dump fell in,
    /// at least two of them).
    fn far(&self, g: &GpuWait, held: bool) -> Option<f64> {
        let m = self.all.median_without(Some(g.share))?;
        if !far_in_waits(g.share, m, held) {
            return None;
        }
        let thirds: Vec<bool> = (0..3)
            .filter_map(|t| {
                let own = g.thirds[t]?;
                let tm = self.thirds[t].median_without(Some(own))?;
                Some(far_in_waits(own, tm, true))
            })
            .collect();
        (held || (thirds.len() >= 2 && thirds.iter().all(|x| *x))).then_some(m)
    }
}

/// The GPU rule: its mean SM clock far below the others' median while a slowing
/// limit held it (named ranks stay named until within 8% of the median).
fn slow_gpu(w: &WindowSummary, median_mhz: f64, held: bool) -> Option<Basis> {
    let c = w.clocks.as_ref()?;
    let (ratio, slowed) = if held {
        (0.92, MIN_SLOWED / 2.0)
    } else {
        (MAX_CLOCK_RATIO, MIN_SLOWED)
    };
    (c.sm_mhz_mean <= median_mhz * ratio && c.slowed >= slowed).then(|| Basis::GpuClock {
        mhz: c.sm_mhz_mean,
        median_mhz,
        limits: c.slowed_by.clone(),
    })
}

/// What toporun read beside the stacks that may explain the rank's slowness.
fn evidence(row: &RankRow, w: &WindowSummary) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = w.cpu_pct {
        out.push(format!(
            "its process used {c:.0}% of a CPU core over the window"
        ));
    }
    if let Some(t) = w.throttled.filter(|t| t.throttled > 0) {
        out.push(format!(
            "its CPU cgroup was throttled in {} of {} periods ({:.1}s held back) during the window: its CPU quota (cpu.max, cpu.cfs_quota_us; a pod's CPU limit) is too small for it",
            t.throttled,
            t.periods,
            t.throttled_us as f64 / 1e6
        ));
    }
    if let Some(g) = &row.gpu_now {
        let slowing: Vec<String> = g
            .limits
            .iter()
            .filter(|l| l.slows())
            .map(|l| format!("{l:?}"))
            .collect();
        if let (Some(sm), Some(max)) = (g.sm_mhz, g.sm_max_mhz) {
            let why = if slowing.is_empty() {
                ", no clock limit".to_string()
            } else {
                format!(", clocks limited by {}", slowing.join(", "))
            };
            let busy = g
                .util_pct
                .map(|u| format!("{u}% busy, "))
                .unwrap_or_default();
            out.push(format!(
                "GPU {}: {busy}SM clock {sm} of {max} MHz{why}",
                g.index
            ));
        }
    }
    if let Some(n) = w.pcie_replays.filter(|n| *n > 0) {
        out.push(format!(
            "its GPU counted {n} PCIe replays during the window (a link retrying transfers)"
        ));
    }
    if let Some(n) = w.nvlink_errors.filter(|n| *n > 0) {
        out.push(format!(
            "its GPU counted {n} NVLink errors during the window"
        ));
    }
    out
}

impl Straggler {
    /// The finding's line and its evidence, as printed.
    pub fn text(&self, span: Duration) -> String {
        let gpu = match (self.gpu, &self.gpu_uuid) {
            (Some(g), Some(u)) => format!(", GPU {g} {u}"),
            (Some(g), None) => format!(", GPU {g}"),
            (None, _) => String::new(),
        };
        let who = format!(
            "rank {} (node {} on {}{gpu})",
            self.rank, self.node_rank, self.host
        );
        let (others, secs) = (self.others, span.as_secs());
        let mut s = match &self.basis {
            Basis::WaitShare => format!(
                "toporun: straggler: {who} waits {:.0}% of the time against a median of {:.0}% for the other {others} over {secs}s: the others wait for it",
                self.wait * 100.0,
                self.median * 100.0,
            ),
            Basis::GpuWaitShare { in_group, .. } => format!(
                "toporun: straggler: {who}: its GPU spends {:.0}% of the time in collectives against {:.0}% for the other {others}{} over {secs}s: they wait for its kernels",
                self.wait * 100.0,
                self.median * 100.0,
                if *in_group {
                    " of a group they share (and not clearly more than its peers in any other of its groups)"
                } else {
                    ""
                },
            ),
            Basis::GpuClock { mhz, median_mhz, limits } => {
                let why: Vec<String> = limits.iter().map(|l| format!("{l:?}")).collect();
                format!(
                    "toporun: straggler: {who}: its GPU's SM clock averaged {mhz:.0} MHz against a median of {median_mhz:.0} MHz for the other {others} over {secs}s, held down by {}: every rank waits for its kernels",
                    why.join(", ")
                )
            }
        };
        if let Some(a) = self.spends {
            // Its GPU is what is slow there: the samples say where its Python thread
            // stands meanwhile, not where its time goes.
            let its = match self.basis {
                Basis::GpuWaitShare { .. } => "its Python thread is mostly in",
                _ => "it spends its time in",
            };
            s.push_str(&format!("; {its} {}", a.describe()));
            if let Some(p) = &self.place {
                s.push_str(&format!(": {p}"));
            }
        }
        for e in &self.evidence {
            s.push_str(&format!("\n  {e}"));
        }
        s
    }
}

/// The job's straggler decision, as the node that decides writes it at every sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StragglerNotice {
    /// Counts the changes said, so each node prints each once.
    pub seq: u32,
    /// The last change's lines (kept until the next change).
    pub said: Vec<String>,
    pub stragglers: Vec<Straggler>,
}

/// Says a change in who straggles once it has held for `confirm`.
#[derive(Debug, Default)]
pub struct Decider {
    said: Vec<u32>,
    pending: Option<(Vec<u32>, Duration)>,
}

/// What changed, to be said.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub found: Vec<Straggler>,
    /// Ranks said before that no longer straggle.
    pub cleared: Vec<u32>,
}

impl Decider {
    pub fn observe(
        &mut self,
        now: Duration,
        found: Vec<Straggler>,
        confirm: Duration,
    ) -> Option<Change> {
        let ranks: Vec<u32> = found.iter().map(|s| s.rank).collect();
        if ranks == self.said {
            self.pending = None;
            return None;
        }
        let since = match &self.pending {
            Some((p, since)) if *p == ranks => *since,
            _ => {
                self.pending = Some((ranks.clone(), now));
                now
            }
        };
        if now.saturating_sub(since) < confirm {
            return None;
        }
        let cleared = self
            .said
            .iter()
            .filter(|r| !ranks.contains(r))
            .copied()
            .collect();
        let new: Vec<Straggler> = found
            .into_iter()
            .filter(|s| !self.said.contains(&s.rank))
            .collect();
        self.said = ranks;
        self.pending = None;
        Some(Change {
            found: new,
            cleared,
        })
    }

    /// The ranks said to straggle now.
    pub fn current(&self) -> &[u32] {
        &self.said
    }
}

/// The job's straggler decision as it goes: who straggles now, and a count of the
/// changes said (other nodes print each change once).
#[derive(Debug, Default)]
pub struct Verdicts {
    decider: Decider,
    pub seq: u32,
    pub current: Vec<Straggler>,
    /// The lines of the last change, kept until the next (a node that reads the
    /// decision later still prints them).
    pub last_said: Vec<String>,
}

impl Verdicts {
    /// Judges the rows of one sample; the lines to print when who straggles changed
    /// (a change is said once it held a quarter of the window).
    pub fn step(&mut self, now: Duration, rows: &[RankRow], span: Duration) -> Vec<String> {
        let found = find(rows, self.decider.current());
        let change = self.decider.observe(now, found.clone(), span / 4);
        let said = self.decider.current();
        self.current = found
            .into_iter()
            .filter(|s| said.contains(&s.rank))
            .collect();
        let Some(c) = change else {
            return Vec::new();
        };
        self.seq += 1;
        let mut lines: Vec<String> = c.found.iter().map(|s| s.text(span)).collect();
        lines.extend(c.cleared.iter().map(|r| {
            format!("toporun: straggler: rank {r} no longer holds the job back (its wait share is back near the others')")
        }));
        self.last_said = lines.clone();
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rank: u32, wait: Option<f64>) -> RankRow {
        RankRow {
            rank,
            local_rank: rank % 2,
            node_rank: rank / 2,
            host: format!("trainer-{}", rank / 2),
            pid: 100 + rank as i32,
            gpu: Some(rank % 2),
            gpu_uuid: None,
            now: Some(Activity::Compute),
            cpu_pct: Some(99.0),
            rss_bytes: None,
            gpu_now: None,
            gpu_time: None,
            window: wait.map(|wait| WindowSummary {
                wait,
                thirds: [wait; 3],
                samples: 60,
                spends: Some(Activity::Compute),
                place: Some("forward (model.py:12)".into()),
                cpu_pct: Some(99.0),
                throttled: None,
                pcie_replays: None,
                nvlink_errors: None,
                clocks: None,
                gpu_wait: None,
            }),
        }
    }

    #[test]
    fn the_rank_that_waits_least_is_named_with_where_it_spends_its_time() {
        let rows: Vec<RankRow> = [0.41, 0.44, 0.03, 0.39]
            .iter()
            .enumerate()
            .map(|(r, w)| row(r as u32, Some(*w)))
            .collect();
        let found = find(&rows, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        let text = found[0].text(Duration::from_secs(60));
        assert!(
            text.starts_with("toporun: straggler: rank 2 (node 1 on trainer-1, GPU 0) waits 3% of the time against a median of 41% for the other 3 over 60s: the others wait for it; it spends its time in its own code (compute on the CPU): forward (model.py:12)"),
            "{text}"
        );
        assert!(
            text.contains("\n  its process used 99% of a CPU core"),
            "{text}"
        );
    }

    /// A rank of an NCCL job: its stacks say it waits `cpu_wait`, its GPU spends
    /// `thirds` of each third of the window inside collectives.
    fn nccl_row(rank: u32, cpu_wait: f64, thirds: [f64; 3]) -> RankRow {
        let mut x = row(rank, Some(cpu_wait));
        let w = x.window.as_mut().unwrap();
        w.gpu_wait = Some(GpuWait {
            share: thirds.iter().sum::<f64>() / 3.0,
            thirds: thirds.map(Some),
            dumps: 12,
            covered_s: 14.5,
            busbw: Vec::new(),
            comms: Vec::new(),
        });
        x
    }

    /// The shares the 2x H100 and 2x H200 jobs gave (nccl-straggler-h100x2's
    /// shares.txt, nccl-straggler-h200x2): rank 1 doing 3x the work spent 14-16% of
    /// its GPU time in collectives, rank 0 58-62%; balanced 23% and 35%; a job where
    /// every rank checkpoints 26-33%.
    #[test]
    fn under_nccl_the_gpu_that_waits_least_is_named_whatever_the_stacks_say() {
        // The stacks said the opposite (rank 0 spins at .item(), rank 1 blocks in the
        // all_reduce launch): the GPU shares decide.
        let slow = [
            nccl_row(0, 0.05, [0.59, 0.61, 0.60]),
            nccl_row(1, 0.95, [0.14, 0.16, 0.15]),
        ];
        let found = find(&slow, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rank, 1);
        let text = found[0].text(Duration::from_secs(60));
        assert!(
            text.starts_with("toporun: straggler: rank 1 (node 0 on trainer-0, GPU 1): its GPU spends 15% of the time in collectives against 60% for the other 1 over 60s: they wait for its kernels; its Python thread is mostly in its own code (compute on the CPU): forward (model.py:12)"),
            "{text}"
        );
        // A node given host GPUs 2 and 3: the GPU is named by its NVML index and its
        // UUID (4x H200, tests/fixtures/hosts/h200x4.json), which names it on the host
        // whatever subset the container sees.
        let mut on_3 = slow.clone();
        on_3[1].gpu = Some(3);
        on_3[1].gpu_uuid = Some("GPU-9d6e3212-dcc0-8ee3-de76-a270a62a5cbf".into());
        let text = find(&on_3, &[])[0].text(Duration::from_secs(60));
        assert!(
            text.starts_with("toporun: straggler: rank 1 (node 0 on trainer-0, GPU 3 GPU-9d6e3212-dcc0-8ee3-de76-a270a62a5cbf): "),
            "{text}"
        );
        let balanced = [
            nccl_row(0, 0.4, [0.22, 0.24, 0.23]),
            nccl_row(1, 0.4, [0.36, 0.34, 0.35]),
        ];
        assert!(find(&balanced, &[]).is_empty());
        let checkpoint = [
            nccl_row(0, 0.3, [0.26, 0.33, 0.30]),
            nccl_row(1, 0.3, [0.29, 0.27, 0.33]),
        ];
        assert!(find(&checkpoint, &[]).is_empty());
        // Slow in one third only (a few seconds of extra work): nobody.
        let burst = [
            nccl_row(0, 0.3, [0.30, 0.30, 0.60]),
            nccl_row(1, 0.3, [0.30, 0.30, 0.10]),
        ];
        assert!(find(&burst, &[]).is_empty());
        // Named already: held while still well below (23% against 40%), cleared
        // once near the others.
        assert_eq!(find(&burst, &[1]).len(), 1);
        let back = [
            nccl_row(0, 0.3, [0.30, 0.30, 0.35]),
            nccl_row(1, 0.3, [0.30, 0.30, 0.25]),
        ];
        assert!(find(&back, &[1]).is_empty());
        let still = [
            nccl_row(0, 0.3, [0.50, 0.50, 0.50]),
            nccl_row(1, 0.3, [0.30, 0.30, 0.30]),
        ];
        assert_eq!(find(&still, &[1]).len(), 1);
    }

    /// gloo ranks keep the CPU rule; a job where one rank only was timed cannot be
    /// judged by GPU and keeps it too.
    #[test]
    fn without_timed_gpus_the_stacks_decide() {
        let mut rows: Vec<RankRow> = [0.41, 0.44, 0.03, 0.39]
            .iter()
            .enumerate()
            .map(|(r, w)| row(r as u32, Some(*w)))
            .collect();
        rows[0] = nccl_row(0, 0.41, [0.5; 3]);
        let found = find(&rows, &[]);
        assert_eq!(found.iter().map(|s| s.rank).collect::<Vec<_>>(), vec![2]);
        assert_eq!(found[0].basis, Basis::WaitShare);
    }

    #[test]
    fn a_balanced_job_or_one_in_a_long_phase_has_none() {
        let balanced: Vec<RankRow> = [0.35, 0.42, 0.30, 0.38]
            .iter()
            .enumerate()
            .map(|(r, w)| row(r as u32, Some(*w)))
            .collect();
        assert!(find(&balanced, &[]).is_empty());
        // Everyone checkpointing: nobody waits much, nobody is held back.
        let pause: Vec<RankRow> = [0.02, 0.10, 0.12, 0.11]
            .iter()
            .enumerate()
            .map(|(r, w)| row(r as u32, Some(*w)))
            .collect();
        assert!(find(&pause, &[]).is_empty());
        // Not a whole window yet for the others: no median to compare with.
        let young = vec![row(0, Some(0.01)), row(1, None), row(2, None)];
        assert!(find(&young, &[]).is_empty());
    }

    #[test]
    fn a_slowdown_that_leaves_a_third_of_the_window_untouched_names_nobody() {
        // The failing CI's numbers: rank 0 logged for a few seconds of a 20 s window,
        // 25% against 51% over the window, but in its oldest third it waited as the
        // others did.
        let with_thirds = |r: u32, wait: f64, thirds: [f64; 3]| {
            let mut x = row(r, Some(wait));
            x.window.as_mut().unwrap().thirds = thirds;
            x
        };
        let mut rows = vec![
            with_thirds(0, 0.25, [0.44, 0.06, 0.25]),
            with_thirds(1, 0.51, [0.44, 0.58, 0.51]),
            with_thirds(2, 0.52, [0.45, 0.60, 0.51]),
            with_thirds(3, 0.49, [0.43, 0.55, 0.49]),
        ];
        assert!(find(&rows, &[]).is_empty());
        // Named already: the hold rule over the whole window keeps it named.
        let held: Vec<u32> = find(&rows, &[0]).iter().map(|s| s.rank).collect();
        assert_eq!(held, vec![0]);
        // Far below in every third: a straggler.
        rows[0] = with_thirds(0, 0.25, [0.22, 0.26, 0.25]);
        let named: Vec<u32> = find(&rows, &[]).iter().map(|s| s.rank).collect();
        assert_eq!(named, vec![0]);
    }

    #[test]
    fn a_slow_node_has_each_of_its_ranks_named() {
        let rows: Vec<RankRow> = [0.5, 0.5, 0.04, 0.06]
            .iter()
            .enumerate()
            .map(|(r, w)| row(r as u32, Some(*w)))
            .collect();
        let ranks: Vec<u32> = find(&rows, &[]).iter().map(|s| s.rank).collect();
        assert_eq!(ranks, vec![2, 3]);
    }

    #[test]
    fn a_change_is_said_once_it_held_a_while_and_once_only() {
        let rows: Vec<RankRow> = [0.4, 0.4, 0.03, 0.4]
            .iter()
            .enumerate()
            .map(|(r, w)| row(r as u32, Some(*w)))
            .collect();
        let s = |t| Duration::from_secs(t);
        let mut d = Decider::default();
        assert_eq!(d.observe(s(0), find(&rows, &[]), s(15)), None);
        assert_eq!(d.observe(s(10), find(&rows, &[]), s(15)), None);
        let c = d.observe(s(15), find(&rows, &[]), s(15)).unwrap();
        assert_eq!(c.found[0].rank, 2);
        assert!(c.cleared.is_empty());
        assert_eq!(d.observe(s(16), find(&rows, &[]), s(15)), None);
        // A blip of balance does not clear it; a lasting one does.
        assert_eq!(d.observe(s(20), Vec::new(), s(15)), None);
        assert_eq!(d.observe(s(21), find(&rows, &[]), s(15)), None);
        assert_eq!(d.observe(s(30), Vec::new(), s(15)), None);
        let c = d.observe(s(45), Vec::new(), s(15)).unwrap();
        assert_eq!((c.found.len(), c.cleared), (0, vec![2]));
        assert!(d.current().is_empty());
    }

    #[test]
    fn verdicts_say_a_straggler_and_its_clearing_once_each() {
        let slow: Vec<RankRow> = [0.4, 0.4, 0.03, 0.4]
            .iter()
            .enumerate()
            .map(|(r, w)| row(r as u32, Some(*w)))
            .collect();
        let even: Vec<RankRow> = (0..4).map(|r| row(r, Some(0.4))).collect();
        let (s, span) = (|t| Duration::from_secs(t), Duration::from_secs(20));
        let mut v = Verdicts::default();
        assert!(v.step(s(0), &slow, span).is_empty());
        let said = v.step(s(5), &slow, span);
        assert_eq!(said.len(), 1);
        assert!(
            said[0].starts_with("toporun: straggler: rank 2 "),
            "{said:?}"
        );
        assert_eq!((v.seq, v.current[0].rank), (1, 2));
        assert!(v.step(s(6), &slow, span).is_empty());
        assert_eq!(v.last_said, said, "kept for a node that reads it later");
        assert!(v.step(s(7), &even, span).is_empty());
        let said = v.step(s(12), &even, span);
        assert!(
            said[0].contains("rank 2 no longer holds the job back"),
            "{said:?}"
        );
        assert!(v.current.is_empty());
        assert_eq!(v.seq, 2);
    }

    #[test]
    fn a_named_rank_stays_named_until_it_is_back_near_the_others() {
        let rows = |slow: f64| -> Vec<RankRow> {
            [0.6, 0.6, slow, 0.6]
                .iter()
                .enumerate()
                .map(|(r, w)| row(r as u32, Some(*w)))
                .collect()
        };
        // 0.35 against 0.6: not far enough to be named, close enough to stay named.
        assert!(find(&rows(0.35), &[]).is_empty());
        assert_eq!(find(&rows(0.35), &[2])[0].rank, 2);
        assert!(find(&rows(0.5), &[2]).is_empty());
        assert_eq!(find(&rows(0.22), &[])[0].rank, 2);
    }

    #[test]
    fn a_gpu_held_down_by_a_limit_is_named_where_the_wait_shares_are_even() {
        use crate::stacks::rank_window::GpuClocks;
        // NCCL: every CPU waits in its own synchronisation, the shares are even.
        let clocks = |mhz: f64, slowed: f64, by: Vec<ClockLimit>| GpuClocks {
            sm_mhz_mean: mhz,
            slowed,
            slowed_by: by,
        };
        let rows = |two: GpuClocks| -> Vec<RankRow> {
            (0..4)
                .map(|r| {
                    let mut x = row(r, Some(0.05));
                    x.window.as_mut().unwrap().clocks = Some(if r == 2 {
                        two.clone()
                    } else {
                        clocks(1980.0, 0.0, vec![])
                    });
                    x
                })
                .collect()
        };
        let hot = clocks(1250.0, 0.9, vec![ClockLimit::HwThermal]);
        let found = find(&rows(hot.clone()), &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        let text = found[0].text(Duration::from_secs(60));
        assert!(
            text.starts_with("toporun: straggler: rank 2 (node 1 on trainer-1, GPU 0): its GPU's SM clock averaged 1250 MHz against a median of 1980 MHz for the other 3 over 60s, held down by HwThermal: every rank waits for its kernels"),
            "{text}"
        );
        // Slower without a limit (a smaller part, an idle GPU): not named.
        assert!(find(&rows(clocks(1250.0, 0.0, vec![])), &[]).is_empty());
        // Within 15%: not named; once named, it stays until within 8%.
        let warm = clocks(1750.0, 0.6, vec![ClockLimit::PowerCap]);
        assert!(find(&rows(warm.clone()), &[]).is_empty());
        assert_eq!(find(&rows(warm), &[2]).len(), 1);
        assert!(find(&rows(clocks(1900.0, 0.6, vec![ClockLimit::PowerCap])), &[2]).is_empty());
    }

    #[test]
    fn the_median_of_the_others_is_the_median_without_ones_own_value() {
        let naive = |v: &[f64], skip: usize| -> Option<f64> {
            let mut o: Vec<f64> = (0..v.len()).filter(|i| *i != skip).map(|i| v[i]).collect();
            o.sort_by(f64::total_cmp);
            let n = o.len();
            (n > 0).then(|| {
                if n % 2 == 1 {
                    o[n / 2]
                } else {
                    (o[n / 2 - 1] + o[n / 2]) / 2.0
                }
            })
        };
        for v in [
            vec![0.4],
            vec![0.4, 0.1],
            vec![0.3, 0.3, 0.1, 0.5],
            vec![0.2, 0.9, 0.2, 0.4, 0.7],
        ] {
            let sorted = Sorted::of(v.iter().copied());
            for (i, x) in v.iter().enumerate() {
                assert_eq!(
                    sorted.median_without(Some(*x)),
                    naive(&v, i),
                    "{v:?} without {x}"
                );
            }
        }
        // A rank without a value (no GPU clock read): the median of all.
        assert_eq!(
            Sorted::of([1.0, 3.0].into_iter()).median_without(None),
            Some(2.0)
        );
        assert_eq!(
            Sorted::of(std::iter::empty()).median_without(Some(1.0)),
            None
        );
    }
}
