//! Bad numbers, files and variables end in a clear message and exit 2: never a panic,
//! a hang, a silent wrap, or output that can add a line or run a command when sourced.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::*;

fn refused(args: &[&str], env: &[(&str, &str)], says: &str) {
    let (code, _, err, _) = run_within(
        toporun().args(args).envs(env.iter().copied()),
        Duration::from_secs(20),
    );
    assert_eq!(code, 2, "{args:?} {env:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(says), "{args:?}: expected {says:?} in:\n{err}");
}

fn dry<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["launch", "--dry-run", "--facts"];
    a.push(Box::leak(host("h200x4").into_boxed_str()));
    a.extend(extra);
    a.push("t.py");
    a
}

#[test]
fn durations_out_of_range_are_usage_errors() {
    for v in ["1e20", "1e19", "nan", "-1", "inf"] {
        let arg = format!("--shutdown-timeout={v}");
        refused(&dry(&[&arg]), &[], "--shutdown-timeout");
    }
    refused(
        &dry(&[
            "--nnodes=2",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:1",
            "--rdzv-conf=join_timeout=1e20",
        ]),
        &[],
        "join_timeout",
    );
    // Read when the job starts, before any rank: the job itself must not run.
    for v in ["nan", "-1", "1e30", "0"] {
        refused(
            &[
                "--standalone",
                "--nproc-per-node=1",
                "-m",
                "this_module_never_runs",
            ],
            &[("TOPORUN_INIT_WARN_SECS", v)],
            "TOPORUN_INIT_WARN_SECS",
        );
    }
    // Shorter than 120 samples at the fastest sampling: refused, by option or variable.
    let job = ["--standalone", "-m", "this_module_never_runs"];
    let short = [&["--straggler-window=14.5"][..], &job].concat();
    refused(
        &short,
        &[],
        "--straggler-window=14.5: expected at least 15 seconds",
    );
    refused(
        &job,
        &[("TOPORUN_STRAGGLER_WINDOW", "2")],
        "TOPORUN_STRAGGLER_WINDOW=2: expected at least 15 seconds: the straggler rule decides on 120 samples",
    );
}

/// Bytes that are not UTF-8: an argument is refused by name (exit 2), a variable is
/// passed on to the ranks as it is and read by toporun only where it is text; neither
/// panics, as std's `args()` and `vars()` would.
#[test]
fn bytes_that_are_not_text_are_named_or_passed_on_never_a_panic() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let bad = OsStr::from_bytes(b"data-\xff.bin");
    let mut args: Vec<&OsStr> = dry(&[]).into_iter().map(OsStr::new).collect();
    args.push(bad);
    let (code, _, err, _) = run_within(toporun().args(&args), Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("is not valid UTF-8"), "{err}");
    let (code, out, err, _) = run_within(
        toporun().args(dry(&[])).env("TOPORUN_T_BYTES", bad),
        Duration::from_secs(20),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        !err.contains("panicked") && out.contains("t.py"),
        "{out}\n{err}"
    );
    assert!(
        err.contains("the value of TOPORUN_T_BYTES is not UTF-8"),
        "{err}"
    );
}

#[test]
fn counts_never_wrap() {
    refused(&dry(&["--nproc-per-node=4294967295"]), &[], "at most 4096");
    refused(
        &dry(&["--nnodes=2", "--node-rank=4294967296"]),
        &[],
        "--node-rank",
    );
    refused(&dry(&["--max-restarts=4294967297"]), &[], "--max-restarts");
    refused(
        &dry(&["--nnodes=1000000", "--nproc-per-node=4096"]),
        &[],
        "32-bit",
    );
    refused(&dry(&["--nnodes=2000000"]), &[], "at most 1048576 nodes");
}

