//! The first cause names the right rank and reason when a 4-rank gloo job stops as
//! user code stops: a rank that left early (its peers' lost connections are the
//! consequence), a native crash, an exit without a traceback; and blames nobody when
//! ranks merely finish at different times.

use crate::support;
use std::process::Command;
use support::*;

fn job(mode: &str, extra: &[&str]) -> Command {
    let mut c = toporun();
    c.args(["--standalone", "--nproc-per-node=4", "--nccl-report=off"])
        .args(extra)
        .arg("first_cause.py");
    c.env("MODE", mode)
        .env("PYTHON_EXEC", python())
        .current_dir(scripts());
    c
}

/// The first `toporun: root cause` line.
fn first_cause(err: &str) -> &str {
    err.lines()
        .find(|l| l.starts_with("toporun: root cause"))
        .unwrap_or_else(|| panic!("no root cause line:\n{err}"))
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_rank_that_left_early_is_the_cause_not_the_rank_that_lost_it() {
    for mode in ["leave", "short"] {
        let (code, _, err) = run(&mut job(mode, &["--exit-codes=classified"]));
        assert_eq!(code, 1, "{mode}: {err}");
        let cause = first_cause(&err);
        assert!(
            cause.starts_with("toporun: root cause (code): rank 1 left the job (exit 0 at "),
            "{mode}: {cause}\n{err}"
        );
        assert!(cause.contains("is the consequence"), "{mode}: {cause}");
        // The lost address is matched to the rank that held it (gloo prints the port
        // in network byte order; toporun matches either).
        assert!(cause.contains(", a port rank 1 held)"), "{mode}: {cause}");
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_native_crash_is_named_with_the_function_it_struck_in() {
    let (code, _, err) = run(&mut job("segv", &[]));
    assert_eq!(code, 1, "{err}");
    assert!(
        first_cause(&err).starts_with("toporun: root cause (code): rank 3 crashed with SIGSEGV (a native crash in C/C++/CUDA code) in decode_native_record (first_cause.py:"),
        "{err}"
    );
    // Without faulthandler: where it was last sampled, with the sample's age.
    let (_, _, err) = run(job("segv", &["--faulthandler=off"]).env("STEP_SECS", "1.5"));
    let cause = first_cause(&err);
    assert!(
        cause.starts_with("toporun: root cause (code): rank 3 crashed with SIGSEGV")
            && cause.contains("last seen in ")
            && cause.contains("s before it ended"),
        "{err}"
    );
}

/// `sys.exit("...")` on one rank: its message is the cause, quoted.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn an_exit_with_a_message_is_named_with_the_message() {
    let (code, _, err) = run(&mut job("exitmsg", &[]));
    assert_eq!(code, 1, "{err}");
    let cause = first_cause(&err);
    assert!(
        cause.starts_with("toporun: root cause (code): rank 1 exited with code 1 without a Python traceback, its last words on stderr: \"config error: lr must be positive (got -0.001)\""),
        "{err}"
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn an_exit_without_a_traceback_says_where_the_rank_was() {
    let (code, _, err) = run(job("exit3", &["--exit-codes=classified"]).env("STEP_SECS", "1.5"));
    assert_eq!(code, 1, "{err}");
    let cause = first_cause(&err);
    assert!(
        cause.starts_with(
            "toporun: root cause (code): rank 3 exited with code 3 without a Python traceback"
        ) && cause.contains("last seen in flush_shards (first_cause.py:"),
        "{err}"
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn ranks_that_finish_at_different_times_blame_nobody() {
    for mode in ["rank0_last", "uneven"] {
        let (code, out, err) = run(&mut job(mode, &[]));
        assert_eq!(code, 0, "{mode}: {err}");
        assert_eq!(out.matches(" done").count(), 4, "{mode}: {out}");
        assert!(!err.contains("root cause"), "{mode}: {err}");
    }
}

/// Rank 0 checkpoints into a 1 MiB tmpfs of its own mount namespace (`unshare -m`,
/// root): PyTorch's stream writer says only "unexpected pos"; the volume it was
/// writing says full, with its own class.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_checkpoint_to_a_full_volume_names_the_volume() {
    let d = tempfile::tempdir().unwrap();
    let inner = job("ckpt", &["--exit-codes=classified"]);
    let mut c = Command::new("unshare");
    c.args([
        "-m",
        "sh",
        "-c",
        "mount -t tmpfs -o size=1m tmpfs \"$CKPT\" && exec \"$@\"",
        "sh",
    ])
    .arg(inner.get_program())
    .args(inner.get_args())
    .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
    .env("CKPT", d.path())
    .current_dir(scripts());
    let (code, _, err) = run(&mut c);
    let want = format!(
        "toporun: root cause (disk): rank 0 could not write {}/step3.pt: its volume is full (1 MiB, ",
        d.path().display()
    );
    assert!(first_cause(&err).starts_with(&want), "{err}");
    assert_eq!(code, 83, "{err}");
}

/// PyTorch's CUDA out-of-memory error (its message replayed on a CPU rank; a real
/// one on the device: tests/fixtures/device): its own kind and class, the numbers in
/// one line, the innermost user frame.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn cuda_out_of_memory_is_its_own_cause_with_the_numbers() {
    let (code, _, err) = run(&mut job("cuda_oom", &["--exit-codes=classified"]));
    let cause = first_cause(&err);
    assert!(
        cause.starts_with("toporun: root cause (gpu-memory): rank 0 ran out of GPU memory in build_activations (first_cause.py:")
            && cause.contains("asked 8.00 GiB with 6.66 GiB free of 79.18 GiB")
            && cause.contains("expandable_segments:True"),
        "{err}"
    );
    assert_eq!(code, 84, "{err}");
}

/// Rank 1 waits for a batch its DataLoader worker never delivers: the hang names
/// rank 1, and shows where its worker stands (the culprit frame is in the child).
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_stuck_dataloader_worker_is_shown_in_the_hang() {
    let (code, _, err) = run(&mut job(
        "worker_stuck",
        &[
            "--hang-timeout=5",
            "--on-hang=stop",
            "--exit-codes=classified",
        ],
    ));
    assert_eq!(code, 124, "{err}");
    assert!(
        err.contains("toporun: hang: rank 1 is not where the other 3 wait"),
        "{err}"
    );
    let worker = err
        .lines()
        .find(|l| l.starts_with("  rank 1 worker pid "))
        .unwrap_or_else(|| panic!("no worker line:\n{err}"));
    assert!(
        worker.contains("read_remote_shard (scripts/first_cause.py:")
            && worker.contains("__getitem__ (scripts/first_cause.py:"),
        "{worker}"
    );
}

/// A DataLoader worker killed under rank 1: rank 1 is named, with PyTorch's words.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_killed_dataloader_worker_names_its_rank() {
    let (code, _, err) = run(&mut job("worker_killed", &["--exit-codes=classified"]));
    assert_eq!(code, 1, "{err}");
    let cause = first_cause(&err);
    assert!(
        cause.starts_with(
            "toporun: root cause (code): rank 1 raised RuntimeError: DataLoader worker (pid "
        ) && cause.contains("is killed by signal: Killed."),
        "{err}"
    );
}

/// One node of a static 2-node job of 2 ranks each on loopback, running `mode`.
fn node_of_two(node: u32, port: u16, mode: &str) -> std::process::Child {
    let mut c = toporun();
    c.args([
        "--nnodes=2",
        &format!("--node-rank={node}"),
        "--master-addr=127.0.0.1",
        &format!("--master-port={port}"),
        "--nproc-per-node=2",
        "--nccl-report=off",
        "--exit-codes=classified",
        "first_cause.py",
    ])
    .env("MODE", mode)
    .env("PYTHON_EXEC", python())
    .current_dir(scripts())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    c.spawn().unwrap()
}

/// Rank 1 (node 0) leaves early: node 0 names it, and node 1, whose ranks lost it
/// too, hears the same cause with the stop.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_rank_that_left_is_the_cause_on_every_node() {
    let port = free_port();
    let nodes = [node_of_two(0, port, "leave"), node_of_two(1, port, "leave")];
    let outs: Vec<(i32, String)> = nodes
        .into_iter()
        .map(|n| {
            let o = n.wait_with_output().unwrap();
            (
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .collect();
    for (node, (code, err)) in outs.iter().enumerate() {
        assert_eq!(*code, 1, "node {node}: {err}");
        let cause = first_cause(err);
        assert!(
            cause.contains("rank 1 left the job (exit 0 at ")
                && cause.contains("while rank 0 was still running"),
            "node {node}: {cause}\n{err}"
        );
    }
}
