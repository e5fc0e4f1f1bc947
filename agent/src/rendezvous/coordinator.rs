//! The coordinator: runs on the node that hosts the store. It watches joins, closes the
//! round (static: all nodes; c10d: max nodes, or min nodes plus the last-call window),
//! publishes every node's place, and says where it stands while it waits.

use super::config::{Config, NodeInfo, Shape};
use super::kv::{Kv, KvError};
use std::time::{Duration, Instant};
use toporun_shared::torchrun::MAX_NPROC;
use toporun_shared::untrusted::{printable, valid_host};

/// The value of `closed` that tells every node the round failed, and why.
pub const CLOSED_ERROR: &str = "error: ";

/// Where a round stands, reported every few seconds while it waits.
#[derive(Debug, Clone)]
pub struct Waiting {
    pub joined: u32,
    pub expected: u32,
    /// Static node ranks not joined yet (empty for c10d).
    pub missing: Vec<u32>,
    pub elapsed: Duration,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum CoordinateError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("rendezvous timed out after {waited:.0?}: {joined} of {expected} node(s) joined{}", missing_text(.missing))]
    Timeout {
        waited: Duration,
        joined: u32,
        expected: u32,
        missing: Vec<u32>,
    },
    #[error("{} nodes joined but node rank(s) {missing:?} did not: two nodes were given the same --node-rank", .missing.len())]
    Duplicate { missing: Vec<u32> },
    #[error("node {0} published an unreadable description: {1}")]
    BadNode(u32, String),
    #[error("the nodes' ranks add up to {0}, more than torch can count (a 32-bit int)")]
    TooManyRanks(u64),
    #[error("node {node} ({host}) {what}")]
    Invalid {
        node: u32,
        host: String,
        what: String,
    },
}

/// A node's description as untrusted input: its counts within the job's limits, its
/// names printable, its --nnodes the host's own.
fn validate(cfg: &Config, i: u32, info: &NodeInfo) -> Result<(), CoordinateError> {
    let invalid = |what: String| CoordinateError::Invalid {
        node: i,
        host: printable(&info.hostname),
        what,
    };
    if info.nproc == 0 || info.nproc > MAX_NPROC {
        return Err(invalid(format!(
            "says it runs {} ranks (1 to {MAX_NPROC})",
            info.nproc
        )));
    }
    if !valid_host(&info.hostname) || !valid_host(&info.addr) {
        return Err(invalid(format!(
            "describes itself with an unusable host name or address {:?} / {:?}",
            printable(&info.hostname),
            printable(&info.addr)
        )));
    }
    if let Shape::Static { .. } = cfg.shape {
        if info.node_rank != Some(i) {
            return Err(invalid(format!(
                "published node rank {:?} under node rank {i}",
                info.node_rank
            )));
        }
    }
    if let Some((min, max)) = info.nnodes {
        if (min, max) != cfg.nnodes() {
            let (hmin, hmax) = cfg.nnodes();
            let show = |a: u32, b: u32| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}:{b}")
                }
            };
            return Err(invalid(format!(
                "runs with --nnodes={} but the host runs with --nnodes={}: every node must be started with the same --nnodes",
                show(min, max),
                show(hmin, hmax)
            )));
        }
    }
    Ok(())
}

fn missing_text(missing: &[u32]) -> String {
    if missing.is_empty() {
        String::new()
    } else {
        format!("; missing node rank(s) {missing:?}")
    }
}

