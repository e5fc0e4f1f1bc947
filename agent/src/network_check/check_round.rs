//! One node's round of the network check, in the words both paths share: the node
//! (`CheckNode`), what can fail (`CheckError`), how long it waits once its record is
//! written (`Waits`), and its waits on the rendezvous state (a count reached, the
//! values that came).

use crate::rendezvous::{beat_window, Backend, Key, Kv, KvError, Unreadable};
use std::time::{Duration, Instant};
use toporun_shared::facts::Nic;

/// How long a node waits for the others' listeners, a probe round's barrier, and
/// the records and report.
pub const GATHER_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot listen for the probes: {0}")]
    Listen(std::io::Error),
    #[error("the rendezvous state failed: {0}")]
    State(#[from] KvError),
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
}

/// This node in the check.
pub struct CheckNode<'a> {
    pub round: u32,
    pub node_rank: u32,
    pub nnodes: u32,
    pub host: &'a str,
    /// The address its peers reach it at (its rendezvous address).
    pub addr: &'a str,
    /// Its interfaces' addresses.
    pub ips: &'a [String],
    pub nics: &'a [Nic],
    pub hosts_rendezvous: bool,
    /// It has EFA or InfiniBand devices (NCCL's data path is not TCP).
    pub rdma: bool,
    /// How often a waiting spare beats (the rendezvous keep-alive).
    pub spare_beat: Duration,
    /// Where the round runs under `--network-check gate`, the rule it decides by.
    pub gate: Option<GateRule>,
}

/// What `--network-check gate` decides by: `--nnodes`' minimum where the job may
/// change size, None for a static job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateRule {
    pub elastic_min: Option<u32>,
}

impl CheckNode<'_> {
    /// How long node rank 0 may watch the spares' beats before the gate counts them
    /// (a spare whose beat did not move in that time is dead); none outside gate.
    pub fn spare_window(&self) -> Duration {
        match self.gate {
            Some(_) => beat_window(self.spare_beat),
            None => Duration::ZERO,
        }
    }
}

/// How long, once this node wrote its record, node rank 0 gathers the others', the
/// others wait for the report, and the store's host waits for all to have read it.
pub struct Waits {
    pub gather: Duration,
    pub report: Duration,
    pub seen: Duration,
}

/// Waits, at most `wait`, until `nnodes` nodes are counted under `key`: whether all
/// were.
pub async fn counted(kv: &mut Kv, key: &str, nnodes: u32, wait: Duration) -> Result<bool, KvError> {
    let until = Instant::now() + wait;
    loop {
        if kv.tally_count(key).await? >= u64::from(nnodes) {
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The values under `keys` that are there, read at once (None where absent or
/// unreadable).
pub async fn read_present<T: serde::de::DeserializeOwned>(
    kv: &mut Kv,
    keys: &[Key<T>],
) -> Result<Vec<Option<T>>, CheckError> {
    let mut present = Vec::new();
    for k in keys {
        present.push(kv.check(&[k.name()]).await?);
    }
    let names: Vec<&str> = keys
        .iter()
        .zip(&present)
        .filter(|(_, p)| **p)
        .map(|(k, _)| k.name())
        .collect();
    let mut raw = kv.read(&names).await?.into_iter();
    Ok(keys
        .iter()
        .zip(present)
        .map(|(k, p)| match p {
            true => raw.next().and_then(|r| k.decode_or_warn(&r)),
            false => None,
        })
        .collect())
}
