//! torchrun's options as one table: names, argparse dests, help. The launcher builds
//! its parser from it; `options` resolves the values.

/// torchrun's options by name: the parser, the resolution and PET_<DEST> look
/// them up by this type, so a misspelt option does not compile.
macro_rules! option_names {
    ($($name:ident = $dest:literal),* $(,)?) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Opt {
            $($name),*
        }

        impl Opt {
            pub const ALL: &'static [Opt] = &[$(Opt::$name),*];

            /// argparse's dest: clap's id, and PET_<DEST> upper-cased.
            pub const fn dest(self) -> &'static str {
                match self {
                    $(Opt::$name => $dest),*
                }
            }
        }
    };
}

option_names! {
    Nnodes = "nnodes",
    NprocPerNode = "nproc_per_node",
    RdzvBackend = "rdzv_backend",
    RdzvEndpoint = "rdzv_endpoint",
    RdzvId = "rdzv_id",
    RdzvConf = "rdzv_conf",
    Standalone = "standalone",
    MaxRestarts = "max_restarts",
    MonitorInterval = "monitor_interval",
    StartMethod = "start_method",
    Role = "role",
    Module = "module",
    NoPython = "no_python",
    RunPath = "run_path",
    LogDir = "log_dir",
    Redirects = "redirects",
    Tee = "tee",
    LogLinePrefixTemplate = "log_line_prefix_template",
    LocalRanksFilter = "local_ranks_filter",
    NodeRank = "node_rank",
    MasterAddr = "master_addr",
    MasterPort = "master_port",
    LocalAddr = "local_addr",
    SignalsToHandle = "signals_to_handle",
    NumaBinding = "numa_binding",
    ShutdownTimeout = "shutdown_timeout",
    LogsSpecs = "logs_specs",
    EventLogHandler = "event_log_handler",
    VirtualLocalRank = "virtual_local_rank",
    DuplicateStdoutFilters = "duplicate_stdout_filters",
    DuplicateStderrFilters = "duplicate_stderr_filters",
    PrintCompletion = "print_completion",
}

impl Opt {
    /// The option whose dest is `dest`.
    pub fn from_dest(dest: &str) -> Option<Opt> {
        Opt::ALL.iter().copied().find(|o| o.dest() == dest)
    }

    /// Its PET_<DEST> variable.
    pub fn pet(self) -> String {
        format!("PET_{}", self.dest().to_ascii_uppercase())
    }
}

/// One option: its name (PET_<DEST>), long spellings, short letter, flag or value.
#[derive(Debug, Clone, Copy)]
pub struct OptionDef {
    pub opt: Opt,
    pub longs: &'static [&'static str],
    pub short: Option<char>,
    pub flag: bool,
    pub help: &'static str,
    /// Accepted for compatibility but meaningless outside Python: the word to say.
    pub note: Option<&'static str>,
    /// argparse `choices`: any other value on the command line is a usage error.
    pub choices: &'static [&'static str],
    /// What an unset option means (the resolution reads it here; the help shows it).
    pub default: Option<&'static str>,
}

const fn opt(opt: Opt, longs: &'static [&'static str], help: &'static str) -> OptionDef {
    OptionDef {
        opt,
        longs,
        short: None,
        flag: false,
        help,
        note: None,
        choices: &[],
        default: None,
    }
}

const fn flag(opt: Opt, longs: &'static [&'static str], help: &'static str) -> OptionDef {
    OptionDef {
        opt,
        longs,
        short: None,
        flag: true,
        help,
        note: None,
        choices: &[],
        default: None,
    }
}

const PYTHON_ONLY: &str = "toporun starts workers as separate processes; this torchrun option only affects Python's multiprocessing and is ignored";

/// torchrun's signals forwarded to the ranks.
pub const DEFAULT_SIGNALS: &str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";

/// What an unset option means, from the table.
pub fn default_of(o: Opt) -> Option<&'static str> {
    OPTIONS.iter().find(|d| d.opt == o)?.default
}

