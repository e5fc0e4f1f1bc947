//! toporun's own launch options, each declared once (beside torchrun's, which the
//! shared option table declares): its id, `--long` name, variable, how it takes a
//! value, its default and help. The parser, `launch --help` (`[env: NAME] [default:
//! VALUE]`) and the launch's lookups (`Extra::id`, `Extra::var`) read these rows.
//!
//! The variables are read by the launch (`launch::option_or_env`), not by clap's `env`:
//! a variable set to the empty string counts as unset (a pod spec's `value: ""`), and a
//! bad value is named as the user wrote it (`TOPORUN_HANG_TIMEOUT=0`), which clap's own
//! reading does not do.

use crate::subcommands::{
    ColocatedChoice, DryRunFormat, ExitCodesChoice, NetworkCheckChoice, NetworkPathChoice, OnHang,
    OnOff, PreflightChoice, StopSignalTo,
};
use clap::builder::{EnumValueParser, ValueParser};
use clap::{Arg, ArgAction, Command};
use toporun_shared::root_cause::exit_codes::{HANG, TABLE};
use toporun_shared::toporun_vars::ToporunVar;

/// How an option takes its value.
#[derive(Clone, Copy)]
pub enum Takes {
    /// A switch (its variable true as torch reads one).
    Flag,
    /// One of a typed enum's values, and clap's default.
    Choice(fn() -> ValueParser, &'static str),
    /// A value named so; the default the help shows, where unset means it.
    Value(&'static str, Option<&'static str>),
    /// A port number.
    Port,
    /// The entrypoint and its arguments.
    Entrypoint,
    /// Declared with toporun's subcommands (`subcommands::Globals`), global to all.
    Global,
}

/// An option's help: fixed, or made from a table (the exit codes).
#[derive(Clone, Copy)]
pub enum Help {
    Text(&'static str),
    Made(fn() -> String),
}

/// One option's row.
pub struct ExtraDef {
    pub extra: Extra,
    /// Its clap id (what the launch looks it up by).
    pub id: &'static str,
    pub long: &'static str,
    pub var: Option<&'static str>,
    pub takes: Takes,
    pub help: Help,
}

/// The enum and its rows from one list: a variant cannot lack a row.
macro_rules! extra_options {
    ($($variant:ident => ($id:literal, $long:literal, $var:expr, $takes:expr, $help:expr),)+) => {
        /// toporun's own launch options, beside torchrun's [`toporun_shared::torchrun::Opt`]:
        /// the parser and the launch look them up by this type, so a misspelt option
        /// does not compile.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Extra {
            $($variant,)+
        }

        /// Every option's row, in the order `launch --help` shows them.
        pub const EXTRA_OPTIONS: &[ExtraDef] = &[
            $(ExtraDef { extra: Extra::$variant, id: $id, long: $long, var: $var, takes: $takes, help: $help },)+
        ];
    };
}

fn on_off() -> ValueParser {
    EnumValueParser::<OnOff>::new().into()
}

const fn var(v: ToporunVar) -> Option<&'static str> {
    Some(v.name())
}

