//! Printing commands whose reader went away (`toporun topo | head`) end quietly, as
//! coreutils do: no "failed printing to stdout" panic, no SIGABRT and core file.

use crate::support;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use support::*;

/// Runs toporun with its stdout's reader closed before it prints anything.
fn with_closed_stdout(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = toporun()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_pipe_ends_printing_commands_quietly() {
    let h = host("h200x4");
    let cases: Vec<Vec<&str>> = vec![
        vec!["topo", "--facts", &h],
        vec!["preflight", "--format", "json", "--facts", &h],
        vec!["probe", "--facts", &h],
        vec![
            "launch",
            "--dry-run",
            "--facts",
            &h,
            "--nproc-per-node=2",
            "train.py",
        ],
    ];
    for args in cases {
        let (status, err) = with_closed_stdout(&args);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
        // Ended by SIGPIPE (as `head` expects), never by abort.
        assert!(
            status.signal() == Some(libc::SIGPIPE) || status.code().is_some(),
            "{args:?}: {status:?}"
        );
        assert_ne!(status.signal(), Some(libc::SIGABRT), "{args:?}");
    }
}
