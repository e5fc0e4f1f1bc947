//! `--network-check` in a multi-node round: once the round placed this node and
//! before its ranks start, the nodes measure the paths between them; a slow node is
//! named (report), or refused (gate): the others go on in a new round a spare may
//! join, or, where the job cannot lose it, every node exits with the peer class. A
//! refused node's link (machine and network namespace) is remembered under the run's
//! keys, so its container, restarted, does not rejoin (and restart) the job it was
//! refused from.

use crate::job::error::JobError;
use crate::job::session::multi_node::MultiNode;
use crate::job::session::rdzv_connect::until_signal;
use crate::job::spec::{Job, NodePlace};
use crate::network_check::exchange::{run, CheckNode, GateRule};
use crate::network_check::torch_path::{TorchProbe, TorchSide};
use crate::rendezvous::{Backend, Shape};
use crate::supervise::Events;
use std::time::Duration;
use toporun_shared::finding_id::FindingId;
use toporun_shared::network_check::report::{Gate, NetworkReport};
use toporun_shared::network_check::CheckMode;
use toporun_shared::untrusted::printable;

/// What the check left for this node.
pub(super) enum Checked {
    /// Its ranks start (with the report, where the check ran).
    Go(Option<NetworkReport>),
    /// The job goes on without a refused node, in the next round.
    NextRound,
    /// A handled signal arrived meanwhile.
    Signal,
}

impl MultiNode {
    /// Runs the check of `node`'s round as `--network-check` says.
    pub(super) async fn check_network(
        &mut self,
        p: &Job,
        node: &NodePlace,
        events: &mut Events,
    ) -> Result<Checked, JobError> {
        let mode = self.round_mode(p, node).await;
        let warm = self.torch_probe.take();
        if mode == CheckMode::Off || node.nnodes < 2 {
            if let Some(w) = warm {
                w.end().await;
            }
            return Ok(Checked::Go(None));
        }
        let elastic_min = match self.cfg.shape {
            Shape::Elastic { min, .. } => Some(min),
            Shape::Static { .. } => None,
        };
        let me = CheckNode {
            round: node.round,
            node_rank: node.node_rank,
            nnodes: node.nnodes,
            host: &self.info.hostname,
            addr: &self.info.addr,
            ips: &self.info.ips,
            nics: &p.facts.nics,
            hosts_rendezvous: self.state.hosted_here(),
            rdma: p.facts.rdma.iter().any(|d| d.uverbs_openable),
            spare_beat: self.cfg.keepalive_interval,
            gate: (mode == CheckMode::Gate).then_some(GateRule { elastic_min }),
        };
        let keys = self.cfg.round_keys(node.round);
        let torch = torch_side(p, node, warm);
        let checked = tokio::select! {
            r = run(&mut self.client, &keys, &me, torch) => r,
            _ = until_signal(events) => return Ok(Checked::Signal),
        };
        let report = match checked
            .map_err(|e| e.to_string())
            .and_then(|r| fits(r, node))
        {
            Ok(r) => r,
            Err(e) => return not_done(mode, node, &e),
        };
        say(&report);
        if mode == CheckMode::Report {
            return Ok(Checked::Go(Some(report)));
        }
        let decision = report.gate(elastic_min);
        if let Gate::Without(slow) = &decision {
            if slow.contains(&node.node_rank) {
                self.remember_refused(&report).await;
            }
        }
        gate(&report, decision, node)
    }

    /// The mode the round runs: the least its nodes asked for, as its coordinator
    /// wrote it (this node's own where it cannot be read), said where it is less.
    async fn round_mode(&mut self, p: &Job, node: &NodePlace) -> CheckMode {
        let own = p.rdzv.network_check;
        if own == CheckMode::Off || node.nnodes < 2 {
            return own;
        }
        let key = self.cfg.round_keys(node.round).network_mode();
        // Written with the round's layout, which this node has read.
        let read = self.client.get(key.name(), Duration::from_secs(2)).await;
        let round = read
            .ok()
            .and_then(|raw| key.decode(&raw).ok())
            .unwrap_or(own);
        if round < own {
            crate::console::say!("toporun: the network check of round {} runs as --network-check {}: another node of the round asked for that", node.round, round.as_str());
        }
        round.min(own)
    }

