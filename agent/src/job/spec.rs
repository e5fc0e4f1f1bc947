//! What the launcher decided before any rank starts (`Job`), a node's place once a
//! round closed (`NodePlace`), and the pure functions that turn both into one rank's
//! GPU, CPUs and environment, shared by the dry run and the launch.

use crate::paths::Root;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toporun_shared::colocation;
use toporun_shared::facts::{Gpu, HostFacts};
use toporun_shared::finding::{Finding, Severity};
use toporun_shared::flight_recorder::RecorderSwitches;
use toporun_shared::plan::Plan;
use toporun_shared::preflight::PreflightOptions;
use toporun_shared::rank_env::{self, AttemptPlaces, NodeRanks, RankSpec, RankSwitches};
use toporun_shared::toporun_vars::ToporunVar;
use toporun_shared::torchrun::worker::{layout, JobEnv, RankPlace};
use toporun_shared::torchrun::{LaunchOptions, OptionsError};
use toporun_shared::user_env::UserEnv;

/// How long every worker's store handshake is waited for before the missing ones are
/// named (seconds; no option of its own).
pub const INIT_WARN_VAR: &str = ToporunVar::InitWarnSecs.name();
/// The secret that moves the rendezvous keys, where `--rdzv-conf token=` sets none.
pub const RDZV_TOKEN_VAR: &str = ToporunVar::RdzvToken.name();

/// Everything a launch decided before starting ranks.
pub struct Job {
    /// The file system the job's probes read (/proc, /sys, cgroups): "/" live.
    pub root: Root,
    pub opts: LaunchOptions,
    pub facts: HostFacts,
    pub nproc: u32,
    pub plan: Plan,
    /// The environment the ranks inherit, as torchrun's workers inherit its own.
    /// toporun's own settings in it (`TOPORUN_*`, `TORCHELASTIC_*`) are read by the
    /// launcher into the typed fields below; here it is only what the ranks will see.
    pub inherited_env: BTreeMap<String, String>,
    pub python: String,
    /// Why that interpreter (printed at start and in the dry run).
    pub python_why: String,
    /// The GPUs CUDA will show the ranks (CUDA_VISIBLE_DEVICES applied), in order.
    pub cuda_gpus: Vec<usize>,
    /// How the ranks are stopped early (a preemption, a signal).
    pub stop: StopSettings,
    /// What a failure leaves for people and Kubernetes.
    pub report: ReportSettings,
    /// What toporun watches while the ranks run.
    pub watch: WatchSettings,
    /// Among the nodes: the rendezvous keys' secret, co-location.
    pub rdzv: RdzvSettings,
    /// `--faulthandler on`: the ranks get PYTHONFAULTHANDLER=1 (a native crash prints
    /// the Python stacks toporun reads).
    pub faulthandler: bool,
    /// `TORCHELASTIC_ENABLE_FILE_TIMER` and `TORCHELASTIC_TIMER_FILE`.
    pub file_timer: FileTimerSetting,
}

/// How the ranks are stopped when an attempt ends early.
#[derive(Debug, Clone, Default)]
pub struct StopSettings {
    /// `--stop-grace`: on a preemption, how long the ranks get after the stop file
    /// before the signal.
    pub grace: std::time::Duration,
    /// `--stop-signal-to group`: the signal goes to each rank's process group.
    pub signal_group: bool,
    /// `--watch-preemption`: where the cloud's preemption notice is polled.
    pub watch_preemption: Option<crate::probe::cloud_metadata::Endpoints>,
    /// `TOPORUN_STOP_FILE`: the user's stop file, where set.
    pub user_file: Option<PathBuf>,
}

impl StopSettings {
    /// The stop file every rank is told of (`TOPORUN_STOP_FILE`): the user's, else
    /// `stop-requested` in the run directory.
    pub fn stop_file(&self, run_dir: &Path) -> PathBuf {
        self.user_file
            .clone()
            .unwrap_or_else(|| run_dir.join("stop-requested"))
    }
}

