//! Each rank's time on its GPU inside collectives, from flight-recorder dumps taken
//! while the job trains (TORCH_NCCL_ENABLE_TIMING gives every finished entry its GPU
//! `duration_ms`). Under NCCL a collective returns to Python once queued, so the
//! ranks' stacks cannot tell who waits; their GPUs can: the fast rank's kernel waits
//! inside the collective for the slow one (2x H100 and 2x H200: ~60% of the time
//! against ~15% for a rank doing 3x the work, tests/fixtures/device/nccl-straggler-*).
//!
//! The ranks' dumps are matched by collective sequence number: each rank's span runs
//! from the first to the last collective every dump holds of one group, on the rank's
//! own clock (no clock skew between nodes), and its busy time is what its entries of
//! every group spent on the GPU within that span.

use super::dump::{Dump, Entry};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One rank's GPU time over a span of its dump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuTime {
    pub rank: u32,
    /// The span the matched collectives cover, on the rank's clock (ns).
    pub span_ns: u64,
    /// Time its collectives ran on the GPU within the span (ns, at most the span).
    pub busy_ns: u64,
    /// Collectives timed within the span.
    pub timed: u32,
    /// Bus bandwidth per collective kind over the span, for collectives of at least
    /// [`MIN_BUSBW_BYTES`] (smaller ones time their latency, not the links).
    pub busbw: Vec<KindBusbw>,
    /// Its GPU time on each communicator whose operations were timed in the span
    /// (NCCL's counters; none from dumps): overlapping groups are compared one at a
    /// time, the ranks that share each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comms: Vec<CommTime>,
}

/// A rank's GPU time on one communicator over a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommTime {
    /// NCCL's communicator hash: the same on every member.
    pub comm: u64,
    /// At most the span.
    pub busy_ns: u64,
    /// It carries send/recv (pipeline stages): two ranks in one such communicator sit
    /// in different stages, whose waits differ by design.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub p2p: bool,
}

impl GpuTime {
    /// The share of the span its GPU spent inside collectives (0..=1).
    pub fn share(&self) -> f64 {
        if self.span_ns == 0 {
            return 0.0;
        }
        self.busy_ns as f64 / self.span_ns as f64
    }
}

/// A collective kind's bus bandwidth on one rank (nccl-tests' busbw: the algorithm
/// bandwidth times the bytes each link carries per byte of the result).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindBusbw {
    /// `all_reduce`, `all_gather`... (the op without its `nccl:` prefix).
    pub kind: String,
    pub gbps: f64,
    pub count: u32,
    /// Bytes moved per collective, on average.
    pub mean_bytes: u64,
}

/// Collectives smaller than this are left out of busbw.
pub const MIN_BUSBW_BYTES: u64 = 1 << 20;

/// The spans to match: a dump holds at least this many timed collectives in common
/// with the others, or it says nothing.
pub const MIN_MATCHED: usize = 20;

/// Each rank's GPU time over the collectives all `dumps` hold; empty where the dumps
/// share no timed span of one group (timing off, no collective in common).
pub fn gpu_times(dumps: &[Dump]) -> Vec<GpuTime> {
    let Some((group, lo, hi)) = common_range(dumps) else {
        return Vec::new();
    };
    dumps
        .iter()
        .filter_map(|d| rank_time(d, &group, lo, hi))
        .collect()
}

fn timed(e: &Entry) -> bool {
    e.duration_ns.is_some() && !e.is_p2p && e.time_created_ns > 0
}

