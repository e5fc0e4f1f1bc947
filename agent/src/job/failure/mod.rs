//! A local rank failed: why (the causes, the leading one first), whether it is a
//! failure at all (a peer lost mid-collective holds the verdict for the keep-alives),
//! every node told, and torchrun's summary written with toporun's causes first; and,
//! before a restart, the last attempt's GPU memory released.

pub(super) mod causes;
pub(super) mod gpu_release;
pub(crate) mod recorder;

use crate::job::failure::gpu_release::{wait_released, Holder, RELEASE_WAIT};
use crate::job::failure::recorder::say_flight_recorder;
use crate::job::nccl_report::Reporter;
use crate::job::session::Session;
use crate::job::spec::{Job, NodePlace, ReportSettings};
use crate::job::transitions::{self, AttemptEnd, Restarts};
use crate::paths::Root;
use crate::probe::gpu_events::XidLog;
use crate::probe::NvmlProbe;
use crate::rendezvous::{StopKind, StopReason};
use crate::status::JobStatus;
use crate::supervise::{self, failure_summary};
use causes::MemoryAtStart;
use std::path::Path;
use std::time::Duration;
use toporun_shared::root_cause::exit_codes::class_of;
use toporun_shared::root_cause::judge::Left;
use toporun_shared::root_cause::{Cause, CauseKind};

/// Before a restart: waits until the last attempt's processes released their GPU
/// memory; the cause that ends the job when they do not.
pub async fn gpus_released(root: &Root, probe: Option<&NvmlProbe>) -> Option<Cause> {
    let probe = probe?;
    match wait_released(probe, root, std::process::id(), RELEASE_WAIT).await {
        Ok(waited) if waited > Duration::from_secs(1) => {
            crate::console::say!(
                "toporun: the GPU memory was released after {:.1}s",
                waited.as_secs_f64()
            );
            None
        }
        Ok(_) => None,
        Err(held) => {
            let who: Vec<String> = held.iter().map(Holder::line).collect();
            Some(Cause::new(CauseKind::Hardware, None, format!("GPU memory still held {}s after the attempt ended: {}; a process that left its rank's process group, or a GPU or driver that does not release memory: a restart would fail with CUDA out of memory", RELEASE_WAIT.as_secs(), who.join("; "))).fix("stop that process; if it cannot be stopped (state D), drain the node and reset the GPU"))
        }
    }
}

/// The ranks that failed, and what toporun knows of their end.
pub struct Failed<'a> {
    pub failures: &'a [supervise::Failure],
    /// The ranks that exited 0 while others ran.
    pub left: &'a [Left],
    /// Where each rank (by pid) was last sampled, and when.
    pub last_seen: &'a std::collections::HashMap<i32, (String, std::time::SystemTime)>,
    /// The files each rank (by pid) was last seen writing.
    pub writing: &'a std::collections::HashMap<i32, Vec<String>>,
    /// The TCP ports each rank (by rank) held.
    pub ports: &'a std::collections::HashMap<u32, Vec<u16>>,
    pub fr_dir: Option<&'a Path>,
    pub attempt_dir: &'a Path,
    pub memory: MemoryAtStart,
    pub xids: Option<&'a XidLog>,
    pub gpus: Option<&'a NvmlProbe>,
}

/// torchrun's failure summary with toporun's causes first, written when the job
/// ends on this rank failure (the state machine says whether it does).
#[derive(Debug, Clone)]
pub struct FailureReport {
    /// The rank that failed first.
    first: supervise::Failure,
    failures: Vec<supervise::Failure>,
    /// toporun's cause lines, the leading one first.
    lead: Vec<String>,
}

/// The finding of a hang report's text: its last `toporun: hang:` line that is
/// neither the report's first line nor the worker processes' header.
fn hang_headline(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("toporun: hang: "))
        .find(|l| !l.ends_with("the odd ones first:") && !l.starts_with("where the ranks' worker"))
        .map(str::to_string)
}

