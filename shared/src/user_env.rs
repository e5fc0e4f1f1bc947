//! The environment the ranks inherit from the user, by name: what toporun's
//! additions to a rank's environment yield to.

use crate::facts::PlatformFacts;
use std::collections::BTreeMap;

/// The user's variables, by name.
pub type UserEnv = BTreeMap<String, String>;

/// What NCCL sees set: the user's environment, then the settings of NCCL's config
/// files (`conf`) for the names the environment leaves unset, as NCCL applies them.
pub fn with_nccl_conf(user: &UserEnv, conf: &BTreeMap<String, String>) -> UserEnv {
    let mut seen = conf.clone();
    seen.extend(user.iter().map(|(k, v)| (k.clone(), v.clone())));
    seen
}

/// Where a variable that NCCL sees set was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetIn {
    Environment,
    /// One of NCCL's config files (its path).
    ConfFile(String),
}

impl SetIn {
    /// Where `name` is set: the environment wins, as in NCCL.
    pub fn of(name: &str, env: &UserEnv, platform: &PlatformFacts) -> SetIn {
        if env.contains_key(name) || !platform.nccl_conf.contains_key(name) {
            return SetIn::Environment;
        }
        let file = platform.nccl_conf_from.get(name);
        SetIn::ConfFile(
            file.cloned()
                .unwrap_or_else(|| platform.nccl_conf_files.join(" or ")),
        )
    }

    /// The config file, where one sets it.
    pub fn file(&self) -> Option<&str> {
        match self {
            SetIn::Environment => None,
            SetIn::ConfFile(f) => Some(f),
        }
    }
}

impl std::fmt::Display for SetIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetIn::Environment => f.write_str("set by the user"),
            SetIn::ConfFile(file) => write!(f, "set in {file}"),
        }
    }
}

/// A user's environment from pairs, for tests.
#[cfg(test)]
pub(crate) fn env_of(pairs: &[(&str, &str)]) -> UserEnv {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
