//! Hosting or joining the store, and every round of the job: a single node hosts its
//! own store ([`SingleNode`]); several nodes run the rendezvous protocol with
//! keep-alives, stop requests across nodes and an exit barrier ([`MultiNode`]).

pub(super) mod meeting;
mod multi_node;
mod multi_node_join;
mod network_gate;
mod node_session;
mod node_table;
mod rdzv_connect;
mod rdzv_state;
mod single_node;
pub(super) mod store_host;

pub use node_session::Session;

use crate::job::error::JobError;
use crate::job::session::multi_node::MultiNode;
use crate::job::session::single_node::SingleNode;
use crate::job::spec::Job;
use crate::paths;
use crate::supervise::Events;

/// The session a job starts with: the one place that knows the kinds.
pub enum Started {
    Single(SingleNode),
    Multi(Box<MultiNode>),
}

type Result<T> = std::result::Result<T, JobError>;

impl Started {
    /// Binds or connects. None when a handled signal arrived meanwhile.
    pub async fn start(p: &Job, events: &mut Events) -> Result<Option<Started>> {
        let run_id = p.opts.run_id(&paths::random_id());
        if p.opts.nnodes_max == 1 {
            return Ok(Some(Started::Single(SingleNode::start(p, run_id)?)));
        }
        Ok(MultiNode::start(p, run_id, events)
            .await?
            .map(|m| Started::Multi(Box::new(m))))
    }
}
