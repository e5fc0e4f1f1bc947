//! The ranks' PyTorch flight recorder: where their dumps go (and what makes them
//! dump), and the dumps of an attempt read and matched after a failure or a hang.

use crate::flight_recorder::{
    DUMP_ON_TIMEOUT_VAR, DUMP_PREFIX_VAR, OLD_DUMP_PREFIX_VAR, RECORDER_DEFAULTS,
};
use crate::job::run_dir::write_json;
use crate::job::session::meeting::Meeting;
use crate::job::spec::Job;
use crate::job::straggler::gpu_dumps::DumpPlaces;
use crate::status::JobStatus;
use crate::store::StoreError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toporun_shared::flight_recorder::Dump;

/// The flight recorder's variables the ranks get (none where the user chose the dump
/// prefix or the recorder is off): the one list the launch and the dry run use.
pub fn recorder_vars(p: &Job, attempt_dir: &Path) -> BTreeMap<String, String> {
    let user = |k: &str| p.inherited_env.get(k);
    let mut env = BTreeMap::new();
    if !toporun_dumps(p) {
        return env;
    }
    let dir = attempt_dir.join("fr");
    env.insert(DUMP_PREFIX_VAR.into(), format!("{}/rank_", dir.display()));
    for (name, old, value) in RECORDER_DEFAULTS {
        if user(name).is_none() && user(old).is_none() {
            env.insert(name.into(), value.into());
        }
    }
    if gpu_timed(p) {
        env.extend(timing_vars(p, attempt_dir));
    }
    env
}

/// toporun chooses where the ranks dump: the recorder is on and the user set no
/// dump prefix of their own.
fn toporun_dumps(p: &Job) -> bool {
    let user = |k: &str| p.inherited_env.get(k);
    p.watch.flight_recorder
        && user(DUMP_PREFIX_VAR)
            .or_else(|| user(OLD_DUMP_PREFIX_VAR))
            .is_none()
}

/// The ranks time their collectives for the GPU straggler rule: `--gpu-timing on`,
/// the straggler watch on, and GPUs to time.
pub fn gpu_timed(p: &Job) -> bool {
    p.watch.gpu_timing && p.watch.straggler_window.is_some() && p.gpu_of(0).is_some()
}

/// Where each rank's dump pipe is (`<prefix><rank>.pipe`): the user's, else
/// `<attempt dir>/fr-pipe/rank_`.
pub fn pipe_prefix(p: &Job, attempt_dir: &Path) -> PathBuf {
    PIPE_VARS
        .iter()
        .find_map(|v| p.inherited_env.get(*v))
        .map(PathBuf::from)
        .unwrap_or_else(|| attempt_dir.join("fr-pipe").join("rank_"))
}

/// What makes the ranks time their collectives and dump on a write to their pipe,
/// each unless the user set it: the timing, the pipe (both names: torch 2.11 reads
/// TORCH_NCCL_DEBUG_INFO_PIPE_FILE, later releases TORCH_FR_DEBUG_INFO_PIPE_FILE),
/// and the buffer size under the name the pipe needs (torch 2.11 opens no pipe
/// without TORCH_NCCL_TRACE_BUFFER_SIZE).
fn timing_vars(p: &Job, attempt_dir: &Path) -> BTreeMap<String, String> {
    let user = |k: &str| p.inherited_env.get(k);
    let mut env = BTreeMap::new();
    if user(TIMING_VAR).is_none() {
        env.insert(TIMING_VAR.into(), "1".into());
    }
    if PIPE_VARS.iter().all(|v| user(v).is_none()) {
        let prefix = pipe_prefix(p, attempt_dir).display().to_string();
        for v in PIPE_VARS {
            env.insert(v.into(), prefix.clone());
        }
    }
    if user(PIPE_BUFFER_VAR).is_none() {
        let size = user(RECORDER_DEFAULTS[0].0).map_or(RECORDER_DEFAULTS[0].2, |s| s.as_str());
        env.insert(PIPE_BUFFER_VAR.into(), size.into());
    }
    env
}

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
    if !p.watch.flight_recorder {
        return off("--flight-recorder off");
    }
    if let Some(prefix) = user(DUMP_PREFIX_VAR).or_else(|| user(OLD_DUMP_PREFIX_VAR)) {
        return off(&format!(
            "your flight-recorder prefix {prefix}: toporun leaves the recorder to you"
        ));
    }
    let set = timing_vars(p, attempt_dir);
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
    if user(TIMING_VAR).is_some_and(|v| v.trim() == "0") {
        line.push_str(" (your TORCH_NCCL_ENABLE_TIMING=0: no GPU time to read, the stacks decide)");
    }
    line
}

