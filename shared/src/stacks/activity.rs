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
    /// Under NCCL, at a line that waits for the GPU's queued work (`.item()`,
    /// `synchronize()`): the GPU is computing, or waiting in a collective for its
    /// peers. Counted as waiting, as a collective is (the tracker decides it from the
    /// sampled line; `classify` never returns it).
    GpuWait,
    /// In PyTorch's backward where its kernels run on the device's own thread (CUDA):
    /// the caller waits there while the GPU works through the backward.
    Backward,
    /// On a CPU, anywhere else: the model's forward/backward, the optimizer, the
    /// user's own code (with CUDA, also launching kernels and syncing on them).
    Compute,
    /// Off the CPU outside all of the above: a sleep, a lock, I/O, or a C++ wait
    /// Python cannot see (`work.wait()` of an async collective).
    Blocked,
    /// Its stack cannot be read (not Python: a C, C++ or JAX program on NCCL): only
    /// its GPU's time in collectives says where it spends its time.
    Unseen,
}

impl Activity {
    /// One word, for a table.
    pub fn short(self) -> &'static str {
        match self {
            Activity::Collective => "collective",
            Activity::Data => "data",
            Activity::Checkpoint => "checkpoint",
            Activity::GpuWait => "gpu-wait",
            Activity::Backward => "backward",
            Activity::Compute => "compute",
            Activity::Blocked => "blocked",
            Activity::Unseen => "unseen",
        }
    }

    /// The rank waits for others here: in a collective, or (NCCL) at a GPU sync.
    pub fn waits(self) -> bool {
        matches!(self, Activity::Collective | Activity::GpuWait)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Activity::Collective => "collectives",
            Activity::Data => "data loading",
            Activity::Checkpoint => "checkpointing",
            Activity::GpuWait => "a wait for its GPU's queued work (.item(), synchronize)",
            Activity::Backward => "PyTorch's backward (autograd, its GPU kernels queued)",
            Activity::Compute => "its own code (compute on the CPU)",
            Activity::Blocked => "blocked outside PyTorch (sleep, lock or I/O)",
            Activity::Unseen => "code whose stack cannot be read (not Python)",
        }
    }
}

/// Where torch.distributed, DDP and FSDP communicate: a sample is in a collective when
/// its innermost PyTorch frame is in one of these (DDP's `forward` is there too, but
/// the model's own frames lie inside it).
const COLLECTIVE_FILES: &[&str] = &["torch/distributed/", "torch/nn/parallel/"];
const DATA_FILES: &[&str] = &["torch/utils/data/"];
const CHECKPOINT_FILES: &[&str] = &["torch/distributed/checkpoint/", "torch/serialization.py"];

fn in_any(f: &Frame, files: &[&str]) -> bool {
    files.iter().any(|d| f.file.contains(d))
}

/// A frame of PyTorch's own Python (`.../torch/...`).
pub(super) fn in_torch(f: &Frame) -> bool {
    f.file.starts_with("torch/") || f.file.contains("/torch/")
}

/// Where a rank's autograd backward runs: on the calling thread for CPU tensors, so a
/// caller idle inside `backward()` waits on DDP's gradient all-reduce (its reducer
/// waits in C++, under no torch.distributed frame); on the device's own thread with
/// CUDA, where the caller idles through every backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backward {
    OnCaller,
    #[default]
    OnDevice,
}

const AUTOGRAD_FILES: &[&str] = &["torch/autograd/"];

/// The innermost PyTorch frame is communication (frames go innermost first).
fn communicating(t: &ThreadStack, backward: Backward) -> bool {
    let Some(f) = t.frames.iter().find(|f| in_torch(f)) else {
        return false;
    };
    in_any(f, COLLECTIVE_FILES)
        || (backward == Backward::OnCaller && t.idle && in_any(f, AUTOGRAD_FILES))
}

