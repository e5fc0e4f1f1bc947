//! A rank's GPU time inside NCCL operations and its bus bandwidth over a window:
//! the difference of two readings of its counters. The GPU times come from NCCL's
//! kernel-channel timestamps, so a rank's share of the window inside operations is
//! what the flight recorder's timed entries gave, without a dump.

use super::decode::{CommCounters, RankCounters};
use super::func::NcclFunc;
use super::sampling::KernelSampling;
use crate::flight_recorder::{CommTime, GpuTime, KindBusbw, LinkModel, LinkSpeed};
use std::collections::BTreeMap;
use std::time::Duration;

/// The same communicator in both readings (its slot was not reused between them).
fn pairs<'a>(
    before: &'a RankCounters,
    after: &'a RankCounters,
) -> impl Iterator<Item = (Option<&'a CommCounters>, &'a CommCounters)> {
    after.comms.iter().map(|a| {
        let b = before
            .comms
            .iter()
            .find(|b| b.slot == a.slot && b.generation == a.generation && b.hash == a.hash);
        (b, a)
    })
}

/// With sampling, a communicator's GPU time in a window is estimated from at least
/// this many timed operations (a burst's worth).
pub const MIN_TIMED: u64 = 8;

/// Per kind: bus bytes, GPU ns, count, bytes of the big operations in the window.
type Big = BTreeMap<NcclFunc, (f64, u64, u64, u64)>;

fn big_ops(before: &RankCounters, after: &RankCounters) -> Big {
    let mut by = Big::new();
    for (b, a) in pairs(before, after) {
        for f in &a.funcs {
            let old = b.and_then(|b| b.funcs.iter().find(|x| x.func == f.func));
            let (n, bytes, ns) = match old {
                Some(o) => (
                    f.big_count.saturating_sub(o.big_count),
                    f.big_bytes.saturating_sub(o.big_bytes),
                    f.big_gpu_ns.saturating_sub(o.big_gpu_ns),
                ),
                None => (f.big_count, f.big_bytes, f.big_gpu_ns),
            };
            let Some(factor) = f.func.bus_factor(a.nranks).filter(|_| n > 0 && ns > 0) else {
                continue;
            };
            let e = by.entry(f.func).or_default();
            *e = (e.0 + bytes as f64 * factor, e.1 + ns, e.2 + n, e.3 + bytes);
        }
    }
    by
}

/// A communicator's estimated GPU time and its timed operations between two
/// readings; None where too few were timed to stand for the others (one wait would
/// be all). Where NCCL times only sampled operations, the GPU time is the timed
/// operations' mean times the operations posted.
fn comm_busy(
    b: Option<&CommCounters>,
    a: &CommCounters,
    sampling: KernelSampling,
) -> Option<(u64, u64)> {
    let ns = a.busy_ns.saturating_sub(b.map_or(0, |b| b.busy_ns));
    let done = a.done.saturating_sub(b.map_or(0, |b| b.done));
    let posted = a.posted.saturating_sub(b.map_or(0, |b| b.posted));
    match sampling {
        KernelSampling::All if done > 0 => Some((ns, done)),
        KernelSampling::All => None,
        _ if done >= MIN_TIMED => Some((
            (ns as f64 * posted.max(done) as f64 / done as f64) as u64,
            done,
        )),
        _ => None,
    }
}

/// A communicator with less GPU time a member than this share of the busiest one's
/// (each over its members with a figure) is taken only for a rank in no other; one
/// without a figure (too few of its operations timed), by its operations posted.
const LIGHT_SHARE: f64 = 0.1;

/// A communicator over the ranks judged.
#[derive(Default)]
struct Members {
    ranks: Vec<u32>,
    /// Its size in the job.
    nranks: u32,
    /// GPU time over the members with a figure, and how many have one.
    busy: u64,
    timed: u32,
    posted: u64,
}

