//! The check's outcome for people and programs: what each node wrote (the paths it
//! received on, where its peers reached it), the verdict over all of them, and the
//! lines the deciding node says.

use super::path::DataPath;
use super::schedule::{rounds, Path};
use super::verdict::{judge, NodeFigure, PathFigure, SlowBy, SlowNode, Verdict};
use crate::untrusted::printable;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What one node measured: the paths it received on (the receiver times them), and
/// where its peers reached it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node: u32,
    pub host: String,
    /// The address its peers connected to.
    pub addr: String,
    /// The interface that address is on, and that interface's rate, where known.
    pub interface: Option<String>,
    pub expected_gbit: Option<f64>,
    pub received: Vec<PathFigure>,
    /// It hosts the rendezvous store: the job cannot go on without it.
    #[serde(default)]
    pub hosts_rendezvous: bool,
    /// It has EFA or InfiniBand devices: NCCL's data path is not the TCP one measured.
    #[serde(default)]
    pub rdma: bool,
    /// What carried its probes (every node of a round agrees on it).
    #[serde(default)]
    pub via: DataPath,
}

/// A node's figures with where it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeLine {
    #[serde(flatten)]
    pub figure: NodeFigure,
    pub host: Option<String>,
    pub addr: Option<String>,
    pub interface: Option<String>,
}

/// The check of one round, as the deciding node judged it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkReport {
    pub round: u32,
    pub nodes: Vec<NodeLine>,
    pub slow: Vec<SlowNode>,
    /// Nodes whose record never came (counted as having received nothing).
    pub silent: Vec<u32>,
    /// The node that hosts the rendezvous store, if one does.
    pub rendezvous_host: Option<u32>,
    /// Nodes waiting to join the next round when it was judged (spares): every node
    /// gates on this one count.
    pub spares: u32,
    /// A node has EFA or InfiniBand: the TCP path measured is not NCCL's data path,
    /// and the gate refuses no one on it.
    #[serde(default)]
    pub rdma: bool,
    /// What carried the probes.
    #[serde(default)]
    pub via: DataPath,
    /// How long the check took, end to end on the deciding node (ms).
    pub took_ms: u64,
}

impl NetworkReport {
    /// Judges `nnodes` nodes of round `round` from the records that came.
    pub fn judge(round: u32, nnodes: u32, records: &[NodeRecord], took_ms: u64) -> Self {
        // A record speaks for the paths into its own node that the schedule has, once
        // each: nothing else it carries counts.
        // Taken out of the schedule's set as they come: a second figure of a path
        // finds it gone.
        let mut open: BTreeSet<Path> = rounds(nnodes).into_iter().flatten().collect();
        let figures: Vec<PathFigure> = records
            .iter()
            .flat_map(|r| r.received.iter().filter(|f| f.path.to == r.node))
            .filter(|f| f.gbit.is_finite() && open.remove(&f.path))
            .copied()
            .collect();
        let expected: BTreeMap<u32, f64> = records
            .iter()
            .filter_map(|r| Some((r.node, r.expected_gbit?)))
            .collect();
        let Verdict { nodes, slow } = judge(nnodes, &figures, &expected);
        let record = |n: u32| records.iter().find(|r| r.node == n);
        let nodes = nodes
            .into_iter()
            .map(|figure| {
                let r = record(figure.node);
                NodeLine {
                    host: r.map(|r| printable(&r.host)),
                    addr: r.map(|r| printable(&r.addr)),
                    interface: r.and_then(|r| r.interface.as_deref().map(printable)),
                    figure,
                }
            })
            .collect();
        let silent = (0..nnodes).filter(|n| record(*n).is_none()).collect();
        let via = records.first().map(|r| r.via.clone()).unwrap_or_default();
        NetworkReport {
            round,
            nodes,
            slow,
            silent,
            rendezvous_host: records.iter().find(|r| r.hosts_rendezvous).map(|r| r.node),
            spares: 0,
            // Measured through torch, the figures are the job's own data path.
            rdma: via == DataPath::Tcp && records.iter().any(|r| r.rdma),
            via,
            took_ms,
        }
    }

    /// Whether no probe connected anywhere (no round trip timed).
    pub fn nothing_measured(&self) -> bool {
        self.nodes.iter().all(|n| n.figure.rtt_us <= 0.0)
    }

