//! `net.interface`: a non-virtual interface that is up and has an address, for NCCL's
//! bootstrap and socket transport between nodes.

use crate::facts::HostFacts;
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};

pub fn check(facts: &HostFacts) -> Finding {
    let usable: Vec<&str> = facts
        .nics
        .iter()
        .filter(|n| !n.virtual_iface && n.state != "down" && !n.addresses.is_empty())
        .map(|n| n.name.as_str())
        .collect();
    let all: Vec<&str> = facts.nics.iter().map(|n| n.name.as_str()).collect();
    let f =
        Finding::new(FindingId::NetInterface, Severity::Ok, "").fact("interfaces", all.join(","));
    match usable.as_slice() {
        [] => Finding { severity: Severity::Warning, summary: "no usable non-virtual network interface (up, with an address): other nodes cannot be reached; a single-node job still runs over lo".into(), ..f }
            .remedy("check the pod's network (CNI) or hostNetwork settings"),
        names => {
            let default = facts.nics.iter().find(|n| n.default_route).map(|n| n.name.as_str()).unwrap_or("none");
            Finding { summary: format!("usable interface(s): {}; default route via {default}", names.join(", ")), ..f }.fact("default_route", default)
        }
    }
}
