//! `toporun [launch] [--dry-run] [torchrun options] ENTRYPOINT ARGS`: plan, rendezvous,
//! start and supervise the local ranks.

use crate::cli::{self, Extra};
use crate::dry_run;
use crate::exit::ExitStatus;
use crate::facts_source;
use crate::subcommands::{
    ColocatedChoice, DryRunFormat, ExitCodesChoice, NetworkCheckChoice, NetworkPathChoice, OnHang,
    OnOff, PreflightChoice, StopSignalTo,
};
use anyhow::{bail, Context, Result};
use clap::ArgMatches;
use clap::ValueEnum;
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toporun_agent::job::{
    self, FileTimerSetting, HangWatch, Job, RdzvSettings, ReportSettings, StopSettings,
    WatchSettings,
};
use toporun_agent::supervise::{self, Events, StderrRead};
use toporun_shared::colocation;
use toporun_shared::nccl_counters::Profiler;
use toporun_shared::network_check::{CheckMode, PathChoice};
use toporun_shared::plan::{self, LaunchShape, PlanMode};
use toporun_shared::torchrun::worker;
use toporun_shared::torchrun::{resolve, LaunchOptions};

/// Kubernetes' default terminationMessagePath.
const TERMINATION_LOG: &str = "/dev/termination-log";

#[derive(Clone, Copy, PartialEq, Eq)]
enum PreflightMode {
    Off,
    Warn,
    Gate,
}

/// A toporun option from the command line, else its environment variable (so a
/// manifest can set it without touching the job's command).
fn option_or_env(m: &ArgMatches, o: Extra, env: &BTreeMap<String, String>) -> Option<Given> {
    if let Some(v) = m.get_one::<String>(o.id()) {
        let what = format!("--{}", o.id().replace('_', "-"));
        return Some(Given {
            what,
            value: v.clone(),
        });
    }
    from_env(o, env).map(|(var, v)| Given {
        what: var.to_string(),
        value: v.clone(),
    })
}

/// A value and the name it was given by (the option or its variable): an error
/// names what the user wrote.
struct Given {
    what: String,
    value: String,
}

/// The option's variable and its value, where it has one and it is set.
fn from_env(o: Extra, env: &BTreeMap<String, String>) -> Option<(&'static str, &String)> {
    let var = o.var()?;
    set_var(env, var).map(|v| (var, v))
}

/// A variable's value; one set to the empty string counts as unset (a pod spec's
/// `value: ""`, a template that filled nothing in), as torch reads its own.
fn set_var<'a>(env: &'a BTreeMap<String, String>, name: &str) -> Option<&'a String> {
    env.get(name).filter(|v| !v.is_empty())
}

/// A toporun flag: on the command line, or its variable true as torch reads one.
fn flag_or_env(m: &ArgMatches, o: Extra, env: &BTreeMap<String, String>) -> bool {
    m.get_flag(o.id())
        || from_env(o, env).is_some_and(|(_, v)| toporun_shared::flags::torch_bool(v) == Some(true))
}

/// A typed toporun option: the command line, else its variable (a bad value named
/// with the variable, exit 2), else the option's default.
fn typed_choice<T: ValueEnum + Clone + Send + Sync + 'static>(
    m: &ArgMatches,
    o: Extra,
    env: &BTreeMap<String, String>,
) -> Result<T> {
    let id = o.id();
    let given = m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if let (false, Some((var, v))) = (given, from_env(o, env)) {
        return T::from_str(v, false).map_err(|_| {
            let names: Vec<String> = T::value_variants()
                .iter()
                .filter_map(|c| c.to_possible_value().map(|p| p.get_name().to_string()))
                .collect();
            anyhow::Error::new(toporun_shared::torchrun::OptionsError::usage(format!(
                "{var}={v}: expected {}",
                names.join(", ")
            )))
        });
    }
    Ok(m.get_one::<T>(id).cloned().expect("has a default"))
}

