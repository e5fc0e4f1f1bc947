//! Every key of the rendezvous, named once. Keys live under `toporun/<run_id>/`
//! (or `toporun/<run_id>/<key space>/` with a token):
//! - `round`: the round the job is at; nodes that stop a round move it on.
//! - `finished`: set when the job ends, so spares waiting for a next round leave.
//! - `refused/<machine>`: a machine `--network-check gate` refused, which does not
//!   join again.
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
//!   liveness, spares, the exit barrier and stops seen. The backend keeps what it
//!   needs under a counted key (etcd: one key per node; a TCPStore: `waiting/beat/
//!   <place>`, each spare's beat).
//! - `coordinator` (etcd: the node that closes the round), `master` (etcd: the
//!   workers' store of the round), `nccl/<node>` (the NCCL digests), `stacks/<node>` and
//!   `hang` (the job-wide hang decision), `fr/<node>` (flight-recorder dumps),
//!   `ranks/<node>`, `stragglers` and `stragglers/view` (the job-wide straggler decision
//!   and the job's rows for `toporun top`).
//! - `net/mode`, `net/listen/<node>`, `net/done/<k>`, `net/record/<node>`, `net/records`,
//!   `net/report`, `net/seen`: the network check (each node's probe listener, the probe rounds done,
//!   what each node received, the deciding node's report, the nodes that read it).
//!
//! A key whose value is JSON is a [`Key<T>`](super::typed_key::Key): the builder
//! names the value's type, and reading it gives that type or `Unreadable`.

