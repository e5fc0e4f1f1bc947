//! A node's side: join a round, learn its place, keep alive, watch for a stop, and
//! wait at the exit barrier.

use super::{Config, NodeInfo, Shape};
use crate::store::{StoreClient, StoreError};
use std::time::{Duration, Instant};
use toporun_shared::colocation::NodeEnv;

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
    #[error("the coordinator published an unreadable layout {0:?}")]
    BadLayout(String),
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
    let body = serde_json::to_vec(info).expect("node info serializes");
    let idx = match cfg.shape {
        Shape::Static { .. } => {
            let r = info.node_rank.expect("static nodes have a rank");
            c.set(&cfg.key(round, &format!("node/{r}")), &body).await?;
            c.add(&cfg.key(round, "join"), 1).await?;
            r
        }
        Shape::Elastic { .. } => {
            let idx = c.add(&cfg.key(round, "join"), 1).await? as u32 - 1;
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
    let nnodes: u32 = String::from_utf8_lossy(&c.get(&closed, cfg.read_timeout).await?)
        .parse()
        .map_err(|_| JoinError::BadLayout("closed".into()))?;
    if idx >= nnodes {
        return Err(JoinError::Surplus { round, idx, nnodes });
    }
    let raw = c
        .get(&cfg.key(round, &format!("layout/{idx}")), cfg.read_timeout)
        .await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let nums: Vec<u32> = text
        .split(',')
        .map(|x| x.parse().map_err(|_| JoinError::BadLayout(text.clone())))
        .collect::<Result<_, _>>()?;
    let [node_rank, offset, world, nnodes] = nums[..] else {
        return Err(JoinError::BadLayout(text));
    };
    let raw = c
        .get(&cfg.key(round, &format!("env/{idx}")), cfg.read_timeout)
        .await?;
    let env: NodeEnv = serde_json::from_slice(&raw)
        .map_err(|_| JoinError::BadLayout(String::from_utf8_lossy(&raw).into_owned()))?;
    Ok(Place {
        round,
        node_rank,
        offset,
        world,
        nnodes,
        env,
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
    Ok(String::from_utf8_lossy(&won).into_owned())
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
        let mut last: Vec<(i64, Instant)> = vec![(-1, Instant::now()); self.nnodes as usize];
        let mut next_beat = Instant::now();
        let limit = self.cfg.keepalive_interval * self.cfg.keepalive_misses;
        loop {
            let step = async {
                if Instant::now() >= next_beat {
                    self.client.add(&alive_key(self.node_rank), 1).await?;
                    next_beat = Instant::now() + self.cfg.keepalive_interval;
                    if self.is_host {
                        for r in 0..self.nnodes {
                            let v = self.client.add(&alive_key(r), 0).await?;
                            let slot = &mut last[r as usize];
                            if v != slot.0 {
                                *slot = (v, Instant::now());
                            } else if slot.1.elapsed() > limit {
                                let reason = format!("node {r} stopped sending keep-alives {:.0?} ago (dead or partitioned)", slot.1.elapsed());
                                return request_stop(
                                    &mut self.client,
                                    &self.cfg,
                                    self.round,
                                    &format!("node-lost: {reason}"),
                                )
                                .await
                                .map(Some);
                            }
                        }
                    }
                }
                if self.client.check(&[&stop_key]).await? {
                    return Ok(Some(
                        String::from_utf8_lossy(
                            &self.client.get(&stop_key, Duration::from_secs(5)).await?,
                        )
                        .into_owned(),
                    ));
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

/// The exit barrier: waits (bounded) until every node finished, or a stop arrives.
/// The host then lingers until every node has seen the barrier open, so its store
/// outlives their last request.
pub async fn barrier(
    c: &mut StoreClient,
    cfg: &Config,
    round: u32,
    nnodes: u32,
    timeout: Duration,
    is_host: bool,
) -> Result<Option<String>, StoreError> {
    let done = cfg.key(round, "done");
    let seen = cfg.key(round, "done_seen");
    let stop = cfg.key(round, "stop");
    c.add(&done, 1).await?;
    let start = Instant::now();
    loop {
        if c.add(&done, 0).await? >= i64::from(nnodes) {
            break;
        }
        if c.check(&[&stop]).await? {
            return Ok(Some(
                String::from_utf8_lossy(&c.get(&stop, Duration::from_secs(5)).await?).into_owned(),
            ));
        }
        if start.elapsed() >= timeout {
            return Ok(Some(format!(
                "exit barrier: not every node finished within {timeout:.0?}"
            )));
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
