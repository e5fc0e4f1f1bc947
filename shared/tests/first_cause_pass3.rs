//! What 4x H200 (torch 2.11, NCCL 2.28.9) gave for issue 62's GPU points and issue
//! 61's busy rank on 4 GPUs, kept under tests/fixtures/device/first-cause-pass3-h200x4
//! (`scripts/device/gpu_first_cause_pass3.sh`; its README says which call made what).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};
use toporun_shared::nccl_counters::{NcclWatch, NodeReading, RankCounters};
use toporun_shared::stacks::{counters_alone, CountersAlone, Places};

const SET: &str = "first-cause-pass3-h200x4";

fn fixture(path: &str) -> PathBuf {
    common::device_fixture(SET, path)
}

fn text(path: &str) -> String {
    std::fs::read_to_string(fixture(path)).unwrap()
}

fn counters(run: &str, rank: u32) -> RankCounters {
    common::counters_file(SET, &format!("{run}/nccl-counters/rank_{rank}.gz"))
}

/// Seconds into the run of the first stderr line of `run` containing `what`.
fn said_at(run: &str, what: &str) -> f64 {
    let err = text(&format!("{run}/stderr"));
    let line = err.lines().find(|l| l.contains(what)).unwrap();
    line[1..line.find(']').unwrap()].trim().parse().unwrap()
}

/// The run's 4 ranks read twice 16 s apart with nothing moving, rank `held`'s CPU
/// busy through it (as both holds measured), the others idle in their wait.
fn counters_say(run: &str, held: u32) -> CountersAlone {
    let at = |busy: u64| NodeReading {
        live: vec![0, 1, 2, 3],
        counters: (0..4).map(|r| (r, counters(run, r))).collect(),
        cpu: (0..4)
            .map(|r| (r, Duration::from_secs(if r == held { busy } else { 0 })))
            .collect(),
        ..Default::default()
    };
    let (mut w, t0) = (NcclWatch::default(), Instant::now());
    let timeout = Duration::from_secs(15);
    counters_alone(&mut w, at(0), &Places::new(), timeout, t0);
    counters_alone(
        &mut w,
        at(16),
        &Places::new(),
        timeout,
        t0 + Duration::from_secs(16),
    )
}

/// 4 ranks, --hang-timeout 15 --on-hang stop: rank 0 alone evaluating for 35 s and
/// rank 1 spinning in Python each never post the operation the others wait in, their
/// CPU busy; the counters name each busy. The evaluation's GPU ran kernels and the job went
/// on to exit 0; the spin's GPU idled and the job ended within the timeout + 10 s of
/// the hold.
#[test]
fn on_four_gpus_the_evaluation_runs_on_and_the_spinning_rank_is_stopped_in_time() {
    // The spin's counters as the stop left them (the evaluation's went on to the end).
    let said = counters_say("hang4-spin", 1);
    let CountersAlone::Busy(line) = said else {
        panic!("not busy: {said:?}")
    };
    assert!(
        line.starts_with("rank 1 never posted all_reduce (4 B"),
        "{line}"
    );
    let eval = text("hang4-eval/stderr");
    assert!(
        eval.contains("toporun: no hang said: rank 0 never posted all_reduce (4 B")
            && eval.contains("its GPU runs kernels"),
        "{eval}"
    );
    let summary = text("summary.txt");
    assert!(
        summary.contains("== hang eval on 4 ranks: exit 0"),
        "{summary}"
    );
    assert!(
        summary.contains("== hang eval on 2 ranks: exit 0"),
        "{summary}"
    );
    assert!(
        said_at("hang4-eval", "toporun: no hang said") < said_at("hang4-eval", "evaluation done")
    );
    for (run, ranks) in [("hang4-spin", 4), ("hang2-spin", 2)] {
        let head = format!("== hang spin on {ranks} ranks: exit 124 after ");
        let line = summary.lines().find(|l| l.starts_with(&head)).unwrap();
        let exit: f64 = line[head.len()..].trim_end_matches(" s").parse().unwrap();
        let hold = said_at(run, "hold: rank 1 starts spin");
        assert!(
            exit - hold <= 25.0,
            "{run}: ended {:.1}s after the hold",
            exit - hold
        );
    }
}

/// Each step reduces the gradient (16 MiB) then the loss (4 B); rank 1 skipped one
/// gradient. Every rank then waits on its GPU, sampled: the first report names rank 1,
/// what it skipped and the shift, on 2 ranks as on 4, before any dump came.
#[test]
fn the_skipped_gradient_is_named_at_the_first_report_on_two_and_four_gpus() {
    for n in [2, 4] {
        let run = format!("failures{n}/skipgrad");
        let hang: serde_json::Value =
            serde_json::from_str(&text(&format!("{run}/hang.json"))).unwrap();
        assert_eq!(hang["odd"], serde_json::json!([1]), "{hang}");
        let err = text(&format!("{run}/stderr"));
        let first = err
            .lines()
            .find(|l| l.contains("toporun: hang: ") && !l.contains("no NCCL operation"))
            .unwrap();
        assert!(
            first.contains("rank 1 skipped the others' operation 25, all_reduce of 16 MiB: what rank 1 posted there is what the others posted next, and its later operations are shifted by one"),
            "{first}"
        );
        assert!(said_at(&run, "rank 1 skipped") < said_at(&run, "flight-recorder dumps here"));
    }
}

/// sys.exit("...") on one rank is named with its message; a stuck group under a side
/// group that keeps posting is named from the counters (the second call, the metrics
/// thread on its own stream); no rank printed torch's deprecation warning under
/// --nccl-profiler off.
#[test]
fn sys_exit_s_message_the_stuck_group_under_a_busy_side_group_and_no_deprecation() {
    for n in [2, 4] {
        let err = text(&format!("failures{n}/sysexit-run1/stderr"));
        assert!(
            err.contains("its last words on stderr: \"config error: lr must be positive\""),
            "{err}"
        );
    }
    let side = text("summary-sidebusy.txt");
    let named = side
        .matches("rank 1 never posted all_reduce (16 MiB, operation 13")
        .count();
    assert_eq!(named, 2, "{side}");
    assert_eq!(side.matches("in read_next_shard").count(), 2, "{side}");
    let off = text("off4/stderr");
    assert!(!off.contains("deprecated"), "{off}");
    assert!(!off.contains("toporun: warning"), "{off}");
}
