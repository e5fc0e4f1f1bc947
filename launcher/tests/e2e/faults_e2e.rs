//! Supervision under faults: fail fast, shutdown timeout, signals, no orphans.

use crate::support;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

fn job(mode: &str, out: &Path, extra: &[&str]) -> Command {
    let mut c = toporun();
    c.args(["--standalone", "--nproc-per-node=3"])
        .args(extra)
        .arg("worker.py");
    c.env("MODE", mode)
        .env("PROBE_OUT", out)
        .env("PYTHON_EXEC", python())
        .current_dir(scripts());
    c
}

fn alive(pid: i32) -> bool {
    // A zombie counts as gone: it runs nothing.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn wait_exit(child: &mut Child, timeout: Duration) -> (i32, Duration) {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (s.code().unwrap_or(-1), start.elapsed());
        }
        assert!(
            start.elapsed() < timeout,
            "toporun did not exit within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn term_time(out: &Path, rank: u32) -> Option<f64> {
    std::fs::read_to_string(out.join(format!("term{rank}")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_failing_rank_stops_the_others_within_a_second() {
    let d = tempfile::tempdir().unwrap();
    let start = std::time::SystemTime::now();
    let (code, _, err) = run(&mut job("exit3", d.path(), &[]));
    let took = start.elapsed().unwrap();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("worker.py FAILED"), "{err}");
    assert!(err.contains("exitcode  : 3"), "{err}");
    assert!(err.contains("rank      : 0 (local_rank: 0)"), "{err}");
    let exited: f64 = std::fs::read_to_string(d.path().join("exit0"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for r in [1, 2] {
        let t = term_time(d.path(), r).unwrap_or_else(|| panic!("rank {r} got no SIGTERM"));
        assert!(
            t - exited < 1.0,
            "rank {r} stopped {:.3}s after rank 0 failed",
            t - exited
        );
    }
    assert!(took < Duration::from_secs(15), "took {took:?}");
    for pid in rank_pids(d.path(), 3, Duration::ZERO) {
        assert!(!alive(pid), "pid {pid} left behind");
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_rank_ignoring_sigterm_is_killed_after_the_shutdown_timeout() {
    let d = tempfile::tempdir().unwrap();
    let mut child = job("ignore-term", d.path(), &["--shutdown-timeout=2"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ps = rank_pids(d.path(), 3, Duration::from_secs(30));
    // Rank 0 keeps running too: stop the job with SIGTERM to toporun.
    sigterm(&child);
    let (code, took) = wait_exit(&mut child, Duration::from_secs(10));
    assert_eq!(code, 1);
    assert!(
        took >= Duration::from_millis(1800),
        "SIGKILL came before the timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(6), "{took:?}");
    for pid in ps {
        assert!(!alive(pid), "pid {pid} left behind");
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn sigterm_to_toporun_reaches_every_rank() {
    let d = tempfile::tempdir().unwrap();
    let mut child = job("", d.path(), &[])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ps = rank_pids(d.path(), 3, Duration::from_secs(30));
    sigterm(&child);
    let (code, took) = wait_exit(&mut child, Duration::from_secs(30));
    assert_eq!(code, 1);
    // The ranks exit at SIGTERM at once: toporun then ends (measured 20 ms beside a
    // test suite on the 2-core VM). A rank ignoring it would hold the exit for the
    // 30 s before SIGKILL.
    eprintln!("SIGTERM to exit: {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    for r in 0..3 {
        assert!(term_time(d.path(), r).is_some(), "rank {r} got no SIGTERM");
    }
    for pid in ps {
        assert!(!alive(pid));
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn sigkill_to_toporun_leaves_no_rank_alive() {
    let d = tempfile::tempdir().unwrap();
    let mut child = job("", d.path(), &[])
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ps = rank_pids(d.path(), 3, Duration::from_secs(30));
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    for pid in ps {
        assert!(!alive(pid), "rank pid {pid} survived SIGKILL of toporun");
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn record_traceback_is_the_root_cause() {
    let d = tempfile::tempdir().unwrap();
    let (code, _, err) = run(&mut job("raise", d.path(), &[]));
    assert_eq!(code, 1);
    let root = err
        .split("Root Cause")
        .nth(1)
        .unwrap_or_else(|| panic!("{err}"));
    assert!(root.contains("ValueError: boom from rank 0"), "{root}");
    assert!(root.contains("error.json"), "{root}");
}

/// Three ranks whose rank 0 raises under @record, started by toporun (`ours`) or the
/// installed torchrun, writing what they probe to `out`.
fn raising(ours: bool, out: &Path) -> Command {
    let mut c = if ours {
        toporun()
    } else {
        Command::new(torchrun())
    };
    c.args(["--standalone", "--nproc-per-node=3", "worker.py"])
        .env("MODE", "raise")
        .env("PROBE_OUT", out)
        .env("PYTHON_EXEC", python())
        .current_dir(scripts());
    c
}

/// The launcher's TORCHELASTIC_ERROR_FILE gets the root cause's error.json, as
/// torchrun's @record main writes it (compared with the installed torchrun).
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launcher_error_file_holds_the_root_cause_like_torchrun() {
    let mut docs = Vec::new();
    for ours in [true, false] {
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("launcher-error.json");
        let mut c = raising(ours, d.path());
        let (code, _, err) = run(c.env("TORCHELASTIC_ERROR_FILE", &dest));
        assert_eq!(code, 1, "{err}");
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&dest).unwrap_or_else(|e| panic!("{e}: {err}")),
        )
        .unwrap();
        docs.push(v);
    }
    for key in ["message", "errorCode"] {
        assert_eq!(
            docs[0]["message"][key], docs[1]["message"][key],
            "{key}: toporun {} vs torchrun {}",
            docs[0], docs[1]
        );
    }
    assert!(docs[0]["message"]["message"]
        .as_str()
        .unwrap()
        .contains("ValueError: boom from rank 0"));
}

/// The error files the failure summary names are still there after the job, with
/// the rank's traceback, as torchrun leaves its run directory (toporun removed it at
/// exit once, and the summary named files that were gone).
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn the_error_files_the_summary_names_outlive_the_job_like_torchruns() {
    for ours in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = raising(ours, tmp.path());
        let (code, _, err) = run(c.env("TMPDIR", tmp.path()));
        assert_eq!(code, 1, "{err}");
        let named: Vec<&str> = err
            .lines()
            .filter_map(|l| l.trim().strip_prefix("error_file: "))
            .filter(|f| f.starts_with('/'))
            .collect();
        assert!(!named.is_empty(), "ours={ours}: no error file named: {err}");
        for f in named {
            let text = std::fs::read_to_string(f)
                .unwrap_or_else(|e| panic!("ours={ours}: {f} named but {e}: {err}"));
            assert!(text.contains("boom from rank"), "{f}: {text}");
        }
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn grandchildren_of_a_failed_rank_are_killed() {
    let d = tempfile::tempdir().unwrap();
    let mut child = job("grandchild", d.path(), &["--shutdown-timeout=1"])
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    rank_pids(d.path(), 3, Duration::from_secs(30));
    let start = Instant::now();
    let gc = loop {
        if let Some(p) = std::fs::read_to_string(d.path().join("grandchild"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            break p;
        }
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    };
    sigterm(&child);
    wait_exit(&mut child, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!alive(gc), "grandchild {gc} survived");
}

#[test]
fn tee_prefixes_whole_lines_and_writes_log_files() {
    let d = tempfile::tempdir().unwrap();
    let logs = d.path().join("logs");
    let (code, out, err) = run(toporun().args([
        "--standalone",
        "--nproc-per-node=2",
        "--tee=3",
        "--log-dir",
        logs.to_str().unwrap(),
        "--no-python",
        "sh",
        "-c",
        "for i in 1 2 3; do echo line$i-$LOCAL_RANK; done; echo oops >&2",
    ]));
    assert_eq!(code, 0, "{err}");
    for r in 0..2 {
        for i in 1..=3 {
            assert!(
                out.lines()
                    .any(|l| l == format!("[default{r}]:line{i}-{r}")),
                "{out}"
            );
        }
        assert!(err.contains(&format!("[default{r}]:oops")), "{err}");
    }
    let run_dir = std::fs::read_dir(&logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(
        run_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("none_")
            || run_dir.file_name().unwrap().to_string_lossy().len() > 10
    );
    let stdout1 = std::fs::read_to_string(run_dir.join("attempt_0/1/stdout.log")).unwrap();
    assert_eq!(stdout1, "line1-1\nline2-1\nline3-1\n");
    let (code, out, _) = run(toporun().args([
        "--standalone",
        "--nproc-per-node=2",
        "--local-ranks-filter=1",
        "--tee=1",
        "--no-python",
        "sh",
        "-c",
        "echo hi-$LOCAL_RANK",
    ]));
    assert_eq!(code, 0);
    assert!(
        out.contains("[default1]:hi-1") && !out.contains("hi-0"),
        "{out}"
    );
}

#[test]
fn prefix_template_is_honoured() {
    let (code, out, _) = run(toporun()
        .args([
            "--standalone",
            "--nproc-per-node=2",
            "--role=trainer",
            "--tee=1",
            "--no-python",
            "sh",
            "-c",
            "echo hello",
        ])
        .env(
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
            "<${role_name}:${rank}/${local_rank}> ",
        ));
    assert_eq!(code, 0);
    assert!(
        out.lines().any(|l| l == "<trainer:0/0> hello")
            && out.lines().any(|l| l == "<trainer:1/1> hello"),
        "{out}"
    );
}

#[test]
fn a_chatty_rank_is_not_slowed_by_a_console_nobody_reads() {
    // toporun's stdout is a pipe nobody reads until the rank has finished: a burst of
    // 8 MB fits the console queue's 16 MiB budget and must not wait for the console
    // (larger ones wait: console_backpressure_e2e).
    let d = tempfile::tempdir().unwrap();
    let done = d.path().join("done");
    let script = format!(
        "head -c 8000000 /dev/zero | tr '\\0' 'x' | fold -w 100; touch {}",
        done.display()
    );
    let mut child = toporun()
        .args([
            "--standalone",
            "--nproc-per-node=1",
            "--tee=3",
            "--no-python",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !done.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the rank was blocked by the unread console"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 80_000);
    assert!(
        lines
            .iter()
            .all(|l| l.len() == 100 + "[default0]:".len() && l.starts_with("[default0]:xxxx")),
        "a line was split or interleaved"
    );
}

#[test]
fn numa_binding_pins_each_rank_to_its_gpus_cpus() {
    let text = std::fs::read_to_string(host("h200x4")).unwrap();
    let mut facts: serde_json::Value = serde_json::from_str(&text).unwrap();
    let online = std::thread::available_parallelism().unwrap().get();
    for (i, d) in facts["gpus"]["devices"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        d["cpu_affinity"] = serde_json::json!([i % online]);
    }
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("facts.json");
    std::fs::write(&f, facts.to_string()).unwrap();
    let (code, out, err) = run(toporun().args([
        "--facts",
        f.to_str().unwrap(),
        "--standalone",
        "--nproc-per-node=2",
        "--numa-binding=node",
        "--tee=1",
        "--no-python",
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status",
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("[default0]:Cpus_allowed_list:\t0"), "{out}");
    if online > 1 {
        assert!(out.contains("[default1]:Cpus_allowed_list:\t1"), "{out}");
    }
}

#[test]
fn a_missing_interpreter_says_how_to_fix_it() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("t.py"), "print('t')\n").unwrap();
    let (code, _, err) = run(toporun()
        .args(["--standalone", "--nproc-per-node=1", "t.py"])
        .env("PYTHON_EXEC", "/nonexistent/python")
        .current_dir(d.path()));
    assert_eq!(code, 1);
    assert!(
        err.contains("could not start local rank 0 (/nonexistent/python)")
            && err.contains("PYTHON_EXEC"),
        "{err}"
    );
}

/// TORCHELASTIC_ENABLE_FILE_TIMER=1 with torch's own FileTimerClient in the ranks:
/// the overrunning rank is SIGKILLed, the others stopped, exit 137 as torchrun.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn file_timer_kills_a_hung_rank_like_torchrun() {
    for ours in [true, false] {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("watchdog");
        let mut c = if ours {
            toporun()
        } else {
            Command::new(torchrun())
        };
        c.args(["--standalone", "--nproc-per-node=2", "file_timer.py"])
            .env("PYTHON_EXEC", python())
            .env("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
            .env("TORCHELASTIC_TIMER_FILE", &fifo)
            // torchrun kills itself and leaves the other rank running: bound it.
            .env("OTHERS_SLEEP", if ours { "60" } else { "5" })
            .current_dir(scripts());
        let start = Instant::now();
        let o = c.output().unwrap();
        let took = start.elapsed();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        use std::os::unix::process::ExitStatusExt;
        // torchrun is SIGKILLed by its own timer server (a shell shows 137); toporun
        // exits 137 itself (PID 1 in a container cannot be SIGKILLed from inside).
        let code = o
            .status
            .code()
            .unwrap_or_else(|| 128 + o.status.signal().unwrap_or(0));
        assert_eq!(code, 137, "ours={ours}\n{out}\n{err}");
        assert!(took < Duration::from_secs(30), "ours={ours}: {took:?}");
        assert!(
            out.contains(&format!("timer file {}", fifo.display())),
            "{out}"
        );
        if ours {
            assert!(
                err.contains("file timer: scope 'stuck_step' of rank 1"),
                "{err}"
            );
            assert!(!fifo.exists(), "the FIFO is removed");
        }
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn file_timer_garbage_is_reported_not_fatal() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("watchdog");
    let script = d.path().join("garbage.py");
    std::fs::write(&script, "import os\nfd = os.open(os.environ['TORCHELASTIC_TIMER_FILE'], os.O_WRONLY | os.O_NONBLOCK)\nos.write(fd, b'{not json}\\n')\nos.close(fd)\nimport time; time.sleep(0.5)\nprint('survived', flush=True)\n").unwrap();
    let (code, out, err) = run(toporun()
        .args(["--standalone", "--nproc-per-node=1"])
        .arg(&script)
        .env("PYTHON_EXEC", python())
        .env("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
        .env("TORCHELASTIC_TIMER_FILE", &fifo));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("survived") && err.contains("file timer: ignoring a malformed request"),
        "{out}{err}"
    );
}

/// The end of a job adds no abort: static tcp:// and env:// jobs of 4 gloo ranks that
/// destroy their process group, 20 runs each, exit 0 every time. (Without
/// destroy_process_group ranks abort at exit under torchrun as well: measured here
/// 5 of 20 under torchrun, 3 of 20 under toporun; pytorch/pytorch#190489.)
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn twenty_static_jobs_each_way_end_without_an_abort() {
    for mode in ["tcp", "env"] {
        for i in 0..20u16 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let (code, out, err) = run(toporun()
                .args(["--nnodes=1", "--node-rank=0", "--master-addr=127.0.0.1"])
                .arg(format!("--master-port={port}"))
                .args([
                    "--nproc-per-node=4",
                    "--nccl-report=off",
                    "exit_clean.py",
                    mode,
                ])
                .env("PYTHON_EXEC", python())
                .env("DESTROY", "1")
                .current_dir(scripts()));
            assert_eq!(code, 0, "{mode} run {i}:\n{out}\n{err}");
            assert!(!err.contains("terminate called"), "{mode} run {i}: {err}");
        }
    }
}
