//! What toporun said on real GPUs when a hang stopped a job, and when (issue 62):
//! the spinning rank's job ends within --hang-timeout + 10 s of the hold, a frozen
//! rank is named stopped in two real trainers, and under `--nccl-profiler off` no
//! rank prints torch's deprecation warning. The captures lie under
//! tests/fixtures/device (each set's README says which command made them).

mod common;

/// The lines of `path` in the fixture set `set`.
fn lines(set: &str, path: &str) -> Vec<String> {
    let text = std::fs::read_to_string(common::device_fixture(set, path)).unwrap();
    text.lines().map(str::to_owned).collect()
}

use common::stamp_of as at;

/// 2x H200, rank 1 spinning in Python (it holds the GIL, slow to dump) from the
/// hold, `--hang-timeout 20 --on-hang stop`: named by the counters, its dump waited
/// 7 s, not torch's 60, and every rank stopped within the timeout + 10 s of the hold.
#[test]
fn a_spinning_rank_s_job_ends_within_the_timeout_and_ten_seconds() {
    let l = lines("nccl-first-cause-pass3-h200x2", "summary.txt");
    let hold = at(&l, "hold: rank 1 starts spin");
    let named = at(&l, "rank 1 is busy (CPU 100%");
    let stopped = at(&l, "stopped every rank after the hang report");
    assert!(l.iter().any(|s| s.contains("waiting up to 7s")), "{l:?}");
    assert!(
        named - hold < 20.0 + 10.0,
        "named {:.1}s after the hold",
        named - hold
    );
    assert!(
        stopped - hold <= 20.0 + 10.0,
        "stopped {:.1}s after the hold",
        stopped - hold
    );
    let err = lines("nccl-first-cause-pass3-h200x2", "spin2-stderr");
    assert_eq!(at(&err, "stopped every rank"), stopped);
}

/// A rank frozen with SIGSTOP at step 30 of two real trainers (Lightning and
/// Transformers' Trainer, 2 of 4x H200): named stopped, by its process state, with
/// what to do; the dumps waited only 7 s, and the job stopped (exit 124).
#[test]
fn a_frozen_rank_is_named_stopped_in_two_real_trainers() {
    for run in [
        "fault-lightning-stop-toporun-pass2",
        "pass2/fault-hf-stop-toporun",
    ] {
        let l = lines("real-trainers-h200x4", &format!("{run}/summary.txt"));
        assert!(l[0].contains("exit 124"), "{run}: {}", l[0]);
        let said = at(&l, "rank 1 is stopped (process state T");
        let line = l.iter().find(|s| s.contains("process state T")).unwrap();
        assert!(
            line.contains("rank 1 never posted all_reduce"),
            "{run}: {line}"
        );
        assert!(line.contains("`kill -CONT` its process"), "{run}: {line}");
        assert!(l.iter().any(|s| s.contains("waiting up to 7s")), "{run}");
        let stopped = at(&l, "stopped every rank after the hang report");
        assert!(stopped - said < 7.0 + 6.0, "{run}: {said} .. {stopped}");
        let err = lines("real-trainers-h200x4", &format!("{run}/stderr"));
        assert_eq!(at(&err, "process state T"), said, "{run}");
    }
}

/// torch 2.11 under `--nccl-profiler off` (2x H200): the dumps time the GPUs through
/// the ranks' pipes, and no rank warns that TORCH_NCCL_TRACE_BUFFER_SIZE is
/// deprecated (toporun gives it the new name only).
#[test]
fn no_rank_warns_of_a_deprecated_variable_under_profiler_off() {
    let err = lines("nccl-first-cause-pass3-h200x2", "profiler-off-stderr");
    assert!(err
        .iter()
        .any(|l| l.contains("NCCL's own counters: off (--nccl-profiler off)")));
    let dumps = err
        .iter()
        .filter(|l| l.contains("preparing to dump debug info"))
        .count();
    assert!(dumps >= 4, "the ranks' pipes opened: {dumps} dumps");
    let warned: Vec<&String> = err.iter().filter(|l| l.contains("deprecated")).collect();
    assert!(warned.is_empty(), "{warned:?}");
}
