//! Hosting or joining the store, and every round of the job: a single node hosts its
//! own store; several nodes run the agent's rendezvous protocol (static or c10d) with
//! keep-alives, stop requests across nodes and an exit barrier.

use super::error::JobError;
use super::nccl_report::ReportStore;
use super::spec::{Job, NodePlace};
use crate::etcd::{self, Etcd};
use crate::paths;
use crate::rendezvous::{
    advance_round, barrier, coordinate, current_round, join, request_stop, round_closed,
    wait_for_next_round, Config, EtcdKv, JoinError, Kv, Next, NodeInfo, Shape, StopWatch, Waiting,
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

/// How a node's entry into the job ended.
pub enum Entered {
    Placed(NodePlace),
    /// A handled signal arrived.
    Signal,
    /// The job finished while this node waited as a spare.
    JobFinished,
}

enum Joined {
    Placed(NodePlace),
    /// The round closed before this node could take part.
    Surplus,
    Signal,
}

pub struct Session {
    run_id: String,
    store_host: String,
    port: u16,
    server: Option<StoreServer>,
    /// etcd: the workers' store this node hosts as node rank 0 of the current round.
    round_server: Option<StoreServer>,
    multi: Option<Multi>,
    /// NCCL hosts the co-location model expects from the last round (host only).
    expected_nccl_nodes: Option<u32>,
    /// The machine (boot_id) of every global rank in the last round (host only).
    rank_machines: Vec<Option<String>>,
}

struct Multi {
    cfg: Config,
    /// Hosts the rendezvous store (static and c10d).
    is_host: bool,
    client: Kv,
    info: NodeInfo,
    /// The etcd cluster, when the rendezvous lives there.
    etcd: Option<Etcd>,
}

impl Multi {
    /// Another connection to the rendezvous state (its own lease in etcd).
    async fn connect(&self, host: &str, port: u16) -> Result<Kv> {
        if let Some(e) = &self.etcd {
            return Ok(Kv::Etcd(EtcdKv::new(e.clone())));
        }
        let mut c = StoreClient::connect(host, port, Duration::from_secs(30))
            .await
            .map_err(|e| JobError::failed("connecting to the rendezvous store", e))?;
        c.set_deadline(self.cfg.read_timeout);
        Ok(Kv::Store(c))
    }

    /// Whether this node looks at the others' keep-alives: the store's host, or every
    /// node in etcd.
    fn watches(&self) -> bool {
        self.is_host || self.etcd.is_some()
    }
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

/// Connects to the rendezvous store, saying every 5 s which store it still tries.
async fn connect_store(
    run_id: &str,
    store_host: &str,
    port: u16,
    is_host: bool,
    cfg: &Config,
    events: &mut Events,
) -> Result<Option<StoreClient>> {
    let target = endpoint::join(store_host, port);
    eprintln!(
        "toporun: rendezvous {run_id} ({}): {} the store at {target}",
        if matches!(cfg.shape, Shape::Static { .. }) {
            "static"
        } else {
            "c10d"
        },
        if is_host { "hosting" } else { "joining" }
    );
    let connecting = StoreClient::connect(store_host, port, cfg.join_timeout);
    tokio::pin!(connecting);
    let started = std::time::Instant::now();
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(5),
        Duration::from_secs(5),
    );
    let mut client = loop {
        tokio::select! {
            c = &mut connecting => break c.map_err(|e| JobError::failed(format!(
                "could not reach the rendezvous store at {target} within {:.0?}: check that {store_host} resolves from this pod (DNS), that the node hosting it is running (pod scheduled?) and that port {port} is open between nodes",
                cfg.join_timeout), e))?,
            _ = tick.tick() => eprintln!("toporun: rendezvous {run_id}: still connecting to the store at {target} ({:.0}s of {:.0}s): is the node hosting it up?", started.elapsed().as_secs_f64(), cfg.join_timeout.as_secs_f64()),
            _ = until_signal(events) => return Ok(None),
        }
    };
    client.set_deadline(cfg.read_timeout);
    Ok(Some(client))
}

/// Reaches the etcd cluster (any member), saying every 5 s that it still tries;
/// gives up at the join timeout naming every endpoint.
async fn connect_etcd(
    p: &Job,
    run_id: &str,
    cfg: &Config,
    events: &mut Events,
) -> Result<Option<Etcd>> {
    let o = &p.opts;
    let conf = |k: &str| o.rdzv_conf.get(k).filter(|v| !v.is_empty()).cloned();
    let https = match conf("protocol").as_deref() {
        None | Some("http") => false,
        Some("https") => true,
        Some(other) => {
            return Err(JobError::Usage(format!(
                "--rdzv-conf protocol={}: expected http or https",
                printable(other)
            )))
        }
    };
    let endpoints = etcd::parse_endpoints(&o.rdzv_endpoint, https)
        .map_err(|e| JobError::Usage(e.to_string()))?;
    let tls = etcd::Tls {
        cacert: conf("cacert"),
        cert: conf("cert"),
        key: conf("key"),
    };
    let mut client = Etcd::new(endpoints, &tls, Duration::from_secs(5))
        .map_err(|e| JobError::Usage(e.to_string()))?;
    eprintln!(
        "toporun: rendezvous {run_id} (etcd): joining through etcd at {}",
        client.endpoints()
    );
    let started = std::time::Instant::now();
    loop {
        tokio::select! {
            r = client.ping() => match r {
                Ok(()) => break,
                Err(e @ etcd::EtcdError::Unreachable { .. }) => {
                    if started.elapsed() >= cfg.join_timeout {
                        return Err(JobError::Failed(format!(
                            "could not reach etcd within {:.0?} at {}: {e}. Check that the endpoints resolve from this pod, that etcd runs there and serves its v3 API on the client port (etcd 3.4 or later), and that the port is open",
                            cfg.join_timeout, client.endpoints()
                        )));
                    }
                    eprintln!("toporun: rendezvous {run_id}: still trying etcd at {} ({:.0}s of {:.0}s): {e}", client.endpoints(), started.elapsed().as_secs_f64(), cfg.join_timeout.as_secs_f64());
                }
                Err(e) => return Err(JobError::failed("reaching etcd", e)),
            },
            _ = until_signal(events) => return Ok(None),
        }
    }
    client.set_deadline(cfg.read_timeout);
    Ok(Some(client))
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
                round_server: None,
                multi: None,
                expected_nccl_nodes: None,
                rank_machines: Vec::new(),
            }));
        }
        let mut is_host = match o.rdzv_backend {
            RdzvBackend::Static => o.node_rank == 0,
            RdzvBackend::C10d => hosts_c10d(p, &store_host),
            RdzvBackend::Etcd => false,
        };
        let server = match (is_host, o.rdzv_backend) {
            (false, _) | (_, RdzvBackend::Etcd) => None,
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
            RdzvBackend::C10d | RdzvBackend::Etcd => Shape::Elastic {
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
        let (client, etcd) = match o.rdzv_backend {
            RdzvBackend::Etcd => match connect_etcd(p, &run_id, &cfg, events).await? {
                Some(e) => (Kv::Etcd(EtcdKv::new(e.clone())), Some(e)),
                None => return Ok(None),
            },
            _ => match connect_store(&run_id, &store_host, port, is_host, &cfg, events).await? {
                Some(c) => (Kv::Store(c), None),
                None => return Ok(None),
            },
        };
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
            round_server: None,
            expected_nccl_nodes: None,
            rank_machines: Vec::new(),
            multi: Some(Multi {
                cfg,
                is_host,
                client,
                info,
                etcd,
            }),
        }))
    }

    /// This node's place in the first round at or after `min_round` that it can
    /// take part in: a node arriving while a round runs waits for the next one (the
    /// running nodes admit it, or it waits as a spare). None when a handled signal
    /// arrived.
    pub async fn join(&mut self, p: &Job, min_round: u32, events: &mut Events) -> Result<Entered> {
        if self.multi.is_none() {
            return Ok(Entered::Placed(NodePlace {
                run_id: self.run_id.clone(),
                round: min_round,
                places: layout(&[p.nproc], 0),
                master_addr: self.store_host.clone(),
                master_port: self.port,
                node_rank: 0,
                nnodes: 1,
                extra_env: Default::default(),
            }));
        };
        let run_id = self.run_id.clone();
        let rdzv = |e: JoinError| JobError::failed(format!("rendezvous {run_id}"), e);
        let mut min_round = min_round;
        if min_round == 0 {
            let place_where = self.rendezvous_where();
            let m = self.multi.as_mut().expect("multi-node");
            let finished = m.cfg.key_base("finished");
            if m.client
                .check(&[&finished])
                .await
                .map_err(|e| rdzv(e.into()))?
            {
                return Err(JobError::Failed(format!(
                    "rendezvous {run_id} already finished: a job with this --rdzv-id completed at {}; give every job its own --rdzv-id{}",
                    place_where,
                    if m.etcd.is_some() {
                        format!(" (etcd keeps a run's keys: etcdctl del --prefix toporun/{} removes them)", printable(&run_id))
                    } else {
                        String::new()
                    }
                )));
            }
        }
        loop {
            let m = self.multi.as_mut().expect("multi-node");
            let mut round = current_round(&mut m.client, &m.cfg).await.map_err(rdzv)?;
            while round < min_round {
                round = advance_round(&mut m.client, &m.cfg, round)
                    .await
                    .map_err(rdzv)?;
            }
            let waiting = if round_closed(&mut m.client, &m.cfg, round)
                .await
                .map_err(rdzv)?
            {
                true
            } else {
                match self.join_round(p, round, events).await? {
                    Joined::Placed(node) => return Ok(Entered::Placed(node)),
                    Joined::Signal => return Ok(Entered::Signal),
                    Joined::Surplus => true,
                }
            };
            if waiting {
                let m = self.multi.as_mut().expect("multi-node");
                // Static: this node's rank is held in the running round, by a node
                // that died (this one replaces it at the next round) or by a node
                // given the same --node-rank (a mistake in the job spec).
                let holder = match m.info.node_rank {
                    Some(r) => {
                        let claim = m.cfg.key(round, &format!("claim/{r}"));
                        let held = m.client.check(&[&claim]).await.unwrap_or(false);
                        let who = if held {
                            m.client.get(&claim, m.cfg.read_timeout).await.ok()
                        } else {
                            None
                        };
                        who.map(|w| (r, printable(&String::from_utf8_lossy(&w))))
                    }
                    None => None,
                };
                match &holder {
                    Some((r, who)) => eprintln!("toporun: rendezvous {run_id}: node rank {r} is held by {who} in the running round {round}: if that node died, this one takes its place at the next round (once its keep-alives stop); if two nodes were given the same --node-rank, fix the job spec"),
                    None => eprintln!("toporun: rendezvous {run_id}: round {round} is running without this node; it waits for the next round (the running nodes admit it if the round is below --nnodes max, else it is a spare)"),
                }
                let mut report = |w: Duration| {
                    eprintln!(
                        "toporun: rendezvous {run_id}: waiting for round {} ({:.0}s)",
                        round + 1,
                        w.as_secs_f64()
                    );
                };
                let waited = wait_for_next_round(&mut m.client, &m.cfg, round, &mut report);
                tokio::pin!(waited);
                let next = tokio::select! {
                    r = &mut waited => match (r, &holder) {
                        (Ok(n), _) => n,
                        // The store went away while this node waited: the job ended
                        // (or its host died) without needing this static rank.
                        (Err(_), Some(_)) => Next::Finished,
                        (Err(e), None) => return Err(JobError::failed(format!("rendezvous {run_id}: no round this node could join"), e)),
                    },
                    _ = until_signal(events) => return Ok(Entered::Signal),
                };
                min_round = match next {
                    Next::Round(r) => r,
                    Next::Finished => match holder {
                        // A static rank the job never needed again was a duplicate.
                        Some((rank, other)) => {
                            return Err(JobError::failed(
                                format!("rendezvous {run_id}"),
                                JoinError::DuplicateRank {
                                    rank,
                                    other,
                                    me: printable(&m.info.hostname),
                                },
                            ))
                        }
                        None => return Ok(Entered::JobFinished),
                    },
                };
            }
        }
    }

    /// Joins round `round` (the coordinator runs beside on the store's host, or on
    /// the etcd node that claimed the round).
    async fn join_round(&mut self, p: &Job, round: u32, events: &mut Events) -> Result<Joined> {
        let m = self.multi.as_mut().expect("multi-node");
        let coordinates = if let Some(me) = m.client.etcd_uid().map(str::to_string) {
            m.client
                .compare_set(&m.cfg.key(round, "coordinator"), b"", me.as_bytes())
                .await
                .map_err(|e| JobError::failed("rendezvous coordinator claim", e))?
                == me.as_bytes()
        } else {
            m.is_host
        };
        let coordinator = if coordinates {
            let mut c = m.connect("127.0.0.1", self.port).await?;
            let cfg = m.cfg.clone();
            // The store's host gives each round's workers a clean store (etcd rounds
            // get a new one on node rank 0).
            let store = self.server.clone();
            Some(tokio::spawn(async move {
                let mut clear = move || {
                    if let Some(s) = &store {
                        s.forget_workers();
                    }
                };
                let mut report = |w: &Waiting| {
                    let who = if w.missing.is_empty() {
                        format!("{} more", w.expected.saturating_sub(w.joined))
                    } else {
                        format!("node rank(s) {:?}", w.missing)
                    };
                    eprintln!("toporun: rendezvous {} round {round}: {}/{} nodes joined, waiting for {who}, {:.0}s of {:.0}s", cfg.run_id, w.joined, w.expected, w.elapsed.as_secs_f64(), w.timeout.as_secs_f64());
                };
                coordinate(&mut c, &cfg, round, &mut report, &mut clear).await
            }))
        } else {
            None
        };
        let run_id = self.run_id.clone();
        // The coordinator reports progress; the others say they are waiting.
        let mut report = move |waited: Duration| {
            if !coordinates {
                eprintln!("toporun: rendezvous {run_id} round {round}: waiting for the round to close ({:.0}s)", waited.as_secs_f64());
            }
        };
        let place_where = self.rendezvous_where();
        let run_id = self.run_id.clone();
        let (joined, coordinated) = {
            let m = self.multi.as_mut().expect("multi-node");
            let joining = join(&mut m.client, &m.cfg, round, &m.info, &mut report);
            tokio::pin!(joining);
            // Poll both: this node's own join and the coordinator, which may fail (a
            // timeout naming the missing nodes) while the join still waits.
            let mut coordinator = coordinator;
            let mut coordinated = None;
            let joined = loop {
                tokio::select! {
                    r = &mut joining => break r,
                    c = async { coordinator.as_mut().expect("guarded").await }, if coordinator.is_some() && coordinated.is_none() => {
                        let c = c.map_err(|e| JobError::failed("the rendezvous coordinator", e))?;
                        if let Err(e) = &c {
                            return Err(JobError::Failed(format!("rendezvous {run_id}: {e}. Likely causes: the missing nodes' pods are not scheduled or crashed, {place_where} does not resolve for them, or its port is blocked between nodes")));
                        }
                        coordinated = Some(c);
                    }
                    _ = until_signal(events) => return Ok(Joined::Signal),
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
            (joined, coordinated)
        };
        if let Some(result) = coordinated {
            match result {
                Ok(infos) => self.coordinated(p, round, &infos),
                Err(e) => return Err(JobError::failed(format!("rendezvous {}", self.run_id), e)),
            }
        }
        let place = match joined {
            Ok(place) => place,
            Err(JoinError::Surplus { .. }) => return Ok(Joined::Surplus),
            Err(e) => {
                return Err(JobError::failed(
                    format!("joining rendezvous {}", self.run_id),
                    e,
                ))
            }
        };
        let (master_addr, master_port) = self.master(round, place.node_rank).await?;
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
        Ok(Joined::Placed(NodePlace {
            run_id: self.run_id.clone(),
            round,
            places,
            master_addr,
            master_port,
            node_rank: place.node_rank,
            nnodes: place.nnodes,
            extra_env: place.env,
        }))
    }

    /// What the coordinator learnt: the node table, the co-location findings, and
    /// what the NCCL report will expect.
    fn coordinated(&mut self, p: &Job, round: u32, infos: &[NodeInfo]) {
        eprint!("{}", node_table(&self.run_id, round, infos));
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

    /// Where the rendezvous lives, for messages.
    fn rendezvous_where(&self) -> String {
        match self.multi.as_ref().and_then(|m| m.etcd.as_ref()) {
            Some(e) => format!("etcd at {}", e.endpoints()),
            None => self.store_host.clone(),
        }
    }

    /// The workers' store for round `round`: the rendezvous store (static, c10d), or
    /// in etcd one that node rank 0 of the round starts and publishes.
    async fn master(&mut self, round: u32, node_rank: u32) -> Result<(String, u16)> {
        let m = self.multi.as_mut().expect("multi-node");
        if m.etcd.is_none() {
            return Ok((self.store_host.clone(), self.port));
        }
        let key = m.cfg.key(round, "master");
        if node_rank == 0 {
            let server = StoreServer::bind_on(0, Reach::All)
                .map_err(|e| JobError::failed("starting the workers' store", e))?;
            let addr = m.info.addr.clone();
            let port = server.port();
            self.round_server = Some(server);
            m.client
                .set(&key, endpoint::join(&addr, port).as_bytes())
                .await
                .map_err(|e| JobError::failed("publishing the workers' store", e))?;
            return Ok((addr, port));
        }
        self.round_server = None;
        let raw = m.client.get(&key, m.cfg.read_timeout).await.map_err(|e| {
            JobError::failed(
                format!("reading where node rank 0 of round {round} runs the workers' store"),
                e,
            )
        })?;
        let text = String::from_utf8_lossy(&raw);
        endpoint::parse(&text)
            .ok()
            .and_then(|ep| Some((ep.host.clone(), ep.port?)))
            .filter(|(h, _)| toporun_shared::untrusted::valid_host(h))
            .ok_or_else(|| {
                JobError::Failed(format!(
                    "round {round}: node rank 0 published an unusable store address {:?}",
                    printable(&text)
                ))
            })
    }

    /// This node's store, when it hosts one (for its counters).
    pub fn store(&self) -> Option<StoreServer> {
        self.server.clone()
    }

    /// Where this node publishes its NCCL digest (multi-node jobs only).
    pub fn report_store(&self, round: u32, node: &NodePlace) -> Option<ReportStore> {
        let m = self.multi.as_ref()?;
        // Digests meet in the workers' store (the rendezvous store, or in etcd the
        // one node rank 0 runs), which the node hosting it reads.
        Some(ReportStore {
            host: node.master_addr.clone(),
            port: node.master_port,
            prefix: m.cfg.key(round, "nccl/"),
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            is_host: if m.etcd.is_some() {
                node.node_rank == 0
            } else {
                m.is_host
            },
            expected_nccl_nodes: self.expected_nccl_nodes,
            rank_machines: self.rank_machines.clone(),
        })
    }

    /// A future that resolves when another node asks every node to stop.
    pub async fn stop_watch(&self, round: u32, node: &NodePlace) -> Result<StopFuture> {
        let Some(m) = self.multi.as_ref() else {
            return Ok(Box::pin(std::future::pending()));
        };
        let client = m.connect(&self.store_host, self.port).await?;
        let watch = StopWatch {
            client,
            cfg: m.cfg.clone(),
            round,
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            watches: m.watches(),
            note: |m| eprintln!("toporun: {m}"),
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
        let watches = m.watches();
        barrier(
            &mut m.client,
            &m.cfg,
            round,
            node.node_rank,
            node.nnodes,
            watches,
            m.is_host,
        )
        .await
        .map_err(|e| JobError::failed("the exit barrier", e))
    }

    /// Watches the agent store for the workers' TCPStore handshake ("init/" counter)
    /// and says when some workers connected but others did not: the signature of a
    /// rank hung in init_process_group.
    pub fn watch_init(&self, world: u32, grace: Duration) -> Option<tokio::task::JoinHandle<()>> {
        let server = self.server.clone().or_else(|| self.round_server.clone())?;
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
