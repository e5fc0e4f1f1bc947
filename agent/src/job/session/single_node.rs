//! A one-node job: it hosts its own store, loopback-only unless the user named an
//! address others can reach, and every round places all ranks on this node.

use crate::job::entry::Entered;
use crate::job::error::JobError;
use crate::job::session::node_session::Session;
use crate::job::session::store_host::{bind, is_loopback};
use crate::job::spec::{Job, NodePlace};
use crate::store::{Reach, StoreServer};
use crate::supervise::Events;

pub struct SingleNode {
    run_id: String,
    store_host: String,
    server: StoreServer,
}

impl SingleNode {
    pub fn start(p: &Job, run_id: String) -> Result<SingleNode, JobError> {
        let (store_host, port) = p.opts.store_address();
        let reach = if is_loopback(&store_host) {
            Reach::Loopback
        } else {
            Reach::All
        };
        let server = bind(p, port, reach)?;
        Ok(SingleNode {
            run_id,
            store_host,
            server,
        })
    }

    pub fn place(&self, p: &Job, round: u32) -> NodePlace {
        let store = (self.store_host.clone(), self.server.port());
        NodePlace::one_node(p.nproc, self.run_id.clone(), round, store)
    }
}

impl Session for SingleNode {
    async fn join(&mut self, p: &Job, min_round: u32, _: &mut Events) -> Result<Entered, JobError> {
        // Each round's workers meet a clean store, as on several nodes: a restart after
        // a hang found the last round's `exception_dump` (set by NCCL's watchdog, or by
        // toporun asking for dumps) and its ranks dumped and died at once (4x H200).
        self.server.forget_workers();
        Ok(Entered::Placed(self.place(p, min_round)))
    }

    fn store(&self) -> Option<StoreServer> {
        Some(self.server.clone())
    }
}
