//! `toporun top`'s table: one row per rank, what it does now and over the window,
//! its process and GPU, the stragglers marked.

use super::straggler::{RankRow, Straggler};
use serde::{Deserialize, Serialize};

/// What `toporun top` shows, as the launcher keeps it (and as `--format json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopTable {
    /// The straggler window, in seconds.
    pub window_s: u64,
    /// The rows are the whole job's (the store's host published them), not only
    /// this node's.
    pub job_wide: bool,
    pub ranks: Vec<RankRow>,
    pub stragglers: Vec<Straggler>,
    /// Ranks of the job left out of a bounded job view.
    #[serde(default)]
    pub hidden: u32,
}

/// Rows a node's job view carries at most.
pub const JOB_VIEW_ROWS: usize = 64;

/// The job's rows for `toporun top`: at most [`JOB_VIEW_ROWS`], and how many there are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    pub ranks: Vec<RankRow>,
    pub total: u32,
}

/// The job's rows bounded to `max`: the stragglers, then those that wait least (the
/// likeliest next ones), in rank order.
pub fn job_view(mut ranks: Vec<RankRow>, stragglers: &[Straggler], max: usize) -> Vec<RankRow> {
    let named = |r: &RankRow| stragglers.iter().any(|s| s.rank == r.rank);
    let wait = |r: &RankRow| r.window.as_ref().map_or(f64::MAX, |w| w.wait);
    ranks.sort_by(|a, b| named(b).cmp(&named(a)).then(wait(a).total_cmp(&wait(b))));
    ranks.truncate(max);
    ranks.sort_by_key(|r| r.rank);
    ranks
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".into())
}

impl TopTable {
    pub fn text(&self) -> String {
        if self.ranks.is_empty() {
            return "no rank is running right now\n".into();
        }
        let scope = if self.job_wide {
            "the job"
        } else {
            "this node"
        };
        let mut out = format!(
            "{} rank(s) of {scope}; WAIT is the share of samples in collectives (and, under NCCL, waiting on its GPU) over the last {}s, GPU WAIT its GPU's time inside collectives (NCCL), BUSBW+WAIT its all_reduce bus bandwidth in GB/s with its waits for the others inside them (only the rank that waits least shows what the links carry; the slow-links rule judges them); the straggler, marked *, waits least\n",
            self.ranks.len(),
            self.window_s
        );
        out.push_str(&format!(
            "{:<2}{:>5} {:>4} {:<16} {:>7}  {:<11} {:>5} {:>8} {:>10} {:>5} {:>8} {:>4} {:>5} {:>9}  {}\n",
            "",
            "RANK",
            "NODE",
            "HOST",
            "PID",
            "NOW",
            "WAIT",
            "GPU WAIT",
            "BUSBW+WAIT",
            "CPU%",
            "RSS",
            "GPU",
            "UTIL",
            "SM MHz",
            "CLOCK LIMITS"
        ));
        for r in &self.ranks {
            out.push_str(&self.line(r));
        }
        for s in &self.stragglers {
            out.push_str(&s.text(std::time::Duration::from_secs(self.window_s)));
            out.push('\n');
        }
        out
    }

