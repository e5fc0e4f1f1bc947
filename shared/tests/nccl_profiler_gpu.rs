//! What 4x H200 (torch 2.11, NCCL 2.28.9) gave for issue 49 with toporun's NCCL
//! profiler plugin loaded, kept under tests/fixtures/device/nccl-profiler-*-h200x4
//! (`scripts/device/gpu_profiler.sh`), and the decisions taken on the ranks' captured
//! counters files: the rank that never posted the awaited all_reduce, a mismatch where
//! every rank posted, and each rank's GPU wait share and link speed over a window.

use flate2::read::GzDecoder;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use toporun_shared::flight_recorder::LinkModel;
use toporun_shared::nccl_counters::{
    decode, window, KernelSampling, NcclFunc, NcclState, NcclWatch, NodeReading, RankCounters,
    WaitedOp,
};

/// The first runs, every operation timed on the GPU (`TOPORUN_NCCL_KERNEL_SAMPLING=all`
/// as it is now; counters layout version 2).
const ALL: &str = "nccl-profiler-h200x4";
/// The same cases with the plugin's default sampling (bursts of 8 operations timed
/// about every 100 ms; layout version 3), a burst begun at the first post after each
/// period.
const SAMPLED: &str = "nccl-profiler-sampled-h200x4";
/// Again with the default sampling as it is now: a burst begins after a period's worth
/// of posts, an operation is timed once its channels report.
const BURSTS: &str = "nccl-profiler-bursts-h200x4";
/// Again after the post path was made cheaper (bursts placed by post index, the clock
/// read now and then, the first period from the first post, names matched once).
const POST_PATH: &str = "nccl-profiler-post-path-h200x4";

fn fixture_in(set: &str, path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/device")
        .join(set)
        .join(path)
}

fn fixture(path: &str) -> PathBuf {
    fixture_in(ALL, path)
}

/// Rank `rank`'s counters file in `dir` (gzipped in the fixture).
fn counters(dir: &str, rank: u32) -> RankCounters {
    let (set, dir) = dir.split_once(':').unwrap_or((ALL, dir));
    let f = std::fs::File::open(fixture_in(set, &format!("{dir}/rank_{rank}.gz"))).unwrap();
    let mut bytes = Vec::new();
    GzDecoder::new(f).read_to_end(&mut bytes).unwrap();
    decode(&bytes).unwrap()
}

fn node(dir: &str, ranks: u32) -> BTreeMap<u32, RankCounters> {
    (0..ranks).map(|r| (r, counters(dir, r))).collect()
}

/// The node read twice `secs` apart with nothing completing between (the ranks were
/// stopped at the hang: their counters stand as they were then).
fn stalled(dir: &str, ranks: u32, secs: u64) -> NcclState {
    let reading = NodeReading {
        live: (0..ranks).collect(),
        counters: node(dir, ranks),
        cpu: BTreeMap::new(),
        written: BTreeMap::new(),
        on_gpu: Default::default(),
    };
    let mut w = NcclWatch::default();
    let t0 = Instant::now();
    assert_eq!(
        w.observe(&reading, t0),
        NcclState::Moving,
        "{dir}: a wait begins"
    );
    w.observe(&reading, t0 + Duration::from_secs(secs))
}

/// The rank that spun in Python and the rank blocked in a read, on 2 and 4 ranks: each
/// never posted the 1-element all_reduce that starts the others' next step, and that
/// is the operation named, at the index the run's own report gave.
#[test]
fn the_rank_that_never_posted_the_awaited_all_reduce_is_behind() {
    for (set, dir, ranks, index) in [
        (ALL, "hang2-spin", 2, 65522),
        (ALL, "hang2-stuck", 2, 42362),
        (ALL, "hang4-spin", 4, 51884),
        (ALL, "hang4-stuck", 4, 54368),
        (SAMPLED, "hang2-spin", 2, 55922),
        (SAMPLED, "hang2-stuck", 2, 60554),
        (SAMPLED, "hang4-spin", 4, 49616),
        (SAMPLED, "hang4-stuck", 4, 51890),
        (BURSTS, "hang2-spin", 2, 65258),
        (BURSTS, "hang2-stuck", 2, 62336),
        (BURSTS, "hang4-spin", 4, 54680),
        (BURSTS, "hang4-stuck", 4, 51398),
        (POST_PATH, "hang2-spin", 2, 66212),
        (POST_PATH, "hang2-stuck", 2, 66674),
        (POST_PATH, "hang4-spin", 4, 53018),
        (POST_PATH, "hang4-stuck", 4, 47642),
    ] {
        let NcclState::Stalled(s) = stalled(&format!("{set}:{dir}/nccl-counters"), ranks, 21)
        else {
            panic!("{set} {dir}: no stall");
        };
        // Sampled, the awaited operation is the first rank 1 never posted (its stack,
        // busy in Python or in a read, does not wait on its GPU).
        let which = if set == ALL {
            WaitedOp::Oldest
        } else {
            WaitedOp::FirstNotPosted
        };
        assert_eq!(s.which, which, "{set} {dir}");
        let behind: Vec<u32> = s.behind.iter().map(|b| b.rank).collect();
        assert_eq!(behind, vec![1], "{set} {dir}");
        assert_eq!(s.behind[0].posted, index - 1, "{set} {dir}");
        let others: Vec<u32> = (0..ranks).filter(|r| *r != 1).collect();
        assert_eq!(s.waiting, others, "{set} {dir}");
        assert_eq!(
            (s.op.func, s.op.bytes, s.op.index + 1),
            (NcclFunc::AllReduce, 4, index),
            "{set} {dir}"
        );
        // The run's report said the same, with busy or stuck from the rank's CPU.
        let stderr = std::fs::read_to_string(fixture_in(set, &format!("{dir}/stderr"))).unwrap();
        let said = format!(
            "rank 1 never posted all_reduce (4 B, operation {index} on communicator {:#x})",
            s.comm
        );
        assert!(stderr.contains(&said), "{set} {dir}: {said}\n{stderr}");
        let state = if dir.ends_with("spin") {
            "is busy (CPU 100%"
        } else {
            "is stuck (CPU 0%"
        };
        assert!(
            stderr.contains(&format!("rank 1 {state}")),
            "{set} {dir}: {stderr}"
        );
    }
}

