//! A preempted job (SIGTERM to one node's toporun, as a drain or a spot reclaim sends
//! it): one stop for the whole job, the stop file on every node within a second, the
//! ranks' DataLoader workers left serving them, one distributed checkpoint every rank
//! takes part in, and the preempted exit code on every node. Two c10d nodes on
//! loopback, 2 gloo ranks each, a DataLoader with 2 workers per rank.

use crate::support;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

fn node(port: u16, dir: &Path, n: u32, mode: &str, extra: &[&str]) -> Child {
    node_with(port, dir, n, mode, extra, &[])
}

fn node_with(
    port: u16,
    dir: &Path,
    n: u32,
    mode: &str,
    extra: &[&str],
    env: &[(&str, String)],
) -> Child {
    let mut c = toporun();
    c.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    c.args([
        "--nnodes=2",
        "--rdzv-backend=c10d",
        &format!("--rdzv-endpoint=127.0.0.1:{port}"),
        "--nproc-per-node=2",
        "--nccl-report=off",
        "--exit-codes=classified",
    ])
    .args(extra)
    .arg("preempt.py")
    .env("MODE", mode)
    .env("OUT", dir)
    .env("CKPT", dir.join("ckpt"))
    .env("TOPORUN_STOP_FILE", dir.join(format!("stop{n}")))
    .env("PYTHON_EXEC", python())
    .current_dir(scripts())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c.spawn().unwrap()
}

struct Ended {
    code: i32,
    out: String,
    err: String,
}

/// Both nodes' ends.
fn ended(nodes: [Child; 2]) -> Vec<Ended> {
    nodes
        .into_iter()
        .map(|n| {
            let o = n.wait_with_output().unwrap();
            Ended {
                code: o.status.code().unwrap_or(-1),
                out: String::from_utf8_lossy(&o.stdout).into_owned(),
                err: String::from_utf8_lossy(&o.stderr).into_owned(),
            }
        })
        .collect()
}

