//! The paths between a job's nodes, measured before its ranks start (issue 64's
//! network check): which node measures which path in which round (`schedule`), and
//! which node is slow from the figures (`verdict`), what is said and kept of it
//! (`report`), and the whole at a scale no test machine has (`simulate`). Pure: the
//! agents measure (`toporun_agent::network_check`), the store carries the figures,
//! this decides.

/// `--network-check`: what the check does after each round of a multi-node job.
/// Ordered: a round runs the least any of its nodes asks for.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum CheckMode {
    Off,
    /// Measure and name slow nodes; the job goes on.
    #[default]
    Report,
    /// Measure, name and refuse slow nodes.
    Gate,
}

impl CheckMode {
    /// As `--network-check` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckMode::Off => "off",
            CheckMode::Report => "report",
            CheckMode::Gate => "gate",
        }
    }
}

/// Where a node listens for its peers' probes (written to the rendezvous state).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Listener {
    /// The node's rendezvous address (`--local-addr`, else its host name).
    pub addr: String,
    pub port: u16,
    /// Its interfaces' addresses: a peer tries them where `addr` does not answer.
    #[serde(default)]
    pub ips: Vec<String>,
    /// A random number its senders must say: a stranger on the network that did not
    /// read the rendezvous state cannot pose as a peer.
    #[serde(default)]
    pub nonce: u64,
}

pub mod path;
pub use path::{DataPath, PathChoice, PathVote};
pub mod report;
pub mod schedule;
pub mod simulate;
pub mod verdict;
