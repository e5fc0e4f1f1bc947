//! `nccl.env`: the user's NCCL_* variables checked against the host. Unknown names and
//! harmful values give warnings with evidence; nothing here changes a value.

use crate::facts::HostFacts;
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};
use crate::measured::{self, slowdown};
use crate::nccl_vars;
use crate::user_env::{with_nccl_conf, SetIn};
use std::collections::BTreeMap;

/// The id of the findings on the user's NCCL variables.
pub const ID: FindingId = FindingId::NcclEnv;

/// NCCL reads its switches as integers: "true" is 0 to it.
fn truthy(v: &str) -> bool {
    crate::flags::nccl_flag(v)
}

/// Whether an NCCL_SOCKET_IFNAME value selects `iface` (NCCL's prefix/exact/exclude syntax).
pub fn ifname_selects(spec: &str, iface: &str) -> bool {
    let (exclude, list) = spec.strip_prefix('^').map_or((false, spec), |s| (true, s));
    let (exact, list) = list.strip_prefix('=').map_or((false, list), |s| (true, s));
    let hit = list
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| {
            if exact {
                iface == p
            } else {
                iface.starts_with(p)
            }
        });
    hit != exclude
}

/// [`check`] of what NCCL sees set: the environment, then NCCL's config files. A
/// finding on a config file's value says so, with the fix made there.
pub fn check_as_nccl_sees(facts: &HostFacts, env: &BTreeMap<String, String>) -> Vec<Finding> {
    let seen = with_nccl_conf(env, &facts.platform.nccl_conf);
    let mut findings = check(facts, &seen);
    for f in &mut findings {
        let at = f
            .facts
            .get("variable")
            .map(|v| SetIn::of(v, env, &facts.platform));
        let Some(SetIn::ConfFile(files)) = at else {
            continue;
        };
        f.remedy = f
            .remedy
            .take()
            .map(|r| match r.strip_suffix(" from the job spec") {
                Some(head) => format!("{head} from {files}"),
                None => format!("{r} (set in {files}: change it there)"),
            });
        f.facts.insert("set in".into(), files);
    }
    findings.extend(conf_line_faults(facts, env));
    findings
}

/// Lines of NCCL's config files that NCCL reads otherwise than they look: spaces
/// around a name (NCCL sets the name as written: nothing it reads) and a value ending
/// in a carriage return (a CRLF file: NCCL keeps the `\r`).
fn conf_line_faults(facts: &HostFacts, env: &BTreeMap<String, String>) -> Vec<Finding> {
    let p = &facts.platform;
    let mut out = Vec::new();
    for (name, value) in p.nccl_conf.iter().filter(|(k, _)| !env.contains_key(*k)) {
        let at = SetIn::of(name, env, p);
        let file = at.file().unwrap_or_default();
        let bare = name.trim();
        let found = if bare != name && bare.starts_with("NCCL_") {
            Finding::new(ID, Severity::Warning, format!("{file} sets {name:?} with spaces around the name: NCCL takes the name as written, so {bare} stays unset"))
                .remedy(format!("write {bare}={} in {file}, with no space around '='", value.trim()))
        } else if value.ends_with('\r') && name.starts_with("NCCL_") {
            Finding::new(ID, Severity::Warning, format!("{name}'s value in {file} ends in a carriage return (the file has CRLF line endings): NCCL takes {value:?} as the value"))
                .remedy(format!("convert {file} to LF line endings (dos2unix {file})"))
        } else {
            continue;
        };
        out.push(found.fact("variable", bare).fact("set in", file));
    }
    out
}

