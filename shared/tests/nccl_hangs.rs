//! The NCCL failure cases as they ran on 2x H100 (torch 2.11, NCCL 2.28.9;
//! `scripts/device/gpu_nccl_failures.sh`, tests/fixtures/device/nccl-failures-h100x2): each
//! case's hang.json holds the stacks toporun sampled, its stderr NCCL's watchdog line,
//! its fr/ the flight-recorder dumps. The decisions are replayed on them: the rank
//! that left, the rank outside any collective, the collective whose sizes differ, and
//! the watchdog's victim named as the messenger.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use toporun_shared::flight_recorder::{analyze, headline, parse};
use toporun_shared::root_cause::watchdog::last_timeout;
use toporun_shared::stacks::hang_report::{Context, Hang};
use toporun_shared::stacks::{Group, Places, RankStack, ThreadStack};

fn dir(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/device/nccl-failures-h100x2")
        .join(case)
}

#[derive(serde::Deserialize)]
struct Recorded {
    groups: Vec<Group>,
}

/// The ranks' stacks as sampled (the main thread's frames of each group).
fn stacks(case: &str) -> Vec<RankStack> {
    let text = std::fs::read_to_string(dir(case).join("hang.json")).unwrap();
    let rec: Recorded = serde_json::from_str(&text).unwrap();
    let mut out: Vec<RankStack> = rec
        .groups
        .iter()
        .flat_map(|g| {
            g.ranks.iter().map(|r| RankStack {
                rank: *r,
                local_rank: *r,
                pid: 100 + *r as i32,
                threads: vec![ThreadStack {
                    thread: Some("MainThread".into()),
                    frames: g.frames.clone(),
                    idle: false,
                }],
                error: None,
            })
        })
        .collect();
    out.sort_by_key(|s| s.rank);
    out
}

/// Each rank's innermost line, read from the rank script as it ran there.
fn lines(stacks: &[RankStack]) -> BTreeMap<u32, String> {
    let script = std::fs::read_to_string(dir("gpu_nccl_failure_rank.py")).unwrap();
    stacks
        .iter()
        .filter_map(|s| {
            let f = s.main_thread()?.frames.first()?;
            let n = usize::try_from(f.line).ok()?.checked_sub(1)?;
            Some((s.rank, script.lines().nth(n)?.to_string()))
        })
        .collect()
}

fn hang(case: &str) -> Hang {
    let s = stacks(case);
    let ctx = Context {
        left: Vec::new(),
        lines: lines(&s),
        ..Default::default()
    };
    let secs = Duration::from_secs(15);
    Hang::with(&s, &Places::new(), secs, secs, &ctx)
}

#[test]
fn a_rank_that_ended_its_loop_and_waits_in_destroy_process_group_left_the_job() {
    for case in [
        "leaver",
        "skip",
        "rerun/leaver",
        "rerun/skip",
        "rerun/leaver-default",
    ] {
        let h = hang(case);
        assert_eq!(h.odd, vec![1], "{case}: {}", h.headline);
        assert!(
            h.headline.starts_with("rank 1 left the job (rank 1 tears its process group down in destroy_process_group in <module> (gpu_nccl_failure_rank.py:109)) while rank 0 still needed it: rank 0 waits on its GPU at .item() in main (gpu_nccl_failure_rank.py:102)"),
            "{case}: {}",
            h.headline
        );
        let s = stacks(case);
        let ctx = Context {
            left: Vec::new(),
            lines: lines(&s),
            ..Default::default()
        };
        assert!(ctx.left_while_others_wait(&s), "{case}");
    }
}

#[test]
fn with_two_ranks_the_one_in_its_own_read_is_named_not_every_rank_alike() {
    let h = hang("stuck");
    assert_eq!(h.odd, vec![1]);
    assert!(
        h.headline.starts_with("rank 1 is in no collective: rank 1 runs its own code in read_next_shard (gpu_nccl_failure_rank.py:47), while rank 0 waits on its GPU at .item() in main (gpu_nccl_failure_rank.py:102)"),
        "{}",
        h.headline
    );
    let s = stacks("stuck");
    assert!(!Context {
        left: Vec::new(),
        lines: lines(&s),
        ..Default::default()
    }
    .left_while_others_wait(&s));
}

#[test]
fn ranks_alike_at_item_point_to_the_flight_recorder_which_names_the_sizes() {
    let h = hang("metrics");
    assert!(h.odd.is_empty());
    assert!(
        h.headline.starts_with("every rank waits for its peers"),
        "{}",
        h.headline
    );
    assert!(!h.headline.contains("same place"), "{}", h.headline);
    let dumps: Vec<_> = (0..2)
        .map(|r| {
            parse(
                r,
                &std::fs::read(dir("metrics").join(format!("fr/rank_{r}"))).unwrap(),
            )
            .unwrap()
        })
        .collect();
    assert_eq!(
        headline(&analyze(&dumps)).as_deref(),
        Some("rank 0 entered collective #14 on group 0 with input sizes [[1]], the others [[2048, 2048]]")
    );
}

#[test]
fn the_watchdogs_victim_is_the_messenger_and_the_rank_in_its_read_the_cause() {
    let err = std::fs::read_to_string(dir("watchdog").join("stderr")).unwrap();
    let w = last_timeout(&err).unwrap();
    assert_eq!((w.seq, w.timeout_ms), (Some(13), Some(25000)));
    let s = stacks("watchdog");
    let ctx = Context {
        left: Vec::new(),
        lines: lines(&s),
        ..Default::default()
    };
    let h = Hang::watchdog(&s, &Places::new(), 0, &w.what(), &ctx);
    assert_eq!(h.odd, vec![1]);
    assert!(
        h.headline.starts_with("rank 1 is in no collective"),
        "{}",
        h.headline
    );
    assert!(h.text(&Places::new()).starts_with(
        "toporun: hang: NCCL's watchdog stopped rank 0 in all_reduce #13 after its 25s timeout;"
    ));
}
