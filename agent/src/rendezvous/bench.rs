//! `toporun bench rendezvous`: N simulated nodes (async tasks, one connection each) run
//! the real join protocol against a store, to size the rendezvous host.

use super::backend::etcd_client::Etcd;
use super::backend::{Backend, EtcdKv, Kv, StoreKv};
use super::config::{Config, Shape};
use super::coordinator::coordinate;
use super::node::join;
use super::node_info::NodeInfo;
use crate::store::{StoreClient, StoreServer};
use std::time::{Duration, Instant};

/// Connections opening at once.
const CONNECTING: usize = 1024;

/// Where the simulated nodes meet.
pub enum Target {
    /// A toporun store in this process.
    InProcess,
    /// A TCPStore elsewhere (toporun's in another process, or PyTorch's).
    Store(String, u16),
    /// An etcd cluster (its client endpoints).
    Etcd(Vec<String>),
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    pub nodes: u32,
    pub seconds: f64,
    pub ops: u64,
    pub ops_per_second: f64,
    pub store: String,
}

/// How the simulated nodes reach the rendezvous.
#[derive(Clone)]
enum Via {
    Etcd(Etcd),
    Store(String, u16),
}

/// Why the bench could not finish a round.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot start the in-process store: {0}")]
    InProcess(#[source] std::io::Error),
    #[error(transparent)]
    Etcd(#[from] crate::rendezvous::backend::etcd_client::EtcdError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("a simulated node could not join: {0}")]
    Join(#[from] crate::rendezvous::node::JoinError),
    #[error("the coordinator failed: {0}")]
    Coordinate(#[from] crate::rendezvous::coordinator::CoordinateError),
    #[error("a simulated node's task ended: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("{got} distinct node ranks for {nodes} nodes")]
    Ranks { got: usize, nodes: u32 },
}

/// Runs one round of `nodes` simulated nodes against `target`.
pub async fn bench(
    nodes: u32,
    target: Target,
    timeout: Duration,
) -> Result<BenchResult, BenchError> {
    let mut _in_process = None;
    let (via, store) = match target {
        Target::InProcess => {
            let s = StoreServer::bind(0).map_err(BenchError::InProcess)?;
            let port = s.port();
            _in_process = Some(s);
            let what = "toporun's in-process store".to_string();
            (Via::Store("127.0.0.1".into(), port), what)
        }
        Target::Store(h, p) => {
            let what = format!("the store at {}", crate::store::client::display(&h, p));
            (Via::Store(h, p), what)
        }
        Target::Etcd(eps) => {
            let what = format!("etcd at {}", eps.join(","));
            (
                Via::Etcd(Etcd::new(eps, &Default::default(), timeout)?),
                what,
            )
        }
    };
    // Each simulated node connects from its own loopback address, as real nodes come
    // from their own IPs (from one address, the kernel's search for a free ephemeral
    // port among 16,000 connections costs more than the rendezvous).
    let loopback = matches!(&via, Via::Store(h, _) if h == "127.0.0.1");
    let connect = move |node: Option<u32>| {
        let via = via.clone();
        let source = node.filter(|_| loopback).map(|i| {
            let [_, a, b, c] = i.to_be_bytes();
            std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, a.saturating_add(1), b, c))
        });
        async move {
            match via {
                Via::Etcd(e) => Ok(Kv::Etcd(EtcdKv::new(e))),
                Via::Store(h, p) => StoreClient::connect_from(&h, p, source, timeout)
                    .await
                    .map(|c| Kv::Store(StoreKv(c)))
                    .map_err(BenchError::from),
            }
        }
    };
    let cfg = Config {
        run_id: format!("bench-{}-{}", std::process::id(), crate::paths::random_id()),
        shape: Shape::Elastic {
            min: nodes,
            max: nodes,
        },
        join_timeout: timeout,
        last_call: Duration::ZERO,
        close_timeout: timeout,
        read_timeout: timeout,
        keepalive_interval: Duration::from_secs(5),
        keepalive_misses: 3,
        colocated: toporun_shared::colocation::Mode::Warn,
        key_space: None,
    };
    // Connections open at most CONNECTING at a time: a storm beyond the kernel's
    // listen backlog (net.core.somaxconn, 4096 by default) loses SYNs and waits out
    // a 1 s retransmit, which measures the kernel, not the rendezvous.
    let connecting = std::sync::Arc::new(tokio::sync::Semaphore::new(CONNECTING));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(nodes as usize);
    for i in 0..nodes {
        let (cfg, conn, gate) = (cfg.clone(), connect(Some(i)), connecting.clone());
        tasks.push(tokio::spawn(async move {
            // The semaphore is never closed.
            let permit = gate.acquire_owned().await.ok();
            let mut c = conn.await?;
            drop(permit);
            let info = NodeInfo {
                hostname: format!("sim-{i}"),
                addr: format!("10.{}.{}.{}", i / 62500, (i / 250) % 250, i % 250),
                nproc: 8,
                gpus: 8,
                ..Default::default()
            };
            let place = join(&mut c, &cfg, 0, &info, &mut |_| {}).await?;
            Ok::<_, BenchError>((place, c.ops()))
        }));
    }
    let mut coord = connect(None).await?;
    coordinate(&mut coord, &cfg, 0, &mut |_| {}, &mut || {}).await?;
    let mut ops = coord.ops();
    let mut ranks = std::collections::BTreeSet::new();
    for t in tasks {
        let (place, n) = t.await??;
        ranks.insert(place.node_rank);
        ops += n;
    }
    let seconds = start.elapsed().as_secs_f64();
    if ranks.len() != nodes as usize {
        return Err(BenchError::Ranks {
            got: ranks.len(),
            nodes,
        });
    }
    Ok(BenchResult {
        nodes,
        seconds,
        ops,
        ops_per_second: ops as f64 / seconds,
        store,
    })
}
