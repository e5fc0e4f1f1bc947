//! toporun's rendezvous over a TCPStore: nodes join a round, one coordinator closes it
//! and hands out places. Only standard store operations are used, so the same protocol
//! runs against toporun's store or PyTorch's own TCPStore server, and every node does a
//! constant number of operations (a round of N nodes costs O(N) in total).
//!
//! Keys, under `toporun/<run_id>/r<round>/`:
//! - `join`: ADD counter; c10d nodes take their join index (ticket) from it.
//! - `node/<ticket>`: the node's description (JSON, with its nproc).
//! - `layout/<ticket>`: "node_rank,offset,world,nnodes", set by the coordinator.
//! - `env/<ticket>`: variables the co-location decision adds to the node's ranks.
//! - `closed`: the number of nodes, set once when the round closes (nodes WAIT on it).
//! - `name/<rank>`: "hostname, address", to name a node that is lost.
//! - `stop`: "restart ...", "membership ..." or "fail ..." (first writer wins): every
//!   node stops its ranks.
//! - `alive/<rank>`: keep-alives (counters; leased keys in etcd); `done`: the exit
//!   barrier; `waiting`: nodes that arrived after the round closed.
//!
//! and `toporun/<run_id>/round`, the round the job is at: nodes that stop a round
//! move it on, nodes that arrive read it. In etcd, counters are one key per node under
//! the counter's name and c10d nodes enroll under their own id (`node/<id>`,
//! `layout/<id>`), ordered by creation.

pub mod bench;
mod config;
mod coordinator;
mod kv;
mod node;

pub use config::{key_space, Config, NodeInfo, Shape};
pub use coordinator::{coordinate, CoordinateError, Waiting};
pub use kv::{EtcdKv, Kv, KvError};
pub use node::{
    advance_round, barrier, current_round, join, request_stop, round_closed, wait_for_next_round,
    JoinError, Next, Place, StopWatch, FAIL, MEMBERSHIP, RESTART,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreClient, StoreServer};
    use std::time::Duration;
    use toporun_shared::colocation;

    fn cfg(shape: Shape) -> Config {
        Config {
            run_id: "t".into(),
            shape,
            join_timeout: Duration::from_secs(5),
            last_call: Duration::from_millis(300),
            close_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_millis(100),
            keepalive_misses: 3,
            colocated: colocation::Mode::Join,
            key_space: None,
        }
    }

    async fn client(port: u16) -> Kv {
        Kv::Store(
            StoreClient::connect("127.0.0.1", port, Duration::from_secs(2))
                .await
                .unwrap(),
        )
    }

    /// Runs round 0's coordinator on the store at `port`.
    async fn coordinate_on(port: u16, cfg: &Config) -> Result<Vec<NodeInfo>, CoordinateError> {
        coordinate(&mut client(port).await, cfg, 0, &mut |_| {}, &mut || {}).await
    }

    #[tokio::test]
    async fn static_heterogeneous_nodes_get_ranks_in_node_order() {
        let s = StoreServer::bind(0).unwrap();
        let cfg = cfg(Shape::Static { nnodes: 2 });
        let mut handles = Vec::new();
        for (rank, nproc) in [(1u32, 3u32), (0, 1)] {
            let (cfg, port) = (cfg.clone(), s.port());
            handles.push(tokio::spawn(async move {
                let info = NodeInfo {
                    node_rank: Some(rank),
                    nproc,
                    hostname: "node".into(),
                    addr: "node".into(),
                    ..Default::default()
                };
                join(&mut client(port).await, &cfg, 0, &info, &mut |_| {})
                    .await
                    .unwrap()
            }));
        }
        let infos = coordinate_on(s.port(), &cfg).await.unwrap();
        assert_eq!(
            infos.iter().map(|i| i.nproc).collect::<Vec<_>>(),
            vec![1, 3]
        );
        let node1 = handles.remove(0).await.unwrap();
        assert_eq!(
            (node1.node_rank, node1.offset, node1.world, node1.nnodes),
            (1, 1, 4, 2)
        );
        assert_eq!(handles.remove(0).await.unwrap().offset, 0);
    }

    #[tokio::test]
    async fn static_timeout_names_the_missing_rank() {
        let s = StoreServer::bind(0).unwrap();
        let mut cfg = cfg(Shape::Static { nnodes: 2 });
        cfg.join_timeout = Duration::from_millis(300);
        let info = NodeInfo {
            node_rank: Some(0),
            nproc: 1,
            hostname: "node".into(),
            addr: "node".into(),
            ..Default::default()
        };
        let port = s.port();
        let c2 = cfg.clone();
        tokio::spawn(
            async move { join(&mut client(port).await, &c2, 0, &info, &mut |_| {}).await },
        );
        let err = coordinate_on(port, &cfg).await.unwrap_err();
        assert!(
            err.to_string().contains("missing node rank(s) [1]"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn elastic_closes_after_last_call_with_min_nodes() {
        let s = StoreServer::bind(0).unwrap();
        let cfg = cfg(Shape::Elastic { min: 2, max: 4 });
        let mut handles = Vec::new();
        for _ in 0..2 {
            let (cfg, port) = (cfg.clone(), s.port());
            handles.push(tokio::spawn(async move {
                join(
                    &mut client(port).await,
                    &cfg,
                    0,
                    &NodeInfo {
                        nproc: 2,
                        hostname: "node".into(),
                        addr: "node".into(),
                        ..Default::default()
                    },
                    &mut |_| {},
                )
                .await
                .unwrap()
            }));
        }
        let t = std::time::Instant::now();
        let infos = coordinate_on(s.port(), &cfg).await.unwrap();
        assert_eq!(infos.len(), 2);
        assert!(
            t.elapsed() >= Duration::from_millis(250),
            "closed before the last call"
        );
        let mut ranks: Vec<u32> = Vec::new();
        for h in handles {
            let p = h.await.unwrap();
            assert_eq!(p.world, 4);
            ranks.push(p.node_rank);
        }
        ranks.sort();
        assert_eq!(ranks, vec![0, 1]);
    }

    #[tokio::test]
    async fn a_silent_node_triggers_a_stop_on_the_host() {
        let s = StoreServer::bind(0).unwrap();
        let cfg = cfg(Shape::Static { nnodes: 2 });
        let watch = StopWatch {
            client: client(s.port()).await,
            cfg: cfg.clone(),
            round: 0,
            node_rank: 0,
            nnodes: 2,
            watches: true,
            note: |_| {},
        };
        let reason = tokio::time::timeout(Duration::from_secs(3), watch.run())
            .await
            .unwrap();
        // Two nodes, one lost and nobody waiting: below --nnodes, the job cannot go on.
        assert!(reason.starts_with("fail: node 1"), "{reason}");
        assert!(reason.contains("fewer than the minimum of 2"), "{reason}");
    }

    #[tokio::test]
    async fn bench_a_thousand_nodes() {
        let r = bench::bench(1000, bench::Target::InProcess, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(r.nodes, 1000);
        // Each node: join, wait, one read of its place (and the coordinator's).
        assert!(r.ops >= 3000, "{r:?}");
    }
}