pub const OPTIONS: &[OptionDef] = &[
    OptionDef { default: Some("1"), ..opt(Opt::Nnodes, &["nnodes"], "number of nodes, N or MIN:MAX") },
    OptionDef { default: Some("1"), ..opt(Opt::NprocPerNode, &["nproc-per-node", "nproc_per_node"], "ranks per node: a number, gpu, cpu or auto") },
    OptionDef { default: Some("static"), ..opt(Opt::RdzvBackend, &["rdzv-backend", "rdzv_backend"], "rendezvous backend: static or c10d") },
    opt(Opt::RdzvEndpoint, &["rdzv-endpoint", "rdzv_endpoint"], "rendezvous endpoint HOST[:PORT]"),
    opt(Opt::RdzvId, &["rdzv-id", "rdzv_id"], "job id shared by all nodes"),
    opt(Opt::RdzvConf, &["rdzv-conf", "rdzv_conf"], "rendezvous settings k=v,k=v (join_timeout, last_call_timeout, close_timeout, read_timeout, is_host)"),
    flag(Opt::Standalone, &["standalone"], "single node: rendezvous on localhost with a free port and a random id"),
    OptionDef { default: Some("0"), ..opt(Opt::MaxRestarts, &["max-restarts", "max_restarts"], "restarts of all ranks after a failure") },
    opt(Opt::MonitorInterval, &["monitor-interval", "monitor_interval"], "seconds between worker checks (toporun reacts to exits at once)"),
    OptionDef { note: Some(PYTHON_ONLY), choices: &["spawn", "fork", "forkserver"], default: Some("spawn"), ..opt(Opt::StartMethod, &["start-method", "start_method"], "spawn, fork or forkserver") },
    OptionDef { default: Some("default"), ..opt(Opt::Role, &["role"], "worker role name") },
    OptionDef { short: Some('m'), ..flag(Opt::Module, &["module"], "run the entrypoint as python -m") },
    flag(Opt::NoPython, &["no-python", "no_python"], "run the entrypoint directly, not through python"),
    OptionDef { note: Some("toporun runs the entrypoint as `python -u script` (the same as --run-path does for a script path)"), ..flag(Opt::RunPath, &["run-path", "run_path"], "run the entrypoint with runpy.run_path inside the agent") },
    opt(Opt::LogDir, &["log-dir", "log_dir"], "directory for per-rank logs and error files"),
    OptionDef { short: Some('r'), default: Some("0"), ..opt(Opt::Redirects, &["redirects"], "send output to log files: 0 none, 1 stdout, 2 stderr, 3 both, or 0:1,1:2") },
    OptionDef { short: Some('t'), default: Some("0"), ..opt(Opt::Tee, &["tee"], "copy output to log files and the console, same values as --redirects") },
    OptionDef { default: Some("[${role_name}${local_rank}]:"), ..opt(Opt::LogLinePrefixTemplate, &["log-line-prefix-template", "log_line_prefix_template"], "console prefix of each rank's lines: ${role_name}, ${rank}, ${local_rank}; TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE too") },
    opt(Opt::LocalRanksFilter, &["local-ranks-filter", "local_ranks_filter"], "show only these local ranks' output on the console (0,3)"),
    OptionDef { default: Some("0"), ..opt(Opt::NodeRank, &["node-rank", "node_rank"], "this node's rank (static rendezvous)") },
    OptionDef { default: Some("127.0.0.1"), ..opt(Opt::MasterAddr, &["master-addr", "master_addr"], "address of node 0 (static rendezvous)") },
    OptionDef { default: Some("29500"), ..opt(Opt::MasterPort, &["master-port", "master_port"], "port of node 0's store (static rendezvous)") },
    opt(Opt::LocalAddr, &["local-addr", "local_addr"], "address this node advertises"),
    OptionDef { default: Some(DEFAULT_SIGNALS), ..opt(Opt::SignalsToHandle, &["signals-to-handle", "signals_to_handle"], "signals forwarded to the ranks") },
    OptionDef { choices: &["node", "socket", "exclusive", "core-complex"], ..opt(Opt::NumaBinding, &["numa-binding", "numa_binding"], "bind ranks' CPUs to their GPU: node, socket, exclusive, core-complex (one L3 cache domain)") },
    OptionDef { default: Some("30"), ..opt(Opt::ShutdownTimeout, &["shutdown-timeout", "shutdown_timeout"], "seconds between the stop signal and SIGKILL") },
    opt(Opt::LogsSpecs, &["logs-specs", "logs_specs"], "a torchrun.logs_specs entry point name (the default layout is toporun's own)"),
    OptionDef { note: Some(PYTHON_ONLY), ..opt(Opt::EventLogHandler, &["event-log-handler", "event_log_handler"], "a Python event handler") },
    flag(Opt::VirtualLocalRank, &["virtual-local-rank", "virtual_local_rank"], "every rank sees only its own GPU: LOCAL_RANK=0, CUDA_VISIBLE_DEVICES its device"),
    opt(Opt::DuplicateStdoutFilters, &["duplicate-stdout-filters", "duplicate_stdout_filters"], "the tee'd stdout lines containing any of these comma-separated strings (,, for a comma) also go to attempt_N/filtered_stdout.log"),
    opt(Opt::DuplicateStderrFilters, &["duplicate-stderr-filters", "duplicate_stderr_filters"], "the tee'd stderr lines containing any of these comma-separated strings (,, for a comma) also go to attempt_N/filtered_stderr.log"),
    OptionDef { choices: &["bash", "zsh", "tcsh"], ..opt(Opt::PrintCompletion, &["print-completion", "print_completion"], "print a completion script for this shell and exit") },
];
