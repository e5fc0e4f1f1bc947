//! The check's probes through the ranks' torch: one process per node
//! (`torch_probe.py`, run by the ranks' interpreter with their NCCL variables) that
//! measures the schedule's paths with torch.distributed's send and receive, over the
//! job's own transport (NCCL's IB, EFA or sockets; gloo). It imports torch while the
//! agents agree on the path, gets its parameters on stdin, answers one JSON line, and
//! is killed past its deadline or when dropped.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use toporun_shared::network_check::schedule::Path;
use toporun_shared::network_check::verdict::PathFigure;
use toporun_shared::user_env::UserEnv;

const SCRIPT: &str = include_str!("torch_probe.py");
/// How long importing torch and starting CUDA may take.
pub const READY_WAIT: Duration = Duration::from_secs(30);
/// How long the measure may take, the communicators' start included.
pub const MEASURE_WAIT: Duration = Duration::from_secs(20);
/// Lines of its stderr kept to say why it failed.
const STDERR_LINES: usize = 12;

/// The backend the ranks use: NCCL on GPUs, gloo without.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchBackend {
    Nccl,
    Gloo,
}

impl TorchBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            TorchBackend::Nccl => "nccl",
            TorchBackend::Gloo => "gloo",
        }
    }
}

/// What the probe is told to measure.
#[derive(Debug, Serialize)]
pub struct Params<'a> {
    /// The workers' store, which the probes meet in as the ranks will.
    pub host: &'a str,
    pub port: u16,
    pub prefix: String,
    pub backend: &'static str,
    pub node: u32,
    pub nnodes: u32,
    /// Each probe round's phases, in order.
    pub phases: Vec<Vec<Path>>,
    pub timeout_s: u64,
    /// Where NCCL logs which network it chose.
    pub debug_file: PathBuf,
    /// Set in the probe's environment before the process group starts.
    pub env: UserEnv,
}

/// One line the probe says.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Said {
    /// (Its torch version follows, unread.)
    Ready {},
    Unable {
        why: String,
    },
    Result {
        received: Vec<PathFigure>,
        net: Option<String>,
        #[serde(default)]
        start_s: f64,
    },
    Failed {
        why: String,
    },
}

/// This node's side of the torch path: its probe (or why it has none), and the
/// workers' store the probes meet in.
pub struct TorchSide<'a> {
    pub probe: Result<TorchProbe, String>,
    pub store: (&'a str, u16),
    /// Variables the round adds (co-location's), set before NCCL starts.
    pub env: UserEnv,
}

/// What the probe measured: the paths into this node, and NCCL's network.
pub struct Measured {
    pub received: Vec<PathFigure>,
    pub net: Option<String>,
    /// How long the process group took to start (NCCL's communicator).
    pub start_s: f64,
}

pub struct TorchProbe {
    pub backend: TorchBackend,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    pub debug_file: PathBuf,
}

impl TorchProbe {
    /// Starts the probe: `python` with the process's environment and `env` over it.
    pub fn start(python: &str, backend: TorchBackend, env: &UserEnv) -> Result<Self, String> {
        let debug_file = std::env::temp_dir().join(format!(
            "toporun-network-probe-{}-{}.log",
            std::process::id(),
            crate::paths::random_id()
        ));
        let mut cmd = Command::new(python);
        cmd.args(["-u", "-c", SCRIPT, backend.as_str()])
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if backend == TorchBackend::Nccl {
            cmd.env("NCCL_DEBUG", "INFO")
                .env("NCCL_DEBUG_SUBSYS", "INIT,NET")
                .env("NCCL_DEBUG_FILE", &debug_file);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {python}: {e}"))?;
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            tokio::spawn(keep_tail(err, stderr.clone()));
        }
        let stdout = child.stdout.take().ok_or("the probe has no stdout")?;
        Ok(TorchProbe {
            backend,
            stdin: child.stdin.take(),
            lines: BufReader::new(stdout).lines(),
            child,
            stderr,
            debug_file,
        })
    }

    /// Waits until torch is imported (and CUDA started): Err says why it cannot.
    pub async fn ready(&mut self, wait: Duration) -> Result<(), String> {
        match self.next(wait).await? {
            Said::Ready { .. } => Ok(()),
            Said::Unable { why } | Said::Failed { why } => Err(why),
            Said::Result { .. } => Err("it answered out of turn".into()),
        }
    }

    /// Runs the measure with `params`.
    pub async fn measure(&mut self, params: &Params<'_>) -> Result<Measured, String> {
        let line = serde_json::to_string(params).map_err(|e| e.to_string())? + "\n";
        let stdin = self.stdin.as_mut().ok_or("the probe's stdin is closed")?;
        stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("cannot reach the probe: {e}"))?;
        match self.next(MEASURE_WAIT).await? {
            Said::Result {
                received,
                net,
                start_s,
            } => Ok(Measured {
                received,
                net,
                start_s,
            }),
            Said::Unable { why } | Said::Failed { why } => Err(why),
            Said::Ready { .. } => Err("it answered out of turn".into()),
        }
    }

    /// The next line the probe says (lines that are not its JSON, a user's
    /// sitecustomize printing, are passed over), within `wait`.
    async fn next(&mut self, wait: Duration) -> Result<Said, String> {
        let read = async {
            while let Some(line) = self.lines.next_line().await.map_err(|e| e.to_string())? {
                if let Ok(said) = serde_json::from_str::<Said>(&line) {
                    return Ok(said);
                }
            }
            Err("it exited".to_string())
        };
        let said = match tokio::time::timeout(wait, read).await {
            Ok(said) => said,
            Err(_) => Err(format!("no answer within {wait:?}")),
        };
        said.map_err(|e| self.why(e))
    }

    /// `e`, with the end of what the probe wrote on stderr.
    fn why(&mut self, e: String) -> String {
        let _ = self.child.start_kill();
        let tail: Vec<String> = self
            .stderr
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        match tail.is_empty() {
            true => e,
            false => format!("{e}; its stderr ended: {}", tail.join(" | ")),
        }
    }
}

impl Drop for TorchProbe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.debug_file);
    }
}

/// Keeps the last lines of the probe's stderr.
async fn keep_tail(err: tokio::process::ChildStderr, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(err).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Ok(mut t) = tail.lock() {
            if t.len() == STDERR_LINES {
                t.pop_front();
            }
            t.push_back(toporun_shared::untrusted::printable(&line));
        }
    }
}
