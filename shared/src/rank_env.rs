//! This node's ranks, in one place and without I/O: each rank's argv, whole
//! environment, CPUs and GPU ([`node_ranks`]). The launch and the dry run call it
//! alike (the dry run with placeholder paths), and the launch makes the directories
//! it names beforehand.
//! Layers, each applied where the user set nothing: the NCCL plan, toporun's
//! additions (the NCCL report's capture, the file timer, the flight recorder, the
//! stop file, faulthandler, co-location, the NCCL profiler plugin), then torchrun's
//! own variables.

use crate::cpu_binding::{cpus_for, TooFewCpus};
use crate::facts::Gpu;
use crate::flight_recorder::{recorder_vars, RecorderSwitches};
use crate::nccl_counters::{profiler_vars, PluginPlaces};
use crate::toporun_vars::ToporunVar;
use crate::torchrun::worker::{worker_argv, worker_env, JobEnv, RankPlace};
use crate::torchrun::LaunchOptions;
use crate::user_env::UserEnv;
use crate::visible_devices::rank_gpu;
use std::path::{Path, PathBuf};

/// torch's file timer: the file the ranks' FileTimerClient writes to.
pub const TIMER_FILE_VAR: &str = "TORCHELASTIC_TIMER_FILE";

/// Where an attempt's files are, as the ranks' variables name them.
pub struct AttemptPlaces<'a> {
    pub attempt_dir: &'a Path,
    /// The file the ranks watch for a stop request (`TOPORUN_STOP_FILE`).
    pub stop_file: &'a Path,
    /// The file timer's file, where toporun serves one.
    pub timer_file: Option<String>,
    /// XDG_CACHE_HOME for the ranks, where their cache root cannot be written.
    pub cache_home: Option<PathBuf>,
    /// toporun's NCCL profiler plugin and the counters' directory, where the ranks
    /// load it.
    pub profiler: Option<PluginPlaces<'a>>,
}

/// What the job asks toporun to give every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankSwitches {
    pub recorder: RecorderSwitches,
    /// PYTHONFAULTHANDLER=1: costs nothing until a crash, then gives its stacks.
    pub faulthandler: bool,
}

/// What every rank of the attempt gets from toporun besides the plan: `report` (the
/// NCCL report's capture), the file timer, the flight recorder's settings, the stop
/// file, the diagnostics. The user's own values win later, in `rank_env`.
pub fn attempt_env(
    user: &UserEnv,
    sw: RankSwitches,
    at: &AttemptPlaces,
    report: &UserEnv,
) -> UserEnv {
    let mut env = report.clone();
    if let Some(f) = &at.timer_file {
        env.insert(TIMER_FILE_VAR.into(), f.clone());
    }
    let recorder = recorder_vars(user, sw.recorder, at.attempt_dir);
    if let (false, Some(cache)) = (recorder.is_empty(), &at.cache_home) {
        env.insert("XDG_CACHE_HOME".into(), cache.display().to_string());
    }
    env.extend(recorder);
    let stop = at.stop_file.display().to_string();
    env.insert(ToporunVar::StopFile.name().into(), stop);
    if sw.faulthandler {
        env.insert("PYTHONFAULTHANDLER".into(), "1".into());
    }
    env
}

/// What one rank gets on top of the environment it inherits: the plan, then
/// toporun's additions where the user set nothing, then torchrun's own.
pub fn rank_env(
    planned: UserEnv,
    user: &UserEnv,
    additions: &[&UserEnv],
    place: &RankPlace,
    job: &JobEnv,
) -> UserEnv {
    let mut env = planned;
    for (k, v) in additions.iter().flat_map(|m| m.iter()) {
        if !user.contains_key(k) {
            env.insert(k.clone(), v.clone());
        }
    }
    env.extend(worker_env(place, job, user));
    env
}

/// What makes this node's ranks: the options, the plan, what the user set, where the
/// node stands (`places`, `job`, `node_env`: the co-location decision's variables) and
/// the attempt (`at`, `report`: the NCCL report's capture), the GPUs CUDA shows.
pub struct NodeRanks<'a> {
    pub opts: &'a LaunchOptions,
    pub python: &'a str,
    pub planned: UserEnv,
    pub user: &'a UserEnv,
    pub switches: RankSwitches,
    pub places: &'a [RankPlace],
    pub job: &'a JobEnv,
    pub node_env: &'a UserEnv,
    pub at: &'a AttemptPlaces<'a>,
    pub report: &'a UserEnv,
    /// The GPUs the ranks use in turn (indices into `gpus`: CUDA_VISIBLE_DEVICES').
    pub cuda_gpus: &'a [usize],
    pub gpus: &'a [Gpu],
    /// CPUs sharing an L3 cache (`--numa-binding=exclusive`'s core complexes).
    pub l3_groups: &'a [Vec<u32>],
}

