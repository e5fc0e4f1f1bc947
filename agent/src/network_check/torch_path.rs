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
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use toporun_shared::network_check::schedule::Path;
use toporun_shared::network_check::verdict::PathFigure;
use toporun_shared::untrusted::printable;
use toporun_shared::user_env::UserEnv;

const SCRIPT: &str = include_str!("torch_probe.py");
/// How long importing torch and starting CUDA may take, from the check's start.
pub const READY_WAIT: Duration = Duration::from_secs(20);
/// How long the measure may take, the communicator's start included.
pub const MEASURE_WAIT: Duration = Duration::from_secs(20);
/// The probe's own timeouts (the store, the process group): shorter than the kill,
/// so that its own error comes first.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the probe may take to exit once it answered (its context released).
const EXIT_WAIT: Duration = Duration::from_secs(5);
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
    /// It starts receiving on this path.
    Begin {
        path: Path,
    },
    /// What it received on a path.
    Path(PathFigure),
    Result {
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
#[derive(Debug, Default)]
pub struct Measured {
    /// Each path it finished; where it failed on a path into this node, that path at
    /// zero (its sender never delivered).
    pub received: Vec<PathFigure>,
    pub net: Option<String>,
    /// How long the process group took to start (NCCL's communicator).
    pub start_s: f64,
    /// Why it did not finish, where it did not.
    pub failed: Option<String>,
}

pub struct TorchProbe {
    pub backend: TorchBackend,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_task: Option<tokio::task::JoinHandle<()>>,
    pub debug_file: PathBuf,
}

impl TorchProbe {
    /// Starts the probe: `python` with the process's environment and `env` over it.
    pub fn start(python: &str, backend: TorchBackend, env: &UserEnv) -> Result<Self, String> {
        Self::start_script(python, SCRIPT, backend, env)
    }

    fn start_script(
        python: &str,
        script: &str,
        backend: TorchBackend,
        env: &UserEnv,
    ) -> Result<Self, String> {
        let debug_file = std::env::temp_dir().join(format!(
            "toporun-network-probe-{}-{}.log",
            std::process::id(),
            crate::paths::random_id()
        ));
        let mut cmd = Command::new(python);
        cmd.args(["-u", "-c", script, backend.as_str()])
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
        let stderr_task = child
            .stderr
            .take()
            .map(|err| tokio::spawn(keep_tail(err, stderr.clone())));
        let stdout = child.stdout.take().ok_or("the probe has no stdout")?;
        Ok(TorchProbe {
            backend,
            stdin: child.stdin.take(),
            lines: BufReader::new(stdout).lines(),
            child,
            stderr,
            stderr_task,
            debug_file,
        })
    }

    /// Waits, until `until`, for torch imported (and CUDA started): Err says why not.
    pub async fn ready(&mut self, until: Instant) -> Result<(), String> {
        match self.next(until).await {
            Ok(Said::Ready { .. }) => Ok(()),
            Ok(Said::Unable { why } | Said::Failed { why }) => Err(printable(&why)),
            Ok(_) => Err(self.why("it answered out of turn".into()).await),
            Err(e) => Err(self.why(e).await),
        }
    }

    /// Runs the measure with `params`, for at most MEASURE_WAIT: what it finished,
    /// and why it did not finish the rest, where it did not.
    pub async fn measure(&mut self, params: &Params<'_>) -> Measured {
        let until = Instant::now() + MEASURE_WAIT;
        let mut m = Measured::default();
        if let Err(e) = self.send_params(params).await {
            m.failed = Some(self.why(e).await);
            return m;
        }
        let mut begun: Option<Path> = None;
        loop {
            let why = match self.next(until).await {
                Ok(Said::Begin { path }) => {
                    begun = Some(path);
                    continue;
                }
                Ok(Said::Path(f)) => {
                    begun = None;
                    m.received.push(f);
                    continue;
                }
                Ok(Said::Result { net, start_s }) => {
                    (m.net, m.start_s) = (net, start_s);
                    return m;
                }
                Ok(Said::Unable { why } | Said::Failed { why }) => printable(&why),
                Ok(Said::Ready { .. }) => "it answered out of turn".into(),
                Err(e) => self.why(e).await,
            };
            // The path it was on when it failed: its sender never delivered.
            m.received.extend(begun.map(|path| PathFigure {
                path,
                gbit: 0.0,
                rtt_us: 0.0,
            }));
            m.failed = Some(why);
            return m;
        }
    }

    /// Ends the probe and waits for it to be gone, so that no context of its holds
    /// the GPU when the ranks start (a GPU in exclusive-process mode would refuse
    /// them): its stdin closed (a probe waiting for parameters returns), at most
    /// 5 s to exit after its answer, then killed.
    pub async fn end(mut self) {
        self.stdin = None;
        let exited = tokio::time::timeout(EXIT_WAIT, self.child.wait()).await;
        if exited.is_err() {
            self.kill().await;
        }
    }

    /// Kills the probe and reaps it (at most a second).
    async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await;
    }

    async fn send_params(&mut self, params: &Params<'_>) -> Result<(), String> {
        let line = serde_json::to_string(params).map_err(|e| e.to_string())? + "\n";
        let stdin = self.stdin.as_mut().ok_or("the probe's stdin is closed")?;
        stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("cannot reach the probe: {e}"))
    }

    /// The next line the probe says (lines that are not its JSON, a user's
    /// sitecustomize printing, are passed over), until `until`.
    async fn next(&mut self, until: Instant) -> Result<Said, String> {
        let read = async {
            while let Some(line) = self.lines.next_line().await.map_err(|e| e.to_string())? {
                if let Ok(said) = serde_json::from_str::<Said>(&line) {
                    return Ok(said);
                }
            }
            Err("it exited".to_string())
        };
        match tokio::time::timeout_at(until.into(), read).await {
            Ok(said) => said,
            Err(_) => Err("it did not answer in time".into()),
        }
    }

    /// `e`, with the end of what the probe wrote on stderr: it is stopped, and its
    /// stderr read to the end (at most a second each).
    async fn why(&mut self, e: String) -> String {
        self.kill().await;
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the probe that measures one path, begins a second, and dies
    /// as a probe whose peer failed does: the first figure is kept, the second path
    /// is said at zero, and the reason carries the end of its stderr.
    const DIES_ON_THE_SECOND_PATH: &str = r#"
import json, sys
def say(**k): print(json.dumps(k), flush=True)
print("a user's sitecustomize says hello", flush=True)
say(kind="ready", torch="2.11")
p = json.loads(sys.stdin.readline())
assert p["node"] == 1 and p["env"] == {"NCCL_HOSTID": "h"}
say(kind="begin", path={"from": 0, "to": 1})
say(kind="path", path={"from": 0, "to": 1}, gbit=12.5, rtt_us=30.0)
say(kind="begin", path={"from": 2, "to": 1})
print("Traceback (most recent call last):", file=sys.stderr)
print("RuntimeError: the peer [31mwent away", file=sys.stderr, flush=True)
sys.exit(1)
"#;

    #[tokio::test]
    async fn what_was_measured_survives_a_probe_that_dies_and_its_stderr_says_why() {
        let env = UserEnv::new();
        let mut probe =
            TorchProbe::start_script("python3", DIES_ON_THE_SECOND_PATH, TorchBackend::Gloo, &env)
                .unwrap();
        probe.ready(Instant::now() + READY_WAIT).await.unwrap();
        let params = Params {
            host: "127.0.0.1",
            port: 1,
            prefix: "p/".into(),
            backend: "gloo",
            node: 1,
            nnodes: 3,
            phases: Vec::new(),
            timeout_s: 15,
            debug_file: probe.debug_file.clone(),
            env: [("NCCL_HOSTID".to_string(), "h".to_string())].into(),
        };
        let m = probe.measure(&params).await;
        let figures: Vec<(u32, f64)> = m.received.iter().map(|f| (f.path.from, f.gbit)).collect();
        assert_eq!(figures, [(0, 12.5), (2, 0.0)], "{m:?}");
        let why = m.failed.unwrap();
        assert!(
            why.starts_with("it exited; its stderr ended: Traceback"),
            "{why}"
        );
        assert!(
            why.contains("RuntimeError: the peer") && !why.contains('\x1b'),
            "{why}"
        );
    }

    /// A probe ready and waiting for parameters that never come (the round went over
    /// TCP, or the check is off) is gone, reaped, when `end` returns: no context of
    /// its holds the GPU when the ranks start.
    #[tokio::test]
    async fn a_waiting_probe_is_gone_when_end_returns() {
        let script = "import json, sys\nprint(json.dumps(dict(kind='ready')), flush=True)\nsys.stdin.readline()";
        let mut probe =
            TorchProbe::start_script("python3", script, TorchBackend::Gloo, &UserEnv::new())
                .unwrap();
        probe.ready(Instant::now() + READY_WAIT).await.unwrap();
        let pid = probe.child.id().unwrap();
        let t = Instant::now();
        probe.end().await;
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[tokio::test]
    async fn a_probe_that_cannot_import_torch_says_so() {
        let script =
            "import json; print(json.dumps(dict(kind='unable', why='no module named torch')))";
        let mut probe =
            TorchProbe::start_script("python3", script, TorchBackend::Nccl, &UserEnv::new())
                .unwrap();
        let err = probe.ready(Instant::now() + READY_WAIT).await.unwrap_err();
        assert_eq!(err, "no module named torch");
        let missing =
            TorchProbe::start("/nonexistent/python3", TorchBackend::Nccl, &UserEnv::new());
        assert!(missing.is_err_and(|e| e.starts_with("cannot start /nonexistent/python3")));
    }
}
