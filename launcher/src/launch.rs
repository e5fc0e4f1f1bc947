//! `toporun [launch] [--dry-run] [torchrun options] ENTRYPOINT ARGS`: plan, rendezvous,
//! start and supervise the local ranks.

mod dry_run;
mod nccl_report;
mod rendezvous;

use crate::cli;
use crate::facts_source;
use anyhow::{bail, Context, Result};
use clap::ArgMatches;
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toporun_agent::supervise::{
    self, failure_summary, line_prefix, Events, LogPlan, Outcome, RankCmd,
};
use toporun_shared::colocation;
use toporun_shared::facts::HostFacts;
use toporun_shared::plan::{self, LaunchShape, Plan, PlanMode};
use toporun_shared::torchrun::worker::{self, JobEnv, RankPlace};
use toporun_shared::torchrun::{resolve, LaunchOptions};

/// Everything a launch decided before starting ranks.
pub struct Prepared {
    pub opts: LaunchOptions,
    pub facts: HostFacts,
    pub nproc: u32,
    pub plan: Plan,
    pub parent_env: BTreeMap<String, String>,
    pub python: String,
    /// Why that interpreter (printed at start and in the dry run).
    pub python_why: String,
    /// The GPUs CUDA will show the ranks (CUDA_VISIBLE_DEVICES applied), in order.
    pub cuda_gpus: Vec<usize>,
    /// `--colocated join|warn`.
    pub colocated: colocation::Mode,
    /// `--nccl-report on|off`.
    pub nccl_report: bool,
}

impl Prepared {
    /// The value the ranks will see for an NCCL variable: the user's, else the plan's.
    pub fn rank_value(&self, name: &str) -> Option<String> {
        self.parent_env.get(name).cloned().or_else(|| {
            self.plan
                .variables
                .iter()
                .find(|v| v.name == name)
                .and_then(|v| v.value.clone())
        })
    }
}

pub fn run(m: &ArgMatches) -> u8 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("toporun: error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    rt.block_on(async {
        match launch(m).await {
            Ok(code) => code,
            Err(e) => {
                // torchrun's @record writes the launcher's own errors there too.
                if let Ok(dest) = std::env::var("TORCHELASTIC_ERROR_FILE") {
                    let _ = supervise::record_error(Path::new(&dest), &format!("{e:#}"));
                }
                crate::report(&e)
            }
        }
    })
}

/// The launch options: command line > PET_* > defaults. Pure and fast, so it runs
/// before the signal handlers that depend on it and before any probing.
fn options(m: &ArgMatches, parent_env: &BTreeMap<String, String>) -> Result<LaunchOptions> {
    let command: Vec<String> = m
        .get_many::<String>("command")
        .map(|v| v.cloned().collect())
        .unwrap_or_default();
    Ok(resolve(
        &cli::set_on_command_line(m),
        parent_env,
        &command[0],
        &command[1..],
    )?)
}

