//! toporun's own subcommands (probe, topo, preflight, nccl-log, bench) as typed
//! arguments with clap's derive: every choice is an enum next to its definition, and
//! `TOPORUN_*` switches come through clap's `env`. The launch keeps the builder in
//! `cli.rs`, made from the shared torchrun option table.

use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use toporun_shared::preflight::Requirement;
use toporun_shared::toporun_vars::ToporunVar;

/// A yes/no from the environment by torch's rule (`flags::torch_bool`).
fn torch_bool() -> impl TypedValueParser<Value = bool> {
    clap::builder::NonEmptyStringValueParser::new().try_map(|v| {
        toporun_shared::flags::torch_bool(&v)
            .ok_or_else(|| format!("{v:?}: expected 1/true/yes or 0/false/no"))
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
}

/// `launch --dry-run --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DryRunFormat {
    Text,
    /// sourceable
    Shell,
    /// docker --env-file / ConfigMap ready
    Env,
    Json,
}

impl DryRunFormat {
    pub fn name(self) -> &'static str {
        match self {
            DryRunFormat::Text => "text",
            DryRunFormat::Shell => "shell",
            DryRunFormat::Env => "env",
            DryRunFormat::Json => "json",
        }
    }
}

/// `--preflight` / `TOPORUN_PREFLIGHT` of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PreflightChoice {
    Warn,
    Off,
    Gate,
}

/// `--nccl-report` / `TOPORUN_NCCL_REPORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// `--stop-signal-to` / `TOPORUN_STOP_SIGNAL_TO`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StopSignalTo {
    /// Each rank's main process: its DataLoader workers keep serving it.
    Rank,
    /// Each rank's whole process group, as torchrun signals it.
    Group,
}

/// `--exit-codes` / `TOPORUN_EXIT_CODES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExitCodesChoice {
    /// torchrun's: 1 for any rank failure
    Torchrun,
    /// one code per cause's class (the codes: --exit-codes's help, from the exit-code table)
    Classified,
}

/// `--on-hang` / `TOPORUN_ON_HANG`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnHang {
    /// print every rank's stack and name the odd ones; the job goes on
    Report,
    /// report, then end the job (exit code: the hang class)
    Stop,
}

/// `--network-check` / `TOPORUN_NETWORK_CHECK`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NetworkCheckChoice {
    Off,
    Report,
    Gate,
}

/// `--network-check-path` / `TOPORUN_NETWORK_CHECK_PATH`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NetworkPathChoice {
    Auto,
    Torch,
    Tcp,
}

/// `--colocated` / `TOPORUN_COLOCATED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ColocatedChoice {
    Join,
    Warn,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PreflightFormat {
    Text,
    Json,
    Junit,
}

/// What `--require` makes an error when absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Required {
    Nvlink,
    Rdma,
    Efa,
}

