//! The command line: torchrun's options (built from the shared option table, so the
//! real launch and `launch --dry-run` share one parser) and toporun's subcommands.

use crate::subcommands::{
    Cli, ColocatedChoice, DryRunFormat, ExitCodesChoice, OnHang, OnOff, PreflightChoice,
    StopSignalTo,
};
use clap::builder::EnumValueParser;
use clap::{Arg, ArgAction, ArgMatches, Command};
use std::collections::BTreeMap;
use toporun_shared::toporun_vars::ToporunVar;
use toporun_shared::torchrun::{Opt, OPTIONS};

pub const SUBCOMMANDS: &[&str] = &[
    "probe",
    "topo",
    "preflight",
    "launch",
    "bench",
    "nccl-log",
    "stacks",
    "top",
    "fr-trace",
    "help",
];

/// toporun's own launch options, beside torchrun's [`Opt`]: the parser and the
/// launch look them up by this type, so a misspelt option does not compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra {
    Facts,
    NvidiaSmiTopo,
    Format,
    DryRun,
    NcclEnv,
    NcclReport,
    Colocated,
    Preflight,
    PreflightMeasure,
    FlightRecorder,
    GpuTiming,
    StopGrace,
    StopSignalTo,
    WatchPreemption,
    Faulthandler,
    ReadStderr,
    ExitCodes,
    HangTimeout,
    Stragglers,
    StragglerWindow,
    OnHang,
    StatusPort,
    TerminationLog,
    Command,
}

impl Extra {
    /// Its clap id.
    pub const fn id(self) -> &'static str {
        match self {
            Extra::Facts => "facts",
            Extra::NvidiaSmiTopo => "nvidia_smi_topo",
            Extra::Format => "format",
            Extra::DryRun => "dry_run",
            Extra::NcclEnv => "nccl_env",
            Extra::NcclReport => "nccl_report",
            Extra::Colocated => "colocated",
            Extra::Preflight => "preflight",
            Extra::PreflightMeasure => "preflight_measure",
            Extra::FlightRecorder => "flight_recorder",
            Extra::GpuTiming => "gpu_timing",
            Extra::StopGrace => "stop_grace",
            Extra::StopSignalTo => "stop_signal_to",
            Extra::WatchPreemption => "watch_preemption",
            Extra::Faulthandler => "faulthandler",
            Extra::ReadStderr => "read_stderr",
            Extra::ExitCodes => "exit_codes",
            Extra::HangTimeout => "hang_timeout",
            Extra::Stragglers => "stragglers",
            Extra::StragglerWindow => "straggler_window",
            Extra::OnHang => "on_hang",
            Extra::StatusPort => "status_port",
            Extra::TerminationLog => "termination_log",
            Extra::Command => "command",
        }
    }

    /// The variable a manifest sets it with, where it has one (the one table of them:
    /// `toporun_shared::toporun_vars`).
    pub const fn var(self) -> Option<&'static str> {
        match self {
            Extra::NcclReport => Some(ToporunVar::NcclReport.name()),
            Extra::Colocated => Some(ToporunVar::Colocated.name()),
            Extra::Preflight => Some(ToporunVar::Preflight.name()),
            Extra::PreflightMeasure => Some(ToporunVar::PreflightMeasure.name()),
            Extra::FlightRecorder => Some(ToporunVar::FlightRecorder.name()),
            Extra::GpuTiming => Some(ToporunVar::GpuTiming.name()),
            Extra::StopGrace => Some(ToporunVar::StopGrace.name()),
            Extra::StopSignalTo => Some(ToporunVar::StopSignalTo.name()),
            Extra::WatchPreemption => Some(ToporunVar::WatchPreemption.name()),
            Extra::Faulthandler => Some(ToporunVar::Faulthandler.name()),
            Extra::ReadStderr => Some(ToporunVar::ReadStderr.name()),
            Extra::ExitCodes => Some(ToporunVar::ExitCodes.name()),
            Extra::HangTimeout => Some(ToporunVar::HangTimeout.name()),
            Extra::Stragglers => Some(ToporunVar::Stragglers.name()),
            Extra::StragglerWindow => Some(ToporunVar::StragglerWindow.name()),
            Extra::OnHang => Some(ToporunVar::OnHang.name()),
            Extra::TerminationLog => Some(ToporunVar::TerminationLog.name()),
            // torchrun reads and ignores it; toporun serves the port it names.
            Extra::StatusPort => Some("TORCHELASTIC_HEALTH_CHECK_PORT"),
            Extra::Facts
            | Extra::NvidiaSmiTopo
            | Extra::Format
            | Extra::DryRun
            | Extra::NcclEnv
            | Extra::Command => None,
        }
    }
}

