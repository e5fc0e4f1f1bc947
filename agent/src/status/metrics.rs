//! `/metrics`: the job's state in the OpenMetrics text format (prometheus-client).

use super::state::{RankState, Snapshot};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use toporun_shared::root_cause::CauseKind;

type Labels = Vec<(String, String)>;

fn gauge(r: &mut Registry, name: &str, help: &str, v: i64) {
    let g: Gauge = Gauge::default();
    g.set(v);
    r.register(name, help, g);
}

fn seconds(r: &mut Registry, name: &str, help: &str, v: f64) {
    let g: Gauge<f64, AtomicU64> = Gauge::default();
    g.set(v);
    r.register(name, help, g);
}

fn counter(r: &mut Registry, name: &str, help: &str, v: u64) {
    let c: Counter = Counter::default();
    c.inc_by(v);
    r.register(name, help, c);
}

/// This node's ranks' wait shares, and the ranks the job waits for.
fn stragglers(r: &mut Registry, s: &Snapshot) {
    let shares: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    let mine = |node: u32| !s.top.job_wide || s.node_rank == Some(node);
    for row in s.top.ranks.iter().filter(|x| mine(x.node_rank)) {
        if let Some(w) = &row.window {
            shares
                .get_or_create(&vec![("rank".into(), row.rank.to_string())])
                .set(w.wait);
        }
    }
    r.register(
        "toporun_rank_wait_share",
        "Share of this node's ranks' stack samples in collectives (and, under NCCL, waiting on their GPU) over the straggler window (the straggler waits least)",
        shares,
    );
    gpu_times(r, s, &mine);
    let named: Family<Labels, Gauge> = Family::default();
    for x in &s.stragglers {
        named
            .get_or_create(&vec![
                ("rank".into(), x.rank.to_string()),
                ("node".into(), x.node_rank.to_string()),
            ])
            .set(1);
    }
    r.register(
        "toporun_straggler",
        "1 for each rank the job waits for now (its wait share far below the others')",
        named,
    );
}

/// Seconds since the start and since the last restart.
fn times(r: &mut Registry, s: &Snapshot) {
    seconds(
        r,
        "toporun_uptime_seconds",
        "Seconds since toporun started",
        s.started.map_or(0.0, |t| t.elapsed().as_secs_f64()),
    );
    seconds(
        r,
        "toporun_seconds_since_restart",
        "Seconds since the last restart (since the start when there was none)",
        s.last_restart
            .or(s.started)
            .map_or(0.0, |t| t.elapsed().as_secs_f64()),
    );
}

/// The last network check's figures per node and direction, and its slow nodes.
fn network(r: &mut Registry, s: &Snapshot) {
    let rates: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    let rtts: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    let slow: Family<Labels, Gauge> = Family::default();
    let nodes = s.network.iter().flat_map(|n| &n.nodes);
    for n in nodes {
        let f = &n.figure;
        let node = ("node".to_string(), f.node.to_string());
        for (dir, v) in [("send", f.send_gbit), ("receive", f.recv_gbit)] {
            let labels = vec![node.clone(), ("direction".into(), dir.into())];
            rates.get_or_create(&labels).set(v * 1e9);
        }
        if f.rtt_us.is_finite() {
            rtts.get_or_create(&vec![node.clone()]).set(f.rtt_us / 1e6);
        }
        let named = s
            .network
            .iter()
            .flat_map(|n| &n.slow)
            .any(|x| x.node == f.node);
        slow.get_or_create(&vec![node]).set(i64::from(named));
    }
    r.register(
        "toporun_network_bits_per_second",
        "The network check's best path of each node, each direction, at the last round's start (bits/s)",
        rates,
    );
    r.register(
        "toporun_network_round_trip_seconds",
        "The network check's quickest round trip of each node",
        rtts,
    );
    r.register(
        "toporun_network_slow_node",
        "1 for each node the network check named slow (--network-check)",
        slow,
    );
}

/// Under NCCL with `--gpu-timing on`: each rank's GPU time inside collectives and
/// each collective kind's bus bandwidth, over the window (else the last dump).
fn gpu_times(r: &mut Registry, s: &Snapshot, mine: &dyn Fn(u32) -> bool) {
    let shares: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    let busbw: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    for row in s.top.ranks.iter().filter(|x| mine(x.node_rank)) {
        let rank = ("rank".to_string(), row.rank.to_string());
        if let Some(w) = row.gpu_wait_share() {
            shares.get_or_create(&vec![rank.clone()]).set(w);
        }
        for k in row.busbw_kinds() {
            busbw
                .get_or_create(&vec![rank.clone(), ("kind".into(), k.kind.clone())])
                .set(k.gbps * 1e9);
        }
    }
    r.register(
        "toporun_rank_gpu_wait_share",
        "Share of the time this node's ranks' GPUs spent inside collectives over the straggler window, from their flight recorders (NCCL; the straggler's is lowest)",
        shares,
    );
    r.register(
        "toporun_collective_busbw",
        "Bus bandwidth of this node's ranks' collectives of 1 MiB or more, per kind, in bytes per second (nccl-tests' busbw), over the straggler window, with the rank's waits for its peers inside them: only the rank that waits least shows what the links carry",
        busbw,
    );
}

