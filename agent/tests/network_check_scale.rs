//! The network check's protocol at scale, on loopback: N nodes' agents in one
//! process, each with its own connection to a real store, run the whole check (probe
//! listeners published, two probe rounds with their barriers, records, the report
//! read by all). Loopback paths are alike, so nobody may be named; the time is the
//! protocol's (round trips, barriers, the windows) on a 2-core machine where 2N
//! streams share the CPU.

use std::time::{Duration, Instant};
use toporun_agent::network_check::exchange::{run, CheckNode};
use toporun_agent::rendezvous::{Kv, RunKeys, StoreKv};
use toporun_agent::store::{Reach, StoreClient, StoreServer};
use toporun_shared::network_check::report::NetworkReport;

async fn node(port: u16, node_rank: u32, nnodes: u32) -> NetworkReport {
    let client = StoreClient::connect("127.0.0.1", port, Duration::from_secs(5))
        .await
        .unwrap();
    let mut kv = Kv::Store(StoreKv(client));
    let keys = RunKeys::new("scale", None).round(0);
    let me = CheckNode {
        round: 0,
        node_rank,
        nnodes,
        host: "loopback",
        addr: "127.0.0.1",
        ips: &[],
        nics: &[],
        hosts_rendezvous: node_rank == 0,
        spare_beat: Duration::from_secs(5),
        gate: None,
        rdma: false,
    };
    run(&mut kv, &keys, &me, Err("no torch here".into()))
        .await
        .unwrap()
}

/// `nnodes` nodes at once: every node's report, and how long the slowest took.
fn check(nnodes: u32) -> (Vec<NetworkReport>, Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = StoreServer::bind_on(0, Reach::Loopback).unwrap();
        let port = server.port();
        let t = Instant::now();
        let nodes: Vec<_> = (0..nnodes)
            .map(|n| tokio::spawn(node(port, n, nnodes)))
            .collect();
        let mut reports = Vec::new();
        for n in nodes {
            reports.push(n.await.unwrap());
        }
        (reports, t.elapsed())
    })
}

#[test]
fn sixty_four_nodes_check_within_five_seconds_and_name_nobody_on_alike_paths() {
    for nnodes in [2, 8, 64] {
        let (reports, took) = check(nnodes);
        let first = &reports[0];
        eprintln!(
            "{nnodes} nodes on loopback: {took:.2?}; {}",
            first.summary()
        );
        assert!(
            reports.iter().all(|r| r == first),
            "every node reads one report"
        );
        assert_eq!(first.nodes.len(), nnodes as usize);
        assert!(first.silent.is_empty(), "{:?}", first.silent);
        assert!(first.slow.is_empty(), "alike paths: {:?}", first.named());
        assert!(
            first
                .nodes
                .iter()
                .all(|n| n.figure.send_gbit > 0.0 && n.figure.recv_gbit > 0.0),
            "{}",
            first.summary()
        );
        assert!(took < Duration::from_secs(5), "{nnodes} nodes: {took:?}");
    }
}

/// A node gone during the check (its agent stopped in the first probe round): the
/// others wait for it in full once, then briefly, and its record is said missing.
#[test]
fn a_node_gone_during_the_check_holds_the_others_once() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = StoreServer::bind_on(0, Reach::Loopback).unwrap();
        let port = server.port();
        let t = Instant::now();
        let gone = tokio::spawn(node(port, 2, 3));
        let stay: Vec<_> = (0..2).map(|n| tokio::spawn(node(port, n, 3))).collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        gone.abort();
        let mut reports = Vec::new();
        for n in stay {
            reports.push(n.await.unwrap());
        }
        let took = t.elapsed();
        eprintln!("one of 3 gone: {took:.2?}; {}", reports[0].summary());
        assert_eq!(reports[0].silent, [2]);
        assert_eq!(reports[0], reports[1]);
        // One full barrier (9 s), then 1 s waits: about 15 s. Every wait in full
        // (two barriers, the records, the host's last wait) took over 30 s.
        assert!(took < Duration::from_secs(22), "{took:?}");
    });
}