/// A toporun option's help: what it does, then its variable (`Extra::var`) and, where
/// clap shows none (no `default_value`), its default: the one format of the help,
/// `[env: NAME]` then `[default: VALUE]`, as torchrun's options show theirs.
fn described(e: Extra, text: &str, default: Option<&str>) -> String {
    let mut s = text.to_string();
    if let Some(v) = e.var() {
        s.push_str(&format!(" [env: {v}]"));
    }
    if let Some(d) = default {
        s.push_str(&format!(" [default: {d}]"));
    }
    s
}

/// `--exit-codes`' help, every class from the one table the launch exits by (it
/// named 1, 80, 81, 82, 124 and 3 while 83, 84 and 85 existed).
fn exit_codes_help() -> String {
    let classes: Vec<String> = toporun_shared::root_cause::exit_codes::TABLE
        .iter()
        .map(|c| format!("{} {}", c.code, c.what))
        .collect();
    format!(
        "torchrun: torchrun's exit codes; classified: one per cause of a failure, for a podFailurePolicy ({})",
        classes.join("; ")
    )
}

fn global_args(cmd: Command) -> Command {
    cmd.arg(
        Arg::new(Extra::Facts.id())
            .long("facts")
            .global(true)
            .value_name("FILE")
            .help(described(
                Extra::Facts,
                "use a captured facts file (toporun probe --format json) instead of probing",
                None,
            )),
    )
    .arg(
        Arg::new(Extra::NvidiaSmiTopo.id())
            .long("nvidia-smi-topo")
            .global(true)
            .value_name("FILE")
            .help(described(
                Extra::NvidiaSmiTopo,
                "take GPU links from a `nvidia-smi topo -m` capture",
                None,
            )),
    )
}

/// `--dry-run --format`, typed.
fn dry_run_format_arg() -> Arg {
    Arg::new(Extra::Format.id())
        .long("format")
        .value_parser(EnumValueParser::<DryRunFormat>::new())
        .default_value("text")
        .help(described(Extra::Format, "output format of --dry-run", None))
}

/// torchrun's options plus toporun's launch extras.
pub fn launch_command(name: &'static str) -> Command {
    let cmd = Command::new(name)
        .about("Start one rank per GPU as torchrun would (same options, PET_* variables and worker environment)")
        .override_usage(format!(
            "{} [OPTIONS] ENTRYPOINT [ARGS]...",
            if name == "launch" { "toporun launch" } else { name }
        ));
    let cmd = stop_args(diagnosis_args(plan_args(torchrun_args(cmd)))).arg(
            Arg::new(Extra::Command.id())
                .value_name("ENTRYPOINT [ARGS]")
                .help(described(Extra::Command, "the training script and its arguments (a module with -m, a program with --no-python); options go before it", None))
                .num_args(1..)
                .trailing_var_arg(true)
                .allow_hyphen_values(true)
                .required(true),
        );
    global_args(cmd)
}

/// torchrun's own options, from the shared table.
fn torchrun_args(mut cmd: Command) -> Command {
    for o in OPTIONS {
        let mut help = format!("{} [env: {}]", o.help, o.opt.pet());
        if let Some(d) = o.default {
            help.push_str(&format!(" [default: {d}]"));
        }
        let mut arg = Arg::new(o.opt.dest()).long(o.longs[0]).help(help);
        for alias in &o.longs[1..] {
            arg = arg.alias(*alias);
        }
        if let Some(s) = o.short {
            arg = arg.short(s);
        }
        arg = if o.flag {
            arg.action(ArgAction::SetTrue)
        } else {
            arg.action(ArgAction::Set).allow_hyphen_values(false)
        };
        if !o.choices.is_empty() {
            arg = arg.value_parser(clap::builder::PossibleValuesParser::new(o.choices));
        }
        cmd = cmd.arg(arg);
    }
    cmd
}