    /// One line: every node's figures, or from 9 nodes on the weakest node's.
    pub fn summary(&self) -> String {
        if self.nothing_measured() {
            let why = match self.via {
                DataPath::Tcp => "the nodes could not connect to each other's probe ports (a NetworkPolicy or firewall that lets only some ports through?); nobody is named. NCCL and gloo also connect on ports of their own",
                DataPath::Torch { .. } => "the torch probes failed (each node's warning says why: the job's own NCCL or gloo may fail the same way); nobody is named. --network-check-path tcp measures between the agents instead",
            };
            return format!(
                "network check of round {} ({} nodes, {:.1}s, {}): no path could be measured: {why}; --network-check off skips the check",
                self.round,
                self.nodes.len(),
                self.took_ms as f64 / 1000.0,
                self.via.said()
            );
        }
        let weakest = self
            .nodes
            .iter()
            .min_by(|a, b| a.figure.gbit().total_cmp(&b.figure.gbit()));
        let shown: Vec<&NodeLine> = match self.nodes.len() {
            0..=8 => self.nodes.iter().collect(),
            _ => weakest.into_iter().collect(),
        };
        let lead = match shown.len() < self.nodes.len() {
            true => "weakest: ",
            false => "",
        };
        let nodes: Vec<String> = shown
            .iter()
            .map(|n| {
                let f = &n.figure;
                format!(
                    "node {} {} out / {} in, {}",
                    f.node,
                    gbit(f.send_gbit),
                    gbit(f.recv_gbit),
                    rtt(f.rtt_us)
                )
            })
            .collect();
        let silent: String = self
            .silent
            .iter()
            .map(|n| format!("; node {n}'s record never came (not judged)"))
            .collect();
        format!(
            "network check of round {} ({} nodes, {:.1}s, {}): {lead}{}{silent}",
            self.round,
            self.nodes.len(),
            self.took_ms as f64 / 1000.0,
            self.via.said(),
            nodes.join("; ")
        )
    }

    /// Where and how slow each named node is, with the figure it was held to.
    pub fn named(&self) -> Vec<String> {
        self.slow.iter().map(|s| self.describe(s)).collect()
    }

    fn describe(&self, s: &SlowNode) -> String {
        let line = self.nodes.iter().find(|n| n.figure.node == s.node);
        let at = line.map(where_).unwrap_or_default();
        let (out, inn) = line.map_or((0.0, 0.0), |l| (l.figure.send_gbit, l.figure.recv_gbit));
        let held = match s.by {
            SlowBy::Peers { median_gbit } => format!(
                "under half of the other nodes' median of {}",
                gbit(median_gbit)
            ),
            SlowBy::Interface { expected_gbit } => format!(
                "under a hundredth of its interface's {}",
                gbit(expected_gbit)
            ),
            SlowBy::Unreachable => return format!(
                "node {}{at}: its probes never connected in one direction (sends at {}, receives at {}): a dead link, or a firewall or NetworkPolicy that closes ports other than the rendezvous' (NCCL and gloo need such ports too); not refused under gate, since the check cannot tell which",
                s.node,
                gbit(out),
                gbit(inn)
            ),
        };
        let silent = match self.silent.contains(&s.node) {
            true => " (its own measurements never came)",
            false => "",
        };
        let what = match self.rdma {
            true => "This is the TCP path between the nodes' agents (the rendezvous, gloo, NCCL's bootstrap); NCCL's data path here is EFA or InfiniBand, which this check does not measure: check this node's TCP interface (not refused under gate)",
            false => "A bad cable, a degraded NIC, a congested switch port or a wrong MTU slows every rank of the job; check this node's link, or run the job without it",
        };
        format!(
            "node {}{at} sends at {} and receives at {}{silent}: {held}. {what}",
            s.node,
            gbit(out),
            gbit(inn)
        )
    }
}

/// What `--network-check gate` does with a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    Pass,
    /// The job goes on without these nodes, in a new round a spare may join.
    Without(Vec<u32>),
    /// It cannot go on without them (why): every node stops.
    Stop(String),
}

