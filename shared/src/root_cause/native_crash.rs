//! Where a rank crashed natively, as Python's faulthandler prints it on SIGSEGV,
//! SIGFPE, SIGABRT, SIGBUS and SIGILL (`PYTHONFAULTHANDLER=1`, which toporun sets):
//! the fatal error and every thread's Python frames, the crashing thread's first.
//! Without that block, the rank's last sampled stack says where it last stood.

use super::python_error::{last_exception, library, unprefixed};
use crate::stacks::ThreadStack;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeCrash {
    /// faulthandler's words: `Segmentation fault`, `Aborted`.
    pub fatal: String,
    /// The innermost frame of the user's code in the crashing thread (else its
    /// innermost): (file, line, function).
    pub frame: Option<(String, u32, String)>,
    /// No thread held a Python frame and an uncaught traceback came first: the
    /// interpreter crashed on its way out, in a library's teardown (PyTorch's NCCL
    /// process group, left without destroy_process_group), after the exception that
    /// ended the rank. Seen on 4x H200: a ValueError, then SIGSEGV.
    #[serde(default)]
    pub on_exit: bool,
}

/// `  File "/app/train.py", line 6 in decode_native_record` (faulthandler's form).
fn frame(line: &str) -> Option<(String, u32, String)> {
    let rest = line.trim_start().strip_prefix("File \"")?;
    let (file, rest) = rest.split_once("\", line ")?;
    let (num, func) = rest.split_once(" in ")?;
    Some((
        file.to_string(),
        num.trim().parse().ok()?,
        func.trim().to_string(),
    ))
}

/// The last faulthandler block in `text`.
pub fn last_native_crash(text: &str) -> Option<NativeCrash> {
    let lines: Vec<&str> = text.lines().map(unprefixed).collect();
    let start = lines
        .iter()
        .rposition(|l| l.starts_with("Fatal Python error: "))?;
    let fatal = lines[start]["Fatal Python error: ".len()..]
        .trim()
        .to_string();
    let after = &lines[start + 1..];
    // The crashing thread ("Current thread 0x... (most recent call first):"), else
    // the first thread shown (a single-threaded process: "Stack (most recent...").
    let head = after
        .iter()
        .position(|l| l.starts_with("Current thread "))
        .or_else(|| {
            after
                .iter()
                .position(|l| l.contains("(most recent call first):"))
        });
    let frames: Vec<(String, u32, String)> = head
        .map(|h| after[h + 1..].iter().map_while(|l| frame(l)).collect())
        .unwrap_or_default();
    let user = frames.iter().find(|(file, ..)| !library(file));
    let no_python = head.is_some()
        && after
            .iter()
            .take_while(|l| !l.starts_with("Extension modules"))
            .all(|l| frame(l).is_none());
    Some(NativeCrash {
        fatal,
        frame: user.or(frames.first()).cloned(),
        on_exit: no_python && last_exception(&lines[..start].join("\n")).is_some(),
    })
}

/// `decode_native_record (train.py:6)`.
pub fn frame_text((file, line, func): &(String, u32, String)) -> String {
    let name = file.rsplit('/').next().unwrap_or(file);
    format!("{func} ({name}:{line})")
}

/// Where a sampled thread stood: its innermost user frame (else its innermost).
pub fn where_sampled(thread: &ThreadStack) -> Option<String> {
    let f = thread
        .frames
        .iter()
        .find(|f| !library(&f.file))
        .or(thread.frames.first())?;
    Some(f.short())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::stacks::Frame;

    /// Python 3.11's faulthandler after ctypes.string_at(0), two threads.
    const SEGV: &str = "step 2 ok
Fatal Python error: Segmentation fault

Thread 0x00007f3a1b7fe640 (most recent call first):
  File \"/usr/lib/python3.11/threading.py\", line 324 in wait
  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap

Current thread 0x00007f3a2c1e9740 (most recent call first):
  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at
  File \"/app/first_cause.py\", line 6 in decode_native_record
  File \"/app/first_cause.py\", line 40 in <module>

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
";

    #[test]
    fn the_crashing_threads_user_frame() {
        let c = last_native_crash(SEGV).expect("a faulthandler block");
        assert_eq!(c.fatal, "Segmentation fault");
        let f = c.frame.unwrap();
        assert_eq!(frame_text(&f), "decode_native_record (first_cause.py:6)");
    }

    /// A job's stderr as scripts/device/timed_run.py kept it (`[  7.80] ` before each line).
    pub(crate) fn job_stderr(stamped: &str) -> String {
        stamped
            .lines()
            .map(|l| l.split_once("] ").map_or(l, |(_, rest)| rest))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// 4x H200, torch 2.11: rank 1's uncaught ValueError, then SIGSEGV with no Python
    /// frame as the interpreter exited (ProcessGroupNCCL left alive).
    pub(crate) const TEARDOWN: &str =
        include_str!("../../../tests/fixtures/device/x4-h200/failures/valueerror/stderr");

    #[test]
    fn a_crash_after_an_uncaught_exception_with_no_python_frame_is_on_exit() {
        let c = last_native_crash(&job_stderr(TEARDOWN)).unwrap();
        assert_eq!(
            (c.fatal.as_str(), c.frame, c.on_exit),
            ("Segmentation fault", None, true)
        );
        // A crash in the code itself (the same run's segv case), a block without any
        // thread, a frameless block with no traceback before it: not on exit.
        let segv = include_str!("../../../tests/fixtures/device/x4-h200/failures/segv/stderr");
        let c = last_native_crash(&job_stderr(segv)).unwrap();
        assert_eq!(
            frame_text(&c.frame.unwrap()),
            "decode_native_record (gpu_nccl_failure_rank.py:51)"
        );
        assert!(!c.on_exit);
        assert!(!last_native_crash(SEGV).unwrap().on_exit);
        let frameless = "Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n  <no Python frame>\n";
        assert!(!last_native_crash(frameless).unwrap().on_exit);
        let cut = "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\nKeyError: 'x'\nFatal Python error: Aborted\n";
        assert!(!last_native_crash(cut).unwrap().on_exit, "no thread shown");
    }

    #[test]
    fn a_single_threaded_stack_and_none() {
        let text = "Fatal Python error: Aborted\n\nStack (most recent call first):\n  File \"t.py\", line 3 in boom\n";
        let c = last_native_crash(text).unwrap();
        assert_eq!(c.fatal, "Aborted");
        assert_eq!(frame_text(&c.frame.unwrap()), "boom (t.py:3)");
        assert_eq!(
            last_native_crash("Traceback (most recent call last):\n"),
            None
        );
    }

    #[test]
    fn where_a_sample_stood() {
        let t = ThreadStack {
            thread: Some("MainThread".into()),
            frames: vec![
                Frame {
                    function: "write".into(),
                    file: "/usr/lib/python3.11/site-packages/lib/io.py".into(),
                    line: 9,
                },
                Frame {
                    function: "flush_shards".into(),
                    file: "/app/train.py".into(),
                    line: 12,
                },
            ],
            idle: false,
        };
        assert_eq!(where_sampled(&t).unwrap(), "flush_shards (train.py:12)");
    }
}