/// The first harness run: the ranks left their warm-up after different step counts,
/// so rank 0's next 4 MiB all_reduce met the others' 1-element one. Every rank posted
/// the operation and none completed: nobody is behind, and the flight recorder then
/// named the mismatch.
#[test]
fn a_mismatch_has_nobody_behind() {
    let NcclState::Stalled(s) = stalled("mismatch4/nccl-counters", 4, 21) else {
        panic!("no stall");
    };
    assert!(s.behind.is_empty(), "{s:?}");
    assert_eq!(s.waiting, vec![0, 1, 2, 3]);
    let stderr = std::fs::read_to_string(fixture("mismatch4/stderr")).unwrap();
    assert!(
        stderr.contains("input sizes [[1048576]], the others [[1]]"),
        "{stderr}"
    );
}

/// Each rank's share of a 20 s window inside collectives, from its counters at 30 s
/// and 50 s into the run.
fn shares(dir: &str, ranks: u32) -> Vec<f64> {
    (0..ranks)
        .map(|r| {
            let (a, b) = (
                counters(&format!("{dir}/at30"), r),
                counters(&format!("{dir}/at50"), r),
            );
            window::gpu_time(r, &a, &b, Duration::from_secs(20))
                .unwrap()
                .share()
        })
        .collect()
}

/// Rank 1 on 3x the matmuls: its GPU spends far less of the window in collectives
/// than the others, which wait for it; balanced, the shares are alike.
#[test]
fn the_straggler_waits_least_and_a_balanced_job_names_nobody() {
    let sets = [ALL, SAMPLED, BURSTS, POST_PATH];
    for (set, ranks) in sets.into_iter().flat_map(|set| [(set, 2), (set, 4)]) {
        let sampling = counters(&format!("{set}:straggler{ranks}-slow/at30"), 0).sampling;
        let expected = match set {
            ALL => KernelSampling::All,
            _ => KernelSampling::default(),
        };
        assert_eq!(sampling, expected, "{set}");
        let slow = shares(&format!("{set}:straggler{ranks}-slow"), ranks);
        let others = slow
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != 1)
            .map(|(_, s)| *s);
        let least_other = others.fold(f64::MAX, f64::min);
        assert!(slow[1] < least_other / 2.0, "{set} {ranks} ranks: {slow:?}");
        let even = shares(&format!("{set}:straggler{ranks}-balanced"), ranks);
        let (lo, hi) = even
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), s| (l.min(*s), h.max(*s)));
        assert!(hi < lo * 1.5, "{set} {ranks} ranks balanced: {even:?}");
        eprintln!("{set} {ranks} ranks: slow {slow:?} balanced {even:?}");
    }
}

/// The same windows against NV18: the rank that waited least carries 4 MiB
/// all_reduces at what the links should give, so no slow-links finding.
#[test]
fn healthy_nvlink_reads_as_healthy() {
    let model = LinkModel {
        class: "NV18 (Hopper) between GPU 0 and GPU 1".into(),
        gbps: 370.8,
    };
    for dir in [
        "straggler4-balanced",
        "straggler4-slow",
        "straggler2-balanced",
        "nccl-profiler-sampled-h200x4:straggler4-balanced",
        "nccl-profiler-sampled-h200x4:straggler2-slow",
        "nccl-profiler-bursts-h200x4:straggler4-slow",
        "nccl-profiler-bursts-h200x4:straggler2-balanced",
        "nccl-profiler-post-path-h200x4:straggler4-balanced",
        "nccl-profiler-post-path-h200x4:straggler2-slow",
    ] {
        let ranks = if dir.contains("straggler4") { 4 } else { 2 };
        let pairs: Vec<(RankCounters, RankCounters)> = (0..ranks)
            .map(|r| {
                (
                    counters(&format!("{dir}/at30"), r),
                    counters(&format!("{dir}/at50"), r),
                )
            })
            .collect();
        let refs: Vec<(&RankCounters, &RankCounters)> = pairs.iter().map(|(a, b)| (a, b)).collect();
        let speeds = window::link_speeds(&refs, &model);
        let s = speeds.iter().find(|s| s.kind == "all_reduce").unwrap();
        eprintln!("{dir}: {s:?}");
        assert_eq!(s.mean_bytes, 4 << 20, "{dir}");
        assert!(!s.slow(), "{dir}: {s:?}");
    }
}