    /// This node's link, refused: its container, restarted (a podFailurePolicy
    /// ignores exit 82), finds it at its first join and leaves at once.
    async fn remember_refused(&mut self, report: &NetworkReport) {
        let key = self.cfg.keys().refused(&self.machine());
        let why = report.named().join("; ");
        let _ = self.client.set(&key, why.as_bytes()).await;
    }

    /// Refuses a machine the network check refused earlier in this run.
    pub(super) async fn refuse_refused_machine(&mut self) -> Result<(), JobError> {
        let key = self.cfg.keys().refused(&self.machine());
        if !self.client.check(&[&key]).await.unwrap_or(false) {
            return Ok(());
        }
        let why = self.client.get(&key, self.cfg.read_timeout).await;
        let why = why
            .map(|w| printable(&String::from_utf8_lossy(&w)))
            .unwrap_or_default();
        Err(JobError::NetworkRefused(format!(
            "--network-check gate refused this machine ({}) earlier in rendezvous {}: {why}; run this pod on another node, or give the job a new --rdzv-id",
            printable(&self.machine()),
            self.run_id
        )))
    }

    /// This node's link: its machine (boot id, else host name) and its network
    /// namespace, which a container restarted in its pod keeps (and a hostNetwork pod
    /// shares with the host), while another pod on the machine has its own.
    fn machine(&self) -> String {
        let machine = self.info.boot_id.as_deref().unwrap_or(&self.info.hostname);
        match self.info.net_ns {
            Some(ns) => format!("{machine}-net{ns}"),
            None => machine.to_string(),
        }
    }
}

/// This node's side of the torch path: the probe started before the round closed
/// (else now), with the node's co-location variables to apply before NCCL starts.
fn torch_side<'a>(
    p: &Job,
    node: &'a NodePlace,
    warm: Option<TorchProbe>,
) -> Result<TorchSide<'a>, String> {
    let backend = p.torch_probe_backend()?;
    let probe = match warm {
        Some(w) => Ok(w),
        None => TorchProbe::start(&p.python, backend, &p.stand_in_env()),
    };
    Ok(TorchSide {
        probe,
        store: (&node.master_addr, node.master_port),
        env: p.node_additions(node),
    })
}

impl MultiNode {
    /// Starts the torch probe before the round closes, where the check will use one.
    pub(super) fn warm_torch_probe(&mut self, p: &Job) {
        let may_run = p.rdzv.network_check != CheckMode::Off && p.opts.nnodes_max >= 2;
        if self.torch_probe.is_none() && may_run {
            let backend = p.torch_probe_backend().ok();
            self.torch_probe =
                backend.and_then(|b| TorchProbe::start(&p.python, b, &p.stand_in_env()).ok());
        }
    }
}

/// The report, where it is of this round and of every node in it.
fn fits(r: NetworkReport, node: &NodePlace) -> Result<NetworkReport, String> {
    let all = r.nodes.len() == node.nnodes as usize;
    match r.round == node.round && all {
        true => Ok(r),
        false => Err(format!(
            "its report is of round {} and {} nodes, not of round {} and {}",
            r.round,
            r.nodes.len(),
            node.round,
            node.nnodes
        )),
    }
}

/// The summary, and a warning per named node.
fn say(report: &NetworkReport) {
    crate::console::say!("toporun: {}", report.summary());
    let id = FindingId::NetworkSlowNode;
    for line in report.named() {
        crate::console::say_warning!("network check: {line} [{id}]");
    }
}

/// A check that did not finish: the ranks start without it, except under gate,
/// where the other nodes may have refused one and moved on.
fn not_done(mode: CheckMode, node: &NodePlace, e: &str) -> Result<Checked, JobError> {
    if mode == CheckMode::Gate {
        return Err(JobError::Failed(format!("the network check of round {} did not finish ({e}); under --network-check gate no rank starts without it (--network-check report starts them)", node.round)));
    }
    crate::console::say_warning!("the network check of round {} did not finish ({e}); the ranks start without it (--network-check off skips it)", node.round);
    Ok(Checked::Go(None))
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