/// The dry run and the NCCL plan: what is planned, checked and reported before the ranks start.
fn plan_args(cmd: Command) -> Command {
    cmd.arg(
            Arg::new(Extra::DryRun.id())
                .long("dry-run")
                .action(ArgAction::SetTrue)
                .help(described(Extra::DryRun, "print the plan and every rank's environment and command; start nothing", None)),
        )
        .arg(dry_run_format_arg())
        .arg(
            Arg::new(Extra::NcclEnv.id())
                .long("nccl-env")
                .value_parser(EnumValueParser::<OnOff>::new())
                .default_value("on")
                .help(described(Extra::NcclEnv, "off: plan no NCCL variable, keep the environment as is", None)),
        )
        .arg(
            Arg::new(Extra::NcclReport.id())
                .long("nccl-report")
                .value_parser(EnumValueParser::<OnOff>::new())
                .default_value("on")
                .help(described(Extra::NcclReport, "on: NCCL writes its init to per-rank files in the run directory (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT, NCCL_DEBUG_FILE; never over your own NCCL_DEBUG*) and toporun reports which transport NCCL chose between which ranks; off: torchrun's behaviour", None)),
        )
        .arg(
            Arg::new(Extra::Colocated.id())
                .long("colocated")
                .value_parser(EnumValueParser::<ColocatedChoice>::new())
                .default_value("join")
                .help(described(Extra::Colocated, "nodes of this job on one physical host sharing /dev/shm: join them onto one NCCL host (same NCCL_HOSTID, NCCL_CUMEM_ENABLE=0 across network namespaces) or only warn", None)),
        )
        .arg(
            Arg::new(Extra::Preflight.id())
                .long("preflight")
                .value_parser(EnumValueParser::<PreflightChoice>::new())
                .default_value("warn")
                .help(described(Extra::Preflight, "check the host before starting ranks: warn prints the findings and starts them as torchrun would; gate stops the launch (exit 3, nothing started) when a finding is certain to break the job; off checks nothing", None)),
        )
        .arg(
            Arg::new(Extra::PreflightMeasure.id())
                .long("preflight-measure")
                .action(ArgAction::SetTrue)
                .help(described(Extra::PreflightMeasure, "the preflight also measures every GPU link (as `toporun preflight --measure`) before ranks start; slow links are warnings", None)),
        )
}

