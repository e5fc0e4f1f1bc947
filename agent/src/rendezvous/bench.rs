//! `toporun bench rendezvous`: N simulated nodes (async tasks, one connection each) run
//! the real join protocol against a store, to size the rendezvous host.

use super::backend::etcd_client::Etcd;
use super::backend::{Backend, EtcdKv, Kv, StoreKv};
use super::config::{Config, NodeInfo, Shape};
use super::coordinator::coordinate;
use super::node::join;
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

/// Runs one round of `nodes` simulated nodes against `target`.
pub async fn bench(nodes: u32, target: Target, timeout: Duration) -> Result<BenchResult, String> {
    let mut _in_process = None;
    let (target, store) = match target {
        Target::InProcess => {
            let s = StoreServer::bind(0)
                .map_err(|e| format!("cannot start the in-process store: {e}"))?;
            let port = s.port();
            _in_process = Some(s);
            (
                Target::Store("127.0.0.1".into(), port),
                "toporun's in-process store".to_string(),
            )
        }
        Target::Store(h, p) => {
            let what = format!("the store at {}", crate::store::client::display(&h, p));
            (Target::Store(h, p), what)
        }
        Target::Etcd(eps) => {
            let what = format!("etcd at {}", eps.join(","));
            (Target::Etcd(eps), what)
        }
    };
    let etcd = match &target {
        Target::Etcd(eps) => {
            Some(Etcd::new(eps.clone(), &Default::default(), timeout).map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    // Each simulated node connects from its own loopback address, as real nodes come
    // from their own IPs (from one address, the kernel's search for a free ephemeral
    // port among 16,000 connections costs more than the rendezvous).
    let loopback = matches!(&target, Target::Store(h, _) if h == "127.0.0.1");
    let connect = move |node: Option<u32>| {
        let etcd = etcd.clone();
        let source = node.filter(|_| loopback).map(|i| {
            let [_, a, b, c] = i.to_be_bytes();
            std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, a.saturating_add(1), b, c))
        });
        let store = match &target {
            Target::Store(h, p) => Some((h.clone(), *p)),
            _ => None,
        };
        async move {
            match (etcd, store) {
                (Some(e), _) => Ok(Kv::Etcd(EtcdKv::new(e))),
                (None, Some((h, p))) => StoreClient::connect_from(&h, p, source, timeout)
                    .await
                    .map(|c| Kv::Store(StoreKv(c)))
                    .map_err(|e| e.to_string()),
                _ => Err("no target".to_string()),
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
            let permit = gate.acquire_owned().await.map_err(|e| e.to_string())?;
            let mut c = conn.await?;
            drop(permit);
            let info = NodeInfo {
                hostname: format!("sim-{i}"),
                addr: format!("10.{}.{}.{}", i / 62500, (i / 250) % 250, i % 250),
                nproc: 8,
                gpus: 8,
                ..Default::default()
            };
            let place = join(&mut c, &cfg, 0, &info, &mut |_| {})
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((place, c.ops()))
        }));
    }
    let mut coord = connect(None).await?;
    coordinate(&mut coord, &cfg, 0, &mut |_| {}, &mut || {})
        .await
        .map_err(|e| e.to_string())?;
    let mut ops = coord.ops();
    let mut ranks = std::collections::BTreeSet::new();
    for t in tasks {
        let (place, n) = t.await.map_err(|e| e.to_string())??;
        ranks.insert(place.node_rank);
        ops += n;
    }
    let seconds = start.elapsed().as_secs_f64();
    if ranks.len() != nodes as usize {
        return Err(format!(
            "{} distinct node ranks for {nodes} nodes",
            ranks.len()
        ));
    }
    Ok(BenchResult {
        nodes,
        seconds,
        ops,
        ops_per_second: ops as f64 / seconds,
        store,
    })
}
