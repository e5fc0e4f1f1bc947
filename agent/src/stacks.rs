//! Reading the Python stacks of this node's ranks, as their parent: py-spy reads each
//! rank's memory without stopping it (process_vm_readv; a parent may read its
//! children under Yama ptrace_scope 1, and with no Yama the same uid suffices).
//! Frames only: file, function, line; never locals, arguments or the environment.

use crate::paths::{Root, PROC};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use toporun_shared::stacks::{Frame, RankStack, ThreadStack};

/// A rank of this node, as the supervisor started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankPid {
    pub rank: u32,
    pub local_rank: u32,
    pub pid: i32,
}

/// The fix when the kernel refuses to let toporun read a rank.
pub const REFUSED_FIX: &str = "the kernel refused to let toporun read the rank's memory (Yama ptrace_scope 2 or 3, or a seccomp profile without process_vm_readv): add SYS_PTRACE to the container's securityContext.capabilities, or use a seccomp profile that allows process_vm_readv";

thread_local! {
    static IN_READER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is inside py-spy now: a panic there is caught and reported by
/// the reader, so the process's panic hook stays quiet for it.
pub fn in_reader() -> bool {
    IN_READER.with(|f| f.get())
}

/// Source files larger than this are not read for a line (a generated module).
const SOURCE_READ_MAX: u64 = 4 << 20;

/// Lines kept; the cache starts over past it (a job's sampled lines are few).
const LINES_KEPT: usize = 4096;

/// Lines of the ranks' source, each read once: the hang watch and the straggler
/// tracker read the same few lines at every sample.
#[derive(Default)]
pub struct SourceLines(HashMap<(String, i32), Option<String>>);

impl SourceLines {
    /// The text of `frame`'s line, as the ranks see it.
    pub fn of(&mut self, root: &Root, frame: &Frame) -> Option<&str> {
        if self.0.len() > LINES_KEPT {
            self.0.clear();
        }
        self.0
            .entry((frame.file.clone(), frame.line))
            .or_insert_with(|| line_text(root, &frame.file, frame.line))
            .as_deref()
    }

    /// The text of each rank's innermost line of code, where it can be read.
    pub fn innermost(&mut self, root: &Root, stacks: &[RankStack]) -> BTreeMap<u32, String> {
        stacks
            .iter()
            .filter_map(|s| {
                let f = s.main_thread()?.frames.first()?;
                Some((s.rank, self.of(root, f)?.to_string()))
            })
            .collect()
    }
}

/// The text of line `line` (1-based) of the source `file`, as the ranks see it.
fn line_text(root: &Root, file: &str, line: i32) -> Option<String> {
    let path = root.join(file.trim_start_matches('/'));
    if !file.starts_with('/') || std::fs::metadata(&path).ok()?.len() > SOURCE_READ_MAX {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let n = usize::try_from(line).ok()?.checked_sub(1)?;
    text.lines().nth(n).map(str::to_string)
}

/// The direct children of `pid` (DataLoader workers and the like), from
/// /proc/<pid>/task/<pid>/children.
pub fn children(root: &crate::paths::Root, pid: i32) -> Vec<i32> {
    root.read(format!("{}/{pid}/task/{pid}/children", crate::paths::PROC))
        .map(|t| {
            t.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Readers attached to ranks, kept between samples (attaching costs ~10 ms a rank,
/// a sample ~40 us).
#[derive(Default)]
pub struct Sampler {
    spies: HashMap<i32, py_spy::PythonSpy>,
}

fn config() -> py_spy::Config {
    py_spy::Config {
        // Read while the rank runs: a hung rank is never paused further by toporun.
        blocking: py_spy::config::LockingStrategy::NonBlocking,
        ..Default::default()
    }
}

/// The reader's error, with the fix where the kernel refused it.
fn with_fix(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    if text.contains("ermission") || text.contains("EPERM") || text.contains("ptrace") {
        format!("{text}: {REFUSED_FIX}")
    } else {
        text
    }
}

/// Why a rank's stack could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// py-spy could not attach or read (the kernel refused, the process went away).
    #[error("{}", with_fix(.0))]
    Spy(Box<dyn std::error::Error + Send + Sync>),
    #[error("not read: the {0:?} budget was spent")]
    OverBudget(Duration),
    #[error("the stack reader failed on this rank's memory (it changed while read: the rank was exiting?)")]
    ReaderPanicked,
}

impl Sampler {
    /// Every rank's stacks, each read within `budget` in all (a rank not reached in
    /// time says so).
    pub fn capture(&mut self, ranks: &[RankPid], budget: Duration) -> Vec<RankStack> {
        let start = Instant::now();
        self.spies
            .retain(|pid, _| ranks.iter().any(|r| r.pid == *pid));
        ranks
            .iter()
            .map(|r| {
                if start.elapsed() > budget {
                    return stack(r, Err(ReadError::OverBudget(budget)));
                }
                stack(r, self.read(r.pid))
            })
            .collect()
    }

    /// One rank's threads; a panic inside py-spy (memory that changed under it, a
    /// rank exiting) is caught and said, never the launcher's end.
    fn read(&mut self, pid: i32) -> Result<Vec<ThreadStack>, ReadError> {
        IN_READER.with(|f| f.set(true));
        let got =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.read_unguarded(pid)));
        IN_READER.with(|f| f.set(false));
        got.unwrap_or_else(|_| {
            self.spies.remove(&pid);
            Err(ReadError::ReaderPanicked)
        })
    }

    fn read_unguarded(&mut self, pid: i32) -> Result<Vec<ThreadStack>, ReadError> {
        let spy = match self.spies.entry(pid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(
                py_spy::PythonSpy::new(pid, &config()).map_err(|e| ReadError::Spy(e.into()))?,
            ),
        };
        let traces = match spy.get_stack_traces() {
            Ok(t) => t,
            Err(e) => {
                self.spies.remove(&pid);
                return Err(ReadError::Spy(e.into()));
            }
        };
        Ok(traces
            .into_iter()
            .map(|t| ThreadStack {
                idle: !t.active,
                thread: t.thread_name,
                frames: t
                    .frames
                    .into_iter()
                    .map(|f| Frame {
                        function: f.name,
                        file: f.filename,
                        line: f.line,
                    })
                    .collect(),
            })
            .collect())
    }
}

fn stack(r: &RankPid, threads: Result<Vec<ThreadStack>, ReadError>) -> RankStack {
    let (threads, error) = match threads {
        Ok(t) => (t, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    RankStack {
        rank: r.rank,
        local_rank: r.local_rank,
        pid: r.pid,
        threads,
        error,
    }
}

/// Bytes the process has written so far (`wchar` of /proc/<pid>/io).
pub fn written(root: &Root, pid: i32) -> Option<u64> {
    root.read(format!("{PROC}/{pid}/io"))?
        .lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The thread stock ProcessGroupNCCL's heartbeat monitor runs as: the one that
/// watches the workers' store for `exception_dump` (nccl2 and gloo have none).
pub const NCCL_MONITOR_THREAD: &str = "pt_nccl_heartbt";

/// Whether process `pid` has a thread named `name` (/proc/<pid>/task/*/comm).
pub fn has_thread(root: &Root, pid: i32, name: &str) -> bool {
    root.list(format!("{PROC}/{pid}/task")).iter().any(|t| {
        root.read(format!("{PROC}/{pid}/task/{t}/comm"))
            .is_some_and(|c| c.trim() == name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_found_by_name() {
        let d = tempfile::tempdir().unwrap();
        for (tid, comm) in [(42, "python3\n"), (43, "pt_nccl_heartbt\n")] {
            let dir = d.path().join(format!("proc/42/task/{tid}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("comm"), comm).unwrap();
        }
        let root = Root::at(d.path());
        assert!(has_thread(&root, 42, NCCL_MONITOR_THREAD));
        assert!(!has_thread(&root, 42, "pt_nccl_watchdg"));
        assert!(!has_thread(&root, 7, NCCL_MONITOR_THREAD));
    }

    #[test]
    fn wchar_is_read_from_proc_io() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("proc/42")).unwrap();
        std::fs::write(
            d.path().join("proc/42/io"),
            "rchar: 10\nwchar: 2048\nsyscr: 1\n",
        )
        .unwrap();
        assert_eq!(written(&Root::at(d.path()), 42), Some(2048));
        assert_eq!(written(&Root::at(d.path()), 43), None);
    }

    #[test]
    fn a_process_that_is_not_python_gives_an_error_not_a_panic() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let r = RankPid {
            rank: 0,
            local_rank: 0,
            pid: child.id() as i32,
        };
        let got = Sampler::default().capture(&[r], Duration::from_secs(2));
        let _ = child.kill();
        let _ = child.wait();
        assert!(got[0].error.is_some(), "{got:?}");
    }
}