const POLL: Duration = Duration::from_millis(20);
/// How long the host keeps the store up for nodes to read that the round failed.
const REFUSAL_LINGER: Duration = Duration::from_secs(5);
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Closes round `round` and publishes the layout; returns the node descriptions in
/// node-rank order.
pub async fn coordinate(
    c: &mut Kv,
    cfg: &Config,
    round: u32,
    progress: &mut (dyn FnMut(&Waiting) + Send),
    before_publish: &mut (dyn FnMut() + Send),
) -> Result<Vec<NodeInfo>, CoordinateError> {
    let prefix = cfg.key(round, "");
    let start = Instant::now();
    let mut last_report = Instant::now();
    let mut quorum_at: Option<Instant> = None;
    let count = loop {
        let joined = match cfg.shape {
            Shape::Static { .. } => c.tally_count(&cfg.key(round, "join")).await? as u32,
            Shape::Elastic { .. } => c.enrolled_count(&prefix).await?,
        };
        let elapsed = start.elapsed();
        let (expected, done) = match cfg.shape {
            Shape::Static { nnodes } => (nnodes, joined >= nnodes),
            Shape::Elastic { min, max } => {
                if joined >= min && quorum_at.is_none() {
                    quorum_at = Some(Instant::now());
                }
                (
                    max,
                    joined >= max || quorum_at.is_some_and(|t| t.elapsed() >= cfg.last_call),
                )
            }
        };
        if done {
            break joined.min(cfg.max_nodes());
        }
        let need = match cfg.shape {
            Shape::Static { nnodes } => nnodes,
            Shape::Elastic { min, .. } => min,
        };
        if elapsed >= cfg.join_timeout && joined < need {
            let missing = missing_static(c, cfg, round).await?;
            let e = CoordinateError::Timeout {
                waited: elapsed,
                joined,
                expected: need,
                missing,
            };
            // The nodes that did join learn it now, not at their own deadline.
            let _ = c
                .set(
                    &cfg.key(round, "closed"),
                    format!("{CLOSED_ERROR}{e}").as_bytes(),
                )
                .await;
            return Err(e);
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            let missing = missing_static(c, cfg, round).await?;
            progress(&Waiting {
                joined,
                expected,
                missing,
                elapsed,
                timeout: cfg.join_timeout,
            });
            last_report = Instant::now();
        }
        tokio::time::sleep(POLL).await;
    };
    let enrolled: Vec<(String, Vec<u8>)> = match cfg.shape {
        Shape::Static { .. } => {
            let keys: Vec<String> = (0..count)
                .map(|i| cfg.key(round, &format!("node/{i}")))
                .collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            if !c.check(&refs).await? {
                let missing = missing_static(c, cfg, round).await?;
                return Err(CoordinateError::Duplicate { missing });
            }
            let values = c.multi_get(&refs, cfg.join_timeout).await?;
            (0..count).map(|i| i.to_string()).zip(values).collect()
        }
        Shape::Elastic { .. } => c.enrolled(&prefix, count, cfg.join_timeout).await?,
    };
    if enrolled.len() != count as usize {
        return Err(CoordinateError::BadNode(
            enrolled.len() as u32,
            format!(
                "{} of {count} node descriptions could be read",
                enrolled.len()
            ),
        ));
    }
    let infos: Vec<NodeInfo> = enrolled
        .iter()
        .enumerate()
        .map(|(i, (_, b))| {
            serde_json::from_slice(b).map_err(|e| CoordinateError::BadNode(i as u32, e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    let total: u64 = infos.iter().map(|i| u64::from(i.nproc)).sum();
    let checked = infos
        .iter()
        .enumerate()
        .try_for_each(|(i, info)| validate(cfg, i as u32, info))
        .and(if total > toporun_shared::torchrun::MAX_WORLD {
            Err(CoordinateError::TooManyRanks(total))
        } else {
            Ok(())
        });
    if let Err(e) = checked {
        // Every node learns it at once instead of waiting out its timeout; the store
        // stays up until they have read it (or a few seconds).
        let _ = c
            .set(
                &cfg.key(round, "closed"),
                format!("{CLOSED_ERROR}{e}").as_bytes(),
            )
            .await;
        let seen = cfg.key(round, "refused_seen");
        let start = Instant::now();
        while start.elapsed() < REFUSAL_LINGER {
            match c.tally_count(&seen).await {
                Ok(n) if n >= i64::from(count) => break,
                Ok(_) => tokio::time::sleep(POLL).await,
                Err(_) => break,
            }
        }
        return Err(e);
    }
    let world = total as u32; // checked above
    let views: Vec<_> = infos.iter().map(NodeInfo::colocation).collect();
    let coloc = toporun_shared::colocation::decide(&views, cfg.colocated);
    let mut offset = 0;
    let mut layout: Vec<(String, Vec<u8>)> = Vec::with_capacity(infos.len());
    for (i, (info, (ticket, _))) in infos.iter().zip(&enrolled).enumerate() {
        layout.push((
            cfg.key(round, &format!("layout/{ticket}")),
            format!("{i},{offset},{world},{count}").into_bytes(),
        ));
        layout.push((
            cfg.key(round, &format!("env/{ticket}")),
            serde_json::to_vec(&coloc.env[i]).expect("node env serializes"),
        ));
        // Who node i is, for the nodes that name it when it is lost.
        layout.push((
            cfg.key(round, &format!("name/{i}")),
            format!("{}, {}", printable(&info.hostname), printable(&info.addr)).into_bytes(),
        ));
        offset += info.nproc;
    }
    // Every node of the round has stopped its last ranks (it joined): the place
    // where the new ones meet can be cleared before any starts.
    before_publish();
    let pairs: Vec<(&str, &[u8])> = layout
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    c.multi_set(&pairs).await?;
    c.set(&cfg.key(round, "closed"), count.to_string().as_bytes())
        .await?;
    Ok(infos)
}

/// Static node ranks whose description has not arrived (empty for c10d).
async fn missing_static(c: &mut Kv, cfg: &Config, round: u32) -> Result<Vec<u32>, KvError> {
    let Shape::Static { nnodes } = cfg.shape else {
        return Ok(Vec::new());
    };
    let mut missing = Vec::new();
    for r in 0..nnodes {
        if !c.check(&[&cfg.key(round, &format!("node/{r}"))]).await? {
            missing.push(r);
        }
    }
    Ok(missing)
}
