//! The status endpoint while a real two-node job runs, read with a real HTTP client
//! (reqwest) and Prometheus' own OpenMetrics parser (the prometheus_client package):
//! readiness turns 200 only after the rendezvous closed and every rank started,
//! liveness stays 200 through a restart, metrics follow exits and restarts; a port
//! already taken is said and the job runs without the endpoint.

use crate::support;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use support::*;

fn node(rank: u32, port: u16, status: Option<u16>) -> Child {
    // Node 0's rank fails in the first attempt (exit 3): one restart follows.
    let script = "sleep 2; if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 0 ]; then exit 3; fi; sleep 4";
    let mut c = toporun();
    c.args([
        "--nnodes=2",
        &format!("--node-rank={rank}"),
        "--master-addr=127.0.0.1",
        &format!("--master-port={port}"),
        "--nproc-per-node=1",
        "--max-restarts=1",
        "--nccl-report=off",
    ]);
    if let Some(s) = status {
        c.arg(format!("--status-port={s}"));
    }
    c.args(["--no-python", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

fn get(client: &reqwest::blocking::Client, port: u16, path: &str) -> Option<(u16, String)> {
    let r = client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .ok()?;
    let code = r.status().as_u16();
    Some((code, r.text().ok()?))
}

fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn readiness_liveness_and_metrics_follow_a_real_job() {
    let (port, sport) = (free_port(), free_port());
    let client = http().timeout(Duration::from_secs(5)).build().unwrap();
    let mut n0 = node(0, port, Some(sport));
    until("the endpoint answers", Duration::from_secs(20), || {
        get(&client, sport, "/healthz").is_some_and(|(c, _)| c == 200)
    });
    // Node 1 is not there yet: alive, not ready.
    let (code, why) = get(&client, sport, "/readyz").unwrap();
    assert_eq!(code, 503, "{why}");
    assert!(why.contains("rendezvous"), "{why}");
    let m = prometheus_samples(&get(&client, sport, "/metrics").unwrap().1);
    assert_eq!(m["toporun_ready{}"], 0.0);
    assert_eq!(m["toporun_nodes_expected{}"], 2.0);

    let n1 = node(1, port, None);
    until(
        "ready after the rendezvous",
        Duration::from_secs(30),
        || get(&client, sport, "/readyz").is_some_and(|(c, _)| c == 200),
    );
    let status: serde_json::Value =
        serde_json::from_str(&get(&client, sport, "/status").unwrap().1).unwrap();
    assert_eq!(status["ranks"][0]["state"], "running", "{status}");
    assert!(status["ranks"][0]["pid"].as_i64().unwrap() > 0);
    assert_eq!(status["node_rank"], 0);

    // The first attempt fails (exit 3) and restarts; liveness holds throughout.
    let mut worst = 200;
    until(
        "the restart in the metrics",
        Duration::from_secs(30),
        || {
            worst = worst.max(get(&client, sport, "/healthz").map_or(599, |(c, _)| c));
            let m = prometheus_samples(&get(&client, sport, "/metrics").unwrap().1);
            m.get("toporun_restarts_total{}") == Some(&1.0)
                && m.get("toporun_rank_exits_total{code=3}") == Some(&1.0)
        },
    );
    assert_eq!(worst, 200, "liveness failed during the restart");
    until(
        "ready again after the restart",
        Duration::from_secs(30),
        || get(&client, sport, "/readyz").is_some_and(|(c, _)| c == 200),
    );
    let status: serde_json::Value =
        serde_json::from_str(&get(&client, sport, "/status").unwrap().1).unwrap();
    assert!(
        status["last_failure"]
            .as_str()
            .unwrap_or("")
            .contains("exit code 3"),
        "{status}"
    );
    assert!(
        !status.to_string().contains("PATH"),
        "no environment in the status"
    );
    let c0 = n0.wait().unwrap();
    let out1 = n1.wait_with_output().unwrap();
    assert!(c0.success() && out1.status.success());
}

#[test]
fn a_taken_port_is_said_and_the_job_runs() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let sport = taken.local_addr().unwrap().port();
    let out = toporun()
        .args([
            "--standalone",
            "--nproc-per-node=1",
            "--nccl-report=off",
            "--no-python",
            "true",
        ])
        .env("TORCHELASTIC_HEALTH_CHECK_PORT", sport.to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("cannot listen on port {sport}")),
        "{err}"
    );
}
