//! Where a rank stands in a hang: waiting for its peers (inside a collective, or on its
//! GPU, where NCCL's kernels wait: `loss.item()`, `synchronize()`, `.cpu()`), or
//! elsewhere (its own code, I/O, a lock, a sleep, data loading). Under NCCL a
//! collective returns to Python once queued, so a rank whose peer never joins waits at
//! its next synchronisation with the GPU, on a line of its own code: only that line's
//! text tells it from a rank stuck in its own code.

use super::activity::{classify, in_torch, Activity, Backward};
use super::model::ThreadStack;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Standing {
    /// Inside torch.distributed (or DDP's communication): `op` is its function.
    Collective { op: String },
    /// Synchronising with its GPU, where NCCL's kernels wait for the peers: `call` is
    /// what waits (`.item()`, `torch.cuda.synchronize`).
    GpuWait { call: String },
    /// Tearing its process group down (`destroy_process_group`): its training is over,
    /// and under NCCL the call itself can wait for peers still in a collective.
    Leaving { call: String },
    /// Anywhere else: its own code, data, a checkpoint, I/O or a lock.
    Elsewhere { activity: Activity },
}

impl Standing {
    /// Waiting for its peers, directly or through its GPU.
    pub fn waits(&self) -> bool {
        matches!(self, Standing::Collective { .. } | Standing::GpuWait { .. })
    }

    /// `waits in all_reduce`, `waits on its GPU at .item()`, `stands in its own code`.
    pub fn verb(&self) -> String {
        match self {
            Standing::Collective { op } => format!("waits in {op}"),
            Standing::GpuWait { call } => format!("waits on its GPU at {call}"),
            Standing::Leaving { call } => format!("tears its process group down in {call}"),
            Standing::Elsewhere { activity } => match activity {
                Activity::Blocked => "is blocked outside PyTorch (I/O, a lock or a sleep)".into(),
                Activity::Data => "is loading data".into(),
                Activity::Checkpoint => "is checkpointing".into(),
                Activity::Backward => "is in PyTorch's backward".into(),
                Activity::GpuWait => "waits on its GPU".into(),
                Activity::Compute | Activity::Collective => "runs its own code".into(),
                Activity::Unseen => "stands where its stack cannot be read".into(),
            },
        }
    }
}

/// Calls that wait for the GPU's queued work (and so for NCCL's kernels), as they
/// appear in a line of the rank's code.
const GPU_WAITS: &[&str] = &[
    ".item()",
    ".cpu()",
    ".tolist()",
    ".numpy()",
    "synchronize(",
    ".wait(",
    ".to(\"cpu\"",
    ".to('cpu'",
];

/// torch's own Python frames that wait for the GPU.
const GPU_WAIT_FRAMES: &[(&str, &str)] = &[
    ("torch/cuda/", "synchronize"),
    ("torch/cuda/streams.py", "synchronize"),
    ("torch/cuda/streams.py", "wait"),
];

/// Where the thread stands; `line`: the text of its innermost frame's line, where it
/// could be read (the rank's own source).
/// torch.distributed's calls that end a rank's part in the job.
const LEAVING_CALLS: &[&str] = &["destroy_process_group", "_shutdown_backend"];

pub fn standing(t: &ThreadStack, line: Option<&str>) -> Standing {
    standing_with(t, line, Backward::OnDevice)
}

