//! The ranks' PyTorch flight recorder: where their dumps go (and what makes them
//! dump), and the dumps of an attempt read and matched after a failure or a hang.

use crate::flight_recorder::{
    DUMP_ON_TIMEOUT_VAR, DUMP_PREFIX_VAR, OLD_DUMP_PREFIX_VAR, RECORDER_DEFAULTS,
};
use crate::job::run_dir::write_json;
use crate::job::session::meeting::Meeting;
use crate::job::spec::Job;
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
    if !p.flight_recorder
        || user(DUMP_PREFIX_VAR)
            .or_else(|| user(OLD_DUMP_PREFIX_VAR))
            .is_some()
    {
        return env;
    }
    let dir = attempt_dir.join("fr");
    env.insert(DUMP_PREFIX_VAR.into(), format!("{}/rank_", dir.display()));
    for (name, old, value) in RECORDER_DEFAULTS {
        if user(name).is_none() && user(old).is_none() {
            env.insert(name.into(), value.into());
        }
    }
    env
}

/// Where the ranks' flight-recorder dumps go: `<attempt dir>/fr/rank_<N>` unless the
/// user chose (TORCH_FR_DUMP_TEMP_FILE). torch first creates `<cache root>/torch`
/// ($XDG_CACHE_HOME, else $HOME/.cache) and fails the dump when it cannot, even with
/// a writable prefix; where that root cannot be written (HOME=/proc, a read-only
/// home) the ranks get XDG_CACHE_HOME under the run directory: other libraries'
/// caches move only where they could not be written anyway.
pub fn flight_recorder_env(
    p: &Job,
    run_dir: &Path,
    attempt_dir: &Path,
    env: &mut BTreeMap<String, String>,
    say: bool,
) -> Option<PathBuf> {
    let user = |k: &str| p.inherited_env.get(k);
    if let Some(prefix) = user(DUMP_PREFIX_VAR).or_else(|| user(OLD_DUMP_PREFIX_VAR)) {
        return Path::new(prefix).parent().map(Path::to_path_buf);
    }
    if !p.flight_recorder {
        return None;
    }
    let dir = attempt_dir.join("fr");
    if std::fs::create_dir_all(&dir).is_err() {
        return None;
    }
    env.extend(recorder_vars(p, attempt_dir));
    let cache_root = p
        .inherited_env
        .get("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            p.inherited_env
                .get("HOME")
                .map(|h| Path::new(h).join(".cache"))
        });
    let writable = cache_root.is_some_and(|c| std::fs::create_dir_all(c.join("torch")).is_ok());
    if !writable && !p.inherited_env.contains_key("XDG_CACHE_HOME") {
        let cache = run_dir.join("cache");
        if say {
            crate::console::say!("toporun: note: the ranks' cache root ($HOME/.cache) cannot be written, so PyTorch's flight recorder could not dump: the ranks get XDG_CACHE_HOME={}", cache.display());
        }
        env.insert("XDG_CACHE_HOME".into(), cache.display().to_string());
    }
    Some(dir)
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
