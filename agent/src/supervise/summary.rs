//! torchrun's failure report: the root cause (first failure), the others, each with
//! time, host, rank, exit code or signal, pid, error file and its traceback.

use super::spawn::RankCmd;
use nix::sys::wait::WaitStatus;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::SystemTime;

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
        Failure {
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
            .unwrap_or_else(|| {
                self.at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64())
            })
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

fn block(idx: usize, f: &Failure, host: &str) -> String {
    let exit = match &f.signal {
        Some(sig) => format!("{} (pid: {})\n  signal_name: {sig}", f.exitcode, f.pid),
        None => format!("{} (pid: {})", f.exitcode, f.pid),
    };
    let (file, tb) = match &f.error {
        Some(e) => (
            f.error_file.display().to_string(),
            if e.traceback.is_empty() {
                e.message.clone()
            } else {
                e.traceback.trim_end().to_string()
            },
        ),
        None => (
            "<N/A>".into(),
            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html".into(),
        ),
    };
    format!(
        "[{idx}]:\n  time      : {}\n  host      : {host}\n  rank      : {} (local_rank: {})\n  exitcode  : {exit}\n  error_file: {file}\n  traceback : {tb}\n",
        utc(f.when()),
        f.rank,
        f.local_rank
    )
}

/// torchrun's "<entrypoint> FAILED" block; the root cause is the earliest failure.
pub fn failure_summary(entrypoint: &str, host: &str, failures: &[Failure]) -> String {
    let mut sorted: Vec<&Failure> = failures.iter().collect();
    sorted.sort_by(|a, b| a.when().total_cmp(&b.when()));
    let rule = "=".repeat(60);
    let thin = "-".repeat(60);
    let others = if sorted.len() > 1 {
        sorted[1..]
            .iter()
            .enumerate()
            .map(|(i, f)| block(i + 1, f, host))
            .collect::<String>()
    } else {
        "  <NO_OTHER_FAILURES>\n".into()
    };
    format!(
        "{rule}\n{entrypoint} FAILED\n{thin}\nFailures:\n{others}{thin}\nRoot Cause (first observed failure):\n{}{rule}\n",
        sorted.first().map(|f| block(0, f, host)).unwrap_or_default()
    )
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
        };
        let s = failure_summary("train.py", "node-a", &[mk(1, 20, -15), mk(0, 10, 3)]);
        let root = s.split("Root Cause").nth(1).unwrap();
        assert!(root.contains("rank      : 0 (local_rank: 0)"));
        assert!(root.contains("exitcode  : 3 (pid: 100)"));
        assert!(root.contains("1970-01-01_00:00:10"));
        assert!(s.starts_with(&"=".repeat(60)));
        assert!(s.contains("train.py FAILED"));
    }
}
