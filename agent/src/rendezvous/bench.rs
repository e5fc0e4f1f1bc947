//! `toporun bench rendezvous`: N simulated nodes (async tasks, one connection each) run
//! the real join protocol against a store, to size the rendezvous host.

use super::config::{Config, NodeInfo, Shape};
use super::coordinator::coordinate;
use super::node::join;
use crate::store::{StoreClient, StoreServer};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    pub nodes: u32,
    pub seconds: f64,
    pub ops: u64,
    pub ops_per_second: f64,
    pub store: String,
}

/// Runs one round of `nodes` nodes against `endpoint` (host, port), or against an
/// in-process toporun store when None.
pub async fn bench(
    nodes: u32,
    endpoint: Option<(String, u16)>,
    timeout: Duration,
) -> Result<BenchResult, String> {
    let (host, port, store) = match endpoint {
        Some((h, p)) => (
            h.clone(),
            p,
            format!("external store at {}", crate::store::client::display(&h, p)),
        ),
        None => {
            let s = StoreServer::bind(0)
                .map_err(|e| format!("cannot start the in-process store: {e}"))?;
            (
                "127.0.0.1".to_string(),
                s.port(),
                "toporun's in-process store".to_string(),
            )
        }
    };
    let cfg = Config {
        run_id: format!("bench-{}", std::process::id()),
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
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(nodes as usize);
    for i in 0..nodes {
        let (h, cfg) = (host.clone(), cfg.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = StoreClient::connect(&h, port, timeout)
                .await
                .map_err(|e| e.to_string())?;
            let info = NodeInfo {
                hostname: format!("sim-{i}"),
                addr: format!("10.0.{}.{}", i / 250, i % 250),
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
    let mut coord = StoreClient::connect(&host, port, timeout)
        .await
        .map_err(|e| e.to_string())?;
    coordinate(&mut coord, &cfg, 0, &mut |_| {})
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
