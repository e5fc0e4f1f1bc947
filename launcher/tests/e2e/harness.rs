//! The test harness's own rules: a skip cannot pass silently on CI.

use crate::support::skip_refused;

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
