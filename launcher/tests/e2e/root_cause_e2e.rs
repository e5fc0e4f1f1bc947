//! The cause of a failure named first, from real evidence: the kernel OOM killer in a
//! real memory cgroup made here (v1, this machine; needs root), a SIGKILL from
//! outside, a full /dev/shm in a mount namespace of its own (`unshare -m`), the
//! rank's own exception without `@record`, GPU faults fed as Xid events
//! (`TOPORUN_XID_REPLAY`); a peer's own failure, on the node that lost it; and the
//! codes of `--exit-codes`.

use crate::support;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

fn job(mode: &str, out: &Path, extra: &[&str]) -> Command {
    let mut c = toporun();
    c.args(["--standalone", "--nproc-per-node=2", "--nccl-report=off"])
        .args(extra)
        .arg("cause_rank.py");
    c.env("MODE", mode)
        .env("OUT", out)
        .env("PYTHON_EXEC", python())
        .current_dir(scripts());
    c
}

/// A v1 memory cgroup of its own with `limit` bytes (swap included), removed on drop.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    fn new(limit: u64) -> MemoryCgroup {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/memory/toporun-test-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a v1 memory cgroup (root, /sys/fs/cgroup/memory)");
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
        let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
        MemoryCgroup(dir)
    }

    /// `cmd` started inside the cgroup.
    fn wrap(&self, cmd: &Command) -> Command {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$@\"",
                self.0.display()
            ))
            .arg("sh")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .current_dir(scripts());
        sh
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once its processes are gone.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn the_oom_killer_is_named_with_the_limit_and_classified_as_memory() {
    let d = tempfile::tempdir().unwrap();
    let cg = MemoryCgroup::new(200 << 20);
    let inner = job("oom", d.path(), &["--exit-codes=classified"]);
    let (code, _, err) = run(&mut cg.wrap(&inner));
    assert!(
        err.contains("toporun: root cause (oom): rank 1 was killed by the kernel OOM killer"),
        "{err}"
    );
    assert!(err.contains("limit 200 MiB"), "{err}");
    assert!(
        err.contains("toporun: exit code 81 under --exit-codes classified: killed for memory"),
        "{err}"
    );
    assert_eq!(code, 81, "{err}");
    // torchrun's codes by default: 1 for any rank failure.
    let (code, _, err) = run(&mut cg.wrap(&job("oom", d.path(), &[])));
    assert_eq!(code, 1, "{err}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_sigkill_from_outside_is_said_to_come_from_outside() {
    let d = tempfile::tempdir().unwrap();
    let cg = MemoryCgroup::new(1 << 30);
    let child = cg
        .wrap(&job("sleep", d.path(), &["--exit-codes=classified"]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid_file = d.path().join("pid1");
    let start = Instant::now();
    while !pid_file.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rank 1 never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("root cause (external): rank 1 was killed by SIGKILL from outside the job (not the OOM killer"),
        "{err}"
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn the_ranks_own_exception_leads_without_record() {
    let d = tempfile::tempdir().unwrap();
    let msg = d.path().join("termination-log");
    let (code, _, err) =
        run(job("raise", d.path(), &["--exit-codes=classified"])
            .env("TOPORUN_TERMINATION_LOG", &msg));
    assert_eq!(code, 1, "{err}");
    let line = "ValueError: bad batch shape (3, 224) at step 17 (cause_rank.py:";
    assert!(
        err.contains(&format!("toporun: root cause (code): rank 1 raised {line}")),
        "{err}"
    );
    // In torchrun's block, where it said only "To enable traceback see".
    assert!(err.contains(&format!("traceback : {line}")), "{err}");
    let msg = std::fs::read_to_string(msg).unwrap();
    assert!(
        msg.starts_with("toporun: root cause (code): rank 1 raised"),
        "{msg}"
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_full_dev_shm_is_named_with_its_size() {
    let d = tempfile::tempdir().unwrap();
    let inner = job("shm", d.path(), &["--exit-codes=classified"]);
    let mut c = Command::new("unshare");
    c.args([
        "-m",
        "sh",
        "-c",
        "mount -t tmpfs -o size=8m tmpfs /dev/shm && exec \"$@\"",
        "sh",
    ])
    .arg(inner.get_program())
    .args(inner.get_args())
    .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
    .current_dir(scripts());
    let (code, _, err) = run(&mut c);
    assert!(
        err.contains("toporun: root cause (shm): rank 0: /dev/shm ran out (/dev/shm is 8 MiB"),
        "{err}"
    );
    assert!(err.contains("medium: Memory"), "{err}");
    assert_eq!(code, 81, "{err}");
}

/// A replay file holding one Xid event on GPU 0, dated now.
fn xid_file(dir: &Path, xid: u64) -> PathBuf {
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let path = dir.join("xids.jsonl");
    let line = serde_json::json!({"gpu": 0, "uuid": "GPU-9c1e", "pci_bus_id": "00000000:18:00.0", "xid": xid, "at": at});
    std::fs::write(&path, format!("{line}\n")).unwrap();
    path
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_gpu_that_fell_off_the_bus_leads_with_no_restart_and_the_hardware_code() {
    let d = tempfile::tempdir().unwrap();
    let xids = xid_file(d.path(), 79);
    let (code, _, err) = run(job(
        "abort",
        d.path(),
        &["--exit-codes=classified", "--max-restarts=3"],
    )
    .env("TOPORUN_XID_REPLAY", &xids));
    assert!(err.contains("GPU 0 (GPU-9c1e, PCI 00000000:18:00.0) reported Xid 79 (GPU has fallen off the bus): a GPU or node fault"), "{err}");
    assert!(
        err.contains("toporun: root cause (hardware): a GPU of this node, GPU 0 (GPU-9c1e, PCI 00000000:18:00.0), reported Xid 79"),
        "{err}"
    );
    assert!(err.contains("drain the node"), "{err}");
    // Restarts were left, yet none was tried.
    assert!(!err.contains("restart 1 of 3"), "{err}");
    assert_eq!(code, 80, "{err}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_code_fault_xid_with_a_traceback_stays_the_codes() {
    let d = tempfile::tempdir().unwrap();
    let xids = xid_file(d.path(), 13);
    let (code, _, err) =
        run(job("cudafault", d.path(), &["--exit-codes=classified"])
            .env("TOPORUN_XID_REPLAY", &xids));
    assert!(
        err.contains("toporun: root cause (code): rank 1 raised RuntimeError: CUDA error: an illegal memory access was encountered (cause_rank.py:"),
        "{err}"
    );
    assert!(
        err.contains("reported Xid 13 (graphics engine exception"),
        "{err}"
    );
    assert!(!err.contains("root cause (hardware)"), "{err}");
    assert_eq!(code, 1, "{err}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_peers_own_failure_is_the_cause_on_the_node_whose_rank_lost_it() {
    let port = free_port().to_string();
    let node = |rank: &str| {
        let mut c = toporun();
        c.args([
            "--nnodes=2",
            "--nproc-per-node=1",
            "--master-addr=127.0.0.1",
        ])
        .args(["--master-port", &port, "--node-rank", rank])
        .args(["--nccl-report=off", "--exit-codes=classified"])
        .arg("--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=2")
        .arg("peer_fails.py")
        .env("PYTHON_EXEC", python())
        .current_dir(scripts())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
        c.spawn().unwrap()
    };
    let (n0, n1) = (node("0"), node("1"));
    let (o0, o1) = (
        n0.wait_with_output().unwrap(),
        n1.wait_with_output().unwrap(),
    );
    let (e0, e1) = (
        String::from_utf8_lossy(&o0.stderr),
        String::from_utf8_lossy(&o1.stderr),
    );
    let why = "rank 1 raised ValueError: bad batch at step 5 (peer_fails.py:14)";
    assert!(e1.contains(&format!("root cause (code): {why}")), "{e1}");
    // Node 0's rank lost its peer first; the held verdict became node 1's stop,
    // the exception included, and not a failure of node 0's own.
    assert!(e0.contains("a rank lost a peer at 127.0.0.1:"), "{e0}");
    let theirs =
        format!("root cause (code): node 1 local rank 0 (rank 1) failed with exit code 1: {why}");
    assert!(e0.contains(&theirs), "{e0}");
    assert!(e0.contains("the rank's failure is its consequence"), "{e0}");
    assert!(!e0.contains("the rank's failure counts"), "{e0}");
    assert!(!e0.contains("root cause (code): rank 0"), "{e0}");
    assert_eq!((o0.status.code(), o1.status.code()), (Some(1), Some(1)));
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_console_that_goes_away_loses_lines_not_the_failure_report() {
    use std::io::BufRead;
    let d = tempfile::tempdir().unwrap();
    let msg = d.path().join("termination-log");
    let mut c = job("raise", d.path(), &["--exit-codes=classified"]);
    c.env("TOPORUN_TERMINATION_LOG", &msg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    // `toporun ... 2>&1 | head -1`: one line read, then the reader is gone.
    let mut first = String::new();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    err.read_line(&mut first).unwrap();
    drop(err);
    let status = child.wait().unwrap();
    assert!(first.starts_with("toporun: "), "{first}");
    // Not a panic (101): the report is still written where it is read.
    assert_eq!(status.code(), Some(1), "{status:?}");
    let msg = std::fs::read_to_string(&msg).unwrap();
    assert!(
        msg.starts_with("toporun: root cause (code): rank 1 raised"),
        "{msg}"
    );
}

/// Both ranks raise at import, at once: each is reported with its own exit code and
/// exception, never as stopped by toporun's SIGTERM (the race must not come back).
/// Rank 1's interpreter takes 300 ms to tear down after its traceback, as one that
/// had imported more (a half-imported torch, logging handlers) does.
#[test]
fn ranks_that_fail_at_once_are_each_reported_with_their_own_exit() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("bad.py"),
        "import atexit, os, time\nif os.environ['LOCAL_RANK'] == '1':\n    atexit.register(time.sleep, 0.3)\nimport no_such_module_for_toporun\n",
    )
    .unwrap();
    for run in 0..50 {
        let (code, _, err) = support::run(
            toporun()
                .args(["--standalone", "--nproc-per-node=2", "--nccl-report=off"])
                .arg("bad.py")
                .env("PYTHON_EXEC", "python3")
                .current_dir(d.path()),
        );
        assert_eq!(code, 1, "run {run}: {err}");
        for rank in 0..2 {
            let block = err
                .split(&format!("  rank      : {rank} (local_rank: {rank})\n"))
                .nth(1)
                .unwrap_or_else(|| panic!("run {run}: rank {rank} not in the summary:\n{err}"));
            let block = block.split("-----").next().unwrap();
            assert!(
                block.contains("exitcode  : 1 (pid")
                    && block.contains("ModuleNotFoundError: No module named"),
                "run {run}: rank {rank} not reported with its own exit:\n{err}"
            );
        }
    }
}
