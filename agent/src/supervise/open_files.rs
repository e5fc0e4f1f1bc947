//! The open-file limit: toporun raises its soft limit to the hard one at start (a
//! container's default of 1024 would let a flood of store connections starve the
//! ranks' own), and gives the ranks back the limit they would have had.

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use std::sync::OnceLock;

/// The soft and hard limits toporun was started with.
static STARTED_WITH: OnceLock<(u64, u64)> = OnceLock::new();

/// Raises the soft limit to the hard limit; returns (before, after).
pub fn raise() -> Option<(u64, u64)> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let _ = STARTED_WITH.set((soft, hard));
    if soft >= hard {
        return Some((soft, soft));
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).ok()?;
    Some((soft, hard))
}

/// What a rank should get back (None: nothing was changed).
pub fn for_ranks() -> Option<(u64, u64)> {
    let (soft, hard) = *STARTED_WITH.get()?;
    let now = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    (now != (soft, hard)).then_some((soft, hard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_to_the_hard_limit_and_remembers_the_start() {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        if soft == hard {
            setrlimit(Resource::RLIMIT_NOFILE, hard / 2, hard).unwrap();
        }
        let (before, after) = raise().unwrap();
        assert_eq!(after, hard);
        assert!(before <= after);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap().0, hard);
        assert_eq!(for_ranks().map(|l| l.0), Some(before));
    }
}