/// Waits until all 4 ranks of the two nodes run their loop.
fn all_ready(dir: &Path) {
    let start = Instant::now();
    while (0..4).any(|r| !dir.join(format!("ready{r}")).exists()) {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts two nodes, waits until all 4 ranks run their loop, sends SIGTERM to the
/// second node's toporun only; returns both ends, how long after the signal each
/// node's stop file appeared, and how long the job took to end after the signal.
fn preempt(mode: &str, extra: &[&str]) -> (tempfile::TempDir, Vec<Ended>, Vec<f64>, Duration) {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let nodes = [
        node(port, d.path(), 0, mode, extra),
        node(port, d.path(), 1, mode, extra),
    ];
    all_ready(d.path());
    let signalled = Instant::now();
    // The stop file goes with the attempt, so it is watched while the job stops.
    let watch = watch_stop_files(d.path().to_path_buf(), signalled);
    sigterm(&nodes[1]);
    let ends = ended(nodes);
    let took = signalled.elapsed();
    (d, ends, watch.join().unwrap(), took)
}

/// Seconds from `from` until each node's stop file appeared (polled every 2 ms).
fn watch_stop_files(dir: PathBuf, from: Instant) -> std::thread::JoinHandle<Vec<f64>> {
    std::thread::spawn(move || {
        let mut seen: Vec<Option<f64>> = vec![None; 2];
        while seen.iter().any(Option::is_none) && from.elapsed() < Duration::from_secs(60) {
            for (n, s) in seen.iter_mut().enumerate() {
                if s.is_none() && dir.join(format!("stop{n}")).exists() {
                    *s = Some(from.elapsed().as_secs_f64());
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        seen.into_iter()
            .enumerate()
            .map(|(n, s)| s.unwrap_or_else(|| panic!("node {n} made no stop file")))
            .collect()
    })
}

/// The step every rank stopped at, asserted equal, with their saves and batches.
fn one_step(ends: &[Ended]) -> String {
    let lines: Vec<&str> = ends
        .iter()
        .flat_map(|e| e.out.lines())
        .filter(|l| l.contains(" saved at step "))
        .collect();
    assert_eq!(lines.len(), 4, "every rank saves: {lines:?}");
    let steps: Vec<&str> = lines
        .iter()
        .map(|l| {
            l.split(" saved at step ")
                .nth(1)
                .unwrap()
                .split(';')
                .next()
                .unwrap()
        })
        .collect();
    assert!(
        steps.iter().all(|s| *s == steps[0]),
        "one step for all: {lines:?}"
    );
    for l in &lines {
        assert!(l.ends_with("read 2 batches after the stop"), "{l}");
    }
    steps[0].to_string()
}

/// The checkpoint loads in a fresh process and holds every rank's tensor.
fn loads_every_rank(ckpt: &Path) {
    let code = "import sys, torch, torch.distributed.checkpoint as dcp\n\
        sd = {f'r{r}': torch.zeros(8) for r in range(4)}\n\
        dcp.load(sd, checkpoint_id=sys.argv[1])\n\
        assert all(bool((sd[f'r{r}'] == r).all()) for r in range(4)), sd\n\
        print('loaded 4 ranks')\n";
    let o = Command::new(python())
        .args(["-c", code])
        .arg(ckpt)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("loaded 4 ranks"),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn sigterm_to_one_node_saves_one_checkpoint_on_every_rank() {
    let (d, ends, delays, took) = preempt("handler", &[]);
    for (n, e) in ends.iter().enumerate() {
        assert_eq!(e.code, 85, "node {n}: {}", e.err);
        assert!(
            e.err.contains("toporun: preempted: SIGTERM on node ")
                && e.err.contains("2 of 2 ranks exited 0"),
            "node {n}: {}",
            e.err
        );
    }
    let step = one_step(&ends);
    loads_every_rank(&d.path().join("ckpt"));
    eprintln!(
        "stopped at step {step}; stop files {delays:?} s after the signal; last exit {took:?}"
    );
    assert!(
        delays.iter().all(|s| *s < 1.0),
        "every node acts within 1 s: {delays:?}"
    );
    assert!(
        took < Duration::from_secs(30),
        "within the shutdown deadline: {took:?}"
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_loop_that_polls_the_stop_file_stops_every_rank_at_one_step() {
    let (d, ends, delays, _) = preempt("file", &["--stop-grace=20"]);
    for (n, e) in ends.iter().enumerate() {
        assert_eq!(e.code, 85, "node {n}: {}", e.err);
        // Nobody needed the signal (it would kill a rank without a handler): every
        // rank ended by itself within the grace.
        assert!(
            e.err.contains("2 of 2 ranks exited 0"),
            "node {n}: {}",
            e.err
        );
    }
    one_step(&ends);
    loads_every_rank(&d.path().join("ckpt"));
    assert!(delays.iter().all(|s| *s < 1.0), "{delays:?}");
}

/// `--watch-preemption` on node 1 only, its metadata service the test server in AWS's
/// form: the spot interruption notice stops the whole job as a SIGTERM would.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn an_aws_spot_notice_stops_the_job_as_a_preemption() {
    let d = tempfile::tempdir().unwrap();
    let notice = d.path().join("notice");
    let mut server = Command::new(python())
        .arg(scripts().join("metadata_server.py"))
        .args(["aws", fixtures().join("metadata").to_str().unwrap()])
        .env("SPOT_NOTICE_FILE", &notice)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let aws = format!("http://127.0.0.1:{}", line.trim());
    let port = free_port();
    let watch = [
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", aws),
        ("GCE_METADATA_HOST", "127.0.0.1:9".to_string()),
        (
            "TOPORUN_AZURE_METADATA_ENDPOINT",
            "http://127.0.0.1:9".to_string(),
        ),
    ];
    let grace = ["--stop-grace=20"];
    let nodes = [
        node(port, d.path(), 0, "file", &grace),
        node_with(
            port,
            d.path(),
            1,
            "file",
            &["--stop-grace=20", "--watch-preemption"],
            &watch,
        ),
    ];
    all_ready(d.path());
    std::fs::write(&notice, "now").unwrap();
    let ends = ended(nodes);
    let _ = server.kill();
    let _ = server.wait();
    for (n, e) in ends.iter().enumerate() {
        assert_eq!(e.code, 85, "node {n}: {}", e.err);
        assert!(
            e.err.contains("preempted: the AWS spot interruption notice (terminate at 2026-11-24T14:40:00Z) on node "),
            "node {n}: {}",
            e.err
        );
    }
    one_step(&ends);
    loads_every_rank(&d.path().join("ckpt"));
}