/// What the thread was doing: data and checkpoints when any frame is theirs (a
/// checkpoint's own collectives are its cost), a collective when the innermost
/// PyTorch frame communicates (not a model's forward under DDP's `forward`), or
/// when the rank idles in a backward it runs itself (DDP's reducer waiting); in a
/// backward the device runs, the backward (its caller idles while the GPU works).
pub fn classify(t: &ThreadStack, backward: Backward) -> Activity {
    let any = |files: &[&str]| t.frames.iter().any(|f| in_any(f, files));
    if any(DATA_FILES) {
        Activity::Data
    } else if any(CHECKPOINT_FILES) {
        Activity::Checkpoint
    } else if communicating(t, backward) {
        Activity::Collective
    } else if backward == Backward::OnDevice && any(AUTOGRAD_FILES) {
        Activity::Backward
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
        assert_eq!(classify(&t, Backward::OnDevice), Activity::Collective);
        let ddp = format!("{SITE}torch/nn/parallel/distributed.py");
        let sync = thread(false, &[("_sync_buffers", &ddp), ("step", "/app/train.py")]);
        assert_eq!(classify(&sync, Backward::OnDevice), Activity::Collective);
    }

    #[test]
    fn a_models_forward_under_ddp_is_compute_and_its_buffer_sync_a_collective() {
        let ddp = format!("{SITE}torch/nn/parallel/distributed.py");
        let linear = format!("{SITE}torch/nn/modules/linear.py");
        let module = format!("{SITE}torch/nn/modules/module.py");
        let forward = thread(
            false,
            &[
                ("forward", &linear),
                ("_call_impl", &module),
                ("forward", "/app/model.py"),
                ("_run_ddp_forward", &ddp),
                ("forward", &ddp),
                ("step", "/app/train.py"),
            ],
        );
        assert_eq!(classify(&forward, Backward::OnDevice), Activity::Compute);
        // nn.Sequential straight under DDP: no user frame between them.
        let sequential = thread(
            false,
            &[
                ("forward", &linear),
                ("_call_impl", &module),
                ("forward", &ddp),
            ],
        );
        assert_eq!(classify(&sequential, Backward::OnDevice), Activity::Compute);
        let c10d = format!("{SITE}torch/distributed/distributed_c10d.py");
        let sync = thread(
            true,
            &[
                ("broadcast", &c10d),
                ("_sync_buffers", &ddp),
                ("forward", &ddp),
            ],
        );
        assert_eq!(classify(&sync, Backward::OnDevice), Activity::Collective);
    }

    #[test]
    fn idle_in_a_backward_the_rank_runs_itself_is_ddp_waiting_for_gradients() {
        let graph = format!("{SITE}torch/autograd/graph.py");
        let tensor = format!("{SITE}torch/_tensor.py");
        let frames = [
            ("_engine_run_backward", graph.as_str()),
            ("backward", &tensor),
            ("step", "/app/train.py"),
        ];
        let waiting = thread(true, &frames);
        assert_eq!(classify(&waiting, Backward::OnCaller), Activity::Collective);
        // With CUDA the caller idles through every backward: not a wait on peers, and
        // not "blocked outside PyTorch" either.
        assert_eq!(classify(&waiting, Backward::OnDevice), Activity::Backward);
        // A CPU backward computing on the caller is compute.
        let computing = thread(false, &frames);
        assert_eq!(classify(&computing, Backward::OnCaller), Activity::Compute);
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
        assert_eq!(classify(&get, Backward::OnDevice), Activity::Data);
        let dcp = format!("{SITE}torch/distributed/checkpoint/state_dict_saver.py");
        let c10d = format!("{SITE}torch/distributed/distributed_c10d.py");
        let save = thread(true, &[("all_gather_object", &c10d), ("save", &dcp)]);
        assert_eq!(classify(&save, Backward::OnDevice), Activity::Checkpoint);
        let torch_save = format!("{SITE}torch/serialization.py");
        assert_eq!(
            classify(&thread(false, &[("save", &torch_save)]), Backward::OnDevice),
            Activity::Checkpoint
        );
    }

    #[test]
    fn elsewhere_it_computes_when_on_a_cpu_and_is_blocked_when_not() {
        let nn = format!("{SITE}torch/nn/modules/module.py");
        let fwd = thread(false, &[("forward", "/app/model.py"), ("_call_impl", &nn)]);
        assert_eq!(classify(&fwd, Backward::OnDevice), Activity::Compute);
        assert_eq!(
            classify(
                &thread(false, &[("compute", "/app/train.py")]),
                Backward::OnDevice
            ),
            Activity::Compute
        );
        assert_eq!(
            classify(
                &thread(true, &[("log", "/app/train.py")]),
                Backward::OnDevice
            ),
            Activity::Blocked
        );
    }
}
