//! Hangs found and explained (real PyTorch, gloo, 4 ranks): the rank holding the others
//! up is named with its function and line; a compute loop and a printing rank are not
//! hangs; `--on-hang stop` ends the job with 124 and leaves no process; a failing
//! rank's summary carries where the others stood.

use crate::support;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

fn job(mode: &str, out: &Path, extra: &[&str]) -> Command {
    job_of(4, mode, out, extra)
}

/// `job` on `nproc` ranks.
fn job_of(nproc: u32, mode: &str, out: &Path, extra: &[&str]) -> Command {
    let mut c = toporun();
    c.args([
        "--standalone",
        &format!("--nproc-per-node={nproc}"),
        "--nccl-report=off",
    ])
    .args(extra)
    .arg("hang_rank.py");
    c.env("MODE", mode)
        .env("OUT", out)
        .env("PYTHON_EXEC", python())
        .current_dir(scripts());
    c
}

/// Where rank 3 waits: the line of `time.sleep(3600)` in the script.
fn wait_line() -> String {
    let script = std::fs::read_to_string(scripts().join("hang_rank.py")).unwrap();
    let n = script
        .lines()
        .position(|l| l.trim() == "time.sleep(3600)")
        .unwrap()
        + 1;
    format!("rank 3: wait_for_data (scripts/hang_rank.py:{n})")
}

/// Stops a job left running when a test fails half-way.
struct Job(std::process::Child);

