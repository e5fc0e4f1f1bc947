//! A store port that is taken says who holds it: the static host fails naming the
//! process, and a c10d node whose endpoint names this machine says why it joins
//! instead of hosting (so a store that never comes explains itself).

use crate::support;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::*;

fn held_port() -> (std::net::TcpListener, u16) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

#[test]
fn a_static_host_names_who_holds_its_port() {
    let (_held, port) = held_port();
    let (code, _, err) = run(toporun().args([
        "--nnodes=2",
        "--node-rank=0",
        "--master-addr=127.0.0.1",
        &format!("--master-port={port}"),
        "--no-python",
        "true",
    ]));
    assert_eq!(code, 1, "{err}");
    let me = format!("held by pid {} (", std::process::id());
    assert!(
        err.contains(&format!("port {port} is already in use")),
        "{err}"
    );
    assert!(err.contains(&me) && err.contains("LISTEN)"), "{err}");
}

#[test]
fn a_c10d_node_that_cannot_host_says_why_and_who_holds_the_port() {
    let (_held, port) = held_port();
    let mut child = toporun()
        .args([
            "--nnodes=1:2",
            "--rdzv-backend=c10d",
            &format!("--rdzv-endpoint=localhost:{port}"),
            "--rdzv-conf=join_timeout=3",
            "--no-python",
            "true",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let start = Instant::now();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        said.push_str(&line);
        said.push('\n');
        if line.contains("instead of hosting it") || start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        said.contains(&format!("names this machine, but port {port} is taken")),
        "{said}"
    );
    assert!(
        said.contains(&format!("pid {} (", std::process::id())),
        "{said}"
    );
}