impl Members {
    fn busy_each(&self) -> Option<f64> {
        (self.timed > 0).then(|| self.busy as f64 / f64::from(self.timed))
    }

    fn posted_each(&self) -> f64 {
        self.posted as f64 / self.ranks.len().max(1) as f64
    }
}

/// Which communicator each rank's GPU time is read from, so that ranks are compared
/// on the same one: summed over communicators, groups that overlap on the GPU (FSDP's
/// gathers and reductions, tensor parallel beside data parallel) fill every rank's
/// window and hide the one that waits least. The communicators are taken widest
/// first (members among `ranks`), then by their GPU time over those ranks; each
/// gives its share to the members not yet given one (a data-parallel job: its one
/// group; tensor parallel pairs: each pair). Communicators carrying point-to-point
/// traffic are left out: pipeline stages post different work by design, and their
/// waits on send/recv say which stage is heavier, not which rank is slow.
pub fn judged_comms(ranks: &[(u32, &RankCounters, &RankCounters)]) -> BTreeMap<u32, u64> {
    // Members by the communicator being there, not by enough of its operations timed
    // in this window: a rank short of those gets no figure (`gpu_time`), never one
    // from a lighter group beside it, where it would read as waiting least.
    let mut by: BTreeMap<u64, Members> = BTreeMap::new();
    for (rank, before, after) in ranks {
        for (b, a) in pairs(before, after).filter(|(_, a)| a.live && !a.carries_p2p()) {
            let e = by.entry(a.hash).or_default();
            e.ranks.push(*rank);
            e.nranks = e.nranks.max(a.nranks);
            e.posted += a.posted.saturating_sub(b.map_or(0, |b| b.posted));
            if let Some((busy, _)) = comm_busy(b, a, after.sampling) {
                e.busy += busy;
                e.timed += 1;
            }
        }
    }
    let mut order: Vec<(u64, Members)> = by.into_iter().collect();
    // A group that carries next to none of the GPU's collective time (HSDP's
    // job-wide group, there for a loss or a barrier) says nothing of who waits: it
    // comes after the others. Then the widest here, the widest in the job (HSDP's
    // node-local groups against the job-wide one), the busiest.
    let most = |f: &dyn Fn(&Members) -> Option<f64>| {
        order.iter().filter_map(|(_, m)| f(m)).fold(0.0, f64::max)
    };
    let (busiest, most_posted) = (most(&Members::busy_each), most(&|m| Some(m.posted_each())));
    let light = |m: &Members| match m.busy_each() {
        Some(b) => b < LIGHT_SHARE * busiest,
        None => m.posted_each() < LIGHT_SHARE * most_posted,
    };
    // Between groups as wide, the one posting more comes first, then the busier: a
    // busy group short of timed operations in this window keeps its ranks (better
    // without a figure than read from a lighter group), and a metrics group beside a
    // data-parallel one, timed or not, does not take them.
    order.sort_by_key(|(hash, m)| {
        let wide = (m.ranks.len(), m.nranks);
        let posts = m.posted_each() as u64;
        (light(m), std::cmp::Reverse((wide, posts, m.busy)), *hash)
    });
    let mut judged = BTreeMap::new();
    for (hash, m) in order {
        for r in m.ranks {
            judged.entry(r).or_insert(hash);
        }
    }
    judged
}

