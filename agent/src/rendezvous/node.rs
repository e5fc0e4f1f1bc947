//! A node's side: join a round, learn its place, keep alive, watch for a stop, and
//! wait at the exit barrier.

use super::backend::{Backend, Kv, KvError};
use super::config::{Config, Shape};
use super::keys::RoundKeys;
use super::node_info::NodeInfo;
use super::protocol::{Closed, Expect, Layout, StopKind, StopReason, Unreadable};
use super::spares::{silence_limit, SpareBeats};
use super::typed_key::Key;
use std::time::{Duration, Instant};
use toporun_shared::colocation::NodeEnv;
use toporun_shared::root_cause::CauseKind;
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
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
    #[error("the job stopped while this node waited for a round: {0}")]
    Stopped(StopReason),
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
    let keys = cfg.round_keys(round);
    let (ticket, expect_rank) = enter(c, cfg, &keys, info).await?;
    let start = Instant::now();
    let deadline = cfg
        .join_timeout
        .saturating_add(cfg.last_call)
        .saturating_add(cfg.close_timeout);
    let closed = keys.closed();
    loop {
        match c.wait(&[&closed], PROGRESS_EVERY).await {
            Ok(()) => break,
            Err(e) if e.is_wait_timeout() && start.elapsed() < deadline => report(start.elapsed()),
            Err(e) if e.is_wait_timeout() => return Err(JoinError::Timeout(start.elapsed())),
            Err(e) => return Err(e.into()),
        }
    }
    let (layout_key, env_key) = (keys.layout(&ticket), keys.env(&ticket));
    // A round closes with at least its minimum of nodes, so a node whose join order
    // is below it has a layout: one read for all three keys (on a refusal the layout
    // reads empty and `closed` says why).
    let sure = expect_rank.is_some_and(|r| r < cfg.min_nodes()) && c.tickets_are_join_order();
    let mut got = if sure {
        c.read(&[&closed, &layout_key, env_key.name()]).await?
    } else {
        c.read(&[&closed]).await?
    };
    let nnodes = match Closed::decode(&closed, &got[0], cfg.max_nodes())? {
        Closed::Refused(why) => {
            let _ = c.tally(&keys.refused_seen()).await;
            return Err(JoinError::Refused(why));
        }
        Closed::Nodes(n) => n,
    };
    if !sure {
        // The coordinator wrote every layout before `closed`: a node without one
        // came too late (join order tells without asking).
        let placed = match expect_rank {
            Some(r) if c.tickets_are_join_order() => r < nnodes,
            _ => c.check(&[&layout_key]).await?,
        };
        if !placed {
            return Err(JoinError::Surplus { round, nnodes });
        }
        got = c.read(&[&closed, &layout_key, env_key.name()]).await?;
    }
    let expect = Expect {
        node_rank: expect_rank,
        nnodes,
        nproc: info.nproc,
    };
    let layout = Layout::decode(&layout_key, &got[1], expect)?;
    let env = node_env(&env_key, &got[2])?;
    Ok(Place {
        round,
        node_rank: layout.node_rank,
        offset: layout.offset,
        world: layout.world,
        nnodes: layout.nnodes,
        env,
    })
}

/// Enters the round: a static node claims its rank, a c10d node takes a ticket.
/// Returns the ticket and the node rank where it is known already.
async fn enter(
    c: &mut Kv,
    cfg: &Config,
    keys: &RoundKeys,
    info: &NodeInfo,
) -> Result<(String, Option<u32>), JoinError> {
    match (cfg.shape, info.node_rank) {
        (Shape::Static { .. }, Some(r)) => {
            // One node per rank: the first to claim it keeps it, a second is told
            // whose it is (a rank given twice would otherwise run twice).
            let me = format!("{} ({})", info.hostname, crate::paths::random_id());
            let holder = c.compare_set(&keys.claim(r), b"", me.as_bytes()).await?;
            if holder != me.as_bytes() {
                return Err(JoinError::DuplicateRank {
                    rank: r,
                    other: printable(&String::from_utf8_lossy(&holder)),
                    me: printable(&me),
                });
            }
            let key = keys.node(&r.to_string());
            c.set(key.name(), &key.encode(info)).await?;
            c.tally(&keys.join()).await?;
            Ok((r.to_string(), Some(r)))
        }
        _ => {
            // The backend picks the ticket and writes the description under it.
            let nodes = keys.nodes();
            let body = nodes.encode(info);
            let ticket = c.enroll(&keys.join(), nodes.name(), &body).await?;
            // Where tickets follow the join order, the ticket is the node rank.
            let rank = if c.tickets_are_join_order() {
                ticket.parse().ok()
            } else {
                None
            };
            Ok((ticket, rank))
        }
    }
}

/// The co-location variables the coordinator gave this node: NCCL's only.
fn node_env(key: &Key<NodeEnv>, raw: &[u8]) -> Result<NodeEnv, JoinError> {
    key.decode(raw)
        .ok()
        .filter(|e| {
            e.vars
                .iter()
                .all(|(k, v)| k.starts_with("NCCL_") && valid_env(k, v))
        })
        .ok_or_else(|| {
            JoinError::BadLayout(format!(
                "unusable co-location variables {}",
                printable(&String::from_utf8_lossy(raw))
            ))
        })
}

