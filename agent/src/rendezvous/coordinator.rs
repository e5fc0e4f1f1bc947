//! The coordinator: runs on the node that hosts the store. It watches joins, closes the
//! round (static: all nodes; c10d: max nodes, or min nodes plus the last-call window),
//! publishes every node's place, and says where it stands while it waits.

use super::backend::{Backend, Kv, KvError};
use super::config::{Config, Shape};
use super::keys::RoundKeys;
use super::node_info::NodeInfo;
use super::protocol::{Closed, Layout, StopReason};
use std::time::{Duration, Instant};
use toporun_shared::torchrun::MAX_NPROC;
use toporun_shared::untrusted::{printable, valid_host};

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
    #[error("rendezvous timed out after {waited:.0?} (join_timeout) with {joined} node(s) joined, enough for the minimum of {min}, before the last call of {last_call:.0?} ended: as in torchrun, the join timeout bounds the whole rendezvous; set --rdzv-conf join_timeout above last_call_timeout, or start --nnodes max nodes")]
    TimeoutInLastCall {
        waited: Duration,
        joined: u32,
        min: u32,
        last_call: Duration,
    },
    #[error("{key} was set by someone other than the coordinator of the round (this node) before it closed the round: a forged value ({value}); every node is stopped. Give the job a secret with --rdzv-conf token=... and keep the store's port private")]
    Forged { key: String, value: String },
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
    let keys = cfg.round_keys(round);
    let result = close(c, cfg, &keys, progress, before_publish).await;
    if let Err(e) = &result {
        refuse(c, cfg, &keys, e).await;
    }
    result
}

/// Tells every node why the round failed instead of leaving them to their own
/// timeouts: a forgery stops the job; otherwise `closed` carries the refusal, and
/// for a refused node the store stays up until the nodes have read it (or a few
/// seconds).
async fn refuse(c: &mut Kv, cfg: &Config, keys: &RoundKeys, e: &CoordinateError) {
    match e {
        CoordinateError::Forged { .. } => {
            let stop = StopReason::fail(e.to_string()).encode();
            let _ = c.compare_set(&keys.stop(), b"", &stop).await;
            return;
        }
        CoordinateError::Kv(_) => return,
        _ => {}
    }
    let closed = Closed::Refused(e.to_string()).encode();
    if c.set(&keys.closed(), &closed).await.is_err() {
        return;
    }
    if !matches!(
        e,
        CoordinateError::Invalid { .. } | CoordinateError::TooManyRanks(_)
    ) {
        return;
    }
    let joined = match cfg.shape {
        Shape::Static { .. } => c.tally_count(&keys.join()).await.ok(),
        Shape::Elastic { .. } => c
            .enrolled_count(&keys.join(), keys.nodes().name())
            .await
            .ok()
            .map(u64::from),
    };
    let count = joined.unwrap_or(0).min(u64::from(cfg.max_nodes()));
    let start = Instant::now();
    while start.elapsed() < REFUSAL_LINGER {
        match c.tally_count(&keys.refused_seen()).await {
            Ok(n) if n >= count => break,
            Ok(_) => tokio::time::sleep(POLL).await,
            Err(_) => break,
        }
    }
}

