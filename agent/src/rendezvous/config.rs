//! What a rendezvous is configured with: its shape and timeouts.

use super::keys::{RoundKeys, RunKeys};
use std::time::Duration;
use toporun_shared::colocation;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Exactly `nnodes`, ranks given on the command line.
    Static { nnodes: u32 },
    /// Between min and max nodes; ranks by join order.
    Elastic { min: u32, max: u32 },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub run_id: String,
    pub shape: Shape,
    pub join_timeout: Duration,
    pub last_call: Duration,
    /// How long a node waits, beyond the join timeout and last call, for the host to
    /// close the round.
    pub close_timeout: Duration,
    /// Bound on single store reads (the round's layout).
    pub read_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_misses: u32,
    /// Whether co-located nodes are joined onto one NCCL host or only reported.
    pub colocated: colocation::Mode,
    /// With a shared secret (`--rdzv-conf token=`, `TOPORUN_RDZV_TOKEN`), the
    /// rendezvous keys live under a name derived from it.
    pub key_space: Option<String>,
}

/// The key space a token opens: TCPStore has no operation that lists keys, so a
/// client without the token can neither read nor poison the rendezvous (workers'
/// own keys are unaffected). It does not stop an observer of the network traffic.
pub fn key_space(run_id: &str, token: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"toporun rendezvous\0")
        .chain_update(run_id.as_bytes())
        .chain_update(b"\0")
        .chain_update(token.as_bytes())
        .finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

impl Config {
    /// The --nnodes this shape came from, as (min, max).
    pub fn nnodes(&self) -> (u32, u32) {
        match self.shape {
            Shape::Static { nnodes } => (nnodes, nnodes),
            Shape::Elastic { min, max } => (min, max),
        }
    }

    /// The run's keys (under the key space a token opens).
    pub fn keys(&self) -> RunKeys {
        RunKeys::new(&self.run_id, self.key_space.as_deref())
    }

    /// The keys of round `round`.
    pub fn round_keys(&self, round: u32) -> RoundKeys {
        self.keys().round(round)
    }

    /// The fewest nodes a round runs with.
    pub fn min_nodes(&self) -> u32 {
        self.nnodes().0
    }

    pub fn max_nodes(&self) -> u32 {
        match self.shape {
            Shape::Static { nnodes } => nnodes,
            Shape::Elastic { max, .. } => max,
        }
    }
}
