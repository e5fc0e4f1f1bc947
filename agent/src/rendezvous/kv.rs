//! Where the rendezvous state lives: a TCPStore (static and c10d, hosted by one node)
//! or etcd (no node is special). The protocol uses a handful of operations; each
//! backend does them its own way where that matters: a TCPStore counts with ADD,
//! etcd with one key per node (no compare-and-swap race on a hot counter), and
//! liveness is a counter in the store but a lease in etcd, so a node that dies takes
//! its keep-alive key with it.

use crate::etcd::{Etcd, EtcdError};
use crate::store::{StoreClient, StoreError};
use std::time::{Duration, Instant};
use toporun_shared::untrusted::printable;

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error("timed out after {0:?} waiting for keys {1:?}")]
    WaitTimeout(Duration, Vec<String>),
    #[error("the rendezvous state holds garbage: {0}")]
    Garbage(String),
}

impl KvError {
    pub fn is_wait_timeout(&self) -> bool {
        matches!(
            self,
            KvError::WaitTimeout(..) | KvError::Store(StoreError::WaitTimeout(..))
        )
    }
}

pub enum Kv {
    Store(StoreClient),
    Etcd(EtcdKv),
}

/// An etcd client with this node's identity (for its own keys) and lease.
pub struct EtcdKv {
    pub etcd: Etcd,
    /// Names this node's keys under counters (unique per process).
    pub uid: String,
    lease: Option<i64>,
    /// Rises on every liveness look, so a present key reads as a moving counter.
    tick: i64,
}

impl EtcdKv {
    pub fn new(etcd: Etcd) -> EtcdKv {
        EtcdKv {
            etcd,
            uid: crate::paths::random_id(),
            lease: None,
            tick: 0,
        }
    }
}

type R<T> = Result<T, KvError>;

impl EtcdKv {
    /// Keeps this node's lease alive, or grants a new one of `ttl` when there is none
    /// or it expired (a paused node).
    async fn renew_lease(&mut self, ttl: Duration) -> Result<(), crate::etcd::EtcdError> {
        let alive = match self.lease {
            Some(id) => self.etcd.keep_alive(id).await?,
            None => false,
        };
        if !alive {
            self.lease = Some(
                self.etcd
                    .grant(ttl.as_secs_f64().ceil().max(1.0) as i64)
                    .await?,
            );
        }
        Ok(())
    }
}

impl Kv {
    /// This node's identity in etcd (the name of its own keys); None on a store.
    pub fn etcd_uid(&self) -> Option<&str> {
        match self {
            Kv::Etcd(e) => Some(&e.uid),
            Kv::Store(_) => None,
        }
    }
}

/// How often a waiting etcd client looks again: at first, and at most.
const ETCD_POLL: Duration = Duration::from_millis(25);
const ETCD_POLL_MAX: Duration = Duration::from_millis(400);

impl Kv {
    pub fn ops(&self) -> u64 {
        match self {
            Kv::Store(c) => c.ops(),
            Kv::Etcd(e) => e.etcd.ops(),
        }
    }

    pub fn is_etcd(&self) -> bool {
        matches!(self, Kv::Etcd(_))
    }

    pub async fn set(&mut self, key: &str, value: &[u8]) -> R<()> {
        match self {
            Kv::Store(c) => Ok(c.set(key, value).await?),
            Kv::Etcd(e) => e
                .etcd
                .put(key, value, None)
                .await
                .map(|_| ())
                .map_err(Into::into),
        }
    }

    /// Whether every key exists now.
    pub async fn check(&mut self, keys: &[&str]) -> R<bool> {
        match self {
            Kv::Store(c) => Ok(c.check(keys).await?),
            Kv::Etcd(e) => Ok(e.etcd.get_all(keys).await?.iter().all(Option::is_some)),
        }
    }

