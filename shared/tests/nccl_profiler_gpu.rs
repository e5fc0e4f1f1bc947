//! What 4x H200 (torch 2.11, NCCL 2.28.9) gave for issue 49 with toporun's NCCL
//! profiler plugin loaded, kept under tests/fixtures/device/nccl-profiler-*-h200x4
//! (`scripts/device/gpu_profiler.sh`), and the decisions taken on the ranks' captured
//! counters files: the rank that never posted the awaited all_reduce, a mismatch where
//! every rank posted, and each rank's GPU wait share and link speed over a window.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use toporun_shared::flight_recorder::{GpuTime, LinkModel};
use toporun_shared::nccl_counters::{
    window, KernelSampling, NcclFunc, NcclState, NcclWatch, NodeReading, RankCounters, WaitedOp,
};
use toporun_shared::stacks::hang_report::{Context, Hang};
use toporun_shared::stacks::rank_window::{CommWait, GpuWait, WindowSummary};
use toporun_shared::stacks::straggler::{self, RankRow};
use toporun_shared::stacks::{
    nccl_verdict, Frame, NcclVerdict, Place, Places, RankStack, ThreadStack,
};

/// The first runs, every operation timed on the GPU (`TOPORUN_NCCL_KERNEL_SAMPLING=all`
/// as it is now; counters layout version 2).
const ALL: &str = "nccl-profiler-h200x4";
/// The same cases with the plugin's default sampling (bursts of 8 operations timed
/// about every 100 ms; layout version 3), a burst begun at the first post after each
/// period.
const SAMPLED: &str = "nccl-profiler-sampled-h200x4";
/// Again with bursts every 100 ms, a burst beginning after a period's worth of posts,
/// an operation timed once its channels report (as since).
const BURSTS: &str = "nccl-profiler-bursts-h200x4";
/// Again after the post path was made cheaper (bursts placed by post index, the clock
/// read now and then, the first period from the first post, names matched once).
const POST_PATH: &str = "nccl-profiler-post-path-h200x4";
/// The final build (the sampling words on one cache line, a post's index from its own
/// count), with two nodes of two ranks on one host (`hang2x2-*`).
const FINAL: &str = "nccl-profiler-final-h200x4";
/// The post path without locked read-modify-writes and bursts about every 500 ms (the
/// default since): a spin on 4 ranks, a read on 2, the stragglers on 4.
const SAMPLING: &str = "nccl-profiler-sampling-h200x4";

/// The sampling a set's runs had: every operation in the first, bursts of 8 about
/// every 100 ms until the last, every 500 ms there.
fn sampling_of(set: &str) -> KernelSampling {
    match set {
        ALL => KernelSampling::All,
        SAMPLING => KernelSampling::default(),
        _ => KernelSampling::Bursts {
            burst: 8,
            period_ms: 100,
        },
    }
}

/// The ranks a set's straggler runs had (each slow and balanced).
fn straggler_ranks(set: &str) -> &'static [u32] {
    match set {
        SAMPLING => &[4],
        _ => &[2, 4],
    }
}

fn fixture_in(set: &str, path: &str) -> PathBuf {
    common::device_fixture(set, path)
}

fn fixture(path: &str) -> PathBuf {
    fixture_in(ALL, path)
}

/// Rank `rank`'s counters file in `dir` (gzipped in the fixture).
fn counters(dir: &str, rank: u32) -> RankCounters {
    let (set, dir) = dir.split_once(':').unwrap_or((ALL, dir));
    common::counters_file(set, &format!("{dir}/rank_{rank}.gz"))
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
        ..Default::default()
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
        (FINAL, "hang2-spin", 2, 65114),
        (FINAL, "hang2-stuck", 2, 69020),
        (FINAL, "hang4-spin", 4, 54680),
        (FINAL, "hang4-stuck", 4, 55772),
        (SAMPLING, "hang4-spin", 4, 54608),
        (SAMPLING, "hang2-stuck", 2, 71282),
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
    // The counters show the mismatch at once: two ranks each side, every operation
    // before it 4 MiB on every rank.
    let m = s.mismatch.as_ref().expect("the ranks' operations differ");
    let groups: Vec<(Vec<u32>, u64)> = m.groups.iter().map(|(r, o)| (r.clone(), o.bytes)).collect();
    assert_eq!(m.index + 1, 51981);
    assert_eq!(groups, vec![(vec![1, 3], 4), (vec![0, 2], 4 << 20)]);
    assert_eq!(
        m.odd,
        Some(toporun_shared::nccl_counters::mismatch::OddBy::Pattern)
    );
    let h = Hang::nccl(
        &[],
        &toporun_shared::stacks::Places::new(),
        &s,
        Duration::from_secs(20),
        &Context::default(),
    );
    assert_eq!(h.odd, vec![1, 3]);
    assert!(h.headline.contains("the ranks posted different operations as operation 51981: ranks 1,3 all_reduce of 4 B, ranks 0,2 all_reduce of 4 MiB: ranks 1,3 left the pattern of the operations before it (all_reduce of 4 MiB on every rank)"), "{}", h.headline);
    let stderr = std::fs::read_to_string(fixture("mismatch4/stderr")).unwrap();
    assert!(
        stderr.contains("input sizes [[1048576]], the others [[1]]"),
        "{stderr}"
    );
}

