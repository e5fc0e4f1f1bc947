//! The JSON documents toporun prints, as types: their field names are the contract
//! scripts rely on (tests read them back by name). Fields are declared in name order,
//! the order serde_json's maps printed them in before.

use serde::Serialize;
use std::collections::BTreeMap;
use toporun_shared::facts::{
    GpuSource, HostFacts, LinkBandwidth, LinkKind, Nic, P2pPair, RdmaDevice,
};
use toporun_shared::finding::Finding;
use toporun_shared::nccl_log::{self, LogReport};

/// `toporun topo --format json`.
#[derive(Serialize)]
pub struct Topo<'a> {
    pub gpus: Vec<TopoGpu<'a>>,
    pub matrix: &'a [Vec<LinkKind>],
    pub nics: &'a [Nic],
    pub p2p: &'a [P2pPair],
    pub rdma: &'a [RdmaDevice],
    pub source: &'a GpuSource,
}

#[derive(Serialize)]
pub struct TopoGpu<'a> {
    pub cpu_affinity: String,
    pub index: u32,
    pub name: &'a str,
    pub numa_node: Option<u32>,
    pub pci_bus_id: &'a str,
    pub uuid: &'a str,
}

impl<'a> Topo<'a> {
    pub fn of(f: &'a HostFacts) -> Topo<'a> {
        Topo {
            gpus: f
                .gpus
                .devices
                .iter()
                .map(|d| TopoGpu {
                    cpu_affinity: toporun_shared::cpulist::format(&d.cpu_affinity),
                    index: d.index,
                    name: &d.name,
                    numa_node: d.numa_node,
                    pci_bus_id: &d.pci_bus_id,
                    uuid: &d.uuid,
                })
                .collect(),
            matrix: &f.gpus.links,
            nics: &f.nics,
            p2p: &f.gpus.p2p,
            rdma: &f.rdma,
            source: &f.gpus.source,
        }
    }
}

/// `toporun preflight --format json`.
#[derive(Serialize)]
pub struct Preflight<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<&'a LinkBandwidth>,
    pub findings: &'a [Finding],
    /// No finding at error level.
    pub ok: bool,
}

/// `toporun nccl-log --format json`.
#[derive(Serialize)]
pub struct NcclLog<'a> {
    pub communicators: Vec<Communicator<'a>>,
    pub findings: &'a [Finding],
    pub nccl_lines: usize,
    pub net_plugins: &'a [String],
    pub version: Option<&'a str>,
}

#[derive(Serialize)]
pub struct Communicator<'a> {
    pub complete: bool,
    pub id: &'a str,
    pub links: &'a [nccl_log::Link],
    pub local_ranks: Option<u32>,
    pub nnodes: Option<u32>,
    pub nranks: Option<u32>,
    pub ranks: &'a [nccl_log::RankInfo],
    /// One line: ranks, nodes and the slowest transport.
    pub summary: String,
}

impl<'a> NcclLog<'a> {
    pub fn of(r: &'a LogReport, findings: &'a [Finding]) -> NcclLog<'a> {
        NcclLog {
            communicators: r
                .comms
                .iter()
                .map(|c| Communicator {
                    complete: c.complete(),
                    id: &c.id,
                    links: &c.links,
                    local_ranks: c.local_ranks,
                    nnodes: c.nnodes,
                    nranks: c.nranks,
                    ranks: &c.ranks,
                    summary: nccl_log::comm_line(c),
                })
                .collect(),
            findings,
            nccl_lines: r.nccl_lines,
            net_plugins: &r.net_plugins,
            version: r.version.as_deref(),
        }
    }
}

/// `toporun launch --dry-run --format json`.
#[derive(Serialize)]
pub struct DryRun<'a, P: Serialize, E: Serialize> {
    pub findings: Vec<Finding>,
    pub global_ranks: &'a str,
    pub host: DryRunHost<'a>,
    pub nccl_expected: E,
    pub nccl_report: String,
    pub nnodes: String,
    pub notes: &'a [String],
    pub nproc_per_node: u32,
    pub plan: P,
    pub python: Python<'a>,
    pub ranks: Vec<DryRunRank<'a>>,
}

#[derive(Serialize)]
pub struct DryRunHost<'a> {
    pub gpus: usize,
    pub hostname: &'a str,
    pub links: &'a [Vec<LinkKind>],
    pub product: Option<&'a str>,
}

#[derive(Serialize)]
pub struct Python<'a> {
    pub path: &'a str,
    pub why: &'a str,
}

#[derive(Serialize)]
pub struct DryRunRank<'a> {
    pub argv: &'a [String],
    pub cpus: Option<&'a str>,
    pub env: &'a BTreeMap<String, String>,
    pub gpu: Option<u32>,
    pub gpu_uuid: Option<&'a str>,
    pub local_rank: u32,
    pub rank: Option<u32>,
}
