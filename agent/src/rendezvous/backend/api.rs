//! What the rendezvous asks of the place its state lives, and what that place can
//! do: callers ask a capability (`leases`, `tickets_are_join_order`...), never which
//! backend it is.

use super::etcd_client::EtcdError;
use crate::store::StoreError;
use std::future::Future;
use std::time::Duration;

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

pub type R<T> = Result<T, KvError>;

/// A place counted by `tally_alive`, and its beat counter's reading.
pub type Beat = (u64, i64);

/// The operations the protocol uses; each backend does them its own way where that
/// matters (a TCPStore counts with ADD, etcd with one key per node).
pub trait Backend: Send {
    /// A TCPStore numbers c10d nodes by join order, so a node's ticket is its node
    /// rank; etcd orders them by creation, known only to the coordinator.
    fn tickets_are_join_order(&self) -> bool;
    /// Liveness is a lease: a node that dies takes its keys with it (an absent
    /// keep-alive is a lost node; a spare that dies drops out of the count).
    fn leases(&self) -> bool;
    /// The state lives in one node's process: when it goes, that node has gone.
    fn hosted_by_a_node(&self) -> bool;
    /// This connection's own name, for claims that must tell writers apart (etcd's
    /// per-round coordinator); None where a node is chosen otherwise.
    fn identity(&self) -> Option<&str>;
    /// Operations sent so far.
    fn ops(&self) -> u64;

    fn set(&mut self, key: &str, value: &[u8]) -> impl Future<Output = R<()>> + Send;
    /// Whether every key exists now.
    fn check(&mut self, keys: &[&str]) -> impl Future<Output = R<bool>> + Send;
    /// Waits until every key exists.
    fn wait(&mut self, keys: &[&str], timeout: Duration) -> impl Future<Output = R<()>> + Send;
    /// Waits for the keys, then reads them.
    fn multi_get(
        &mut self,
        keys: &[&str],
        timeout: Duration,
    ) -> impl Future<Output = R<Vec<Vec<u8>>>> + Send;
    /// Reads keys known to exist; an absent key is garbage.
    fn read(&mut self, keys: &[&str]) -> impl Future<Output = R<Vec<Vec<u8>>>> + Send;
    fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> impl Future<Output = R<()>> + Send;
    /// TCPStore's compare_set: returns the value the key holds afterwards.
    fn compare_set(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> impl Future<Output = R<Vec<u8>>> + Send;
    /// Counts this node once under `key`; returns the count so far.
    fn tally(&mut self, key: &str) -> impl Future<Output = R<u64>> + Send;
    /// Counts this node under `key` for as long as it lives, a call every
    /// keep-alive: the first (`place` None) joins the count and returns this node's
    /// place in it, later calls pass the place back. Where `leases`, the lease keeps
    /// it counted; a counter that cannot forget moves the place's beat instead.
    fn tally_alive(
        &mut self,
        key: &str,
        ttl: Duration,
        place: Option<u64>,
    ) -> impl Future<Output = R<u64>> + Send;
    /// How many nodes `tally` (or `tally_alive`, alive or not) counted under `key`.
    fn tally_count(&mut self, key: &str) -> impl Future<Output = R<u64>> + Send;
    /// The places `tally_alive` counted under `key` (the newest, a bounded number),
    /// each with a reading that moves while its node lives; None where `leases` keep
    /// the count itself alive.
    fn tally_beats(&mut self, key: &str) -> impl Future<Output = R<Option<Vec<Beat>>>> + Send;
    /// Enters a c10d round: writes the node's description under `nodes` + ticket
    /// and returns the ticket (`join` is the join counter).
    fn enroll(
        &mut self,
        join: &str,
        nodes: &str,
        body: &[u8],
    ) -> impl Future<Output = R<String>> + Send;
    /// Nodes enrolled so far.
    fn enrolled_count(&mut self, join: &str, nodes: &str) -> impl Future<Output = R<u32>> + Send;
    /// The first `count` enrolled nodes' tickets and descriptions, in node-rank order.
    fn enrolled(
        &mut self,
        nodes: &str,
        count: u32,
        timeout: Duration,
    ) -> impl Future<Output = R<Vec<(String, Vec<u8>)>>> + Send;
    /// One keep-alive of node `idx` under `alive` (a prefix ending in '/').
    fn beat(&mut self, alive: &str, idx: u32, ttl: Duration) -> impl Future<Output = R<()>> + Send;
    /// One reading per node of `0..nnodes` that changes while the node keeps
    /// beating (-1: absent).
    fn pulses(&mut self, alive: &str, nnodes: u32) -> impl Future<Output = R<Vec<i64>>> + Send;
}

/// A counter read back from the state: never negative, whoever wrote it.
pub fn count(key: &str, n: i64) -> R<u64> {
    u64::try_from(n).map_err(|_| {
        KvError::Garbage(format!(
            "the counter {key} reads {n}: another client of the store wrote it"
        ))
    })
}