impl Drop for Job {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_hung_rank_is_named_and_on_hang_stop_ends_the_job() {
    let d = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let msg = d.path().join("termination-log");
    let (code, _, err) = run(
        job("hang", d.path(), &["--hang-timeout=10", "--on-hang=stop"])
            .env("WATCH_DUMP_KEY", "1")
            .env("TOPORUN_TERMINATION_LOG", &msg),
    );
    let took = start.elapsed();
    assert_eq!(code, 124, "{err}");
    // Before stopping, toporun asked stock ProcessGroupNCCL's ranks to dump, naming
    // the odd rank, where their monitor looks.
    let key = std::fs::read_to_string(d.path().join("exception_dump"));
    assert_eq!(key.ok().as_deref(), Some("3"), "{err}");
    // It waited for the one rank with that monitor, and read its dump.
    assert!(
        err.contains("1 of 1 flight-recorder dumps here after"),
        "{err}"
    );
    assert!(err.contains("flight recorder: dumps of rank(s) 0"), "{err}");
    // The finding leads the termination message, the stacks follow.
    let msg = std::fs::read_to_string(msg).unwrap();
    assert!(
        msg.starts_with("toporun: hang: rank 3 is not where the other 3 wait in all_reduce"),
        "{msg}"
    );
    assert!(msg.contains(&wait_line()), "{msg}");
    assert!(err.contains(&wait_line()), "{err}");
    assert!(err.contains("ranks 0-2: all_reduce"), "{err}");
    assert!(
        err.contains("rank 3 is not where the other 3 wait in all_reduce"),
        "{err}"
    );
    // Startup (4 torch imports on 2 cores: 51.5 s in all once on a loaded CI
    // machine), then 10 s and a few samples.
    assert!(took < Duration::from_secs(75), "{took:?}");
    std::thread::sleep(Duration::from_millis(500));
    for r in 0..4 {
        let pid = std::fs::read_to_string(d.path().join(format!("pid{r}"))).unwrap();
        assert!(!alive(&pid), "rank {r} (pid {pid}) left running");
    }
}

/// Two ranks, rank 1 stopped with SIGSTOP: no majority is needed, its process state
/// names it; `--on-hang stop` still ends the job (a stopped process takes SIGKILL).
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_stopped_rank_is_named_by_its_process_state() {
    let d = tempfile::tempdir().unwrap();
    let extra = ["--hang-timeout=10", "--on-hang=stop"];
    let (code, _, err) = run(&mut job_of(2, "stopped", d.path(), &extra));
    assert_eq!(code, 124, "{err}");
    assert!(
        err.contains("toporun: hang: rank 1 is stopped (process state T: SIGSTOP, Ctrl-Z or a debugger holds it)"),
        "{err}"
    );
    std::thread::sleep(Duration::from_millis(500));
    for r in 0..2 {
        let pid = std::fs::read_to_string(d.path().join(format!("pid{r}"))).unwrap();
        assert!(!alive(&pid), "rank {r} (pid {pid}) left running");
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_compute_loop_and_a_printing_rank_are_not_hangs() {
    for (mode, secs) in [("compute", "30"), ("print", "20")] {
        let d = tempfile::tempdir().unwrap();
        let (code, _, err) =
            run(job(mode, d.path(), &["--hang-timeout=10", "--on-hang=stop"]).env("SECS", secs));
        assert_eq!(code, 0, "{mode}: {err}");
        assert!(!err.contains("toporun: hang"), "{mode}: {err}");
    }
}

/// Two ranks on the CPU, no majority: rank 1 sleeps in its own code while rank 0 idles
/// in DDP's backward, waiting for rank 1's gradients (on the CPU the backward runs on
/// the rank's own thread: idling there is a wait). Rank 1 is named.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn with_two_ranks_the_one_in_its_own_code_is_named_while_the_other_waits_in_backward() {
    let d = tempfile::tempdir().unwrap();
    let extra = ["--hang-timeout=5", "--on-hang=stop"];
    let (code, _, err) = run(&mut job_of(2, "backward", d.path(), &extra));
    assert_eq!(code, 124, "{err}");
    assert!(
        err.contains("toporun: hang: rank 1 is in no collective"),
        "{err}"
    );
    assert!(err.contains("wait_for_data"), "{err}");
}

/// A hang stopped under --on-hang stop while every rank ignores SIGTERM (as ranks
/// blocked in NCCL, or a handler waiting on the same peers, do): SIGKILL follows 5 s
/// after SIGTERM, not at --shutdown-timeout (60 s here).
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_hang_stop_kills_what_sigterm_cannot_end_within_5s() {
    let d = tempfile::tempdir().unwrap();
    let extra = [
        "--hang-timeout=3",
        "--on-hang=stop",
        "--shutdown-timeout=60",
    ];
    let t0 = std::time::Instant::now();
    let (code, _, err) = run(&mut job("deaf", d.path(), &extra));
    let took = t0.elapsed();
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("wait_for_data"), "{err}");
    assert!(
        err.contains("did not stop by the shutdown deadline after SIGTERM"),
        "{err}"
    );
    // Before the 5 s kill the ranks got the whole --shutdown-timeout (60 s here);
    // start-up of 4 torch ranks on a loaded 2-core machine takes up to about 20 s.
    assert!(took < std::time::Duration::from_secs(45), "{took:?}: {err}");
    let said = err
        .matches("toporun: hang: no rank has made progress")
        .count();
    assert_eq!(said, 1, "said once: {err}");
}

/// Rank 2 killed while the others cannot take SIGTERM (as ranks blocked in NCCL): while
/// toporun waits out --shutdown-timeout for them, no hang is said of the survivors
/// (Lightning on 2x H200 was reported hung 20 s after its rank 1 was killed).
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn no_hang_is_said_while_the_ranks_a_failure_left_are_stopped() {
    let d = tempfile::tempdir().unwrap();
    let extra = ["--hang-timeout=3", "--shutdown-timeout=10"];
    let (code, _, err) = run(&mut job("killed", d.path(), &extra));
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("rank 2 was killed by SIGKILL"), "{err}");
    assert!(
        err.contains("did not stop by the shutdown deadline"),
        "{err}"
    );
    assert!(!err.contains("toporun: hang"), "{err}");
    // Said at once, not 10 s later with the cause: the job is seen stopping.
    assert!(
        err.contains(
            "was killed by SIGKILL: stopping the other 3 rank(s) (SIGTERM, SIGKILL after 10s)"
        ),
        "{err}"
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_failing_ranks_summary_says_where_the_others_stood() {
    let d = tempfile::tempdir().unwrap();
    // Rank 2 fails 6 s after the others enter the all_reduce: stacks are sampled
    // every few seconds, and on a loaded CI machine 2 s once held no sample.
    let (code, _, err) = run(job("fail", d.path(), &[]).env("FAIL_AFTER", "6"));
    assert_eq!(code, 1, "{err}");
    // Gloo peers die within milliseconds of rank 2: their last samples from before
    // the failure are shown, with the oldest one's age.
    assert!(
        err.contains("where the other ranks stood when it failed (last sampled at most ")
            && err.contains("s before it failed):\n  ranks 0-1,3: all_reduce"),
        "{err}"
    );
}

/// One node of a static 2-node job of 2 ranks each on loopback.
fn node_of_two(rank: u32, port: u16, out: &Path, logs: &Path, mode: &str, extra: &[&str]) -> Job {
    let mut c = toporun();
    c.args([
        "--nnodes=2",
        &format!("--node-rank={rank}"),
        "--master-addr=127.0.0.1",
        &format!("--master-port={port}"),
        "--nproc-per-node=2",
        "--nccl-report=off",
        "--log-dir",
        logs.to_str().unwrap(),
    ])
    .args(extra)
    .arg("hang_rank.py")
    .env("MODE", mode)
    .env("OUT", out)
    .env("PYTHON_EXEC", python())
    .current_dir(scripts())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    Job(c.spawn().unwrap())
}

fn finished(mut j: Job) -> (i32, String) {
    let child = std::mem::replace(&mut j.0, Command::new("true").spawn().unwrap());
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_rank_stuck_on_another_node_is_named_with_its_node_and_local_rank() {
    let (d, logs0, logs1) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let port = free_port();
    // 124 in both exit-code modes.
    let stop = [
        "--hang-timeout=10",
        "--on-hang=stop",
        "--exit-codes=classified",
    ];
    let host = node_of_two(0, port, d.path(), logs0.path(), "hang", &stop);
    let other = node_of_two(1, port, d.path(), logs1.path(), "hang", &stop);
    let ((code0, err0), (code1, err1)) = (finished(host), finished(other));
    // Global rank 3 is node 1's local rank 1.
    let placed = "rank 3 (node 1 on ";
    assert!(
        err0.contains(placed) && err0.contains(", local rank 1): wait_for_data"),
        "{err0}"
    );
    assert!(
        err0.contains("is not where the other 3 wait in all_reduce"),
        "{err0}"
    );
    assert!(
        err1.contains("found no rank of any node making progress"),
        "{err1}"
    );
    assert!(err1.contains(placed), "{err1}");
    assert_eq!((code0, code1), (124, 124), "{err0}\n---\n{err1}");
    // The finding, as JSON in the deciding node's run directory.
    let json = files_under(logs0.path())
        .into_iter()
        .find(|p| p.ends_with("hang.json"))
        .expect("hang.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert_eq!(v["odd"], serde_json::json!([3]), "{v}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn the_node_hosting_the_store_matches_every_nodes_flight_recorder_dumps() {
    let (d, logs0, logs1) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let port = free_port();
    let host = node_of_two(0, port, d.path(), logs0.path(), "frdump", &[]);
    let other = node_of_two(1, port, d.path(), logs1.path(), "frdump", &[]);
    let ((code0, err0), (code1, err1)) = (finished(host), finished(other));
    assert_eq!((code0, code1), (1, 1), "{err0}\n---\n{err1}");
    // Rank 3 runs on node 1; node 0 names it from node 1's dumps.
    assert!(
        err0.contains("flight recorder: dumps of rank(s) 0,1,2,3"),
        "{err0}"
    );
    assert!(
        err0.contains("entered by rank(s) 0,1,2 (scheduled, not completed); never entered by:\n    rank 3: last entered #3"),
        "{err0}"
    );
    // Node 1, where the rank failed, leads its summary with what it could see. Its
    // rank 3 failed first: its other rank losing a peer is no verdict to hold (both
    // nodes held, each waiting for the other, for the keep-alive timeout).
    assert!(
        err1.contains("toporun: flight recorder: rank(s) 3 never entered"),
        "{err1}"
    );
    assert!(!err1.contains("holding the verdict"), "{err1}");
    // Node 0 names rank 3's own error, which node 1's stop carries.
    assert!(
        err0.contains("rank 3 raised RuntimeError: rank 3 skipped the all_reduce"),
        "{err0}"
    );
}

#[test]
fn a_zero_hang_timeout_is_a_usage_error() {
    let (code, _, err) = run(toporun().args(["--hang-timeout=0", "--no-python", "true"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--hang-timeout=0"), "{err}");
    // A misspelt `off` says what is accepted; `off` itself runs with no hang watch.
    let (code, _, err) = run(toporun().args(["--hang-timeout=of", "--no-python", "true"]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "--hang-timeout=of: expected a positive number of seconds (at most 30 days), or off"
        ),
        "{err}"
    );
    // Set by its variable, the variable is named.
    let (code, _, err) = run(toporun()
        .args(["--no-python", "true"])
        .env("TOPORUN_HANG_TIMEOUT", "0"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("TOPORUN_HANG_TIMEOUT=0: expected"), "{err}");
    let (code, _, err) =
        run(toporun().args(["--standalone", "--hang-timeout=off", "--no-python", "true"]));
    assert_eq!(code, 0, "{err}");
}

/// Waits for the run directory holding the stacks socket and every rank's pid file, and
/// for the ranks to stand where the hang script puts them (as `toporun stacks` shows).
fn running_job(log_dir: &Path, out: &Path) -> std::path::PathBuf {
    let start = Instant::now();
    loop {
        let sock = std::fs::read_dir(log_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.join("stacks.sock").exists());
        let pids = (0..4).all(|r| out.join(format!("pid{r}")).exists());
        if let (Some(dir), true) = (sock, pids) {
            // The ranks reach their all_reduce (and rank 3 its wait) right after: a
            // second or two, more when CI shares the cores (2 s was once too short).
            let (_, now, _) = run(toporun().args(["stacks", dir.to_str().unwrap()]));
            if now.contains(&wait_line()) && now.contains("ranks 0-2: all_reduce") {
                return dir;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the job did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `toporun stacks` as `cmd` runs it, again while a rank's stack was not read within
/// its 2 s budget ("not read": two CI runs sharing the 2 cores spent it).
fn stacks_read(cmd: impl Fn() -> Command) -> String {
    let mut out = String::new();
    for _ in 0..5 {
        let (code, text, err) = run(&mut cmd());
        assert_eq!(code, 0, "{err}");
        out = text;
        if !out.contains("not read:") {
            break;
        }
    }
    out
}

fn expect_stacks(text: &str) {
    assert!(text.contains("4 rank(s) on this node"), "{text}");
    assert!(text.contains(&wait_line()), "{text}");
    assert!(text.contains("ranks 0-2: all_reduce"), "{text}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn toporun_stacks_and_the_endpoint_answer_while_the_job_runs() {
    let (d, logs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Its own TMPDIR: the job registers there, and a bare `toporun stacks` looks there.
    let tmp = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = job(
        "hang",
        d.path(),
        &[
            "--log-dir",
            logs.path().to_str().unwrap(),
            "--status-port",
            &port.to_string(),
        ],
    )
    .env("TMPDIR", tmp.path())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let mut child = Job(child);
    let dir = running_job(logs.path(), d.path());
    expect_stacks(&stacks_read(|| {
        let mut c = toporun();
        c.args(["stacks", dir.to_str().unwrap()]);
        c
    }));
    // Without an argument: the job running here.
    expect_stacks(&stacks_read(|| {
        let mut c = toporun();
        c.arg("stacks").env("TMPDIR", tmp.path());
        c
    }));
    let (_, json, _) = run(toporun().args(["stacks", dir.to_str().unwrap(), "--format", "json"]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["ranks"].as_array().unwrap().len(), 4, "{v}");
    let http = http().build().unwrap();
    let url = format!("http://127.0.0.1:{port}/stacks");
    let mut text = String::new();
    for _ in 0..5 {
        text = http.get(&url).send().unwrap().text().unwrap();
        if !text.contains("not read:") {
            break;
        }
    }
    expect_stacks(&text);
    sigterm(&child.0);
    child.0.wait().unwrap();
    let (code, _, err) = run(toporun().args(["stacks", dir.to_str().unwrap()]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot reach the job"), "{err}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn toporun_stacks_works_when_toporun_is_pid_1() {
    let (d, logs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let inner = job(
        "hang",
        d.path(),
        &["--log-dir", logs.path().to_str().unwrap()],
    );
    let mut c = Command::new("unshare");
    c.args([
        "-p",
        "-f",
        "--mount-proc",
        "--kill-child",
        inner.get_program().to_str().unwrap(),
    ])
    .args(inner.get_args())
    .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
    .current_dir(scripts())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    let mut child = Job(c.spawn().expect("unshare (util-linux; needs root)"));
    let dir = running_job(logs.path(), d.path());
    expect_stacks(&stacks_read(|| {
        let mut c = toporun();
        c.args(["stacks", dir.to_str().unwrap()]);
        c
    }));
    // unshare ignores SIGTERM while it waits: toporun (its child) gets it.
    let pid = child.0.id();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let toporun_pid: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(toporun_pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.0.wait().unwrap();
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn flight_recorder_dumps_name_the_rank_that_never_entered_even_with_an_unwritable_home() {
    let (d, logs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (code, _, err) = run(job(
        "frdump",
        d.path(),
        &["--log-dir", logs.path().to_str().unwrap()],
    )
    .env("HOME", "/proc")
    .env_remove("XDG_CACHE_HOME"));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("XDG_CACHE_HOME="), "{err}");
    let named = "collective #4 gloo:all_reduce entered by rank(s) 0,1,2 (scheduled, not completed); never entered by:\n    rank 3: last entered #3 gloo:all_reduce";
    assert!(
        err.contains("flight recorder: dumps of rank(s) 0,1,2,3"),
        "{err}"
    );
    assert!(err.contains(named), "{err}");
    // The finding heads the failure summary.
    assert!(
        err.contains(
            "toporun: flight recorder: rank(s) 3 never entered gloo:all_reduce #4 on group 0"
        ),
        "{err}"
    );
    // The same dumps, offline.
    let run_dir = std::fs::read_dir(logs.path())
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    // The finding, as JSON in the attempt directory.
    let json = std::fs::read_to_string(run_dir.join("attempt_0/flight-recorder.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        v["headline"]
            .as_str()
            .unwrap()
            .starts_with("rank(s) 3 never entered"),
        "{v}"
    );
    let fr = run_dir.join("attempt_0/fr");
    let (code, out, err) = run(toporun().args(["fr-trace", fr.to_str().unwrap()]));
    assert_eq!(code, 1, "{err}");
    assert!(out.contains(named), "{out}");
}

/// The 2-rank case the 2x H100 run gave as "every rank stands at the same place":
/// rank 1 blocks in its own read while rank 0 waits for it (here in gloo's all_reduce,
/// on the GPU at `.item()`); the rank script is the one `scripts/device/gpu_nccl_failures.sh`
/// runs there, on CPU ranks (DEVICE=cpu).
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn with_two_ranks_the_rank_in_its_own_read_is_named() {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/device/gpu_nccl_failure_rank.py");
    let start = Instant::now();
    let (code, _, err) = run(toporun()
        .args(["--standalone", "--nproc-per-node=2", "--nccl-report=off"])
        .args([
            "--hang-timeout=5",
            "--on-hang=stop",
            "--exit-codes=classified",
        ])
        .arg(&script)
        .env("CASE", "stuck")
        .env("DEVICE", "cpu")
        .env("PYTHON_EXEC", python()));
    assert_eq!(code, 124, "{err}");
    assert!(
        err.contains("toporun: hang: rank 1 is in no collective: rank 1 is blocked outside PyTorch (I/O, a lock or a sleep) in read_next_shard (gpu_nccl_failure_rank.py:"),
        "{err}"
    );
    assert!(
        err.contains("while rank 0 waits in all_reduce in main (gpu_nccl_failure_rank.py:"),
        "{err}"
    );
    assert!(!err.contains("same place"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
}

/// A hang already said is not said again as a straggler: the stuck rank waits least
/// (the others wait in all_reduce), which the straggler windows, left running, would
/// read as the rank the others wait for (seen on 2x H100, watchdog case:
/// tests/fixtures/device/spawn-check-h100x2).
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_standing_hang_is_not_also_a_straggler() {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/device/gpu_nccl_failure_rank.py");
    let child = toporun()
        .args(["--standalone", "--nproc-per-node=2", "--nccl-report=off"])
        .args([
            "--hang-timeout=3",
            "--on-hang=report",
            "--straggler-window=15",
        ])
        .arg(&script)
        .env("CASE", "stuck")
        .env("DEVICE", "cpu")
        .env("PYTHON_EXEC", python())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The hang is said ~3 s after the ranks stand still; the windows fill in 15 s.
    std::thread::sleep(Duration::from_secs(30));
    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let hang_at = err
        .find("toporun: hang:")
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        !err[hang_at..].contains("toporun: straggler:"),
        "a straggler named after the hang was said:\n{err}"
    );
}
