//! The test harness's own rules: a skip cannot pass silently on CI; a run that does
//! not end fails at its deadline with what it printed.

use crate::support::{run_within, skip_refused};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_skip_fails_on_ci_and_where_privileges_are_required() {
    assert!(
        skip_refused("t", None, false).is_none(),
        "a workstation may skip"
    );
    assert!(skip_refused("t", Some("false"), false).is_none());
    let on_ci = skip_refused("t", Some("true"), false).expect("CI=true refuses");
    assert!(on_ci.contains("EXPECTED_SKIPS"), "{on_ci}");
    assert!(skip_refused("t", None, true).is_some());
}

#[test]
fn a_run_past_its_deadline_is_stopped_and_fails_with_its_output() {
    let t = Instant::now();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo waiting for the peer >&2; sleep 60"]);
    let stopped =
        std::panic::AssertUnwindSafe(move || run_within(&mut cmd, Duration::from_secs(1)));
    let failed =
        std::panic::catch_unwind(stopped).expect_err("a run past its deadline fails the test");
    let said = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(said.contains("still running after 1s (stopped)"), "{said}");
    assert!(said.contains("waiting for the peer"), "{said}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // A run that ends in time gives its code and output, however much it printed.
    let mut big = Command::new("sh");
    big.args([
        "-c",
        "head -c 300000 /dev/zero | tr '\\0' x; echo done >&2; exit 3",
    ]);
    let (code, out, err, _) = run_within(&mut big, Duration::from_secs(20));
    assert_eq!((code, out.len(), err.as_str()), (3, 300000, "done\n"));
}