fn preflight_mode(m: &ArgMatches, env: &BTreeMap<String, String>) -> Result<PreflightMode> {
    Ok(match typed_choice(m, Extra::Preflight, env)? {
        PreflightChoice::Off => PreflightMode::Off,
        PreflightChoice::Gate => PreflightMode::Gate,
        PreflightChoice::Warn => PreflightMode::Warn,
    })
}

/// The hang timeout when none is given: half of the process group's 10-minute default
/// timeout (no variable sets that one), so the report comes before NCCL's watchdog
/// stops a rank. A rank that left, or NCCL's watchdog, is said sooner (watch.rs).
pub const DEFAULT_HANG_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// `--hang-timeout` (TOPORUN_HANG_TIMEOUT; `off`: no hang watch) and `--on-hang`
/// (TOPORUN_ON_HANG); unset, a report at [`DEFAULT_HANG_TIMEOUT`].
fn hang_watch(m: &ArgMatches, env: &BTreeMap<String, String>) -> Result<Option<HangWatch>> {
    let on_hang = typed_choice::<OnHang>(m, Extra::OnHang, env)?;
    let Some(Given { what, value: v }) = option_or_env(m, Extra::HangTimeout, env) else {
        return Ok(Some(HangWatch {
            timeout: DEFAULT_HANG_TIMEOUT,
            stop: on_hang == OnHang::Stop,
        }));
    };
    if v == "off" {
        return Ok(None);
    }
    let timeout = toporun_shared::torchrun::seconds(&what, &v)
        .ok()
        .filter(|t| !t.is_zero());
    let Some(timeout) = timeout else {
        bail!(toporun_shared::torchrun::OptionsError::usage(format!(
            "{what}={v}: expected a positive number of seconds (at most 30 days), or off to turn the hang watch off"
        )));
    };
    Ok(Some(HangWatch {
        timeout,
        stop: on_hang == OnHang::Stop,
    }))
}

/// `TOPORUN_INIT_WARN_SECS`: how long every worker's store handshake is waited for
/// before the missing ones are named; checked before anything binds a port.
fn init_grace(env: &BTreeMap<String, String>) -> Result<std::time::Duration> {
    let Some(v) = set_var(env, job::INIT_WARN_VAR) else {
        return Ok(std::time::Duration::from_secs(30));
    };
    let d = toporun_shared::torchrun::seconds(job::INIT_WARN_VAR, v)?;
    if d.is_zero() {
        bail!(toporun_shared::torchrun::OptionsError::usage(format!(
            "{}={v}: expected a positive number of seconds",
            job::INIT_WARN_VAR
        )));
    }
    Ok(d)
}

/// The shortest straggler window: the 120 samples (40 a third) the rule was tuned on, at
/// 8 a second, the fastest sampling. At 10 s (80 samples) the CPU straggler of
/// straggler_e2e's job was named in 3 of 5 runs.
const MIN_STRAGGLER_WINDOW: std::time::Duration = std::time::Duration::from_secs(15);

/// `--stragglers` (TOPORUN_STRAGGLERS) and `--straggler-window`
/// (TOPORUN_STRAGGLER_WINDOW): the window, none when off.
fn straggler_window(
    m: &ArgMatches,
    env: &BTreeMap<String, String>,
) -> Result<Option<std::time::Duration>> {
    if typed_choice::<OnOff>(m, Extra::Stragglers, env)? == OnOff::Off {
        return Ok(None);
    }
    let Some(Given { what, value: v }) = option_or_env(m, Extra::StragglerWindow, env) else {
        return Ok(Some(std::time::Duration::from_secs(60)));
    };
    let w = toporun_shared::torchrun::seconds(&what, &v)?;
    if w < MIN_STRAGGLER_WINDOW {
        bail!(toporun_shared::torchrun::OptionsError::usage(format!(
            "{what}={v}: expected at least {} seconds: the straggler rule decides on 120 samples a window (40 a third), and toporun samples at most 8 times a second",
            MIN_STRAGGLER_WINDOW.as_secs()
        )));
    }
    Ok(Some(w))
}

