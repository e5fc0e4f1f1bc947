//! A node's side: join a round, learn its place, keep alive, watch for a stop, and
//! wait at the exit barrier.

use super::config::{Config, NodeInfo, Shape};
use super::coordinator::CLOSED_ERROR;
use super::kv::{Kv, KvError};
use std::time::{Duration, Instant};
use toporun_shared::colocation::NodeEnv;
use toporun_shared::torchrun::MAX_WORLD;
use toporun_shared::untrusted::{printable, valid_env};

/// This node's place in a closed round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub round: u32,
    pub node_rank: u32,
    /// Global rank of this node's local rank 0.
    pub offset: u32,
    pub world: u32,
    pub nnodes: u32,
    /// Variables the co-location decision adds to this node's ranks.
    pub env: NodeEnv,
}

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("the rendezvous at the store did not close within {0:.0?}; the node hosting it reports who is missing")]
    Timeout(Duration),
    #[error("round {round} closed with {nnodes} node(s) before this node could take part")]
    Surplus { round: u32, nnodes: u32 },
    #[error("the store holds an unusable layout for this node: {0}")]
    BadLayout(String),
    #[error("the node hosting the rendezvous refused the round: {0}")]
    Refused(String),
    #[error("node rank {rank} is already taken by {other}; this node ({me}) was given the same --node-rank: give every node its own --node-rank from 0 to --nnodes - 1")]
    DuplicateRank {
        rank: u32,
        other: String,
        me: String,
    },
}

const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Joins round `round`; `report` is called every few seconds while waiting.
pub async fn join(
    c: &mut Kv,
    cfg: &Config,
    round: u32,
    info: &NodeInfo,
    report: &mut (dyn FnMut(Duration) + Send),
) -> Result<Place, JoinError> {
    let body = serde_json::to_vec(info).unwrap_or_default();
    let prefix = cfg.key(round, "");
    let (ticket, expect_rank) = match (cfg.shape, info.node_rank) {
        (Shape::Static { .. }, Some(r)) => {
            // One node per rank: the first to claim it keeps it, a second is told
            // whose it is (a rank given twice would otherwise run twice).
            let me = format!("{} ({})", info.hostname, crate::paths::random_id());
            let holder = c
                .compare_set(&cfg.key(round, &format!("claim/{r}")), b"", me.as_bytes())
                .await?;
            if holder != me.as_bytes() {
                return Err(JoinError::DuplicateRank {
                    rank: r,
                    other: printable(&String::from_utf8_lossy(&holder)),
                    me: printable(&me),
                });
            }
            c.set(&cfg.key(round, &format!("node/{r}")), &body).await?;
            c.tally(&cfg.key(round, "join")).await?;
            (r.to_string(), Some(r))
        }
        _ => {
            let ticket = c.enroll(&prefix, &body).await?;
            // A TCPStore's ticket is the join order, which is the node rank.
            let rank = if c.is_etcd() {
                None
            } else {
                ticket.parse().ok()
            };
            (ticket, rank)
        }
    };
    let start = Instant::now();
    let deadline = cfg.join_timeout + cfg.last_call + cfg.close_timeout;
    let closed = cfg.key(round, "closed");
    loop {
        match c.wait(&[&closed], PROGRESS_EVERY).await {
            Ok(()) => break,
            Err(e) if e.is_wait_timeout() && start.elapsed() < deadline => report(start.elapsed()),
            Err(e) if e.is_wait_timeout() => return Err(JoinError::Timeout(start.elapsed())),
            Err(e) => return Err(e.into()),
        }
    }
    let layout_key = cfg.key(round, &format!("layout/{ticket}"));
    let env_key = cfg.key(round, &format!("env/{ticket}"));
    // A round closes with at least its minimum of nodes, so a TCPStore node whose join
    // order is below it has a layout: one read for all three keys (on a refusal the
    // layout reads empty and `closed` says why).
    let min = match cfg.shape {
        Shape::Static { nnodes } => nnodes,
        Shape::Elastic { min, .. } => min,
    };
    let sure = expect_rank.is_some_and(|r| r < min) && !c.is_etcd();
    let mut got = if sure {
        c.read(&[&closed, &layout_key, &env_key]).await?
    } else {
        c.read(&[&closed]).await?
    };
    let closed_text = String::from_utf8_lossy(&got[0]).into_owned();
    if let Some(why) = closed_text.strip_prefix(CLOSED_ERROR) {
        let _ = c.tally(&cfg.key(round, "refused_seen")).await;
        return Err(JoinError::Refused(printable(why)));
    }
    let nnodes: u32 = closed_text
        .parse()
        .ok()
        .filter(|n| (1..=cfg.max_nodes()).contains(n))
        .ok_or_else(|| {
            JoinError::BadLayout(format!(
                "the round closed with {:?} nodes (1 to {})",
                printable(&closed_text),
                cfg.max_nodes()
            ))
        })?;
    if !sure {
        // The coordinator wrote every layout before `closed`: a node without one
        // came too late (a TCPStore's join order tells without asking).
        let placed = match expect_rank {
            Some(r) if !c.is_etcd() => r < nnodes,
            _ => c.check(&[&layout_key]).await?,
        };
        if !placed {
            return Err(JoinError::Surplus { round, nnodes });
        }
        got = c.read(&[&closed, &layout_key, &env_key]).await?;
    }
    let raw = got.pop().unwrap_or_default();
    let place = parse_layout(
        &String::from_utf8_lossy(&got[1]),
        expect_rank,
        nnodes,
        info.nproc,
    )?;
    let env: NodeEnv = serde_json::from_slice(&raw)
        .ok()
        .filter(|e: &NodeEnv| {
            e.vars
                .iter()
                .all(|(k, v)| k.starts_with("NCCL_") && valid_env(k, v))
        })
        .ok_or_else(|| {
            JoinError::BadLayout(format!(
                "unusable co-location variables {}",
                printable(&String::from_utf8_lossy(&raw))
            ))
        })?;
    Ok(Place {
        round,
        env,
        ..place
    })
}

