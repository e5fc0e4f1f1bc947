//! The ranks' PyTorch flight recorder: where their dumps go (and what makes them
//! dump), and the dumps of an attempt read and matched after a failure or a hang.

use crate::job::run_dir::write_json;
use crate::job::session::meeting::Meeting;
use crate::job::spec::Job;
use crate::job::straggler::gpu_dumps::DumpPlaces;
use crate::status::JobStatus;
use crate::store::{StoreClient, StoreError};
use std::path::{Path, PathBuf};
use std::time::Duration;
use toporun_shared::flight_recorder::{
    pipe_opens, pipe_prefix, timing_vars, toporun_dumps, user_dump_prefix, Dump, RecorderSwitches,
    UserEnv, PIPE_BUFFER_VAR, PIPE_VARS, TIMING_VAR,
};

/// The dry run's line on the GPU timing: what the ranks get, the user's values it
/// keeps, or why it is off.
pub fn gpu_timing_line(p: &Job, attempt_dir: &Path) -> String {
    let user = |k: &str| p.inherited_env.get(k);
    let off = |why: &str| format!("off ({why})");
    if !p.watch.gpu_timing {
        return off("--gpu-timing off");
    }
    if p.watch.straggler_window.is_none() {
        return off("--stragglers off");
    }
    if p.gpu_of(0).is_none() {
        return off("no GPU: the stacks name the straggler");
    }
    if p.profiler_plugin().is_some() {
        return off("NCCL's own counters time the collectives: no dump while the job trains");
    }
    if !p.watch.flight_recorder {
        return off("--flight-recorder off");
    }
    if let Some(prefix) = user_dump_prefix(&p.inherited_env) {
        return off(&format!(
            "your flight-recorder prefix {prefix}: toporun leaves the recorder to you"
        ));
    }
    let torch = p.ranks_torch();
    if !pipe_opens(&p.inherited_env, torch) {
        return off(&match (user(PIPE_BUFFER_VAR), torch) {
            (Some(n), _) => format!("your {PIPE_BUFFER_VAR}={n} opens no dump pipe"),
            (None, v) => format!("torch {}: its dump pipe opens only with {PIPE_BUFFER_VAR} set, which makes every rank print torch's deprecation warning, so toporun leaves it unset; set {PIPE_BUFFER_VAR}=2000 yourself to time the GPU from the flight recorder", v.map_or("?".into(), |v| v.to_string())),
        });
    }
    let set = timing_vars(&p.inherited_env, attempt_dir, torch);
    let kept: Vec<String> = [TIMING_VAR, PIPE_BUFFER_VAR, PIPE_VARS[0], PIPE_VARS[1]]
        .iter()
        .filter_map(|k| Some(format!("{k}={}", user(k)?)))
        .collect();
    let every = p
        .watch
        .straggler_window
        .map_or(0, |w| dump_every(w).as_secs());
    let mut line = format!(
        "on, a dump every {every}s read for the straggler: {}",
        set.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if !kept.is_empty() {
        line.push_str(&format!("; yours kept: {}", kept.join(" ")));
    }
    if torch.is_none() && user(PIPE_BUFFER_VAR).is_none() {
        line.push_str(&format!(" (the ranks' torch was not found and is taken for 2.11 or later; on an older one set {PIPE_BUFFER_VAR}=2000, or no dump pipe opens)"));
    }
    if user(TIMING_VAR).is_some_and(|v| v.trim() == "0") {
        line.push_str(" (your TORCH_NCCL_ENABLE_TIMING=0: no GPU time to read, the stacks decide)");
    }
    line
}

/// How often the straggler asks for dumps: every twelfth of the window (4 dumps a
/// third), between 2 and 10 s.
pub fn dump_every(window: Duration) -> Duration {
    (window / 12).clamp(Duration::from_secs(2), Duration::from_secs(10))
}

/// Where the straggler's dumps are asked for and read, where the ranks are timed.
/// `span` is the straggler window.
pub fn gpu_dump_places(
    user: &UserEnv,
    sw: RecorderSwitches,
    span: Option<Duration>,
    attempt_dir: &Path,
    fr_dir: Option<&Path>,
) -> Option<DumpPlaces> {
    let span = span.filter(|_| sw.gpu_timed)?;
    let dump_prefix = match user_dump_prefix(user) {
        Some(theirs) => PathBuf::from(theirs),
        None => fr_dir?.join("rank_"),
    };
    Some(DumpPlaces {
        pipe_prefix: pipe_prefix(user, attempt_dir),
        dump_prefix,
        taken: attempt_dir.join("fr-sampled"),
        every: dump_every(span),
    })
}

/// Makes the directories the recorder's variables name (the dumps', the dump pipes'),
/// and finds whether the ranks' cache root can be written: torch first creates
/// `<cache root>/torch` ($XDG_CACHE_HOME, else $HOME/.cache) and fails the dump when it
/// cannot, even with a writable prefix. Where it cannot (HOME=/proc, a read-only home)
/// the answer is an XDG_CACHE_HOME under the run directory for the ranks: other
/// libraries' caches move only where they could not be written anyway.
pub fn prepare_dumps(
    user: &UserEnv,
    sw: RecorderSwitches,
    run_dir: &Path,
    attempt_dir: &Path,
    say: bool,
) -> Option<PathBuf> {
    if !toporun_dumps(user, sw) {
        return None;
    }
    let _ = std::fs::create_dir_all(attempt_dir.join("fr"));
    if let (true, Some(pipes)) = (sw.gpu_timed, pipe_prefix(user, attempt_dir).parent()) {
        let _ = std::fs::create_dir_all(pipes);
    }
    let env = |k: &str| user.get(k);
    if env("XDG_CACHE_HOME").is_some() {
        return None;
    }
    let cache_root = env("HOME").map(|h| Path::new(h).join(".cache"));
    if cache_root.is_some_and(|c| std::fs::create_dir_all(c.join("torch")).is_ok()) {
        return None;
    }
    let cache = run_dir.join("cache");
    if say {
        crate::console::say!("toporun: note: the ranks' cache root ($HOME/.cache) cannot be written, so PyTorch's flight recorder could not dump: the ranks get XDG_CACHE_HOME={}", cache.display());
    }
    Some(cache)
}

/// Entries of each rank a node sends to the others (the recorder keeps 2000).
const ENTRIES_SENT: usize = 200;

/// How long the deciding node waits for the other nodes' dumps.
const GATHER_WAIT: Duration = Duration::from_secs(10);

/// The flight recorder's dumps of this attempt, matched across ranks, when the ranks
/// left any (gloo dumps only when asked: `_dump_fr_trace_file`); the finding's line.
/// On several nodes every node sends its dumps to the workers' store and the node
/// hosting it matches the whole job.
/// The report also goes to `out` (the attempt directory) as flight-recorder.json,
/// and its finding to the status endpoint.
pub async fn say_flight_recorder(
    dir: Option<&Path>,
    meeting: Option<Meeting>,
    out: &Path,
    status: &JobStatus,
) -> Option<String> {
    let (local, _) = crate::flight_recorder::read(&[dir?.display().to_string()]);
    // No dumps here (a rank that exited leaves none, while its peers, blocked in
    // NCCL, dumped): said to the deciding node, which would otherwise wait
    // GATHER_WAIT for them; briefly, as the store may be gone with a lost node.
    if local.is_empty() {
        if let Some(m) = meeting {
            let _ = tokio::time::timeout(NONE_SAID_WAIT, send(&m, &local)).await;
        }
        return None;
    }
    let dumps = match meeting {
        None => local,
        Some(m) => match job_dumps(&m, &local).await {
            Ok(Some(all)) => all,
            Ok(None) => local,
            Err(e) => {
                crate::console::say!("toporun: flight recorder: this node's dumps only: the workers' store is unreachable ({e})");
                local
            }
        },
    };
    if dumps.is_empty() {
        return None;
    }
    let report = toporun_shared::flight_recorder::analyze(&dumps);
    crate::console::say_raw!(
        "toporun: {}",
        toporun_shared::flight_recorder::render_text(&report)
    );
    let headline = toporun_shared::flight_recorder::headline(&report);
    let json = serde_json::json!({"headline": &headline, "report": &report});
    write_json(&out.join("flight-recorder.json"), &json);
    status.update(|x| x.last_collective = headline.clone());
    headline
}

/// How long a node without dumps tries to say so.
const NONE_SAID_WAIT: Duration = Duration::from_secs(1);

/// Writes this node's dumps (their recent entries) for the deciding node.
async fn send(m: &Meeting, local: &[Dump]) -> Result<StoreClient, StoreError> {
    let mut c = m.connect().await?;
    let sent: Vec<Dump> = local.iter().map(|d| d.recent(ENTRIES_SENT)).collect();
    m.write(&mut c, &m.keys.flight_recorder(m.node_rank), &sent)
        .await?;
    Ok(c)
}

/// Sends this node's dumps; on the deciding node, every node's that came within
/// [`GATHER_WAIT`].
async fn job_dumps(m: &Meeting, local: &[Dump]) -> Result<Option<Vec<Dump>>, StoreError> {
    let mut c = send(m, local).await?;
    if !m.decides {
        return Ok(None);
    }
    let mut all: Vec<Dump> = m
        .gather(&mut c, |n| m.keys.flight_recorder(n), GATHER_WAIT)
        .await?
        .into_iter()
        .flatten()
        .collect();
    all.sort_by_key(|d| d.rank);
    all.dedup_by_key(|d| d.rank);
    Ok(Some(all))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::RunKeys;
    use crate::store::StoreServer;

    fn meeting(port: u16, node_rank: u32) -> Meeting {
        Meeting {
            host: "127.0.0.1".into(),
            port,
            keys: RunKeys::new("t", None).round(0),
            node_rank,
            nnodes: 2,
            decides: node_rank == 0,
        }
    }

    /// Node 1's rank exited and left no dump, node 0's dumped: node 1 says it has
    /// none, so node 0 gathers at once instead of waiting GATHER_WAIT for it.
    #[tokio::test]
    async fn a_node_without_dumps_says_so_and_the_deciding_node_does_not_wait() {
        let s = StoreServer::bind(0).unwrap();
        let empty = tempfile::tempdir().unwrap();
        let status = JobStatus::default();
        let said = say_flight_recorder(
            Some(empty.path()),
            Some(meeting(s.port(), 1)),
            empty.path(),
            &status,
        );
        assert_eq!(said.await, None);
        let start = std::time::Instant::now();
        let all = job_dumps(&meeting(s.port(), 0), &[]).await.unwrap();
        assert_eq!(all.map(|d| d.len()), Some(0));
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }
}