impl From<Required> for Requirement {
    fn from(r: Required) -> Requirement {
        match r {
            Required::Nvlink => Requirement::Nvlink,
            Required::Rdma => Requirement::Rdma,
            Required::Efa => Requirement::Efa,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchBackend {
    /// a TCPStore (toporun's, started in a separate process unless --endpoint names one)
    Store,
    /// the etcd cluster at --endpoint
    Etcd,
}

/// Options every subcommand takes.
#[derive(Args, Debug, Clone, Default)]
pub struct Globals {
    /// use a captured facts file (toporun probe --format json) instead of probing
    #[arg(long, global = true, value_name = "FILE")]
    pub facts: Option<String>,
    /// take GPU links from a `nvidia-smi topo -m` capture
    #[arg(long = "nvidia-smi-topo", global = true, value_name = "FILE")]
    pub nvidia_smi_topo: Option<String>,
}

/// Skips the cloud's metadata service.
#[derive(Args, Debug, Clone)]
pub struct Metadata {
    /// do not ask the cloud's metadata service (AWS IMDSv2, GCP, Azure; at most 300 ms, silent off-cloud) for the instance type
    #[arg(long = "no-metadata", env = ToporunVar::NoMetadata.name(), value_parser = torch_bool(), num_args = 0, default_missing_value = "true", default_value = "false")]
    pub no_metadata: bool,
}

#[derive(Parser, Debug)]
#[command(
    name = "toporun",
    version = env!("CARGO_PKG_VERSION"),
    about = "A torchrun-compatible launcher that knows the GPU host and the container it runs in.\n\n`toporun [torchrun options] ENTRYPOINT [ARGS]` launches like torchrun.",
    subcommand_required = true,
    arg_required_else_help = true,
    override_usage = "toporun [torchrun options] ENTRYPOINT [ARGS]...   (launch, exactly like torchrun)\n       toporun [--facts FILE] <COMMAND>"
)]
pub struct Cli {
    #[command(flatten)]
    pub globals: Globals,
    #[command(subcommand)]
    pub command: Sub,
}

#[derive(Subcommand, Debug)]
pub enum Sub {
    /// Print the host facts toporun sees
    Probe {
        #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
        format: ReportFormat,
        #[command(flatten)]
        metadata: Metadata,
    },
    /// The GPU link matrix as nvidia-smi shows it, with P2P status, NICs and RDMA devices
    Topo {
        #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
        format: ReportFormat,
    },
    /// Check that this container is fit for distributed training; exit 1 on any error finding
    Preflight(PreflightArgs),
    /// Read NCCL INFO logs: the transport between ranks, and known failures with their fix
    ///
    /// Read NCCL INFO logs (files, or - for stdin): per communicator the ranks, nodes and the transport between ranks, whether each is the best the hardware allows (given --facts or --nvidia-smi-topo), and known failures with their fix. Exit 0 all best, 1 something is not or a failure was found, 2 nothing readable
    #[command(name = "nccl-log")]
    NcclLog {
        #[arg(value_name = "FILE", required = true, num_args = 1..)]
        files: Vec<String>,
        #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
        format: ReportFormat,
    },
    /// Every rank's Python stack of the job running here, the odd ones first
    ///
    /// Every rank's Python stack (frames only) of the job running here, grouped with the odd ones first: asks the running launcher (as from `kubectl exec`). Without RUN_DIR, finds the job running in this container
    Stacks {
        /// the job's run directory (its --log-dir run, or torchelastic_*/<run id>_* under $TMPDIR)
        #[arg(value_name = "RUN_DIR")]
        run_dir: Option<String>,
        #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
        format: ReportFormat,
    },
    /// One row per rank of the running job: activity, wait share, CPU, GPU; the straggler marked
    ///
    /// One row per rank of the job running here (the whole job's where the store's host publishes them), refreshed each second: what it does now, its share of time waiting in collectives over the straggler window, CPU, memory, GPU utilisation, SM clock and clock limits; the straggler marked. Asks the running launcher, as `toporun stacks`
    Top {
        /// the job's run directory (its --log-dir run, or torchelastic_*/<run id>_* under $TMPDIR)
        #[arg(value_name = "RUN_DIR")]
        run_dir: Option<String>,
        #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
        format: ReportFormat,
        /// print the table once and exit (always so with --format json)
        #[arg(long)]
        once: bool,
    },
    /// Match PyTorch flight-recorder dumps across ranks: the collective some ranks never entered
    ///
    /// Match PyTorch flight-recorder dumps across ranks (files, or directories of <prefix><rank> files): the collective some ranks never entered, which ranks, and what each last completed; or the rank whose sizes or dtypes differ. Exit 0 the ranks agree, 1 a rank is named, 2 nothing readable
    #[command(name = "fr-trace")]
    FrTrace {
        #[arg(value_name = "FILE|DIR", required = true, num_args = 1..)]
        paths: Vec<String>,
        #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
        format: ReportFormat,
    },
    /// Benchmarks for sizing a deployment
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(Args, Debug)]
pub struct PreflightArgs {
    /// output format
    #[arg(long, value_enum, default_value_t = PreflightFormat::Text)]
    pub format: PreflightFormat,
    /// error when fewer GPUs are visible
    #[arg(long = "expect-gpus", value_name = "N")]
    pub expect_gpus: Option<u32>,
    /// smallest acceptable /dev/shm (16Gi, 1G, bytes) [default: 1Gi]
    #[arg(long = "min-shm", value_name = "SIZE")]
    pub min_shm: Option<String>,
    /// make these an error when absent
    #[arg(long, value_enum, value_delimiter = ',')]
    pub require: Vec<Required>,
    /// also measure copy bandwidth between every GPU pair (both directions) and between each GPU and pinned host memory near it, through the CUDA driver, and compare each link with its class (a few hundred ms on 8 GPUs; skipped with a note where there is no driver)
    #[arg(long)]
    pub measure: bool,
    #[command(flatten)]
    pub metadata: Metadata,
}

#[derive(Subcommand, Debug)]
pub enum Bench {
    /// N simulated nodes join a store or etcd: the time to a complete rendezvous
    ///
    /// N simulated nodes run the real join protocol against a store or etcd; prints the time to a complete rendezvous and the operation rate
    Rendezvous {
        /// simulated nodes
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        nodes: u32,
        #[arg(long, value_enum, default_value_t = BenchBackend::Store)]
        backend: BenchBackend,
        /// store: an existing TCPStore (toporun's or PyTorch's); etcd: its client endpoints, comma-separated
        #[arg(long, value_name = "HOST:PORT[,...]")]
        endpoint: Option<String>,
        /// seconds (at most 30 days, as every timeout of a launch)
        #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=2_592_000))]
        timeout: u64,
        #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
        format: ReportFormat,
        /// store backend: the store runs inside this process instead of a server of its own (the protocol's cost alone, no socket between processes)
        #[arg(long, conflicts_with = "endpoint")]
        in_process: bool,
    },
    /// Times reading N Python processes' stacks and the sampler's CPU
    ///
    /// Starts N Python processes and times reading their stacks: the first capture (attaching), a later one, and the CPU toporun spends sampling them at the hang watcher's interval, alone and with the straggler tracker fed at each sample
    Stacks {
        /// the Python to start (a virtualenv's, as the ranks use)
        #[arg(long, default_value = "python3")]
        python: String,
        /// processes, as the ranks of one node
        #[arg(long, default_value_t = 8)]
        ranks: u32,
        /// seconds of sampling for the CPU figure
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// sampling interval in milliseconds (1000 without --hang-timeout)
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
    },
    /// Serves a toporun store on a free loopback port, prints the port, and exits when stdin closes
    #[command(name = "store-server", hide = true)]
    StoreServer,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_derived_parser_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn choices_and_globals_parse_into_types() {
        let cli = Cli::try_parse_from([
            "toporun",
            "preflight",
            "--facts",
            "f.json",
            "--format",
            "junit",
            "--require",
            "nvlink,efa",
        ])
        .unwrap();
        assert_eq!(cli.globals.facts.as_deref(), Some("f.json"));
        let Sub::Preflight(p) = cli.command else {
            panic!()
        };
        assert_eq!(p.format, PreflightFormat::Junit);
        assert_eq!(p.require, vec![Required::Nvlink, Required::Efa]);
        assert!(!p.metadata.no_metadata);
        assert!(Cli::try_parse_from(["toporun", "topo", "--format", "xml"]).is_err());
    }

    #[test]
    fn no_metadata_is_a_flag() {
        let cli = Cli::try_parse_from(["toporun", "probe", "--no-metadata"]).unwrap();
        let Sub::Probe { metadata, .. } = cli.command else {
            panic!()
        };
        assert!(metadata.no_metadata);
    }
}