    /// Waits until every key exists.
    pub async fn wait(&mut self, keys: &[&str], timeout: Duration) -> R<()> {
        match self {
            Kv::Store(c) => Ok(c.wait(keys, timeout).await?),
            Kv::Etcd(_) => {
                // Polling backs off (a thousand waiting nodes must not flood the
                // cluster); a watch stream would need the gateway's chunked answers.
                let start = Instant::now();
                let mut pause = ETCD_POLL;
                while !self.check(keys).await? {
                    if start.elapsed() >= timeout {
                        return Err(KvError::WaitTimeout(
                            timeout,
                            keys.iter().map(|k| k.to_string()).collect(),
                        ));
                    }
                    tokio::time::sleep(pause.min(timeout.saturating_sub(start.elapsed()))).await;
                    pause = (pause * 3 / 2).min(ETCD_POLL_MAX);
                }
                Ok(())
            }
        }
    }

    /// Waits for the key, then reads it.
    pub async fn get(&mut self, key: &str, timeout: Duration) -> R<Vec<u8>> {
        Ok(self.multi_get(&[key], timeout).await?.remove(0))
    }

    pub async fn multi_get(&mut self, keys: &[&str], timeout: Duration) -> R<Vec<Vec<u8>>> {
        match self {
            Kv::Store(c) => Ok(c.multi_get(keys, timeout).await?),
            Kv::Etcd(_) => {
                self.wait(keys, timeout).await?;
                let Kv::Etcd(e) = self else { unreachable!() };
                e.etcd
                    .get_all(keys)
                    .await?
                    .into_iter()
                    .zip(keys)
                    .map(|(v, k)| v.ok_or_else(|| KvError::Garbage(format!("{k} vanished"))))
                    .collect()
            }
        }
    }

    /// Reads keys known to exist (a TCPStore skips the wait); an absent key is garbage.
    pub async fn read(&mut self, keys: &[&str]) -> R<Vec<Vec<u8>>> {
        match self {
            Kv::Store(c) => Ok(c.multi_get_now(keys).await?),
            Kv::Etcd(e) => e
                .etcd
                .get_all(keys)
                .await?
                .into_iter()
                .zip(keys)
                .map(|(v, k)| v.ok_or_else(|| KvError::Garbage(format!("{k} is missing"))))
                .collect(),
        }
    }

    pub async fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> R<()> {
        match self {
            Kv::Store(c) => Ok(c.multi_set(pairs).await?),
            Kv::Etcd(e) => Ok(e.etcd.put_all(pairs).await?),
        }
    }

    /// TCPStore's compare_set: returns the value the key holds afterwards.
    pub async fn compare_set(&mut self, key: &str, expected: &[u8], desired: &[u8]) -> R<Vec<u8>> {
        match self {
            Kv::Store(c) => Ok(c.compare_set(key, expected, desired).await?),
            Kv::Etcd(e) => Ok(e.etcd.compare_set(key, expected, desired).await?),
        }
    }

    /// Counts this node once under `key` (each node calls it at most once per key);
    /// returns the count so far.
    pub async fn tally(&mut self, key: &str) -> R<i64> {
        match self {
            Kv::Store(c) => Ok(c.add(key, 1).await?),
            Kv::Etcd(e) => {
                e.etcd.put(&format!("{key}/{}", e.uid), b"1", None).await?;
                Ok(e.etcd.count(&format!("{key}/")).await?)
            }
        }
    }

    /// Counts this node under `key` as `tally` does, for as long as it lives: in etcd
    /// the entry holds this node's lease, renewed by each later call, so a node that
    /// dies (a spare killed while it waits) drops out of the count when its lease
    /// expires. A TCPStore counter cannot forget: the first call counts, later ones
    /// do nothing.
    pub async fn tally_alive(&mut self, key: &str, ttl: Duration, first: bool) -> R<()> {
        match self {
            Kv::Store(c) => {
                if first {
                    c.add(key, 1).await?;
                }
                Ok(())
            }
            Kv::Etcd(e) => {
                e.renew_lease(ttl).await?;
                e.etcd
                    .put(&format!("{key}/{}", e.uid), b"1", e.lease)
                    .await?;
                Ok(())
            }
        }
    }

    /// How many nodes `tally` counted under `key`.
    pub async fn tally_count(&mut self, key: &str) -> R<i64> {
        match self {
            Kv::Store(c) => Ok(c.add(key, 0).await?),
            Kv::Etcd(e) => Ok(e.etcd.count(&format!("{key}/")).await?),
        }
    }