/// The round the job is at (`round` under the run's keys), created at 0 by the
/// first node.
pub async fn current_round(c: &mut Kv, cfg: &Config) -> Result<u32, JoinError> {
    let key = cfg.key_base("round");
    let v = c.compare_set(&key, b"", b"0").await?;
    let text = String::from_utf8_lossy(&v);
    text.parse::<u32>().map_err(|_| {
        JoinError::BadLayout(format!(
            "the run's round counter {key} holds {:?}, not a round number: another program wrote there, or two different jobs share --rdzv-id {}",
            printable(&text),
            printable(&cfg.run_id)
        ))
    })
}

/// Moves the job from round `from` to `from + 1` (if no node did yet); returns the
/// round it is at now.
pub async fn advance_round(c: &mut Kv, cfg: &Config, from: u32) -> Result<u32, JoinError> {
    let key = cfg.key_base("round");
    c.compare_set(
        &key,
        from.to_string().as_bytes(),
        (from + 1).to_string().as_bytes(),
    )
    .await?;
    current_round(c, cfg).await
}

/// Whether round `round` closed (its nodes are running or done).
pub async fn round_closed(c: &mut Kv, cfg: &Config, round: u32) -> Result<bool, JoinError> {
    Ok(c.check(&[&cfg.key(round, "closed")]).await?)
}

/// What a node that waited for the next round found.
pub enum Next {
    Round(u32),
    /// The job finished without it.
    Finished,
}

