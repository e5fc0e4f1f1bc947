//! Where a multi-node job's rendezvous state lives: a store one node hosts (static,
//! c10d) or an etcd cluster. Every answer that depends on which is given here, so the
//! rest of the session asks what it needs (a connection, who watches, who lingers)
//! instead of which backend it runs on.

use crate::job::error::JobError;
use crate::rendezvous::etcd_client::Etcd;
use crate::rendezvous::{Config, EtcdKv, Kv, StoreKv};
use crate::store::StoreClient;
use std::time::Duration;
use toporun_shared::untrusted::printable;

pub(super) enum RdzvState {
    /// The store at `host:port`; `hosted`: this node runs it.
    Store {
        host: String,
        port: u16,
        hosted: bool,
    },
    Etcd(Etcd),
}

impl RdzvState {
    /// Another connection to the state (its own lease in etcd).
    pub async fn connect(&self, cfg: &Config) -> Result<Kv, JobError> {
        self.connect_at(cfg, None).await
    }

    /// A connection for the round's coordinator, which runs beside the store it
    /// hosts (over loopback), or anywhere in etcd.
    pub async fn connect_here(&self, cfg: &Config) -> Result<Kv, JobError> {
        self.connect_at(cfg, Some("127.0.0.1")).await
    }

    async fn connect_at(&self, cfg: &Config, here: Option<&str>) -> Result<Kv, JobError> {
        let (host, port) = match self {
            RdzvState::Etcd(e) => return Ok(Kv::Etcd(EtcdKv::new(e.clone()))),
            RdzvState::Store { host, port, .. } => (here.unwrap_or(host), *port),
        };
        let mut c = StoreClient::connect(host, port, Duration::from_secs(30))
            .await
            .map_err(|e| JobError::failed("connecting to the rendezvous store", e))?;
        c.set_deadline(cfg.read_timeout);
        Ok(Kv::Store(StoreKv(c)))
    }

    /// This node runs the store the others use (never in etcd).
    pub fn hosted_here(&self) -> bool {
        matches!(self, RdzvState::Store { hosted: true, .. })
    }

    /// Whether this node looks at the others' keep-alives: the store's host, or every
    /// node where no node hosts the state.
    pub fn watches(&self) -> bool {
        !matches!(self, RdzvState::Store { hosted: false, .. })
    }

    /// Whether this node, as node rank `node_rank`, hosts the round's workers' store
    /// (and so decides what meets there): the store's host, or in etcd node rank 0,
    /// which starts one each round.
    pub fn hosts_workers_store(&self, node_rank: u32) -> bool {
        match self {
            RdzvState::Etcd(_) => node_rank == 0,
            RdzvState::Store { hosted, .. } => *hosted,
        }
    }

    /// The workers' store where it is the rendezvous store itself (static, c10d); None
    /// in etcd, where node rank 0 of each round starts one.
    pub fn fixed_workers_store(&self) -> Option<(String, u16)> {
        match self {
            RdzvState::Store { host, port, .. } => Some((host.clone(), *port)),
            RdzvState::Etcd(_) => None,
        }
    }

    /// Where the rendezvous lives, for messages.
    pub fn describe(&self) -> String {
        match self {
            RdzvState::Etcd(e) => format!("etcd at {}", e.endpoints()),
            RdzvState::Store { host, .. } => host.clone(),
        }
    }

    /// How to clear a finished run's keys where they outlive the job (etcd).
    pub fn clear_hint(&self, run_id: &str) -> String {
        match self {
            RdzvState::Etcd(_) => format!(
                " (etcd keeps a run's keys: etcdctl del --prefix toporun/{} removes them)",
                printable(run_id)
            ),
            RdzvState::Store { .. } => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(hosted: bool) -> RdzvState {
        RdzvState::Store {
            host: "node-0".into(),
            port: 29400,
            hosted,
        }
    }

    #[test]
    fn the_stores_host_watches_hosts_and_lingers_the_others_do_not() {
        let (host, other) = (store(true), store(false));
        assert!(host.hosted_here() && host.watches() && host.hosts_workers_store(3));
        assert!(!other.hosted_here() && !other.watches() && !other.hosts_workers_store(0));
        // The workers meet in the rendezvous store itself, whoever asks.
        assert_eq!(other.fixed_workers_store(), Some(("node-0".into(), 29400)));
        assert_eq!(other.describe(), "node-0");
        assert_eq!(other.clear_hint("job"), "");
    }
}
