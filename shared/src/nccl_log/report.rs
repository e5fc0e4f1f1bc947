//! The model of what a log says: communicators, their ranks and links, known
//! failures, and the verdict on each link.

use super::signature::Known;
use super::transport::{Class, Transport};
use serde::Serialize;

/// Key of lines that carry no communicator (old NCCL, cut logs).
pub const UNIDENTIFIED: &str = "unidentified";

/// What one rank of one communicator said about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RankInfo {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    pub cuda_dev: Option<u32>,
    pub nvml_dev: Option<u32>,
    /// PCI bus id as NCCL's busId decodes (`0000:00:06.0`).
    pub bus_id: Option<String>,
    pub local_rank: Option<u32>,
    pub complete: bool,
}

/// A link between two ranks over one transport (direction as NCCL logged it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Link {
    pub from: u32,
    pub to: u32,
    pub via: String,
    pub class: Class,
    pub rdma: bool,
    /// Whether it is the best the hardware allows; None when nothing says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Comm {
    pub id: String,
    pub nranks: Option<u32>,
    pub nnodes: Option<u32>,
    pub local_ranks: Option<u32>,
    pub ranks: Vec<RankInfo>,
    pub links: Vec<Link>,
}

impl Comm {
    /// Every rank that logged its init completed it.
    pub fn complete(&self) -> bool {
        !self.ranks.is_empty() && self.ranks.iter().all(|r| r.complete)
    }

    /// Ranks to draw: the logged size, else the highest rank seen + 1.
    pub fn size(&self) -> u32 {
        self.nranks.unwrap_or_else(|| {
            self.links
                .iter()
                .flat_map(|l| [l.from, l.to])
                .chain(self.ranks.iter().map(|r| r.rank))
                .max()
                .map_or(0, |m| m + 1)
        })
    }

    pub fn host_of(&self, rank: u32) -> Option<&str> {
        self.ranks
            .iter()
            .find(|r| r.rank == rank)
            .map(|r| r.host.as_str())
    }

    /// The slowest transport class in use, and how many links use it.
    pub fn worst(&self) -> Option<&Link> {
        self.links
            .iter()
            .max_by_key(|l| Transport::parse(&l.via).map_or(0, |t| t.rank()))
    }
}

/// A known failure line found in the log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    pub host: String,
    pub pid: u32,
    pub dev: Option<u32>,
    pub line: String,
    #[serde(flatten)]
    pub known: Known,
}

/// What a log says, ready to print.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LogReport {
    pub version: Option<String>,
    pub net_plugins: Vec<String>,
    pub comms: Vec<Comm>,
    pub failures: Vec<Failure>,
    /// Lines read that were NCCL's.
    pub nccl_lines: usize,
}

impl LogReport {
    pub fn fatal(&self) -> impl Iterator<Item = &Failure> {
        self.failures.iter().filter(|f| f.known.fatal)
    }
}

/// The verdict on one link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub best: bool,
    /// What the hardware allows between these ranks.
    pub allows: String,
    pub why: String,
}