async fn close(
    c: &mut Kv,
    cfg: &Config,
    keys: &RoundKeys,
    progress: &mut (dyn FnMut(&Waiting) + Send),
    before_publish: &mut (dyn FnMut() + Send),
) -> Result<Vec<NodeInfo>, CoordinateError> {
    let count = wait_for_nodes(c, cfg, keys, progress).await?;
    let enrolled = read_enrolled(c, cfg, keys, count).await?;
    let infos: Vec<NodeInfo> = (0u32..)
        .zip(&enrolled)
        .map(|(i, (ticket, b))| {
            let key = keys.node(ticket);
            key.decode(b)
                .map_err(|e| CoordinateError::BadNode(i, e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    let total: u64 = infos.iter().map(|i| u64::from(i.nproc)).sum();
    for (i, info) in (0u32..).zip(&infos) {
        validate(cfg, i, info)?;
    }
    let world = u32::try_from(total)
        .ok()
        .filter(|_| total <= toporun_shared::torchrun::MAX_WORLD)
        .ok_or(CoordinateError::TooManyRanks(total))?;
    let tickets: Vec<&str> = enrolled.iter().map(|(t, _)| t.as_str()).collect();
    let layout = layout(cfg, keys, &infos, &tickets, world);
    // Every node of the round has stopped its last ranks (it joined): the place
    // where the new ones meet can be cleared before any starts.
    before_publish();
    forged_closed(c, keys).await?;
    let pairs: Vec<(&str, &[u8])> = layout
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    c.multi_set(&pairs).await?;
    c.set(&keys.closed(), &Closed::Nodes(count).encode())
        .await?;
    Ok(infos)
}

/// Polls until the round can close; returns how many nodes it closes with.
async fn wait_for_nodes(
    c: &mut Kv,
    cfg: &Config,
    keys: &RoundKeys,
    progress: &mut (dyn FnMut(&Waiting) + Send),
) -> Result<u32, CoordinateError> {
    let start = Instant::now();
    let mut last_report = Instant::now();
    let mut quorum_at: Option<Instant> = None;
    loop {
        // The coordinator is the only writer of `closed`: one found now is forged.
        forged_closed(c, keys).await?;
        let joined = match cfg.shape {
            Shape::Static { .. } => {
                u32::try_from(c.tally_count(&keys.join()).await?).unwrap_or(u32::MAX)
            }
            Shape::Elastic { .. } => c.enrolled_count(&keys.join(), keys.nodes().name()).await?,
        };
        let elapsed = start.elapsed();
        let (expected, done) = match cfg.shape {
            Shape::Static { nnodes } => (nnodes, joined >= nnodes),
            Shape::Elastic { min, max } => {
                if joined >= min && quorum_at.is_none() {
                    quorum_at = Some(Instant::now());
                }
                let last_call_over = quorum_at.is_some_and(|t| t.elapsed() >= cfg.last_call);
                (max, joined >= max || last_call_over)
            }
        };
        if done {
            return Ok(joined.min(cfg.max_nodes()));
        }
        if elapsed >= cfg.join_timeout {
            return Err(timed_out(c, cfg, keys, elapsed, joined).await?);
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            let missing = missing_static(c, cfg, keys).await?;
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
    }
}

/// The join timeout bounds the whole rendezvous, as torchrun's does: with the
/// minimum joined but the last call still open it is a timeout all the same.
async fn timed_out(
    c: &mut Kv,
    cfg: &Config,
    keys: &RoundKeys,
    waited: Duration,
    joined: u32,
) -> Result<CoordinateError, KvError> {
    let min = cfg.min_nodes();
    if joined >= min {
        return Ok(CoordinateError::TimeoutInLastCall {
            waited,
            joined,
            min,
            last_call: cfg.last_call,
        });
    }
    Ok(CoordinateError::Timeout {
        waited,
        joined,
        expected: min,
        missing: missing_static(c, cfg, keys).await?,
    })
}

async fn forged_closed(c: &mut Kv, keys: &RoundKeys) -> Result<(), CoordinateError> {
    let key = keys.closed();
    if !c.check(&[&key]).await? {
        return Ok(());
    }
    let value = c.read(&[&key]).await?.remove(0);
    let text = String::from_utf8_lossy(&value);
    Err(CoordinateError::Forged {
        key,
        value: format!(
            "{:?}",
            printable(&text.chars().take(80).collect::<String>())
        ),
    })
}

/// The first `count` nodes' tickets and descriptions, in node-rank order.
async fn read_enrolled(
    c: &mut Kv,
    cfg: &Config,
    keys: &RoundKeys,
    count: u32,
) -> Result<Vec<(String, Vec<u8>)>, CoordinateError> {
    let enrolled = match cfg.shape {
        Shape::Static { .. } => {
            let tickets: Vec<String> = (0..count).map(|i| i.to_string()).collect();
            let node_keys: Vec<_> = tickets.iter().map(|t| keys.node(t)).collect();
            let refs: Vec<&str> = node_keys.iter().map(|k| k.name()).collect();
            if !c.check(&refs).await? {
                let missing = missing_static(c, cfg, keys).await?;
                return Err(CoordinateError::Duplicate { missing });
            }
            let values = c.multi_get(&refs, cfg.join_timeout).await?;
            tickets.into_iter().zip(values).collect()
        }
        Shape::Elastic { .. } => {
            c.enrolled(keys.nodes().name(), count, cfg.join_timeout)
                .await?
        }
    };
    let read = u32::try_from(enrolled.len()).unwrap_or(u32::MAX);
    if read != count {
        return Err(CoordinateError::BadNode(
            read,
            format!(
                "{} of {count} node descriptions could be read",
                enrolled.len()
            ),
        ));
    }
    Ok(enrolled)
}

/// Every node's layout, co-location variables and name, as key-value pairs.
fn layout(
    cfg: &Config,
    keys: &RoundKeys,
    infos: &[NodeInfo],
    tickets: &[&str],
    world: u32,
) -> Vec<(String, Vec<u8>)> {
    let views: Vec<_> = infos.iter().map(NodeInfo::colocation).collect();
    let coloc = toporun_shared::colocation::decide(&views, cfg.colocated);
    // At most --nnodes max (coordinate reads no more).
    let nnodes = u32::try_from(infos.len()).unwrap_or(u32::MAX);
    let mut offset = 0;
    let mut out = Vec::with_capacity(infos.len() * 3 + 1);
    for (i, (node_rank, (info, ticket))) in (0u32..).zip(infos.iter().zip(tickets)).enumerate() {
        let place = Layout {
            node_rank,
            offset,
            world,
            nnodes,
        };
        out.push((keys.layout(ticket), place.encode()));
        out.push(keys.env(ticket).entry(&coloc.env[i]));
        // Who node i is, for the nodes that name it when it is lost.
        out.push((
            keys.name(node_rank),
            format!("{}, {}", printable(&info.hostname), printable(&info.addr)).into_bytes(),
        ));
        offset += info.nproc;
    }
    let peers: Vec<_> = infos.iter().map(NodeInfo::addrs).collect();
    out.push(keys.peers().entry(&peers));
    let machines: Vec<_> = infos.iter().map(NodeInfo::machine).collect();
    out.push(keys.machines().entry(&machines));
    // The network check the round runs: the least its nodes ask for (one that did not
    // say asks for the default).
    let check = infos
        .iter()
        .map(|i| i.network_check.unwrap_or_default())
        .min();
    out.push(keys.network_mode().entry(&check.unwrap_or_default()));
    out
}

/// Static node ranks whose description has not arrived (empty for c10d).
async fn missing_static(c: &mut Kv, cfg: &Config, keys: &RoundKeys) -> Result<Vec<u32>, KvError> {
    let Shape::Static { nnodes } = cfg.shape else {
        return Ok(Vec::new());
    };
    let mut missing = Vec::new();
    for r in 0..nnodes {
        if !c.check(&[keys.node(&r.to_string()).name()]).await? {
            missing.push(r);
        }
    }
    Ok(missing)
}
