//! A node of a multi-node job: its connection to the rendezvous state (a store one
//! node hosts, or etcd), what it tells the others, and what it does each round
//! besides joining (`multi_node_join`): the workers' store, stop requests, the
//! NCCL report's place and the exit barrier.

use crate::job::entry::{Entered, StopFuture};
use crate::job::error::JobError;
use crate::job::nccl_report::ReportStore;
use crate::job::session::meeting::Meeting;
use crate::job::session::node_session::Session;
use crate::job::session::node_table::node_table;
use crate::job::session::rdzv_connect::{connect_etcd, connect_store};
use crate::job::session::rdzv_state::RdzvState;
use crate::job::session::store_host::{bind, bind_c10d, endpoint_is_here};
use crate::job::spec::{Job, NodePlace};
use crate::network_check::torch_path::TorchProbe;
use crate::rendezvous::{
    barrier, key_space, request_stop, Backend, BarrierNode, Config, EtcdKv, Key, Kv, NodeInfo,
    NodeMachine, Shape, StopReason, StopWatch, StoreKv,
};
use crate::store::{Reach, StoreServer};
use crate::supervise::Events;
use std::time::Duration;
use toporun_shared::colocation;
use toporun_shared::root_cause::peer::{names_a_node, nodes_at, NodeAddrs, MAX_ADDRS};
use toporun_shared::torchrun::{endpoint, RdzvBackend};
use toporun_shared::untrusted::{printable, valid_host};

type Result<T> = std::result::Result<T, JobError>;

/// Beyond the keep-alive timeout, for the watching node to notice and write the stop.
const HOLD_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The least a keep-alive may wait for a node-hosted store before this node counts
/// itself cut off: a loaded host answers late, not never.
const CUT_OFF_FLOOR: std::time::Duration = std::time::Duration::from_secs(10);

/// How long reading the round's table of nodes may take at a rank's failure.
const PEERS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a node's word that it saw a stop may take.
const STOP_SEEN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest the store's host waits for the other nodes to see a stop.
const LINGER: std::time::Duration = std::time::Duration::from_secs(5);

pub struct MultiNode {
    pub(super) run_id: String,
    /// Where the rendezvous state lives.
    pub(super) state: RdzvState,
    /// The rendezvous store this node hosts (static, c10d).
    pub(super) server: Option<StoreServer>,
    /// etcd: the workers' store this node hosts as node rank 0 of the current round.
    pub(super) round_server: Option<StoreServer>,
    pub(super) cfg: Config,
    pub(super) client: Kv,
    pub(super) info: NodeInfo,
    /// NCCL hosts the co-location model expects from the last round (host only).
    expected_nccl_nodes: Option<u32>,
    /// The machine (boot_id) of every global rank in the last round (host only).
    rank_machines: Vec<Option<String>>,
    /// Every node's name and addresses in the round it coordinated, in node-rank
    /// order (empty where another node coordinated: read from the store then).
    pub(super) nodes: Vec<NodeAddrs>,
    /// The network check's torch probe, started before the round closes so that
    /// importing torch overlaps the rendezvous.
    pub(super) torch_probe: Option<TorchProbe>,
}

fn config(p: &Job, run_id: &str) -> Config {
    let o = &p.opts;
    let conf = &o.rdzv_conf;
    let shape = match o.rdzv_backend {
        RdzvBackend::Static => Shape::Static {
            nnodes: o.nnodes_max,
        },
        RdzvBackend::C10d | RdzvBackend::Etcd => Shape::Elastic {
            min: o.nnodes_min,
            max: o.nnodes_max,
        },
    };
    let token = conf
        .token
        .as_ref()
        .or(p.rdzv.token.as_ref())
        .filter(|t| !t.is_empty());
    Config {
        run_id: run_id.to_string(),
        shape,
        join_timeout: conf.join_timeout,
        last_call: conf.last_call_timeout,
        close_timeout: conf.close_timeout,
        read_timeout: conf.read_timeout,
        keepalive_interval: conf.keep_alive_interval,
        keepalive_misses: conf.keep_alive_max_attempt,
        colocated: p.rdzv.colocated,
        key_space: token.map(|t| key_space(run_id, t)),
    }
}

/// This node's interfaces' addresses that can name it to its peers.
fn interface_addrs(p: &Job) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let all = p.facts.nics.iter().flat_map(|n| &n.addresses);
    for a in all.filter(|a| names_a_node(&a.addr)) {
        if !out.contains(&a.addr) && out.len() < MAX_ADDRS {
            out.push(a.addr.clone());
        }
    }
    out
}

