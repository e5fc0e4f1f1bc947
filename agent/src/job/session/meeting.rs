//! Where a node meets the others once a round is placed: the workers' store (the
//! rendezvous store, or in etcd the one node rank 0 runs), under the round's keys,
//! where the node hosting it decides for the job (the hang decision, the
//! flight-recorder dumps matched across nodes).

use crate::rendezvous::{Key, RoundKeys};
use crate::store::{StoreClient, StoreError};
use std::time::{Duration, Instant};

pub struct Meeting {
    pub host: String,
    pub port: u16,
    pub keys: RoundKeys,
    pub node_rank: u32,
    pub nnodes: u32,
    /// This node decides (it hosts the workers' store).
    pub decides: bool,
}

impl Meeting {
    /// Connects within a few seconds: a store gone with its node is not waited for.
    pub async fn connect(&self) -> Result<StoreClient, StoreError> {
        StoreClient::connect(&self.host, self.port, Duration::from_secs(3)).await
    }

    /// Every node's value under `key_of(node)`, waiting at most `wait` for all of
    /// them; those that came (a node gone leaves its value out, and so does a value
    /// that is not a `T`, with a warning).
    pub async fn gather<T: serde::de::DeserializeOwned>(
        &self,
        c: &mut StoreClient,
        key_of: impl Fn(u32) -> Key<T>,
        wait: Duration,
    ) -> Result<Vec<T>, StoreError> {
        let keys: Vec<Key<T>> = (0..self.nnodes).map(key_of).collect();
        let names: Vec<&str> = keys.iter().map(|k| k.name()).collect();
        let start = Instant::now();
        loop {
            // One round trip when every node has written (each sample, usually).
            let present: Vec<&Key<T>> = if c.check(&names).await? {
                keys.iter().collect()
            } else {
                let mut some = Vec::new();
                for k in &keys {
                    if c.check(&[k.name()]).await? {
                        some.push(k);
                    }
                }
                some
            };
            if present.len() == keys.len() || start.elapsed() >= wait {
                let names: Vec<&str> = present.iter().map(|k| k.name()).collect();
                let raw = c.multi_get_now(&names).await?;
                let values = present.iter().zip(&raw);
                return Ok(values.filter_map(|(k, r)| k.decode_or_warn(r)).collect());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The value under `key`, none when absent or, with a warning, not a `T` (read
    /// now, never waited for).
    pub async fn read<T: serde::de::DeserializeOwned>(
        &self,
        c: &mut StoreClient,
        key: &Key<T>,
    ) -> Result<Option<T>, StoreError> {
        if !c.check(&[key.name()]).await? {
            return Ok(None);
        }
        let raw = c.get(key.name(), Duration::from_secs(5)).await?;
        Ok(key.decode_or_warn(&raw))
    }

    /// Writes `value` under `key`.
    pub async fn write<T: serde::Serialize>(
        &self,
        c: &mut StoreClient,
        key: &Key<T>,
        value: &T,
    ) -> Result<(), StoreError> {
        c.set(key.name(), &key.encode(value)).await
    }
}
