//! What 4x H200 (torch 2.11, NCCL 2.28.9) gave for issue 61, kept under
//! tests/fixtures/device/real-trainers-h200x4 (`scripts/device/gpu_real_trainers.sh`):
//! PyTorch Lightning's DDP trainer on 2 ranks, rank 1 skipping an all_reduce on a side
//! group at step 30 (`FAULT=skip`), its counters files as the attempt's end left them.
//! Rank 0 posted the side group's all_reduce, and its next copy to the GPU queued
//! behind NCCL's kernel, so it never posted the default group's all_reduce that rank 1
//! waits in, its CPU spinning at 100%: the first pass called it busy with its GPU
//! running kernels, and said no hang.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};
use toporun_shared::nccl_counters::{NcclWatch, NodeReading, RankCounters};
use toporun_shared::stacks::{counters_alone, CountersAlone, Places};

const SET: &str = "real-trainers-h200x4";

fn fixture(path: &str) -> PathBuf {
    common::device_fixture(SET, path)
}

fn counters(run: &str, rank: u32) -> RankCounters {
    common::counters_file(SET, &format!("{run}/rank_{rank}.gz"))
}

/// The skip run's node read twice 16 s apart with nothing moving, rank 0's CPU busy
/// the whole time (as measured then), rank 1's idle.
#[test]
fn a_skipped_collective_on_a_side_group_is_a_hang_that_names_the_rank_that_skipped() {
    let run = "fault-lightning-skip-toporun-pass2";
    let at = |cpu0: u64| NodeReading {
        live: vec![0, 1],
        counters: [(0, counters(run, 0)), (1, counters(run, 1))].into(),
        cpu: [(0, Duration::from_secs(cpu0)), (1, Duration::ZERO)].into(),
        ..Default::default()
    };
    let (mut w, t0) = (NcclWatch::default(), Instant::now());
    let timeout = Duration::from_secs(15);
    assert!(matches!(
        counters_alone(&mut w, at(0), &Places::new(), timeout, t0),
        CountersAlone::Moving
    ));
    let said = counters_alone(
        &mut w,
        at(16),
        &Places::new(),
        timeout,
        t0 + Duration::from_secs(16),
    );
    let CountersAlone::Hang(h) = said else {
        panic!("not a hang: {said:?}")
    };
    assert_eq!(h.odd, vec![1, 0], "{}", h.headline);
    assert!(
        h.headline.contains("which rank 1 never posted"),
        "{}",
        h.headline
    );
    assert!(h.headline.contains("in different orders"), "{}", h.headline);
    // What the run said with this rule, and the first pass without it.
    let said = std::fs::read_to_string(fixture(&format!("{run}/stderr"))).unwrap();
    assert!(said.contains("which rank 1 never posted"), "{said}");
    let before = std::fs::read_to_string(fixture("fault-lightning-skip-toporun/stderr")).unwrap();
    assert!(before.contains("toporun: no hang said"), "{before}");
}

/// The side group: rank 0 posted two all_reduces, rank 1 one; the default group: rank
/// 1 one more than rank 0. Each is behind on one communicator.
#[test]
fn the_skip_run_s_counters_show_each_rank_behind_on_one_communicator() {
    let run = "fault-lightning-skip-toporun-pass2";
    let posted = |rank: u32| -> Vec<u64> {
        let mut p: Vec<u64> = counters(run, rank)
            .comms
            .iter()
            .filter(|c| c.live)
            .map(|c| c.posted)
            .collect();
        p.sort();
        p
    };
    let (r0, r1) = (posted(0), posted(1));
    assert_eq!(r0.len(), 2, "{r0:?}");
    assert_eq!((r0[0], r1[0]), (2, 1), "side group");
    assert_eq!(r1[1], r0[1] + 1, "default group");
}

/// Rank 1's own lines in a run's stderr (toporun's stamp `[  21.10] ` taken off): those
/// torch prefixes with `[rank1]:`, and those the trainer prints as `rank 1: ...`.
fn rank1_tail(run: &str) -> String {
    let err = std::fs::read_to_string(fixture(&format!("{run}/stderr"))).unwrap();
    err.lines()
        .map(|l| l.split_once("] ").map_or(l, |(_, rest)| rest))
        .filter(|l| l.starts_with("[rank1]:") || l.starts_with("rank 1:"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Lightning catches the exception (and sys.exit's SystemExit) and tears its process
/// group down, which waits while rank 0 sits in its collective: the report said rank
/// 1 "is stuck in destroy_process_group". What rank 1 raised or said before is the
/// cause (2x H200, tests/fixtures/device/real-trainers-h200x4/pass2).
#[test]
fn lightning_s_rank_in_its_teardown_is_said_with_what_it_raised_or_said_before() {
    use toporun_shared::stacks::hang_report::Hang;
    use toporun_shared::stacks::teardown::{teardown_cause, LastSaid};
    let runs = [
        ("fault-lightning-raise-toporun", "; before its teardown rank 1 raised RuntimeError: loss became NaN at step 30 (injected) (trainer_common.py:82): that is the cause"),
        ("fault-lightning-dlworker-toporun", "; before its teardown rank 1 raised RuntimeError: DataLoader worker (pid 1831) is killed by signal: Killed."),
        ("fault-lightning-exit-toporun", "; its last words on stderr before its teardown: \"rank 1: giving up at step 30: the shard's checksum does not match\""),
    ];
    for (run, expected) in runs {
        let run = format!("pass2/{run}");
        let json = std::fs::read_to_string(fixture(&format!("{run}/hang.json"))).unwrap();
        let hang: Hang = serde_json::from_str(&json).unwrap();
        let said = [(1, LastSaid::of(&rank1_tail(&run)).unwrap())].into();
        let cause = teardown_cause(&hang, &said).unwrap_or_default();
        assert!(cause.starts_with(expected), "{run}: {cause}");
    }
}