/// What this node tells the others.
fn node_info(p: &Job, shape: Shape) -> NodeInfo {
    let (o, c) = (&p.opts, &p.facts.container);
    NodeInfo {
        nnodes: Some((o.nnodes_min, o.nnodes_max)),
        network_check: Some(p.rdzv.network_check),
        node_rank: matches!(shape, Shape::Static { .. }).then_some(o.node_rank),
        hostname: c.hostname.clone(),
        addr: o.local_addr.clone().unwrap_or_else(|| c.hostname.clone()),
        nproc: p.nproc,
        gpus: p.facts.gpus.count(),
        boot_id: c.boot_id.clone(),
        ipc_ns: c.namespaces.get("ipc").map(|n| n.inode),
        net_ns: c.namespaces.get("net").map(|n| n.inode),
        shm_dev: c.shm.as_ref().and_then(|s| s.dev),
        gpu_nodes: p
            .facts
            .gpus
            .device_nodes
            .iter()
            .filter(|d| d.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok())
            .cloned()
            .collect(),
        ips: interface_addrs(p),
        nccl: colocation::VARS
            .iter()
            .filter_map(|v| Some((v.to_string(), p.rank_value(v)?)))
            .collect(),
    }
}

/// Hosts the rendezvous store where this node should; returns the server, if any.
async fn host_store(p: &Job, store_host: &str, port: u16) -> Result<Option<StoreServer>> {
    let o = &p.opts;
    match o.rdzv_backend {
        RdzvBackend::Etcd => Ok(None),
        RdzvBackend::Static if o.node_rank == 0 => bind(p, port, Reach::All).map(Some),
        RdzvBackend::Static => Ok(None),
        RdzvBackend::C10d => {
            let here = match o.rdzv_conf.is_host {
                Some(is_host) => is_host,
                None => endpoint_is_here(p, store_host).await,
            };
            if !here {
                return Ok(None);
            }
            bind_c10d(p, port, &endpoint::join(store_host, port))
        }
    }
}

impl MultiNode {
    /// Hosts or connects. None when a handled signal arrived meanwhile.
    pub async fn start(p: &Job, run_id: String, events: &mut Events) -> Result<Option<MultiNode>> {
        let (store_host, port) = p.opts.store_address();
        let server = host_store(p, &store_host, port).await?;
        let is_host = server.is_some();
        let cfg = config(p, &run_id);
        let (client, state) = if p.opts.rdzv_backend == RdzvBackend::Etcd {
            match connect_etcd(p, &cfg, events).await? {
                Some(e) => (Kv::Etcd(EtcdKv::new(e.clone())), RdzvState::Etcd(e)),
                None => return Ok(None),
            }
        } else {
            match connect_store(&store_host, port, is_host, &cfg, events).await? {
                Some(c) => {
                    let (host, hosted) = (store_host, is_host);
                    (
                        Kv::Store(StoreKv(c)),
                        RdzvState::Store { host, port, hosted },
                    )
                }
                None => return Ok(None),
            }
        };
        let info = node_info(p, cfg.shape);
        Ok(Some(MultiNode {
            run_id,
            state,
            server,
            round_server: None,
            cfg,
            client,
            info,
            expected_nccl_nodes: None,
            rank_machines: Vec::new(),
            torch_probe: None,
            nodes: Vec::new(),
        }))
    }

    /// What the coordinator learnt: the node table, the co-location findings, and
    /// what the NCCL report will expect.
    pub(super) fn coordinated(&mut self, p: &Job, round: u32, infos: &[NodeInfo]) {
        crate::console::say_raw!("{}", node_table(&self.run_id, round, infos));
        let views: Vec<_> = infos.iter().map(NodeInfo::colocation).collect();
        let decision = colocation::decide(&views, p.rdzv.colocated);
        self.expected_nccl_nodes = Some(colocation::nccl_hosts(&views, &decision.env));
        self.nodes = infos.iter().map(NodeInfo::addrs).collect();
        let machines: Vec<_> = infos.iter().map(NodeInfo::machine).collect();
        let world = machines
            .iter()
            .fold(0, |w: u32, m| w.saturating_add(m.nproc));
        self.rank_machines = NodeMachine::per_rank(&machines, world);
        for f in decision.findings {
            let fix = f.remedy.map(|r| format!(". Fix: {r}")).unwrap_or_default();
            crate::console::say!("toporun: {}: {}: {}{fix}", f.severity, f.id, f.summary);
        }
    }

