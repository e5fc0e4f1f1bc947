//! The NCCL planner: facts + the user's environment + the launch shape -> for each
//! variable a value (or "left to NCCL"), the reason, and where it came from. Pure.

mod cumem;
mod decision;
mod p2p_level;
mod rdma;
mod socket_ifname;
mod topo_file;

use decision::Decision;
pub use decision::LaunchShape;

use crate::facts::HostFacts;
use crate::finding::Finding;
use crate::user_env::SetIn;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// toporun chose the value.
    Planned,
    /// The user set it; kept as is.
    User,
    /// No value: NCCL decides, and the reason says why that is right here.
    LeftToNccl,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedVar {
    pub name: String,
    pub value: Option<String>,
    pub source: Source,
    pub reason: String,
    /// The NCCL config file a user value is set in (NCCL reads it there; the
    /// environment does not carry it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_in: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    pub variables: Vec<PlannedVar>,
    /// Warnings and errors about the user's settings and the host.
    pub findings: Vec<Finding>,
}

/// `--nccl-env=on|off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanMode {
    On,
    Off,
}

pub fn plan(
    facts: &HostFacts,
    user_env: &BTreeMap<String, String>,
    shape: &LaunchShape,
    mode: PlanMode,
) -> Plan {
    // A value of NCCL's config files counts as the user's: NCCL applies it where the
    // environment leaves the name unset, so a planned one would silently replace it.
    let set_where = |name: &str| SetIn::of(name, user_env, &facts.platform);
    let findings = crate::nccl_env_check::check_as_nccl_sees(facts, user_env);
    let user_env = &crate::user_env::with_nccl_conf(user_env, &facts.platform.nccl_conf);
    let mut decisions = vec![
        p2p_level::decide(facts, user_env),
        socket_ifname::decide(facts, shape),
    ];
    decisions.push(proto(facts));
    decisions.push(topo_file::decide(facts));
    decisions.extend(rdma::decide(facts));
    decisions.extend(cumem::decide(facts, user_env, shape.nproc_per_node.max(1)));
    let mut variables: Vec<PlannedVar> = decisions
        .into_iter()
        .map(|d| resolve(d, user_env, &set_where, mode))
        .collect();
    // Every other NCCL_*/FI_* variable of the user's, kept.
    let kept: Vec<(&String, &String)> = user_env
        .iter()
        .filter(|(k, _)| {
            (k.starts_with("NCCL_") || k.starts_with("FI_"))
                && !variables.iter().any(|p| &p.name == *k)
        })
        .collect();
    for (k, v) in kept {
        let at = set_where(k);
        let reason = format!("{at}, kept");
        variables.push(PlannedVar::kept(k, Some(v.clone()), at, reason));
    }
    Plan {
        variables,
        findings,
    }
}

/// A decision as the ranks get it: the user's value (or NCCL_P2P_DISABLE for the
/// P2P level) wins, `--nccl-env=off` leaves it to NCCL, else toporun's.
fn resolve(
    d: Decision,
    user_env: &BTreeMap<String, String>,
    set_where: &dyn Fn(&str) -> SetIn,
    mode: PlanMode,
) -> PlannedVar {
    let p2p_disable = (d.name == "NCCL_P2P_LEVEL")
        .then(|| user_env.get("NCCL_P2P_DISABLE"))
        .flatten();
    if let Some(v) = user_env.get(d.name) {
        let at = set_where(d.name);
        let reason = format!("{at}, kept (toporun would have {})", describe(&d));
        PlannedVar::kept(d.name, Some(v.clone()), at, reason)
    } else if let Some(v) = p2p_disable {
        let at = set_where("NCCL_P2P_DISABLE");
        let reason = format!("NCCL_P2P_DISABLE={v} {at} decides P2P; kept");
        PlannedVar::kept(d.name, None, at, reason)
    } else if mode == PlanMode::Off {
        let reason = "--nccl-env=off: toporun plans nothing".into();
        PlannedVar::new(d.name, None, Source::LeftToNccl, reason)
    } else {
        let source = match d.value {
            Some(_) => Source::Planned,
            None => Source::LeftToNccl,
        };
        PlannedVar::new(d.name, d.value, source, d.reason)
    }
}

impl PlannedVar {
    fn new(name: &str, value: Option<String>, source: Source, reason: String) -> PlannedVar {
        PlannedVar {
            name: name.into(),
            value,
            source,
            reason,
            set_in: None,
        }
    }

