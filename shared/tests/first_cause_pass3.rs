//! What 2x H200 (torch 2.11, NCCL 2.28.9) gave for issue 62's points 2 and 4, kept
//! under tests/fixtures/device/nccl-first-cause-pass3-h200x2: a spinning rank's job
//! ends within --hang-timeout + 10 s, and no rank prints torch's deprecation warning
//! under `--nccl-profiler off`.

use std::path::PathBuf;

fn fixture(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/device/nccl-first-cause-pass3-h200x2")
        .join(path);
    std::fs::read_to_string(p).unwrap()
}

/// Seconds into the run of the first line of `text` containing `what`.
fn at(text: &str, what: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("{what}"));
    line[1..line.find(']').unwrap()].trim().parse().unwrap()
}

#[test]
fn a_spinning_rank_s_job_ends_within_the_timeout_and_ten_seconds() {
    let err = fixture("spin2-stderr");
    let hold = at(&err, "hold: rank 1 starts spin");
    let named = at(&err, "toporun: hang: rank 1 never posted");
    let stopped = at(&err, "toporun: stopped every rank");
    assert!(err.contains("rank 1 is busy (CPU 100%"), "{err}");
    assert!(
        named - hold <= 20.0 + 1.5,
        "named {:.1} s after the hold",
        named - hold
    );
    assert!(
        stopped - hold <= 20.0 + 10.0,
        "ended {:.1} s after the hold",
        stopped - hold
    );
    assert!(err.contains("waiting up to 7s"), "{err}");
}

#[test]
fn no_rank_warns_of_a_deprecated_variable_with_the_profiler_off() {
    let err = fixture("profiler-off-stderr");
    assert!(err.contains("toporun: python:"), "a real run: {err}");
    assert!(!err.contains("is deprecated"), "{err}");
}