/// What a failure leaves behind: the exit code, the termination message, the status
/// endpoint, torchrun's error file.
#[derive(Debug, Clone, Default)]
pub struct ReportSettings {
    /// `--exit-codes classified`: one exit code per cause of a failure.
    pub classified: bool,
    /// Where the root cause of a failure goes for Kubernetes (termination message).
    pub termination_log: Option<PathBuf>,
    /// The status endpoint's port (`--status-port`, TORCHELASTIC_HEALTH_CHECK_PORT).
    pub status_port: Option<u16>,
    /// `TORCHELASTIC_ERROR_FILE`: where torchrun's `@record` would write the failure.
    pub error_file: Option<PathBuf>,
}

/// What toporun watches while the ranks run.
#[derive(Debug, Clone, Default)]
pub struct WatchSettings {
    /// `--hang-timeout` and `--on-hang`: when no rank has made progress for this
    /// long, report (and with `stop`, end the job).
    pub hang: Option<HangWatch>,
    /// `--straggler-window`: the window over which each rank's wait share is
    /// judged (None: `--stragglers off`).
    pub straggler_window: Option<std::time::Duration>,
    /// `--nccl-report on|off`.
    pub nccl_report: bool,
    /// `--flight-recorder on`: the ranks' dumps go to the run directory and are read
    /// after a failure or hang.
    pub flight_recorder: bool,
    /// `--gpu-timing on`: NCCL ranks time their collectives and dump their recorder
    /// through a pipe while they train (the GPU straggler rule reads the dumps).
    pub gpu_timing: bool,
    /// `--nccl-profiler`: whether the ranks load toporun's NCCL profiler plugin.
    pub nccl_profiler: toporun_shared::nccl_counters::Profiler,
    /// How the ranks' stderr goes through toporun (their last exception is read).
    pub stderr: crate::supervise::StderrRead,
    /// `TOPORUN_INIT_WARN_SECS`: how long every worker's store handshake is waited
    /// for before the missing ones are named.
    pub init_grace: std::time::Duration,
    /// `TOPORUN_XID_REPLAY`: a file of Xid events followed instead of NVML's.
    pub xid_replay: Option<PathBuf>,
}

/// Among the nodes of a multi-node job.
#[derive(Debug, Clone)]
pub struct RdzvSettings {
    /// `TOPORUN_RDZV_TOKEN`: the secret that moves the rendezvous keys (where
    /// `--rdzv-conf token=` does not set one).
    pub token: Option<String>,
    /// `--colocated join|warn`.
    pub colocated: colocation::Mode,
    /// `--network-check off|report|gate`.
    pub network_check: toporun_shared::network_check::CheckMode,
    /// `--network-check-path`: what carries the check's probes.
    pub network_path: toporun_shared::network_check::PathChoice,
}

/// torch's file timer as the environment asks for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileTimerSetting {
    /// `TORCHELASTIC_ENABLE_FILE_TIMER=1`: toporun serves the timer file.
    pub serve: bool,
    /// `TORCHELASTIC_TIMER_FILE`: its path (passed on to the ranks either way).
    pub path: Option<PathBuf>,
}

/// How hangs are watched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HangWatch {
    pub timeout: std::time::Duration,
    /// `--on-hang stop`: end the job (exit 124) after the report.
    pub stop: bool,
}

/// This node's place once the rendezvous closed.
#[derive(Default)]
pub struct NodePlace {
    pub run_id: String,
    /// The rendezvous round it was placed in.
    pub round: u32,
    pub places: Vec<RankPlace>,
    pub master_addr: String,
    pub master_port: u16,
    pub node_rank: u32,
    pub nnodes: u32,
    /// Variables the round's co-location decision adds to this node's ranks.
    pub extra_env: colocation::NodeEnv,
    /// The network check of the round, where it ran.
    pub network: Option<Box<toporun_shared::network_check::report::NetworkReport>>,
}

impl NodePlace {
    /// The node of a one-node job: node 0 of 1, whatever `--node-rank` says (the
    /// launch runs it so), the workers' store at `store`.
    pub fn one_node(nproc: u32, run_id: String, round: u32, store: (String, u16)) -> NodePlace {
        NodePlace {
            run_id,
            round,
            places: layout(&[nproc], 0),
            master_addr: store.0,
            master_port: store.1,
            node_rank: 0,
            nnodes: 1,
            extra_env: Default::default(),
            network: None,
        }
    }