/// The group every dump holds with the most timed collectives, and the sequence
/// numbers all dumps hold of it.
fn common_range(dumps: &[Dump]) -> Option<(String, u64, u64)> {
    let mut best: Option<(String, u64, u64)> = None;
    let first = dumps.first()?;
    let groups: std::collections::BTreeSet<&str> =
        first.entries.iter().map(|e| e.group.as_str()).collect();
    for g in groups {
        let mut lo = 0u64;
        let mut hi = u64::MAX;
        for d in dumps {
            let seqs = d
                .entries
                .iter()
                .filter(|e| e.group == g && timed(e))
                .map(|e| e.collective_seq_id);
            let (min, max) = seqs.fold((u64::MAX, 0), |(a, b), s| (a.min(s), b.max(s)));
            (lo, hi) = (lo.max(min), hi.min(max));
        }
        let wider = best
            .as_ref()
            .is_none_or(|b| hi.saturating_sub(lo) > b.2 - b.1);
        if hi >= lo && (hi - lo) as usize + 1 >= MIN_MATCHED && wider {
            best = Some((g.to_string(), lo, hi));
        }
    }
    best
}

/// One rank's span from collective `lo` to `hi` of `group`, and what its timed
/// entries of every group spent on the GPU within it.
fn rank_time(d: &Dump, group: &str, lo: u64, hi: u64) -> Option<GpuTime> {
    let at = |seq: u64| {
        d.entries
            .iter()
            .find(|e| e.group == group && !e.is_p2p && e.collective_seq_id == seq)
            .map(|e| e.time_created_ns)
    };
    let (start, end) = (at(lo)?, at(hi)?);
    let span_ns = end.checked_sub(start).filter(|s| *s > 0)?;
    let within: Vec<&Entry> = d
        .entries
        .iter()
        .filter(|e| timed(e) && (start..end).contains(&e.time_created_ns))
        .collect();
    let busy = capped_busy(&within);
    Some(GpuTime {
        rank: d.rank,
        span_ns,
        busy_ns: busy.min(span_ns),
        timed: within.len() as u32,
        busbw: busbw(&within, &d.group_sizes),
        comms: Vec::new(),
    })
}

/// The entries' GPU time, each at most what one in a hundred of them reaches: a
/// pause every rank takes (a checkpoint, an evaluation) is one long wait on the rank
/// that came back first, a straggler makes its peers wait in many collectives.
fn capped_busy(within: &[&Entry]) -> u64 {
    let mut ns: Vec<u64> = within.iter().filter_map(|e| e.duration_ns).collect();
    ns.sort_unstable();
    let Some(cap) = ns.get(ns.len() * 99 / 100).or(ns.last()).copied() else {
        return 0;
    };
    ns.iter().map(|n| (*n).min(cap)).sum()
}

/// The collective kind of an op (`nccl:all_reduce` -> `all_reduce`).
pub(super) fn kind_of(op: &str) -> &str {
    op.rsplit(':').next().unwrap_or(op)
}

/// Bytes each link carries per byte of the collective (nccl-tests' busbw factors)
/// and the bytes that count, for a group of `n`.
pub(super) fn bus_bytes(kind: &str, bytes: super::dump::Bytes, n: u32) -> Option<f64> {
    let n = f64::from(n.max(1));
    let share = (n - 1.0) / n;
    Some(match kind {
        "all_reduce" | "allreduce" => bytes.input as f64 * 2.0 * share,
        "all_gather" | "_allgather_base" | "allgather" | "all_gather_into_tensor" => {
            bytes.output as f64 * share
        }
        "reduce_scatter" | "_reduce_scatter_base" | "reduce_scatter_tensor" => {
            bytes.input as f64 * share
        }
        "all_to_all" | "alltoall" | "alltoall_base" => bytes.input as f64 * share,
        "broadcast" | "reduce" => bytes.input as f64,
        _ => return None,
    })
}