/// The snapshot as OpenMetrics text.
pub fn render(s: &Snapshot) -> String {
    let mut r = Registry::default();
    let ranks: Family<Labels, Gauge> = Family::default();
    for state in ["running", "exited"] {
        let n = s
            .ranks
            .iter()
            .filter(|x| (x.state == RankState::Running) == (state == "running"))
            .count();
        ranks
            .get_or_create(&vec![("state".into(), state.into())])
            .set(n as i64);
    }
    r.register(
        "toporun_ranks",
        "Local ranks of the current attempt, by state",
        ranks,
    );
    let exits: Family<Labels, Counter> = Family::default();
    for (code, n) in &s.exits_by_code {
        exits
            .get_or_create(&vec![("code".into(), code.to_string())])
            .inc_by(*n);
    }
    r.register(
        "toporun_rank_exits",
        "Local rank exits since the start, by exit code (negative: killed by that signal)",
        exits,
    );
    counter(
        &mut r,
        "toporun_restarts",
        "Restarts of this node's ranks",
        u64::from(s.restarts),
    );
    counter(
        &mut r,
        "toporun_hangs",
        "Hangs reported (no rank made progress for --hang-timeout)",
        s.hangs,
    );
    let causes: Family<Labels, Gauge> = Family::default();
    for kind in CauseKind::ALL {
        causes
            .get_or_create(&vec![("kind".into(), kind.as_str().into())])
            .set(i64::from(s.root_cause == Some(kind)));
    }
    r.register(
        "toporun_root_cause",
        "1 for the kind of the last failure's leading cause (hardware, oom, shm, peer, code, external)",
        causes,
    );
    gauge(
        &mut r,
        "toporun_rendezvous_round",
        "The current rendezvous round (-1 before the first)",
        s.round.map_or(-1, i64::from),
    );
    gauge(
        &mut r,
        "toporun_nodes_joined",
        "Nodes in the last closed round",
        i64::from(s.nodes_joined),
    );
    gauge(
        &mut r,
        "toporun_nodes_expected",
        "Nodes the job asks for (--nnodes, max)",
        i64::from(s.nodes_expected),
    );
    gauge(
        &mut r,
        "toporun_ready",
        "1 when the rendezvous is complete and every local rank runs",
        i64::from(s.ready()),
    );
    counter(
        &mut r,
        "toporun_store_connections",
        "Connections accepted by this node's store",
        s.store_connections,
    );
    counter(
        &mut r,
        "toporun_store_operations",
        "Operations served by this node's store",
        s.store_operations,
    );
    stragglers(&mut r, s);
    network(&mut r, s);
    let findings: Family<Labels, Gauge> = Family::default();
    for sev in ["warning", "error"] {
        findings
            .get_or_create(&vec![("severity".into(), sev.into())])
            .set(s.findings_by_severity.get(sev).copied().unwrap_or(0) as i64);
    }
    r.register(
        "toporun_preflight_findings",
        "The host's preflight findings, by severity",
        findings,
    );
    times(&mut r, s);
    let mut out = String::new();
    if encode(&mut out, &r).is_err() {
        out = "# encoding the metrics failed\n# EOF\n".into();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::state::JobStatus;

    #[test]
    fn the_leading_cause_of_the_last_failure_is_one() {
        let s = JobStatus::new("job", 1);
        s.update(|x| x.root_cause = Some(CauseKind::Oom));
        let text = render(&s.snapshot());
        assert!(
            text.contains("toporun_root_cause{kind=\"oom\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("toporun_root_cause{kind=\"code\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn gpu_wait_shares_and_busbw_show_per_rank() {
        use toporun_shared::flight_recorder::{GpuTime, KindBusbw};
        use toporun_shared::stacks::straggler::RankRow;
        let s = JobStatus::new("job", 1);
        let row = |rank: u32, busy_ns: u64| RankRow {
            rank,
            local_rank: rank,
            node_rank: 0,
            host: "h".into(),
            pid: 1,
            gpu: Some(rank),
            gpu_uuid: None,
            now: None,
            cpu_pct: None,
            rss_bytes: None,
            gpu_now: None,
            window: None,
            gpu_time: Some(GpuTime {
                rank,
                span_ns: 1_000_000_000,
                busy_ns,
                timed: 500,
                busbw: vec![KindBusbw {
                    kind: "all_reduce".into(),
                    gbps: 150.5,
                    count: 400,
                    mean_bytes: 4 << 20,
                }],
                comms: Vec::new(),
            }),
        };
        s.update(|x| x.top.ranks = vec![row(0, 600_000_000), row(1, 150_000_000)]);
        let text = render(&s.snapshot());
        assert!(
            text.contains("toporun_rank_gpu_wait_share{rank=\"1\"} 0.15"),
            "{text}"
        );
        assert!(
            text.contains("toporun_collective_busbw{rank=\"0\",kind=\"all_reduce\"} 150500000000"),
            "{text}"
        );
    }

    #[test]
    fn exits_and_restarts_show() {
        let s = JobStatus::new("job", 1);
        s.round(0, 0);
        s.placed(0, 1);
        s.rank_started(0, 0, 7);
        s.rank_exited(7, 3);
        s.round(1, 1);
        let text = render(&s.snapshot());
        assert!(
            text.contains("toporun_rank_exits_total{code=\"3\"} 1"),
            "{text}"
        );
        assert!(text.contains("toporun_restarts_total 1"), "{text}");
        assert!(text.contains("toporun_rendezvous_round 1"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