    /// This node of `nproc` ranks where a closed round placed it.
    pub fn in_round(
        nproc: u32,
        run_id: String,
        place: crate::rendezvous::Place,
        store: (String, u16),
    ) -> NodePlace {
        let places = (0..nproc)
            .map(|l| RankPlace {
                local_rank: l,
                rank: place.offset + l,
                group_rank: place.node_rank,
                local_world_size: nproc,
                world_size: place.world,
                group_world_size: place.nnodes,
            })
            .collect();
        NodePlace {
            run_id,
            round: place.round,
            places,
            master_addr: store.0,
            master_port: store.1,
            node_rank: place.node_rank,
            nnodes: place.nnodes,
            extra_env: place.env,
            network: None,
        }
    }
}

impl Job {
    /// This node's ranks in `node`'s place for attempt `attempt` (rank_env::node_ranks):
    /// `at`, where the attempt's files are; `report`, the NCCL report's variables.
    pub fn node_ranks(
        &self,
        node: &NodePlace,
        (attempt, run_dir): (u32, &Path),
        at: &AttemptPlaces,
        report: &UserEnv,
    ) -> Result<Vec<RankSpec>, OptionsError> {
        let job = self.job_env(node, attempt, run_dir);
        rank_env::node_ranks(&NodeRanks {
            opts: &self.opts,
            python: &self.python,
            planned: self.plan.planned(),
            user: &self.inherited_env,
            switches: self.rank_switches(),
            places: &node.places,
            job: &job,
            node_env: &node.extra_env.vars,
            at,
            report,
            cuda_gpus: &self.cuda_gpus,
            gpus: &self.facts.gpus.devices,
            l3_groups: &self.facts.container.l3_groups,
        })
        .map_err(|e| OptionsError::usage(e.to_string()))
    }

    /// What a process standing in for this node's ranks (the network check's torch
    /// probe) runs with over toporun's environment: the plan's variables where the
    /// user set nothing, as the ranks get them, without the per-rank ones
    /// (torchrun's, the recorder's, the profiler's).
    pub fn stand_in_env(&self) -> toporun_shared::user_env::UserEnv {
        let mut env = self.plan.planned();
        env.retain(|k, _| !self.inherited_env.contains_key(k));
        env
    }

    /// The round's co-location variables for this node's ranks, where the user set
    /// nothing (known once the round closed).
    pub fn node_additions(&self, node: &NodePlace) -> toporun_shared::user_env::UserEnv {
        let mut env = node.extra_env.vars.clone();
        env.retain(|k, _| !self.inherited_env.contains_key(k));
        env
    }

    /// The backend of this node's network-check probe through torch, where
    /// `--network-check-path` asks for one (auto: where the ranks use GPUs), else
    /// why the node measures over TCP.
    pub fn torch_probe_backend(
        &self,
    ) -> Result<crate::network_check::torch_path::TorchBackend, String> {
        use crate::network_check::torch_path::TorchBackend;
        use toporun_shared::network_check::PathChoice;
        let gpus = self.gpu_of(0).is_some();
        match (self.rdzv.network_path, gpus) {
            (PathChoice::Tcp, _) => Err("it was asked to (--network-check-path tcp)".into()),
            (PathChoice::Auto, false) => Err(
                "its ranks do not use GPUs (--network-check-path torch measures through gloo)"
                    .into(),
            ),
            (_, true) => Ok(TorchBackend::Nccl),
            (_, false) => Ok(TorchBackend::Gloo),
        }
    }

    /// The value the ranks will see for an NCCL variable: the user's, else the plan's.
    pub fn rank_value(&self, name: &str) -> Option<String> {
        self.inherited_env.get(name).cloned().or_else(|| {
            self.plan
                .variables
                .iter()
                .find(|v| v.name == name)
                .and_then(|v| v.value.clone())
        })
    }

    /// What is wrong with the host for this launch (warnings and errors): preflight's
    /// checks and the plan's findings on the user's settings.
    pub fn findings(&self) -> Vec<Finding> {
        let mut all: Vec<Finding> =
            toporun_shared::preflight::run(&self.facts, &PreflightOptions::default())
                .into_iter()
                .filter(|f| f.id != toporun_shared::nccl_env_check::ID)
                .collect();
        all.extend(self.plan.findings.iter().cloned());
        all.retain(|f| f.severity >= Severity::Warning);
        all
    }