/// `--preflight-measure`, or TOPORUN_PREFLIGHT_MEASURE=1/true.
fn wants_measure(m: &ArgMatches, env: &BTreeMap<String, String>) -> bool {
    flag_or_env(m, Extra::PreflightMeasure, env)
}

/// Where the root cause of a failure goes: `--termination-log`, else
/// TOPORUN_TERMINATION_LOG, else the kubelet's file when it mounted one.
fn termination_log(m: &ArgMatches, env: &BTreeMap<String, String>) -> Option<PathBuf> {
    option_or_env(m, Extra::TerminationLog, env)
        .map(|g| PathBuf::from(g.value))
        .or_else(|| {
            let k8s = Path::new(TERMINATION_LOG);
            k8s.exists().then(|| k8s.to_path_buf())
        })
}

/// Writes a failure's root cause where Kubernetes shows it, when there is a place.
fn termination_message(path: Option<PathBuf>, text: &str) {
    supervise::leave_termination_message(path.as_deref(), text);
}

pub fn run(m: &ArgMatches) -> ExitStatus {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::console::say!("toporun: error: cannot start the async runtime: {e}");
            return ExitStatus::Failed;
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
                let env = crate::text_env::variable_map();
                termination_message(termination_log(m, &env), &format!("toporun: error: {e:#}"));
                crate::exit::report(&e)
            }
        }
    })
}

/// The launch options: command line > PET_* > defaults. Pure and fast, so it runs
/// before the signal handlers that depend on it and before any probing.
fn options(m: &ArgMatches, parent_env: &BTreeMap<String, String>) -> Result<LaunchOptions> {
    let command: Vec<String> = m
        .get_many::<String>(Extra::Command.id())
        .map(|v| v.cloned().collect())
        .unwrap_or_default();
    Ok(resolve(
        &cli::set_on_command_line(m),
        parent_env,
        &command[0],
        &command[1..],
    )?)
}