    /// The workers' store for round `round`: the rendezvous store (static, c10d), or
    /// in etcd one that node rank 0 of the round starts and publishes.
    pub(super) async fn master(&mut self, round: u32, node_rank: u32) -> Result<(String, u16)> {
        if let Some(fixed) = self.state.fixed_workers_store() {
            return Ok(fixed);
        }
        let key = self.cfg.round_keys(round).master();
        if node_rank == 0 {
            let server = StoreServer::bind_on(0, Reach::All)
                .map_err(|e| JobError::failed("starting the workers' store", e))?;
            let (addr, port) = (self.info.addr.clone(), server.port());
            self.round_server = Some(server);
            self.client
                .set(&key, endpoint::join(&addr, port).as_bytes())
                .await
                .map_err(|e| JobError::failed("publishing the workers' store", e))?;
            return Ok((addr, port));
        }
        self.round_server = None;
        let raw = self
            .client
            .get(&key, self.cfg.read_timeout)
            .await
            .map_err(|e| {
                let what =
                    format!("reading where node rank 0 of round {round} runs the workers' store");
                JobError::failed(what, e)
            })?;
        let text = String::from_utf8_lossy(&raw);
        endpoint::parse(&text)
            .ok()
            .and_then(|ep| Some((ep.host.clone(), ep.port?)))
            .filter(|(h, _)| valid_host(h))
            .ok_or_else(|| {
                JobError::Failed(format!(
                    "round {round}: node rank 0 published an unusable store address {:?}",
                    printable(&text)
                ))
            })
    }
}

impl Session for MultiNode {
    fn store(&self) -> Option<StoreServer> {
        self.server.clone()
    }

    fn workers_store(&self) -> Option<StoreServer> {
        self.server.clone().or_else(|| self.round_server.clone())
    }

    fn has_peers(&self) -> bool {
        true
    }

    async fn join(&mut self, p: &Job, min_round: u32, events: &mut Events) -> Result<Entered> {
        self.join_first(p, min_round, events).await
    }

    /// Where this node publishes its NCCL digest.
    fn report_store(&self, round: u32, node: &NodePlace) -> Option<ReportStore> {
        // Digests meet in the workers' store (the rendezvous store, or in etcd the
        // one node rank 0 runs), which the node hosting it reads.
        Some(ReportStore {
            host: node.master_addr.clone(),
            port: node.master_port,
            keys: self.cfg.round_keys(round),
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            is_host: self.state.hosts_workers_store(node.node_rank),
            expected_nccl_nodes: self.expected_nccl_nodes,
            rank_machines: self.rank_machines.clone(),
        })
    }

    /// Where this node meets the others after the rendezvous: as the NCCL digests,
    /// in the workers' store, decided by the node that hosts it.
    fn meeting(&self, round: u32, node: &NodePlace) -> Option<Meeting> {
        let r = self.report_store(round, node)?;
        Some(Meeting {
            host: r.host,
            port: r.port,
            keys: self.cfg.round_keys(round),
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            decides: r.is_host,
        })
    }

    /// A future that resolves when another node asks every node to stop.
    async fn stop_watch(&self, round: u32, node: &NodePlace) -> Result<StopFuture> {
        let mut client = self.state.connect(&self.cfg).await?;
        if let Kv::Store(StoreKv(c)) = &mut client {
            c.set_deadline(self.cut_off_after());
        }
        let watch = StopWatch {
            client,
            cfg: self.cfg.clone(),
            round,
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            watches: self.state.watches(),
            note: |m| crate::console::say!("toporun: {m}"),
        };
        Ok(Box::pin(watch.run()))
    }

    /// Tells every node to stop (first reason wins); returns the reason that won.
    async fn stop_all(&mut self, round: u32, reason: StopReason) -> StopReason {
        match request_stop(&mut self.client, &self.cfg, round, &reason).await {
            Ok(won) => {
                self.stop_seen(round).await;
                won
            }
            // The store is gone or frozen: nobody waits for this node's word.
            Err(_) => reason,
        }
    }

    /// A channel whose first stop reason goes to every node at once, on a connection of
    /// its own made now (a preemption is announced the moment the signal arrives,
    /// while this node's ranks are still being stopped).
    async fn announcer(
        &self,
        round: u32,
    ) -> Option<tokio::sync::mpsc::UnboundedSender<StopReason>> {
        let mut client = self.state.connect(&self.cfg).await.ok()?;
        let cfg = self.cfg.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<StopReason>();
        tokio::spawn(async move {
            if let Some(reason) = rx.recv().await {
                let _ = request_stop(&mut client, &cfg, round, &reason).await;
            }
        });
        Some(tx)
    }

