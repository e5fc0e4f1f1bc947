//! toporun's rendezvous: nodes join a round, one coordinator closes it and hands out
//! places. Only standard store operations are used, so the same protocol runs
//! against toporun's store, PyTorch's own TCPStore server or etcd, and every node does
//! a constant number of operations (a round of N nodes costs O(N) in total). Every
//! key is named in `keys`, every value is a type of `protocol`, and the state lives
//! behind `backend`.

// Counts here come from other nodes and the store: no cast may wrap them silently.
#![deny(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

pub mod backend;
pub mod bench;
mod config;
mod coordinator;
mod keys;
mod node;
mod node_info;
mod protocol;
mod spares;
mod typed_key;

pub use backend::{etcd_client, Backend, EtcdKv, Kv, KvError, StoreKv};
pub use config::{key_space, Config, Shape};
pub use coordinator::{coordinate, CoordinateError, Waiting};
pub use keys::{RoundKeys, RunKeys};
pub use node::{
    advance_round, barrier, current_round, join, request_stop, round_closed, wait_for_next_round,
    BarrierNode, JoinError, NextRound, Place, StopWatch,
};
pub use node_info::{NodeInfo, NodeMachine};
pub use protocol::{Closed, Layout, StopKind, StopReason, Unreadable};
pub use spares::{alive_spares, beat_window};
pub use typed_key::Key;

