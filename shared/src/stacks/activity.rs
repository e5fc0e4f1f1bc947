//! What a rank was doing at one stack sample, from its main thread's frames: in a
//! collective (waiting for its peers, in synchronous training), loading data, saving
//! a checkpoint, computing, or blocked elsewhere. The share of samples in a
//! collective is what finds a straggler: the rank the others wait for waits least.

use super::model::{Frame, ThreadStack};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activity {
    /// In c10d or a data-parallel wrapper's communication: waiting on the others.
    Collective,
    /// In the DataLoader (the rank's own `__getitem__`, or waiting for a worker).
    Data,
    /// In torch.distributed.checkpoint or torch.save.
    Checkpoint,
    /// On a CPU, anywhere else: the model's forward/backward, the optimizer, the
    /// user's own code (with CUDA, also launching kernels and syncing on them).
    Compute,
    /// Off the CPU outside all of the above: a sleep, a lock, I/O, or a C++ wait
    /// Python cannot see (`work.wait()` of an async collective).
    Blocked,
}

impl Activity {
    /// One word, for a table.
    pub fn short(self) -> &'static str {
        match self {
            Activity::Collective => "collective",
            Activity::Data => "data",
            Activity::Checkpoint => "checkpoint",
            Activity::Compute => "compute",
            Activity::Blocked => "blocked",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Activity::Collective => "collectives",
            Activity::Data => "data loading",
            Activity::Checkpoint => "checkpointing",
            Activity::Compute => "compute",
            Activity::Blocked => "blocked outside PyTorch (sleep, lock or I/O)",
        }
    }
}

/// Communication entry points of torch.distributed, DDP and FSDP (function names,
/// matched in files under `torch/distributed/` or `torch/nn/parallel/`).
const COLLECTIVE_FILES: &[&str] = &["torch/distributed/", "torch/nn/parallel/"];
const DATA_FILES: &[&str] = &["torch/utils/data/"];
const CHECKPOINT_FILES: &[&str] = &["torch/distributed/checkpoint/", "torch/serialization.py"];

fn in_any(f: &Frame, files: &[&str]) -> bool {
    files.iter().any(|d| f.file.contains(d))
}

/// What the thread was doing: the first class any of its frames belongs to, data
/// and checkpoints before collectives (a checkpoint's own collectives are its cost).
pub fn classify(t: &ThreadStack) -> Activity {
    let any = |files: &[&str]| t.frames.iter().any(|f| in_any(f, files));
    if any(DATA_FILES) {
        Activity::Data
    } else if any(CHECKPOINT_FILES) {
        Activity::Checkpoint
    } else if any(COLLECTIVE_FILES) {
        Activity::Collective
    } else if t.idle {
        Activity::Blocked
    } else {
        Activity::Compute
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(idle: bool, frames: &[(&str, &str)]) -> ThreadStack {
        ThreadStack {
            thread: Some("MainThread".into()),
            frames: frames
                .iter()
                .map(|(function, file)| Frame {
                    function: (*function).into(),
                    file: (*file).into(),
                    line: 1,
                })
                .collect(),
            idle,
        }
    }

    const SITE: &str = "/venv/lib/python3.11/site-packages/";

    #[test]
    fn a_rank_in_all_reduce_is_in_a_collective() {
        let c10d = format!("{SITE}torch/distributed/distributed_c10d.py");
        let logger = format!("{SITE}torch/distributed/c10d_logger.py");
        let t = thread(
            true,
            &[
                ("all_reduce", &c10d),
                ("wrapper", &logger),
                ("step", "/app/train.py"),
            ],
        );
        assert_eq!(classify(&t), Activity::Collective);
        let ddp = format!("{SITE}torch/nn/parallel/distributed.py");
        let sync = thread(false, &[("_sync_buffers", &ddp), ("step", "/app/train.py")]);
        assert_eq!(classify(&sync), Activity::Collective);
    }

    #[test]
    fn data_and_checkpoints_come_before_their_own_collectives() {
        let loader = format!("{SITE}torch/utils/data/dataloader.py");
        let get = thread(
            false,
            &[
                ("__getitem__", "/app/data.py"),
                ("_next_data", &loader),
                ("__next__", &loader),
            ],
        );
        assert_eq!(classify(&get), Activity::Data);
        let dcp = format!("{SITE}torch/distributed/checkpoint/state_dict_saver.py");
        let c10d = format!("{SITE}torch/distributed/distributed_c10d.py");
        let save = thread(true, &[("all_gather_object", &c10d), ("save", &dcp)]);
        assert_eq!(classify(&save), Activity::Checkpoint);
        let torch_save = format!("{SITE}torch/serialization.py");
        assert_eq!(
            classify(&thread(false, &[("save", &torch_save)])),
            Activity::Checkpoint
        );
    }

    #[test]
    fn elsewhere_it_computes_when_on_a_cpu_and_is_blocked_when_not() {
        let nn = format!("{SITE}torch/nn/modules/module.py");
        let fwd = thread(false, &[("forward", "/app/model.py"), ("_call_impl", &nn)]);
        assert_eq!(classify(&fwd), Activity::Compute);
        assert_eq!(
            classify(&thread(false, &[("compute", "/app/train.py")])),
            Activity::Compute
        );
        assert_eq!(
            classify(&thread(true, &[("log", "/app/train.py")])),
            Activity::Blocked
        );
    }
}
