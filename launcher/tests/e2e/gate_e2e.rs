//! The entrypoint as a gate: `--preflight gate` stops a launch on an unfit host before
//! any rank starts (exit 3, the findings and fixes said, the termination message
//! written), `warn` starts the ranks as torchrun would, and a rank failure leaves its
//! root cause in the termination message Kubernetes shows.

use crate::support;

use std::process::Command;
use support::*;

fn launch(facts: &str, extra: &[&str], rank: &str) -> Command {
    let mut c = toporun();
    c.args(["--facts", &host(facts), "launch"])
        .args(extra)
        .args([
            "--standalone",
            "--nproc-per-node=1",
            "--nccl-report=off",
            "--no-python",
            "sh",
            "-c",
            rank,
        ]);
    c
}

#[test]
fn gate_stops_an_unfit_host_before_any_rank() {
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("ran");
    let term = d.path().join("termination-log");
    let rank = format!("touch {}", marker.display());
    let (code, _, err) = run(launch(
        "broken-efa-no-ipc-lock",
        &[
            "--preflight=gate",
            "--termination-log",
            term.to_str().unwrap(),
        ],
        &rank,
    )
    .env_remove("TOPORUN_PREFLIGHT"));
    assert_eq!(code, 3, "{err}");
    assert!(!marker.exists(), "a rank started behind the gate");
    assert!(
        err.contains("--preflight gate") && err.contains("Fix:"),
        "{err}"
    );
    let message = std::fs::read_to_string(&term).unwrap();
    assert!(message.contains("no rank was started"), "{message}");
    // 3 under --exit-codes classified too.
    let (code, _, err) = run(launch(
        "broken-efa-no-ipc-lock",
        &["--preflight=gate", "--exit-codes=classified"],
        &rank,
    )
    .env_remove("TOPORUN_PREFLIGHT"));
    assert_eq!(code, 3, "{err}");

    // The same host with warn (the default): the findings are said, the rank runs.
    let (code, _, err) = run(&mut launch("broken-efa-no-ipc-lock", &[], &rank));
    assert_eq!(code, 0, "{err}");
    assert!(marker.exists());
    assert!(err.contains("error:"), "{err}");
}

#[test]
fn gate_lets_a_fit_host_run_and_the_variable_sets_it() {
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("ran");
    let rank = format!("touch {}", marker.display());
    let (code, _, err) = run(launch("h200x4", &[], &rank).env("TOPORUN_PREFLIGHT", "gate"));
    assert_eq!(code, 0, "{err}");
    assert!(marker.exists());
    let (code, _, err) = run(launch("h200x4", &[], "true").env("TOPORUN_PREFLIGHT", "always"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("TOPORUN_PREFLIGHT"), "{err}");
}

#[test]
fn a_rank_failure_leaves_its_root_cause_in_the_termination_message() {
    let d = tempfile::tempdir().unwrap();
    let term = d.path().join("termination-log");
    let (code, _, err) = run(&mut launch(
        "h200x4",
        &["--termination-log", term.to_str().unwrap()],
        "echo boom >&2; exit 7",
    ));
    assert_eq!(code, 1, "{err}");
    let message = std::fs::read_to_string(&term).unwrap();
    assert!(message.len() <= 4096);
    assert!(
        message.contains("Root Cause") && message.contains("exitcode  : 7"),
        "{message}"
    );
}
