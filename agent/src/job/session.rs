//! Hosting or joining the store, and every round of the job: a single node hosts its
//! own store; several nodes run the agent's rendezvous protocol (static or c10d) with
//! keep-alives, stop requests across nodes and an exit barrier.

use super::error::JobError;
use super::nccl_report::ReportStore;
use super::spec::{Job, NodePlace};
use crate::paths;
use crate::rendezvous::{
    barrier, coordinate, join, request_stop, Config, JoinError, NodeInfo, Shape, StopWatch, Waiting,
};
use crate::store::{Reach, StoreClient, StoreServer};
use crate::supervise::{Event, Events};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use toporun_shared::colocation;
use toporun_shared::torchrun::endpoint;
use toporun_shared::torchrun::worker::{layout, RankPlace};
use toporun_shared::torchrun::RdzvBackend;
use toporun_shared::untrusted::printable;

pub type StopFuture = Pin<Box<dyn Future<Output = String>>>;

pub struct Session {
    run_id: String,
    store_host: String,
    port: u16,
    server: Option<StoreServer>,
    multi: Option<Multi>,
    /// NCCL hosts the co-location model expects from the last round (host only).
    expected_nccl_nodes: Option<u32>,
    /// The machine (boot_id) of every global rank in the last round (host only).
    rank_machines: Vec<Option<String>>,
}

struct Multi {
    cfg: Config,
    is_host: bool,
    client: StoreClient,
    info: NodeInfo,
}

type Result<T> = std::result::Result<T, JobError>;

fn bind(port: u16, what: &str, reach: Reach) -> Result<StoreServer> {
    StoreServer::bind_on(port, reach).map_err(|e| {
        JobError::Failed(if e.kind() == std::io::ErrorKind::AddrInUse {
            format!("port {port} is already in use on this node (another job, or a torchrun left behind); choose another {what} or use --standalone for a free port")
        } else {
            format!("cannot listen on port {port}: {e}")
        })
    })
}

/// Whether this node should host the c10d store: `is_host` in --rdzv-conf, else the
/// endpoint names this node (loopback, its hostname, or one of its addresses).
fn hosts_c10d(p: &Job, host: &str) -> bool {
    if let Some(v) = p.opts.rdzv_conf.get("is_host") {
        return matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes");
    }
    let c = &p.facts.container;
    if host == "localhost" || host == c.hostname || p.opts.local_addr.as_deref() == Some(host) {
        return true;
    }
    let local: Vec<std::net::IpAddr> = p
        .facts
        .nics
        .iter()
        .flat_map(|n| n.addresses.iter().filter_map(|a| a.addr.parse().ok()))
        .collect();
    use std::net::ToSocketAddrs;
    (host, 0u16)
        .to_socket_addrs()
        .map(|mut it| it.any(|a| a.ip().is_loopback() || local.contains(&a.ip())))
        .unwrap_or(false)
}

/// `localhost` or a loopback address.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

async fn until_signal(events: &mut Events) {
    while !matches!(events.next().await, Event::Signal(_)) {}
}