/// How often the straggler asks for dumps: every twelfth of the window (4 dumps a
/// third), between 2 and 10 s.
fn dump_every(window: Duration) -> Duration {
    (window / 12).clamp(Duration::from_secs(2), Duration::from_secs(10))
}

/// Where the straggler's dumps are asked for and read, where the ranks are timed.
pub fn gpu_dump_places(p: &Job, attempt_dir: &Path, fr_dir: Option<&Path>) -> Option<DumpPlaces> {
    let span = p.watch.straggler_window?;
    if !gpu_timed(p) {
        return None;
    }
    let dump_prefix = match p.inherited_env.get(DUMP_PREFIX_VAR) {
        Some(user) => PathBuf::from(user),
        None => fr_dir?.join("rank_"),
    };
    Some(DumpPlaces {
        pipe_prefix: pipe_prefix(p, attempt_dir),
        dump_prefix,
        taken: attempt_dir.join("fr-sampled"),
        every: dump_every(span),
    })
}

/// ProcessGroupNCCL times each collective on the GPU (its entries' `duration_ms`).
pub const TIMING_VAR: &str = "TORCH_NCCL_ENABLE_TIMING";
/// The dump pipe's prefix, by its torch 2.11 name and its later one.
pub const PIPE_VARS: [&str; 2] = [
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
    "TORCH_FR_DEBUG_INFO_PIPE_FILE",
];
/// The buffer size the pipe needs set under this name (torch 2.11).
pub const PIPE_BUFFER_VAR: &str = "TORCH_NCCL_TRACE_BUFFER_SIZE";

/// Where the ranks' flight-recorder dumps go: `<attempt dir>/fr` unless the user chose
/// (TORCH_FR_DUMP_TEMP_FILE, its directory); None with the recorder off.
pub fn dump_dir(p: &Job, attempt_dir: &Path) -> Option<PathBuf> {
    let user = |k: &str| p.inherited_env.get(k);
    if let Some(prefix) = user(DUMP_PREFIX_VAR).or_else(|| user(OLD_DUMP_PREFIX_VAR)) {
        return Path::new(prefix).parent().map(Path::to_path_buf);
    }
    p.watch.flight_recorder.then(|| attempt_dir.join("fr"))
}

/// Makes the directories the recorder's variables name (the dumps', the dump pipes'),
/// and finds whether the ranks' cache root can be written: torch first creates
/// `<cache root>/torch` ($XDG_CACHE_HOME, else $HOME/.cache) and fails the dump when it
/// cannot, even with a writable prefix. Where it cannot (HOME=/proc, a read-only home)
/// the answer is an XDG_CACHE_HOME under the run directory for the ranks: other
/// libraries' caches move only where they could not be written anyway.
pub fn prepare_dumps(p: &Job, run_dir: &Path, attempt_dir: &Path, say: bool) -> Option<PathBuf> {
    if !toporun_dumps(p) {
        return None;
    }
    let _ = std::fs::create_dir_all(attempt_dir.join("fr"));
    if let (true, Some(pipes)) = (gpu_timed(p), pipe_prefix(p, attempt_dir).parent()) {
        let _ = std::fs::create_dir_all(pipes);
    }
    let env = |k: &str| p.inherited_env.get(k);
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
    // No dumps here: none elsewhere either, as a rule (one backend, one code path),
    // and nothing to wait for on a store that may be gone with a lost node.
    if local.is_empty() {
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

/// Sends this node's dumps; on the deciding node, every node's that came within
/// [`GATHER_WAIT`].
async fn job_dumps(m: &Meeting, local: &[Dump]) -> Result<Option<Vec<Dump>>, StoreError> {
    let mut c = m.connect().await?;
    let sent: Vec<Dump> = local.iter().map(|d| d.recent(ENTRIES_SENT)).collect();
    m.write(&mut c, &m.keys.flight_recorder(m.node_rank), &sent)
        .await?;
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

/// Whether stock ProcessGroupNCCL's monitor looks for `exception_dump`: not when the
/// user turned its store polling off.
pub fn monitor_polls(p: &Job) -> bool {
    p.inherited_env
        .get(DUMP_ON_TIMEOUT_VAR)
        .and_then(|v| toporun_shared::flags::torch_bool(v))
        != Some(false)
}
