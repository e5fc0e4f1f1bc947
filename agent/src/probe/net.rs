//! Network interfaces: /sys/class/net, addresses (getifaddrs), default routes.

use crate::paths::{self, Root};
use std::collections::BTreeSet;
use toporun_shared::facts::{Nic, NicAddress};

/// Name prefixes of interfaces that never carry NCCL traffic.
const VIRTUAL_PREFIXES: &[&str] = &[
    "lo",
    "docker",
    "virbr",
    "veth",
    "cni",
    "flannel",
    "cali",
    "tunl",
    "kube-ipvs",
    "ifb",
    "vxlan",
    "weave",
    "cilium",
    "lxc",
    "br-",
    "dummy",
];

pub fn is_virtual_name(name: &str) -> bool {
    VIRTUAL_PREFIXES.iter().any(|p| name.starts_with(p))
}

pub fn probe(root: &Root) -> Vec<Nic> {
    let defaults = default_route_ifaces(root);
    let mut addrs = if root.is_live() {
        live_addresses()
    } else {
        Vec::new()
    };
    root.list(paths::SYS_CLASS_NET)
        .into_iter()
        .map(|name| {
            let dir = format!("{}/{name}", paths::SYS_CLASS_NET);
            let read = |f: &str| root.read(format!("{dir}/{f}"));
            // Physical devices link to /sys/devices/pci...; virtual ones to /sys/devices/virtual.
            let sys_virtual = std::fs::read_link(root.join(&dir))
                .is_ok_and(|t| t.to_string_lossy().contains("/virtual/"));
            let mut addresses: Vec<NicAddress> = Vec::new();
            addrs.retain(|(n, a)| {
                if *n == name {
                    addresses.push(a.clone());
                    false
                } else {
                    true
                }
            });
            Nic {
                state: read("operstate").unwrap_or_else(|| "unknown".into()),
                speed_mbps: read("speed")
                    .and_then(|s| s.parse::<i64>().ok())
                    .filter(|s| *s > 0)
                    .map(|s| s as u64),
                mtu: read("mtu").and_then(|s| s.parse().ok()),
                mac: read("address"),
                addresses,
                default_route: defaults.contains(&name),
                virtual_iface: is_virtual_name(&name)
                    || (sys_virtual && !name.starts_with("net") && !name.starts_with("eth")),
                name,
            }
        })
        .collect()
}

fn live_addresses() -> Vec<(String, NicAddress)> {
    let Ok(list) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    list.filter_map(|ifa| {
        let addr = ifa.address?;
        let mask = ifa.netmask;
        let (text, prefix) = if let Some(v4) = addr.as_sockaddr_in() {
            let bits = mask
                .and_then(|m| m.as_sockaddr_in().map(|m| u32::from(m.ip()).count_ones()))
                .unwrap_or(32);
            (v4.ip().to_string(), bits as u8)
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            let bits = mask
                .and_then(|m| m.as_sockaddr_in6().map(|m| u128::from(m.ip()).count_ones()))
                .unwrap_or(128);
            (v6.ip().to_string(), bits as u8)
        } else {
            return None;
        };
        Some((
            ifa.interface_name,
            NicAddress {
                addr: text,
                prefix_len: prefix,
            },
        ))
    })
    .collect()
}

/// Interfaces holding a default route (IPv4 destination 00000000, IPv6 ::/0).
fn default_route_ifaces(root: &Root) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in root
        .read(paths::PROC_NET_ROUTE)
        .unwrap_or_default()
        .lines()
        .skip(1)
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 7 && f[1] == "00000000" && f[7] == "00000000" {
            out.insert(f[0].to_string());
        }
    }
    for line in root
        .read(paths::PROC_NET_IPV6_ROUTE)
        .unwrap_or_default()
        .lines()
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 10 && f[0].bytes().all(|b| b == b'0') && f[1] == "00" && f[9] != "lo" {
            out.insert(f[9].to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_match_sys_class_net() {
        let nics = probe(&Root::live());
        let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            nics.iter().map(|n| n.name.clone()).collect::<Vec<_>>(),
            names
        );
        let lo = nics.iter().find(|n| n.name == "lo").unwrap();
        assert!(lo.virtual_iface);
        assert!(lo
            .addresses
            .iter()
            .any(|a| a.addr == "127.0.0.1" && a.prefix_len == 8));
    }

    #[test]
    fn default_route_from_a_fake_proc() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/net")).unwrap();
        std::fs::create_dir_all(dir.path().join("sys/class/net/eth0")).unwrap();
        std::fs::create_dir_all(dir.path().join("sys/class/net/net1")).unwrap();
        std::fs::write(dir.path().join("sys/class/net/eth0/operstate"), "up\n").unwrap();
        std::fs::write(dir.path().join("sys/class/net/net1/speed"), "100000\n").unwrap();
        std::fs::write(
            dir.path().join("proc/net/route"),
            "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
net1\t000010AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n",
        )
        .unwrap();
        let nics = probe(&Root::at(dir.path()));
        assert!(
            nics.iter()
                .find(|n| n.name == "eth0")
                .unwrap()
                .default_route
        );
        let net1 = nics.iter().find(|n| n.name == "net1").unwrap();
        assert!(!net1.default_route);
        assert_eq!(net1.speed_mbps, Some(100_000));
    }
}
