//! `toporun bench rendezvous`: 1024 simulated nodes in under 2 s here, and the same
//! load against PyTorch's own TCPStore server is not faster than against toporun's.

use crate::support;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use support::*;

fn bench(args: &[&str]) -> serde_json::Value {
    let (code, out, err) = run(toporun()
        .args(["bench", "rendezvous", "--format", "json"])
        .args(args));
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn a_thousand_nodes_in_under_two_seconds() {
    let v = bench(&["--nodes", "1024"]);
    eprintln!("toporun store: {v}");
    assert_eq!(v["nodes"], 1024);
    assert!(v["seconds"].as_f64().unwrap() < 2.0, "{v}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn pytorchs_tcpstore_is_not_faster_for_the_same_load() {
    let mut server = std::process::Command::new(python())
        .args(["-c", "import sys, time, torch.distributed as dist\nfrom datetime import timedelta\ns = dist.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))\nprint(s.port, flush=True)\ntime.sleep(120)"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let port = BufReader::new(server.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    let endpoint = format!("127.0.0.1:{}", port.trim());
    let theirs = bench(&["--nodes", "64", "--endpoint", &endpoint]);
    let ours = bench(&["--nodes", "64"]);
    server.kill().unwrap();
    server.wait().unwrap();
    eprintln!("64 nodes: PyTorch TCPStore {theirs}, toporun {ours}");
    assert!(
        ours["seconds"].as_f64().unwrap() <= theirs["seconds"].as_f64().unwrap(),
        "ours {ours} theirs {theirs}"
    );
}

#[test]
fn bad_bench_arguments_exit_2() {
    let (code, _, err) = run(toporun().args(["bench", "rendezvous", "--nodes", "0"]));
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(toporun().args([
        "bench",
        "rendezvous",
        "--nodes",
        "4",
        "--endpoint",
        "host-without-port",
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("HOST:PORT"), "{err}");
}