/// A rendezvous connection to a test's store on loopback.
#[cfg(test)]
pub(crate) async fn test_client(port: u16) -> Kv {
    let c =
        crate::store::StoreClient::connect("127.0.0.1", port, std::time::Duration::from_secs(2));
    Kv::Store(StoreKv(c.await.unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreServer;
    use std::time::Duration;
    use toporun_shared::colocation;

    pub(super) fn cfg(shape: Shape) -> Config {
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

    use super::test_client as client;

    /// Node rank 0's watch over a round of `nnodes`.
    async fn watch(port: u16, cfg: &Config, nnodes: u32) -> StopWatch {
        StopWatch {
            client: client(port).await,
            cfg: cfg.clone(),
            round: 0,
            node_rank: 0,
            nnodes,
            watches: true,
            note: |_| {},
        }
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
                    boot_id: Some(format!("boot-{rank}")),
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
        // Every node reads each rank's machine as the coordinator published it (a
        // node that did not coordinate judged NCCL's links without it).
        let key = cfg.round_keys(0).machines();
        let raw = client(s.port()).await.read(&[key.name()]).await.unwrap();
        let machines = NodeMachine::per_rank(&key.decode_or_warn(&raw[0]).unwrap(), node1.world);
        let boot = |r: &str| Some(r.to_string());
        assert_eq!(
            machines,
            vec![
                boot("boot-0"),
                boot("boot-1"),
                boot("boot-1"),
                boot("boot-1")
            ]
        );
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
        let watch = watch(s.port(), &cfg, 2).await;
        let reason = tokio::time::timeout(Duration::from_secs(3), watch.run())
            .await
            .unwrap();
        // Two nodes, one lost and nobody waiting: below --nnodes, the job cannot go on.
        assert_eq!(reason.kind, StopKind::Fail, "{reason}");
        assert!(reason.detail.starts_with("node 1"), "{reason}");
        assert!(
            reason.detail.contains("fewer than the minimum of 2"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn a_lost_node_is_not_replaced_by_a_spare_that_died() {
        let s = StoreServer::bind(0).unwrap();
        let cfg = cfg(Shape::Elastic { min: 2, max: 2 });
        let (keys, ttl) = (cfg.round_keys(0), Duration::from_millis(300));
        // A spare counted itself and died: a TCPStore's counter still says one.
        let mut spare = client(s.port()).await;
        spare.tally_alive(&keys.waiting(), ttl, None).await.unwrap();
        // Node 1 beats for a while (past the spares' silence limit, 1.2 s here), then
        // dies too.
        let mut node1 = client(s.port()).await;
        let alive = keys.alive();
        tokio::spawn(async move {
            for _ in 0..16 {
                node1.beat(&alive, 1, ttl).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let watch = watch(s.port(), &cfg, 2).await;
        let reason = tokio::time::timeout(Duration::from_secs(5), watch.run())
            .await
            .unwrap();
        // Not a restart for the dead spare, which would wait out the join timeout.
        assert_eq!(reason.kind, StopKind::Fail, "{reason}");
        assert!(
            reason.detail.contains("1 node(s) remain and 0 wait"),
            "{reason}"
        );
    }

    fn node(rank: Option<u32>) -> NodeInfo {
        NodeInfo {
            node_rank: rank,
            nproc: 1,
            hostname: "node".into(),
            addr: "node".into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_negative_join_count_is_garbage_not_a_huge_one() {
        let s = StoreServer::bind(0).unwrap();
        let cfg = cfg(Shape::Static { nnodes: 2 });
        // Any store client can write the counter; -3 as u32 would read as 4e9 joined.
        let mut stranger = client(s.port()).await;
        let Kv::Store(StoreKv(raw)) = &mut stranger else {
            unreachable!()
        };
        raw.add(&cfg.round_keys(0).join(), -3).await.unwrap();
        let err = coordinate_on(s.port(), &cfg).await.unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, CoordinateError::Kv(KvError::Garbage(_))),
            "{text}"
        );
        assert!(text.contains("r0/join reads -3"), "{text}");
    }

    #[tokio::test]
    async fn the_join_timeout_bounds_the_round_even_with_min_nodes() {
        // torchrun: the join deadline passes before the last call ends: timeout.
        let s = StoreServer::bind(0).unwrap();
        let mut cfg = cfg(Shape::Elastic { min: 1, max: 2 });
        cfg.join_timeout = Duration::from_millis(400);
        cfg.last_call = Duration::from_secs(10);
        let (c2, port) = (cfg.clone(), s.port());
        tokio::spawn(async move {
            join(&mut client(port).await, &c2, 0, &node(None), &mut |_| {}).await
        });
        let t = std::time::Instant::now();
        let err = coordinate_on(s.port(), &cfg).await.unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert!(
            matches!(
                err,
                CoordinateError::TimeoutInLastCall {
                    joined: 1,
                    min: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err
            .to_string()
            .contains("join_timeout above last_call_timeout"));
    }

    #[tokio::test]
    async fn a_forged_closed_stops_host_and_late_node_at_once() {
        let s = StoreServer::bind(0).unwrap();
        let cfg = cfg(Shape::Static { nnodes: 2 });
        let keys = cfg.round_keys(0);
        let port = s.port();
        let c0 = cfg.clone();
        tokio::spawn(async move {
            join(&mut client(port).await, &c0, 0, &node(Some(0)), &mut |_| {}).await
        });
        let c1 = cfg.clone();
        let coordinator = tokio::spawn(async move { coordinate_on(port, &c1).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        // A stranger closes the round before node 1 joins.
        let mut stranger = client(port).await;
        stranger
            .set(&keys.closed(), &Closed::Nodes(2).encode())
            .await
            .unwrap();
        stranger.set(&keys.layout("1"), b"{}").await.unwrap();
        let t = std::time::Instant::now();
        let err = coordinator.await.unwrap().unwrap_err();
        assert!(matches!(err, CoordinateError::Forged { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("r0/closed was set by someone other"),
            "{err}"
        );
        // Node 1 finds the round closed and would wait as a spare: it is told instead.
        let mut c = client(port).await;
        assert!(round_closed(&mut c, &cfg, 0).await.unwrap());
        let late = wait_for_next_round(&mut c, &cfg, 0, &mut |_| {}).await;
        let Err(JoinError::Stopped(reason)) = late else {
            panic!("the late node was not stopped")
        };
        assert_eq!(reason.kind, StopKind::Fail);
        assert!(reason.detail.contains("forged"), "{reason}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }
}
