//! torchrun's failure report: the root cause (first failure), the others, each with
//! time, host, rank, exit code or signal, pid, error file and its traceback.

use super::logs::Sink;
use super::spawn::RankCmd;
use super::tail::file_tail;
use crate::clock::{epoch_secs, now_secs};
use nix::sys::wait::WaitStatus;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use toporun_shared::root_cause::disk::{paths_named, write_failed};
use toporun_shared::root_cause::gpu_memory::{cuda_oom, CudaOom};
use toporun_shared::root_cause::native_crash::{last_native_crash, NativeCrash};
use toporun_shared::root_cause::peer::lost_peer;
use toporun_shared::root_cause::python_error::{last_exception, PythonError};
use toporun_shared::root_cause::shm::shm_exhausted;

#[derive(Debug, Clone)]
pub struct Failure {
    pub local_rank: u32,
    pub rank: u32,
    pub pid: i32,
    /// Exit code, or the negative signal number as torchrun prints it.
    pub exitcode: i32,
    pub signal: Option<String>,
    pub at: SystemTime,
    pub error_file: PathBuf,
    pub error: Option<WorkerError>,
    /// The last Python exception in its stderr (toporun read it).
    pub exception: Option<PythonError>,
    /// Its line saying /dev/shm ran out.
    pub shm: Option<String>,
    /// Its line saying a peer went away, and the peer's address where given.
    pub peer_lost: Option<(String, Option<String>)>,
    /// faulthandler's block, where it crashed natively.
    pub native: Option<NativeCrash>,
    /// Its line saying a write failed, and the absolute paths its output names.
    pub write_failed: Option<String>,
    pub paths: Vec<String>,
    /// PyTorch's CUDA out-of-memory message.
    pub cuda_oom: Option<CudaOom>,
    /// NCCL's watchdog stopped it (a collective timed out).
    pub watchdog: Option<toporun_shared::root_cause::watchdog::WatchdogTimeout>,
    /// torch's watchdog raised an NCCL error of one of its collectives.
    pub watchdog_error: Option<toporun_shared::root_cause::watchdog::WatchdogError>,
    /// toporun read its stderr (else no exception can be known).
    pub stderr_read: bool,
    /// Its last lines of its own on stderr (an exit without a traceback says why).
    pub last_words: Option<String>,
}

/// What a `@record`-decorated worker wrote to TORCHELASTIC_ERROR_FILE.
#[derive(Debug, Clone)]
pub struct WorkerError {
    pub message: String,
    pub traceback: String,
    pub timestamp: Option<f64>,
}

#[derive(Deserialize)]
struct ErrorFile {
    message: ErrorMessage,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ErrorMessage {
    Structured {
        message: String,
        #[serde(rename = "extraInfo", default)]
        extra: Option<ExtraInfo>,
    },
    Plain(String),
}

#[derive(Deserialize, Default)]
struct ExtraInfo {
    #[serde(default)]
    py_callstack: String,
    #[serde(default)]
    timestamp: Option<String>,
}

impl WorkerError {
    pub fn read(path: &std::path::Path) -> Option<WorkerError> {
        let text = std::fs::read_to_string(path).ok()?;
        let file: ErrorFile = serde_json::from_str(&text).ok()?;
        Some(match file.message {
            ErrorMessage::Structured { message, extra } => {
                let extra = extra.unwrap_or_default();
                WorkerError {
                    message,
                    traceback: extra.py_callstack,
                    timestamp: extra.timestamp.and_then(|t| t.parse().ok()),
                }
            }
            ErrorMessage::Plain(message) => WorkerError {
                message,
                traceback: String::new(),
                timestamp: None,
            },
        })
    }
}

impl Failure {
    pub fn new(cmd: &RankCmd, pid: i32, status: WaitStatus, at: SystemTime) -> Failure {
        let (exitcode, signal) = match status {
            WaitStatus::Exited(_, c) => (c, None),
            WaitStatus::Signaled(_, s, _) => (-(s as i32), Some(s.as_str().to_string())),
            _ => (1, None),
        };
        let error = WorkerError::read(&cmd.error_file);
        // A grandchild holding the pipe keeps it open: bounded.
        cmd.stderr_tail
            .wait_closed(std::time::Duration::from_millis(500));
        let mut output = cmd.stderr_tail.text();
        if let (true, Sink::File(log)) = (output.is_empty(), &cmd.stderr) {
            output = file_tail(log);
        }
        let output = toporun_shared::untrusted::without_escapes(&output);
        Failure {
            exception: last_exception(&output),
            shm: shm_exhausted(&output),
            peer_lost: lost_peer(&output),
            native: last_native_crash(&output),
            write_failed: write_failed(&output),
            paths: paths_named(&output),
            cuda_oom: cuda_oom(&output),
            watchdog: toporun_shared::root_cause::watchdog::last_timeout(&output),
            watchdog_error: toporun_shared::root_cause::watchdog::last_error(&output),
            last_words: toporun_shared::root_cause::last_words::last_words(&output),
            stderr_read: !matches!(cmd.stderr, Sink::Inherit | Sink::Null),
            local_rank: cmd.local_rank,
            rank: cmd.rank,
            pid,
            exitcode,
            signal,
            at,
            error_file: cmd.error_file.clone(),
            error,
        }
    }

