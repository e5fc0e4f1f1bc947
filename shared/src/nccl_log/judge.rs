//! Whether each link NCCL chose is the best the hardware allows.

use super::report::{Comm, Link, LogReport, RankInfo, Verdict};
use super::transport::Class;
use crate::facts::{same_bus, HostFacts, LinkKind};

/// What the judge knows about the hardware: one host's facts, taken to describe
/// every host of the job (the nodes of a job are alike).
pub struct Topology<'a> {
    pub facts: &'a HostFacts,
}

fn gpu_index(facts: &HostFacts, r: &RankInfo) -> Option<usize> {
    if let Some(bus) = &r.bus_id {
        if let Some(i) = facts
            .gpus
            .devices
            .iter()
            .position(|g| same_bus(&g.pci_bus_id, bus))
        {
            return Some(i);
        }
    }
    let i = r.nvml_dev? as usize;
    (i < facts.gpus.count()).then_some(i)
}

fn verdict(best: bool, allows: impl Into<String>, why: impl Into<String>) -> Option<Verdict> {
    Some(Verdict {
        best,
        allows: allows.into(),
        why: why.into(),
    })
}

fn same_host_verdict(c: &Comm, l: &Link, topo: Option<&Topology>) -> Option<Verdict> {
    let gpus = topo.and_then(|t| {
        let a = c.ranks.iter().find(|r| r.rank == l.from)?;
        let b = c.ranks.iter().find(|r| r.rank == l.to)?;
        Some((t.facts, gpu_index(t.facts, a)?, gpu_index(t.facts, b)?))
    });
    match gpus {
        Some((facts, a, b)) if a != b => {
            let kind = facts.gpus.link(a, b);
            let path = match kind {
                Some(LinkKind::NvLink(n)) => format!("NVLink (NV{n})"),
                Some(k) => format!("PCIe ({k})"),
                None => "an unknown path".to_string(),
            };
            if facts.gpus.p2p_ok(a, b) {
                verdict(
                    l.class == Class::P2p,
                    format!("P2P over {path}"),
                    if l.class == Class::P2p {
                        format!("GPUs {a} and {b} reach each other over {path}")
                    } else {
                        format!("GPUs {a} and {b} support P2P over {path}, but NCCL used {}: P2P disabled (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL) or the ranks cannot see each other's GPU", l.via)
                    },
                )
            } else {
                verdict(
                    l.class != Class::Net,
                    "SHM (no P2P between these GPUs)",
                    format!("GPUs {a} and {b} report no P2P over {path}"),
                )
            }
        }
        _ => match l.class {
            Class::P2p => verdict(true, "P2P", "ranks on one host, GPU to GPU"),
            Class::Net => verdict(false, "P2P or SHM", format!("both ranks run on host {} but NCCL sent their traffic over {}: P2P and SHM disabled, or NCCL took them for separate hosts", c.host_of(l.from).unwrap_or("?"), l.via)),
            Class::Shm => None,
        },
    }
}

fn cross_host_verdict(l: &Link, topo: Option<&Topology>) -> Option<Verdict> {
    if l.class != Class::Net {
        return verdict(
            true,
            "P2P",
            "NCCL took both hosts for one (NCCL_HOSTID) and went GPU to GPU",
        );
    }
    if l.rdma {
        return verdict(true, "RDMA", format!("RDMA network ({})", l.via));
    }
    let t = topo?;
    let active = t.facts.rdma.iter().filter(|d| d.is_active()).count();
    if active > 0 {
        verdict(false, format!("RDMA ({active} active devices)"), format!("this host has {active} active RDMA devices but NCCL used TCP sockets ({}): the network plugin is missing (aws-ofi-nccl for EFA) or NCCL_IB_DISABLE / NCCL_NET=Socket is set", l.via))
    } else {
        verdict(
            true,
            "TCP sockets (no RDMA device)",
            "no RDMA device on this host: sockets are all there is",
        )
    }
}

/// Fills every link's verdict. Ranks on one host (by NCCL's hostname) are judged
/// against the GPU links and P2P status of `topo` when given; ranks on different hosts
/// against its RDMA devices.
pub fn judge(report: &mut LogReport, topo: Option<&Topology>) {
    for c in &mut report.comms {
        let verdicts: Vec<Option<Verdict>> = c
            .links
            .iter()
            .map(|l| match (c.host_of(l.from), c.host_of(l.to)) {
                (Some(a), Some(b)) if a == b => same_host_verdict(c, l, topo),
                // A rank that never logged here runs on another node (one node's
                // files hold only its own ranks).
                (Some(_), _) | (_, Some(_)) => cross_host_verdict(l, topo),
                _ => None,
            })
            .collect();
        for (l, v) in c.links.iter_mut().zip(verdicts) {
            l.verdict = v;
        }
    }
}
