//! What one H200 (torch 2.11, NCCL 2.28.9) gave for a straggler under overlapping
//! NCCL groups, kept under tests/fixtures/device/hsdp-straggler-h200x1
//! (`scripts/device/gpu_cross_node_hang.sh`, stages hsdp-slow and hsdp-healthy):
//! FSDP2 over a 2x2 mesh (HSDP) on four toporun nodes of one rank each, NCCL over
//! sockets, every rank in a shard group, a replicate group and the job's; in
//! hsdp-slow rank 3 sleeps 150 ms before each step (410 ms a step against 264).
//! The counters of every rank were copied 50 s and 80 s into the run: that window.
//! Two captures: the first session's (the stage names) and a rerun on another H200
//! with the build of the third reading (`third/`, 406 ms a step against 257).

mod common;

use std::time::Duration;
use toporun_shared::nccl_counters::window::{gpu_time, judged_comms};
use toporun_shared::nccl_counters::RankCounters;
use toporun_shared::stacks::rank_window::{CommWait, GpuWait, WindowSummary};
use toporun_shared::stacks::straggler::{find, Basis, RankRow, Straggler};

const SET: &str = "hsdp-straggler-h200x1";
const SPAN: Duration = Duration::from_secs(30);

fn reading(stage: &str, at: u32, rank: u32) -> RankCounters {
    common::counters_file(SET, &format!("{stage}/at{at}/rank_{rank}.gz"))
}

/// Each rank's row as its node (one rank a node) gives it: its GPU time on the
/// communicator its node judges it by and on each of its communicators, the window's
/// one share standing for each third (two readings).
fn rows(stage: &str) -> Vec<RankRow> {
    (0..4)
        .map(|rank| {
            let (b, a) = (reading(stage, 50, rank), reading(stage, 80, rank));
            let judged = judged_comms(&[(rank, &b, &a)]);
            let t = gpu_time(rank, &b, &a, SPAN, judged[&rank]).expect("a figure");
            let comms = common::comm_waits(&t);
            row(rank, t.share(), comms)
        })
        .collect()
}

fn row(rank: u32, share: f64, comms: Vec<CommWait>) -> RankRow {
    RankRow {
        rank,
        local_rank: 0,
        node_rank: rank,
        host: "vm".into(),
        pid: 1000 + rank as i32,
        gpu: Some(0),
        gpu_uuid: None,
        now: None,
        cpu_pct: None,
        rss_bytes: None,
        gpu_now: None,
        gpu_time: None,
        window: Some(WindowSummary {
            wait: 0.0,
            thirds: [0.0; 3],
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
                dumps: 6,
                covered_s: SPAN.as_secs_f64(),
                busbw: Vec::new(),
                comms,
            }),
        }),
    }
}

/// The captures: where each run's stages are.
const RUNS: [&str; 2] = ["", "third/"];

/// The straggler `stage`'s rows name: rank 3 alone, by its GPU time, waiting under
/// 30% of the window where its peer in a group they share waits over 60%.
fn rank_3_named(stage: &str) -> Straggler {
    let mut slow = find(&rows(stage), &[]);
    assert_eq!(
        slow.iter().map(|s| s.rank).collect::<Vec<_>>(),
        [3],
        "{stage}: {slow:?}"
    );
    let s = slow.remove(0);
    assert!(
        matches!(s.basis, Basis::GpuWaitShare { .. }),
        "{stage}: {s:?}"
    );
    assert!(s.wait < 0.3 && s.median > 0.6, "{stage}: {s:?}");
    s
}

/// The slow rank is named from the groups it shares, the healthy run names nobody.
#[test]
fn the_slow_rank_under_hsdp_is_named_where_the_groups_meet() {
    for run in RUNS {
        let s = rank_3_named(&format!("{run}hsdp-slow"));
        // Its replicate group: rank 1 waits there most of the window, rank 3 a
        // quarter.
        assert_eq!(s.others, 1);
        let healthy = find(&rows(&format!("{run}hsdp-healthy")), &[]);
        assert!(healthy.is_empty(), "{run}: {healthy:?}");
    }
}

/// Before: the job-wide group, widest, was each rank's, and it carries only the
/// trainer's stop check (7 all_reduces in the 30 s, a couple timed): no rank had a
/// figure, and nothing judged the GPUs. And the ranks' shares compared across
/// groups (each on its busiest) leave the slow rank within the job-wide rule's
/// bounds: the groups must be compared one at a time.
#[test]
fn the_job_wide_group_is_not_the_one_judged_and_shares_across_groups_do_not_compare() {
    let (b, a) = (reading("hsdp-slow", 50, 3), reading("hsdp-slow", 80, 3));
    let world = a
        .comms
        .iter()
        .find(|c| c.nranks == 4)
        .expect("the job's group");
    assert!(gpu_time(3, &b, &a, SPAN, world.hash).is_none());
    let judged = judged_comms(&[(3, &b, &a)]);
    assert_ne!(judged[&3], world.hash);
    let mut alone = rows("hsdp-slow");
    for r in &mut alone {
        r.window
            .as_mut()
            .unwrap()
            .gpu_wait
            .as_mut()
            .unwrap()
            .comms
            .clear();
    }
    assert!(find(&alone, &[]).is_empty(), "{:?}", find(&alone, &[]));
}

/// A rank whose GPU, not its Python, is slow: rank 3 queues 106 (43) bf16 matmuls
/// before each step, about 150 ms (60 ms) of GPU work alone, several times that on
/// a GPU the four nodes share (909 ms, 519 ms a step, against 257 healthy). Its host
/// does not wait for them, so its Python stands at the step's `.item()` like its
/// peers': only the GPU time tells. Named from the group it shares, both times.
#[test]
fn a_rank_whose_gpu_is_slow_is_named_from_its_gpu_time() {
    for run in ["slowgpu/r150/", "slowgpu/r60/"] {
        rank_3_named(&format!("{run}hsdp-slowgpu"));
    }
}