/// What toporun watches and says while the ranks run, and how a failure ends.
fn diagnosis_args(cmd: Command) -> Command {
    cmd.arg(
            Arg::new(Extra::FlightRecorder.id())
                .long("flight-recorder")
                .value_parser(EnumValueParser::<OnOff>::new())
                .default_value("on")
                .help(described(Extra::FlightRecorder, "on: the ranks' PyTorch flight-recorder dumps go to the run directory (TORCH_FR_DUMP_TEMP_FILE, unless set), and after a failure or hang toporun matches them across ranks; off: torchrun's environment", None)),
        )
        .arg(
            Arg::new(Extra::GpuTiming.id())
                .long("gpu-timing")
                .value_parser(EnumValueParser::<OnOff>::new())
                .default_value("on")
                .help(described(Extra::GpuTiming, "on: NCCL ranks time their collectives on the GPU (TORCH_NCCL_ENABLE_TIMING) and dump their flight recorder through a pipe every window/12 s, so a rank slow on its GPU is named and slow links are said (no step-time cost measured on 2x H200: docs/stragglers.md); off: no timing, no dumps; your own TORCH_NCCL_* values are kept", None)),
        )
        .arg(
            Arg::new(Extra::Faulthandler.id())
                .long("faulthandler")
                .value_parser(EnumValueParser::<OnOff>::new())
                .default_value("on")
                .help(described(Extra::Faulthandler, "on: the ranks get PYTHONFAULTHANDLER=1 (unless set), so a native crash (SIGSEGV, SIGABRT...) prints every thread's Python stack and toporun names the function it struck in; off: torchrun's environment", None)),
        )
        .arg(
            Arg::new(Extra::ReadStderr.id())
                .long("read-stderr")
                .value_parser(EnumValueParser::<OnOff>::new())
                .default_value("on")
                .help(described(Extra::ReadStderr, "on: the ranks' stderr passes through toporun byte for byte (on a terminal, through a pseudo-terminal per rank: colours and progress bars kept), so a failure names the rank's last Python exception and a full /dev/shm; off: inherited, as torchrun", None)),
        )
        .arg(
            Arg::new(Extra::ExitCodes.id())
                .long("exit-codes")
                .value_parser(EnumValueParser::<ExitCodesChoice>::new())
                .default_value("torchrun")
                .help(described(Extra::ExitCodes, &exit_codes_help(), None)),
        )
        .arg(
            Arg::new(Extra::HangTimeout.id())
                .long("hang-timeout")
                .value_name("SECONDS")
                .help(described(Extra::HangTimeout, "report a hang when no rank has made progress (its Python frames and lines unchanged, nothing written) for this long: every rank's stack, the odd ones first; it must exceed the longest blocking step, such as a checkpoint write; a rank that left while the others wait, or NCCL's watchdog timing a collective out, is reported sooner; `off`: no hang watch", Some("300: a report, below the process group's 10-minute timeout"))),
        )
        .arg(
            Arg::new(Extra::Stragglers.id())
                .long("stragglers")
                .value_parser(EnumValueParser::<OnOff>::new())
                .default_value("on")
                .help(described(Extra::Stragglers, "on: from the stack samples, each rank's share of time waiting in collectives over a window; the rank that waits far less than the others (the one they wait for) is named with what it spends its time on, and shown by `toporun top`", None)),
        )
        .arg(
            Arg::new(Extra::StragglerWindow.id())
                .long("straggler-window")
                .value_name("SECONDS")
                .help(described(Extra::StragglerWindow, "the window over which wait shares are compared, at least 15", Some("60"))),
        )
        .arg(
            Arg::new(Extra::OnHang.id())
                .long("on-hang")
                .value_parser(EnumValueParser::<OnHang>::new())
                .default_value("report")
                .help(described(Extra::OnHang, &format!("after a hang report: report keeps the job running; stop ends it (exit {})", toporun_shared::root_cause::exit_codes::HANG.code), None)),
        )
        .arg(
            Arg::new(Extra::StatusPort.id())
                .long("status-port")
                .value_name("PORT")
                .value_parser(clap::value_parser!(u16))
                .help(described(Extra::StatusPort, "serve /healthz, /readyz, /metrics (Prometheus) and /status (JSON) on this port", None)),
        )
        .arg(
            Arg::new(Extra::TerminationLog.id())
                .long("termination-log")
                .value_name("PATH")
                .help(described(Extra::TerminationLog, "where the root cause of a failure goes, at most 4096 bytes, for Kubernetes to show", Some("/dev/termination-log when present"))),
        )
}

/// How a stop (a drain, a preemption) reaches the ranks.
fn stop_args(cmd: Command) -> Command {
    cmd.arg(
            Arg::new(Extra::StopGrace.id())
                .long("stop-grace")
                .value_name("SECONDS")
                .help(described(Extra::StopGrace, "on a preemption (a handled signal on any node), how long the ranks get after the stop file (TOPORUN_STOP_FILE) appears before the signal is forwarded; the shutdown deadline still bounds it", Some("0: at once, as torchrun"))),
        )
        .arg(
            Arg::new(Extra::StopSignalTo.id())
                .long("stop-signal-to")
                .value_parser(EnumValueParser::<StopSignalTo>::new())
                .default_value("rank")
                .help(described(Extra::StopSignalTo, "rank: a stop signal goes to each rank's main process, so its DataLoader workers keep serving it until it exits; group: to its whole process group, as torchrun sends it", None)),
        )
        .arg(
            Arg::new(Extra::WatchPreemption.id())
                .long("watch-preemption")
                .action(ArgAction::SetTrue)
                .help(described(Extra::WatchPreemption, "poll the cloud's instance metadata every 2 s for a preemption notice (AWS spot instance-action, GCP instance/preempted, Azure Scheduled Events Preempt) and stop the job as on a SIGTERM when one comes", None)),
        )
}

/// toporun's own subcommands (derived in `subcommands`), with the launch beside them.
pub fn toporun_command() -> Command {
    use clap::CommandFactory;
    Cli::command()
        .subcommand(launch_command("launch"))
        .after_help("Every launch option with its variable and default: toporun launch --help")
}

/// The options the command line set, for PET_* precedence.
pub fn set_on_command_line(m: &ArgMatches) -> BTreeMap<Opt, String> {
    let mut out = BTreeMap::new();
    for o in OPTIONS {
        let id = o.opt.dest();
        if m.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let v = if o.flag {
            "true".to_string()
        } else {
            m.get_one::<String>(id).cloned().unwrap_or_default()
        };
        out.insert(o.opt, v);
    }
    out
}

