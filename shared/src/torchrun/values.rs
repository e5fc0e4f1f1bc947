//! The values every torchrun option is checked against: the error an option gives
//! (usage or value), the bounds that keep counts representable, and seconds.

use std::time::Duration;

/// A bad option. `usage`: argparse (or a range check) refuses it before anything runs
/// (exit 2); otherwise torchrun finds it only when it runs, as a ValueError or
/// RuntimeError (exit 1), and toporun exits as torchrun does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OptionsError {
    pub message: String,
    pub usage: bool,
}

impl OptionsError {
    pub fn usage(message: impl Into<String>) -> OptionsError {
        OptionsError {
            message: message.into(),
            usage: true,
        }
    }

    pub fn value(message: impl Into<String>) -> OptionsError {
        OptionsError {
            message: message.into(),
            usage: false,
        }
    }

    pub fn exit_code(&self) -> u8 {
        if self.usage {
            crate::root_cause::exit_codes::USAGE
        } else {
            crate::root_cause::exit_codes::FAILURE
        }
    }
}

/// Upper bounds that keep every count, product and deadline representable: more than
/// any machine or job has, far below what would wrap or overflow.
pub const MAX_NPROC: u32 = 4096;
pub const MAX_NODES: u32 = 1 << 20;
/// torch keeps ranks in a C int.
pub const MAX_WORLD: u64 = i32::MAX as u64;
/// Durations (timeouts, intervals) up to 30 days.
pub const MAX_SECS: f64 = 30.0 * 24.0 * 3600.0;

/// Seconds as a Duration, refusing NaN, negatives and anything above MAX_SECS.
pub fn seconds(what: &str, v: &str) -> Result<Duration, OptionsError> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && (0.0..=MAX_SECS).contains(x))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            OptionsError::usage(format!(
                "{what}={v}: expected a number of seconds from 0 to {MAX_SECS:.0} (30 days)"
            ))
        })
}
