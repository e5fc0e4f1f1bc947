//! Hosting or joining the store, and agreeing on every node's place.

use super::{NodePlace, Prepared};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use toporun_agent::paths::{self, Root};
use toporun_agent::store::{StoreClient, StoreServer};
use toporun_agent::supervise::Events;
use toporun_shared::torchrun::endpoint;
use toporun_shared::torchrun::worker::layout;
use toporun_shared::torchrun::RdzvBackend;

/// c10d's default port.
const C10D_PORT: u16 = 29400;
/// How often a waiting node says where it stands.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What each node tells the others.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    pub node_rank: u32,
    pub hostname: String,
    pub addr: String,
    pub nproc: u32,
    pub gpus: usize,
    pub boot_id: Option<String>,
    pub ipc_ns: Option<u64>,
    pub net_ns: Option<u64>,
}

fn bind(port: u16, what: &str) -> Result<StoreServer> {
    StoreServer::bind(port).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            format!("port {port} is already in use on this node (another job, or a torchrun left behind); choose another {what} or use --standalone for a free port")
        } else {
            format!("cannot listen on port {port}: {e}")
        };
        anyhow::anyhow!(hint)
    })
}

fn random_id() -> String {
    Root::live()
        .read(paths::PROC_RANDOM_UUID)
        .unwrap_or_else(|| format!("{:x}", std::process::id()))
}

/// Returns this node's place, or None when a handled signal arrived while waiting.
pub async fn join(p: &Prepared, events: &mut Events) -> Result<Option<NodePlace>> {
    let o = &p.opts;
    let run_id = o.run_id(&random_id());
    let (host, port) = match o.rdzv_backend {
        RdzvBackend::Static => (o.master_addr.clone(), o.master_port),
        RdzvBackend::C10d => {
            let ep = endpoint::parse(&o.rdzv_endpoint)
                .map_err(toporun_shared::torchrun::OptionsError)?;
            (ep.host, ep.port.unwrap_or(C10D_PORT))
        }
    };
    if o.nnodes_max == 1 {
        let server = bind(
            port,
            if o.rdzv_backend == RdzvBackend::Static {
                "--master-port"
            } else {
                "--rdzv-endpoint port"
            },
        )?;
        let master_addr = if o.standalone {
            "localhost".to_string()
        } else {
            host
        };
        return Ok(Some(NodePlace {
            run_id,
            places: layout(&[p.nproc], 0),
            master_addr,
            master_port: server.port(),
        }));
    }
    if o.rdzv_backend == RdzvBackend::C10d {
        bail!("multi-node c10d rendezvous is not implemented in this toporun yet: use static rendezvous (--nnodes N --node-rank R --master-addr A --master-port P, or PET_* as TrainJob sets them)");
    }
    let join_timeout = o.conf_secs("join_timeout", 600.0)?;
    if o.node_rank == 0 {
        bind(port, "--master-port")?;
    }
    let start = Instant::now();
    let mut client = tokio::select! {
        c = StoreClient::connect(&host, port, join_timeout) => c.with_context(|| format!("node {} could not reach node 0's store at {}: check that {host} resolves (pod DNS), that node 0 is running (pod scheduled) and that port {port} is open", o.node_rank, endpoint::join(&host, port)))?,
        _ = wait_signal(events) => return Ok(None),
    };
    let c = &p.facts.container;
    let me = NodeInfo {
        node_rank: o.node_rank,
        hostname: c.hostname.clone(),
        addr: o.local_addr.clone().unwrap_or_else(|| c.hostname.clone()),
        nproc: p.nproc,
        gpus: p.facts.gpus.count(),
        boot_id: c.boot_id.clone(),
        ipc_ns: c.namespaces.get("ipc").map(|n| n.inode),
        net_ns: c.namespaces.get("net").map(|n| n.inode),
    };
    let key = |r: u32| format!("toporun/{run_id}/node/{r}");
    client
        .set(&key(o.node_rank), &serde_json::to_vec(&me)?)
        .await?;
    let n = o.nnodes_max;
    let keys: Vec<String> = (0..n).map(key).collect();
    let mut last_progress = Instant::now();
    loop {
        let mut missing = Vec::new();
        for (r, k) in keys.iter().enumerate() {
            if !client.check(&[k]).await? {
                missing.push(r);
            }
        }
        if missing.is_empty() {
            break;
        }
        let elapsed = start.elapsed();
        if elapsed >= join_timeout {
            bail!(
                "rendezvous {run_id} timed out after {:.0?}: node rank(s) {missing:?} never joined ({} of {n} did). Likely causes: their pods are not scheduled or crashed, {host} does not resolve for them, or port {port} is blocked between nodes",
                join_timeout,
                n as usize - missing.len()
            );
        }
        if last_progress.elapsed() >= PROGRESS_EVERY {
            eprintln!("toporun: rendezvous {run_id} (static): {}/{n} nodes joined, waiting for node rank(s) {missing:?}, {:.0}s of {:.0}s", n as usize - missing.len(), elapsed.as_secs_f64(), join_timeout.as_secs_f64());
            last_progress = Instant::now();
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = wait_signal(events) => return Ok(None),
        }
    }
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let infos: Vec<NodeInfo> = client
        .multi_get(&key_refs, join_timeout)
        .await?
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<Result<_, _>>()
        .context("a node published an unreadable description")?;
    let sizes: Vec<u32> = infos.iter().map(|i| i.nproc).collect();
    eprint!("{}", node_table(&run_id, &infos, &sizes));
    for line in colocation(&infos) {
        eprintln!("toporun: {line}");
    }
    Ok(Some(NodePlace {
        run_id,
        places: layout(&sizes, o.node_rank as usize),
        master_addr: host,
        master_port: port,
    }))
}