/// argparse rejects an unknown `-x` before the entrypoint; clap's trailing argument
/// would take it as the script. Parses like argparse: a dash-led entrypoint is an
/// unknown option unless it came after `--`.
pub fn parse_launch(cmd: Command, argv: &[String]) -> Result<ArgMatches, clap::Error> {
    let mut cmd = cmd;
    let argv = expand_abbreviations(&mut cmd, argv)?;
    let argv = &argv[..];
    if let Some(shell) = completion_request(argv) {
        // As argparse's action: print and exit before the entrypoint is required.
        print_completion(&mut cmd, &shell)?;
        #[allow(clippy::exit)]
        std::process::exit(0);
    }
    let m = cmd.try_get_matches_from_mut(argv)?;
    if let Some(first) = m
        .get_many::<String>(Extra::Command.id())
        .and_then(|mut v| v.next())
    {
        let after_dashdash = argv
            .iter()
            .position(|a| a == "--")
            .is_some_and(|i| argv.get(i + 1) == Some(first));
        if first.starts_with('-') && first != "-" && !after_dashdash {
            let near = nearest_option(&cmd, first)
                .map_or(String::new(), |o| format!("; did you mean '--{o}'?"));
            return Err(cmd.error(clap::error::ErrorKind::UnknownArgument, format!("unrecognized option '{first}'{near} (options go before the entrypoint; use -- before an entrypoint that starts with '-')")));
        }
    }
    Ok(m)
}

/// The long option nearest to a mistyped `--name[=value]`, as clap measures it
/// (Jaro similarity above 0.8), if one is that near.
fn nearest_option(cmd: &Command, given: &str) -> Option<String> {
    let name = given.trim_start_matches('-').split('=').next()?;
    cmd.get_arguments()
        .flat_map(|a| a.get_long_and_visible_aliases().unwrap_or_default())
        .map(|long| (strsim::jaro(name, long), long))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, long)| long.to_string())
}

/// argparse's abbreviations: a prefix of exactly one option string stands for it; a
/// prefix of several (even two spellings of one option, `--nproc` of
/// `--nproc-per-node` and `--nproc_per_node`) is "ambiguous", exit 2. Stops at the
/// entrypoint: everything after it belongs to the script.
fn expand_abbreviations(cmd: &mut Command, argv: &[String]) -> Result<Vec<String>, clap::Error> {
    let mut longs: Vec<(String, bool)> = Vec::new();
    let mut shorts_with_value: Vec<char> = Vec::new();
    for a in cmd.get_arguments() {
        let takes = a.get_action().takes_values();
        if let Some(l) = a.get_long() {
            longs.push((format!("--{l}"), takes));
        }
        for alias in a.get_all_aliases().unwrap_or_default() {
            longs.push((format!("--{alias}"), takes));
        }
        if let (Some(c), true) = (a.get_short(), takes) {
            shorts_with_value.push(c);
        }
    }
    longs.push(("--help".into(), false));
    let mut out: Vec<String> = argv.iter().take(1).cloned().collect();
    let mut i = 1;
    while i < argv.len() {
        let a = &argv[i];
        if a == "--" || !a.starts_with('-') || a == "-" {
            out.extend(argv[i..].iter().cloned());
            return Ok(out);
        }
        if let Some(rest) = a.strip_prefix("--") {
            let (name, value) = match rest.split_once('=') {
                Some((n, v)) => (format!("--{n}"), Some(v)),
                None => (format!("--{rest}"), None),
            };
            let (full, takes) = match longs.iter().find(|(l, _)| *l == name) {
                Some((l, t)) => (l.clone(), *t),
                None => {
                    let matches: Vec<&(String, bool)> =
                        longs.iter().filter(|(l, _)| l.starts_with(&name)).collect();
                    match matches.as_slice() {
                        [] => (name.clone(), false),
                        [(l, t)] => (l.clone(), *t),
                        many => {
                            let names: Vec<&str> = many.iter().map(|(l, _)| l.as_str()).collect();
                            return Err(cmd.error(
                                clap::error::ErrorKind::UnknownArgument,
                                format!(
                                    "ambiguous option: {name} could match {}",
                                    names.join(", ")
                                ),
                            ));
                        }
                    }
                }
            };
            out.push(match value {
                Some(v) => format!("{full}={v}"),
                None => full,
            });
            if takes && value.is_none() && i + 1 < argv.len() {
                i += 1;
                out.push(argv[i].clone());
            }
        } else {
            // -m, -r VALUE, -rVALUE, -t VALUE.
            out.push(a.clone());
            let c = a.chars().nth(1).unwrap_or(' ');
            if a.len() == 2 && shorts_with_value.contains(&c) && i + 1 < argv.len() {
                i += 1;
                out.push(argv[i].clone());
            }
        }
        i += 1;
    }
    Ok(out)
}