    /// Enters a c10d round: returns this node's ticket, under which its description
    /// (`<prefix>node/<ticket>`) and later its layout lie; the caller's next request
    /// (its wait for the round) carries the description to a TCPStore. A TCPStore numbers nodes by
    /// join order (the ticket is the node rank); in etcd each node writes under its own
    /// id and the coordinator orders them by creation.
    pub async fn enroll(&mut self, prefix: &str, body: &[u8]) -> R<String> {
        match self {
            Kv::Store(c) => {
                let n = c.add(&format!("{prefix}join"), 1).await?;
                let idx = u32::try_from(n - 1)
                    .ok()
                    .filter(|i| *i < toporun_shared::torchrun::MAX_NODES)
                    .ok_or_else(|| KvError::Garbage(format!("join counter at {n}")))?;
                // Goes out with the node's next request (its wait for the round).
                c.set_with_next(&format!("{prefix}node/{idx}"), body);
                Ok(idx.to_string())
            }
            Kv::Etcd(e) => {
                e.etcd
                    .put(&format!("{prefix}node/{}", e.uid), body, None)
                    .await?;
                Ok(e.uid.clone())
            }
        }
    }

    /// Nodes enrolled in a c10d round so far.
    pub async fn enrolled_count(&mut self, prefix: &str) -> R<u32> {
        let n = match self {
            Kv::Store(c) => c.add(&format!("{prefix}join"), 0).await?,
            Kv::Etcd(e) => e.etcd.count(&format!("{prefix}node/")).await?,
        };
        u32::try_from(n).map_err(|_| KvError::Garbage(format!("join count {n}")))
    }

    /// The first `count` enrolled nodes' tickets and descriptions, in node-rank order.
    pub async fn enrolled(
        &mut self,
        prefix: &str,
        count: u32,
        timeout: Duration,
    ) -> R<Vec<(String, Vec<u8>)>> {
        match self {
            Kv::Store(c) => {
                let keys: Vec<String> = (0..count).map(|i| format!("{prefix}node/{i}")).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let values = c.multi_get(&refs, timeout).await?;
                Ok((0..count).map(|i| i.to_string()).zip(values).collect())
            }
            Kv::Etcd(e) => {
                let node = format!("{prefix}node/");
                let kvs = e.etcd.prefix(&node, false, i64::from(count)).await?;
                Ok(kvs
                    .into_iter()
                    .map(|kv| (kv.key[node.len()..].to_string(), kv.value))
                    .collect())
            }
        }
    }

    /// One keep-alive of node `idx` under `alive` (a prefix ending in '/'); `ttl` is
    /// how long etcd keeps the key without another.
    pub async fn beat(&mut self, alive: &str, idx: u32, ttl: Duration) -> R<()> {
        match self {
            Kv::Store(c) => c
                .add(&format!("{alive}{idx}"), 1)
                .await
                .map(|_| ())
                .map_err(Into::into),
            Kv::Etcd(e) => {
                e.renew_lease(ttl).await?;
                // The key is (re)attached each beat: cheap, and it survives a lease
                // that expired while this node was paused.
                e.etcd.put(&format!("{alive}{idx}"), b"1", e.lease).await?;
                Ok(())
            }
        }
    }

    /// One reading per node of `0..nnodes` that changes while the node keeps beating.
    pub async fn pulses(&mut self, alive: &str, nnodes: u32) -> R<Vec<i64>> {
        match self {
            Kv::Store(c) => {
                let mut out = Vec::with_capacity(nnodes as usize);
                for r in 0..nnodes {
                    out.push(c.add(&format!("{alive}{r}"), 0).await?);
                }
                Ok(out)
            }
            Kv::Etcd(e) => {
                e.tick += 1;
                let mut out = vec![-1; nnodes as usize];
                for kv in e.etcd.prefix(alive, true, 0).await? {
                    let idx = kv.key[alive.len()..].parse::<usize>().map_err(|_| {
                        KvError::Garbage(format!("unexpected key {:?}", printable(&kv.key)))
                    })?;
                    if let Some(slot) = out.get_mut(idx) {
                        *slot = e.tick;
                    }
                }
                Ok(out)
            }
        }
    }
}
