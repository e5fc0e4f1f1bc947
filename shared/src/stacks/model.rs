//! What a stack capture gives: frames, threads, a rank's stacks.

use serde::{Deserialize, Serialize};

/// One Python frame: where, never what (no locals, arguments or environment).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: i32,
}

impl Frame {
    /// `decode_native_record (train.py:6)`.
    pub fn short(&self) -> String {
        let name = self.file.rsplit('/').next().unwrap_or(&self.file);
        format!("{} ({name}:{})", self.function, self.line)
    }
}

/// One thread's frames, innermost first.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ThreadStack {
    pub thread: Option<String>,
    pub frames: Vec<Frame>,
    /// The thread was not on a CPU when read (blocked in C++: a collective, a lock,
    /// I/O, a sleep).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
}

/// One rank's stacks, or why none could be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankStack {
    pub rank: u32,
    pub local_rank: u32,
    pub pid: i32,
    pub threads: Vec<ThreadStack>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RankStack {
    /// The thread a one-line view shows: the main thread where it is named and has
    /// frames, else the first with frames.
    pub fn main_thread(&self) -> Option<&ThreadStack> {
        let with_frames = |t: &&ThreadStack| !t.frames.is_empty();
        self.threads
            .iter()
            .filter(with_frames)
            .find(|t| t.thread.as_deref() == Some("MainThread"))
            .or_else(|| self.threads.iter().find(with_frames))
    }

    /// The main thread is printing an exception (an excepthook or the traceback
    /// module) or the interpreter is shutting down (atexit, weakref finalizers, its
    /// outermost frame no longer the script's): the rank is already on its way out,
    /// so this sample says nothing of where it stood.
    pub fn unwinding(&self) -> bool {
        let Some(t) = self.main_thread() else {
            return false;
        };
        let printing = t
            .frames
            .first()
            .is_some_and(|f| f.function.contains("excepthook") || f.file.ends_with("traceback.py"));
        let exiting = t.frames.last().is_some_and(|f| {
            f.function.ends_with("_exitfunc") || f.function.ends_with("_run_exitfuncs")
        });
        printing || exiting
    }
}

/// Stacks for the stack modules' tests.
#[cfg(test)]
pub(crate) mod build {
    use super::{Frame, RankStack, ThreadStack};

    /// A main thread of `(function, file, line)` frames, innermost first.
    pub fn main_thread(idle: bool, frames: &[(&str, &str, i32)]) -> ThreadStack {
        ThreadStack {
            thread: Some("MainThread".into()),
            frames: frames
                .iter()
                .map(|(function, file, line)| Frame {
                    function: (*function).into(),
                    file: (*file).into(),
                    line: *line,
                })
                .collect(),
            idle,
        }
    }

    /// Rank `rank` (local rank the same) with `thread` alone.
    pub fn rank_with(rank: u32, thread: ThreadStack) -> RankStack {
        RankStack {
            rank,
            local_rank: rank,
            pid: 100 + rank as i32,
            threads: vec![thread],
            error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(innermost: (&str, &str)) -> RankStack {
        let frame = |(function, file): (&str, &str)| Frame {
            function: function.into(),
            file: file.into(),
            line: 1,
        };
        RankStack {
            rank: 3,
            local_rank: 3,
            pid: 1,
            threads: vec![ThreadStack {
                thread: Some("MainThread".into()),
                frames: vec![frame(innermost), frame(("main", "train.py"))],
                idle: false,
            }],
            error: None,
        }
    }

    #[test]
    fn a_rank_printing_its_exception_is_unwinding() {
        let hook = (
            "init_process_group.<locals>._distributed_excepthook",
            "torch/distributed/distributed_c10d.py",
        );
        assert!(rank(hook).unwinding());
        assert!(rank(("format", "/usr/lib/python3.11/traceback.py")).unwinding());
        assert!(!rank(("all_reduce", "torch/distributed/distributed_c10d.py")).unwinding());
        // After its exception, in the interpreter's shutdown (a CI run's rank 1 was
        // sampled there and shown as where it stood).
        let exiting = RankStack {
            threads: vec![build::main_thread(
                false,
                &[
                    ("_del_library", "torch/library.py", 674),
                    ("finalize.__call__", "python3.11/weakref.py", 590),
                    ("finalize._exitfunc", "python3.11/weakref.py", 666),
                ],
            )],
            ..rank(("x", "y.py"))
        };
        assert!(exiting.unwinding());
    }
}
