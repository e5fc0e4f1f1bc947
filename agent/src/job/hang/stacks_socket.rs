//! `toporun stacks` and `toporun top` from another shell in the container (kubectl
//! exec): the launcher answers on a Unix socket in its run directory (0700), one
//! request line (a [`Request`]) per connection, and leaves an index entry
//! (`$TMPDIR/toporun-<uid>/<pid>`, holding the run directory) so a bare
//! `toporun stacks` finds the job running here, whether toporun is PID 1 or not.

use crate::paths::Root;
use crate::stacks::{RankPid, Sampler};
use crate::status::JobStatus;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toporun_shared::stacks::{merge, render_text, RankStack};

/// The socket's name in the run directory.
pub const SOCKET: &str = "stacks.sock";

/// What a client asks for, as its one request line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Stacks { json: bool },
    Top { json: bool },
}

impl Request {
    fn line(self) -> &'static str {
        match self {
            Request::Stacks { json: false } => "text",
            Request::Stacks { json: true } => "json",
            Request::Top { json: false } => "top",
            Request::Top { json: true } => "top-json",
        }
    }

    fn parse(line: &str) -> Request {
        match line {
            "json" => Request::Stacks { json: true },
            "top" => Request::Top { json: false },
            "top-json" => Request::Top { json: true },
            _ => Request::Stacks { json: false },
        }
    }
}

/// `toporun top`'s table as the sampler last left it.
fn top(status: &JobStatus, json: bool) -> String {
    let t = status.snapshot().top;
    if json {
        return serde_json::to_string(&t).unwrap_or_default() + "\n";
    }
    if t.window_s == 0 {
        return "no rank has been sampled yet (or this job runs with --stragglers off)\n".into();
    }
    t.text()
}

/// Where running jobs leave their index entries.
pub fn index_dir() -> PathBuf {
    std::env::temp_dir().join(format!("toporun-{}", nix::unistd::getuid()))
}

/// Every rank's stack now, as text (grouped, odd ones first) or JSON.
pub fn answer(root: &Root, ranks: &[RankPid], json: bool) -> String {
    let stacks: Vec<RankStack> = Sampler::default().capture(ranks, Duration::from_secs(2));
    let groups = merge(&stacks);
    if json {
        return serde_json::json!({ "ranks": stacks, "groups": groups }).to_string() + "\n";
    }
    if stacks.is_empty() {
        return "no rank is running on this node right now\n".into();
    }
    format!(
        "{} rank(s) on this node, the odd ones first:\n{}{}",
        stacks.len(),
        render_text(&groups, 12),
        crate::job::hang::workers_text::workers_text(root, ranks)
    )
}

/// Serves until the job ends: the returned guard removes the index entry and the
/// socket, so a `--log-dir` run directory holds only what torchrun leaves there.
pub struct Served {
    index: PathBuf,
    socket: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.index);
        let _ = std::fs::remove_file(&self.socket);
    }
}

pub fn serve(
    root: Root,
    run_dir: &Path,
    live: Arc<Mutex<Vec<RankPid>>>,
    status: JobStatus,
) -> std::io::Result<Served> {
    let path = run_dir.join(SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let dir = index_dir();
    std::fs::create_dir_all(&dir)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let index = dir.join(std::process::id().to_string());
    std::fs::write(&index, run_dir.as_os_str().as_encoded_bytes())?;
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let ranks = live
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let _ = reply(conn, &root, &ranks, &status);
        }
    });
    Ok(Served {
        index,
        socket: path,
    })
}

fn reply(
    conn: UnixStream,
    root: &Root,
    ranks: &[RankPid],
    status: &JobStatus,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    BufReader::new(conn.try_clone()?)
        .take(64)
        .read_line(&mut line)?;
    let text = match Request::parse(line.trim()) {
        Request::Stacks { json } => answer(root, ranks, json),
        Request::Top { json } => top(status, json),
    };
    let mut out = conn;
    out.write_all(text.as_bytes())
}

/// Asks the job whose run directory is `run_dir`.
pub fn ask(run_dir: &Path, request: Request) -> std::io::Result<String> {
    let mut s = UnixStream::connect(run_dir.join(SOCKET))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{}\n", request.line()).as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The jobs running here: (launcher pid, run directory), whose launcher is alive.
/// Entries a killed launcher left behind (SIGKILL runs no cleanup) are removed.
pub fn running() -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(index_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let dir = PathBuf::from(std::fs::read_to_string(e.path()).ok()?);
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(e.path());
                return None;
            }
            dir.join(SOCKET).exists().then_some((pid, dir))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_answers_on_its_socket_and_is_listed_while_it_runs() {
        let d = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let live = Arc::new(Mutex::new(vec![RankPid {
            rank: 0,
            local_rank: 0,
            pid,
        }]));
        let status = JobStatus::default();
        let served = serve(Root::live(), d.path(), live, status.clone()).unwrap();
        assert!(running().iter().any(|(_, dir)| dir == d.path()));
        let text = ask(d.path(), Request::Stacks { json: false }).unwrap();
        assert!(text.starts_with("1 rank(s) on this node"), "{text}");
        assert!(text.contains("rank 0: no stack:"), "{text}");
        let json = ask(d.path(), Request::Stacks { json: true }).unwrap();
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(json["ranks"][0]["pid"], pid);
        let top = ask(d.path(), Request::Top { json: false }).unwrap();
        assert!(top.starts_with("no rank has been sampled yet"), "{top}");
        status.update(|x| x.top.window_s = 60);
        let top = ask(d.path(), Request::Top { json: true }).unwrap();
        let top: serde_json::Value = serde_json::from_str(&top).unwrap();
        assert_eq!(top["window_s"], 60);
        drop(served);
        assert!(!running().iter().any(|(_, dir)| dir == d.path()));
        assert!(
            !d.path().join(SOCKET).exists(),
            "the socket outlived the job"
        );
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn an_entry_left_by_a_killed_launcher_is_removed() {
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let pid = gone.id();
        gone.wait().unwrap();
        std::fs::create_dir_all(index_dir()).unwrap();
        let entry = index_dir().join(pid.to_string());
        std::fs::write(&entry, "/nonexistent/run").unwrap();
        assert!(!running().iter().any(|(p, _)| *p == pid));
        assert!(!entry.exists());
    }
}
