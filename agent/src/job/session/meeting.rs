//! Where a node meets the others once a round is placed: the workers' store (the
//! rendezvous store, or in etcd the one node rank 0 runs), under the round's keys,
//! where the node hosting it decides for the job (the hang decision, the
//! flight-recorder dumps matched across nodes).

use crate::rendezvous::RoundKeys;
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
    /// them; those that came (a node gone leaves its value out).
    pub async fn gather(
        &self,
        c: &mut StoreClient,
        key_of: impl Fn(u32) -> String,
        wait: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let keys: Vec<String> = (0..self.nnodes).map(key_of).collect();
        let start = Instant::now();
        loop {
            let mut present = Vec::new();
            for k in &keys {
                if c.check(&[k.as_str()]).await? {
                    present.push(k.as_str());
                }
            }
            if present.len() == keys.len() || start.elapsed() >= wait {
                return c.multi_get_now(&present).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The JSON value under `key`, none when absent or not of that type (read now,
    /// never waited for).
    pub async fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        c: &mut StoreClient,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        if !c.check(&[key]).await? {
            return Ok(None);
        }
        let raw = c.get(key, Duration::from_secs(5)).await?;
        Ok(serde_json::from_slice(&raw).ok())
    }
}
