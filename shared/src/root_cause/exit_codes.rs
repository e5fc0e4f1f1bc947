//! Every exit code toporun gives, in one place: success, a failure, a usage error, a
//! rank's signal, and under `--exit-codes classified` one per class of cause, each
//! with the podFailurePolicy action it deserves (`torchrun`, the default, keeps
//! torchrun's codes). The README, the docs' tables and the manifests' podFailurePolicy
//! are checked against it (launcher/tests/e2e/docs_e2e.rs).

use super::cause::CauseKind;
use serde::Serialize;

/// What a Kubernetes Job's podFailurePolicy should do with a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PodAction {
    /// Retrying will not help: end the Job.
    FailJob,
    /// Retry, counted against backoffLimit.
    Count,
    /// Retry without counting (not this pod's fault).
    Ignore,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExitClass {
    pub code: u8,
    pub what: &'static str,
    pub action: PodAction,
    pub why: &'static str,
}

/// The training code failed (or a cause toporun cannot name).
pub const CODE: ExitClass = ExitClass {
    code: 1,
    what: "the training code failed",
    action: PodAction::Count,
    why: "an exception or an exit code of the ranks: retried within backoffLimit, a bug fails every time",
};
/// The host failed the gate (`--preflight gate`).
pub const GATE: ExitClass = ExitClass {
    code: 3,
    what: "the preflight gate refused the host",
    action: PodAction::FailJob,
    why: "the pod's spec or the node cannot run the job: fix the spec first",
};
/// A GPU or the node is faulty.
pub const HARDWARE: ExitClass = ExitClass {
    code: 80,
    what: "a GPU or the node is faulty",
    action: PodAction::Ignore,
    why: "not the job's fault: run it elsewhere, and drain the node",
};
/// The kernel OOM killer, or /dev/shm full.
pub const MEMORY: ExitClass = ExitClass {
    code: 81,
    what: "killed for memory (OOM killer, or /dev/shm full)",
    action: PodAction::FailJob,
    why: "the same limits fail again: raise the memory limit or /dev/shm first",
};
/// A peer node, or the network to it, was lost.
pub const PEER: ExitClass = ExitClass {
    code: 82,
    what: "a peer node or the network to it was lost",
    action: PodAction::Ignore,
    why: "this pod is not at fault: run it again",
};
/// A volume the job writes is full, over quota or read-only.
pub const DISK: ExitClass = ExitClass {
    code: 83,
    what: "a volume the job writes is full, over quota or read-only",
    action: PodAction::FailJob,
    why: "the same volume fails the next write again: free or grow it first",
};
/// CUDA out of memory.
pub const GPU_MEMORY: ExitClass = ExitClass {
    code: 84,
    what: "CUDA ran out of GPU memory",
    action: PodAction::FailJob,
    why: "the same batch on the same GPUs runs out again: a smaller micro-batch, activation checkpointing, or expandable segments first",
};
/// A node was told to go and every node stopped its ranks.
pub const PREEMPTED: ExitClass = ExitClass {
    code: 85,
    what: "preempted: a node was told to go (a handled signal) and every rank was stopped",
    action: PodAction::Ignore,
    why: "a drain or a spot reclaim, not the job's fault: run it again, from the checkpoint the ranks saved",
};
/// `--on-hang stop` (the same in both modes).
pub const HANG: ExitClass = ExitClass {
    code: 124,
    what: "the ranks hung: no progress for --hang-timeout (--on-hang stop), or NCCL's watchdog stopped a rank that waited for a peer",
    action: PodAction::Count,
    why:
        "a hang may be transient (a lost packet, a slow storage call): retried within backoffLimit",
};

pub const TABLE: [ExitClass; 9] = [
    CODE, GATE, HARDWARE, MEMORY, PEER, DISK, GPU_MEMORY, PREEMPTED, HANG,
];

/// Everything went well.
pub const SUCCESS: u8 = 0;
/// torchrun's code for any failure; `--exit-codes classified` reclassifies it.
pub const FAILURE: u8 = CODE.code;
/// A usage error: an option or input toporun refuses (argparse's 2).
pub const USAGE: u8 = 2;

/// A process ended by signal `sig`, as a shell and torchrun say it (128 + N).
pub fn signalled(sig: i32) -> u8 {
    u8::try_from((128 + sig).clamp(0, 255)).unwrap_or(255)
}

/// Codes outside TABLE that a podFailurePolicy names: a usage error, and toporun
/// itself killed (SIGKILL: the kubelet past the grace period, the OOM killer).
pub const POLICY_EXTRA: [ExitClass; 2] = [
    ExitClass {
        code: USAGE,
        what: "toporun refused its options or input",
        action: PodAction::FailJob,
        why: "the same spec is refused again: fix it first",
    },
    ExitClass {
        code: 137,
        what: "toporun itself was killed (SIGKILL)",
        action: PodAction::Count,
        why: "past the grace period, or the OOM killer on toporun: retried within backoffLimit",
    },
];

/// The class of a failure whose leading cause is `kind`.
pub fn class_of(kind: CauseKind) -> ExitClass {
    match kind {
        CauseKind::Hardware => HARDWARE,
        CauseKind::Oom | CauseKind::Shm => MEMORY,
        CauseKind::Peer => PEER,
        CauseKind::Disk => DISK,
        CauseKind::GpuMemory => GPU_MEMORY,
        CauseKind::Preempted => PREEMPTED,
        CauseKind::Hang => HANG,
        CauseKind::Code | CauseKind::External => CODE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_distinct_and_clear_of_torchrun_and_the_shell() {
        let codes: Vec<u8> = TABLE.iter().map(|c| c.code).collect();
        let mut unique = codes.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), codes.len());
        // 2: usage, 126/127: exec, 128+N: signals.
        assert!(codes
            .iter()
            .all(|c| ![2, 126, 127].contains(c) && (*c < 128)));
        assert_eq!(class_of(CauseKind::Shm).code, 81);
        assert!(POLICY_EXTRA.iter().all(|x| !codes.contains(&x.code)));
        assert_eq!(POLICY_EXTRA[1].code, signalled(9));
        assert_eq!(signalled(300), 255);
    }
}