/// Each rank's GPU time over a 20 s window inside collectives (on the communicator
/// its node judges it by, and on each of its communicators), from its counters at
/// 30 s and 50 s into the run.
fn times(dir: &str, ranks: u32) -> Vec<GpuTime> {
    let readings: Vec<_> = (0..ranks)
        .map(|r| {
            let at = |s| counters(&format!("{dir}/at{s}"), r);
            (at(30), at(50))
        })
        .collect();
    let windows: Vec<_> = (0..ranks)
        .map(|r| (r, &readings[r as usize].0, &readings[r as usize].1))
        .collect();
    let judged = window::judged_comms(&windows);
    windows
        .iter()
        .map(|&(r, a, b)| window::gpu_time(r, a, b, Duration::from_secs(20), judged[&r]).unwrap())
        .collect()
}

fn shares(times: &[GpuTime]) -> Vec<f64> {
    times.iter().map(GpuTime::share).collect()
}

/// Rank 1 on 3x the matmuls: its GPU spends far less of the window in collectives
/// than the others, which wait for it, and toporun's rule names it; balanced, the
/// shares are alike and name nobody.
#[test]
fn the_straggler_waits_least_and_a_balanced_job_names_nobody() {
    let sets = [ALL, SAMPLED, BURSTS, POST_PATH, FINAL, SAMPLING];
    let runs = sets
        .into_iter()
        .flat_map(|set| straggler_ranks(set).iter().map(move |&r| (set, r)));
    for (set, ranks) in runs {
        let sampling = counters(&format!("{set}:straggler{ranks}-slow/at30"), 0).sampling;
        assert_eq!(sampling, sampling_of(set), "{set}");
        let slow_times = times(&format!("{set}:straggler{ranks}-slow"), ranks);
        let slow = shares(&slow_times);
        let others = slow
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != 1)
            .map(|(_, s)| *s);
        let least_other = others.fold(f64::MAX, f64::min);
        assert!(slow[1] < least_other / 2.0, "{set} {ranks} ranks: {slow:?}");
        // toporun's straggler rule on those shares names rank 1, and nobody balanced:
        // on the job's figures (dumps) and communicator by communicator (counters).
        for by_comm in [false, true] {
            let named: Vec<u32> = straggler::find(&rows(&slow_times, by_comm), &[])
                .iter()
                .map(|s| s.rank)
                .collect();
            assert_eq!(named, [1], "{set} {ranks} ranks: {slow:?}");
            let even = times(&format!("{set}:straggler{ranks}-balanced"), ranks);
            let named = straggler::find(&rows(&even, by_comm), &[]);
            assert!(
                named.is_empty(),
                "{set} {ranks} ranks balanced: {:?} {named:?}",
                shares(&even)
            );
        }
        // As the runs themselves said.
        let said = |case: &str| stderr(set, &format!("straggler{ranks}-{case}"));
        assert!(
            said("slow").contains("toporun: straggler: rank 1 ("),
            "{set} {ranks}"
        );
        assert!(
            !said("balanced").contains("toporun: straggler:"),
            "{set} {ranks}"
        );
        eprintln!("{set} {ranks} ranks: slow {slow:?}");
    }
}

