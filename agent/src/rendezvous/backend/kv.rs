//! One connection to the rendezvous state, whichever backend holds it.

use super::api::{Backend, Beat, R};
use super::etcd::EtcdKv;
use super::store::StoreKv;
use std::time::Duration;

pub enum Kv {
    Store(StoreKv),
    Etcd(EtcdKv),
}

/// Calls the same method on whichever backend this is.
macro_rules! each {
    ($self:ident, $b:ident => $e:expr) => {
        match $self {
            Kv::Store($b) => $e,
            Kv::Etcd($b) => $e,
        }
    };
}

impl Kv {
    /// Waits for the key, then reads it.
    pub async fn get(&mut self, key: &str, timeout: Duration) -> R<Vec<u8>> {
        Ok(self.multi_get(&[key], timeout).await?.remove(0))
    }
}

impl Backend for Kv {
    fn tickets_are_join_order(&self) -> bool {
        each!(self, b => b.tickets_are_join_order())
    }
    fn leases(&self) -> bool {
        each!(self, b => b.leases())
    }
    fn hosted_by_a_node(&self) -> bool {
        each!(self, b => b.hosted_by_a_node())
    }
    fn identity(&self) -> Option<&str> {
        each!(self, b => b.identity())
    }
    fn ops(&self) -> u64 {
        each!(self, b => b.ops())
    }
    async fn set(&mut self, key: &str, value: &[u8]) -> R<()> {
        each!(self, b => b.set(key, value).await)
    }
    async fn check(&mut self, keys: &[&str]) -> R<bool> {
        each!(self, b => b.check(keys).await)
    }
    async fn wait(&mut self, keys: &[&str], timeout: Duration) -> R<()> {
        each!(self, b => b.wait(keys, timeout).await)
    }
    async fn multi_get(&mut self, keys: &[&str], timeout: Duration) -> R<Vec<Vec<u8>>> {
        each!(self, b => b.multi_get(keys, timeout).await)
    }
    async fn read(&mut self, keys: &[&str]) -> R<Vec<Vec<u8>>> {
        each!(self, b => b.read(keys).await)
    }
    async fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> R<()> {
        each!(self, b => b.multi_set(pairs).await)
    }
    async fn compare_set(&mut self, key: &str, expected: &[u8], desired: &[u8]) -> R<Vec<u8>> {
        each!(self, b => b.compare_set(key, expected, desired).await)
    }
    async fn tally(&mut self, key: &str) -> R<u64> {
        each!(self, b => b.tally(key).await)
    }
    async fn tally_alive(&mut self, key: &str, ttl: Duration, place: Option<u64>) -> R<u64> {
        each!(self, b => b.tally_alive(key, ttl, place).await)
    }
    async fn tally_count(&mut self, key: &str) -> R<u64> {
        each!(self, b => b.tally_count(key).await)
    }
    async fn tally_beats(&mut self, key: &str) -> R<Option<Vec<Beat>>> {
        each!(self, b => b.tally_beats(key).await)
    }
    async fn enroll(&mut self, join: &str, nodes: &str, body: &[u8]) -> R<String> {
        each!(self, b => b.enroll(join, nodes, body).await)
    }
    async fn enrolled_count(&mut self, join: &str, nodes: &str) -> R<u32> {
        each!(self, b => b.enrolled_count(join, nodes).await)
    }
    async fn enrolled(
        &mut self,
        nodes: &str,
        count: u32,
        timeout: Duration,
    ) -> R<Vec<(String, Vec<u8>)>> {
        each!(self, b => b.enrolled(nodes, count, timeout).await)
    }
    async fn beat(&mut self, alive: &str, idx: u32, ttl: Duration) -> R<()> {
        each!(self, b => b.beat(alive, idx, ttl).await)
    }
    async fn pulses(&mut self, alive: &str, nnodes: u32) -> R<Vec<i64>> {
        each!(self, b => b.pulses(alive, nnodes).await)
    }
}