impl NetworkReport {
    /// The nodes the gate would refuse: measured slow, not unreachable (a closed port
    /// is not a slow link), and none where the TCP path measured is not the job's
    /// data path (EFA or InfiniBand).
    pub fn refusable(&self) -> Vec<u32> {
        if self.rdma {
            return Vec::new();
        }
        let slow = self.slow.iter().filter(|s| s.by != SlowBy::Unreachable);
        slow.map(|s| s.node).collect()
    }

    /// The gate's decision; `elastic_min` is `--nnodes`' minimum where the job may
    /// change size (c10d, etcd), None for a static job.
    pub fn gate(&self, elastic_min: Option<u32>) -> Gate {
        self.gate_with(self.spares, elastic_min)
    }

    /// The gate's decision were `spares` nodes waiting to join the next round.
    pub fn gate_with(&self, spares: u32, elastic_min: Option<u32>) -> Gate {
        let slow = self.refusable();
        if slow.is_empty() {
            return Gate::Pass;
        }
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let left = count(self.nodes.len())
            .saturating_sub(count(slow.len()))
            .saturating_add(spares);
        match (elastic_min, self.rendezvous_host) {
            (_, Some(h)) if slow.contains(&h) => Gate::Stop(format!("node {h} hosts the rendezvous store, and the job cannot go on without it")),
            (None, _) => Gate::Stop("a static job (--nnodes N, --rdzv-backend static) cannot go on with fewer nodes".into()),
            (Some(min), _) if left < min => Gate::Stop(format!("{left} node(s) would be left with the spares waiting, under --nnodes' minimum of {min}")),
            (Some(_), _) => Gate::Without(slow),
        }
    }
}

/// Where a node is, its strings made printable (a report read from the store may
/// come from anyone).
fn where_(n: &NodeLine) -> String {
    let mut parts: Vec<String> = Vec::new();
    parts.extend(n.host.as_deref().map(printable));
    match (
        n.addr.as_deref().map(printable),
        n.interface.as_deref().map(printable),
    ) {
        (Some(a), Some(i)) => parts.push(format!("{a} on {i}")),
        (Some(a), None) => parts.push(a),
        _ => {}
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!(" ({})", parts.join(", ")),
    }
}

fn gbit(v: f64) -> String {
    match v {
        v if v >= 1.0 => format!("{v:.1} Gbit/s"),
        v => format!("{:.0} Mbit/s", v * 1000.0),
    }
}