extra_options! {
    DryRun => ("dry_run", "dry-run", None, Takes::Flag, Help::Text("print the plan and every rank's environment and command; start nothing")),
    Format => ("format", "format", None, Takes::Choice(|| EnumValueParser::<DryRunFormat>::new().into(), "text"), Help::Text("output format of --dry-run")),
    NcclEnv => ("nccl_env", "nccl-env", None, Takes::Choice(on_off, "on"), Help::Text("off: plan no NCCL variable, keep the environment as is")),
    NcclReport => ("nccl_report", "nccl-report", var(ToporunVar::NcclReport), Takes::Choice(on_off, "on"), Help::Text("on: NCCL writes its init to per-rank files in the run directory (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT, NCCL_DEBUG_FILE; never over your own NCCL_DEBUG*) and toporun reports which transport NCCL chose between which ranks; off: torchrun's behaviour")),
    Colocated => ("colocated", "colocated", var(ToporunVar::Colocated), Takes::Choice(|| EnumValueParser::<ColocatedChoice>::new().into(), "join"), Help::Text("nodes of this job on one physical host sharing /dev/shm: join them onto one NCCL host (same NCCL_HOSTID, NCCL_CUMEM_ENABLE=0 across network namespaces) or only warn")),
    NetworkCheck => ("network_check", "network-check", var(ToporunVar::NetworkCheck), Takes::Choice(|| EnumValueParser::<NetworkCheckChoice>::new().into(), "report"), Help::Text("jobs of two or more nodes: after each rendezvous round, before the ranks start, the nodes measure the paths between them (through the ranks' torch and NCCL on GPUs, else TCP between the agents: --network-check-path; two probe rounds: docs/network-check.md); report names a node whose paths fall well below the others' or its interface's, with host, address and figures; gate also refuses it (a spare or the remaining nodes go on where --nnodes allows, else every node exits 82); off measures nothing")),
    NetworkCheckPath => ("network_check_path", "network-check-path", var(ToporunVar::NetworkCheckPath), Takes::Choice(|| EnumValueParser::<NetworkPathChoice>::new().into(), "auto"), Help::Text("what carries the network check's probes: auto measures through the ranks' torch where they use GPUs (one process per node, torch.distributed send and receive: NCCL over the job's own transport, IB, EFA or sockets), else TCP between the agents; torch also measures a CPU job through gloo; tcp always between the agents. A node whose torch cannot start makes the round fall back to TCP")),
    Preflight => ("preflight", "preflight", var(ToporunVar::Preflight), Takes::Choice(|| EnumValueParser::<PreflightChoice>::new().into(), "warn"), Help::Text("check the host before starting ranks: warn prints the findings and starts them as torchrun would; gate stops the launch (exit 3, nothing started) when a finding is certain to break the job; off checks nothing")),
    PreflightMeasure => ("preflight_measure", "preflight-measure", var(ToporunVar::PreflightMeasure), Takes::Flag, Help::Text("the preflight also measures every GPU link (as `toporun preflight --measure`) before ranks start; slow links are warnings")),
    FlightRecorder => ("flight_recorder", "flight-recorder", var(ToporunVar::FlightRecorder), Takes::Choice(on_off, "on"), Help::Text("on: the ranks' PyTorch flight-recorder dumps go to the run directory (TORCH_FR_DUMP_TEMP_FILE, unless set), and after a failure or hang toporun matches them across ranks; off: torchrun's environment")),
    GpuTiming => ("gpu_timing", "gpu-timing", var(ToporunVar::GpuTiming), Takes::Choice(on_off, "on"), Help::Text("on: NCCL ranks time their collectives on the GPU (TORCH_NCCL_ENABLE_TIMING) and dump their flight recorder through a pipe every window/12 s, so a rank slow on its GPU is named and slow links are said (no step-time cost measured on 2x H200: docs/stragglers.md); off: no timing, no dumps; your own TORCH_NCCL_* values are kept")),
    NcclProfiler => ("nccl_profiler", "nccl-profiler", var(ToporunVar::NcclProfiler), Takes::Choice(on_off, "on"), Help::Text("on: every NCCL rank loads toporun's profiler plugin (NCCL_PROFILER_PLUGIN, installed beside toporun) and counts its operations posted and completed on the GPU, so a rank that never posts the collective the others wait in is named as busy or stuck, and GPU stragglers and slow links come without flight-recorder dumps; your own NCCL_PROFILER_PLUGIN wins; off: stacks and dumps, as --gpu-timing says (docs/nccl-profiler.md)")),
    Faulthandler => ("faulthandler", "faulthandler", var(ToporunVar::Faulthandler), Takes::Choice(on_off, "on"), Help::Text("on: the ranks get PYTHONFAULTHANDLER=1 (unless set), so a native crash (SIGSEGV, SIGABRT...) prints every thread's Python stack and toporun names the function it struck in; off: torchrun's environment")),
    ReadStderr => ("read_stderr", "read-stderr", var(ToporunVar::ReadStderr), Takes::Choice(on_off, "on"), Help::Text("on: the ranks' stderr passes through toporun byte for byte (on a terminal, through a pseudo-terminal per rank: colours and progress bars kept), so a failure names the rank's last Python exception and a full /dev/shm; off: inherited, as torchrun")),
    ExitCodes => ("exit_codes", "exit-codes", var(ToporunVar::ExitCodes), Takes::Choice(|| EnumValueParser::<ExitCodesChoice>::new().into(), "torchrun"), Help::Made(exit_codes_help)),
    HangTimeout => ("hang_timeout", "hang-timeout", var(ToporunVar::HangTimeout), Takes::Value("SECONDS", Some("300: a report, below the process group's 10-minute timeout")), Help::Text("report a hang when no rank has made progress (its Python frames and lines unchanged, nothing written) for this long: every rank's stack, the odd ones first; it must exceed the longest blocking step, such as a checkpoint write; a rank that left while the others wait, or NCCL's watchdog timing a collective out, is reported sooner; `off`: no hang watch")),
    Stragglers => ("stragglers", "stragglers", var(ToporunVar::Stragglers), Takes::Choice(on_off, "on"), Help::Text("on: from the stack samples, each rank's share of time waiting in collectives over a window; the rank that waits far less than the others (the one they wait for) is named with what it spends its time on, and shown by `toporun top`")),
    StragglerWindow => ("straggler_window", "straggler-window", var(ToporunVar::StragglerWindow), Takes::Value("SECONDS", Some("60")), Help::Text("the window over which wait shares are compared, at least 15")),
    OnHang => ("on_hang", "on-hang", var(ToporunVar::OnHang), Takes::Choice(|| EnumValueParser::<OnHang>::new().into(), "report"), Help::Made(on_hang_help)),
    // torchrun reads and ignores it; toporun serves the port it names.
    StatusPort => ("status_port", "status-port", Some("TORCHELASTIC_HEALTH_CHECK_PORT"), Takes::Port, Help::Text("serve /healthz, /readyz, /metrics (Prometheus) and /status (JSON) on this port")),
    TerminationLog => ("termination_log", "termination-log", var(ToporunVar::TerminationLog), Takes::Value("PATH", Some("/dev/termination-log when present")), Help::Text("where the root cause of a failure goes, at most 4096 bytes, for Kubernetes to show")),
    StopGrace => ("stop_grace", "stop-grace", var(ToporunVar::StopGrace), Takes::Value("SECONDS", Some("0: at once, as torchrun")), Help::Text("on a preemption (a handled signal on any node), how long the ranks get after the stop file (TOPORUN_STOP_FILE) appears before the signal is forwarded; the shutdown deadline still bounds it")),
    StopSignalTo => ("stop_signal_to", "stop-signal-to", var(ToporunVar::StopSignalTo), Takes::Choice(|| EnumValueParser::<StopSignalTo>::new().into(), "rank"), Help::Text("rank: a stop signal goes to each rank's main process, so its DataLoader workers keep serving it until it exits; group: to its whole process group, as torchrun sends it")),
    WatchPreemption => ("watch_preemption", "watch-preemption", var(ToporunVar::WatchPreemption), Takes::Flag, Help::Text("poll the cloud's instance metadata every 2 s for a preemption notice (AWS spot instance-action, GCP instance/preempted, Azure Scheduled Events Preempt) and stop the job as on a SIGTERM when one comes")),
    Command => ("command", "", None, Takes::Entrypoint, Help::Text("the training script and its arguments (a module with -m, a program with --no-python); options go before it")),
    Facts => ("facts", "facts", None, Takes::Global, Help::Text("")),
    NvidiaSmiTopo => ("nvidia_smi_topo", "nvidia-smi-topo", None, Takes::Global, Help::Text("")),
}

