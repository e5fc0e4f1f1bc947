//! What one H200 (torch 2.11, NCCL 2.28.9) gave for failures of the NCCL corpus
//! (`scripts/device/gpu_nccl_failure_rank.py`) on two toporun nodes of one rank
//! each, NCCL over sockets between them (`scripts/device/gpu_cross_node_hang.sh`,
//! stages failure-C), kept under tests/fixtures/device/cross-node-failures-h200x1:
//! the job-wide rules, across nodes, on a skipped all_reduce, a rank's `sys.exit`,
//! and a stuck rank beside a side group that keeps moving.

mod common;

const SET: &str = "cross-node-failures-h200x1";

fn text(path: &str) -> String {
    std::fs::read_to_string(common::device_fixture(SET, path)).unwrap()
}

/// The toporun lines of node `node`'s stderr in `run`, less torch's own.
fn said(run: &str, node: u32) -> Vec<String> {
    let err = text(&format!("{run}/stderr{node}"));
    err.lines()
        .filter(|l| l.contains("toporun"))
        .map(str::to_owned)
        .collect()
}

use common::stamp_of as at;

/// `failure-skipgrad`: rank 1 skipped one gradient all_reduce (16 MiB); each step also
/// reduces the loss (4 B), so its later operations are the others' shifted by one.
/// The first report named the rank and the operation it skipped, on both nodes, and
/// the job stopped within a second of it.
#[test]
fn a_skipped_all_reduce_across_nodes_is_named_at_the_first_report() {
    let skipped = "rank 1 skipped the others' operation 25, all_reduce of 16 MiB";
    for n in [0, 1] {
        let l = said("failure-skipgrad", n);
        let first = l
            .iter()
            .find(|l| l.contains("toporun: hang: every rank"))
            .unwrap();
        assert!(first.contains(skipped), "node {n}: {first}");
        assert!(
            first.contains("its later operations are shifted by one"),
            "{first}"
        );
    }
}

/// `failure-sysexit`: rank 1 quits with `sys.exit("config error: lr must be
/// positive")`: the root cause quotes its last words on both nodes, and the job
/// exits 1.
#[test]
fn a_rank_s_sys_exit_is_named_with_its_message_across_nodes() {
    for n in [0, 1] {
        let l = said("failure-sysexit", n);
        let cause = l.iter().find(|l| l.contains("root cause")).unwrap();
        assert!(cause.contains("rank 1 exited with code 1 without a Python traceback, its last words on stderr: \"config error: lr must be positive\""), "node {n}: {cause}");
        assert!(text(&format!("failure-sysexit/exit{n}")).contains("exit 1"));
    }
}

/// `failure-sidebusy`: every rank's metrics thread all_reduces on a side group every
/// 10 ms; rank 1 then blocks in a read. NCCL's counters, communicator by communicator,
/// named it at the first report while the side group moved; the stacks alone
/// (`--nccl-profiler off`) saw the metrics thread's stack move as progress and spoke
/// only once the side group stood too, far later in the run.
#[test]
fn a_stuck_rank_beside_a_busy_side_group_is_named_from_the_counters() {
    let l = said("failure-sidebusy", 0);
    let head = l.iter().find(|l| l.contains("never posted")).unwrap();
    assert!(
        head.contains("rank 1 never posted all_reduce (16 MiB, operation 13"),
        "{head}"
    );
    assert!(head.contains("is stuck (CPU 0%"), "{head}");
    assert!(
        l.iter()
            .any(|l| l.contains("while other communicators moved")),
        "{l:#?}"
    );
    let by_counters = at(&l, "never posted");
    let off = said("profiler-off/failure-sidebusy", 0);
    let by_stacks = at(
        &off,
        "rank 1 (node 1 on vm, local rank 0) is in no collective",
    );
    assert!(by_stacks > by_counters + 30.0, "{by_counters} {by_stacks}");
}

/// `--nccl-profiler off`: a stuck rank named by the stacks (`is in no collective`)
/// waits 7 s for the dumps, not torch's 60: the stacks decided. And no rank printed
/// torch's deprecation warning for a variable toporun set.
#[test]
fn a_hang_the_stacks_decided_waits_briefly_for_the_dumps() {
    for run in [
        "profiler-off/failure-stuck",
        "profiler-off/failure-sidebusy",
    ] {
        let l = said(run, 0);
        let named = at(&l, "is in no collective");
        assert!(
            l.iter().any(|l| l.contains("waiting up to 7s")),
            "{run}: {l:#?}"
        );
        let stopped = at(&l, "stopped every rank after the hang report");
        assert!(stopped - named < 7.0 + 3.0, "{run}: {named} .. {stopped}");
        for n in [0, 1] {
            let err = text(&format!("{run}/stderr{n}"));
            assert!(!err.contains("deprecated"), "{run} node {n}");
        }
    }
}
