//! The real launch against the real torchrun: the same worker environment and argv,
//! a real gloo job through toporun's store, and PyTorch's TCPStore client.

use crate::support;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use support::*;

type Env = BTreeMap<String, String>;

/// Runs a launcher with the dump script; returns each rank's (argv, env added).
fn dump(
    mut cmd: Command,
    out: &Path,
    extra_env: &[(&str, &str)],
) -> BTreeMap<String, (Vec<String>, Env)> {
    let parent: Env = std::env::vars().collect();
    cmd.env("PROBE_OUT", out)
        .env("PYTHON_EXEC", python())
        .env("PYTHONPATH", scripts())
        .current_dir(scripts());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let (code, so, se) = run(&mut cmd);
    assert_eq!(code, 0, "{cmd:?}\n{so}\n{se}");
    let mut ranks = BTreeMap::new();
    for e in std::fs::read_dir(out).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "json") {
            continue; // a rank stopped before it finished its dump
        }
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let argv: Vec<String> = serde_json::from_value(v["argv"].clone()).unwrap();
        let env: Env = serde_json::from_value(v["env"].clone()).unwrap();
        let mut added: Env = env
            .into_iter()
            .filter(|(k, v)| {
                parent.get(k) != Some(v)
                    && !extra_env.iter().any(|(ek, _)| ek == k)
                    && k != "PROBE_OUT"
                    && k != "PYTHON_EXEC"
                    && k != "PYTHONPATH"
            })
            .collect();
        // Random by design: ports, run ids, temp dirs (only the layout below them counts).
        for k in ["MASTER_PORT", "TORCHELASTIC_RUN_ID"] {
            if let Some(v) = added.get_mut(k) {
                *v = "<random>".into();
            }
        }
        if let Some(v) = added.get_mut("TORCHELASTIC_ERROR_FILE") {
            let parts: Vec<&str> = v.rsplit('/').take(3).collect();
            *v = parts.into_iter().rev().collect::<Vec<_>>().join("/");
        }
        ranks.insert(
            p.file_name().unwrap().to_string_lossy().into_owned(),
            (argv, added),
        );
    }
    ranks
}