pub fn check(facts: &HostFacts, env: &BTreeMap<String, String>) -> Vec<Finding> {
    let mut out = Vec::new();
    let g = &facts.gpus;
    let nvlink_pairs = g.pairs().filter(|(_, _, l)| l.is_nvlink()).count();
    let warn = |summary: String, var: &str, value: &str| {
        Finding::new(ID, Severity::Warning, summary)
            .fact("variable", var)
            .fact("value", value)
    };
    for (name, value) in env.iter().filter(|(k, _)| k.starts_with("NCCL_")) {
        if !nccl_vars::is_known(name) {
            let why = nccl_vars::folklore(name)
                .map(String::from)
                .or_else(|| nccl_vars::closest(name).map(|c| format!("did you mean {c}?")))
                .unwrap_or_else(|| "NCCL does not read it".into());
            out.push(
                warn(
                    format!("{name} is not an NCCL variable and has no effect: {why}"),
                    name,
                    value,
                )
                .remedy(format!("remove {name} from the job spec")),
            );
        }
    }
    let get = |k: &str| env.get(k).map(String::as_str);
    let p2p_off = get("NCCL_P2P_DISABLE").is_some_and(truthy)
        || get("NCCL_P2P_LEVEL").is_some_and(|v| matches!(v.trim(), "LOC" | "0"));
    let shm_off = get("NCCL_SHM_DISABLE").is_some_and(truthy);
    if nvlink_pairs > 0 && p2p_off {
        let (to, gbps) = if shm_off {
            ("TCP sockets", measured::SOCKET_GBPS)
        } else {
            ("host memory (SHM)", measured::SHM_GBPS)
        };
        let var = if get("NCCL_P2P_DISABLE").is_some_and(truthy) {
            "NCCL_P2P_DISABLE"
        } else {
            "NCCL_P2P_LEVEL"
        };
        out.push(
            warn(format!("{var}={} turns off P2P on {nvlink_pairs} NVLink pair(s): traffic goes through {to}", get(var).unwrap_or_default()), var, get(var).unwrap_or_default())
                .fact("measured", format!("all_reduce busbw {gbps} GB/s vs {} GB/s over NVLink on 4x H200 ({})", measured::NVLINK_P2P_GBPS, slowdown(measured::NVLINK_P2P_GBPS, gbps)))
                .remedy(format!("unset {var}{}", if shm_off { " and NCCL_SHM_DISABLE" } else { "" })),
        );
    } else if shm_off && g.count() > 1 && !g.pairs().all(|(_, _, l)| l.p2p_by_default()) {
        out.push(warn("NCCL_SHM_DISABLE=1 on a host where some GPU pairs have no P2P path: they fall back to TCP sockets".into(), "NCCL_SHM_DISABLE", "1").remedy("unset NCCL_SHM_DISABLE"));
    }
    if let Some(proto) = get("NCCL_PROTO") {
        let simple_only = proto
            .split(',')
            .all(|p| p.trim().eq_ignore_ascii_case("simple"));
        if simple_only && nvlink_pairs > 0 && facts.efa_devices().next().is_none() {
            out.push(
                warn(format!("NCCL_PROTO={proto} on an NVLink host: small messages lose the low-latency protocols"), "NCCL_PROTO", proto)
                    .fact("measured", format!("1 MiB all_reduce {} GB/s vs {} GB/s by default on 4x H200 ({})", measured::SMALL_SIMPLE_GBPS, measured::SMALL_DEFAULT_GBPS, slowdown(measured::SMALL_DEFAULT_GBPS, measured::SMALL_SIMPLE_GBPS)))
                    .remedy("unset NCCL_PROTO (it is an EFA-template leftover; aws-ofi-nccl sets it itself where needed)"),
            );
        }
    }
    if let Some(spec) = get("NCCL_SOCKET_IFNAME") {
        if !spec.starts_with('^')
            && !facts.nics.is_empty()
            && !facts.nics.iter().any(|n| ifname_selects(spec, &n.name))
        {
            let names: Vec<&str> = facts.nics.iter().map(|n| n.name.as_str()).collect();
            out.push(warn(format!("NCCL_SOCKET_IFNAME={spec} matches no interface here ({}): NCCL fails with \"no socket interface found\"", names.join(", ")), "NCCL_SOCKET_IFNAME", spec).remedy("unset it and let toporun plan it, or name an existing interface with =NAME"));
        }
    }
    if let Some(spec) = get("NCCL_IB_HCA") {
        let list = spec.trim_start_matches('^');
        if !list.starts_with('=') {
            let names: Vec<&str> = facts.rdma.iter().map(|d| d.name.as_str()).collect();
            let traps: Vec<String> = list
                .split(',')
                .map(|p| p.split(':').next().unwrap_or_default().trim())
                .flat_map(|p| {
                    names
                        .iter()
                        .filter(move |n| n.starts_with(p) && **n != p)
                        .map(move |n| format!("{p} also matches {n}"))
                })
                .collect();
            if !traps.is_empty() {
                out.push(
                    warn(
                        format!("NCCL_IB_HCA={spec} is a prefix match: {}", traps.join("; ")),
                        "NCCL_IB_HCA",
                        spec,
                    )
                    .remedy(format!("use exact matching: NCCL_IB_HCA=={}", list)),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::testutil::{env, healthy};

    #[test]
    fn folklore_variables_are_flagged() {
        let out = check(
            &healthy(),
            &env(&[("NCCL_P2P_DIRECT_WRITE", "1"), ("NCCL_P2P_LEVEL", "NVL")]),
        );
        assert_eq!(out.len(), 1);
        assert!(out[0].summary.contains("NCCL_P2P_DIRECT_WRITE"));
    }

    #[test]
    fn p2p_disable_on_nvlink_quotes_the_measured_cost() {
        let out = check(&healthy(), &env(&[("NCCL_P2P_DISABLE", "1")]));
        assert!(out[0].facts["measured"].contains("27.5"));
        let out = check(
            &healthy(),
            &env(&[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")]),
        );
        assert!(out[0].facts["measured"].contains("4.6"));
    }

    #[test]
    fn proto_simple_on_nvlink_warns() {
        let out = check(&healthy(), &env(&[("NCCL_PROTO", "Simple")]));
        assert!(out[0].facts["measured"].contains("6.6x"));
        assert!(check(&healthy(), &env(&[("NCCL_PROTO", "LL,LL128,Simple")])).is_empty());
    }

    #[test]
    fn socket_ifname_syntax() {
        assert!(ifname_selects("eth", "eth10"));
        assert!(!ifname_selects("=eth1", "eth10"));
        assert!(ifname_selects("^docker,lo", "eth0"));
        assert!(!ifname_selects("^docker,lo", "lo"));
        let out = check(&healthy(), &env(&[("NCCL_SOCKET_IFNAME", "=ens5")]));
        assert!(out[0].summary.contains("matches no interface"));
    }
}