/// The NCCL plan for this launch's shape; a replayed pod's own NCCL/FI settings
/// count as the user's, and live ones win.
fn nccl_plan(
    m: &ArgMatches,
    facts: &toporun_shared::facts::HostFacts,
    parent_env: &BTreeMap<String, String>,
    opts: &LaunchOptions,
    nproc: u32,
) -> plan::Plan {
    let (master, _) = opts.store_address();
    let shape = LaunchShape {
        nnodes: opts.nnodes_max,
        nproc_per_node: nproc,
        master_addr: Some(&master),
    };
    let mode = match m.get_one::<OnOff>(Extra::NcclEnv.id()) {
        Some(OnOff::Off) => PlanMode::Off,
        _ => PlanMode::On,
    };
    let mut user_env: BTreeMap<String, String> = facts
        .container
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("NCCL_") || k.starts_with("FI_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    user_env.extend(parent_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    plan::plan(facts, &user_env, &shape, mode)
}

/// `--logs-specs NAME`: torchrun loads it from the torchrun.logs_specs entry points
/// before any rank starts, and fails (exit 1) on an unknown one.
fn check_logs_specs(name: &str, python: &str) -> Result<()> {
    let root = toporun_agent::paths::Root::live();
    let py = std::path::PathBuf::from(python);
    if !toporun_agent::probe::platform::entry_points(&root, &py, "torchrun.logs_specs")
        .iter()
        .any(|n| n == name)
    {
        bail!("ValueError: Could not find entrypoint under 'torchrun.logs_specs[{name}]' key (no package installed for {python} registers it)");
    }
    crate::console::say!("toporun: note: --logs-specs {name}: toporun writes torchrun's default log layout; the LogsSpecs class is not loaded");
    Ok(())
}

/// `--network-check`, else TOPORUN_NETWORK_CHECK.
fn network_check(m: &ArgMatches, env: &BTreeMap<String, String>) -> Result<CheckMode> {
    Ok(match typed_choice(m, Extra::NetworkCheck, env)? {
        NetworkCheckChoice::Off => CheckMode::Off,
        NetworkCheckChoice::Report => CheckMode::Report,
        NetworkCheckChoice::Gate => CheckMode::Gate,
    })
}

/// `--network-check-path`, else TOPORUN_NETWORK_CHECK_PATH.
fn network_path(m: &ArgMatches, env: &BTreeMap<String, String>) -> Result<PathChoice> {
    Ok(match typed_choice(m, Extra::NetworkCheckPath, env)? {
        NetworkPathChoice::Auto => PathChoice::Auto,
        NetworkPathChoice::Torch => PathChoice::Torch,
        NetworkPathChoice::Tcp => PathChoice::Tcp,
    })
}

/// `--status-port`, else TORCHELASTIC_HEALTH_CHECK_PORT.
fn status_port(m: &ArgMatches, env: &BTreeMap<String, String>) -> Result<Option<u16>> {
    if let Some(p) = m.get_one::<u16>(Extra::StatusPort.id()) {
        return Ok(Some(*p));
    }
    let Some((var, v)) = from_env(Extra::StatusPort, env) else {
        return Ok(None);
    };
    let port = v.trim().parse::<u16>().map_err(|_| {
        toporun_shared::torchrun::OptionsError::usage(format!(
            "{var}={v}: expected a port number (0 to 65535)"
        ))
    })?;
    Ok(Some(port))
}

fn prepare(
    m: &ArgMatches,
    opts: LaunchOptions,
    parent_env: BTreeMap<String, String>,
) -> Result<Job> {
    let facts = facts_source::load(
        m.get_one::<String>(Extra::Facts.id()),
        m.get_one::<String>(Extra::NvidiaSmiTopo.id()),
    )?;
    // Like torch.cuda.device_count(): the GPUs left visible by CUDA_VISIBLE_DEVICES.
    let cvd = parent_env
        .get("CUDA_VISIBLE_DEVICES")
        .or_else(|| facts.container.env.get("CUDA_VISIBLE_DEVICES"));
    let cuda_gpus =
        toporun_shared::visible_devices::cuda_devices(cvd.map(String::as_str), &facts.gpus);
    let nproc = opts
        .nproc
        .resolve(cuda_gpus.len(), facts.container.cpu_count)?;
    toporun_shared::torchrun::NprocSpec::world_size(opts.nnodes_max, nproc)?;
    let plan = nccl_plan(m, &facts, &parent_env, &opts, nproc);
    let invoked = crate::text_env::invoked_as();
    let interpreter =
        toporun_shared::torchrun::interpreter::choose(&parent_env, &invoked, &|p| p.is_file());
    let python = interpreter.path.clone();
    if let Some(name) = &opts.logs_specs {
        check_logs_specs(name, &python)?;
    }
    let colocated = match typed_choice(m, Extra::Colocated, &parent_env)? {
        ColocatedChoice::Warn => colocation::Mode::Warn,
        ColocatedChoice::Join => colocation::Mode::Join,
    };
    let nccl_report = typed_choice::<OnOff>(m, Extra::NcclReport, &parent_env)? == OnOff::On;
    let termination_log = termination_log(m, &parent_env);
    let status_port = status_port(m, &parent_env)?;
    let hang = hang_watch(m, &parent_env)?;
    let flight_recorder =
        typed_choice::<OnOff>(m, Extra::FlightRecorder, &parent_env)? == OnOff::On;
    let gpu_timing = typed_choice::<OnOff>(m, Extra::GpuTiming, &parent_env)? == OnOff::On;
    // A plugin named in NCCL's config files is the user's too: NCCL loads it unless
    // the environment names another.
    let nccl_profiler = Profiler::choose(
        &toporun_shared::user_env::with_nccl_conf(&parent_env, &facts.platform.nccl_conf),
        typed_choice::<OnOff>(m, Extra::NcclProfiler, &parent_env)? == OnOff::On,
        facts
            .platform
            .nccl_version
            .as_deref()
            .and_then(toporun_shared::version::Version::parse),
        crate::profiler_plugin::find(),
    )
    .map_err(|e| toporun_shared::torchrun::OptionsError::usage(e.to_string()))?;
    let classified = typed_choice::<ExitCodesChoice>(m, Extra::ExitCodes, &parent_env)?
        == ExitCodesChoice::Classified;
    let stop_grace = match option_or_env(m, Extra::StopGrace, &parent_env) {
        Some(g) => toporun_shared::torchrun::seconds(&g.what, &g.value)?,
        None => std::time::Duration::ZERO,
    };
    let stop_signal_group =
        typed_choice::<StopSignalTo>(m, Extra::StopSignalTo, &parent_env)? == StopSignalTo::Group;
    let faulthandler = typed_choice::<OnOff>(m, Extra::Faulthandler, &parent_env)? == OnOff::On;
    let watch_preemption = flag_or_env(m, Extra::WatchPreemption, &parent_env).then(|| {
        toporun_agent::probe::cloud_metadata::Endpoints::from_env(|k| parent_env.get(k).cloned())
    });
    let watch = WatchSettings {
        hang,
        straggler_window: straggler_window(m, &parent_env)?,
        nccl_report,
        flight_recorder,
        gpu_timing,
        nccl_profiler,
        // In a pod stderr is a pipe anyway; on a terminal each rank gets a
        // pseudo-terminal (colours, progress bars) that toporun reads.
        stderr: match typed_choice::<OnOff>(m, Extra::ReadStderr, &parent_env)? {
            OnOff::Off => StderrRead::Off,
            OnOff::On if std::io::IsTerminal::is_terminal(&std::io::stderr()) => {
                StderrRead::Terminal
            }
            OnOff::On => StderrRead::Pipe,
        },
        init_grace: init_grace(&parent_env)?,
        xid_replay: set_var(&parent_env, job::XID_REPLAY_VAR).map(PathBuf::from),
    };
    Ok(Job {
        root: toporun_agent::paths::Root::live(),
        stop: StopSettings {
            grace: stop_grace,
            signal_group: stop_signal_group,
            watch_preemption,
            user_file: set_var(&parent_env, job::STOP_FILE_VAR).map(PathBuf::from),
        },
        report: ReportSettings {
            classified,
            termination_log,
            status_port,
            error_file: set_var(&parent_env, "TORCHELASTIC_ERROR_FILE").map(PathBuf::from),
        },
        watch,
        rdzv: RdzvSettings {
            token: set_var(&parent_env, job::RDZV_TOKEN_VAR).cloned(),
            colocated,
            network_check: network_check(m, &parent_env)?,
            network_path: network_path(m, &parent_env)?,
        },
        file_timer: FileTimerSetting {
            serve: parent_env
                .get("TORCHELASTIC_ENABLE_FILE_TIMER")
                .is_some_and(|v| v == "1"),
            path: set_var(&parent_env, toporun_shared::rank_env::TIMER_FILE_VAR).map(PathBuf::from),
        },
        faulthandler,
        opts,
        facts,
        nproc,
        plan,
        inherited_env: parent_env,
        python,
        python_why: interpreter.why,
        cuda_gpus,
    })
}

/// The training script (or program) and the interpreter's torch, checked where the
/// ranks would start: every rank would fail the same way otherwise.
fn entrypoint_findings(p: &Job, dry_run: bool) -> Vec<toporun_shared::finding::Finding> {
    let Ok(cwd) = std::env::current_dir() else {
        return Vec::new();
    };
    let o = &p.opts;
    toporun_agent::probe::entrypoint::read(
        &o.entrypoint,
        o.module,
        o.no_python,
        &p.python,
        &cwd,
        &p.inherited_env,
    )
    .map(|e| toporun_shared::preflight::entrypoint::check(&e, &p.python, dry_run))
    .unwrap_or_default()
}

async fn launch(m: &ArgMatches) -> Result<ExitStatus> {
    let parent_env = crate::text_env::variable_map();
    for name in crate::text_env::not_text() {
        crate::console::say!("toporun: warning: the value of {name} is not UTF-8: toporun takes it for unset (and may set its own); the ranks get it as it is unless toporun sets one");
    }
    let opts = options(m, &parent_env)?;
    // Handlers before probing, so a SIGTERM during probing or rendezvous is never lost.
    let signals: Vec<Signal> = opts
        .signals_to_handle
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let mut events = Events::install(&signals).context("installing signal handlers")?;
    supervise::become_subreaper();
    supervise::open_files::raise();
    let p = prepare(m, opts, parent_env)?;
    for note in &p.opts.notes {
        crate::console::say!("toporun: note: {note}");
    }
    let dry = m.get_flag(Extra::DryRun.id());
    let entry = entrypoint_findings(&p, dry);
    if dry {
        crate::exit::quiet_on_closed_pipe();
        let format = m
            .get_one::<DryRunFormat>(Extra::Format.id())
            .copied()
            .unwrap_or(DryRunFormat::Text);
        print!("{}", dry_run::render(&p, &entry, format)?);
        return Ok(ExitStatus::Success);
    }
    if !p.opts.no_python {
        crate::console::say!("toporun: python: {} ({})", p.python, p.python_why);
    }
    if !entry.is_empty() {
        let mut why = String::new();
        for f in &entry {
            why.push_str(&format!(
                "toporun: {}: {} [{}]. Fix: {}\n",
                f.severity,
                f.summary,
                f.id,
                f.remedy.as_deref().unwrap_or("")
            ));
        }
        crate::console::say_raw!("{why}");
        termination_message(p.report.termination_log.clone(), &why);
        return Ok(ExitStatus::Failed);
    }
    let mode = preflight_mode(m, &p.inherited_env)?;
    let mut p = p;
    if mode != PreflightMode::Off && wants_measure(m, &p.inherited_env) {
        if m.get_one::<String>(Extra::Facts.id()).is_some() {
            crate::console::say!(
                "toporun: --preflight-measure: not measured, the facts come from --facts"
            );
        } else {
            p.facts.bandwidth = Some(crate::measure_child::measure(
                crate::measure_child::DEADLINE,
            ));
            // What was measured, also when every link is fine (the findings below
            // show warnings and errors only).
            for f in toporun_shared::preflight::bandwidth_findings(&p.facts)
                .iter()
                .filter(|f| f.severity < toporun_shared::finding::Severity::Warning)
            {
                crate::console::say!("toporun: {}: {} [{}]", f.severity, f.summary, f.id);
            }
        }
    }
    let findings = match mode {
        PreflightMode::Off => Vec::new(),
        _ => p.findings(),
    };
    let fix = |f: &toporun_shared::finding::Finding| {
        f.remedy
            .as_ref()
            .map(|r| format!(". Fix: {r}"))
            .unwrap_or_default()
    };
    for f in &findings {
        crate::console::say!(
            "toporun: {}: {} [{}]{}",
            f.severity,
            f.summary,
            f.id,
            fix(f)
        );
    }
    let errors: Vec<_> = findings
        .iter()
        .filter(|f| f.severity == toporun_shared::finding::Severity::Error)
        .collect();
    if mode == PreflightMode::Gate && !errors.is_empty() {
        let mut why = format!(
            "toporun: --preflight gate: this host cannot run the job ({} error(s)); no rank was started\n",
            errors.len()
        );
        for f in &errors {
            why.push_str(&format!("- {} [{}]{}\n", f.summary, f.id, fix(f)));
        }
        crate::console::say_raw!("{why}");
        termination_message(p.report.termination_log.clone(), &why);
        return Ok(ExitStatus::Unfit);
    }
    // torchrun's warning, when it (and so toporun) sets OMP_NUM_THREADS=1 itself.
    if p.nproc > 1 && !p.inherited_env.contains_key("OMP_NUM_THREADS") {
        crate::console::say!("*****************************************\n{}\n*****************************************", worker::OMP_WARNING);
    }
    let code = job::run(&p, &mut events).await?;
    Ok(ExitStatus::Job(code))
}
