//! The environment the ranks inherit from the user, by name: what toporun's
//! additions to a rank's environment yield to.

use std::collections::BTreeMap;

/// The user's variables, by name.
pub type UserEnv = BTreeMap<String, String>;

/// A user's environment from pairs, for tests.
#[cfg(test)]
pub(crate) fn env_of(pairs: &[(&str, &str)]) -> UserEnv {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
