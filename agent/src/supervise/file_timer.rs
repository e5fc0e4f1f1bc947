//! torch's FileTimerServer (TORCHELASTIC_ENABLE_FILE_TIMER=1): ranks' FileTimerClients
//! write JSON lines to a FIFO ({"version", "pid", "scope_id", "expiration_time",
//! "signal"}; a negative expiration releases); a timer that expires kills its pid with
//! its signal, and the launcher stops the job as torchrun does.

use crate::clock::now_secs;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the FIFO is read and timers checked (torch: max_interval=0.1).
const TICK: Duration = Duration::from_millis(100);
/// Bytes kept of a line without a newline; a longer one is malformed.
const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
struct Request {
    pid: i32,
    scope_id: String,
    expiration_time: f64,
    #[serde(default)]
    signal: i32,
}

/// A timer that expired and the signal its pid got.
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    pub pid: i32,
    pub scope_id: String,
    pub signal: i32,
    /// How far past its expiration it was caught.
    pub overrun: Duration,
}

pub struct FileTimer {
    path: PathBuf,
    fifo: std::fs::File,
    buf: Vec<u8>,
    timers: BTreeMap<(i32, String), Request>,
    /// The timer that ended the last attempt, if one did.
    pub fired: Option<Expired>,
}

impl FileTimer {
    /// Creates the FIFO at `path` (as torch, it must not exist) and opens it for
    /// reading without blocking, so clients can open it for writing at once.
    pub fn create(path: &Path) -> std::io::Result<FileTimer> {
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).map_err(
            |e| {
                std::io::Error::other(format!(
                    "cannot create the timer FIFO {}: {e}",
                    path.display()
                ))
            },
        )?;
        let fifo = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        Ok(FileTimer {
            path: path.to_path_buf(),
            fifo,
            buf: Vec::new(),
            timers: BTreeMap::new(),
            fired: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads what clients wrote; malformed lines are reported and skipped.
    fn read_requests(&mut self) {
        let mut chunk = [0u8; 8192];
        loop {
            match self.fifo.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            match serde_json::from_str::<Request>(text) {
                // kill(2) takes 0 and below for process groups (-1: every process
                // toporun may signal): a timer is for one process.
                Ok(r) if r.pid <= 0 => crate::console::say!(
                    "toporun: file timer: ignoring a request for pid {} (a timer is for one process, pid 1 or above)",
                    r.pid
                ),
                Ok(r) if r.expiration_time < 0.0 => {
                    self.timers.remove(&(r.pid, r.scope_id));
                }
                Ok(r) => {
                    self.timers.insert((r.pid, r.scope_id.clone()), r);
                }
                Err(e) => crate::console::say!(
                    "toporun: file timer: ignoring a malformed request ({e}): {:.200}",
                    text
                ),
            }
        }
        if self.buf.len() > MAX_LINE {
            crate::console::say!(
                "toporun: file timer: ignoring {} bytes without a newline",
                self.buf.len()
            );
            self.buf.clear();
        }
    }

    /// One watchdog pass: registers requests, kills the pids of expired timers (the
    /// earliest expired timer with a signal > 0 per pid), forgets dead pids.
    pub fn check(&mut self) -> Vec<Expired> {
        self.read_requests();
        let t = now_secs();
        let mut by_pid: BTreeMap<i32, Vec<&Request>> = BTreeMap::new();
        for r in self.timers.values().filter(|r| r.expiration_time <= t) {
            by_pid.entry(r.pid).or_default().push(r);
        }
        let mut out = Vec::new();
        for (pid, mut list) in by_pid {
            list.sort_by(|a, b| a.expiration_time.total_cmp(&b.expiration_time));
            let Some(r) = list.into_iter().find(|r| r.signal > 0) else {
                continue;
            };
            if let Ok(sig) = Signal::try_from(r.signal) {
                let _ = kill(Pid::from_raw(pid), sig);
            }
            out.push(Expired {
                pid,
                scope_id: r.scope_id.clone(),
                signal: r.signal,
                overrun: Duration::from_secs_f64((t - r.expiration_time).max(0.0)),
            });
        }
        let reaped: Vec<i32> = out.iter().map(|e| e.pid).collect();
        self.timers
            .retain(|(pid, _), _| !reaped.contains(pid) && kill(Pid::from_raw(*pid), None).is_ok());
        out
    }

    /// Resolves when a timer expired (after its pid was signalled).
    pub async fn expired(&mut self) -> Expired {
        loop {
            if let Some(e) = self.check().into_iter().next() {
                self.fired = Some(e.clone());
                return e;
            }
            tokio::time::sleep(TICK).await;
        }
    }
}

impl Drop for FileTimer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(path: &Path, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }

    #[test]
    fn acquire_release_expire_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watchdog");
        let mut t = FileTimer::create(&path).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let soon = now_secs() - 0.5;
        write(
            &path,
            &format!(
                r#"{{"version":1,"pid":{pid},"scope_id":"released","expiration_time":{soon},"signal":9}}"#
            ),
        );
        write(
            &path,
            &format!(
                r#"{{"version":1,"pid":{pid},"scope_id":"released","expiration_time":-1,"signal":0}}"#
            ),
        );
        write(&path, "not json at all");
        write(
            &path,
            &format!(
                r#"{{"version":1,"pid":{pid},"scope_id":"later","expiration_time":{},"signal":9}}"#,
                now_secs() + 60.0
            ),
        );
        assert!(
            t.check().is_empty(),
            "released and future timers do not fire"
        );
        write(
            &path,
            &format!(
                r#"{{"version":1,"pid":{pid},"scope_id":"step","expiration_time":{soon},"signal":9}}"#
            ),
        );
        let e = t.check();
        assert_eq!(e.len(), 1);
        assert_eq!(
            (e[0].pid, e[0].scope_id.as_str(), e[0].signal),
            (pid, "step", 9)
        );
        assert!(e[0].overrun >= Duration::from_millis(400));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(9));
        drop(t);
        assert!(!path.exists(), "the FIFO is removed");
    }

    /// A timer for pid 0 or below (kill(2)'s process groups; -1 is every process
    /// toporun may signal) is ignored, never fired: nothing is registered. Its signal
    /// is SIGWINCH, harmless by default, should the guard ever go.
    #[test]
    fn a_timer_for_a_process_group_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watchdog");
        let mut t = FileTimer::create(&path).unwrap();
        let soon = now_secs() - 0.5;
        for pid in [-1, 0] {
            write(
                &path,
                &format!(
                    r#"{{"version":1,"pid":{pid},"scope_id":"all","expiration_time":{soon},"signal":28}}"#
                ),
            );
        }
        assert!(t.check().is_empty());
        assert!(t.timers.is_empty(), "{:?}", t.timers.keys());
    }
}