/// The ranks of a window whose GPUs spent `times` of it in collectives, with each
/// communicator's share where `by_comm` (as NCCL's counters give them). The captures
/// read the counters twice, so the window's one share stands for each of its thirds
/// (the rule asks two of them); the stacks' wait is the same for all.
fn rows(times: &[GpuTime], by_comm: bool) -> Vec<RankRow> {
    times
        .iter()
        .enumerate()
        .map(|(r, t)| (r, t.share(), comm_waits(t, by_comm)))
        .map(|(r, share, comms)| RankRow {
            rank: r as u32,
            local_rank: r as u32,
            node_rank: 0,
            host: "vm".into(),
            pid: 1000 + r as i32,
            gpu: Some(r as u32),
            gpu_uuid: None,
            now: None,
            cpu_pct: None,
            rss_bytes: None,
            gpu_now: None,
            gpu_time: None,
            window: Some(WindowSummary {
                wait: 0.5,
                thirds: [0.5; 3],
                samples: 60,
                spends: None,
                place: None,
                cpu_pct: None,
                throttled: None,
                pcie_replays: None,
                nvlink_errors: None,
                clocks: None,
                gpu_wait: Some(GpuWait {
                    share,
                    thirds: [Some(share); 3],
                    dumps: 1,
                    covered_s: 20.0,
                    busbw: Vec::new(),
                    comms,
                }),
            }),
        })
        .collect()
}

fn comm_waits(t: &GpuTime, by_comm: bool) -> Vec<CommWait> {
    if by_comm {
        common::comm_waits(t)
    } else {
        Vec::new()
    }
}

/// A run's stderr, as toporun printed it.
fn stderr(set: &str, dir: &str) -> String {
    std::fs::read_to_string(fixture_in(set, &format!("{dir}/stderr"))).unwrap()
}

/// Seconds into the run of the first line of `text` that contains `what`.
fn at(text: &str, what: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.contains(what))?;
    line.strip_prefix('[')?
        .split(']')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// With sampling (bursts every 100 ms; every 500 ms in the last set, a spin on 4 ranks