fn prepare(
    m: &ArgMatches,
    opts: LaunchOptions,
    parent_env: BTreeMap<String, String>,
) -> Result<Prepared> {
    let facts = facts_source::load(
        m.get_one::<String>("facts"),
        m.get_one::<String>("nvidia_smi_topo"),
    )?;
    // Like torch.cuda.device_count(): the GPUs left visible by CUDA_VISIBLE_DEVICES.
    let cvd = parent_env
        .get("CUDA_VISIBLE_DEVICES")
        .or_else(|| facts.container.env.get("CUDA_VISIBLE_DEVICES"));
    let cuda_gpus =
        toporun_shared::visible_devices::cuda_devices(cvd.map(String::as_str), &facts.gpus);
    let nproc = opts
        .nproc
        .resolve(cuda_gpus.len(), facts.container.cpu_count)
        .map_err(toporun_shared::torchrun::OptionsError)?;
    let (master, _) = opts.store_address();
    let shape = LaunchShape {
        nnodes: opts.nnodes_max,
        nproc_per_node: nproc,
        master_addr: Some(&master),
    };
    let mode = if m.get_one::<String>("nccl_env").map(String::as_str) == Some("off") {
        PlanMode::Off
    } else {
        PlanMode::On
    };
    // A replayed pod's own NCCL/FI settings count as the user's; live ones win.
    let mut user_env: BTreeMap<String, String> = facts
        .container
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("NCCL_") || k.starts_with("FI_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    user_env.extend(parent_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let plan = plan::plan(&facts, &user_env, &shape, mode);
    let invoked = std::env::args().next().unwrap_or_default();
    let interpreter =
        toporun_shared::torchrun::interpreter::choose(&parent_env, &invoked, &|p| p.is_file());
    let python = interpreter.path.clone();
    if let Some(name) = &opts.logs_specs {
        // torchrun loads it from the torchrun.logs_specs entry points before any rank
        // starts, and fails (exit 1) on an unknown one.
        let root = toporun_agent::paths::Root::live();
        let py = std::path::PathBuf::from(&python);
        if !toporun_agent::probe::platform::entry_points(&root, &py, "torchrun.logs_specs")
            .contains(name)
        {
            bail!("ValueError: Could not find entrypoint under 'torchrun.logs_specs[{name}]' key (no package installed for {python} registers it)");
        }
        eprintln!("toporun: note: --logs-specs {name}: toporun writes torchrun's default log layout; the LogsSpecs class is not loaded");
    }
    let colocated = match m
        .get_one::<String>("colocated")
        .cloned()
        .or_else(|| parent_env.get("TOPORUN_COLOCATED").cloned())
        .as_deref()
    {
        None | Some("join") => colocation::Mode::Join,
        Some("warn") => colocation::Mode::Warn,
        Some(other) => bail!(toporun_shared::torchrun::OptionsError(format!(
            "TOPORUN_COLOCATED={other}: expected join or warn"
        ))),
    };
    let nccl_report = match m
        .get_one::<String>("nccl_report")
        .cloned()
        .or_else(|| parent_env.get("TOPORUN_NCCL_REPORT").cloned())
        .as_deref()
    {
        None | Some("on") => true,
        Some("off") => false,
        Some(other) => bail!(toporun_shared::torchrun::OptionsError(format!(
            "TOPORUN_NCCL_REPORT={other}: expected on or off"
        ))),
    };
    Ok(Prepared {
        opts,
        facts,
        nproc,
        plan,
        parent_env,
        python,
        python_why: interpreter.why,
        cuda_gpus,
        colocated,
        nccl_report,
    })
}

async fn launch(m: &ArgMatches) -> Result<u8> {
    let parent_env: BTreeMap<String, String> = std::env::vars().collect();
    let opts = options(m, &parent_env)?;
    // Handlers before probing, so a SIGTERM during probing or rendezvous is never lost.
    let signals: Vec<Signal> = opts
        .signals_to_handle
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let mut events = Events::install(&signals).context("installing signal handlers")?;
    supervise::become_subreaper();
    let p = prepare(m, opts, parent_env)?;
    for note in &p.opts.notes {
        eprintln!("toporun: note: {note}");
    }
    if !p.opts.no_python && !m.get_flag("dry_run") {
        eprintln!("toporun: python: {} ({})", p.python, p.python_why);
    }
    if m.get_flag("dry_run") {
        let format = m
            .get_one::<String>("format")
            .map(String::as_str)
            .unwrap_or("text");
        print!("{}", dry_run::render(&p, format)?);
        return Ok(0);
    }
    for f in p
        .plan
        .findings
        .iter()
        .filter(|f| f.severity >= toporun_shared::finding::Severity::Warning)
    {
        eprintln!("toporun: {}: {} [{}]", f.severity, f.summary, f.id);
    }
    // torch's FileTimerServer: TORCHELASTIC_ENABLE_FILE_TIMER=1.
    let mut timer = match p
        .parent_env
        .get("TORCHELASTIC_ENABLE_FILE_TIMER")
        .map(String::as_str)
    {
        Some("1") => {
            let path = p
                .parent_env
                .get("TORCHELASTIC_TIMER_FILE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    std::env::temp_dir().join(format!("watchdog_timer_{}", rendezvous::random_id()))
                });
            Some(
                supervise::file_timer::FileTimer::create(&path)
                    .with_context(|| "TORCHELASTIC_ENABLE_FILE_TIMER=1".to_string())?,
            )
        }
        _ => None,
    };
    let timer_file: Option<String> = timer
        .as_ref()
        .map(|t| t.path().display().to_string())
        .or_else(|| p.parent_env.get("TORCHELASTIC_TIMER_FILE").cloned());
    let Some(mut session) = rendezvous::Session::start(&p, &mut events).await? else {
        eprintln!("toporun: received a signal while connecting to the rendezvous; exiting");
        return Ok(1);
    };
    // torchrun's warning, when it (and so toporun) sets OMP_NUM_THREADS=1 itself.
    if p.nproc > 1 && !p.parent_env.contains_key("OMP_NUM_THREADS") {
        eprintln!("*****************************************\n{}\n*****************************************", worker::OMP_WARNING);
    }
    let host = p.facts.container.hostname.clone();
    let grace = Duration::from_secs_f64(
        p.parent_env
            .get("TOPORUN_INIT_WARN_SECS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(30.0),
    );
    let mut run_dir: Option<RunDir> = None;
    for round in 0..=p.opts.max_restarts {
        let Some(node) = session.join(&p, round, &mut events).await? else {
            eprintln!("toporun: received a signal during the rendezvous; exiting");
            return Ok(1);
        };
        if let Some(sig) = events.pending_signal() {
            eprintln!("toporun: received {sig} before the ranks started; exiting");
            return Ok(1);
        }
        let dir = match &run_dir {
            Some(d) => d.path.clone(),
            None => run_dir
                .insert(RunDir::create(p.opts.log_dir.as_deref(), &node.run_id)?)
                .path
                .clone(),
        };
        if !node.extra_env.vars.is_empty() {
            let vars: Vec<String> = node
                .extra_env
                .vars
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            eprintln!(
                "toporun: co-location: {} on this node's ranks: {}",
                vars.join(" "),
                node.extra_env.reason
            );
        }
        let attempt_dir = PathBuf::from(job_env(&p, &node, round, &dir).attempt_dir);
        let capture = nccl_report::capture(&p, &attempt_dir);
        let (report_env, mut reporter) = match capture {
            nccl_report::Capture::Files {
                dir: ndir,
                prefix,
                env,
            } => {
                let store = session.report_store(round, &node);
                (
                    env,
                    Some(nccl_report::Reporter::start(
                        &p, &ndir, &prefix, p.nproc, &dir, store,
                    )),
                )
            }
            nccl_report::Capture::Off(why) => {
                if p.nccl_report && round == 0 {
                    eprintln!("toporun: nccl report off: {why}");
                }
                (BTreeMap::new(), None)
            }
        };
        let mut report_env = report_env;
        if let Some(f) = &timer_file {
            report_env.insert("TORCHELASTIC_TIMER_FILE".into(), f.clone());
        }
        let cmds = rank_commands(&p, &node, &dir, round, &report_env)?;
        let stop = session.stop_watch(round, &node).await?;
        let init_watch = session.watch_init(node.places.first().map_or(0, |r| r.world_size), grace);
        let timer_expired = async {
            match timer.as_mut() {
                Some(t) => {
                    let e = t.expired().await;
                    // The killed rank's exit normally ends the attempt first (and
                    // names its rank); a pid that is no rank of ours stops it here.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    format!(
                        "fail: the file timer of pid {} (scope {}) expired",
                        e.pid, e.scope_id
                    )
                }
                None => std::future::pending().await,
            }
        };
        let stop = async move {
            tokio::select! {
                r = stop => r,
                r = timer_expired => r,
            }
        };
        let outcome =
            supervise::run_attempt(cmds, &mut events, p.opts.shutdown_timeout, stop).await;
        if let Some(e) = timer.as_mut().and_then(|t| t.fired.take()) {
            // torchrun's FileTimerServer kills the worker, then its own agent with the
            // same signal: no restart, exit 128 + signal.
            let who = match &outcome {
                Ok(Outcome::Failed(fs)) => fs.iter().find(|f| f.pid == e.pid).map(|f| {
                    format!(
                        "rank {} (local rank {}, pid {})",
                        f.rank, f.local_rank, f.pid
                    )
                }),
                _ => None,
            }
            .unwrap_or_else(|| format!("pid {}", e.pid));
            let sig = Signal::try_from(e.signal)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| e.signal.to_string());
            eprintln!("toporun: file timer: scope '{}' of {who} expired {:.1}s ago; killed it with {sig} and stopped every rank, as torchrun's FileTimerServer does", e.scope_id, e.overrun.as_secs_f64());
            session
                .stop_all(
                    round,
                    &format!("fail: file timer expired on node {}", node.node_rank),
                )
                .await;
            return Ok((128 + e.signal).clamp(0, 255) as u8);
        }
        if let Some(w) = init_watch {
            w.abort();
        }
        let restart_left = round < p.opts.max_restarts;
        if let Some(r) = reporter.as_mut() {
            r.finish().await;
        }
        match outcome? {
            Outcome::Succeeded => {
                match session.finish(round, &node).await? {
                    None => return Ok(0),
                    // Another node failed after this one finished: every node restarts.
                    Some(reason)
                        if restart_left
                            && !reason.starts_with("fail")
                            && !reason.starts_with("exit barrier") =>
                    {
                        eprintln!("toporun: {reason}; restarting this node's ranks too (restart {} of {})", round + 1, p.opts.max_restarts);
                    }
                    Some(reason) => {
                        eprintln!(
                            "toporun: this node's ranks succeeded, but the job did not: {reason}"
                        );
                        return Ok(1);
                    }
                }
            }
            Outcome::Interrupted(sig) => {
                session
                    .stop_all(
                        round,
                        &format!("fail: node {} received {sig}", node.node_rank),
                    )
                    .await;
                eprintln!("toporun: stopped the ranks after {sig}");
                return Ok(1);
            }
            Outcome::Failed(failures) => {
                for cause in reporter.as_ref().map(|r| r.failures()).unwrap_or_default() {
                    eprintln!(
                        "toporun: NCCL failed on this node: {}. Fix: {}",
                        cause.summary,
                        cause.remedy.as_deref().unwrap_or("")
                    );
                }
                // The rank that failed first, not one toporun stopped after it.
                let f = supervise::root_cause(&failures).unwrap_or(&failures[0]);
                let what = f
                    .signal
                    .clone()
                    .unwrap_or_else(|| format!("exit code {}", f.exitcode));
                let reason = format!(
                    "{}: node {} local rank {} (rank {}) failed with {what}",
                    if restart_left { "restart" } else { "fail" },
                    node.node_rank,
                    f.local_rank,
                    f.rank
                );
                session.stop_all(round, &reason).await;
                if !restart_left {
                    let summary = failure_summary(&p.opts.entrypoint, &host, &failures);
                    eprint!("{summary}");
                    if let Some(dest) = p.parent_env.get("TORCHELASTIC_ERROR_FILE") {
                        if let Err(e) = supervise::dump_error_file(Path::new(dest), f, &summary) {
                            eprintln!("toporun: cannot write TORCHELASTIC_ERROR_FILE {dest}: {e}");
                        }
                    }
                    return Ok(1);
                }
                eprintln!(
                    "toporun: {reason}; restarting every node's ranks (restart {} of {})",
                    round + 1,
                    p.opts.max_restarts
                );
            }
            Outcome::Stopped(reason) => {
                if reason.starts_with("fail") || !restart_left {
                    eprintln!("toporun: the job stopped: {reason}");
                    return Ok(1);
                }
                eprintln!(
                    "toporun: {reason}; restarting this node's ranks (restart {} of {})",
                    round + 1,
                    p.opts.max_restarts
                );
            }
        }
    }
    bail!("unreachable: the restart loop always returns")
}