impl Extra {
    fn def(self) -> &'static ExtraDef {
        EXTRA_OPTIONS
            .iter()
            .find(|d| d.extra == self)
            .expect("the macro gives every variant a row")
    }

    /// Its clap id.
    pub fn id(self) -> &'static str {
        self.def().id
    }

    /// The variable a manifest sets it with, where it has one.
    pub fn var(self) -> Option<&'static str> {
        self.def().var
    }
}

/// `--exit-codes`' help, every class from the one table the launch exits by.
fn exit_codes_help() -> String {
    let classes: Vec<String> = TABLE
        .iter()
        .map(|c| format!("{} {}", c.code, c.what))
        .collect();
    format!(
        "torchrun: torchrun's exit codes; classified: one per cause of a failure, for a podFailurePolicy ({})",
        classes.join("; ")
    )
}

fn on_hang_help() -> String {
    format!(
        "after a hang report: report keeps the job running; stop ends it (exit {})",
        HANG.code
    )
}

impl ExtraDef {
    /// Its help: what it does, then its variable and, where clap shows none (no
    /// `default_value`), its default: `[env: NAME] [default: VALUE]`, as torchrun's
    /// options show theirs.
    fn help_text(&self) -> String {
        let mut s = match self.help {
            Help::Text(t) => t.to_string(),
            Help::Made(f) => f(),
        };
        if let Some(v) = self.var {
            s.push_str(&format!(" [env: {v}]"));
        }
        if let Takes::Value(_, Some(d)) = self.takes {
            s.push_str(&format!(" [default: {d}]"));
        }
        s
    }