    /// Tells the store's host that this node is done with a stopped round's keys
    /// (best effort): it waits for every node's word before it leaves.
    async fn stop_seen(&mut self, round: u32) {
        if !self.state.hosted_here() {
            let seen = self.cfg.round_keys(round).stop_seen();
            // A store cut off answers no more: not worth another read timeout.
            let _ = tokio::time::timeout(STOP_SEEN_WAIT, self.client.tally(&seen)).await;
        }
    }

    /// The nodes of round `round` at a peer's address, named: from the table where
    /// this node coordinated the round, else as the coordinator published it.
    async fn nodes_at(&self, round: u32, peer: &str) -> Vec<String> {
        let table = match self.nodes.is_empty() {
            true => self.published_nodes(round).await,
            false => self.nodes.clone(),
        };
        nodes_at(peer, &table)
            .into_iter()
            .filter_map(|n| Some(format!("node {n} ({})", table.get(n as usize)?.name)))
            .collect()
    }

    /// A rank failed as a peer went away: watches (keep-alives, leases) for as long as
    /// a lost node takes to be declared; the stop that came, if one did.
    async fn hold_for_peer(&self, node: &NodePlace) -> Option<StopReason> {
        let limit = self.cfg.keepalive_interval * self.cfg.keepalive_misses + HOLD_MARGIN;
        let watch = self.stop_watch(node.round, node).await.ok()?;
        tokio::time::timeout(limit, watch).await.ok()
    }

    /// Before this node leaves a stopped job: where it hosts the store the others
    /// watch, it waits (at most a few seconds) until they have seen the stop, so they
    /// act on its reason instead of on a store gone.
    async fn linger(&mut self, node: &NodePlace, lost: usize) {
        if !self.state.hosted_here() {
            return;
        }
        let nnodes = node.nnodes;
        let seen = self.cfg.round_keys(node.round).stop_seen();
        let start = std::time::Instant::now();
        while start.elapsed() < LINGER {
            match self.client.tally_count(&seen).await {
                // Every node but this one (which never counts itself) and the lost.
                Ok(n) if n + 1 + lost as u64 >= u64::from(nnodes) => return,
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                Err(_) => return,
            }
        }
    }

    /// The exit barrier; None when every node finished.
    async fn finish(&mut self, round: u32, node: &NodePlace) -> Result<Option<StopReason>> {
        crate::console::say!("toporun: this node's ranks finished; waiting for the other nodes (as long as they are alive)");
        let me = BarrierNode {
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            watches: self.state.watches(),
            is_host: self.state.hosted_here(),
        };
        barrier(&mut self.client, &self.cfg, round, me)
            .await
            .map_err(|e| JobError::failed("the exit barrier", e))
    }
}

impl MultiNode {
    /// How long a keep-alive may go unanswered by a node-hosted store: as long as
    /// that host waits before it counts this node lost (it has, by then), not the
    /// read timeout, so a node cut off from it says so in seconds, not a minute.
    fn cut_off_after(&self) -> Duration {
        let limit = self.cfg.keepalive_interval * self.cfg.keepalive_misses + HOLD_MARGIN;
        limit.max(CUT_OFF_FLOOR).min(self.cfg.read_timeout)
    }

    /// The round's table of nodes as its coordinator published it; empty where the
    /// rendezvous state does not answer at once (it may have gone with the peer).
    async fn published_nodes(&self, round: u32) -> Vec<NodeAddrs> {
        self.published(self.cfg.round_keys(round).peers()).await
    }

    /// Where another node coordinated the round: each of its `world` ranks' machine
    /// as the coordinator published it (empty where it cannot be read at once).
    pub(super) async fn learn_machines(&mut self, round: u32, world: u32) {
        let nodes = self.published(self.cfg.round_keys(round).machines()).await;
        self.rank_machines = NodeMachine::per_rank(&nodes, world);
    }

    /// A value the round's coordinator published; the default where the rendezvous
    /// state does not answer within [`PEERS_WAIT`].
    async fn published<T: serde::de::DeserializeOwned + Default>(&self, key: Key<T>) -> T {
        let read = async {
            let mut c = self.state.connect(&self.cfg).await.ok()?;
            if !c.check(&[key.name()]).await.ok()? {
                return None;
            }
            let raw = c.read(&[key.name()]).await.ok()?.pop()?;
            key.decode_or_warn(&raw)
        };
        let value = tokio::time::timeout(PEERS_WAIT, read).await.ok().flatten();
        value.unwrap_or_default()
    }
}