fn compare(
    name: &str,
    args: &[&str],
    extra_env: &[(&str, &str)],
    port_arg: Option<(&str, u16, u16)>,
) {
    let with_port = |p: u16| -> Vec<String> {
        args.iter()
            .map(|a| match port_arg {
                Some((tmpl, _, _)) if a.contains(tmpl) => a.replace(tmpl, &p.to_string()),
                _ => a.to_string(),
            })
            .collect()
    };
    let (tp, op) = port_arg.map_or((0, 0), |(_, a, b)| (a, b));
    let d1 = tempfile::tempdir().unwrap();
    let mut t = Command::new(torchrun());
    t.args(with_port(tp));
    let mut theirs = dump(t, d1.path(), extra_env);
    let d2 = tempfile::tempdir().unwrap();
    let mut o = toporun();
    // toporun's NCCL and flight-recorder additions off: exactly torchrun's environment.
    o.args([
        "--nccl-env=off",
        "--nccl-report=off",
        "--flight-recorder=off",
        "--faulthandler=off",
    ])
    .args(with_port(op));
    let mut ours = dump(o, d2.path(), extra_env);
    // The stop file's path (docs/preemption.md) is toporun's one addition without a
    // switch: a variable nothing reads unless the loop asks for it.
    for (_, env) in ours.values_mut() {
        env.remove("TOPORUN_STOP_FILE");
    }
    // After a rank fails, whether the others got to write before being stopped is a
    // race (toporun stops them within milliseconds): compare the attempts that ran
    // to completion, and the failing rank's own first attempt.
    if extra_env.iter().any(|(k, _)| *k == "FAIL_RANK") {
        let last = |k: &String| !k.contains("_attempt0") || k.starts_with("rank0_");
        theirs.retain(|k, _| last(k));
        ours.retain(|k, _| last(k));
    }
    assert!(!theirs.is_empty(), "{name}: torchrun produced nothing");
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{name}: ranks/attempts differ"
    );
    for (file, (targv, tenv)) in &theirs {
        let (oargv, oenv) = &ours[file];
        assert_eq!(oargv, targv, "{name} {file}: argv");
        assert_eq!(oenv, tenv, "{name} {file}: environment");
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn same_worker_environment_and_argv_as_torchrun() {
    compare(
        "standalone",
        &[
            "--standalone",
            "--nproc-per-node=2",
            "dump_env.py",
            "a1",
            "--flag",
        ],
        &[],
        None,
    );
    compare(
        "static",
        &[
            "--nnodes=1",
            "--node-rank=0",
            "--master-addr=127.0.0.1",
            "--master-port=PORT",
            "--nproc-per-node=2",
            "dump_env.py",
            "a1",
        ],
        &[],
        Some(("PORT", 29611, 29612)),
    );
    compare(
        "c10d",
        &[
            "--nnodes=1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:PORT",
            "--rdzv-id=job1",
            "--nproc_per_node=2",
            "dump_env.py",
        ],
        &[],
        Some(("PORT", 29613, 29614)),
    );
    compare(
        "pet-only",
        &["dump_env.py", "x"],
        &[("PET_NPROC_PER_NODE", "2"), ("PET_STANDALONE", "1")],
        None,
    );
    compare(
        "module",
        &[
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "dump_env",
            "--lr",
            "1",
        ],
        &[],
        None,
    );
    compare(
        "role-and-substitution",
        &[
            "--standalone",
            "--nproc-per-node=2",
            "--role=trainer",
            "dump_env.py",
            "--out=/tmp/${local_rank}",
            "$$x",
        ],
        &[],
        None,
    );
    compare(
        "omp-set",
        &["--standalone", "--nproc-per-node=2", "dump_env.py"],
        &[("OMP_NUM_THREADS", "3")],
        None,
    );
    compare(
        "virtual-local-rank",
        &[
            "--standalone",
            "--nproc-per-node=2",
            "--virtual-local-rank",
            "dump_env.py",
        ],
        &[("CUDA_VISIBLE_DEVICES", "3,5")],
        None,
    );
    // torch 2.15: one node, no --master-port: c10d on a free port, a fresh run id.
    compare(
        "one-node-no-port",
        &["--nproc-per-node=2", "dump_env.py"],
        &[],
        None,
    );
    compare(
        "single-rank-no-omp",
        &["--standalone", "--nproc-per-node=1", "dump_env.py"],
        &[],
        None,
    );
    compare(
        "restarts",
        &[
            "--standalone",
            "--nproc-per-node=2",
            "--max-restarts=1",
            "dump_env.py",
        ],
        &[("FAIL_RANK", "0")],
        None,
    );
}

/// A TOPORUN_* variable set to the empty string (a pod spec's `value: ""`) counts as
/// unset: `TOPORUN_XID_REPLAY=` once failed the launch as a file named "".
#[test]
fn toporun_variables_set_empty_count_as_unset() {
    let mut c = toporun();
    c.args(["--standalone", "--nproc-per-node=2", "--no-python", "true"]);
    for v in toporun_shared::toporun_vars::ToporunVar::ALL {
        c.env(v.name(), "");
    }
    let (code, out, err) = run(&mut c);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn no_python_runs_the_program_directly() {
    let py = python();
    let py = py.to_str().unwrap();
    compare(
        "no-python",
        &[
            "--standalone",
            "--nproc-per-node=2",
            "--no-python",
            py,
            "dump_env.py",
            "z",
        ],
        &[],
        None,
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn restart_after_a_failure_counts_up() {
    let d = tempfile::tempdir().unwrap();
    let mut o = toporun();
    o.args([
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        "dump_env.py",
    ]);
    let ranks = dump(o, d.path(), &[("FAIL_RANK", "0")]);
    assert_eq!(
        ranks["rank0_attempt1.json"].1["TORCHELASTIC_RESTART_COUNT"],
        "1"
    );
    assert_eq!(
        ranks["rank1_attempt1.json"].1["TORCHELASTIC_MAX_RESTARTS"],
        "1"
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn real_gloo_all_reduce_through_toporuns_store() {
    let (code, out, err) = run(toporun()
        .args(["--standalone", "--nproc-per-node=4", "allreduce_gloo.py"])
        .env("PYTHON_EXEC", python())
        .current_dir(scripts()));
    assert_eq!(code, 0, "{out}\n{err}");
    for r in 0..4 {
        assert!(out.contains(&format!("OK rank {r} of 4 sum 10")), "{out}");
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn pytorch_tcpstore_client_passes_every_operation() {
    let (code, out, err) = run(toporun()
        .args(["--standalone", "--nproc-per-node=1", "store_ops.py"])
        .env("PYTHON_EXEC", python())
        .current_dir(scripts()));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("STORE_OPS_OK"), "{out}\n{err}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn installed_as_torchrun_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("torchrun");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_toporun"), &link).unwrap();
    let d = tempfile::tempdir().unwrap();
    let ranks = dump(
        Command::new(&link)
            .args(["--standalone", "--nproc-per-node=2", "dump_env.py"])
            .to_owned_cmd(),
        d.path(),
        &[],
    );
    assert_eq!(ranks.len(), 2);
    let (code, _, err) = run(Command::new(&link).arg("--bogus-option"));
    assert_eq!(code, 2);
    assert!(
        err.contains("usage: torchrun") || err.contains("Usage: torchrun"),
        "{err}"
    );
}

trait Owned {
    fn to_owned_cmd(&mut self) -> Command;
}

impl Owned for Command {
    fn to_owned_cmd(&mut self) -> Command {
        let mut c = Command::new(self.get_program());
        c.args(self.get_args());
        c
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn argument_errors_exit_like_torchrun() {
    // argparse refusals exit 2; what torchrun raises once running (ValueError,
    // RuntimeError) exits 1. Each case against the installed torchrun.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: &[Case] = &[
        (&["--nproc-per-node=many", "t.py"], &[]),
        (&["--nproc-per-node=0", "t.py"], &[]),
        (&["--nnodes=2:1", "t.py"], &[]),
        (&["--nnodes=0", "t.py"], &[]),
        (&["-m", "--no-python", "t.py"], &[]),
        (&["--redirects=9", "t.py"], &[]),
        (&["--local-ranks-filter=a", "t.py"], &[]),
        (&["--node-rank=abc", "t.py"], &[]),
        (&["--monitor-interval=abc", "t.py"], &[]),
        (&["--bogus", "t.py"], &[]),
        (&[], &[]),
        (&["t.py"], &[("PET_STANDALONE", "true")]),
    ];
    for (args, env) in cases {
        let mut reference = Command::new(support::torchrun());
        reference.args(*args).envs(env.iter().copied());
        let (want, _, terr) = run(&mut reference);
        let (code, _, err) = run(toporun()
            .arg("launch")
            .args(*args)
            .envs(env.iter().copied()));
        assert_eq!(
            code, want,
            "{args:?} {env:?}: toporun {err}\ntorchrun {terr}"
        );
        assert!(!err.is_empty());
    }
}

/// The entries of a directory, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A job leaves in `--log-dir` what torchrun leaves (`attempt_N` with the ranks'
/// folders): no stacks socket once it exits, also after SIGTERM, and no empty
/// folders for flight-recorder dumps or NCCL logs nobody wrote.
#[test]
fn a_job_leaves_no_litter_in_its_log_dir() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("t.py"),
        "import sys, time\ntime.sleep(float(sys.argv[1]))\n",
    )
    .unwrap();
    let logs = d.path().join("logs");
    let job = |secs: &str| {
        let mut c = toporun();
        c.args(["--standalone", "--nproc-per-node=2", "--log-dir"])
            .arg(&logs)
            .args(["t.py", secs])
            .env("PYTHON_EXEC", "python3")
            .current_dir(d.path());
        c
    };
    let (code, _, err) = run(&mut job("0"));
    assert_eq!(code, 0, "{err}");
    let runs = entries(&logs);
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run_dir = logs.join(&runs[0]);
    assert_eq!(entries(&run_dir), ["attempt_0"]);
    assert_eq!(entries(&run_dir.join("attempt_0")), ["0", "1"]);
    // Stopped by a signal while its ranks run: the socket goes too.
    std::fs::remove_dir_all(&logs).unwrap();
    let mut child = job("30")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !std::fs::read_dir(&logs).is_ok_and(|mut r| {
        r.next()
            .is_some_and(|e| e.unwrap().path().join("stacks.sock").exists())
    }) {
        assert!(start.elapsed().as_secs() < 20, "no stacks socket appeared");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    sigterm(&child);
    child.wait().unwrap();
    let run_dir = logs.join(&entries(&logs)[0]);
    assert_eq!(entries(&run_dir), ["attempt_0"]);
}