fn rtt(us: f64) -> String {
    match us.is_finite() && us > 0.0 {
        true => format!("{us:.0} us round trip"),
        false => "no round trip".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network_check::schedule::rounds;

    /// Each node's record as the probes would write it: node `shaped` at 20 Mbit/s
    /// both ways.
    fn records(nodes: u32, shaped: u32, skip: Option<u32>) -> Vec<NodeRecord> {
        let r = rounds(nodes);
        (0..nodes)
            .filter(|n| Some(*n) != skip)
            .map(|n| NodeRecord {
                node: n,
                host: format!("node-{n}"),
                addr: format!("10.0.0.{}", n + 1),
                interface: Some("eth0".into()),
                expected_gbit: Some(10.0),
                received: r
                    .iter()
                    .flatten()
                    .filter(|p| p.to == n)
                    .map(|&path| PathFigure {
                        path,
                        gbit: if path.from == shaped || path.to == shaped {
                            0.02
                        } else {
                            8.0
                        },
                        rtt_us: 60.0,
                    })
                    .collect(),
                hosts_rendezvous: n == 0,
                rdma: false,
                via: DataPath::Tcp,
            })
            .collect()
    }

    #[test]
    fn on_efa_or_infiniband_the_tcp_path_is_named_for_what_it_is_and_refuses_no_one() {
        let mut r = records(4, 2, None);
        r[1].rdma = true;
        let report = NetworkReport::judge(0, 4, &r, 1);
        assert_eq!(report.slow.len(), 1);
        let named = &report.named()[0];
        assert!(
            named.contains("NCCL's data path here is EFA or InfiniBand")
                && !named.contains("slows every rank"),
            "{named}"
        );
        assert_eq!(report.gate(Some(1)), Gate::Pass);
    }

    /// The reports node 0 wrote on one H200, three nodes in network namespaces, NCCL
    /// over sockets (tests/fixtures/device/network-check-nccl-h200x1): read back, the
    /// shaped run names node 2 and stops a static job under gate (as every node did,
    /// exit 82), the unshaped one passes.
    #[test]
    fn the_reports_captured_through_nccl_on_a_gpu_read_back_and_gate_as_they_did() {
        let shaped: NetworkReport = serde_json::from_str(include_str!(concat!(
            "../../../tests/fixtures/device/network-check-nccl-h200x1",
            "/shaped/network-check.json"
        )))
        .unwrap();
        let unshaped: NetworkReport = serde_json::from_str(include_str!(concat!(
            "../../../tests/fixtures/device/network-check-nccl-h200x1",
            "/unshaped/network-check.json"
        )))
        .unwrap();
        // NCCL chose its socket transport and took about half a second to start.
        assert!(
            matches!(&shaped.via, DataPath::Torch { backend, net: Some(n), start_s: Some(t) }
                if backend == "nccl" && n == "Socket" && *t > 0.1 && *t < 2.0),
            "{:?}",
            shaped.via
        );
        assert!(!shaped.via.rdma() && !shaped.rdma);
        assert_eq!(shaped.slow.iter().map(|s| s.node).collect::<Vec<_>>(), [2]);
        assert!(matches!(shaped.gate(None), Gate::Stop(w) if w.contains("static")));
        assert!(
            shaped.named()[0].contains("node 2 (vm, 10.79.40.12 on eth0) sends at 815 Mbit/s"),
            "{:?}",
            shaped.named()
        );
        assert!(
            shaped.summary().contains("nccl over Socket"),
            "{}",
            shaped.summary()
        );
        assert!(unshaped.slow.is_empty() && unshaped.gate(None) == Gate::Pass);
        // Elastic under gate: round 1, with the spare in the refused node's place.
        let round1: NetworkReport = serde_json::from_str(include_str!(concat!(
            "../../../tests/fixtures/device/network-check-nccl-h200x1",
            "/elastic-gate/network-check.json"
        )))
        .unwrap();
        assert_eq!((round1.round, round1.nodes.len()), (1, 3));
        assert_eq!(round1.gate(Some(2)), Gate::Pass);
    }

    /// Measured through NCCL over InfiniBand, the figure is the job's data path: the
    /// node is named as slowing the ranks, and the gate may refuse it.
    #[test]
    fn through_nccl_over_rdma_the_figure_is_the_data_path_and_the_gate_may_refuse() {
        let via = DataPath::Torch {
            backend: "nccl".into(),
            net: Some("IB".into()),
            start_s: Some(1.25),
        };
        assert!(via.rdma());
        let mut r = records(4, 2, None);
        for rec in &mut r {
            rec.rdma = true;
            rec.via = via.clone();
        }
        let report = NetworkReport::judge(0, 4, &r, 900);
        assert!(!report.rdma, "{report:?}");
        assert!(
            report
                .summary()
                .contains("(4 nodes, 0.9s, nccl over IB, 1.2s of it starting nccl)"),
            "{}",
            report.summary()
        );
        assert!(
            report.named()[0].contains("slows every rank"),
            "{:?}",
            report.named()
        );
        assert_eq!(report.gate(Some(1)), Gate::Without(vec![2]));
        // The same figures over the agents' TCP refuse no one.
        for rec in &mut r {
            rec.via = DataPath::Tcp;
        }
        assert_eq!(
            NetworkReport::judge(0, 4, &r, 900).gate(Some(1)),
            Gate::Pass
        );
    }

    #[test]
    fn the_gate_refuses_a_slow_node_where_the_job_can_go_on_without_it() {
        let report = NetworkReport::judge(0, 4, &records(4, 2, None), 1);
        assert_eq!(report.gate(Some(2)), Gate::Without(vec![2]));
        let Gate::Stop(why) = report.gate(Some(4)) else {
            panic!("4 nodes needed, 3 left")
        };
        assert!(
            why.contains(
                "3 node(s) would be left with the spares waiting, under --nnodes' minimum of 4"
            ),
            "{why}"
        );
        // A spare waiting takes its place.
        let spared = NetworkReport {
            spares: 1,
            ..report.clone()
        };
        assert_eq!(spared.gate(Some(4)), Gate::Without(vec![2]));
        assert!(matches!(report.gate(None), Gate::Stop(w) if w.contains("static")));
        let host = NetworkReport::judge(0, 4, &records(4, 0, None), 1);
        assert!(
            matches!(host.gate(Some(1)), Gate::Stop(w) if w.contains("node 0 hosts the rendezvous store"))
        );
        let healthy = NetworkReport::judge(0, 4, &records(4, 9, None), 1);
        assert_eq!(healthy.gate(None), Gate::Pass);
        // Many nodes: one line still, with the weakest.
        let many = NetworkReport::judge(0, 64, &records(64, 17, None), 2100);
        assert!(
            many.summary().starts_with(
                "network check of round 0 (64 nodes, 2.1s, TCP between the agents): weakest: node 17 20 Mbit/s out"
            ),
            "{}",
            many.summary()
        );
    }

    #[test]
    fn the_shaped_node_is_named_with_its_host_address_interface_and_figures() {
        let report = NetworkReport::judge(0, 3, &records(3, 2, None), 1200);
        let named = report.named();
        assert_eq!(named.len(), 1, "{named:?}");
        assert!(
            named[0].starts_with("node 2 (node-2, 10.0.0.3 on eth0) sends at 20 Mbit/s and receives at 20 Mbit/s: under a hundredth of its interface's 10.0 Gbit/s"),
            "{}",
            named[0]
        );
        assert!(
            report
                .summary()
                .contains("node 0 8.0 Gbit/s out / 8.0 Gbit/s in, 60 us round trip"),
            "{}",
            report.summary()
        );
    }

    #[test]
    fn probes_that_never_connected_name_nobody_and_say_so() {
        let mut r = records(3, 9, None);
        r.iter_mut()
            .flat_map(|r| &mut r.received)
            .for_each(|f| (f.gbit, f.rtt_us) = (0.0, 0.0));
        let report = NetworkReport::judge(0, 3, &r, 8000);
        assert!(report.slow.is_empty() && report.named().is_empty());
        assert!(
            report.summary().contains("no path could be measured"),
            "{}",
            report.summary()
        );
        assert_eq!(report.gate(None), Gate::Pass);
        // Through torch, every probe failed (each node wrote an empty record): the
        // summary says so, and the gate refuses no one.
        for rec in &mut r {
            rec.received.clear();
            rec.via = DataPath::Torch {
                backend: "nccl".into(),
                net: None,
                start_s: None,
            };
        }
        let report = NetworkReport::judge(0, 3, &r, 21000);
        assert!(report.slow.is_empty(), "{report:?}");
        assert!(
            report
                .summary()
                .contains("no path could be measured: the torch probes failed"),
            "{}",
            report.summary()
        );
        assert_eq!(report.gate(None), Gate::Pass);
    }

    #[test]
    fn without_interface_rates_the_median_names_it() {
        let mut r = records(4, 1, None);
        r.iter_mut().for_each(|r| r.expected_gbit = None);
        let report = NetworkReport::judge(2, 4, &r, 900);
        assert_eq!(report.slow.len(), 1);
        assert!(report.named()[0].contains("under half of the other nodes' median of 8.0 Gbit/s"));
    }

    #[test]
    fn a_node_whose_record_never_came_is_said_silent_and_not_judged() {
        let report = NetworkReport::judge(0, 4, &records(4, 9, Some(3)), 900);
        assert_eq!(report.silent, [3]);
        assert!(report.slow.is_empty(), "{:?}", report.slow);
        assert!(
            report.summary().contains("node 3's record never came"),
            "{}",
            report.summary()
        );
    }

    #[test]
    fn a_forged_record_cannot_speak_for_another_node_or_the_terminal() {
        let mut r = records(3, 9, None);
        // Node 0 claims a fast path into node 1, and a name with escape codes.
        r[0].received.push(PathFigure {
            path: crate::network_check::schedule::Path { from: 2, to: 1 },
            gbit: 1000.0,
            rtt_us: 1.0,
        });
        r[0].host = "\u{1b}[31mred".into();
        let report = NetworkReport::judge(0, 3, &r, 1);
        assert!(report.nodes.iter().all(|n| n.figure.recv_gbit < 100.0));
        assert!(!report.summary().contains('\u{1b}'));
        assert!(!report.nodes[0].host.as_ref().unwrap().contains('\u{1b}'));
        assert!(report.slow.is_empty(), "{:?}", report.slow);
    }
}