    /// A user's setting kept, with the config file it is set in.
    fn kept(name: &str, value: Option<String>, at: SetIn, reason: String) -> PlannedVar {
        PlannedVar {
            set_in: at.file().map(String::from),
            ..PlannedVar::new(name, value, Source::User, reason)
        }
    }
}

fn describe(d: &Decision) -> String {
    match &d.value {
        Some(v) => format!("set {v}: {}", d.reason),
        None => format!("left it to NCCL: {}", d.reason),
    }
}

fn proto(facts: &HostFacts) -> Decision {
    if facts.efa_devices().next().is_some() {
        Decision::leave("NCCL_PROTO", "EFA host: aws-ofi-nccl (>= 1.6) forces Simple itself when the provider needs it; setting it by hand slows every other path")
    } else {
        Decision::leave("NCCL_PROTO", "NCCL picks LL/LL128/Simple per message size; forcing Simple makes 1 MiB all_reduce 6.6x slower on NVLink (measured)")
    }
}

impl Plan {
    /// Every NCCL_*/FI_* variable the ranks will run with, planned or kept.
    pub fn env(&self) -> BTreeMap<String, String> {
        self.variables
            .iter()
            .filter_map(|v| Some((v.name.clone(), v.value.clone()?)))
            .collect()
    }

    /// Only what toporun adds to the ranks' environment (the user's are inherited).
    pub fn planned(&self) -> BTreeMap<String, String> {
        self.variables
            .iter()
            .filter(|v| v.source == Source::Planned)
            .filter_map(|v| Some((v.name.clone(), v.value.clone()?)))
            .collect()
    }