    /// Its clap argument (None: declared elsewhere).
    fn arg(&self) -> Option<Arg> {
        let arg = Arg::new(self.id).help(self.help_text());
        Some(match self.takes {
            Takes::Global => return None,
            Takes::Entrypoint => arg
                .value_name("ENTRYPOINT [ARGS]")
                .num_args(1..)
                .trailing_var_arg(true)
                .allow_hyphen_values(true)
                .required(true),
            Takes::Flag => arg.long(self.long).action(ArgAction::SetTrue),
            Takes::Choice(parser, default) => arg
                .long(self.long)
                .value_parser(parser())
                .default_value(default),
            Takes::Value(name, _) => arg.long(self.long).value_name(name),
            Takes::Port => arg
                .long(self.long)
                .value_name("PORT")
                .value_parser(clap::value_parser!(u16)),
        })
    }
}

/// toporun's launch options, after torchrun's.
pub fn toporun_args(mut cmd: Command) -> Command {
    for d in EXTRA_OPTIONS {
        if let Some(a) = d.arg() {
            cmd = cmd.arg(a);
        }
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_the_long_names_and_variables_toporuns() {
        for d in EXTRA_OPTIONS {
            if !d.long.is_empty() {
                assert_eq!(d.id, d.long.replace('-', "_"), "{:?}", d.extra);
            }
            match d.var {
                Some(v) if d.extra == Extra::StatusPort => {
                    assert_eq!(v, "TORCHELASTIC_HEALTH_CHECK_PORT")
                }
                Some(v) => assert_eq!(v, format!("TOPORUN_{}", d.id.to_ascii_uppercase())),
                None => {}
            }
        }
    }

    #[test]
    fn the_help_says_the_variable_then_the_default() {
        let h = Extra::StragglerWindow.def().help_text();
        assert!(
            h.ends_with("at least 15 [env: TOPORUN_STRAGGLER_WINDOW] [default: 60]"),
            "{h}"
        );
        let codes = Extra::ExitCodes.def().help_text();
        for c in TABLE {
            assert!(codes.contains(&format!("{} {}", c.code, c.what)), "{codes}");
        }
    }
}
