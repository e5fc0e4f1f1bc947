//! Hosting or joining the store, and every round of the job: a single node hosts its
//! own store ([`SingleNode`]); several nodes run the rendezvous protocol with
//! keep-alives, stop requests across nodes and an exit barrier ([`MultiNode`]).

pub(super) mod meeting;
mod multi_node;
mod multi_node_join;
mod node_table;
mod rdzv_connect;
mod single_node;
pub(super) mod store_host;

use crate::job::entry::{Entered, StopFuture};
use crate::job::error::JobError;
use crate::job::nccl_report::ReportStore;
use crate::job::session::meeting::Meeting;
use crate::job::session::multi_node::MultiNode;
use crate::job::session::single_node::SingleNode;
use crate::job::spec::{Job, NodePlace};
use crate::paths;
use crate::rendezvous::StopReason;
use crate::store::StoreServer;
use crate::supervise::Events;
use std::time::Duration;

pub enum Session {
    Single(SingleNode),
    Multi(Box<MultiNode>),
}

type Result<T> = std::result::Result<T, JobError>;

impl Session {
    /// Binds or connects. None when a handled signal arrived meanwhile.
    pub async fn start(p: &Job, events: &mut Events) -> Result<Option<Session>> {
        let run_id = p.opts.run_id(&paths::random_id());
        if p.opts.nnodes_max == 1 {
            return Ok(Some(Session::Single(SingleNode::start(p, run_id)?)));
        }
        Ok(MultiNode::start(p, run_id, events)
            .await?
            .map(|m| Session::Multi(Box::new(m))))
    }

    /// This node's place in the first round at or after `min_round` it can take
    /// part in.
    pub async fn join(&mut self, p: &Job, min_round: u32, events: &mut Events) -> Result<Entered> {
        match self {
            Session::Single(s) => Ok(Entered::Placed(s.place(p, min_round))),
            Session::Multi(m) => m.join(p, min_round, events).await,
        }
    }

    /// This node's store, when it hosts one (for its counters).
    pub fn store(&self) -> Option<StoreServer> {
        match self {
            Session::Single(s) => Some(s.server.clone()),
            Session::Multi(m) => m.server.clone(),
        }
    }

    /// Where this node publishes its NCCL digest (multi-node jobs only).
    pub fn report_store(&self, round: u32, node: &NodePlace) -> Option<ReportStore> {
        match self {
            Session::Single(_) => None,
            Session::Multi(m) => Some(m.report_store(round, node)),
        }
    }

    /// Where this node meets the others after the rendezvous: the hang decision,
    /// flight-recorder dumps (multi-node jobs only).
    pub fn meeting(&self, round: u32, node: &NodePlace) -> Option<Meeting> {
        match self {
            Session::Single(_) => None,
            Session::Multi(m) => Some(m.meeting(round, node)),
        }
    }

    /// The workers' store, when this node hosts it (where torch's ranks look for
    /// `exception_dump`).
    pub fn workers_store(&self) -> Option<StoreServer> {
        match self {
            Session::Single(s) => Some(s.server.clone()),
            Session::Multi(m) => m.server.clone().or_else(|| m.round_server.clone()),
        }
    }

    /// A future that resolves when another node asks every node to stop.
    pub async fn stop_watch(&self, round: u32, node: &NodePlace) -> Result<StopFuture> {
        match self {
            Session::Single(_) => Ok(Box::pin(std::future::pending())),
            Session::Multi(m) => m.stop_watch(round, node).await,
        }
    }

    /// Where a preemption is announced to the other nodes the moment it arrives
    /// (none on a single node).
    pub async fn announcer(
        &self,
        round: u32,
    ) -> Option<tokio::sync::mpsc::UnboundedSender<StopReason>> {
        match self {
            Session::Single(_) => None,
            Session::Multi(m) => m.announcer(round).await,
        }
    }

    /// Tells every node to stop (first reason wins); returns the reason that won.
    pub async fn stop_all(&mut self, round: u32, reason: StopReason) -> StopReason {
        match self {
            Session::Single(_) => reason,
            Session::Multi(m) => m.stop_all(round, reason).await,
        }
    }

    /// A rank failed as a peer went away: the stop that came while this node waited
    /// for the loss to be declared (multi-node only).
    pub async fn hold_for_peer(&self, node: &NodePlace) -> Option<StopReason> {
        match self {
            Session::Single(_) => None,
            Session::Multi(m) => m.hold_for_peer(node.round, node).await,
        }
    }

    /// The nodes at a peer's address, named from the round's table (this node's, where
    /// it coordinated the round, else as the coordinator published it).
    pub async fn nodes_at(&self, round: u32, peer: &str) -> Vec<String> {
        match self {
            Session::Single(_) => Vec::new(),
            Session::Multi(m) => m.nodes_at(round, peer).await,
        }
    }

    /// This node is done with a round another node stopped (multi-node only).
    pub async fn stop_seen(&mut self, round: u32) {
        if let Session::Multi(m) = self {
            m.stop_seen(round).await;
        }
    }

    /// Before leaving a stopped job: the other nodes see why (multi-node only), all
    /// but `lost` of them.
    pub async fn linger(&mut self, node: &NodePlace, lost: usize) {
        if let Session::Multi(m) = self {
            m.linger(node.round, node.nnodes, lost).await;
        }
    }

    /// The exit barrier; None when every node finished.
    pub async fn finish(&mut self, round: u32, node: &NodePlace) -> Result<Option<StopReason>> {
        match self {
            Session::Single(_) => Ok(None),
            Session::Multi(m) => m.finish(round, node).await,
        }
    }

    /// Watches the workers' store for their TCPStore handshake ("init/" counter) and
    /// says when some workers connected but others did not: the signature of a rank
    /// hung in init_process_group.
    pub fn watch_init(&self, world: u32, grace: Duration) -> Option<tokio::task::JoinHandle<()>> {
        let server = self.workers_store()?;
        let count = move || {
            server
                .get(b"init/")
                .and_then(|v| String::from_utf8_lossy(&v).parse::<u32>().ok())
                .unwrap_or(0)
        };
        let base = count();
        Some(tokio::spawn(async move {
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
        }))
    }
}