    pub fn get(&self, name: &str) -> Option<&PlannedVar> {
        self.variables.iter().find(|v| v.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::testutil::{env, healthy};

    #[test]
    fn user_values_are_never_changed() {
        let user = env(&[
            ("NCCL_P2P_LEVEL", "SYS"),
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("NCCL_DEBUG", "INFO"),
        ]);
        let p = plan(&healthy(), &user, &LaunchShape::default(), PlanMode::On);
        for (k, v) in &user {
            let var = p.get(k).unwrap();
            assert_eq!(var.value.as_ref(), Some(v));
            assert_eq!(var.source, Source::User);
        }
        assert_eq!(p.env()["NCCL_P2P_LEVEL"], "SYS");
        assert!(!p.planned().contains_key("NCCL_P2P_LEVEL"));
    }

    #[test]
    fn p2p_disable_from_user_owns_the_level() {
        let p = plan(
            &healthy(),
            &env(&[("NCCL_P2P_DISABLE", "1")]),
            &LaunchShape::default(),
            PlanMode::On,
        );
        let level = p.get("NCCL_P2P_LEVEL").unwrap();
        assert_eq!(level.source, Source::User);
        assert_eq!(level.value, None);
        assert!(p
            .findings
            .iter()
            .any(|f| f.facts.get("measured").is_some_and(|m| m.contains("27.5"))));
    }

    /// The plan of `host` for one node, with the user's `env`.
    fn on(host: &HostFacts, env: &BTreeMap<String, String>) -> Plan {
        plan(host, env, &LaunchShape::default(), PlanMode::On)
    }

    /// A value of NCCL's config files is NCCL's unless the environment sets the name:
    /// toporun keeps it as the user's, says where it is set, and checks it.
    #[test]
    fn nccl_conf_values_are_the_users_unless_the_environment_sets_them() {
        let mut host = healthy();
        host.platform.nccl_conf = env(&[
            ("NCCL_P2P_LEVEL", "SYS"),
            ("NCCL_SOCKET_IFNAME", "eth9"),
            ("NCCL_P2P_DIRECT_READ", "1"),
        ]);
        host.platform.nccl_conf_files = vec!["/etc/nccl.conf".into()];
        let p = on(&host, &BTreeMap::new());
        let level = p.get("NCCL_P2P_LEVEL").unwrap();
        assert_eq!(
            (level.value.as_deref(), level.source),
            (Some("SYS"), Source::User)
        );
        assert!(
            level
                .reason
                .starts_with("set in /etc/nccl.conf, kept (toporun would have set NVL"),
            "{}",
            level.reason
        );
        assert!(!p.planned().contains_key("NCCL_P2P_LEVEL"));
        assert_eq!(level.set_in.as_deref(), Some("/etc/nccl.conf"));
        let other = p.get("NCCL_P2P_DIRECT_READ").unwrap();
        assert_eq!(other.reason, "set in /etc/nccl.conf, kept");
        let finding = p
            .findings
            .iter()
            .find(|f| f.facts.get("variable").map(String::as_str) == Some("NCCL_P2P_DIRECT_READ"))
            .expect("the conf's folklore variable is checked");
        assert_eq!(finding.facts["set in"], "/etc/nccl.conf");
        assert_eq!(
            finding.remedy.as_deref(),
            Some("remove NCCL_P2P_DIRECT_READ from /etc/nccl.conf")
        );
        // The environment wins, as in NCCL.
        let user = env(&[("NCCL_P2P_LEVEL", "PIX")]);
        let p = on(&host, &user);
        let level = p.get("NCCL_P2P_LEVEL").unwrap();
        assert_eq!(level.value.as_deref(), Some("PIX"));
        assert!(
            level.reason.starts_with("set by the user, kept"),
            "{}",
            level.reason
        );
        assert_eq!(level.set_in, None);
        // NCCL_P2P_DISABLE from the file owns the level as the environment's would.
        host.platform.nccl_conf = env(&[("NCCL_P2P_DISABLE", "1")]);
        let p = on(&host, &BTreeMap::new());
        let level = p.get("NCCL_P2P_LEVEL").unwrap();
        assert_eq!((level.value.as_deref(), level.source), (None, Source::User));
        assert_eq!(
            level.reason,
            "NCCL_P2P_DISABLE=1 set in /etc/nccl.conf decides P2P; kept"
        );
    }

    /// A CRLF file and spaces around a name: NCCL reads both otherwise than they
    /// look, and the plan's findings say so, with the file.
    #[test]
    fn nccl_conf_lines_nccl_misreads_are_findings() {
        let mut host = healthy();
        host.platform.nccl_conf = env(&[
            ("NCCL_PROFILER_PLUGIN", "/opt/x.so\r"),
            (" NCCL_ALGO ", " Ring"),
        ]);
        host.platform.nccl_conf_from = env(&[
            ("NCCL_PROFILER_PLUGIN", "/etc/nccl.conf"),
            (" NCCL_ALGO ", "/etc/nccl.conf"),
        ]);
        let p = on(&host, &BTreeMap::new());
        let said = |v: &str| {
            p.findings
                .iter()
                .find(|f| f.facts.get("variable").map(String::as_str) == Some(v))
                .map(|f| (f.summary.clone(), f.remedy.clone().unwrap_or_default()))
                .unwrap_or_else(|| panic!("no finding on {v}: {:?}", p.findings))
        };
        let (summary, remedy) = said("NCCL_PROFILER_PLUGIN");
        assert!(summary.contains("ends in a carriage return"), "{summary}");
        assert!(remedy.contains("dos2unix /etc/nccl.conf"), "{remedy}");
        let (summary, remedy) = said("NCCL_ALGO");
        assert!(summary.contains("so NCCL_ALGO stays unset"), "{summary}");
        assert_eq!(
            remedy,
            "write NCCL_ALGO=Ring in /etc/nccl.conf, with no space around '='"
        );
        // The environment's own value: no finding on the file's.
        let user = env(&[("NCCL_PROFILER_PLUGIN", "/opt/y.so")]);
        let p = on(&host, &user);
        assert!(!p
            .findings
            .iter()
            .any(|f| f.summary.contains("carriage return")));
    }

    #[test]
    fn off_plans_nothing() {
        let p = plan(
            &healthy(),
            &env(&[("NCCL_DEBUG", "INFO")]),
            &LaunchShape::default(),
            PlanMode::Off,
        );
        assert!(p.planned().is_empty());
        assert_eq!(p.env().len(), 1);
    }

    #[test]
    fn nvlink_host_gets_nvl_and_no_proto() {
        let p = plan(
            &healthy(),
            &BTreeMap::new(),
            &LaunchShape::default(),
            PlanMode::On,
        );
        assert_eq!(p.env()["NCCL_P2P_LEVEL"], "NVL");
        assert!(!p.env().contains_key("NCCL_PROTO"));
    }
}