    /// How the ranks are stopped when an attempt ends early.
    pub fn stop_how(&self) -> crate::supervise::StopHow {
        crate::supervise::StopHow {
            timeout: self.opts.shutdown_timeout,
            grace: self.stop.grace,
            group: self.stop.signal_group,
        }
    }

    /// What the job asks of the ranks' flight recorder.
    pub fn recorder_switches(&self) -> RecorderSwitches {
        let torch = self.ranks_torch();
        RecorderSwitches {
            on: self.watch.flight_recorder,
            gpu_timed: self.watch.gpu_timing
                && self.watch.straggler_window.is_some()
                && self.gpu_of(0).is_some()
                && self.profiler_plugin().is_none()
                && toporun_shared::flight_recorder::pipe_opens(&self.inherited_env, torch),
            torch,
        }
    }

    /// The ranks' torch, where probed.
    pub fn ranks_torch(&self) -> Option<toporun_shared::version::Version> {
        let v = self.facts.platform.torch_version.as_deref();
        v.and_then(toporun_shared::version::Version::parse)
    }

    /// What NCCL will see set: the inherited environment, then NCCL's config files for
    /// the names it leaves unset (NCCL_DEBUG in /etc/nccl.conf is the user's too).
    pub fn nccl_seen_env(&self) -> BTreeMap<String, String> {
        let conf = &self.facts.platform.nccl_conf;
        toporun_shared::user_env::with_nccl_conf(&self.inherited_env, conf)
    }

    /// toporun's NCCL profiler plugin, where the ranks use NCCL (a GPU each) and load it.
    pub fn profiler_plugin(&self) -> Option<&Path> {
        self.gpu_of(0)?;
        self.watch.nccl_profiler.plugin()
    }

    /// Where attempt `attempt`'s NCCL counters go, for the run whose directory is
    /// named `run_name`, `ranks` ranks here; None where the ranks do not load
    /// toporun's plugin.
    pub fn counters_place(
        &self,
        run_name: &str,
        attempt: u32,
        ranks: usize,
    ) -> Option<toporun_shared::nccl_counters::CountersPlace> {
        self.profiler_plugin()?;
        Some(toporun_shared::nccl_counters::CountersPlace::choose(
            self.facts.container.shm.as_ref(),
            &self.root.join(crate::paths::DEV_SHM),
            run_name,
            attempt,
            ranks as u32,
        ))
    }

    /// What the job asks toporun to give every rank (`rank_env::attempt_env`).
    pub fn rank_switches(&self) -> RankSwitches {
        RankSwitches {
            recorder: self.recorder_switches(),
            faulthandler: self.faulthandler,
        }
    }

    /// Where the ranks run their backward: on their own thread without a GPU (DDP
    /// waits for its peers' gradients inside it).
    pub fn backward(&self) -> toporun_shared::stacks::activity::Backward {
        use toporun_shared::stacks::activity::Backward;
        match self.gpu_of(0) {
            Some(_) => Backward::OnDevice,
            None => Backward::OnCaller,
        }
    }

    /// The GPU a local rank uses: the local_rank-th one CUDA shows (ranks beyond the
    /// GPU count share them round-robin).
    pub fn gpu_of(&self, local_rank: u32) -> Option<&Gpu> {
        self.facts.gpus.devices.get(self.cuda_index(local_rank)?)
    }

    /// The index (into the facts' GPUs) of the GPU a local rank uses: ranks beyond
    /// the visible GPUs share them in turn.
    pub fn cuda_index(&self, local_rank: u32) -> Option<usize> {
        toporun_shared::visible_devices::rank_gpu(&self.cuda_gpus, local_rank)
    }

    /// torchrun's per-attempt job values for this node.
    pub fn job_env(&self, node: &NodePlace, attempt: u32, run_dir: &Path) -> JobEnv {
        JobEnv {
            master_addr: node.master_addr.clone(),
            master_port: node.master_port,
            run_id: node.run_id.clone(),
            restart_count: attempt,
            max_restarts: self.opts.max_restarts,
            role: self.opts.role.clone(),
            use_agent_store: true,
            signals: self.opts.signals_to_handle.join(","),
            attempt_dir: run_dir
                .join(format!("attempt_{attempt}"))
                .display()
                .to_string(),
            virtual_local_rank: self.opts.virtual_local_rank,
        }
    }
}
