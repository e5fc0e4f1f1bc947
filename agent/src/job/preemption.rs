//! A node told to go (SIGTERM from the kubelet's drain, a spot reclaim): one stop for
//! the whole job, announced to every node the moment the signal arrives, with a stop
//! file every rank can poll (`TOPORUN_STOP_FILE`) made on every node before its ranks
//! are signalled, and a shutdown deadline counted from that first signal everywhere.

use crate::job::spec::{NodePlace, StopSettings};
use crate::probe::cloud_metadata::Endpoints;
use crate::rendezvous::{StopKind, StopReason};
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use toporun_shared::toporun_vars::ToporunVar;

/// The variable that names the stop file in every rank's environment.
pub const STOP_FILE_VAR: &str = ToporunVar::StopFile.name();

/// The file every rank can poll: made when a stop is requested, on every node.
#[derive(Debug, Clone)]
pub struct StopFile(PathBuf);

impl StopFile {
    /// The user's `TOPORUN_STOP_FILE`, else `stop-requested` in the run directory.
    pub fn of(s: &StopSettings, run_dir: &Path) -> StopFile {
        StopFile(s.stop_file(run_dir))
    }

    /// This attempt's stop file, cleared of the last attempt's (the ranks learn its
    /// path from `rank_env::attempt_env`).
    pub fn armed(s: &StopSettings, run_dir: &Path) -> StopFile {
        let f = StopFile::of(s, run_dir);
        f.clear();
        f
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A new attempt starts without the last one's stop.
    pub fn clear(&self) {
        let _ = std::fs::remove_file(&self.0);
    }

    /// Says "stop at the next step" to every rank of this node.
    pub fn make(&self) {
        if let Err(e) = std::fs::write(&self.0, b"stop\n") {
            crate::console::say_warning!("cannot make the stop file {}: {e}", self.0.display());
        }
    }
}

/// Removes the stop file when the attempt ends (the ranks are gone): the run
/// directory keeps only what torchrun leaves there.
pub struct RemovedAtEnd(pub StopFile);

impl Drop for RemovedAtEnd {
    fn drop(&mut self) {
        self.0.clear();
    }
}

/// Milliseconds since the epoch, as a stop reason carries the first signal's time.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How much of the shutdown deadline a stop has spent already: a preemption's
/// deadline runs from its first signal, on whichever node it struck.
pub fn spent(reason: &StopReason) -> Duration {
    match (reason.kind, reason.at_ms) {
        (StopKind::Preempt, Some(at)) => Duration::from_millis(now_ms().saturating_sub(at)),
        _ => Duration::ZERO,
    }
}

/// `ms` since the epoch as an RFC 3339 time; None past what that can say (the
/// year 9999): the time comes from the store, where any node may write it.
fn rfc3339_ms(ms: u64) -> Option<String> {
    use std::fmt::Write;
    let when = UNIX_EPOCH.checked_add(Duration::from_millis(ms))?;
    let mut text = String::new();
    write!(text, "{}", humantime::format_rfc3339_millis(when)).ok()?;
    Some(text)
}

/// What this node saw of a preempted attempt's end: when the stop began, and how
/// each rank exited.
#[derive(Default)]
pub struct Ending {
    exits: Mutex<Vec<i32>>,
}

impl Ending {
    pub fn exited(&self, code: i32) {
        self.exits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(code);
    }

    /// `preempted: SIGTERM on node 1 (trainer-1) at 2025-11-24T16:00:00.100Z; every
    /// rank of this node stopped within 4.2s; 2 of 2 ranks exited 0`.
    pub fn message(&self, reason: &StopReason) -> String {
        let exits = self.exits.lock().unwrap_or_else(PoisonError::into_inner);
        let clean = exits.iter().filter(|c| **c == 0).count();
        let within = spent(reason).as_secs_f64();
        let at = reason
            .at_ms
            .and_then(rfc3339_ms)
            .map_or(String::new(), |when| format!(" at {when}"));
        format!(
            "{}: {}{at}; every rank of this node stopped within {within:.1}s of it; {clean} of {} ranks exited 0",
            called(reason),
            reason.detail,
            exits.len()
        )
    }
}

/// What a stop by signal is called: SIGINT is Ctrl-C at a terminal, an interruption;
/// any other (SIGTERM from a drain, a cloud's notice) a preemption.
fn called(reason: &StopReason) -> &'static str {
    if reason.interrupted {
        "interrupted"
    } else {
        "preempted"
    }
}

/// With `--watch-preemption`, resolves with the cloud's notice as this node's
/// preemption, announced to the other nodes; never without it.
/// `host`: this node's hostname.
pub async fn notice(
    watch: Option<Endpoints>,
    (node, host): (&NodePlace, &str),
    announce: Option<tokio::sync::mpsc::UnboundedSender<StopReason>>,
) -> StopReason {
    let Some(at) = watch else {
        return std::future::pending().await;
    };
    let what = crate::probe::preemption_notice::watch(at).await;
    let r = StopReason::preempted(&what, false, node.node_rank, host, now_ms());
    crate::console::say!("toporun: {what}: stopping the job as a preemption");
    if let Some(tx) = announce {
        let _ = tx.send(r.clone());
    }
    r
}

/// This node's preemption, as the stop every node acts on.
pub fn reason(signal: Signal, node_rank: u32, host: &str, at_ms: u64) -> StopReason {
    let ctrl_c = signal == Signal::SIGINT;
    StopReason::preempted(signal.as_str(), ctrl_c, node_rank, host, at_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_runs_from_the_first_signal() {
        let mut r = reason(Signal::SIGTERM, 1, "trainer-1", now_ms() - 2_000);
        let s = spent(&r);
        assert!(
            s >= Duration::from_millis(1_990) && s < Duration::from_secs(5),
            "{s:?}"
        );
        r.kind = StopKind::Fail;
        assert_eq!(spent(&r), Duration::ZERO);
    }

    #[test]
    fn the_message_says_who_was_told_and_how_the_ranks_ended() {
        let r = reason(Signal::SIGTERM, 1, "trainer-1", now_ms());
        let e = Ending::default();
        e.exited(0);
        e.exited(0);
        let m = e.message(&r);
        assert!(
            m.starts_with("preempted: SIGTERM on node 1 (trainer-1) at "),
            "{m}"
        );
        assert!(m.ends_with("2 of 2 ranks exited 0"), "{m}");
        let ctrl_c = reason(Signal::SIGINT, 0, "laptop", 1_795_530_310_400);
        let m = Ending::default().message(&ctrl_c);
        assert!(
            m.starts_with("interrupted: SIGINT on node 0 (laptop) at 2026-11-24T"),
            "{m}"
        );
        assert!(m.contains(":10.400Z;"), "a readable UTC time: {m}");
        // A time past the year 9999 (any node may write the store's stop key) is
        // left out, never a panic.
        for ms in [253_402_300_800_000, u64::MAX] {
            let far = reason(Signal::SIGTERM, 1, "trainer-1", ms);
            let m = Ending::default().message(&far);
            assert!(
                m.starts_with("preempted: SIGTERM on node 1 (trainer-1); every"),
                "{m}"
            );
        }
    }

    #[test]
    fn the_stop_file_is_made_and_cleared() {
        let d = tempfile::tempdir().unwrap();
        let f = StopFile(d.path().join("stop"));
        f.make();
        assert!(f.0.exists());
        f.clear();
        assert!(!f.0.exists());
    }
}
