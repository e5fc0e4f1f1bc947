//! NCCL_SOCKET_IFNAME: the interface that reaches the other nodes, exact-matched.

use super::decision::{Decision, LaunchShape};
use crate::facts::{HostFacts, Nic};
use std::net::IpAddr;

const NAME: &str = "NCCL_SOCKET_IFNAME";

fn contains(nic: &Nic, target: IpAddr) -> bool {
    nic.addresses
        .iter()
        .any(|a| match (a.addr.parse::<IpAddr>(), target) {
            (Ok(IpAddr::V4(net)), IpAddr::V4(t)) => {
                let bits = u32::from(a.prefix_len.min(32));
                let mask = if bits == 0 {
                    0
                } else {
                    u32::MAX << (32 - bits)
                };
                u32::from(net) & mask == u32::from(t) & mask
            }
            (Ok(IpAddr::V6(net)), IpAddr::V6(t)) => {
                let bits = u32::from(a.prefix_len.min(128));
                let mask = if bits == 0 {
                    0
                } else {
                    u128::MAX << (128 - bits)
                };
                u128::from(net) & mask == u128::from(t) & mask
            }
            _ => false,
        })
}

pub(crate) fn decide(facts: &HostFacts, shape: &LaunchShape) -> Decision {
    let usable: Vec<&Nic> = facts
        .nics
        .iter()
        .filter(|n| !n.virtual_iface && n.state != "down" && !n.addresses.is_empty())
        .collect();
    if usable.is_empty() {
        return Decision::leave(NAME, "no non-virtual interface with an address: NCCL falls back to what it finds (lo for a single node)");
    }
    let target: Option<IpAddr> = shape
        .master_addr
        .and_then(|a| a.trim_matches(|c| c == '[' || c == ']').parse().ok())
        .filter(|ip: &IpAddr| !ip.is_loopback());
    if let Some(ip) = target {
        // The interface on the master's subnet reaches it, even a virtual one (a veth
        // or bridge joining containers): the strongest evidence there is.
        let on_subnet = facts
            .nics
            .iter()
            .filter(|n| n.name != "lo" && n.state != "down")
            .find(|n| contains(n, ip));
        if let Some(nic) = on_subnet {
            return Decision::set(NAME, format!("={}", nic.name), format!("{} holds the subnet of the master address {ip}; '=' matches it exactly (a bare prefix would also catch {}1x)", nic.name, nic.name));
        }
    }
    let default = usable.iter().find(|n| n.default_route);
    // A Multus/SR-IOV secondary (net1...) faster than the default interface carries data.
    let secondary = usable
        .iter()
        .filter(|n| n.name.starts_with("net") && !n.default_route)
        .max_by_key(|n| n.speed_mbps.unwrap_or(0))
        .filter(|n| default.is_none_or(|d| n.speed_mbps.unwrap_or(0) > d.speed_mbps.unwrap_or(0)));
    if let Some(nic) = secondary {
        let speed = |n: &Nic| {
            n.speed_mbps.map_or("unknown speed".to_string(), |s| {
                format!("{} Gb/s", s / 1000)
            })
        };
        return Decision::set(NAME, format!("={}", nic.name), format!("{} is a secondary (Multus/SR-IOV) interface at {}, faster than the default route's {}: it carries NCCL's socket traffic", nic.name, speed(nic), default.map_or("none".to_string(), |d| format!("{} at {}", d.name, speed(d)))));
    }
    let (nic, why) = match (default, target) {
        (Some(d), Some(ip)) => (
            d,
            format!(
                "no interface is on {ip}'s subnet; {} holds the default route, which reaches it",
                d.name
            ),
        ),
        (Some(d), None) => (d, format!("{} holds the default route", d.name)),
        (None, _) => (
            &usable[0],
            format!(
                "{} is the first non-virtual interface with an address (no default route)",
                usable[0].name
            ),
        ),
    };
    Decision::set(
        NAME,
        format!("={}", nic.name),
        format!(
            "{why}; virtual interfaces (lo, docker, veth, cni) are never used; '=' matches exactly"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::NicAddress;
    use crate::preflight::testutil::healthy;

    fn nic(name: &str, addr: &str, prefix: u8, default_route: bool, speed: Option<u64>) -> Nic {
        Nic {
            name: name.into(),
            state: "up".into(),
            addresses: vec![NicAddress {
                addr: addr.into(),
                prefix_len: prefix,
            }],
            default_route,
            speed_mbps: speed,
            virtual_iface: crate::plan::socket_ifname::tests::virt(name),
            ..Default::default()
        }
    }

    pub(super) fn virt(name: &str) -> bool {
        ["lo", "docker", "veth", "cni"]
            .iter()
            .any(|p| name.starts_with(p))
    }

    fn shape(addr: Option<&str>) -> LaunchShape<'_> {
        LaunchShape {
            nnodes: 2,
            nproc_per_node: 8,
            master_addr: addr,
        }
    }

    #[test]
    fn interface_choice() {
        let mut f = healthy();
        f.nics = vec![
            nic("lo", "127.0.0.1", 8, false, None),
            nic("docker0", "172.17.0.1", 16, false, None),
            nic("eth0", "10.0.0.5", 24, true, Some(25_000)),
            nic("eth1", "192.168.7.2", 24, false, Some(25_000)),
            nic("veth12", "10.244.0.1", 24, false, None),
        ];
        assert_eq!(decide(&f, &shape(None)).value.as_deref(), Some("=eth0"));
        let d = decide(&f, &shape(Some("192.168.7.40")));
        assert_eq!(
            d.value.as_deref(),
            Some("=eth1"),
            "master on another subnet: {}",
            d.reason
        );
        // A master on a bridge's or veth's subnet is reached through it (measured on
        // 2x H200: a node in its own network namespace behind a veth pair failed with
        // "Network is unreachable" when NCCL bootstrapped over eth0 instead).
        assert_eq!(
            decide(&f, &shape(Some("172.17.0.9"))).value.as_deref(),
            Some("=docker0")
        );
        assert_eq!(
            decide(&f, &shape(Some("10.244.0.2"))).value.as_deref(),
            Some("=veth12")
        );
        assert_eq!(
            decide(&f, &shape(Some("127.0.0.1"))).value.as_deref(),
            Some("=eth0")
        );
        f.nics
            .push(nic("net1", "192.168.100.4", 24, false, Some(100_000)));
        let d = decide(&f, &shape(None));
        assert_eq!(d.value.as_deref(), Some("=net1"), "{}", d.reason);
        f.nics.retain(|n| virt(&n.name));
        assert_eq!(decide(&f, &shape(None)).value, None);
    }
}
