//! The network check's measuring side (issue 64): after a round closes and before
//! its ranks start, the nodes probe the paths between them over TCP (`probe`) in the
//! schedule's rounds, through the rendezvous state (`exchange`); what is slow is
//! decided in `toporun_shared::network_check`.

pub mod exchange;
pub mod probe;

use serde::{Deserialize, Serialize};

/// Where a node listens for its peers' probes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    /// The node's rendezvous address (`--local-addr`, else its host name).
    pub addr: String,
    pub port: u16,
    /// Its interfaces' addresses, for where `addr` names no other machine (a host
    /// name that resolves to loopback).
    #[serde(default)]
    pub ips: Vec<String>,
}