    fn when(&self) -> f64 {
        self.error
            .as_ref()
            .and_then(|e| e.timestamp)
            .unwrap_or_else(|| epoch_secs(self.at))
    }
}

fn utc(secs: f64) -> String {
    let s = secs as i64;
    let (days, rem) = (s.div_euclid(86_400), s.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}_{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// One failure in torch 2.15's template (`_FAILURE_FORMAT_TEMPLATE`), and its widest
/// line.
fn block(idx: usize, f: &Failure, host: &str) -> (String, usize) {
    let signal = f
        .signal
        .as_ref()
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    let (file, message) = match &f.error {
        Some(e) => (
            f.error_file.display().to_string(),
            if e.traceback.is_empty() {
                e.message.clone()
            } else {
                e.traceback.clone()
            }
            .replace('\n', "\n  "),
        ),
        None if f.exitcode < 0 => (
            "<N/A>".into(),
            format!(
                "Signal {} ({}) received by PID {}",
                -f.exitcode,
                f.signal.as_deref().unwrap_or("<N/A>"),
                f.pid
            ),
        ),
        None => (
            "<N/A>".into(),
            match &f.exception {
                // Read from the rank's stderr; @record gives the whole traceback.
                Some(e) => format!("{} (from its output; the whole traceback with @record: https://pytorch.org/docs/stable/elastic/errors.html)", e.line()),
                None => "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html".into(),
            },
        ),
    };
    let text = format!(
        "[{idx}]:\n  time      : {}\n  host      : {host}\n  rank      : {} (local_rank: {})\n  exitcode  : {} (pid: {}) {signal}\n  error_file: {file}\n  traceback : {message}",
        utc(f.when()),
        f.rank,
        f.local_rank,
        f.exitcode,
        f.pid,
    );
    let width = text.lines().map(str::len).max().unwrap_or(0);
    (text, width)
}

/// Writes the launcher's TORCHELASTIC_ERROR_FILE as torchrun's `@record` does: the
/// root-cause rank's error.json with `errorCode` set to its exit code; toporun's own
/// error in that format when the rank wrote none.
pub fn dump_error_file(
    dest: &std::path::Path,
    root: &Failure,
    summary: &str,
) -> std::io::Result<()> {
    let from_rank = std::fs::read_to_string(&root.error_file)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let doc = match from_rank {
        Some(mut v) => {
            if root.exitcode != 0 {
                if let Some(m) = v.get_mut("message").and_then(|m| m.as_object_mut()) {
                    m.insert("errorCode".into(), root.exitcode.into());
                }
            }
            v
        }
        None => serde_json::json!({"message": {
            "message": format!("ChildFailedError: {}", summary.trim()),
            "extraInfo": {"py_callstack": "", "timestamp": (now_secs() as u64).to_string()},
            "errorCode": root.exitcode,
        }}),
    };
    std::fs::write(dest, doc.to_string())
}

/// A launcher error (not a rank's) in the `@record` format.
pub fn record_error(dest: &std::path::Path, message: &str) -> std::io::Result<()> {
    let doc = serde_json::json!({"message": {
        "message": message,
        "extraInfo": {"py_callstack": "", "timestamp": (now_secs() as u64).to_string()},
    }});
    std::fs::write(dest, doc.to_string())
}

/// The root cause: the earliest failure (by its error file's timestamp, else exit).
pub fn first_failure(failures: &[Failure]) -> Option<&Failure> {
    failures.iter().min_by(|a, b| a.when().total_cmp(&b.when()))
}

/// torchrun's `ChildFailedError` block (torch 2.15's `_MSG_FORMAT_TEMPLATE`): the root
/// cause first (index 0), the others by rank, rules as wide as the widest line (at
/// most 60).
pub fn failure_summary(entrypoint: &str, host: &str, failures: &[Failure]) -> String {
    let Some(root) = first_failure(failures) else {
        return String::new();
    };
    let mut others: Vec<&Failure> = failures
        .iter()
        .filter(|f| !std::ptr::eq(*f, root))
        .collect();
    others.sort_by_key(|f| f.rank);
    let title = format!("{entrypoint} FAILED");
    let (root_text, mut width) = block(0, root, host);
    let mut other_texts = Vec::new();
    for (i, f) in others.iter().enumerate() {
        let (t, w) = block(i + 1, f, host);
        width = width.max(w);
        other_texts.push(t);
    }
    let width = width.max(title.len()).min(60);
    let (rule, thin) = ("=".repeat(width), "-".repeat(width));
    let others = if other_texts.is_empty() {
        "  <NO_OTHER_FAILURES>".to_string()
    } else {
        other_texts.join("\n")
    };
    format!("{rule}\n{title}\n{thin}\nFailures:\n{others}\n{thin}\nRoot Cause (first observed failure):\n{root_text}\n{rule}\n")
}

/// The kubelet reads at most this much of a termination message.
pub const TERMINATION_MESSAGE_MAX: usize = 4096;

/// Writes the root cause where Kubernetes shows it (the container's termination
/// message): at most 4096 bytes, cut at a character boundary, the end kept when cut
/// (the root cause block comes last).
/// The one writer of the termination message: `text` (its last 4096 bytes) where
/// Kubernetes shows it, when there is a place; a failed write is said, never fatal.
pub fn leave_termination_message(path: Option<&Path>, text: &str) {
    let Some(path) = path else { return };
    if let Err(e) = write_termination_message(path, text) {
        let path = path.display();
        crate::console::say_warning!("cannot write the termination message {path}: {e}");
    }
}

fn write_termination_message(path: &Path, text: &str) -> std::io::Result<()> {
    let mut start = text.len().saturating_sub(TERMINATION_MESSAGE_MAX);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    std::fs::write(path, &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_record_error_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("error.json");
        std::fs::write(&p, r#"{"message":{"message":"ValueError: boom","extraInfo":{"py_callstack":"Traceback (most recent call last):\n  ...\nValueError: boom\n","timestamp":"1700000000"}}}"#).unwrap();
        let e = WorkerError::read(&p).unwrap();
        assert_eq!(e.message, "ValueError: boom");
        assert_eq!(e.timestamp, Some(1_700_000_000.0));
    }

    #[test]
    fn summary_names_the_earliest_failure_as_root_cause() {
        let mk = |rank, secs: u64, code| Failure {
            local_rank: rank,
            rank,
            pid: 100 + rank as i32,
            exitcode: code,
            signal: None,
            at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs),
            error_file: PathBuf::from("/x"),
            error: None,
            exception: None,
            shm: None,
            peer_lost: None,
            native: None,
            write_failed: None,
            paths: Vec::new(),
            cuda_oom: None,
            watchdog: None,
            watchdog_error: None,
            stderr_read: true,
            last_words: None,
        };
        let s = failure_summary("train.py", "node-a", &[mk(1, 20, -15), mk(0, 10, 3)]);
        let root = s.split("Root Cause").nth(1).unwrap();
        assert!(root.contains("rank      : 0 (local_rank: 0)"));
        assert!(root.contains("exitcode  : 3 (pid: 100) \n"));
        assert!(root.contains("1970-01-01_00:00:10"));
        assert!(s.starts_with(&format!("{}\ntrain.py FAILED", "=".repeat(60))));
        assert!(s.contains("[1]:\n"));
        assert!(s.contains("traceback : To enable traceback see"));
    }

    #[test]
    fn error_file_copies_the_root_cause_with_its_code() {
        let dir = tempfile::tempdir().unwrap();
        let rank_file = dir.path().join("error.json");
        std::fs::write(&rank_file, r#"{"message":{"message":"ValueError: boom","extraInfo":{"py_callstack":"tb","timestamp":"1"}}}"#).unwrap();
        let f = |file: PathBuf| Failure {
            local_rank: 0,
            rank: 0,
            pid: 1,
            exitcode: 3,
            signal: None,
            at: SystemTime::UNIX_EPOCH,
            error_file: file,
            error: None,
            exception: None,
            shm: None,
            peer_lost: None,
            native: None,
            write_failed: None,
            paths: Vec::new(),
            cuda_oom: None,
            watchdog: None,
            watchdog_error: None,
            stderr_read: true,
            last_words: None,
        };
        let dest = dir.path().join("parent.json");
        dump_error_file(&dest, &f(rank_file), "s").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&dest).unwrap()).unwrap();
        assert_eq!(v["message"]["message"], "ValueError: boom");
        assert_eq!(v["message"]["errorCode"], 3);
        dump_error_file(&dest, &f(dir.path().join("none.json")), "train.py FAILED").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&dest).unwrap()).unwrap();
        assert_eq!(v["message"]["message"], "ChildFailedError: train.py FAILED");
        assert_eq!(v["message"]["errorCode"], 3);
    }

    #[test]
    fn signals_read_as_torch_2_15_prints_them() {
        let f = Failure {
            local_rank: 1,
            rank: 1,
            pid: 27899,
            exitcode: -6,
            signal: Some("SIGABRT".into()),
            at: SystemTime::UNIX_EPOCH,
            error_file: PathBuf::from("/x"),
            error: None,
            exception: None,
            shm: None,
            peer_lost: None,
            native: None,
            write_failed: None,
            paths: Vec::new(),
            cuda_oom: None,
            watchdog: None,
            watchdog_error: None,
            stderr_read: true,
            last_words: None,
        };
        let s = failure_summary("w.py", "localhost", &[f]);
        // Exactly torchrun's lines for a SIGABRT'd rank (captured from torch 2.15).
        assert!(s.contains("  exitcode  : -6 (pid: 27899)  (SIGABRT)\n  error_file: <N/A>\n  traceback : Signal 6 (SIGABRT) received by PID 27899\n"), "{s}");
        assert!(s.contains("Failures:\n  <NO_OTHER_FAILURES>\n"));
        let width = s.lines().next().unwrap().len();
        assert_eq!(
            width,
            "  traceback : Signal 6 (SIGABRT) received by PID 27899".len()
        );
    }
}