/// The round the job is at (`round` under the run's keys), created at 0 by the
/// first node.
pub async fn current_round(c: &mut Kv, cfg: &Config) -> Result<u32, JoinError> {
    let key = cfg.keys().round_counter();
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
    let key = cfg.keys().round_counter();
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
    Ok(c.check(&[&cfg.round_keys(round).closed()]).await?)
}

/// What a node that waited for the next round found.
pub enum NextRound {
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
) -> Result<NextRound, JoinError> {
    // Counted as waiting while alive: etcd's count forgets a spare that dies, and in a
    // TCPStore its beat stops (spares.rs).
    let keys = cfg.round_keys(round);
    let waiting = keys.waiting();
    let ttl = cfg.keepalive_interval * cfg.keepalive_misses;
    let place = c.tally_alive(&waiting, ttl, None).await?;
    let mut next_beat = Instant::now() + cfg.keepalive_interval;
    let start = Instant::now();
    let mut last = Instant::now();
    let finished = cfg.keys().finished();
    let stop = keys.stop();
    loop {
        if Instant::now() >= next_beat {
            c.tally_alive(&waiting, ttl, Some(place)).await?;
            next_beat = Instant::now() + cfg.keepalive_interval;
        }
        let now = current_round(c, cfg).await?;
        if now > round {
            return Ok(NextRound::Round(now));
        }
        if c.check(&[&finished]).await? {
            return Ok(NextRound::Finished);
        }
        // A job that ends (rather than moves to the next round) ends for spares too.
        if let Some(reason) = stop_reason(c, &stop).await? {
            if reason.kind == StopKind::Fail {
                return Err(JoinError::Stopped(reason));
            }
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

/// Asks every node to stop its ranks (first reason wins); returns the winning reason.
pub async fn request_stop(
    c: &mut Kv,
    cfg: &Config,
    round: u32,
    reason: &StopReason,
) -> Result<StopReason, KvError> {
    let key = cfg.round_keys(round).stop();
    let won = c.compare_set(&key, b"", &reason.encode()).await?;
    Ok(StopReason::decode(&key, &won))
}

/// The round's stop reason, if a node asked for one.
async fn stop_reason(c: &mut Kv, key: &str) -> Result<Option<StopReason>, KvError> {
    if !c.check(&[key]).await? {
        return Ok(None);
    }
    let raw = c.read(&[key]).await?.remove(0);
    Ok(Some(StopReason::decode(key, &raw)))
}

/// One node's view of a running round: it beats, and a watching node (the store's
/// host; in etcd every node) also looks at the others' keep-alives and at nodes
/// waiting to join.
struct Watch {
    keys: RoundKeys,
    live: Liveness,
    spare_beats: SpareBeats,
    next_beat: Instant,
    spares: u64,
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
        leases: bool,
    ) -> Watch {
        Watch {
            keys: cfg.round_keys(round),
            live: Liveness::new(nnodes, cfg, leases),
            spare_beats: SpareBeats::new(silence_limit(cfg)),
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
    ) -> Result<Option<StopReason>, KvError> {
        if Instant::now() < self.next_beat {
            return Ok(None);
        }
        let alive = self.keys.alive();
        let ttl = cfg.keepalive_interval * cfg.keepalive_misses;
        c.beat(&alive, self.node_rank, ttl).await?;
        self.next_beat = Instant::now() + cfg.keepalive_interval;
        if !self.watches {
            return Ok(None);
        }
        let pulses = c.pulses(&alive, self.nnodes).await?;
        let lost: Vec<(u32, Duration)> = (0..self.nnodes)
            .zip(pulses)
            .filter(|(r, _)| *r != self.node_rank)
            .filter_map(|(r, v)| self.live.observe(r, v).map(|d| (r, d)))
            .collect();
        let waiting = self.spare_beats.alive(c, &self.keys.waiting()).await?;
        if !lost.is_empty() {
            return Ok(Some(self.lost(c, cfg, &lost, waiting).await?));
        }
        let (max, nnodes) = (cfg.max_nodes(), self.nnodes);
        if waiting > 0 && admit && nnodes < max {
            return Ok(Some(StopReason::new(StopKind::Membership, format!("{waiting} node(s) waiting to join a round of {nnodes} (--nnodes max {max}); restarting to admit them"))));
        }
        if waiting != self.spares {
            self.spares = waiting;
            if waiting > 0 {
                note(&format!("round {} is full ({nnodes} of --nnodes max {max}); {waiting} spare node(s) wait and join at the next round", self.round));
            }
        }
        Ok(None)
    }

    /// The stop for lost nodes: a membership change while enough remain, else the end.
    async fn lost(
        &self,
        c: &mut Kv,
        cfg: &Config,
        lost: &[(u32, Duration)],
        waiting: u64,
    ) -> Result<StopReason, KvError> {
        let mut names = Vec::new();
        let ranks: Vec<u32> = lost.iter().map(|(r, _)| *r).collect();
        for (r, silent) in lost {
            let key = self.keys.name(*r);
            let name = match c.check(&[&key]).await? {
                true => printable(&String::from_utf8_lossy(&c.read(&[&key]).await?.remove(0))),
                false => "?".into(),
            };
            names.push(format!("node {r} ({name}) stopped sending keep-alives, last seen {:.1}s ago (dead or partitioned)", silent.as_secs_f64()));
        }
        let lost_count = u32::try_from(lost.len()).unwrap_or(u32::MAX);
        let remain = self.nnodes.saturating_sub(lost_count);
        let min = cfg.min_nodes();
        let names = names.join("; ");
        let stop = if u64::from(remain) + waiting >= u64::from(min) {
            StopReason::new(StopKind::Membership, format!("{names}; the next round runs with the {remain} remaining node(s) and {waiting} waiting"))
        } else {
            StopReason::fail(format!("{names}; {remain} node(s) remain and {waiting} wait, fewer than the minimum of {min} (--nnodes): the job cannot go on until more nodes come; start the lost node again or lower --nnodes"))
        };
        Ok(stop.caused_by(Some(CauseKind::Peer)).losing(ranks))
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
    /// Returns the stop reason: set by a node, by the keep-alive check, or a failure
    /// when the rendezvous state became unreachable.
    pub async fn run(mut self) -> StopReason {
        let stop_key = self.cfg.round_keys(self.round).stop();
        let leases = self.client.leases();
        let mut watch = Watch::new(
            &self.cfg,
            self.round,
            self.node_rank,
            self.nnodes,
            self.watches,
            leases,
        );
        loop {
            let step = async {
                let c = &mut self.client;
                if let Some(reason) = watch.look(c, &self.cfg, true, self.note).await? {
                    return request_stop(c, &self.cfg, self.round, &reason)
                        .await
                        .map(Some);
                }
                stop_reason(c, &stop_key).await
            };
            match step.await {
                Ok(Some(reason)) => return reason,
                Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => {
                    let why = if self.client.hosted_by_a_node() {
                        "the node hosting the store has died, or this node is cut off from it"
                    } else {
                        "etcd has lost quorum or is unreachable from this node"
                    };
                    // The node (or the etcd members) holding it went away: a peer lost.
                    return StopReason::fail(format!("lost the rendezvous state ({e}); {why}"))
                        .caused_by(Some(CauseKind::Peer));
                }
            }
        }
    }
}

/// Keep-alives a watching node reads: a node whose reading has not moved for
/// `limit` is lost; with leases, a key that vanished is lost at once.
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

/// Who waits at the exit barrier.
#[derive(Debug, Clone, Copy)]
pub struct BarrierNode {
    pub node_rank: u32,
    pub nnodes: u32,
    /// Looks at the others' keep-alives while it waits.
    pub watches: bool,
    /// Hosts the store the rendezvous lives in.
    pub is_host: bool,
}

/// The exit barrier: waits until every node finished, or a stop arrives. Nodes keep
/// beating while they wait and watching nodes look at every beat, so a node still
/// working is waited for as long as it lives (no fixed timeout tears the state down
/// under it), and a node that died is named. A node that loses a store hosted by a
/// node here has finished its work (the host left after the others were done): that
/// is no failure. The store's host then lingers until every node has seen the
/// barrier open, so its store outlives their last request.
pub async fn barrier(
    c: &mut Kv,
    cfg: &Config,
    round: u32,
    me: BarrierNode,
) -> Result<Option<StopReason>, KvError> {
    let result = barrier_inner(c, cfg, round, me).await;
    match result {
        Err(_) if !me.is_host && c.hosted_by_a_node() => Ok(None),
        r => r,
    }
}

async fn barrier_inner(
    c: &mut Kv,
    cfg: &Config,
    round: u32,
    me: BarrierNode,
) -> Result<Option<StopReason>, KvError> {
    let keys = cfg.round_keys(round);
    let (done, stop) = (keys.done(), keys.stop());
    c.tally(&done).await?;
    let leases = c.leases();
    let mut watch = Watch::new(cfg, round, me.node_rank, me.nnodes, me.watches, leases);
    let everyone = u64::from(me.nnodes);
    while c.tally_count(&done).await? < everyone {
        if let Some(reason) = stop_reason(c, &stop).await? {
            return Ok(Some(reason));
        }
        if let Some(reason) = watch.look(c, cfg, false, |_| {}).await? {
            return request_stop(c, cfg, round, &reason).await.map(Some);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.tally(&keys.done_seen()).await?;
    // Spares waiting for a next round learn there is none.
    c.set(&cfg.keys().finished(), round.to_string().as_bytes())
        .await?;
    if me.is_host {
        let linger = Instant::now();
        while c.tally_count(&keys.done_seen()).await? < everyone
            && linger.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(None)
}