/// A local rank failed: every node is told; the end of the attempt, and the failure
/// report to write if the job ends with it.
pub async fn rank_failed(
    p: &Job,
    session: &mut impl Session,
    node: &NodePlace,
    restarts: Restarts,
    reporter: Option<&Reporter>,
    failed: Failed<'_>,
    status: &JobStatus,
) -> (AttemptEnd, Option<FailureReport>) {
    for cause in reporter.map(|r| r.failures()).unwrap_or_default() {
        let fix = cause.remedy.as_deref().unwrap_or("");
        crate::console::say!(
            "toporun: NCCL failed on this node: {}. Fix: {fix}",
            cause.summary
        );
    }
    let failures = failed.failures;
    // A rank of this node that left explains a lost peer here: nothing to hold for.
    let left_here = !failed.left.is_empty();
    if let Some((reason, waited)) = peer_verdict(session, node, failures, left_here).await {
        let after =
            format!(" ({waited:.1}s after the rank failed); the rank's failure is its consequence");
        let place = (failed.fr_dir, failed.attempt_dir);
        heard_stop(session, node, &reason, &after, place, status).await;
        return (AttemptEnd::Stopped(reason), None);
    }
    let xids = failed.xids.map(XidLog::events).unwrap_or_default();
    let gpus = failed.gpus.map(|g| g as &dyn crate::probe::GpuProbe);
    let hang = status.snapshot().last_hang.and_then(|t| hang_headline(&t));
    let evidence = causes::Evidence {
        left: failed.left,
        last_seen: failed.last_seen,
        writing: failed.writing,
        ports: failed.ports,
        hang: hang.as_deref(),
    };
    let found = causes::of(p, failures, evidence, &failed.memory, &xids, gpus);
    // The rank that failed first, not one toporun stopped after it. The supervisor
    // reports a failure with its ranks: none is a bug of toporun's, said, not a panic.
    let Some(f) = supervise::first_failure(failures) else {
        let why =
            "a rank failure was reported without the rank (a bug in toporun: please report it)";
        return (AttemptEnd::Stopped(StopReason::fail(why)), None);
    };
    let what = f
        .signal
        .clone()
        .unwrap_or_else(|| format!("exit code {}", f.exitcode));
    let mut what = format!(
        "node {} local rank {} (rank {}) failed with {what}",
        node.node_rank, f.local_rank, f.rank
    );
    // The other nodes see why, not only that: the leading cause goes with the stop.
    if let Some(c) = found.first() {
        what = format!("{what}: {}", c.summary);
    }
    let ours = transitions::failure_stop(restarts, &what, found.first().map(|c| c.kind));
    // Another node may have stopped the round first (a lost node): its reason decides.
    let won = session.stop_all(node.round, ours.clone()).await;
    // Read once every node was told: the others' dumps join this node's.
    let meeting = session.meeting(node.round, node);
    let collective = say_flight_recorder(failed.fr_dir, meeting, failed.attempt_dir, status).await;
    let mut lead: Vec<String> = found.iter().map(Cause::line).collect();
    lead.extend(collective.map(|c| format!("toporun: flight recorder: {c}")));
    if p.report.classified {
        // The class the exit code takes: the cause of the stop this node acts on.
        let acted = transitions::acted_on(&ours, &won);
        let class = class_of(acted.cause.unwrap_or(CauseKind::Code));
        lead.push(format!(
            "toporun: exit code {} under --exit-codes classified: {} (podFailurePolicy: {:?})",
            class.code, class.what, class.action
        ));
    }
    status.update(|x| {
        x.last_failure = Some(ours.to_string());
        x.root_cause = found.first().map(|c| c.kind);
        x.causes = found.clone();
    });
    let report = FailureReport {
        first: f.clone(),
        failures: failures.to_vec(),
        lead,
    };
    (AttemptEnd::RankFailed { ours, won }, Some(report))
}