fn busbw(entries: &[&Entry], sizes: &BTreeMap<String, u32>) -> Vec<KindBusbw> {
    // kind -> (bus bytes, ns, count, bytes)
    let mut by: BTreeMap<String, (f64, u64, u32, u64)> = BTreeMap::new();
    for e in entries {
        let (Some(b), Some(ns)) = (e.bytes, e.duration_ns) else {
            continue;
        };
        let moved = b.input.max(b.output);
        let kind = kind_of(&e.op);
        let n = sizes.get(&e.group).copied().unwrap_or(2);
        let Some(bus) = bus_bytes(kind, b, n).filter(|_| moved >= MIN_BUSBW_BYTES && ns > 0) else {
            continue;
        };
        let k = by.entry(kind.to_string()).or_default();
        (k.0, k.1, k.2, k.3) = (k.0 + bus, k.1 + ns, k.2 + 1, k.3 + moved);
    }
    by.into_iter()
        .map(|(kind, (bus, ns, count, moved))| KindBusbw {
            kind,
            gbps: bus / ns as f64,
            count,
            mean_bytes: moved / u64::from(count),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flight_recorder::dump::{all_reduces, Bytes};

    /// Rank `rank`'s dump: `n` all_reduces of 4 MiB from `first`, one every 1 ms,
    /// each `busy_us` on the GPU.
    fn dump(rank: u32, first: u64, n: u64, busy_us: u64) -> Dump {
        all_reduces(rank, first..first + n, 4 << 20, |seq| {
            (
                1_000_000_000 + seq * 1_000_000 + u64::from(rank) * 77,
                busy_us * 1000,
            )
        })
    }

    #[test]
    fn one_long_wait_is_a_pause_not_a_share() {
        // Both ranks pause (a checkpoint) and rank 1 comes back 300 ms before rank 0:
        // its next collective waits 300 ms, in a span of 1000 collectives.
        let mut paused = dump(1, 0, 1000, 150);
        paused.entries[500].duration_ns = Some(300_000_000);
        let t = gpu_times(&[dump(0, 0, 1000, 150), paused]);
        assert!((t[1].share() - 0.15).abs() < 0.01, "{}", t[1].share());
        // A straggler makes one collective in six wait (DDP's first bucket): kept.
        let mut waits = dump(0, 0, 600, 150);
        waits
            .entries
            .iter_mut()
            .step_by(6)
            .for_each(|e| e.duration_ns = Some(3_000_000));
        let t = gpu_times(&[waits, dump(1, 0, 600, 150)]);
        assert!(t[0].share() > 0.6, "{}", t[0].share());
    }

    #[test]
    fn shares_are_taken_over_the_collectives_every_dump_holds() {
        // Rank 1's dump starts later and ends earlier: only 150..=249 count.
        let t = gpu_times(&[dump(0, 100, 200, 600), dump(1, 150, 100, 150)]);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].span_ns, 99_000_000);
        assert_eq!(t[0].timed, 99, "the last collective closes the span");
        assert!((t[0].share() - 0.6).abs() < 0.01, "{}", t[0].share());
        assert!((t[1].share() - 0.15).abs() < 0.01, "{}", t[1].share());
        // 4 MiB all_reduce of 2 ranks in 150 us: 2*(1/2)*4 MiB / 150 us = 28 GB/s.
        let bw = &t[1].busbw[0];
        assert_eq!((bw.kind.as_str(), bw.count), ("all_reduce", 99));
        assert!((bw.gbps - 27.96).abs() < 0.1, "{}", bw.gbps);
    }

    #[test]
    fn no_timing_or_no_common_span_says_nothing() {
        let mut untimed = dump(0, 1, 100, 500);
        untimed
            .entries
            .iter_mut()
            .for_each(|e| e.duration_ns = None);
        assert!(gpu_times(&[untimed, dump(1, 1, 100, 500)]).is_empty());
        assert!(gpu_times(&[dump(0, 1, 100, 500), dump(1, 500, 100, 500)]).is_empty());
        assert!(gpu_times(&[]).is_empty());
        // A collective smaller than 1 MiB times latency: no busbw from it.
        let mut small = dump(0, 1, 100, 5);
        for e in &mut small.entries {
            e.bytes = Some(Bytes {
                input: 4096,
                output: 4096,
            });
        }
        assert!(gpu_times(&[small])[0].busbw.is_empty());
    }
}
