//! Why a rank stopped, as one typed cause; when several are known, a fixed
//! precedence picks the one that leads: the hardware, then the OOM killer, then
//! /dev/shm, then a full volume, then GPU memory, then a lost peer, then the training
//! code.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Declared in precedence order: the first leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    /// A GPU or the node failed (a node-fatal Xid).
    Hardware,
    /// The kernel OOM killer killed a process of the job.
    Oom,
    /// /dev/shm ran out.
    Shm,
    /// A volume the job writes is full, over quota or read-only.
    Disk,
    /// CUDA ran out of GPU memory.
    #[serde(rename = "gpu-memory")]
    GpuMemory,
    /// Another node, or the network to it, went away.
    Peer,
    /// The ranks stopped progressing: NCCL's watchdog stopped a rank that waited for
    /// a peer (the messenger), or --on-hang stop.
    Hang,
    /// The training code failed (an exception, an exit code).
    Code,
    /// A signal from outside the job (SIGKILL without an OOM kill).
    External,
    /// A node was told to go (a handled signal: a drain, a spot reclaim): the job
    /// stopped on purpose, every rank at once.
    Preempted,
}

impl CauseKind {
    pub const ALL: [CauseKind; 10] = [
        CauseKind::Hardware,
        CauseKind::Oom,
        CauseKind::Shm,
        CauseKind::Disk,
        CauseKind::GpuMemory,
        CauseKind::Peer,
        CauseKind::Hang,
        CauseKind::Code,
        CauseKind::External,
        CauseKind::Preempted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CauseKind::Hardware => "hardware",
            CauseKind::Oom => "oom",
            CauseKind::Shm => "shm",
            CauseKind::Disk => "disk",
            CauseKind::GpuMemory => "gpu-memory",
            CauseKind::Peer => "peer",
            CauseKind::Hang => "hang",
            CauseKind::Code => "code",
            CauseKind::External => "external",
            CauseKind::Preempted => "preempted",
        }
    }
}

impl fmt::Display for CauseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    pub kind: CauseKind,
    /// The global rank it struck, where it struck one.
    pub rank: Option<u32>,
    /// What happened, with its evidence.
    pub summary: String,
    pub fix: Option<String>,
}

impl Cause {
    pub fn new(kind: CauseKind, rank: Option<u32>, summary: impl Into<String>) -> Cause {
        Cause {
            kind,
            rank,
            summary: summary.into(),
            fix: None,
        }
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Cause {
        self.fix = Some(fix.into());
        self
    }

    /// `toporun: root cause (oom): ... Fix: ...`.
    pub fn line(&self) -> String {
        let fix = self
            .fix
            .as_ref()
            .map(|f| format!(". Fix: {f}"))
            .unwrap_or_default();
        format!("toporun: root cause ({}): {}{fix}", self.kind, self.summary)
    }
}

/// The causes in precedence order (stable among equals): the first leads.
pub fn by_precedence(mut causes: Vec<Cause>) -> Vec<Cause> {
    causes.sort_by_key(|c| c.kind);
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_leads_then_oom_shm_peer_code() {
        let c = |k| Cause::new(k, Some(0), "x");
        let sorted = by_precedence(vec![
            c(CauseKind::Code),
            c(CauseKind::Peer),
            c(CauseKind::Oom),
            c(CauseKind::Hardware),
            c(CauseKind::Shm),
        ]);
        let kinds: Vec<&str> = sorted.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(kinds, ["hardware", "oom", "shm", "peer", "code"]);
        assert_eq!(
            Cause::new(CauseKind::Oom, Some(2), "killed")
                .fix("more memory")
                .line(),
            "toporun: root cause (oom): killed. Fix: more memory"
        );
    }
}