/// A rank that failed as a peer went away (its own output says so) may be no
/// failure at all: the verdict waits for the keep-alives. A node confirmed lost is a
/// membership change (not counted: the next round runs with the survivors), or ends
/// the job as a lost peer when too few remain; a stop the peer's node sent for its
/// own failure is that node's verdict. The stop that decided, and how long it took.
async fn peer_verdict(
    session: &impl Session,
    node: &NodePlace,
    failures: &[supervise::Failure],
    left_here: bool,
) -> Option<(StopReason, f64)> {
    // Only where losing a peer came first: a rank of this node that failed on its own
    // before (its peers then lose it) is this node's failure, not to be held.
    let (line, addr) = supervise::first_failure(failures)?.peer_lost.clone()?;
    if !session.has_peers() || left_here {
        return None;
    }
    let at = match addr {
        Some(a) => match session.nodes_at(node.round, &a).await.as_slice() {
            [] => format!(" at {a}"),
            [one] => format!(" at {a}: {one}"),
            many => format!(" at {a}: one of {}", many.join(", ")),
        },
        None => String::new(),
    };
    crate::console::say!("toporun: a rank lost a peer{at}: {line}; holding the verdict until the keep-alives say whether a node was lost");
    let start = std::time::Instant::now();
    let reason = session.hold_for_peer(node).await;
    let waited = start.elapsed().as_secs_f64();
    if reason.is_none() {
        crate::console::say!(
            "toporun: no node was declared lost within {waited:.1}s: the rank's failure counts"
        );
    }
    Some((reason?, waited))
}

/// A stop another node asked for, or the keep-alives decided, heard by this node:
/// its cause is this node's too (said, with `after`), this node's flight-recorder
/// dumps join the job's (a failure or hang elsewhere), and the store's host, which
/// waits for that word before it leaves, hears that this node saw it.
pub async fn heard_stop(
    session: &mut impl Session,
    node: &NodePlace,
    reason: &StopReason,
    after: &str,
    (fr_dir, attempt_dir): (Option<&Path>, &Path),
    status: &JobStatus,
) {
    match reason.cause {
        Some(kind) => {
            crate::console::say!("toporun: root cause ({kind}): {}{after}", reason.detail);
            status.update(|x| x.root_cause = Some(kind));
        }
        None if !after.is_empty() => {
            crate::console::say!("toporun: stopped by another node: {}{after}", reason.detail);
        }
        None => {}
    }
    if reason.kind != StopKind::Membership {
        let meeting = session.meeting(node.round, node);
        say_flight_recorder(fr_dir, meeting, attempt_dir, status).await;
    }
    session.stop_seen(node.round).await;
}

impl FailureReport {
    /// torchrun's failure summary, on stderr, in the termination message and in
    /// TORCHELASTIC_ERROR_FILE; on stderr and in the termination message toporun's
    /// causes come first, the leading one at the top.
    /// `hostname`: this node's; `entrypoint`: the ranks' program.
    pub fn write(&self, entrypoint: &str, hostname: &str, to: &ReportSettings) {
        // torch prints socket.getfqdn() there.
        let host = crate::probe::fqdn::fqdn(hostname);
        let summary = failure_summary(entrypoint, &host, &self.failures);
        let mut message: String = self.lead.iter().map(|l| format!("{l}\n")).collect();
        message.push_str(&summary);
        crate::console::say_raw!("{message}");
        supervise::leave_termination_message(to.termination_log.as_deref(), &message);
        if let Some(dest) = &to.error_file {
            if let Err(e) = supervise::dump_error_file(dest, &self.first, &summary) {
                let dest = dest.display();
                crate::console::say!("toporun: cannot write TORCHELASTIC_ERROR_FILE {dest}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::hang_headline;

    #[test]
    fn the_headline_is_read_back_from_a_watchdog_report_with_workers() {
        let text = "toporun: hang: NCCL's watchdog stopped rank 0 in all_reduce #13 after its 25s timeout; where each stands, the odd ones first:\n  rank 1: read_next_shard (x.py:47)\n  rank 0: main (x.py:102)\ntoporun: hang: rank 1 is in no collective: ...\ntoporun: hang: where the ranks' worker processes stand (DataLoader workers):\n  rank 1 worker pid 9: f (x.py:1)\n";
        assert_eq!(
            hang_headline(text).as_deref(),
            Some("rank 1 is in no collective: ...")
        );
        assert_eq!(hang_headline("toporun: hang: no rank has made progress for 15s (--hang-timeout 15s); where each stands, the odd ones first:\n"), None);
    }
}