/// `--print-completion SHELL` before the entrypoint (argv already expanded).
fn completion_request(argv: &[String]) -> Option<String> {
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        if !a.starts_with('-') || a == "--" {
            return None;
        }
        if a == "--print-completion" || a == "--print_completion" {
            return Some(it.next().cloned().unwrap_or_default());
        }
        if let Some(v) = a
            .strip_prefix("--print-completion=")
            .or_else(|| a.strip_prefix("--print_completion="))
        {
            return Some(v.to_string());
        }
    }
    None
}

/// A completion script of this command for bash, zsh (clap_complete) or tcsh.
fn print_completion(cmd: &mut Command, shell: &str) -> Result<(), clap::Error> {
    let name = cmd.get_name().to_string();
    let mut out = std::io::stdout();
    match shell {
        "bash" => clap_complete::generate(clap_complete::Shell::Bash, cmd, &name, &mut out),
        "zsh" => clap_complete::generate(clap_complete::Shell::Zsh, cmd, &name, &mut out),
        "tcsh" => {
            // clap_complete has no tcsh: complete option names after `-`.
            let mut opts: Vec<String> = cmd
                .get_arguments()
                .filter_map(|a| a.get_long().map(|l| format!("-{l}")))
                .collect();
            opts.sort();
            println!("complete {name} 'c/--/({})/' 'p/*/f/'", opts.iter().map(|o| o.trim_start_matches('-').to_string()).collect::<Vec<_>>().join(" "));
        }
        other => {
            return Err(cmd.error(
                clap::error::ErrorKind::InvalidValue,
                format!("argument --print-completion/--print_completion: invalid choice: '{other}' (choose from bash, zsh, tcsh)"),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ArgMatches, clap::Error> {
        let argv: Vec<String> = std::iter::once("torchrun")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        parse_launch(launch_command("torchrun"), &argv)
    }

    #[test]
    fn exit_codes_help_names_every_class() {
        let cmd = launch_command("torchrun");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id() == Extra::ExitCodes.id())
            .unwrap();
        let help = arg.get_help().unwrap().to_string();
        for c in toporun_shared::root_cause::exit_codes::TABLE {
            assert!(
                help.contains(&format!("{} {}", c.code, c.what)),
                "{} missing: {help}",
                c.code
            );
        }
    }

    #[test]
    fn both_spellings_prefixes_and_trailing_args() {
        let m = parse(&[
            "--nproc_per_node=2",
            "--nnodes",
            "1",
            "--redir=3",
            "train.py",
            "--lr",
            "0.1",
            "--nnodes=9",
        ])
        .unwrap();
        let set = set_on_command_line(&m);
        assert_eq!(set[&Opt::NprocPerNode], "2");
        assert_eq!(set[&Opt::Redirects], "3");
        assert_eq!(set[&Opt::Nnodes], "1");
        let cmd: Vec<&String> = m.get_many::<String>(Extra::Command.id()).unwrap().collect();
        assert_eq!(cmd, ["train.py", "--lr", "0.1", "--nnodes=9"]);
    }

    #[test]
    fn module_flag_and_short_forms() {
        let m = parse(&["-m", "-t", "3", "pkg.train", "-x"]).unwrap();
        let set = set_on_command_line(&m);
        assert_eq!(set[&Opt::Module], "true");
        assert_eq!(set[&Opt::Tee], "3");
    }

    /// The installed torchrun's parser, option by option: a new torch release that
    /// adds or changes an option fails here, not in a user's job.
    #[test]
    #[ignore = "needs PyTorch: run scripts/dev/test.sh"]
    fn every_option_of_the_installed_torchrun() {
        let python = std::env::var("TOPORUN_PYTHON")
            .expect("TOPORUN_PYTHON: the venv's python (scripts/dev/test.sh sets it)");
        let script = "from torch.distributed.run import get_args_parser\nfor a in get_args_parser()._actions:\n    if a.option_strings and a.dest != 'help':\n        print(' '.join(a.option_strings), a.nargs == 0, ','.join(a.choices or []))\n";
        let out = std::process::Command::new(python)
            .args(["-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cmd = launch_command("torchrun");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.lines().count() > 25, "{text}");
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let (names, flag, choices) = (
                &parts[..parts.len() - 2],
                parts[parts.len() - 2] == "True",
                parts[parts.len() - 1],
            );
            for name in names {
                let arg = cmd
                    .get_arguments()
                    .find(|a| {
                        name.strip_prefix("--").is_some_and(|l| {
                            a.get_long() == Some(l)
                                || a.get_all_aliases().unwrap_or_default().contains(&l)
                        }) || name.strip_prefix('-').and_then(|c| c.chars().next()) == a.get_short()
                    })
                    .unwrap_or_else(|| panic!("torchrun option {name} missing from toporun"));
                assert_eq!(
                    !arg.get_action().takes_values(),
                    flag,
                    "{name}: flag or value"
                );
                let ours: Vec<String> = arg
                    .get_possible_values()
                    .iter()
                    .map(|v| v.get_name().to_string())
                    .collect();
                assert_eq!(ours.join(","), choices, "{name}: choices");
            }
        }
    }

    #[test]
    fn abbreviations_like_argparse() {
        let set = |args: &[&str]| set_on_command_line(&parse(args).unwrap());
        assert_eq!(set(&["--nnod", "2", "t.py"])[&Opt::Nnodes], "2");
        assert_eq!(set(&["--max-r=3", "t.py"])[&Opt::MaxRestarts], "3");
        let e = parse(&["--nproc", "2", "t.py"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        assert!(
            msg.contains(
                "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"
            ),
            "{msg}"
        );
        // Options after the entrypoint belong to the script.
        let m = parse(&["t.py", "--nproc", "x"]).unwrap();
        let cmd: Vec<&String> = m.get_many::<String>(Extra::Command.id()).unwrap().collect();
        assert_eq!(cmd, ["t.py", "--nproc", "x"]);
    }

    #[test]
    fn unknown_option_and_missing_script_are_usage_errors() {
        assert_eq!(parse(&["--bogus", "t.py"]).unwrap_err().exit_code(), 2);
        assert_eq!(parse(&["--nproc-per-node=2"]).unwrap_err().exit_code(), 2);
    }

    /// Every toporun option (a new one is added here too).
    const EXTRAS: &[Extra] = &[
        Extra::Facts,
        Extra::NvidiaSmiTopo,
        Extra::Format,
        Extra::DryRun,
        Extra::NcclEnv,
        Extra::NcclReport,
        Extra::Colocated,
        Extra::Preflight,
        Extra::PreflightMeasure,
        Extra::FlightRecorder,
        Extra::GpuTiming,
        Extra::StopGrace,
        Extra::StopSignalTo,
        Extra::WatchPreemption,
        Extra::Faulthandler,
        Extra::ReadStderr,
        Extra::ExitCodes,
        Extra::HangTimeout,
        Extra::Stragglers,
        Extra::StragglerWindow,
        Extra::OnHang,
        Extra::StatusPort,
        Extra::TerminationLog,
        Extra::Command,
    ];

    #[test]
    fn every_option_name_is_an_argument_of_the_launch_command() {
        let cmd = launch_command("torchrun");
        let ids: Vec<&str> = cmd.get_arguments().map(|a| a.get_id().as_str()).collect();
        for e in EXTRAS {
            assert!(ids.contains(&e.id()), "{e:?} is no argument");
        }
        for o in OPTIONS {
            assert!(ids.contains(&o.opt.dest()), "{:?} is no argument", o.opt);
        }
        for e in EXTRAS {
            match e.var() {
                Some(var) if *e == Extra::StatusPort => {
                    assert_eq!(var, "TORCHELASTIC_HEALTH_CHECK_PORT")
                }
                Some(var) => assert_eq!(var, format!("TOPORUN_{}", e.id().to_ascii_uppercase())),
                None => {}
            }
        }
    }
}