/// Rank `rank`'s GPU time over `span` on communicator `comm` (see [`judged_comms`]),
/// from its counters at its start and end; None where too few of its operations in
/// it were timed.
pub fn gpu_time(
    rank: u32,
    before: &RankCounters,
    after: &RankCounters,
    span: Duration,
    comm: u64,
) -> Option<GpuTime> {
    let (busy, timed) = pairs(before, after)
        .filter(|(_, a)| a.hash == comm)
        .find_map(|(b, a)| comm_busy(b, a, after.sampling))?;
    let span_ns = span.as_nanos() as u64;
    if span_ns == 0 {
        return None;
    }
    let busbw = big_ops(before, after)
        .into_iter()
        .map(|(f, (bus, ns, n, bytes))| KindBusbw {
            kind: f.kind().into(),
            gbps: bus / ns as f64,
            count: n as u32,
            mean_bytes: bytes / n,
        })
        .collect();
    // Send/recv communicators too, marked: they say which ranks sit in other stages.
    let comms = pairs(before, after)
        .filter(|(_, a)| a.live)
        .filter_map(|(b, a)| {
            let p2p = a.carries_p2p();
            let busy = comm_busy(b, a, after.sampling).map(|(busy, _)| busy);
            Some(CommTime {
                comm: a.hash,
                busy_ns: busy.or(p2p.then_some(0))?.min(span_ns),
                p2p,
            })
        })
        .collect();
    Some(GpuTime {
        rank,
        span_ns,
        busy_ns: busy.min(span_ns),
        timed: timed.min(u64::from(u32::MAX)) as u32,
        busbw,
        comms,
    })
}

/// The busbw of the fastest big operation of `func` lately on any rank (the plugin
/// keeps one per communicator and epoch of the GPU timer); None where no file says.
fn fastest_busbw(ranks: &[(&RankCounters, &RankCounters)], func: NcclFunc) -> Option<f64> {
    ranks
        .iter()
        .flat_map(|(_, after)| &after.comms)
        .filter_map(|c| {
            let f = c.fastest.filter(|f| f.func == func)?;
            Some(f.gbps * func.bus_factor(c.nranks)?)
        })
        .reduce(f64::max)
}

