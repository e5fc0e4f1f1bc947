//! A node's side: join a round, learn its place, keep alive, watch for a stop, and
//! wait at the exit barrier.

use super::config::{Config, NodeInfo, Shape};
use super::coordinator::CLOSED_ERROR;
use crate::store::{StoreClient, StoreError};
use std::time::{Duration, Instant};
use toporun_shared::colocation::NodeEnv;
use toporun_shared::torchrun::{MAX_NODES, MAX_WORLD};
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
    Store(#[from] StoreError),
    #[error("the rendezvous at the store did not close within {0:.0?}; the node hosting it reports who is missing")]
    Timeout(Duration),
    #[error("round {round} closed with {nnodes} node(s) before this node (join #{idx}) could take part; it waits for the next round")]
    Surplus { round: u32, idx: u32, nnodes: u32 },
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
    c: &mut StoreClient,
    cfg: &Config,
    round: u32,
    info: &NodeInfo,
    report: &mut (dyn FnMut(Duration) + Send),
) -> Result<Place, JoinError> {
    let body = serde_json::to_vec(info).unwrap_or_default();
    let idx = match (cfg.shape, info.node_rank) {
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
            c.add(&cfg.key(round, "join"), 1).await?;
            r
        }
        _ => {
            let n = c.add(&cfg.key(round, "join"), 1).await?;
            let idx = u32::try_from(n - 1)
                .ok()
                .filter(|i| *i < MAX_NODES)
                .ok_or_else(|| JoinError::BadLayout(format!("join counter at {n}")))?;
            c.set(&cfg.key(round, &format!("node/{idx}")), &body)
                .await?;
            idx
        }
    };
    let start = Instant::now();
    let deadline = cfg.join_timeout + cfg.last_call + cfg.close_timeout;
    let closed = cfg.key(round, "closed");
    loop {
        match c.wait(&[&closed], PROGRESS_EVERY).await {
            Ok(()) => break,
            Err(StoreError::WaitTimeout(..)) if start.elapsed() < deadline => {
                report(start.elapsed())
            }
            Err(StoreError::WaitTimeout(..)) => return Err(JoinError::Timeout(start.elapsed())),
            Err(e) => return Err(e.into()),
        }
    }
    let closed_text =
        String::from_utf8_lossy(&c.get(&closed, cfg.read_timeout).await?).into_owned();
    if let Some(why) = closed_text.strip_prefix(CLOSED_ERROR) {
        let _ = c.add(&cfg.key(round, "refused_seen"), 1).await;
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
    if idx >= nnodes {
        return Err(JoinError::Surplus { round, idx, nnodes });
    }
    let raw = c
        .get(&cfg.key(round, &format!("layout/{idx}")), cfg.read_timeout)
        .await?;
    let place = parse_layout(&String::from_utf8_lossy(&raw), idx, nnodes, info.nproc)?;
    let raw = c
        .get(&cfg.key(round, &format!("env/{idx}")), cfg.read_timeout)
        .await?;
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

/// "node_rank,offset,world,nnodes" as the coordinator writes it, checked against what
/// this node knows: its join index, the round's size and its own rank count.
fn parse_layout(text: &str, idx: u32, nnodes_closed: u32, nproc: u32) -> Result<Place, JoinError> {
    let bad = |why: &str| JoinError::BadLayout(format!("{:?}: {why}", printable(text)));
    let nums: Vec<u32> = text
        .split(',')
        .map(|x| x.parse().map_err(|_| bad("not four integers")))
        .collect::<Result<_, _>>()?;
    let [node_rank, offset, world, nnodes] = nums[..] else {
        return Err(bad("not four integers"));
    };
    if node_rank != idx || nnodes != nnodes_closed {
        return Err(bad(&format!(
            "this node joined as {idx} of {nnodes_closed}"
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
    c: &mut StoreClient,
    cfg: &Config,
    round: u32,
    reason: &str,
) -> Result<String, StoreError> {
    let won = c
        .compare_set(&cfg.key(round, "stop"), b"", reason.as_bytes())
        .await?;
    Ok(printable(&String::from_utf8_lossy(&won)))
}

/// Sends keep-alives and watches for a stop request; the host also watches the other
/// nodes' keep-alives and requests a stop for a node that went silent.
pub struct StopWatch {
    pub client: StoreClient,
    pub cfg: Config,
    pub round: u32,
    pub node_rank: u32,
    pub nnodes: u32,
    pub is_host: bool,
}

impl StopWatch {
    /// Returns the stop reason: set by a node, by the keep-alive check, or "fail: lost
    /// the store" when the store went away (its host died).
    pub async fn run(mut self) -> String {
        let stop_key = self.cfg.key(self.round, "stop");
        let alive_key = |r: u32| self.cfg.key(self.round, &format!("alive/{r}"));
        let mut live = Liveness::new(self.nnodes, &self.cfg);
        let mut next_beat = Instant::now();
        loop {
            let step = async {
                if Instant::now() >= next_beat {
                    self.client.add(&alive_key(self.node_rank), 1).await?;
                    next_beat = Instant::now() + self.cfg.keepalive_interval;
                    if self.is_host {
                        for r in 0..self.nnodes {
                            let v = self.client.add(&alive_key(r), 0).await?;
                            if let Some(reason) = live.observe(r, v) {
                                return request_stop(
                                    &mut self.client,
                                    &self.cfg,
                                    self.round,
                                    &reason,
                                )
                                .await
                                .map(Some);
                            }
                        }
                    }
                }
                if self.client.check(&[&stop_key]).await? {
                    return Ok(Some(printable(&String::from_utf8_lossy(
                        &self.client.get(&stop_key, Duration::from_secs(5)).await?,
                    ))));
                }
                Ok::<_, StoreError>(None)
            };
            match step.await {
                Ok(Some(reason)) => return reason,
                Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => {
                    return format!(
                    "fail: lost the rendezvous store ({e}); the node hosting it has probably died"
                )
                }
            }
        }
    }
}

/// Keep-alive counters the host watches: a node whose counter has not moved for
/// `limit` is lost.
struct Liveness {
    last: Vec<(i64, Instant)>,
    limit: Duration,
}

impl Liveness {
    fn new(nnodes: u32, cfg: &Config) -> Liveness {
        Liveness {
            last: vec![(-1, Instant::now()); nnodes as usize],
            limit: cfg.keepalive_interval * cfg.keepalive_misses,
        }
    }

    /// Records node `r`'s counter; the reason when it went silent.
    fn observe(&mut self, r: u32, v: i64) -> Option<String> {
        let slot = self.last.get_mut(r as usize)?;
        if v != slot.0 {
            *slot = (v, Instant::now());
            None
        } else if slot.1.elapsed() > self.limit {
            Some(format!(
                "node-lost: node {r} stopped sending keep-alives {:.0?} ago (dead or partitioned)",
                slot.1.elapsed()
            ))
        } else {
            None
        }
    }
}

/// The exit barrier: waits until every node finished, or a stop arrives. Nodes keep
/// beating while they wait and the host watches every beat, so a node still working
/// is waited for as long as it lives (no fixed timeout tears the store down under
/// it), and a node that died is named. A node other than the host that loses the
/// store here has finished its work: that is no failure. The host then lingers until
/// every node has seen the barrier open, so its store outlives their last request.
pub async fn barrier(
    c: &mut StoreClient,
    cfg: &Config,
    round: u32,
    node_rank: u32,
    nnodes: u32,
    is_host: bool,
) -> Result<Option<String>, StoreError> {
    let result = barrier_inner(c, cfg, round, node_rank, nnodes, is_host).await;
    match result {
        Err(_) if !is_host => Ok(None),
        r => r,
    }
}

async fn barrier_inner(
    c: &mut StoreClient,
    cfg: &Config,
    round: u32,
    node_rank: u32,
    nnodes: u32,
    is_host: bool,
) -> Result<Option<String>, StoreError> {
    let done = cfg.key(round, "done");
    let seen = cfg.key(round, "done_seen");
    let stop = cfg.key(round, "stop");
    let alive = |r: u32| cfg.key(round, &format!("alive/{r}"));
    c.add(&done, 1).await?;
    let mut live = Liveness::new(nnodes, cfg);
    let mut next_beat = Instant::now();
    loop {
        if c.add(&done, 0).await? >= i64::from(nnodes) {
            break;
        }
        if c.check(&[&stop]).await? {
            return Ok(Some(printable(&String::from_utf8_lossy(
                &c.get(&stop, Duration::from_secs(5)).await?,
            ))));
        }
        if Instant::now() >= next_beat {
            c.add(&alive(node_rank), 1).await?;
            next_beat = Instant::now() + cfg.keepalive_interval;
            if is_host {
                for r in (0..nnodes).filter(|r| *r != node_rank) {
                    let v = c.add(&alive(r), 0).await?;
                    if let Some(reason) = live.observe(r, v) {
                        return request_stop(c, cfg, round, &reason).await.map(Some);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.add(&seen, 1).await?;
    if is_host {
        let linger = Instant::now();
        while c.add(&seen, 0).await? < i64::from(nnodes)
            && linger.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(None)
}
