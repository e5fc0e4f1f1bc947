//! Several toporun nodes on loopback with real PyTorch workers: static and c10d
//! rendezvous, heterogeneous nodes, timeouts, restarts across nodes, lost nodes.

use crate::support;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use support::*;

fn node(args: &[String], out: &Path, env: &[(&str, &str)]) -> Child {
    let mut c = toporun();
    c.args(args)
        .env("PROBE_OUT", out)
        .env("PYTHON_EXEC", python())
        .current_dir(scripts())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn static_args(
    nodes: u32,
    rank: u32,
    port: u16,
    nproc: u32,
    extra: &[&str],
    script: &str,
) -> Vec<String> {
    let mut a: Vec<String> = vec![
        format!("--nnodes={nodes}"),
        format!("--node-rank={rank}"),
        "--master-addr=127.0.0.1".into(),
        format!("--master-port={port}"),
        format!("--nproc-per-node={nproc}"),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push(script.into());
    a
}

fn finish(child: Child, timeout: Duration) -> (i32, String, String, Duration) {
    let start = Instant::now();
    let mut child = child;
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into(),
                String::from_utf8_lossy(&out.stderr).into(),
                start.elapsed(),
            );
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "node did not finish within {timeout:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn env_of(out: &Path, rank: u32, attempt: u32) -> serde_json::Value {
    let text = std::fs::read_to_string(out.join(format!("rank{rank}_attempt{attempt}.json")))
        .unwrap_or_else(|_| panic!("rank {rank} attempt {attempt} did not run"));
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["env"].clone()
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn static_two_nodes_of_two_gloo_ranks() {
    let d = tempfile::tempdir().unwrap();
    let n0 = node(
        &static_args(2, 0, 29631, 2, &[], "allreduce_gloo.py"),
        d.path(),
        &[],
    );
    let n1 = node(
        &static_args(2, 1, 29631, 2, &[], "allreduce_gloo.py"),
        d.path(),
        &[],
    );
    let (c0, o0, e0, _) = finish(n0, Duration::from_secs(120));
    let (c1, o1, e1, _) = finish(n1, Duration::from_secs(120));
    assert_eq!((c0, c1), (0, 0), "{e0}\n{e1}");
    let all = format!("{o0}{o1}");
    for r in 0..4 {
        assert!(all.contains(&format!("OK rank {r} of 4 sum 10")), "{all}");
    }
    assert!(e0.contains("round 0 complete: 2 nodes, 4 ranks"), "{e0}");
    assert!(
        e0.contains("info: rdzv.colocated: node ranks [0, 1]"),
        "two nodes on this machine: {e0}"
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn heterogeneous_nodes_get_ranks_in_node_order() {
    let d = tempfile::tempdir().unwrap();
    let n1 = node(
        &static_args(2, 1, 29632, 3, &[], "dump_env.py"),
        d.path(),
        &[],
    );
    let n0 = node(
        &static_args(2, 0, 29632, 1, &[], "dump_env.py"),
        d.path(),
        &[],
    );
    assert_eq!(finish(n0, Duration::from_secs(60)).0, 0);
    assert_eq!(finish(n1, Duration::from_secs(60)).0, 0);
    let r0 = env_of(d.path(), 0, 0);
    assert_eq!(
        (r0["GROUP_RANK"].as_str(), r0["LOCAL_WORLD_SIZE"].as_str()),
        (Some("0"), Some("1"))
    );
    for (rank, local) in [(1, 0), (2, 1), (3, 2)] {
        let e = env_of(d.path(), rank, 0);
        assert_eq!(e["GROUP_RANK"], "1");
        assert_eq!(e["LOCAL_RANK"], local.to_string());
        assert_eq!(e["WORLD_SIZE"], "4");
        assert_eq!(e["GROUP_WORLD_SIZE"], "2");
        assert_eq!(e["LOCAL_WORLD_SIZE"], "3");
        assert_eq!(e["MASTER_PORT"], "29632");
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn c10d_three_nodes() {
    let d = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "--nnodes=3",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:29633",
        "--rdzv-id=job7",
        "--nproc-per-node=1",
        "allreduce_gloo.py",
    ]
    .map(String::from)
    .into();
    let nodes: Vec<Child> = (0..3).map(|_| node(&args, d.path(), &[])).collect();
    let results: Vec<_> = nodes
        .into_iter()
        .map(|n| finish(n, Duration::from_secs(120)))
        .collect();
    let all: String = results.iter().map(|r| r.1.clone()).collect();
    for (code, _, err, _) in &results {
        assert_eq!(*code, 0, "{err}");
    }
    for r in 0..3 {
        assert!(all.contains(&format!("OK rank {r} of 3 sum 6")), "{all}");
    }
    assert!(
        results
            .iter()
            .filter(|r| r.2.contains("hosting the store"))
            .count()
            == 1,
        "exactly one node hosts"
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_missing_node_fails_within_the_join_timeout_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let n0 = node(
        &static_args(
            2,
            0,
            29634,
            1,
            &["--rdzv-conf=join_timeout=3"],
            "dump_env.py",
        ),
        d.path(),
        &[],
    );
    let (code, _, err, took) = finish(n0, Duration::from_secs(30));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("missing node rank(s) [1]"), "{err}");
    assert!(
        err.contains("not scheduled") && err.contains("resolve"),
        "likely causes: {err}"
    );
    assert!(took < Duration::from_secs(12), "{took:?}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_failure_on_node_1_restarts_every_node() {
    let d = tempfile::tempdir().unwrap();
    let fail = [("FAIL_RANK", "2")];
    let n0 = node(
        &static_args(2, 0, 29635, 2, &["--max-restarts=1"], "dump_env.py"),
        d.path(),
        &fail,
    );
    let n1 = node(
        &static_args(2, 1, 29635, 2, &["--max-restarts=1"], "dump_env.py"),
        d.path(),
        &fail,
    );
    let (c0, _, e0, _) = finish(n0, Duration::from_secs(120));
    let (c1, _, e1, _) = finish(n1, Duration::from_secs(120));
    assert_eq!((c0, c1), (0, 0), "{e0}\n{e1}");
    for r in 0..4 {
        assert_eq!(
            env_of(d.path(), r, 1)["TORCHELASTIC_RESTART_COUNT"],
            "1",
            "rank {r}"
        );
    }
    assert!(e0.contains("node 1 local rank 0 (rank 2) failed"), "{e0}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_node_killed_mid_run_stops_the_others_within_the_keep_alive_timeout() {
    let d = tempfile::tempdir().unwrap();
    let conf = "--rdzv-conf=keep_alive_interval=0.5,keep_alive_max_attempt=2";
    let n0 = node(
        &static_args(2, 0, 29636, 1, &[conf, "--shutdown-timeout=2"], "worker.py"),
        d.path(),
        &[],
    );
    let mut n1 = node(
        &static_args(2, 1, 29636, 1, &[conf], "worker.py"),
        d.path(),
        &[],
    );
    let start = Instant::now();
    while !(d.path().join("pid0").exists() && d.path().join("pid1").exists()) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    n1.kill().unwrap();
    n1.wait().unwrap();
    let (code, _, err, took) = finish(n0, Duration::from_secs(20));
    assert_eq!(code, 1);
    assert!(
        err.contains("node 1 (") && err.contains("stopped sending keep-alives"),
        "{err}"
    );
    assert!(err.contains("fewer than the minimum of 2"), "{err}");
    assert!(took < Duration::from_secs(6), "{took:?}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_rank_hung_before_init_process_group_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let mut c = node(
        &[
            "--standalone".into(),
            "--nproc-per-node=2".into(),
            "hang_init.py".into(),
        ],
        d.path(),
        &[("TOPORUN_INIT_WARN_SECS", "2")],
    );
    let mut lines = BufReader::new(c.stderr.take().unwrap()).lines();
    let start = Instant::now();
    let mut seen = String::new();
    while let Some(Ok(line)) = lines.next() {
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("only 1 of 2 workers have connected") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{seen}");
    }
    assert!(seen.contains("init_process_group"), "{seen}");
    sigterm(&c);
    c.wait().unwrap();
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_node_whose_host_never_comes_says_so_and_gives_up() {
    let d = tempfile::tempdir().unwrap();
    let n1 = node(
        &static_args(
            2,
            1,
            29637,
            1,
            &["--rdzv-conf=join_timeout=6"],
            "dump_env.py",
        ),
        d.path(),
        &[],
    );
    let (code, _, err, took) = finish(n1, Duration::from_secs(30));
    assert_eq!(code, 1);
    assert!(
        err.contains("still connecting to the store at 127.0.0.1:29637"),
        "progress while waiting: {err}"
    );
    assert!(
        err.contains("could not reach the rendezvous store") && err.contains("DNS"),
        "{err}"
    );
    assert!(took < Duration::from_secs(12), "{took:?}");
}