/// and a read on 2), every hang is reported within --hang-timeout + 10 s of the rank's
/// hold (the spinning rank, the rank stuck in a read, and rank 0 alone in an
/// evaluation, on 2 and on 4 ranks), the evaluation as busy, and that job, left to go
/// on (`--on-hang report`), finishes.
#[test]
fn hangs_are_said_within_the_timeout_and_a_long_evaluation_reads_as_busy() {
    let every_case = ["spin", "stuck", "eval"]
        .into_iter()
        .flat_map(|c| [(c, 2), (c, 4)]);
    let runs = [SAMPLED, BURSTS, POST_PATH, FINAL]
        .into_iter()
        .flat_map(|set| every_case.clone().map(move |(c, r)| (set, c, r)));
    for (set, case, ranks) in runs.chain([(SAMPLING, "spin", 4), (SAMPLING, "stuck", 2)]) {
        let summary = std::fs::read_to_string(fixture_in(set, "summary.txt")).unwrap();
        let err = stderr(set, &format!("hang{ranks}-{case}"));
        let timeout = err
            .split("(--hang-timeout ")
            .nth(1)
            .and_then(|t| t.split('s').next())
            .and_then(|t| t.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{set} {case} {ranks}: no timeout said\n{err}"));
        let hold = at(&err, "hold: rank ").expect("the rank's hold");
        let said = at(&err, " never posted ").expect("the hang report");
        let took = said - hold;
        assert!(
            took >= timeout - 1.0 && took <= timeout + 10.0,
            "{set} {case} {ranks}: said {took:.2} s after the hold"
        );
        let (rank, state) = match case {
            "spin" => (1, "busy"),
            "stuck" => (1, "stuck"),
            _ => (0, "busy"),
        };
        assert!(
            err.contains(&format!("rank {rank} is {state} (CPU ")),
            "{set} {case} {ranks}: {err}"
        );
        if case == "eval" {
            assert!(err.contains("raise --hang-timeout if that is expected"));
            let head = format!("== hang eval on {ranks} ranks: exit 0");
            assert!(summary.contains(&head), "{set}: {summary}");
        }
    }
}

/// While the jobs trained (the straggler runs, a minute each), no flight-recorder
/// dump was taken (the run scripts count the dump files) and no rank printed torch's deprecation warning for the trace
/// buffer's old variable, which toporun's earlier default gave every rank (as the
/// dump-timed 2x H200 run shows).
#[test]
fn no_dump_and_no_deprecation_warning_while_the_job_trains() {
    const DEPRECATED: &str = "TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated";
    let old =
        std::fs::read_to_string(fixture_in("gpu-straggler-proof-h200x2", "balanced.err")).unwrap();
    assert!(old.contains(DEPRECATED), "the warning as torch prints it");
    for set in [ALL, SAMPLED, BURSTS, POST_PATH, FINAL, SAMPLING] {
        let name = if set == ALL {
            "summary-stragglers.txt"
        } else {
            "summary.txt"
        };
        let summary = std::fs::read_to_string(fixture_in(set, name)).unwrap();
        let runs: Vec<&str> = summary
            .split("== ")
            .filter(|b| b.starts_with("straggler "))
            .collect();
        let dirs: Vec<String> = straggler_ranks(set)
            .iter()
            .flat_map(|r| ["slow", "balanced"].map(|case| format!("straggler{r}-{case}")))
            .collect();
        assert_eq!(runs.len(), dirs.len(), "{set}: {summary}");
        for run in runs {
            assert!(run.contains("fr dumps: 0,"), "{set}: {run}");
        }
        for dir in &dirs {
            let err = stderr(set, dir);
            assert!(!err.contains(DEPRECATED), "{set} {dir}");
        }
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
        "nccl-profiler-final-h200x4:straggler4-slow",
        "nccl-profiler-final-h200x4:straggler2-balanced",
        "nccl-profiler-sampling-h200x4:straggler4-slow",
        "nccl-profiler-sampling-h200x4:straggler4-balanced",
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

/// The stacks a run's hang report kept (each group's frames, innermost first).
fn reported_stacks(set: &str, dir: &str) -> Vec<RankStack> {
    let text = std::fs::read_to_string(fixture_in(set, &format!("{dir}/hang.json"))).unwrap();
    let hang: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut stacks = Vec::new();
    for g in hang["groups"].as_array().unwrap() {
        let frames: Vec<Frame> = serde_json::from_value(g["frames"].clone()).unwrap();
        for r in g["ranks"].as_array().unwrap() {
            let rank = r.as_u64().unwrap() as u32;
            stacks.push(RankStack {
                rank,
                local_rank: rank % 2,
                pid: 100 + rank as i32,
                threads: vec![ThreadStack {
                    thread: Some("MainThread".into()),
                    frames: frames.clone(),
                    idle: false,
                }],
                error: None,
            });
        }
    }
    stacks.sort_by_key(|s| s.rank);
    stacks
}

/// A node's reading as it travels in its record on the workers' store (JSON,
/// per-function totals left out).
fn travelled(reading: NodeReading) -> NodeReading {
    let json = serde_json::to_vec(&reading.for_exchange()).unwrap();
    serde_json::from_slice(&json).unwrap()
}

/// What the node deciding for the job says of `nodes` (each node's ranks and where
/// its counters lie), read twice 21 s apart with the run's reported stacks: the
/// merged view moves at first, then is a hang (whose places are given too).
fn job_verdict(set: &str, dir: &str, nodes: &[(Vec<u32>, String)]) -> (Hang, Places) {
    let readings: Vec<NodeReading> = nodes
        .iter()
        .map(|(ranks, counters_dir)| {
            travelled(NodeReading {
                live: ranks.clone(),
                counters: ranks
                    .iter()
                    .map(|r| (*r, counters(&format!("{set}:{counters_dir}"), *r)))
                    .collect(),
                ..Default::default()
            })
        })
        .collect();
    let merged = NodeReading::merge(&readings);
    let all: Vec<u32> = nodes.iter().flat_map(|(r, _)| r.clone()).collect();
    assert_eq!(merged.live, all, "{set} {dir}");
    let stacks = reported_stacks(set, dir);
    let places: Places = all
        .iter()
        .map(|r| {
            let place = Place {
                node_rank: r / 2,
                host: format!("trainer-{}", r / 2),
            };
            (*r, (place, r % 2))
        })
        .collect();
    // The innermost lines, from the script the ranks ran.
    let script = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../scripts/device/gpu_profiler_hang_rank.py"),
    )
    .unwrap();
    let line = |n: i32| {
        script
            .lines()
            .nth(n as usize - 1)
            .unwrap()
            .trim()
            .to_string()
    };
    let ctx = Context {
        left: Vec::new(),
        lines: stacks
            .iter()
            .map(|s| (s.rank, line(s.threads[0].frames[0].line)))
            .collect(),
        ..Default::default()
    };
    let mut watch = NcclWatch::default();
    let t0 = Instant::now();
    let timeout = Duration::from_secs(20);
    let first = nccl_verdict(
        &mut watch,
        merged.clone(),
        &stacks,
        &places,
        &ctx,
        timeout,
        t0,
    );
    assert!(matches!(first, NcclVerdict::Moving), "{dir}: {first:?}");
    let later = t0 + Duration::from_secs(21);
    match nccl_verdict(&mut watch, merged, &stacks, &places, &ctx, timeout, later) {
        NcclVerdict::Hang(hang) => (hang, places),
        other => panic!("{set} {dir}: no hang but {other:?}"),
    }
}

/// The 4-rank hangs as two nodes of two ranks: each node's counters travel as its
/// record on the store does, the deciding node follows them merged, and names the
/// same rank and operation as the one-node run, the stall said of the job.
#[test]
fn across_two_nodes_the_merged_counters_name_the_rank_behind() {
    for (set, dir, index) in [
        (POST_PATH, "hang4-spin", 53018),
        (POST_PATH, "hang4-stuck", 47642),
        (FINAL, "hang4-spin", 54680),
        (FINAL, "hang4-stuck", 55772),
    ] {
        let counters_dir = format!("{dir}/nccl-counters");
        let nodes = [
            (vec![0, 1], counters_dir.clone()),
            (vec![2, 3], counters_dir),
        ];
        let (hang, places) = job_verdict(set, dir, &nodes);
        let said = format!("rank 1 never posted all_reduce (4 B, operation {index} on");
        assert!(hang.headline.contains(&said), "{dir}: {}", hang.headline);
        let trigger = hang.trigger.clone().unwrap_or_default();
        assert!(
            trigger.contains("posted or completed in the job for 21s"),
            "{trigger}"
        );
        let text = hang.text(&places);
        assert!(text.contains("trainer-0"), "{dir}: {text}");
    }
}

/// Two toporun nodes of two ranks on one host (GPUs 0,1 and 2,3), rank 3 on node 1
/// spinning in Python or blocked in a read: each node's own counters, merged as the
/// node hosting the store merges them, name rank 3 at the operation both nodes'
/// reports gave; node 0 said it and stopped the job, and node 1 repeated node 0's
/// notice within --hang-timeout + 10 s of its rank's hold (node 0's log has no hold
/// line: the rank that held is node 1's).
#[test]
fn two_real_nodes_name_the_rank_behind_on_the_other_node() {
    for (dir, index, state) in [
        ("hang2x2-spin", 50642, "busy (CPU 10"),
        ("hang2x2-stuck", 53930, "stuck (CPU 0%"),
    ] {
        let nodes = [
            (vec![0, 1], format!("{dir}/nccl-counters0")),
            (vec![2, 3], format!("{dir}/nccl-counters1")),
        ];
        let (hang, _) = job_verdict(FINAL, dir, &nodes);
        let said = format!("rank 3 never posted all_reduce (4 B, operation {index} on");
        assert!(hang.headline.contains(&said), "{dir}: {}", hang.headline);
        assert!(hang.headline.contains("that ranks 0-2 wait in"), "{dir}");
        let node_err = |n: u32| {
            std::fs::read_to_string(fixture_in(FINAL, &format!("{dir}/stderr{n}"))).unwrap()
        };
        let (node0, node1) = (node_err(0), node_err(1));
        for (n, err) in [(0, &node0), (1, &node1)] {
            assert!(err.contains(&said), "node {n} of {dir}: {err}");
            assert!(
                err.contains(&format!("rank 3 (node 1 on vm, local rank 1) is {state}")),
                "node {n} of {dir}"
            );
        }
        assert!(
            node1.contains(
                "node 0 (hosting the workers' store) found the job's NCCL operations stalled"
            ),
            "{dir}"
        );
        // Node 1's own clock: the rank's hold and the report it printed.
        let hold = at(&node1, "hold: rank 3").expect("the rank's hold");
        let took = at(&node1, " never posted ").expect("the report") - hold;
        assert!(
            (19.0..=30.0).contains(&took),
            "{dir}: said {took:.2} s after the hold"
        );
        assert!(
            node0.contains("stopping the ranks: a hang (--on-hang stop)"),
            "{dir}"
        );
    }
}