/// One rank as it will be started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankSpec {
    pub place: RankPlace,
    pub argv: Vec<String>,
    pub env: UserEnv,
    /// The CPUs `--numa-binding` pins it to (None: no binding).
    pub cpus: Option<Vec<u32>>,
    /// Its GPU, an index into the facts' GPUs.
    pub gpu: Option<usize>,
}

/// This node's ranks: each one's argv, environment (the plan, then co-location's
/// variables and toporun's additions where the user set nothing, then torchrun's
/// own), CPUs and GPU.
pub fn node_ranks(n: &NodeRanks) -> Result<Vec<RankSpec>, TooFewCpus> {
    let extras = attempt_env(n.user, n.switches, n.at, n.report);
    let gpu = |l: u32| rank_gpu(n.cuda_gpus, l);
    let affinity: Vec<Vec<u32>> = (0..n.places.len() as u32)
        .map(|l| {
            gpu(l)
                .and_then(|i| n.gpus.get(i))
                .map(|g| g.cpu_affinity.clone())
                .unwrap_or_default()
        })
        .collect();
    n.places
        .iter()
        .map(|p| {
            let l = p.local_rank;
            let profiler = profiler_vars(n.at.profiler, p.rank);
            let additions = [n.node_env, &extras, &profiler];
            Ok(RankSpec {
                place: p.clone(),
                argv: worker_argv(n.opts, n.python, l),
                env: rank_env(n.planned.clone(), n.user, &additions, p, n.job),
                cpus: cpus_for(n.opts.numa_binding, &affinity, n.l3_groups, l as usize)?,
                gpu: gpu(l),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torchrun::worker::layout;

    use crate::user_env::env_of as env;

    fn switches(recorder: bool, faulthandler: bool) -> RankSwitches {
        RankSwitches {
            recorder: RecorderSwitches {
                on: recorder,
                gpu_timed: false,
                torch: None,
            },
            faulthandler,
        }
    }

    fn places_at(cache_home: Option<PathBuf>) -> AttemptPlaces<'static> {
        AttemptPlaces {
            attempt_dir: Path::new("/run/attempt_1"),
            stop_file: Path::new("/run/stop-requested"),
            timer_file: Some("/tmp/timer".into()),
            cache_home,
            profiler: None,
        }
    }

    fn job() -> JobEnv {
        JobEnv {
            master_addr: "h0".into(),
            master_port: 29500,
            run_id: "r".into(),
            restart_count: 1,
            max_restarts: 3,
            role: "default".into(),
            use_agent_store: true,
            signals: "SIGTERM".into(),
            attempt_dir: "/run/attempt_1".into(),
            virtual_local_rank: false,
        }
    }

    #[test]
    fn an_attempt_gets_the_report_timer_recorder_stop_file_and_faulthandler() {
        let report = env(&[("NCCL_DEBUG", "INFO")]);
        let cache = Some(PathBuf::from("/run/cache"));
        let got = attempt_env(&env(&[]), switches(true, true), &places_at(cache), &report);
        assert_eq!(got["NCCL_DEBUG"], "INFO");
        assert_eq!(got[TIMER_FILE_VAR], "/tmp/timer");
        assert_eq!(got["TORCH_FR_DUMP_TEMP_FILE"], "/run/attempt_1/fr/rank_");
        assert_eq!(got["XDG_CACHE_HOME"], "/run/cache");
        assert_eq!(got["TOPORUN_STOP_FILE"], "/run/stop-requested");
        assert_eq!(got["PYTHONFAULTHANDLER"], "1");
    }

    #[test]
    fn without_the_recorder_the_cache_home_and_faulthandler_stay_out() {
        let cache = Some(PathBuf::from("/run/cache"));
        let got = attempt_env(
            &env(&[]),
            switches(false, false),
            &places_at(cache),
            &env(&[]),
        );
        for k in [
            "XDG_CACHE_HOME",
            "TORCH_FR_DUMP_TEMP_FILE",
            "PYTHONFAULTHANDLER",
        ] {
            assert!(!got.contains_key(k), "{k} in {got:?}");
        }
        assert!(got.contains_key("TOPORUN_STOP_FILE"));
    }

    #[test]
    fn the_users_values_win_over_the_plan_and_additions_but_not_torchruns() {
        let user = env(&[("NCCL_P2P_LEVEL", "SYS"), ("PYTHONFAULTHANDLER", "0")]);
        let planned = env(&[("NCCL_SOCKET_IFNAME", "eth0"), ("LOCAL_RANK", "9")]);
        let adds = env(&[("PYTHONFAULTHANDLER", "1"), ("NCCL_P2P_LEVEL", "NVL")]);
        let place = &layout(&[2, 2], 1)[1];
        let got = rank_env(planned, &user, &[&adds], place, &job());
        assert_eq!(got["NCCL_SOCKET_IFNAME"], "eth0");
        assert!(
            !got.contains_key("PYTHONFAULTHANDLER"),
            "inherited, not set"
        );
        assert!(!got.contains_key("NCCL_P2P_LEVEL"), "inherited, not set");
        assert_eq!(got["LOCAL_RANK"], "1");
        assert_eq!(got["RANK"], "3");
        assert_eq!(got["WORLD_SIZE"], "4");
    }
    /// Node 1 of two, its ranks on host GPU 3 (CUDA shows one GPU): ranks 2 and 3,
    /// each with its argv, the co-location variables, the user's value winning, and
    /// the CPUs of that GPU under --numa-binding=node.
    #[test]
    fn node_ranks_are_placed_and_complete() {
        let facts = crate::facts::HostFacts::from_json(include_str!(
            "../../tests/fixtures/hosts/h200x4.json"
        ))
        .unwrap();
        let cli = [(crate::torchrun::Opt::NumaBinding, "node".to_string())].into();
        let opts = crate::torchrun::options::resolve(&cli, &env(&[]), "train.py", &[]).unwrap();
        let places = layout(&[2, 2], 1);
        let user = env(&[("NCCL_CUMEM_ENABLE", "1")]);
        let node_env = env(&[("NCCL_HOSTID", "h"), ("NCCL_CUMEM_ENABLE", "0")]);
        let ranks = node_ranks(&NodeRanks {
            opts: &opts,
            python: "python3",
            planned: env(&[("NCCL_P2P_LEVEL", "NVL")]),
            user: &user,
            switches: switches(false, true),
            places: &places,
            job: &job(),
            node_env: &node_env,
            at: &AttemptPlaces {
                profiler: Some(PluginPlaces {
                    plugin: Path::new("/opt/toporun/libtoporun_nccl_profiler.so"),
                    counters: Path::new("/dev/shm/toporun-run/attempt_0"),
                }),
                ..places_at(None)
            },
            report: &UserEnv::new(),
            cuda_gpus: &[3],
            gpus: &facts.gpus.devices,
            l3_groups: &[],
        })
        .unwrap();
        let ranks_of: Vec<u32> = ranks.iter().map(|r| r.place.rank).collect();
        assert_eq!(ranks_of, [2, 3]);
        for r in &ranks {
            assert_eq!(r.gpu, Some(3));
            assert_eq!(r.argv[..3], ["python3", "-u", "train.py"]);
            assert_eq!(r.env["RANK"], r.place.rank.to_string());
            assert_eq!(r.env["NCCL_HOSTID"], "h");
            assert!(
                !r.env.contains_key("NCCL_CUMEM_ENABLE"),
                "the user's wins, inherited"
            );
            assert_eq!(r.env["NCCL_P2P_LEVEL"], "NVL");
            assert_eq!(r.env["PYTHONFAULTHANDLER"], "1");
            let counters = format!("/dev/shm/toporun-run/attempt_0/rank_{}", r.place.rank);
            assert_eq!(
                r.env["TOPORUN_NCCL_COUNTERS"], counters,
                "each rank its own"
            );
            assert_eq!(
                r.env["NCCL_PROFILER_PLUGIN"],
                "/opt/toporun/libtoporun_nccl_profiler.so"
            );
            let cpus = r.cpus.as_ref().expect("bound");
            assert_eq!(cpus, &facts.gpus.devices[3].cpu_affinity);
        }
    }
}
