//! The rendezvous state in a TCPStore (toporun's or PyTorch's own), hosted by one
//! node: counters are ADD, liveness is a counter that moves.

use super::api::{count, Backend, Beat, KvError, R};
use crate::store::StoreClient;
use std::time::Duration;
use toporun_shared::torchrun::MAX_NODES;

pub struct StoreKv(pub StoreClient);

/// The beat counter of `place`, counted under `key` by `tally_alive`.
fn beat(key: &str, place: u64) -> String {
    format!("{key}/beat/{place}")
}

/// The newest places `tally_beats` reads; older ones are taken as gone (a spare that
/// restarts again and again takes a new place each time).
const BEATS_READ: u64 = 256;

impl Backend for StoreKv {
    fn tickets_are_join_order(&self) -> bool {
        true
    }
    fn leases(&self) -> bool {
        false
    }
    fn hosted_by_a_node(&self) -> bool {
        true
    }
    fn identity(&self) -> Option<&str> {
        None
    }
    fn ops(&self) -> u64 {
        self.0.ops()
    }

    async fn set(&mut self, key: &str, value: &[u8]) -> R<()> {
        Ok(self.0.set(key, value).await?)
    }

    async fn check(&mut self, keys: &[&str]) -> R<bool> {
        Ok(self.0.check(keys).await?)
    }

    async fn wait(&mut self, keys: &[&str], timeout: Duration) -> R<()> {
        Ok(self.0.wait(keys, timeout).await?)
    }

    async fn multi_get(&mut self, keys: &[&str], timeout: Duration) -> R<Vec<Vec<u8>>> {
        Ok(self.0.multi_get(keys, timeout).await?)
    }

    async fn read(&mut self, keys: &[&str]) -> R<Vec<Vec<u8>>> {
        Ok(self.0.multi_get_now(keys).await?)
    }

    async fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> R<()> {
        Ok(self.0.multi_set(pairs).await?)
    }

    async fn compare_set(&mut self, key: &str, expected: &[u8], desired: &[u8]) -> R<Vec<u8>> {
        Ok(self.0.compare_set(key, expected, desired).await?)
    }

    async fn tally(&mut self, key: &str) -> R<u64> {
        count(key, self.0.add(key, 1).await?)
    }

    async fn tally_alive(&mut self, key: &str, _ttl: Duration, place: Option<u64>) -> R<u64> {
        let place = match place {
            Some(p) => p,
            None => count(key, self.0.add(key, 1).await?)?.saturating_sub(1),
        };
        self.0.add(&beat(key, place), 1).await?;
        Ok(place)
    }

    async fn tally_count(&mut self, key: &str) -> R<u64> {
        count(key, self.0.add(key, 0).await?)
    }

    async fn tally_beats(&mut self, key: &str) -> R<Option<Vec<Beat>>> {
        let n = self.tally_count(key).await?;
        let mut out = Vec::new();
        for place in n.saturating_sub(BEATS_READ)..n {
            out.push((place, self.0.add(&beat(key, place), 0).await?));
        }
        Ok(Some(out))
    }

    async fn enroll(&mut self, join: &str, nodes: &str, body: &[u8]) -> R<String> {
        let n = self.0.add(join, 1).await?;
        let idx = u32::try_from(n - 1)
            .ok()
            .filter(|i| *i < MAX_NODES)
            .ok_or_else(|| KvError::Garbage(format!("join counter at {n}")))?;
        // Goes out with the node's next request (its wait for the round).
        self.0.set_with_next(&format!("{nodes}{idx}"), body);
        Ok(idx.to_string())
    }

    async fn enrolled_count(&mut self, join: &str, _nodes: &str) -> R<u32> {
        let n = self.0.add(join, 0).await?;
        u32::try_from(n).map_err(|_| KvError::Garbage(format!("join count {n}")))
    }

    async fn enrolled(
        &mut self,
        nodes: &str,
        count: u32,
        timeout: Duration,
    ) -> R<Vec<(String, Vec<u8>)>> {
        let keys: Vec<String> = (0..count).map(|i| format!("{nodes}{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = self.0.multi_get(&refs, timeout).await?;
        Ok((0..count).map(|i| i.to_string()).zip(values).collect())
    }

    async fn beat(&mut self, alive: &str, idx: u32, _ttl: Duration) -> R<()> {
        self.0.add(&format!("{alive}{idx}"), 1).await?;
        Ok(())
    }

    async fn pulses(&mut self, alive: &str, nnodes: u32) -> R<Vec<i64>> {
        let mut out = Vec::with_capacity(nnodes as usize);
        for r in 0..nnodes {
            out.push(self.0.add(&format!("{alive}{r}"), 0).await?);
        }
        Ok(out)
    }
}
