//! `--network-check` in a multi-node round: once the round placed this node and
//! before its ranks start, the nodes measure the paths between them; a slow node is
//! named (report), or refused (gate): the others go on in a new round a spare may
//! join, or, where the job cannot lose it, every node exits with the peer class.

use crate::job::error::JobError;
use crate::job::session::multi_node::MultiNode;
use crate::job::spec::{Job, NodePlace};
use crate::network_check::exchange::{run, CheckNode};
use crate::rendezvous::Shape;
use toporun_shared::network_check::report::{Gate, NetworkReport};
use toporun_shared::network_check::CheckMode;

/// What the check left for this node.
pub(super) enum Checked {
    /// Its ranks start (with the report, where the check ran).
    Go(Option<NetworkReport>),
    /// The job goes on without a refused node, in the next round.
    NextRound,
}

impl MultiNode {
    /// Runs the check of `node`'s round as `--network-check` says.
    pub(super) async fn check_network(
        &mut self,
        p: &Job,
        node: &NodePlace,
    ) -> Result<Checked, JobError> {
        let mode = p.rdzv.network_check;
        if mode == CheckMode::Off || node.nnodes < 2 {
            return Ok(Checked::Go(None));
        }
        let me = CheckNode {
            round: node.round,
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            host: &self.info.hostname,
            addr: &self.info.addr,
            ips: &self.info.ips,
            nics: &p.facts.nics,
            hosts_rendezvous: self.state.hosted_here(),
        };
        let keys = self.cfg.round_keys(node.round);
        let report = match run(&mut self.client, &keys, &me).await {
            Ok(r) => r,
            Err(e) => {
                crate::console::say_warning!("the network check of round {} did not finish ({e}); the ranks start without it (--network-check off skips it)", node.round);
                return Ok(Checked::Go(None));
            }
        };
        crate::console::say!("toporun: {}", report.summary());
        for line in report.named() {
            crate::console::say_warning!("network check: {line} [network.slow-node]");
        }
        if mode == CheckMode::Report {
            return Ok(Checked::Go(Some(report)));
        }
        let elastic_min = match self.cfg.shape {
            Shape::Elastic { min, .. } => Some(min),
            Shape::Static { .. } => None,
        };
        gate(&report, report.gate(elastic_min), node)
    }
}

/// What `--network-check gate` does on this node.
fn gate(report: &NetworkReport, decision: Gate, node: &NodePlace) -> Result<Checked, JobError> {
    let named = report.named().join("; ");
    match decision {
        Gate::Pass => Ok(Checked::Go(Some(report.clone()))),
        Gate::Without(slow) if slow.contains(&node.node_rank) => Err(JobError::NetworkRefused(format!(
            "--network-check gate refused this node (node rank {} of round {}): {named}; the other nodes go on without it",
            node.node_rank, node.round
        ))),
        Gate::Without(slow) => {
            crate::console::say!("toporun: --network-check gate refused node(s) {slow:?}; the job goes on without them in round {} (a waiting spare joins it)", node.round + 1);
            Ok(Checked::NextRound)
        }
        Gate::Stop(why) => Err(JobError::NetworkRefused(format!(
            "--network-check gate: {named}; {why}, so every node stops; no rank was started"
        ))),
    }
}
