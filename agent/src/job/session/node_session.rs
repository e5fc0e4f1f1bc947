//! What a node does with the rendezvous and the other nodes of its job, as one trait
//! whose defaults are a lone node's answers.

use crate::job::entry::{Entered, StopFuture};
use crate::job::error::JobError;
use crate::job::nccl_report::ReportStore;
use crate::job::session::meeting::Meeting;
use crate::job::spec::{Job, NodePlace};
use crate::rendezvous::StopReason;
use crate::store::StoreServer;
use crate::supervise::Events;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

type Result<T> = std::result::Result<T, JobError>;

/// What a node does with the rendezvous and the other nodes of its job. Alone on one
/// node there are no others: the defaults (nothing to tell, nobody to wait for) are
/// that node's answers, so callers rarely ask which kind of job it is in (the failure
/// report asks `has_peers`: a lost peer means nothing alone).
#[allow(async_fn_in_trait)] // driven on the launcher's own thread, never sent
pub trait Session {
    /// This node's place in the first round at or after `min_round` it can take
    /// part in.
    async fn join(&mut self, p: &Job, min_round: u32, events: &mut Events) -> Result<Entered>;

    /// This node's store, when it hosts one (for its counters).
    fn store(&self) -> Option<StoreServer>;

    /// The workers' store, when this node hosts it (where torch's ranks look for
    /// `exception_dump`).
    fn workers_store(&self) -> Option<StoreServer> {
        self.store()
    }

    /// Whether other nodes take part: a rank that lost a peer may then be waiting
    /// for a node to be declared lost.
    fn has_peers(&self) -> bool {
        false
    }

    /// Where this node publishes its NCCL digest for the others.
    fn report_store(&self, _round: u32, _node: &NodePlace) -> Option<ReportStore> {
        None
    }

    /// Where this node meets the others after the rendezvous: the hang decision,
    /// flight-recorder dumps.
    fn meeting(&self, _round: u32, _node: &NodePlace) -> Option<Meeting> {
        None
    }

    /// A future that resolves when another node asks every node to stop.
    async fn stop_watch(&self, _round: u32, _node: &NodePlace) -> Result<StopFuture> {
        Ok(Box::pin(std::future::pending()))
    }

    /// Where a preemption is announced to the other nodes the moment it arrives.
    async fn announcer(&self, _round: u32) -> Option<UnboundedSender<StopReason>> {
        None
    }

    /// Tells every node to stop (first reason wins); returns the reason that won.
    async fn stop_all(&mut self, _round: u32, reason: StopReason) -> StopReason {
        reason
    }

    /// A rank failed as a peer went away: the stop that came while this node waited
    /// for the loss to be declared.
    async fn hold_for_peer(&self, _node: &NodePlace) -> Option<StopReason> {
        None
    }

    /// The nodes at a peer's address, named from the round's table (this node's, where
    /// it coordinated the round, else as the coordinator published it).
    async fn nodes_at(&self, _round: u32, _peer: &str) -> Vec<String> {
        Vec::new()
    }

    /// This node is done with a round another node stopped.
    async fn stop_seen(&mut self, _round: u32) {}

    /// Before leaving a stopped job: the other nodes see why, all but `lost` of them.
    async fn linger(&mut self, _node: &NodePlace, _lost: usize) {}

    /// The exit barrier; None when every node finished.
    async fn finish(&mut self, _round: u32, _node: &NodePlace) -> Result<Option<StopReason>> {
        Ok(None)
    }

    /// Watches the workers' store for their TCPStore handshake ("init/" counter) and
    /// says when some workers connected but others did not: the signature of a rank
    /// hung in init_process_group.
    fn watch_init(&self, world: u32, grace: Duration) -> Option<tokio::task::JoinHandle<()>> {
        Some(watch_init(self.workers_store()?, world, grace))
    }
}

/// Says, each `grace`, how many of `world` workers have connected to `server` while
/// some but not all have (see [`Session::watch_init`]).
fn watch_init(server: StoreServer, world: u32, grace: Duration) -> tokio::task::JoinHandle<()> {
    let count = move || {
        server
            .get(b"init/")
            .and_then(|v| String::from_utf8_lossy(&v).parse::<u32>().ok())
            .unwrap_or(0)
    };
    let base = count();
    tokio::spawn(async move {
        let mut waited = Duration::ZERO;
        loop {
            tokio::time::sleep(grace).await;
            waited += grace;
            let n = count().saturating_sub(base);
            if n >= world {
                return;
            }
            if n > 0 {
                crate::console::say_warning!("only {n} of {world} workers have connected to the store after {:.0?}: the others are hung before or in init_process_group (crashed early, wrong MASTER_ADDR/MASTER_PORT, or blocked on a GPU); check their output", waited);
            }
        }
    })
}