    fn line(&self, r: &RankRow) -> String {
        let mark = if self.stragglers.iter().any(|s| s.rank == r.rank) {
            "*"
        } else {
            ""
        };
        let g = r.gpu_now.as_ref();
        let sm = g.and_then(|g| Some(format!("{}/{}", g.sm_mhz?, g.sm_max_mhz?)));
        let limits = g.map(|g| {
            let l: Vec<String> = g.limits.iter().map(|l| format!("{l:?}")).collect();
            l.join(",")
        });
        format!(
            "{mark:<2}{:>5} {:>4} {:<16} {:>7}  {:<11} {:>5} {:>8} {:>10} {:>5} {:>8} {:>4} {:>5} {:>9}  {}\n",
            r.rank,
            r.node_rank,
            truncate(&r.host, 16),
            r.pid,
            or_dash(r.now.map(|a| a.short().to_string())),
            or_dash(r.window.as_ref().map(|w| format!("{:.0}%", w.wait * 100.0))),
            or_dash(r.gpu_wait_share().map(|w| format!("{:.0}%", w * 100.0))),
            or_dash(r.busbw("all_reduce").map(|b| format!("{b:.0}"))),
            or_dash(r.cpu_pct.map(|c| format!("{c:.0}"))),
            or_dash(r.rss_bytes.map(|b| format!("{}M", b >> 20))),
            or_dash(r.gpu.map(|g| g.to_string())),
            or_dash(g.and_then(|g| g.util_pct).map(|u| format!("{u}%"))),
            or_dash(sm),
            or_dash(limits.filter(|l| !l.is_empty())),
        )
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::activity::Activity;
    use crate::stacks::rank_window::{ClockLimit, GpuNow};

    fn row(rank: u32) -> RankRow {
        RankRow {
            rank,
            local_rank: rank,
            node_rank: 0,
            host: "trainer-0".into(),
            pid: 100 + rank as i32,
            gpu: Some(rank),
            gpu_uuid: None,
            now: Some(Activity::Collective),
            cpu_pct: Some(12.0),
            rss_bytes: Some(3 << 30),
            gpu_now: Some(GpuNow {
                index: rank,
                util_pct: Some(97),
                sm_mhz: Some(1410),
                sm_max_mhz: Some(1980),
                limits: vec![ClockLimit::PowerCap],
                ..Default::default()
            }),
            window: None,
            gpu_time: None,
        }
    }

    /// Under NCCL with `--gpu-timing on`: each rank's GPU time in collectives and its
    /// all_reduce busbw, from its last dump until a window is full.
    #[test]
    fn timed_ranks_show_their_gpu_wait_and_busbw() {
        use crate::flight_recorder::{GpuTime, KindBusbw};
        let mut timed = row(1);
        timed.gpu_time = Some(GpuTime {
            rank: 1,
            span_ns: 1_000_000_000,
            busy_ns: 170_000_000,
            timed: 700,
            busbw: vec![KindBusbw {
                kind: "all_reduce".into(),
                gbps: 78.8,
                count: 600,
                mean_bytes: 4 << 20,
            }],
            comms: Vec::new(),
        });
        let t = TopTable {
            window_s: 60,
            job_wide: false,
            ranks: vec![row(0), timed],
            stragglers: Vec::new(),
            hidden: 0,
        };
        let text = t.text();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].contains("GPU WAIT") && lines[1].contains("BUSBW+WAIT"),
            "{text}"
        );
        let cols = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(&cols(lines[3])[5..8], ["-", "17%", "79"], "{text}");
        assert_eq!(&cols(lines[2])[5..8], ["-", "-", "-"], "{text}");
    }

    #[test]
    fn every_rank_has_a_row_with_its_gpu_and_the_straggler_is_marked() {
        let mut t = TopTable {
            window_s: 60,
            job_wide: false,
            ranks: vec![row(0), row(1)],
            stragglers: Vec::new(),
            hidden: 0,
        };
        let text = t.text();
        assert!(text.starts_with("2 rank(s) of this node"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(
            lines[2].contains("collective") && lines[2].contains("1410/1980"),
            "{text}"
        );
        assert!(
            lines[2].contains("PowerCap") && lines[2].contains("3072M"),
            "{text}"
        );
        t.stragglers.push(crate::stacks::straggler::Straggler {
            rank: 1,
            node_rank: 0,
            host: "trainer-0".into(),
            gpu: Some(1),
            gpu_uuid: None,
            wait: 0.02,
            median: 0.4,
            others: 1,
            spends: Some(Activity::Compute),
            place: None,
            evidence: Vec::new(),
            basis: crate::stacks::straggler::Basis::WaitShare,
        });
        let text = t.text();
        assert!(text.lines().nth(3).unwrap().starts_with("*"), "{text}");
        assert!(text.contains("toporun: straggler: rank 1 "), "{text}");
    }

    #[test]
    fn a_job_view_keeps_the_stragglers_and_those_that_wait_least() {
        use crate::stacks::rank_window::WindowSummary;
        let ranks: Vec<RankRow> = (0..100)
            .map(|r| {
                let mut x = row(r);
                x.window = Some(WindowSummary {
                    wait: f64::from(r) / 100.0,
                    thirds: [f64::from(r) / 100.0; 3],
                    samples: 60,
                    spends: None,
                    place: None,
                    cpu_pct: None,
                    throttled: None,
                    pcie_replays: None,
                    nvlink_errors: None,
                    clocks: None,
                    gpu_wait: None,
                });
                x
            })
            .collect();
        let named = crate::stacks::straggler::Straggler {
            rank: 90,
            node_rank: 0,
            host: "h".into(),
            gpu: None,
            gpu_uuid: None,
            wait: 0.9,
            median: 0.5,
            others: 99,
            spends: None,
            place: None,
            evidence: Vec::new(),
            basis: crate::stacks::straggler::Basis::WaitShare,
        };
        let view = job_view(ranks, &[named], 5);
        let kept: Vec<u32> = view.iter().map(|r| r.rank).collect();
        assert_eq!(kept, vec![0, 1, 2, 3, 90]);
    }
}
