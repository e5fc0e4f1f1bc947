//! The rendezvous state in etcd: no node is special. Counters are one key per node
//! (no compare-and-swap race on a hot counter) and liveness is a lease, so a node
//! that dies takes its keep-alive key with it.

use super::api::{count, Backend, Beat, KvError, R};
use super::etcd_client::{Etcd, EtcdError};
use std::time::{Duration, Instant};
use toporun_shared::untrusted::printable;

/// An etcd client with this node's identity (for its own keys) and lease.
pub struct EtcdKv {
    pub etcd: Etcd,
    /// Names this node's keys under counters (unique per process).
    uid: String,
    lease: Option<i64>,
    /// Rises on every liveness look, so a present key reads as a moving counter.
    tick: i64,
}

/// How often a waiting etcd client looks again: at first, and at most.
const POLL: Duration = Duration::from_millis(25);
const POLL_MAX: Duration = Duration::from_millis(400);

impl EtcdKv {
    pub fn new(etcd: Etcd) -> EtcdKv {
        EtcdKv {
            etcd,
            uid: crate::paths::random_id(),
            lease: None,
            tick: 0,
        }
    }

    /// Keeps this node's lease alive, or grants a new one of `ttl` when there is none
    /// or it expired (a paused node).
    async fn renew_lease(&mut self, ttl: Duration) -> Result<(), EtcdError> {
        let alive = match self.lease {
            Some(id) => self.etcd.keep_alive(id).await?,
            None => false,
        };
        if !alive {
            let secs = ttl.as_secs().max(1) + u64::from(ttl.subsec_nanos() > 0);
            let secs = i64::try_from(secs).unwrap_or(i64::MAX);
            self.lease = Some(self.etcd.grant(secs).await?);
        }
        Ok(())
    }

    /// Every key's value, where each must exist.
    async fn present(&mut self, keys: &[&str], missing: &str) -> R<Vec<Vec<u8>>> {
        self.etcd
            .get_all(keys)
            .await?
            .into_iter()
            .zip(keys)
            .map(|(v, k)| v.ok_or_else(|| KvError::Garbage(format!("{k} {missing}"))))
            .collect()
    }
}

impl Backend for EtcdKv {
    fn tickets_are_join_order(&self) -> bool {
        false
    }
    fn leases(&self) -> bool {
        true
    }
    fn hosted_by_a_node(&self) -> bool {
        false
    }
    fn identity(&self) -> Option<&str> {
        Some(&self.uid)
    }
    fn ops(&self) -> u64 {
        self.etcd.ops()
    }

    async fn set(&mut self, key: &str, value: &[u8]) -> R<()> {
        self.etcd.put(key, value, None).await?;
        Ok(())
    }

    async fn check(&mut self, keys: &[&str]) -> R<bool> {
        Ok(self.etcd.get_all(keys).await?.iter().all(Option::is_some))
    }

    async fn wait(&mut self, keys: &[&str], timeout: Duration) -> R<()> {
        // Polling backs off (a thousand waiting nodes must not flood the cluster); a
        // watch stream would need the gateway's chunked answers.
        let start = Instant::now();
        let mut pause = POLL;
        while !self.check(keys).await? {
            if start.elapsed() >= timeout {
                return Err(KvError::WaitTimeout(
                    timeout,
                    keys.iter().map(|k| k.to_string()).collect(),
                ));
            }
            tokio::time::sleep(pause.min(timeout.saturating_sub(start.elapsed()))).await;
            pause = (pause * 3 / 2).min(POLL_MAX);
        }
        Ok(())
    }

    async fn multi_get(&mut self, keys: &[&str], timeout: Duration) -> R<Vec<Vec<u8>>> {
        self.wait(keys, timeout).await?;
        self.present(keys, "vanished").await
    }

    async fn read(&mut self, keys: &[&str]) -> R<Vec<Vec<u8>>> {
        self.present(keys, "is missing").await
    }

    async fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> R<()> {
        Ok(self.etcd.put_all(pairs).await?)
    }

    async fn compare_set(&mut self, key: &str, expected: &[u8], desired: &[u8]) -> R<Vec<u8>> {
        Ok(self.etcd.compare_set(key, expected, desired).await?)
    }

    async fn tally(&mut self, key: &str) -> R<u64> {
        self.etcd
            .put(&format!("{key}/{}", self.uid), b"1", None)
            .await?;
        self.tally_count(key).await
    }

    async fn tally_alive(&mut self, key: &str, ttl: Duration, _place: Option<u64>) -> R<u64> {
        self.renew_lease(ttl).await?;
        self.etcd
            .put(&format!("{key}/{}", self.uid), b"1", self.lease)
            .await?;
        Ok(0)
    }

    async fn tally_count(&mut self, key: &str) -> R<u64> {
        count(key, self.etcd.count(&format!("{key}/")).await?)
    }

    async fn tally_beats(&mut self, _key: &str) -> R<Option<Vec<Beat>>> {
        Ok(None)
    }

    async fn enroll(&mut self, _join: &str, nodes: &str, body: &[u8]) -> R<String> {
        self.etcd
            .put(&format!("{nodes}{}", self.uid), body, None)
            .await?;
        Ok(self.uid.clone())
    }

    async fn enrolled_count(&mut self, _join: &str, nodes: &str) -> R<u32> {
        let n = self.etcd.count(nodes).await?;
        u32::try_from(n).map_err(|_| KvError::Garbage(format!("join count {n}")))
    }

    async fn enrolled(
        &mut self,
        nodes: &str,
        count: u32,
        _timeout: Duration,
    ) -> R<Vec<(String, Vec<u8>)>> {
        let kvs = self.etcd.prefix(nodes, false, i64::from(count)).await?;
        Ok(kvs
            .into_iter()
            .map(|kv| (kv.key[nodes.len()..].to_string(), kv.value))
            .collect())
    }

    async fn beat(&mut self, alive: &str, idx: u32, ttl: Duration) -> R<()> {
        self.renew_lease(ttl).await?;
        // The key is (re)attached each beat: cheap, and it survives a lease that
        // expired while this node was paused.
        self.etcd
            .put(&format!("{alive}{idx}"), b"1", self.lease)
            .await?;
        Ok(())
    }

    async fn pulses(&mut self, alive: &str, nnodes: u32) -> R<Vec<i64>> {
        self.tick += 1;
        let mut out = vec![-1; nnodes as usize];
        for kv in self.etcd.prefix(alive, true, 0).await? {
            let idx = kv.key[alive.len()..].parse::<usize>().map_err(|_| {
                KvError::Garbage(format!("unexpected key {:?}", printable(&kv.key)))
            })?;
            if let Some(slot) = out.get_mut(idx) {
                *slot = self.tick;
            }
        }
        Ok(out)
    }
}