impl Session {
    /// Binds or connects. None when a handled signal arrived meanwhile.
    pub async fn start(p: &Job, events: &mut Events) -> Result<Option<Session>> {
        let o = &p.opts;
        let run_id = o.run_id(&paths::random_id());
        let (store_host, port) = o.store_address();
        if o.nnodes_max == 1 {
            // Nobody outside this machine needs a one-node job's store unless the
            // user named an address others can reach.
            let reach = if is_loopback(&store_host) {
                Reach::Loopback
            } else {
                Reach::All
            };
            let server = bind(port, o.store_port_option(), reach)?;
            return Ok(Some(Session {
                run_id,
                store_host,
                port: server.port(),
                server: Some(server),
                multi: None,
                expected_nccl_nodes: None,
                rank_machines: Vec::new(),
            }));
        }
        let mut is_host = match o.rdzv_backend {
            RdzvBackend::Static => o.node_rank == 0,
            RdzvBackend::C10d => hosts_c10d(p, &store_host),
        };
        let server = match (is_host, o.rdzv_backend) {
            (false, _) => None,
            (true, RdzvBackend::Static) => Some(bind(port, o.store_port_option(), Reach::All)?),
            // Several c10d nodes on one machine all match the endpoint: the first to
            // bind hosts, the others join it (as torchrun does), unless is_host says so.
            (true, RdzvBackend::C10d) => match StoreServer::bind(port) {
                Ok(s) => Some(s),
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && !o.rdzv_conf.contains_key("is_host") =>
                {
                    is_host = false;
                    None
                }
                Err(_) => Some(bind(port, o.store_port_option(), Reach::All)?),
            },
        };
        let shape = match o.rdzv_backend {
            RdzvBackend::Static => Shape::Static {
                nnodes: o.nnodes_max,
            },
            RdzvBackend::C10d => Shape::Elastic {
                min: o.nnodes_min,
                max: o.nnodes_max,
            },
        };
        let cfg = Config {
            run_id: run_id.clone(),
            shape,
            join_timeout: o.conf_secs("join_timeout", 600.0)?,
            last_call: o.conf_secs("last_call_timeout", 30.0)?,
            close_timeout: o.conf_secs("close_timeout", 60.0)?,
            read_timeout: o.conf_secs("read_timeout", 60.0)?,
            keepalive_interval: o.conf_secs("keep_alive_interval", 5.0)?,
            keepalive_misses: o
                .rdzv_conf
                .get("keep_alive_max_attempt")
                .and_then(|v| v.parse().ok())
                .unwrap_or(3),
            colocated: p.colocated,
            key_space: o
                .rdzv_conf
                .get("token")
                .or_else(|| p.parent_env.get("TOPORUN_RDZV_TOKEN"))
                .filter(|t| !t.is_empty())
                .map(|t| crate::rendezvous::key_space(&run_id, t)),
        };
        let target = endpoint::join(&store_host, port);
        eprintln!(
            "toporun: rendezvous {run_id} ({}): {} the store at {target}",
            if matches!(shape, Shape::Static { .. }) {
                "static"
            } else {
                "c10d"
            },
            if is_host { "hosting" } else { "joining" }
        );
        // Never wait silently: say every 5 s which store this node is still trying.
        let host_for_connect = store_host.clone();
        let connecting = StoreClient::connect(&host_for_connect, port, cfg.join_timeout);
        tokio::pin!(connecting);
        let started = std::time::Instant::now();
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(5),
            Duration::from_secs(5),
        );
        let client = loop {
            tokio::select! {
                c = &mut connecting => break c.map_err(|e| JobError::failed(format!(
                    "could not reach the rendezvous store at {target} within {:.0?}: check that {store_host} resolves from this pod (DNS), that the node hosting it is running (pod scheduled?) and that port {port} is open between nodes",
                    cfg.join_timeout), e))?,
                _ = tick.tick() => eprintln!("toporun: rendezvous {run_id}: still connecting to the store at {target} ({:.0}s of {:.0}s): is the node hosting it up?", started.elapsed().as_secs_f64(), cfg.join_timeout.as_secs_f64()),
                _ = until_signal(events) => return Ok(None),
            }
        };
        let mut client = client;
        client.set_deadline(cfg.read_timeout);
        let c = &p.facts.container;
        let info = NodeInfo {
            nnodes: Some((o.nnodes_min, o.nnodes_max)),
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
            nccl: colocation::VARS
                .iter()
                .filter_map(|v| Some((v.to_string(), p.rank_value(v)?)))
                .collect(),
        };
        Ok(Some(Session {
            run_id,
            store_host,
            port,
            server,
            expected_nccl_nodes: None,
            rank_machines: Vec::new(),
            multi: Some(Multi {
                cfg,
                is_host,
                client,
                info,
            }),
        }))
    }

    /// This node's place in round `round`. None when a handled signal arrived.
    pub async fn join(
        &mut self,
        p: &Job,
        round: u32,
        events: &mut Events,
    ) -> Result<Option<NodePlace>> {
        let Some(m) = self.multi.as_mut() else {
            return Ok(Some(NodePlace {
                run_id: self.run_id.clone(),
                places: layout(&[p.nproc], 0),
                master_addr: self.store_host.clone(),
                master_port: self.port,
                node_rank: 0,
                nnodes: 1,
                extra_env: Default::default(),
            }));
        };
        let coordinator = if m.is_host {
            let mut c = StoreClient::connect("127.0.0.1", self.port, m.cfg.join_timeout)
                .await
                .map_err(|e| JobError::failed("connecting to this node's own store", e))?;
            let cfg = m.cfg.clone();
            Some(tokio::spawn(async move {
                let mut report = |w: &Waiting| {
                    let who = if w.missing.is_empty() {
                        format!("{} more", w.expected.saturating_sub(w.joined))
                    } else {
                        format!("node rank(s) {:?}", w.missing)
                    };
                    eprintln!("toporun: rendezvous {} round {round}: {}/{} nodes joined, waiting for {who}, {:.0}s of {:.0}s", cfg.run_id, w.joined, w.expected, w.elapsed.as_secs_f64(), w.timeout.as_secs_f64());
                };
                coordinate(&mut c, &cfg, round, &mut report).await
            }))
        } else {
            None
        };
        let run_id = self.run_id.clone();
        let is_host = m.is_host;
        // The host's coordinator reports progress; the others say they are waiting.
        let mut report = move |waited: Duration| {
            if !is_host {
                eprintln!("toporun: rendezvous {run_id} round {round}: waiting for the round to close at the host ({:.0}s)", waited.as_secs_f64());
            }
        };
        let joining = join(&mut m.client, &m.cfg, round, &m.info, &mut report);
        tokio::pin!(joining);
        // Poll both: this node's own join and, on the host, the coordinator, which may
        // fail (a timeout naming the missing nodes) while the join still waits.
        let mut coordinator = coordinator;
        let mut coordinated = None;
        let joined = loop {
            tokio::select! {
                r = &mut joining => break r,
                c = async { coordinator.as_mut().expect("guarded").await }, if coordinator.is_some() && coordinated.is_none() => {
                    let c = c.map_err(|e| JobError::failed("the rendezvous coordinator", e))?;
                    if let Err(e) = &c {
                        return Err(JobError::Failed(format!("rendezvous {}: {e}. Likely causes: the missing nodes' pods are not scheduled or crashed, {} does not resolve for them, or port {} is blocked between nodes", self.run_id, self.store_host, self.port)));
                    }
                    coordinated = Some(c);
                }
                _ = until_signal(events) => return Ok(None),
            }
        };
        if coordinated.is_none() {
            if let Some(task) = coordinator {
                coordinated = Some(
                    task.await
                        .map_err(|e| JobError::failed("the rendezvous coordinator", e))?,
                );
            }
        }
        if let Some(result) = coordinated {
            match result {
                Ok(infos) => {
                    eprint!("{}", node_table(&self.run_id, round, &infos));
                    let views: Vec<_> = infos.iter().map(NodeInfo::colocation).collect();
                    let decision = colocation::decide(&views, p.colocated);
                    self.expected_nccl_nodes = Some(colocation::nccl_hosts(&views, &decision.env));
                    self.rank_machines = infos
                        .iter()
                        .flat_map(|i| std::iter::repeat_n(i.boot_id.clone(), i.nproc as usize))
                        .collect();
                    for f in decision.findings {
                        eprintln!(
                            "toporun: {}: {}: {}{}",
                            f.severity,
                            f.id,
                            f.summary,
                            f.remedy.map(|r| format!(". Fix: {r}")).unwrap_or_default()
                        );
                    }
                }
                Err(e) => return Err(JobError::failed(format!("rendezvous {}", self.run_id), e)),
            }
        }
        let place = match joined {
            Ok(place) => place,
            Err(e @ JoinError::Surplus { .. }) => {
                return Err(JobError::Failed(format!(
                    "{e}; more nodes joined than --nnodes allows: this node is not needed"
                )))
            }
            Err(e) => {
                return Err(JobError::failed(
                    format!("joining rendezvous {}", self.run_id),
                    e,
                ))
            }
        };
        eprintln!(
            "toporun: round {round}: this node is node rank {} of {}, global ranks {}-{} of {}",
            place.node_rank,
            place.nnodes,
            place.offset,
            place.offset + p.nproc - 1,
            place.world
        );
        let places = (0..p.nproc)
            .map(|l| RankPlace {
                local_rank: l,
                rank: place.offset + l,
                group_rank: place.node_rank,
                local_world_size: p.nproc,
                world_size: place.world,
                group_world_size: place.nnodes,
            })
            .collect();
        Ok(Some(NodePlace {
            run_id: self.run_id.clone(),
            places,
            master_addr: self.store_host.clone(),
            master_port: self.port,
            node_rank: place.node_rank,
            nnodes: place.nnodes,
            extra_env: place.env,
        }))
    }

    /// This node's store, when it hosts one (for its counters).
    pub fn store(&self) -> Option<StoreServer> {
        self.server.clone()
    }

    /// Where this node publishes its NCCL digest (multi-node jobs only).
    pub fn report_store(&self, round: u32, node: &NodePlace) -> Option<ReportStore> {
        let m = self.multi.as_ref()?;
        Some(ReportStore {
            host: self.store_host.clone(),
            port: self.port,
            prefix: m.cfg.key(round, "nccl/"),
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            is_host: m.is_host,
            expected_nccl_nodes: self.expected_nccl_nodes,
            rank_machines: self.rank_machines.clone(),
        })
    }

    /// A future that resolves when another node asks every node to stop.
    pub async fn stop_watch(&self, round: u32, node: &NodePlace) -> Result<StopFuture> {
        let Some(m) = self.multi.as_ref() else {
            return Ok(Box::pin(std::future::pending()));
        };
        let mut client = StoreClient::connect(&self.store_host, self.port, Duration::from_secs(30))
            .await
            .map_err(|e| JobError::failed("connecting the stop watch to the store", e))?;
        client.set_deadline(m.cfg.read_timeout);
        let watch = StopWatch {
            client,
            cfg: m.cfg.clone(),
            round,
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            is_host: m.is_host,
        };
        Ok(Box::pin(watch.run()))
    }

    /// Tells every node to stop (first reason wins); returns the reason that won.
    pub async fn stop_all(&mut self, round: u32, reason: &str) -> String {
        match self.multi.as_mut() {
            Some(m) => request_stop(&mut m.client, &m.cfg, round, reason)
                .await
                .unwrap_or_else(|_| reason.to_string()),
            None => reason.to_string(),
        }
    }

    /// The exit barrier; None when every node finished.
    pub async fn finish(&mut self, round: u32, node: &NodePlace) -> Result<Option<String>> {
        let Some(m) = self.multi.as_mut() else {
            return Ok(None);
        };
        eprintln!("toporun: this node's ranks finished; waiting for the other nodes (as long as they are alive)");
        barrier(
            &mut m.client,
            &m.cfg,
            round,
            node.node_rank,
            node.nnodes,
            m.is_host,
        )
        .await
        .map_err(|e| JobError::failed("the exit barrier", e))
    }

    /// Watches the agent store for the workers' TCPStore handshake ("init/" counter)
    /// and says when some workers connected but others did not: the signature of a
    /// rank hung in init_process_group.
    pub fn watch_init(&self, world: u32, grace: Duration) -> Option<tokio::task::JoinHandle<()>> {
        let server = self.server.clone()?;
        let count = move || {
            server
                .get(b"init/")
                .and_then(|v| String::from_utf8_lossy(&v).parse::<u32>().ok())
                .unwrap_or(0)
        };
        let base = count();
        Some(tokio::spawn(async move {
            let mut waited = Duration::ZERO;
            loop {
                tokio::time::sleep(grace).await;
                waited += grace;
                let n = count().saturating_sub(base);
                if n >= world {
                    return;
                }
                if n > 0 {
                    eprintln!("toporun: warning: only {n} of {world} workers have connected to the store after {:.0?}: the others are hung before or in init_process_group (crashed early, wrong MASTER_ADDR/MASTER_PORT, or blocked on a GPU); check their output", waited);
                }
            }
        }))
    }
}

fn node_table(run_id: &str, round: u32, infos: &[NodeInfo]) -> String {
    let total: u32 = infos.iter().map(|i| i.nproc).sum();
    let mut out = format!(
        "toporun: rendezvous {run_id} round {round} complete: {} nodes, {total} ranks\n",
        infos.len()
    );
    if infos.len() > 64 {
        return out;
    }
    out.push_str("  node  hostname                 address                  ranks      GPUs\n");
    let mut base = 0;
    for (i, n) in infos.iter().enumerate() {
        out.push_str(&format!(
            "  {:<5} {:<24} {:<24} {:<10} {}\n",
            i,
            printable(&n.hostname),
            printable(&n.addr),
            format!("{}-{}", base, base + n.nproc.max(1) - 1),
            n.gpus
        ));
        base += n.nproc;
    }
    out
}