/// `<log_dir or a temp dir>/<run_id>_<random>`; the temp dir goes away at exit.
struct RunDir {
    path: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl RunDir {
    fn create(log_dir: Option<&str>, run_id: &str) -> Result<RunDir> {
        let (base, temp) = match log_dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .with_context(|| format!("--log-dir {d}: cannot create it"))?;
                (PathBuf::from(d), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("torchelastic_")
                    .tempdir()
                    .context("creating the run directory")?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let run = tempfile::Builder::new()
            .prefix(&format!("{run_id}_"))
            .tempdir_in(&base)
            .context("creating the run directory")?;
        Ok(RunDir {
            path: run.keep(),
            _temp: temp,
        })
    }
}

/// This node's place once the rendezvous closed.
pub struct NodePlace {
    pub run_id: String,
    pub places: Vec<RankPlace>,
    pub master_addr: String,
    pub master_port: u16,
    pub node_rank: u32,
    pub nnodes: u32,
    /// Variables the round's co-location decision adds to this node's ranks.
    pub extra_env: colocation::NodeEnv,
}

/// The GPU a local rank uses: the local_rank-th one CUDA shows (ranks beyond the
/// GPU count share them round-robin).
pub fn gpu_of(p: &Prepared, local_rank: u32) -> Option<&toporun_shared::facts::Gpu> {
    let idx = *p
        .cuda_gpus
        .get(local_rank as usize % p.cuda_gpus.len().max(1))?;
    p.facts.gpus.devices.get(idx)
}

fn cpus_for(p: &Prepared, local_rank: u32) -> Result<Option<Vec<u32>>> {
    let affinity: Vec<Vec<u32>> = (0..p.nproc)
        .map(|r| {
            gpu_of(p, r)
                .map(|g| g.cpu_affinity.clone())
                .unwrap_or_default()
        })
        .collect();
    toporun_shared::cpu_binding::cpus_for(
        p.opts.numa_binding,
        &affinity,
        &p.facts.container.l3_groups,
        local_rank as usize,
    )
    .map_err(|e| anyhow::Error::new(toporun_shared::torchrun::OptionsError(e)))
}

pub fn job_env(p: &Prepared, node: &NodePlace, attempt: u32, run_dir: &Path) -> JobEnv {
    JobEnv {
        master_addr: node.master_addr.clone(),
        master_port: node.master_port,
        run_id: node.run_id.clone(),
        restart_count: attempt,
        max_restarts: p.opts.max_restarts,
        role: p.opts.role.clone(),
        use_agent_store: true,
        signals: p.opts.signals_to_handle.join(","),
        attempt_dir: run_dir
            .join(format!("attempt_{attempt}"))
            .display()
            .to_string(),
        virtual_local_rank: p.opts.virtual_local_rank,
    }
}

fn rank_commands(
    p: &Prepared,
    node: &NodePlace,
    run_dir: &Path,
    attempt: u32,
    report_env: &BTreeMap<String, String>,
) -> Result<Vec<RankCmd>> {
    let job = job_env(p, node, attempt, run_dir);
    let template = p.opts.log_line_prefix_template.as_deref();
    node.places
        .iter()
        .map(|place| {
            let dir = PathBuf::from(&job.attempt_dir).join(place.local_rank.to_string());
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let mut env = p.plan.planned();
            for (k, v) in node.extra_env.vars.iter().chain(report_env) {
                if !p.parent_env.contains_key(k) {
                    env.insert(k.clone(), v.clone());
                }
            }
            env.extend(worker::worker_env(place, &job, &p.parent_env));
            let (r, t) = (
                p.opts.redirects.for_rank(place.local_rank),
                p.opts.tee.for_rank(place.local_rank),
            );
            let shown = p
                .opts
                .local_ranks_filter
                .as_ref()
                .is_none_or(|f| f.contains(&place.local_rank));
            let plan = LogPlan {
                redirect_out: r.stdout,
                redirect_err: r.stderr,
                tee_out: t.stdout,
                tee_err: t.stderr,
                shown,
                dir: &dir,
                prefix: line_prefix(template, &p.opts.role, place.rank, place.local_rank),
            };
            let (stdout, stderr) = plan.sinks();
            Ok(RankCmd {
                local_rank: place.local_rank,
                rank: place.rank,
                argv: worker::worker_argv(&p.opts, &p.python, place.local_rank),
                env,
                cpus: cpus_for(p, place.local_rank)?,
                error_file: dir.join("error.json"),
                stdout,
                stderr,
            })
        })
        .collect()
}
