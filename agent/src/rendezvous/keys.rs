//! Every key of the rendezvous, named once. Keys live under `toporun/<run_id>/`
//! (or `toporun/<run_id>/<key space>/` with a token):
//! - `round`: the round the job is at; nodes that stop a round move it on.
//! - `finished`: set when the job ends, so spares waiting for a next round leave.
//!
//! and under `r<round>/`:
//! - `join`: counter; c10d nodes take their ticket (join order) from it.
//! - `claim/<rank>`: a static node rank's holder (first writer keeps it).
//! - `node/<ticket>`: the node's description ([`NodeInfo`](super::NodeInfo), JSON).
//! - `layout/<ticket>`, `env/<ticket>`: its place and co-location variables.
//! - `name/<rank>`: "hostname, address", to name a node that is lost.
//! - `closed`: [`Closed`](super::Closed), written once by the coordinator.
//! - `stop`: [`StopReason`](super::StopReason), first writer wins.
//! - `alive/<rank>`, `waiting`, `done`, `done_seen`, `refused_seen`, `stop_seen`:
//!   liveness, spares, the exit barrier and stops seen.
//! - `coordinator` (etcd: the node that closes the round), `master` (etcd: the
//!   workers' store of the round), `nccl/` (the NCCL digests), `stacks/<node>` and
//!   `hang` (the job-wide hang decision), `fr/<node>` (flight-recorder dumps),
//!   `ranks/<node>`, `stragglers` and `stragglers/view` (the job-wide straggler decision
//!   and the job's rows for `toporun top`).

/// The run's keys outside any round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunKeys {
    base: String,
}

impl RunKeys {
    pub fn new(run_id: &str, key_space: Option<&str>) -> RunKeys {
        RunKeys {
            base: match key_space {
                Some(space) => format!("toporun/{run_id}/{space}/"),
                None => format!("toporun/{run_id}/"),
            },
        }
    }

    /// The round counter.
    pub fn round_counter(&self) -> String {
        format!("{}round", self.base)
    }

    /// Set once the job has ended.
    pub fn finished(&self) -> String {
        format!("{}finished", self.base)
    }

    pub fn round(&self, round: u32) -> RoundKeys {
        RoundKeys {
            prefix: format!("{}r{round}/", self.base),
        }
    }
}

/// The keys of one round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundKeys {
    prefix: String,
}

impl RoundKeys {
    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    pub fn join(&self) -> String {
        self.key("join")
    }

    pub fn claim(&self, node_rank: u32) -> String {
        self.key(&format!("claim/{node_rank}"))
    }

    /// Where node descriptions lie (`node/<ticket>`); a prefix ending in '/'.
    pub fn nodes(&self) -> String {
        self.key("node/")
    }

    pub fn node(&self, ticket: &str) -> String {
        format!("{}{ticket}", self.nodes())
    }

    pub fn layout(&self, ticket: &str) -> String {
        self.key(&format!("layout/{ticket}"))
    }

    pub fn env(&self, ticket: &str) -> String {
        self.key(&format!("env/{ticket}"))
    }

    pub fn name(&self, node_rank: u32) -> String {
        self.key(&format!("name/{node_rank}"))
    }

    /// Every node of the round and its addresses, for a peer's address to name one.
    pub fn peers(&self) -> String {
        self.key("peers")
    }

    pub fn closed(&self) -> String {
        self.key("closed")
    }

    pub fn stop(&self) -> String {
        self.key("stop")
    }

    /// Keep-alives (`alive/<rank>`); a prefix ending in '/'.
    pub fn alive(&self) -> String {
        self.key("alive/")
    }

    pub fn waiting(&self) -> String {
        self.key("waiting")
    }

    pub fn done(&self) -> String {
        self.key("done")
    }

    pub fn done_seen(&self) -> String {
        self.key("done_seen")
    }

    /// Nodes that saw the round's stop (the store's host outlives their reading it).
    pub fn stop_seen(&self) -> String {
        self.key("stop_seen")
    }

    pub fn refused_seen(&self) -> String {
        self.key("refused_seen")
    }

    pub fn coordinator(&self) -> String {
        self.key("coordinator")
    }

    pub fn master(&self) -> String {
        self.key("master")
    }

    /// The nodes' NCCL digests; a prefix ending in '/'.
    pub fn nccl(&self) -> String {
        self.key("nccl/")
    }

    /// Each node's stall and stacks, for the job-wide hang decision.
    pub fn stacks(&self, node_rank: u32) -> String {
        self.key(&format!("stacks/{node_rank}"))
    }

    /// A node's flight-recorder dumps after a failure or hang.
    pub fn flight_recorder(&self, node_rank: u32) -> String {
        self.key(&format!("fr/{node_rank}"))
    }

    /// The job-wide hang report the deciding node wrote.
    pub fn hang(&self) -> String {
        self.key("hang")
    }

    /// Each node's rank rows (wait shares, usage), for the straggler decision.
    pub fn rank_rows(&self, node_rank: u32) -> String {
        self.key(&format!("ranks/{node_rank}"))
    }

    /// The job-wide straggler decision the deciding node wrote.
    pub fn stragglers(&self) -> String {
        self.key("stragglers")
    }

    /// The job's rows for `toporun top`, bounded, as the deciding node wrote them.
    pub fn straggler_view(&self) -> String {
        self.key("stragglers/view")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sit_under_the_run_and_round() {
        let run = RunKeys::new("job", None);
        assert_eq!(run.round_counter(), "toporun/job/round");
        let r = run.round(3);
        assert_eq!(r.closed(), "toporun/job/r3/closed");
        assert_eq!(r.layout("7"), "toporun/job/r3/layout/7");
        assert_eq!(r.node("7"), format!("{}7", r.nodes()));
        assert_eq!(r.alive(), "toporun/job/r3/alive/");
    }

    #[test]
    fn a_key_space_moves_every_key() {
        let run = RunKeys::new("job", Some("abc"));
        assert_eq!(run.finished(), "toporun/job/abc/finished");
        assert_eq!(run.round(0).stop(), "toporun/job/abc/r0/stop");
    }
}
