//! What every rule works from (the launch's shape) and gives back (a decision for
//! one variable, before the user's value is considered).

/// What the planner needs to know about the launch.
#[derive(Debug, Clone, Default)]
pub struct LaunchShape<'a> {
    pub nnodes: u32,
    pub nproc_per_node: u32,
    /// Where the other nodes are reached (master or rendezvous host).
    pub master_addr: Option<&'a str>,
}

/// A rule's verdict for one variable, before the user's value is considered.
pub(crate) struct Decision {
    pub name: &'static str,
    pub value: Option<String>,
    pub reason: String,
}

impl Decision {
    pub fn set(name: &'static str, value: impl Into<String>, reason: impl Into<String>) -> Self {
        Decision {
            name,
            value: Some(value.into()),
            reason: reason.into(),
        }
    }
    pub fn leave(name: &'static str, reason: impl Into<String>) -> Self {
        Decision {
            name,
            value: None,
            reason: reason.into(),
        }
    }
}
