//! One-line summaries and findings of a log report: what a person reads first.

use super::report::{Comm, Link, LogReport};
use super::transport::Class;
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};
use crate::measured;
use std::collections::BTreeMap;

/// The id of the findings on a link NCCL took below what the hardware allows.
pub const TRANSPORT_ID: FindingId = FindingId::NcclTransport;

fn plural(n: usize, one: &str) -> String {
    format!("{n} {one}{}", if n == 1 { "" } else { "s" })
}

/// `8 ranks on 1 node, 16 links via P2P/CUMEM: best available`.
pub fn comm_line(c: &Comm) -> String {
    // Pairs of ranks, whichever direction NCCL logged.
    let mut pairs: BTreeMap<&str, std::collections::BTreeSet<(u32, u32)>> = BTreeMap::new();
    for l in &c.links {
        pairs
            .entry(l.via.as_str())
            .or_default()
            .insert((l.from.min(l.to), l.from.max(l.to)));
    }
    let by_via: BTreeMap<&str, usize> = pairs.iter().map(|(v, p)| (*v, p.len())).collect();
    let ranks = c
        .nranks
        .map_or(format!("at least {} ranks", c.size()), |n| {
            plural(n as usize, "rank")
        });
    let nodes = c.nnodes.map_or(String::new(), |n| {
        format!(" on {}", plural(n as usize, "node"))
    });
    let links = if by_via.is_empty() {
        "no channel lines (NCCL_DEBUG_SUBSYS without INIT?)".to_string()
    } else if by_via.len() == 1 {
        let (via, n) = by_via.iter().next().expect("one");
        format!("all {} via {via}", plural(*n, "rank pair"))
    } else {
        by_via
            .iter()
            .map(|(v, n)| format!("{} via {v}", plural(*n, "rank pair")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let verdict = if c
        .links
        .iter()
        .any(|l| l.verdict.as_ref().is_some_and(|v| !v.best))
    {
        ": NOT the best available"
    } else if !c.links.is_empty()
        && c.links
            .iter()
            .all(|l| l.verdict.as_ref().is_some_and(|v| v.best))
    {
        ": best available"
    } else {
        ""
    };
    format!("{ranks}{nodes}, {links}{verdict}")
}

/// The cost NCCL pays for a slower class than the hardware allows, as measured.
fn cost(l: &Link, allows: &str) -> String {
    let used = match (l.class, l.rdma) {
        (Class::Shm, _) => measured::SHM_GBPS,
        (Class::Net, false) => measured::SOCKET_GBPS,
        _ => return String::new(),
    };
    if allows.starts_with("P2P over NVLink") || allows.starts_with("P2P or SHM") {
        format!(
            "measured on H200 NVLink: {used} GB/s instead of {} GB/s all_reduce busbw ({})",
            measured::NVLINK_P2P_GBPS,
            measured::slowdown(measured::NVLINK_P2P_GBPS, used)
        )
    } else {
        String::new()
    }
}

fn fix(l: &Link, allows: &str) -> &'static str {
    match l.class {
        Class::Net if allows.starts_with("RDMA") => "install the network plugin for these devices (aws-ofi-nccl for EFA) and unset NCCL_IB_DISABLE / NCCL_NET=Socket",
        Class::Net => "these ranks share a host but NCCL took them for separate hosts (different pods, hostnames or /dev/shm) or P2P and SHM are disabled: run one pod per node with all its GPUs; where pods must stay separate, share /dev/shm (hostIPC or a hostPath mount) and let toporun join them (--colocated join sets the same NCCL_HOSTID and NCCL_CUMEM_ENABLE=0)",
        _ => "unset NCCL_P2P_DISABLE and any NCCL_P2P_LEVEL below this path, and give each rank all the GPUs of its node (CUDA_VISIBLE_DEVICES)",
    }
}

/// `nccl.transport` per communicator with links below what the hardware allows, and
/// one finding per known failure line.
pub fn findings(r: &LogReport) -> Vec<Finding> {
    let mut out = Vec::new();
    for c in &r.comms {
        let bad: Vec<&Link> = c
            .links
            .iter()
            .filter(|l| l.verdict.as_ref().is_some_and(|v| !v.best))
            .collect();
        let Some(first) = bad.first() else {
            continue;
        };
        let v = first.verdict.as_ref().expect("filtered");
        let pairs: Vec<String> = bad
            .iter()
            .take(8)
            .map(|l| format!("{}->{}", l.from, l.to))
            .collect();
        let mut f = Finding::new(
            TRANSPORT_ID,
            Severity::Warning,
            format!(
                "communicator {}: {} between ranks {}{}: the hardware allows {}",
                c.id,
                first.via,
                pairs.join(", "),
                if bad.len() > 8 { " ..." } else { "" },
                v.allows
            ),
        )
        .fact("why", &v.why)
        .fact("links_below_best", bad.len())
        .remedy(fix(first, &v.allows));
        let cost = cost(first, &v.allows);
        if !cost.is_empty() {
            f = f.fact("cost", cost);
        }
        out.push(f);
    }
    for fail in &r.failures {
        out.push(
            Finding::new(
                fail.known.id,
                if fail.known.fatal {
                    Severity::Error
                } else {
                    Severity::Warning
                },
                format!(
                    "{} (host {}, pid {})",
                    fail.known.cause, fail.host, fail.pid
                ),
            )
            .fact("line", &fail.line)
            .remedy(fail.known.fix),
        );
    }
    out
}