use super::node_info::{NodeInfo, NodeMachine};
use super::typed_key::Key;
use toporun_shared::colocation::NodeEnv;
use toporun_shared::flight_recorder::Dump;
use toporun_shared::nccl_log::Digest;
use toporun_shared::network_check::report::{NetworkReport, NodeRecord};
use toporun_shared::network_check::{CheckMode, Listener, PathVote};
use toporun_shared::root_cause::peer::NodeAddrs;
use toporun_shared::stacks::hang_report::HangNotice;
use toporun_shared::stacks::job_view::NodeStacks;
use toporun_shared::stacks::straggler::{RankRow, StragglerNotice};
use toporun_shared::stacks::top_table::JobView;

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

    /// A machine (boot id, else host name) the network check refused in this run.
    pub fn refused(&self, machine: &str) -> String {
        format!("{}refused/{machine}", self.base)
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

    /// Where node descriptions lie (`node/<ticket>`): a prefix ending in '/', each
    /// value under it a node description.
    pub fn nodes(&self) -> Key<NodeInfo> {
        Key::new(self.key("node/"), "a node description")
    }

    pub fn node(&self, ticket: &str) -> Key<NodeInfo> {
        Key::new(
            format!("{}{ticket}", self.nodes().name()),
            "a node description",
        )
    }

    pub fn layout(&self, ticket: &str) -> String {
        self.key(&format!("layout/{ticket}"))
    }

    pub fn env(&self, ticket: &str) -> Key<NodeEnv> {
        let name = self.key(&format!("env/{ticket}"));
        Key::new(name, "co-location variables")
    }

    pub fn name(&self, node_rank: u32) -> String {
        self.key(&format!("name/{node_rank}"))
    }

    /// Every node of the round and its addresses, for a peer's address to name one.
    pub fn peers(&self) -> Key<Vec<NodeAddrs>> {
        Key::new(self.key("peers"), "the round's table of nodes")
    }

    /// The machine (boot id) of each node of the round and its rank count: every
    /// node judges NCCL's links with it, not only the one that coordinated.
    pub fn machines(&self) -> Key<Vec<NodeMachine>> {
        Key::new(self.key("machines"), "the round's machines")
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

    /// A node's NCCL digest (`nccl/<node>`).
    pub fn nccl(&self, node_rank: u32) -> Key<Digest> {
        Key::new(self.key(&format!("nccl/{node_rank}")), "an NCCL digest")
    }

    /// Each node's stall and stacks, for the job-wide hang decision.
    pub fn stacks(&self, node_rank: u32) -> Key<NodeStacks> {
        let name = self.key(&format!("stacks/{node_rank}"));
        Key::new(name, "a node's stacks")
    }

    /// A node's flight-recorder dumps after a failure or hang.
    pub fn flight_recorder(&self, node_rank: u32) -> Key<Vec<Dump>> {
        let name = self.key(&format!("fr/{node_rank}"));
        Key::new(name, "flight-recorder dumps")
    }

    /// The job-wide hang report the deciding node wrote.
    pub fn hang(&self) -> Key<HangNotice> {
        Key::new(self.key("hang"), "a hang notice")
    }

    /// Each node's rank rows (wait shares, usage), for the straggler decision.
    pub fn rank_rows(&self, node_rank: u32) -> Key<Vec<RankRow>> {
        Key::new(self.key(&format!("ranks/{node_rank}")), "rank rows")
    }

    /// The job-wide straggler decision the deciding node wrote.
    pub fn stragglers(&self) -> Key<StragglerNotice> {
        Key::new(self.key("stragglers"), "a straggler notice")
    }

    /// The network check the round runs, as its coordinator decided it.
    pub fn network_mode(&self) -> Key<CheckMode> {
        Key::new(self.key("net/mode"), "a network-check mode")
    }

    /// Where node `node_rank` listens for the network check's probes.
    pub fn probe_listener(&self, node_rank: u32) -> Key<Listener> {
        let name = self.key(&format!("net/listen/{node_rank}"));
        Key::new(name, "a probe listener")
    }

    /// Node `node_rank`'s word on measuring through torch.
    pub fn network_path_vote(&self, node_rank: u32) -> Key<PathVote> {
        let name = self.key(&format!("net/path/{node_rank}"));
        Key::new(name, "a network-check path vote")
    }

    /// Nodes that said whether they measure through torch.
    pub fn network_path_votes(&self) -> String {
        self.key("net/paths")
    }

    /// What carries the round's probes, as node rank 0 decided from the votes.
    pub fn network_path(&self) -> Key<PathVote> {
        Key::new(self.key("net/path"), "a network-check path")
    }

    /// The prefix of the torch probes' keys in the workers' store.
    pub fn torch_probe_prefix(&self) -> String {
        self.key("net/torch/")
    }

    /// Nodes done with the network check's probe round `k`.
    pub fn probe_round_done(&self, k: usize) -> String {
        self.key(&format!("net/done/{k}"))
    }

    /// What node `node_rank` received in the network check.
    pub fn network_record(&self, node_rank: u32) -> Key<NodeRecord> {
        let name = self.key(&format!("net/record/{node_rank}"));
        Key::new(name, "a network-check record")
    }

    /// Nodes that wrote their network-check record.
    pub fn network_records(&self) -> String {
        self.key("net/records")
    }

    /// Nodes that read the network check's report (none leaves before all have).
    pub fn network_seen(&self) -> String {
        self.key("net/seen")
    }

    /// The network check's report, as the deciding node judged it.
    pub fn network_report(&self) -> Key<NetworkReport> {
        Key::new(self.key("net/report"), "a network-check report")
    }

    /// The job's rows for `toporun top`, bounded, as the deciding node wrote them.
    pub fn straggler_view(&self) -> Key<JobView> {
        Key::new(self.key("stragglers/view"), "the job's rank rows")
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
        assert_eq!(r.node("7").name(), format!("{}7", r.nodes().name()));
        assert_eq!(r.env("7").name(), "toporun/job/r3/env/7");
        assert_eq!(r.alive(), "toporun/job/r3/alive/");
    }

    #[test]
    fn a_key_space_moves_every_key() {
        let run = RunKeys::new("job", Some("abc"));
        assert_eq!(run.finished(), "toporun/job/abc/finished");
        assert_eq!(run.round(0).stop(), "toporun/job/abc/r0/stop");
    }
}