/// A node that arrived after round `round` closed: counted as waiting (the running
/// nodes admit it at their next look if the round is below its maximum size; else it
/// is a spare; in etcd it stays counted only while it keeps its lease alive), it
/// waits for the next round, or the job's end, up to the join timeout.
pub async fn wait_for_next_round(
    c: &mut Kv,
    cfg: &Config,
    round: u32,
    report: &mut (dyn FnMut(Duration) + Send),
) -> Result<Next, JoinError> {
    // Counted as waiting while alive: in etcd the count forgets a spare that dies.
    let waiting = cfg.key(round, "waiting");
    let ttl = cfg.keepalive_interval * cfg.keepalive_misses;
    c.tally_alive(&waiting, ttl, true).await?;
    let mut next_beat = Instant::now() + cfg.keepalive_interval;
    let start = Instant::now();
    let mut last = Instant::now();
    let finished = cfg.key_base("finished");
    loop {
        if Instant::now() >= next_beat {
            c.tally_alive(&waiting, ttl, false).await?;
            next_beat = Instant::now() + cfg.keepalive_interval;
        }
        let now = current_round(c, cfg).await?;
        if now > round {
            return Ok(Next::Round(now));
        }
        if c.check(&[&finished]).await? {
            return Ok(Next::Finished);
        }
        if start.elapsed() >= cfg.join_timeout {
            return Err(JoinError::Timeout(start.elapsed()));
        }
        if last.elapsed() >= PROGRESS_EVERY {
            report(start.elapsed());
            last = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// "node_rank,offset,world,nnodes" as the coordinator writes it, checked against what
/// this node knows: its join index, the round's size and its own rank count.
fn parse_layout(
    text: &str,
    expect_rank: Option<u32>,
    nnodes_closed: u32,
    nproc: u32,
) -> Result<Place, JoinError> {
    let bad = |why: &str| JoinError::BadLayout(format!("{:?}: {why}", printable(text)));
    let nums: Vec<u32> = text
        .split(',')
        .map(|x| x.parse().map_err(|_| bad("not four integers")))
        .collect::<Result<_, _>>()?;
    let [node_rank, offset, world, nnodes] = nums[..] else {
        return Err(bad("not four integers"));
    };
    if expect_rank.is_some_and(|r| r != node_rank) || node_rank >= nnodes || nnodes != nnodes_closed
    {
        return Err(bad(&format!(
            "this node joined as {} of {nnodes_closed}",
            expect_rank.map_or("a node".into(), |r| format!("node {r}"))
        )));
    }
    if u64::from(world) > MAX_WORLD || u64::from(offset) + u64::from(nproc) > u64::from(world) {
        return Err(bad(&format!(
            "this node's {nproc} ranks do not fit at offset {offset} of {world}"
        )));
    }
    Ok(Place {
        round: 0,
        node_rank,
        offset,
        world,
        nnodes,
        env: NodeEnv::default(),
    })
}

/// Asks every node to stop its ranks (first reason wins); returns the winning reason.
pub async fn request_stop(
    c: &mut Kv,
    cfg: &Config,
    round: u32,
    reason: &str,
) -> Result<String, KvError> {
    let won = c
        .compare_set(&cfg.key(round, "stop"), b"", reason.as_bytes())
        .await?;
    Ok(printable(&String::from_utf8_lossy(&won)))
}

/// Stop reasons: a rank failure counts against --max-restarts, a membership change
/// (a node lost or admitted) does not, a failure ends the job.
pub const RESTART: &str = "restart";
pub const MEMBERSHIP: &str = "membership";
pub const FAIL: &str = "fail";

/// One node's view of a running round: it beats, and a watching node (the store's
/// host; in etcd every node) also looks at the others' keep-alives and at nodes
/// waiting to join.
struct Watch {
    live: Liveness,
    next_beat: Instant,
    spares: i64,
    round: u32,
    node_rank: u32,
    nnodes: u32,
    watches: bool,
}

impl Watch {
    fn new(
        cfg: &Config,
        round: u32,
        node_rank: u32,
        nnodes: u32,
        watches: bool,
        etcd: bool,
    ) -> Watch {
        Watch {
            live: Liveness::new(nnodes, cfg, etcd),
            next_beat: Instant::now(),
            spares: 0,
            round,
            node_rank,
            nnodes,
            watches,
        }
    }

    /// Beats when due; returns a stop reason when a watched node is lost or waiting
    /// nodes can be admitted.
    async fn look(
        &mut self,
        c: &mut Kv,
        cfg: &Config,
        admit: bool,
        note: fn(&str),
    ) -> Result<Option<String>, KvError> {
        let (round, node_rank, nnodes) = (self.round, self.node_rank, self.nnodes);
        if Instant::now() < self.next_beat {
            return Ok(None);
        }
        let alive = cfg.key(round, "alive/");
        let ttl = cfg.keepalive_interval * cfg.keepalive_misses;
        c.beat(&alive, node_rank, ttl).await?;
        self.next_beat = Instant::now() + cfg.keepalive_interval;
        if !self.watches {
            return Ok(None);
        }
        let pulses = c.pulses(&alive, nnodes).await?;
        let lost: Vec<(u32, Duration)> = pulses
            .iter()
            .enumerate()
            .filter(|(r, _)| *r as u32 != node_rank)
            .filter_map(|(r, v)| self.live.observe(r as u32, *v).map(|d| (r as u32, d)))
            .collect();
        let waiting = c.tally_count(&cfg.key(round, "waiting")).await?;
        let (min, max) = cfg.nnodes();
        if !lost.is_empty() {
            let mut names = Vec::new();
            for (r, silent) in &lost {
                let name = match c.check(&[&cfg.key(round, &format!("name/{r}"))]).await? {
                    true => printable(&String::from_utf8_lossy(
                        &c.get(&cfg.key(round, &format!("name/{r}")), cfg.read_timeout)
                            .await?,
                    )),
                    false => "?".into(),
                };
                names.push(format!("node {r} ({name}) stopped sending keep-alives, last seen {:.1}s ago (dead or partitioned)", silent.as_secs_f64()));
            }
            let remain = nnodes - lost.len() as u32;
            let available = i64::from(remain) + waiting;
            return Ok(Some(if available >= i64::from(min) {
                format!("{MEMBERSHIP}: {}; the next round runs with the {remain} remaining node(s) and {waiting} waiting", names.join("; "))
            } else {
                format!("{FAIL}: {}; {remain} node(s) remain and {waiting} wait, fewer than the minimum of {min} (--nnodes): the job cannot go on until more nodes come; start the lost node again or lower --nnodes", names.join("; "))
            }));
        }
        if waiting > 0 && admit && nnodes < max {
            return Ok(Some(format!("{MEMBERSHIP}: {waiting} node(s) waiting to join a round of {nnodes} (--nnodes max {max}); restarting to admit them")));
        }
        if waiting != self.spares {
            self.spares = waiting;
            if waiting > 0 {
                note(&format!("round {round} is full ({nnodes} of --nnodes max {max}); {waiting} spare node(s) wait and join at the next round"));
            }
        }
        Ok(None)
    }
}

/// Sends keep-alives and watches for a stop request; a watching node also requests a
/// stop for a node that went silent, or to admit waiting nodes.
pub struct StopWatch {
    pub client: Kv,
    pub cfg: Config,
    pub round: u32,
    pub node_rank: u32,
    pub nnodes: u32,
    pub watches: bool,
    /// Says something worth a line (spares waiting).
    pub note: fn(&str),
}

impl StopWatch {
    /// Returns the stop reason: set by a node, by the keep-alive check, or "fail: lost
    /// the store" when the rendezvous state became unreachable.
    pub async fn run(mut self) -> String {
        let stop_key = self.cfg.key(self.round, "stop");
        let mut watch = Watch::new(
            &self.cfg,
            self.round,
            self.node_rank,
            self.nnodes,
            self.watches,
            self.client.is_etcd(),
        );
        loop {
            let step = async {
                let c = &mut self.client;
                let found = watch.look(c, &self.cfg, true, self.note).await?;
                if let Some(reason) = found {
                    return request_stop(c, &self.cfg, self.round, &reason)
                        .await
                        .map(Some);
                }
                if c.check(&[&stop_key]).await? {
                    return Ok(Some(printable(&String::from_utf8_lossy(
                        &c.get(&stop_key, Duration::from_secs(5)).await?,
                    ))));
                }
                Ok::<_, KvError>(None)
            };
            match step.await {
                Ok(Some(reason)) => return reason,
                Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => {
                    return format!(
                        "{FAIL}: lost the rendezvous state ({e}); {}",
                        if self.client.is_etcd() {
                            "etcd has lost quorum or is unreachable from this node"
                        } else {
                            "the node hosting the store has probably died"
                        }
                    )
                }
            }
        }
    }
}

/// Keep-alives a watching node reads: a node whose reading has not moved for
/// `limit` is lost; with etcd's leases, a key that vanished is lost at once.
struct Liveness {
    last: Vec<(i64, Instant)>,
    limit: Duration,
    absent_is_lost: bool,
}

impl Liveness {
    fn new(nnodes: u32, cfg: &Config, absent_is_lost: bool) -> Liveness {
        Liveness {
            last: vec![(-1, Instant::now()); nnodes as usize],
            limit: cfg.keepalive_interval * cfg.keepalive_misses,
            absent_is_lost,
        }
    }

    /// Records node `r`'s reading (-1: absent); how long it has been silent when lost.
    fn observe(&mut self, r: u32, v: i64) -> Option<Duration> {
        let slot = self.last.get_mut(r as usize)?;
        let seen_before = slot.0 != -1;
        if v != -1 && v != slot.0 {
            *slot = (v, Instant::now());
            None
        } else if slot.1.elapsed() > self.limit || (self.absent_is_lost && v == -1 && seen_before) {
            Some(slot.1.elapsed())
        } else {
            None
        }
    }
}

/// The exit barrier: waits until every node finished, or a stop arrives. Nodes keep
/// beating while they wait and watching nodes look at every beat, so a node still
/// working is waited for as long as it lives (no fixed timeout tears the state down
/// under it), and a node that died is named. A node that loses a TCPStore here has
/// finished its work (the host left after the others were done): that is no failure.
/// The store's host then lingers until every node has seen the barrier open, so its
/// store outlives their last request.
pub async fn barrier(
    c: &mut Kv,
    cfg: &Config,
    round: u32,
    node_rank: u32,
    nnodes: u32,
    watches: bool,
    is_host: bool,
) -> Result<Option<String>, KvError> {
    let result = barrier_inner(c, cfg, round, node_rank, nnodes, watches, is_host).await;
    match result {
        Err(_) if !is_host && !c.is_etcd() => Ok(None),
        r => r,
    }
}

async fn barrier_inner(
    c: &mut Kv,
    cfg: &Config,
    round: u32,
    node_rank: u32,
    nnodes: u32,
    watches: bool,
    is_host: bool,
) -> Result<Option<String>, KvError> {
    let done = cfg.key(round, "done");
    let seen = cfg.key(round, "done_seen");
    let stop = cfg.key(round, "stop");
    c.tally(&done).await?;
    let mut watch = Watch::new(cfg, round, node_rank, nnodes, watches, c.is_etcd());
    loop {
        if c.tally_count(&done).await? >= i64::from(nnodes) {
            break;
        }
        if c.check(&[&stop]).await? {
            return Ok(Some(printable(&String::from_utf8_lossy(
                &c.get(&stop, Duration::from_secs(5)).await?,
            ))));
        }
        if let Some(reason) = watch.look(c, cfg, false, |_| {}).await? {
            return request_stop(c, cfg, round, &reason).await.map(Some);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.tally(&seen).await?;
    // Spares waiting for a next round learn there is none.
    c.set(&cfg.key_base("finished"), round.to_string().as_bytes())
        .await?;
    if is_host {
        let linger = Instant::now();
        while c.tally_count(&seen).await? < i64::from(nnodes)
            && linger.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(None)
}