/// `standing`, with the backward run where `backward` says: on the rank's own thread
/// (no GPU), idling in it is DDP waiting for its peers' gradients.
pub fn standing_with(t: &ThreadStack, line: Option<&str>, backward: Backward) -> Standing {
    if let Some(f) = t
        .frames
        .iter()
        .find(|f| in_torch(f) && LEAVING_CALLS.contains(&f.function.as_str()))
    {
        return Standing::Leaving {
            call: f.function.clone(),
        };
    }
    let activity = classify(t, backward);
    if activity == Activity::Collective {
        let op = t
            .frames
            .iter()
            .find(|f| in_torch(f))
            .map_or_else(|| "a collective".to_string(), |f| f.function.clone());
        return Standing::Collective { op };
    }
    if let Some(f) = t.frames.first() {
        if let Some((_, func)) = GPU_WAIT_FRAMES
            .iter()
            .find(|(file, func)| f.file.contains(file) && f.function == *func)
        {
            return Standing::GpuWait {
                call: format!("torch.cuda {func}()"),
            };
        }
        // A tensor's .item() is C++: Python's innermost frame is the caller's line.
        if !in_torch(f) && matches!(activity, Activity::Compute | Activity::Blocked) {
            let code = line.map(str::trim).unwrap_or_default();
            if let Some(call) = GPU_WAITS.iter().find(|c| code.contains(*c)) {
                let call = call.trim_end_matches('(').trim_start_matches('.');
                let call = if call.ends_with(')') {
                    format!(".{call}")
                } else {
                    format!("{call}()")
                };
                return Standing::GpuWait { call };
            }
        }
    }
    Standing::Elsewhere { activity }
}

#[cfg(test)]
mod tests {
    use super::super::model::build::main_thread as thread;
    use super::*;

    const SITE: &str = "/opt/torch/.venv/lib/python3.12/site-packages/";

    #[test]
    fn a_rank_at_loss_item_waits_on_its_gpu_not_in_its_own_code() {
        // Spinning in cudaStreamSynchronize: on a CPU, in the user's own frame.
        let t = thread(
            false,
            &[
                ("main", "/app/train.py", 80),
                ("<module>", "/app/train.py", 84),
            ],
        );
        assert_eq!(
            standing(&t, Some("        loss.item()\n")),
            Standing::GpuWait {
                call: ".item()".into()
            }
        );
        assert!(standing(&t, Some("        loss.item()")).waits());
        // The same frame without its text (unreadable source) is its own code.
        assert_eq!(
            standing(&t, None),
            Standing::Elsewhere {
                activity: Activity::Compute
            }
        );
    }

    #[test]
    fn a_rank_in_a_read_is_elsewhere() {
        let t = thread(
            true,
            &[
                ("read_next_shard", "/app/train.py", 44),
                ("main", "/app/train.py", 70),
            ],
        );
        let s = standing(&t, Some("    return os.read(r, 1)"));
        assert_eq!(
            s,
            Standing::Elsewhere {
                activity: Activity::Blocked
            }
        );
        assert!(!s.waits());
        assert_eq!(
            s.verb(),
            "is blocked outside PyTorch (I/O, a lock or a sleep)"
        );
    }

    /// Rank 1 of the 2x H100 leaver case: its loop ended (early stopping) and
    /// destroy_process_group waits under NCCL (tests/fixtures/device/nccl-failures-h100x2/leaver).
    #[test]
    fn a_rank_in_destroy_process_group_is_leaving() {
        let c10d = format!("{SITE}torch/distributed/distributed_c10d.py");
        let t = thread(
            true,
            &[
                ("destroy_process_group", &c10d, 2319),
                ("<module>", "/app/train.py", 109),
            ],
        );
        let s = standing(&t, Some("    dist.destroy_process_group()"));
        assert_eq!(
            s,
            Standing::Leaving {
                call: "destroy_process_group".into()
            }
        );
        assert!(!s.waits());
    }

    #[test]
    fn collectives_and_torch_synchronize() {
        let c10d = format!("{SITE}torch/distributed/distributed_c10d.py");
        let t = thread(
            true,
            &[("barrier", &c10d, 4000), ("main", "/app/train.py", 9)],
        );
        assert_eq!(
            standing(&t, None),
            Standing::Collective {
                op: "barrier".into()
            }
        );
        let cuda = format!("{SITE}torch/cuda/__init__.py");
        let t = thread(
            false,
            &[("synchronize", &cuda, 1000), ("main", "/app/train.py", 9)],
        );
        assert_eq!(
            standing(&t, None),
            Standing::GpuWait {
                call: "torch.cuda synchronize()".into()
            }
        );
    }
}