#[test]
fn oversized_files_are_refused_quickly() {
    let (code, _, err, took) = run_within(
        toporun().args(["probe", "--facts", "/dev/zero"]),
        Duration::from_secs(20),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("MiB"), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");

    // A forged capture of 1000 GPUs.
    let d = tempfile::tempdir().unwrap();
    let n = 1000;
    let mut t = String::from("\t");
    for i in 0..n {
        t.push_str(&format!("GPU{i}\t"));
    }
    t.push_str("CPU Affinity\tNUMA Affinity\n");
    for i in 0..n {
        t.push_str(&format!("GPU{i}\t"));
        for j in 0..n {
            t.push_str(if i == j { " X\t" } else { "NV12\t" });
        }
        t.push_str("0-1\t0\n");
    }
    let cap = d.path().join("big.txt");
    std::fs::write(&cap, t).unwrap();
    let (code, _, err, _) = run_within(
        toporun()
            .args(["launch", "--dry-run", "--nvidia-smi-topo"])
            .arg(&cap)
            .args(["--nproc-per-node=gpu", "t.py"]),
        Duration::from_secs(20),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("at most 128"), "{err}");
}

#[test]
fn a_huge_cpulist_costs_what_one_range_does() {
    let d = tempfile::tempdir().unwrap();
    let src = fixtures().join("topo/dgx-a100.txt");
    let text = std::fs::read_to_string(src).unwrap();
    let huge = vec!["0-65535"; 12_000].join(","); // about 100 KB
    let forged = text.replace("48-63,176-191", &huge);
    assert!(forged.len() > 100_000);
    let cap = d.path().join("a100.txt");
    std::fs::write(&cap, forged).unwrap();
    let (code, _, err, took) = run_within(
        toporun()
            .args(["launch", "--dry-run", "--facts", &host("h200x4")])
            .arg("--nvidia-smi-topo")
            .arg(&cap)
            .args(["--nproc-per-node=gpu", "--numa-binding=node", "t.py"]),
        Duration::from_secs(30),
    );
    assert!(code == 0 || code == 2, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    eprintln!("a huge cpulist: {took:?}");
    // Measured 52 ms beside a test suite on the 2-core VM; a quadratic parse of the
    // list takes minutes.
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn sourced_output_gains_no_line_and_runs_nothing() {
    // A line break in a value cannot be carried by an env file: refused.
    let (code, out, err, _) = run_within(
        toporun()
            .args(dry(&["--format", "env"]))
            .env("NCCL_SOCKET_IFNAME", "eth0\nLD_PRELOAD=/tmp/evil.so"),
        Duration::from_secs(20),
    );
    assert_eq!(code, 2, "{err}");
    assert!(!out.contains("LD_PRELOAD"), "{out}");
    assert!(err.contains("NCCL_SOCKET_IFNAME"), "{err}");

    // Shell output is quoted: sourcing it sets the value, line break included, and
    // runs nothing; names that are not identifiers are refused.
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("ran");
    let evil = format!("eth0'\n$(touch {m})\n`touch {m}`", m = marker.display());
    let (code, out, err, _) = run_within(
        toporun()
            .args(dry(&["--format", "shell"]))
            .env("NCCL_SOCKET_IFNAME", &evil),
        Duration::from_secs(20),
    );
    assert_eq!(code, 0, "{err}");
    let script = d.path().join("env.sh");
    std::fs::write(&script, &out).unwrap();
    let shown = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -e; source {}; printf %s \"$NCCL_SOCKET_IFNAME\"",
            script.display()
        ))
        .output()
        .unwrap();
    assert!(shown.status.success(), "{out}");
    assert_eq!(String::from_utf8_lossy(&shown.stdout), evil);
    assert!(
        !Path::new(&marker).exists(),
        "sourcing ran a command:\n{out}"
    );

    // A replayed facts file carries the pod's NCCL variables too.
    let mut facts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(host("h200x4")).unwrap()).unwrap();
    facts["container"]["env"]["NCCL_SOCKET_IFNAME"] =
        serde_json::Value::String("eth0\nLD_PRELOAD=/tmp/evil.so".into());
    let forged = d.path().join("facts.json");
    std::fs::write(&forged, facts.to_string()).unwrap();
    let (code, out, _, _) = run_within(
        toporun()
            .args(["launch", "--dry-run", "--format", "env", "--facts"])
            .arg(&forged)
            .arg("t.py"),
        Duration::from_secs(20),
    );
    assert_eq!(code, 2);
    assert!(!out.contains("LD_PRELOAD"), "{out}");
}