async fn wait_signal(events: &mut Events) {
    loop {
        if let toporun_agent::supervise::Event::Signal(_) = events.next().await {
            return;
        }
    }
}

fn node_table(run_id: &str, infos: &[NodeInfo], sizes: &[u32]) -> String {
    let mut out = format!("toporun: rendezvous {run_id} complete: {} nodes, {} ranks\n  node  hostname                 address                  ranks      GPUs\n", infos.len(), sizes.iter().sum::<u32>());
    let mut base = 0;
    for i in infos {
        out.push_str(&format!(
            "  {:<5} {:<24} {:<24} {:<10} {}\n",
            i.node_rank,
            i.hostname,
            i.addr,
            format!("{}-{}", base, base + i.nproc - 1),
            i.gpus
        ));
        base += i.nproc;
    }
    out
}

/// `rdzv.colocated`: nodes sharing a kernel (boot_id). NCCL's host hash is hostname +
/// boot_id, so nodes with different hostnames or namespaces on one host talk over the
/// network instead of NVLink/shared memory.
pub fn colocation(infos: &[NodeInfo]) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for i in infos {
        let Some(boot) = i.boot_id.as_deref() else {
            continue;
        };
        if seen.contains(&boot) {
            continue;
        }
        seen.push(boot);
        let group: Vec<&NodeInfo> = infos
            .iter()
            .filter(|j| j.boot_id.as_deref() == Some(boot))
            .collect();
        if group.len() < 2 {
            continue;
        }
        let ranks: Vec<u32> = group.iter().map(|g| g.node_rank).collect();
        let same_host = group.iter().all(|g| g.hostname == group[0].hostname);
        let same_ns = group
            .iter()
            .all(|g| g.ipc_ns == group[0].ipc_ns && g.net_ns == group[0].net_ns);
        if same_host && same_ns {
            out.push(format!("info: rdzv.colocated: node ranks {ranks:?} run on one host (boot_id {boot}) with the same hostname and namespaces: NCCL sees one host and uses P2P/SHM between them"));
        } else {
            out.push(format!(
                "warning: rdzv.colocated: node ranks {ranks:?} run on one physical host (boot_id {boot}) but {}: NCCL will take them for different hosts and send their traffic over the network (measured on 4x H200: sockets 4.6 GB/s vs NVLink 353 GB/s). Fix: one pod per node with all its GPUs (--nproc-per-node=gpu), or, where separate pods are really wanted, the same NCCL_HOSTID in each with a shared /dev/shm and hostIPC",
                if same_host { "in different namespaces" } else { "with different hostnames" }
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(r: u32, host: &str, boot: &str, ipc: u64) -> NodeInfo {
        NodeInfo {
            node_rank: r,
            hostname: host.into(),
            addr: host.into(),
            nproc: 2,
            gpus: 2,
            boot_id: Some(boot.into()),
            ipc_ns: Some(ipc),
            net_ns: Some(1),
        }
    }

    #[test]
    fn colocated_pods_warn_same_container_informs() {
        assert!(colocation(&[node(0, "a", "b1", 1), node(1, "b", "b2", 1)]).is_empty());
        let pods = colocation(&[node(0, "pod-a", "b1", 1), node(1, "pod-b", "b1", 2)]);
        assert!(
            pods[0].starts_with("warning: rdzv.colocated")
                && pods[0].contains("different hostnames")
        );
        let same = colocation(&[node(0, "h", "b1", 1), node(1, "h", "b1", 1)]);
        assert!(same[0].starts_with("info: rdzv.colocated"));
    }
}
