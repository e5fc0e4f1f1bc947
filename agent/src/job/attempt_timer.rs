//! torch's file timer in an attempt (TORCHELASTIC_ENABLE_FILE_TIMER=1): served by
//! toporun as torchrun's FileTimerServer, its expiry a stop, and the end it makes.

use crate::job::error::JobError;
use crate::job::session::Session;
use crate::job::spec::{FileTimerSetting, NodePlace};
use crate::job::transitions::AttemptEnd;
use crate::paths::random_id;
use crate::rendezvous::StopReason;
use crate::supervise::{self, file_timer::FileTimer, Outcome};
use nix::sys::signal::Signal;
use std::time::Duration;

/// torch's FileTimerServer when `TORCHELASTIC_ENABLE_FILE_TIMER=1`.
pub(super) fn file_timer(setting: &FileTimerSetting) -> Result<Option<FileTimer>, JobError> {
    if !setting.serve {
        return Ok(None);
    }
    let path = setting
        .path
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("watchdog_timer_{}", random_id())));
    FileTimer::create(&path)
        .map(Some)
        .map_err(|e| JobError::failed("TORCHELASTIC_ENABLE_FILE_TIMER=1", e))
}

/// The file timer's expiry as a stop reason (never, without a timer).
pub(super) async fn timer_expired(timer: &mut Option<FileTimer>) -> StopReason {
    match timer.as_mut() {
        Some(t) => {
            let e = t.expired().await;
            // The killed rank's exit normally ends the attempt first (and names its
            // rank); a pid that is no rank of ours stops it here.
            tokio::time::sleep(Duration::from_secs(2)).await;
            StopReason::fail(format!(
                "the file timer of pid {} (scope {}) expired",
                e.pid, e.scope_id
            ))
        }
        None => std::future::pending().await,
    }
}

/// torchrun's FileTimerServer kills the worker, then its own agent with the same
/// signal: no restart, exit 128 + signal.
pub(super) async fn file_timer_fired<R>(
    session: &mut impl Session,
    node: &NodePlace,
    outcome: &Outcome<R>,
    e: supervise::file_timer::Expired,
) -> AttemptEnd {
    let who = match outcome {
        Outcome::Failed(fs) => fs.iter().find(|f| f.pid == e.pid).map(|f| {
            format!(
                "rank {} (local rank {}, pid {})",
                f.rank, f.local_rank, f.pid
            )
        }),
        _ => None,
    }
    .unwrap_or_else(|| format!("pid {}", e.pid));
    let sig = Signal::try_from(e.signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| e.signal.to_string());
    crate::console::say!("toporun: file timer: scope '{}' of {who} expired {:.1}s ago; killed it with {sig} and stopped every rank, as torchrun's FileTimerServer does", e.scope_id, e.overrun.as_secs_f64());
    let why = format!("file timer expired on node {}", node.node_rank);
    session.stop_all(node.round, StopReason::fail(why)).await;
    AttemptEnd::FileTimer { signal: e.signal }
}