/// This node's link speed per kind over a window, from each rank's counters at its
/// start and end: the fastest rank's busbw counts (it waited least: its time is the
/// transfer), against what `model` gives for the same bytes.
pub fn link_speeds(ranks: &[(&RankCounters, &RankCounters)], model: &LinkModel) -> Vec<LinkSpeed> {
    let mut by: BTreeMap<NcclFunc, (f64, u64, u64, u64)> = BTreeMap::new();
    for (before, after) in ranks {
        for (f, k) in big_ops(before, after) {
            let e = by.entry(f).or_insert(k);
            if k.0 / k.1 as f64 > e.0 / e.1 as f64 {
                *e = k;
            }
        }
    }
    by.into_iter()
        .map(|(f, (bus, ns, n, bytes))| LinkSpeed {
            kind: f.kind().into(),
            count: n as u32,
            mean_bytes: bytes / n,
            gbps: bus / ns as f64,
            expected_gbps: model.expected_gbps(bus / n as f64),
            fastest_gbps: fastest_busbw(ranks, f),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl_counters::decode::decode;
    use crate::nccl_counters::words::Words;

    fn reading(ops: &[(u64, u64)]) -> RankCounters {
        let mut w = Words::default();
        w.comm(0, 7, 0, 2);
        for &(n, gpu_ns) in ops {
            w.ops(0, NcclFunc::AllReduce, 4 << 20, n, n, gpu_ns);
        }
        decode(&w.bytes()).unwrap()
    }

    /// DDP's buckets overlap the backward's kernels: their median runs at a tenth of
    /// the link on a healthy NVLink, while the last bucket of each step, alone on the
    /// GPU, runs near it. The fastest operation keeps the link from being called slow;
    /// where even the fastest is slow, it is.
    #[test]
    fn links_are_slow_only_where_even_the_fastest_operation_is() {
        let model = LinkModel {
            class: "NV18 (Hopper) between GPU 0 and GPU 1".into(),
            gbps: 370.8,
        };
        let at = |fastest_gbps: f64| {
            let mut w = Words::default();
            // 100 all_reduces of 4 MiB at 2 ms each: about 2 GB/s algbw.
            w.comm(0, 7, 0, 2)
                .ops(0, NcclFunc::AllReduce, 4 << 20, 100, 100, 2_000_000)
                .fastest(0, NcclFunc::AllReduce, fastest_gbps);
            decode(&w.bytes()).unwrap()
        };
        let before = reading(&[]);
        let healthy = at(180.0);
        let s = link_speeds(&[(&before, &healthy)], &model);
        assert!(
            s[0].gbps < s[0].expected_gbps / 10.0,
            "the median is slow: {s:?}"
        );
        assert_eq!(s[0].fastest_gbps, Some(180.0), "busbw = algbw on 2 ranks");
        assert!(!s[0].slow(), "the fastest ran near the link: {s:?}");
        let broken = at(3.0);
        let s = link_speeds(&[(&before, &broken)], &model);
        assert!(s[0].slow(), "even the fastest is slow: {s:?}");
    }

    #[test]
    fn the_share_and_busbw_are_the_window_difference() {
        // 1000 all_reduces of 4 MiB before; 100 more of 150 us each in 1 s.
        let before = reading(&[(1000, 600_000)]);
        let after = reading(&[(1000, 600_000), (100, 150_000)]);
        let t = gpu_time(3, &before, &after, Duration::from_secs(1), 7).unwrap();
        assert_eq!((t.rank, t.timed, t.busy_ns), (3, 100, 15_000_000));
        assert!((t.share() - 0.015).abs() < 1e-9);
        // 2 ranks: bus bytes = 4 MiB; 4 MiB / 150 us = 27.96 GB/s.
        let bw = &t.busbw[0];
        assert_eq!(
            (bw.kind.as_str(), bw.count, bw.mean_bytes),
            ("all_reduce", 100, 4 << 20)
        );
        assert!((bw.gbps - 27.96).abs() < 0.01, "{}", bw.gbps);
        assert!(
            gpu_time(3, &after, &after, Duration::from_secs(1), 7).is_none(),
            "nothing completed"
        );
    }

    /// 1000 operations posted in the window, 80 of them timed at 150 us each: the
    /// rank spent about 1000 x 150 us in operations.
    #[test]
    fn sampled_gpu_time_is_the_timed_mean_times_the_posted() {
        let before = reading(&[(1000, 150_000)]);
        let mut w = Words::default();
        w.comm(0, 7, 0, 2)
            .ops(0, NcclFunc::AllReduce, 4 << 20, 1000, 1000, 150_000)
            .ops(0, NcclFunc::AllReduce, 4 << 20, 80, 80, 150_000)
            .untimed(0, NcclFunc::AllReduce, 4 << 20, 920);
        let mut after = decode(&w.bytes()).unwrap();
        let t = gpu_time(0, &before, &after, Duration::from_secs(1), 7).unwrap();
        assert_eq!((t.timed, t.busy_ns), (80, 150_000_000));
        after.sampling = KernelSampling::All;
        let exact = gpu_time(0, &before, &after, Duration::from_secs(1), 7).unwrap();
        assert_eq!(
            exact.busy_ns, 12_000_000,
            "every operation timed: no estimate"
        );
    }

    #[test]
    fn links_count_the_rank_that_waited_least() {
        let model = LinkModel {
            class: "NV18".into(),
            gbps: 370.8,
        };
        let zero = reading(&[]);
        // Rank 0 waited (600 us an all_reduce), rank 1 not (30 us: 140 GB/s).
        let (slow, fast) = (reading(&[(100, 600_000)]), reading(&[(100, 30_000)]));
        let s = link_speeds(&[(&zero, &slow), (&zero, &fast)], &model);
        assert_eq!((s[0].kind.as_str(), s[0].count), ("all_reduce", 100));
        assert!((s[0].gbps - 139.8).abs() < 0.1, "{}", s[0].gbps);
        assert!(!s[0].slow(), "{s:?}");
        // Both slow: a tenth of the model.
        let s = link_speeds(&[(&zero, &slow)], &model);
        assert!(s[0].slow(), "{s:?}");
    }

    /// FSDP-style: three groups overlap on each rank's GPU. The fast ranks' kernels
    /// wait for the slow one in every group (0.7, 0.6, 0.5 of a second), the slow
    /// rank's less (0.35, 0.3, 0.4): summed and capped at the window, every rank read
    /// 1.0 and the straggler was hidden. On the group they all judge by, it is not.
    #[test]
    fn overlapping_groups_are_compared_one_communicator_at_a_time() {
        let reading = |busy_ms: [u64; 3]| {
            let mut w = Words::default();
            for (slot, ms) in busy_ms.into_iter().enumerate() {
                let n = if ms == 0 { 0 } else { 100 };
                w.comm(slot, 10 + slot as u64, 0, 4).ops(
                    slot,
                    NcclFunc::AllGather,
                    4 << 20,
                    n,
                    n,
                    ms * 10_000,
                );
            }
            let mut c = decode(&w.bytes()).unwrap();
            c.sampling = KernelSampling::All;
            c
        };
        let zero = reading([0, 0, 0]);
        let (fast, slow) = (reading([700, 600, 500]), reading([350, 300, 400]));
        let ranks = [(0, &zero, &fast), (1, &zero, &slow), (2, &zero, &fast)];
        let judged = judged_comms(&ranks);
        assert_eq!(
            judged.values().collect::<Vec<_>>(),
            [&10, &10, &10],
            "the busiest group of all"
        );
        let share = |c: &RankCounters, comm| {
            gpu_time(0, &zero, c, Duration::from_secs(1), comm)
                .unwrap()
                .share()
        };
        assert!((share(&fast, 10) - 0.7).abs() < 1e-9);
        assert!((share(&slow, 10) - 0.35).abs() < 1e-9);
        // Tensor-parallel pairs {0,1} and {2,3}: each judged on its own pair.
        let pair = |hash: u64, busy_ms: u64| {
            let mut w = Words::default();
            w.comm(0, hash, 0, 2)
                .ops(0, NcclFunc::AllReduce, 4 << 20, 100, 100, busy_ms * 10_000);
            decode(&w.bytes()).unwrap()
        };
        let (a, b) = (pair(1, 500), pair(2, 600));
        let ranks = [
            (0, &zero, &a),
            (1, &zero, &a),
            (2, &zero, &b),
            (3, &zero, &b),
        ];
        let judged = judged_comms(&ranks);
        assert_eq!(
            (judged[&0], judged[&1], judged[&2], judged[&3]),
            (1, 1, 2, 2)
        );
    }

    /// Under sampling a rank may have too few operations timed on the job's group in
    /// one window: it gets no figure, not one read from a lighter group beside it
    /// (where it would wait least, and be named).
    #[test]
    fn a_rank_short_of_timed_operations_is_not_judged_on_another_group() {
        let zero = decode(&Words::default().bytes()).unwrap();
        let rank = |timed: u64| {
            let mut w = Words::default();
            w.comm(0, 0x1, 0, 4)
                .ops(0, NcclFunc::AllReduce, 4 << 20, timed, timed, 500_000)
                .untimed(0, NcclFunc::AllReduce, 4 << 20, 100)
                .comm(1, 0x2, 0, 4)
                .ops(1, NcclFunc::AllReduce, 4, 20, 20, 1000);
            decode(&w.bytes()).unwrap()
        };
        let (full, short) = (rank(16), rank(3));
        let ranks = [(0, &zero, &full), (1, &zero, &short), (2, &zero, &full)];
        let judged = judged_comms(&ranks);
        assert_eq!((judged[&0], judged[&1], judged[&2]), (0x1, 0x1, 0x1));
        assert!(gpu_time(1, &zero, &short, Duration::from_secs(1), judged[&1]).is_none());
        assert!(gpu_time(0, &zero, &full, Duration::from_secs(1), judged[&0]).is_some());
        // Every rank short of them: the group is not light for want of a figure (it
        // posts as much as ever), and nobody is read from the lighter one.
        let ranks = [(0, &zero, &short), (1, &zero, &short)];
        let judged = judged_comms(&ranks);
        assert_eq!((judged[&0], judged[&1]), (0x1, 0x1));
        // A metrics group beside it, as wide, posting a fifth as much and short of
        // timed operations: the data-parallel group keeps its ranks.
        let metrics = || {
            let mut w = Words::default();
            w.comm(0, 0x1, 0, 4)
                .ops(0, NcclFunc::AllReduce, 4 << 20, 16, 16, 500_000)
                .untimed(0, NcclFunc::AllReduce, 4 << 20, 100)
                .comm(1, 0x2, 0, 4)
                .ops(1, NcclFunc::AllReduce, 4, 3, 3, 1000)
                .untimed(1, NcclFunc::AllReduce, 4, 20);
            decode(&w.bytes()).unwrap()
        };
        let (a, b) = (metrics(), metrics());
        let judged = judged_comms(&[(0, &zero, &a), (1, &zero, &b)]);
        assert_eq!((judged[&0], judged[&1]), (0x1, 0x1));
    }

    /// HSDP: the job's group (0x1, widest) carries only a stop check, next to none of
    /// the GPU time; each rank is judged on its busy group, and a rank in no other
    /// keeps the light one.
    #[test]
    fn a_group_with_next_to_none_of_the_gpu_time_is_judged_last() {
        let zero = decode(&Words::default().bytes()).unwrap();
        let rank = |busy: Option<u64>| {
            let mut w = Words::default();
            w.comm(0, 0x1, 0, 4)
                .ops(0, NcclFunc::AllReduce, 4, 10, 10, 5_000);
            if let Some(hash) = busy {
                w.comm(1, hash, 0, 2)
                    .ops(1, NcclFunc::AllGather, 4 << 20, 100, 100, 50_000);
            }
            decode(&w.bytes()).unwrap()
        };
        let (a, b, alone) = (rank(Some(0x2)), rank(Some(0x3)), rank(None));
        let ranks = [(0, &zero, &a), (1, &zero, &b), (2, &zero, &alone)];
        let judged = judged_comms(&ranks);
        assert_eq!((judged[&0], judged[&1], judged[&2]), (0x2, 0x3, 0x1));
        let t = gpu_time(0, &zero, &a, Duration::from_secs(1), judged[&0]).unwrap();
        let comms: Vec<u64> = t.comms.iter().map(|c| c.comm).collect();
        assert_eq!(comms, [0x1, 0x2], "each communicator with a figure");
    }

    /// Two pipeline stages on 2x H200 (issue 61): the last stage computes the loss, so
    /// the first waits longer in its receives (35% against 15%): healthy, and named
    /// a straggler once. Send/recv waits are the stages' design; the group of
    /// collectives beside them is judged, and with none, nothing is.
    #[test]
    fn pipeline_stages_waits_on_send_and_recv_are_not_compared() {
        let zero = decode(&Words::default().bytes()).unwrap();
        let stage = |rank: u32, recv_ms: u64, collectives: bool| {
            let mut w = Words::default();
            w.comm(0, 0x9, rank, 2)
                .ops(0, NcclFunc::Recv, 4 << 20, 100, 100, recv_ms * 10_000);
            if collectives {
                w.comm(1, 0x3, rank, 2)
                    .ops(1, NcclFunc::AllReduce, 4, 10, 10, 1000);
            }
            let mut c = decode(&w.bytes()).unwrap();
            c.sampling = KernelSampling::All;
            c
        };
        let (first, last) = (stage(0, 350, true), stage(1, 150, true));
        let judged = judged_comms(&[(0, &zero, &first), (1, &zero, &last)]);
        assert_eq!((judged[&0], judged[&1]), (0x3, 0x3));
        let (first, last) = (stage(0, 350, false), stage(1, 150, false));
        assert!(judged_comms(&[(0, &zero, &first), (1, &zero, &last)]).is_empty());
    }
}
