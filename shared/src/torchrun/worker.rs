//! What each worker gets: torchrun's environment, name for name, and its command line.

use super::options::LaunchOptions;
use std::collections::BTreeMap;

/// One local rank's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlace {
    pub local_rank: u32,
    /// Global rank, once the node's rank is known.
    pub rank: u32,
    pub group_rank: u32,
    pub local_world_size: u32,
    pub world_size: u32,
    pub group_world_size: u32,
}

/// Global ranks as torchrun assigns them: node order, contiguous, nodes may differ
/// in size. `sizes[i]` is node i's local world size.
pub fn layout(sizes: &[u32], node_rank: usize) -> Vec<RankPlace> {
    let base: u32 = sizes[..node_rank].iter().sum();
    let world: u32 = sizes.iter().sum();
    (0..sizes[node_rank])
        .map(|l| RankPlace {
            local_rank: l,
            rank: base + l,
            group_rank: node_rank as u32,
            local_world_size: sizes[node_rank],
            world_size: world,
            group_world_size: sizes.len() as u32,
        })
        .collect()
}

/// The job-wide values every rank shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnv {
    pub master_addr: String,
    pub master_port: u16,
    pub run_id: String,
    pub restart_count: u32,
    pub max_restarts: u32,
    pub role: String,
    pub use_agent_store: bool,
    pub signals: String,
    /// `<run dir>/attempt_<n>`; error files go to `<attempt dir>/<local_rank>/error.json`.
    pub attempt_dir: String,
    /// --virtual-local-rank: LOCAL_RANK=0 and only the rank's own GPU visible.
    pub virtual_local_rank: bool,
}

/// The variables torchrun adds for one worker. `parent` is the launcher's environment
/// (TORCH_NCCL_ASYNC_ERROR_HANDLING and OMP_NUM_THREADS are inherited when set).
pub fn worker_env(
    place: &RankPlace,
    job: &JobEnv,
    parent: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    put("LOCAL_RANK", place.local_rank.to_string());
    if job.virtual_local_rank {
        // As torch's agent: the rank's entry of the parent's HIP_/CUDA_VISIBLE_DEVICES,
        // else its index, becomes device 0.
        put("LOCAL_RANK", "0".into());
        let hip = parent.get("HIP_VISIBLE_DEVICES").filter(|v| !v.is_empty());
        let visible = hip.or_else(|| parent.get("CUDA_VISIBLE_DEVICES"));
        let gpu = visible
            .and_then(|v| v.split(',').nth(place.local_rank as usize))
            .map(|g| g.trim().to_string())
            .unwrap_or_else(|| place.local_rank.to_string());
        if hip.is_some() {
            put("HIP_VISIBLE_DEVICES", gpu.clone());
        }
        put("CUDA_VISIBLE_DEVICES", gpu);
    }
    put("RANK", place.rank.to_string());
    put("GROUP_RANK", place.group_rank.to_string());
    put("ROLE_RANK", place.rank.to_string());
    put("ROLE_NAME", job.role.clone());
    put("LOCAL_WORLD_SIZE", place.local_world_size.to_string());
    put("WORLD_SIZE", place.world_size.to_string());
    put("GROUP_WORLD_SIZE", place.group_world_size.to_string());
    put("ROLE_WORLD_SIZE", place.world_size.to_string());
    put("MASTER_ADDR", job.master_addr.clone());
    put("MASTER_PORT", job.master_port.to_string());
    put("TORCHELASTIC_RESTART_COUNT", job.restart_count.to_string());
    put("TORCHELASTIC_MAX_RESTARTS", job.max_restarts.to_string());
    put("TORCHELASTIC_RUN_ID", job.run_id.clone());
    put(
        "TORCHELASTIC_USE_AGENT_STORE",
        if job.use_agent_store { "True" } else { "False" }.into(),
    );
    put(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        parent
            .get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
            .cloned()
            .unwrap_or_else(|| "1".into()),
    );
    put(
        "TORCHELASTIC_ERROR_FILE",
        format!("{}/{}/error.json", job.attempt_dir, place.local_rank),
    );
    put("TORCHELASTIC_SIGNALS_TO_HANDLE", job.signals.clone());
    if let Some(omp) = omp_num_threads(place.local_world_size, parent) {
        put("OMP_NUM_THREADS", omp);
    }
    env
}

/// torchrun sets OMP_NUM_THREADS=1 when unset and more than one rank runs here.
pub fn omp_num_threads(nproc: u32, parent: &BTreeMap<String, String>) -> Option<String> {
    match parent.get("OMP_NUM_THREADS") {
        Some(v) => Some(v.clone()),
        None if nproc > 1 => Some("1".into()),
        None => None,
    }
}

/// torchrun's warning when it sets OMP_NUM_THREADS itself.
pub const OMP_WARNING: &str = "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed.";

/// The worker's command line: `python -u [-m] entrypoint args` or, with --no-python,
/// `entrypoint args`; `${local_rank}` in arguments becomes the local rank.
pub fn worker_argv(opts: &LaunchOptions, python: &str, local_rank: u32) -> Vec<String> {
    let mut argv = Vec::new();
    if !opts.no_python {
        argv.push(python.to_string());
        argv.push("-u".to_string());
        if opts.module {
            argv.push("-m".to_string());
        }
    }
    argv.push(opts.entrypoint.clone());
    argv.extend(opts.args.iter().map(|a| substitute(a, local_rank)));
    argv
}

/// Python's string.Template with the one key torchrun gives it: `${local_rank}` and
/// `$local_rank` become the rank, `$$` a single `$`.
fn substitute(arg: &str, local_rank: u32) -> String {
    if !arg.contains('$') {
        return arg.to_string();
    }
    let rank = local_rank.to_string();
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = after.strip_prefix("{local_rank}") {
            out.push_str(&rank);
            rest = r;
        } else if let Some(r) = after
            .strip_prefix("local_rank")
            .filter(|r| !r.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
        {
            out.push_str(&rank);
            rest = r;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torchrun::options::resolve;

    #[test]
    fn heterogeneous_nodes_get_contiguous_ranks() {
        let n1 = layout(&[1, 3], 1);
        assert_eq!(n1.iter().map(|p| p.rank).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(n1[0].world_size, 4);
        assert_eq!(n1[0].group_world_size, 2);
    }

    #[test]
    fn env_matches_the_torchrun_fixture_names() {
        let fixture: serde_json::Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/source/torchrun-env/torchrun-2.11-4gpu.json"
        ))
        .unwrap();
        let want = &fixture["runs"]["static"]["ranks"][3]["env"];
        let job = JobEnv {
            master_addr: "127.0.0.1".into(),
            master_port: 29422,
            run_id: "none".into(),
            restart_count: 0,
            max_restarts: 0,
            role: "default".into(),
            use_agent_store: true,
            signals: "SIGTERM,SIGINT,SIGHUP,SIGQUIT".into(),
            attempt_dir: "/tmp/torchelastic_itl__54t/none_hs1dcv81/attempt_0".into(),
            virtual_local_rank: false,
        };
        let env = worker_env(&layout(&[4], 0)[3], &job, &BTreeMap::new());
        let got = serde_json::to_value(&env).unwrap();
        assert_eq!(&got, want);
    }

    #[test]
    fn omp_inherited_or_one() {
        let mut parent = BTreeMap::new();
        assert_eq!(omp_num_threads(1, &parent), None);
        assert_eq!(omp_num_threads(2, &parent).as_deref(), Some("1"));
        parent.insert("OMP_NUM_THREADS".into(), "8".into());
        assert_eq!(omp_num_threads(2, &parent).as_deref(), Some("8"));
    }

    #[test]
    fn argv_forms_and_substitution() {
        let empty = BTreeMap::new();
        let args = vec![
            "--out=/tmp/${local_rank}".to_string(),
            "$local_rank".into(),
            "$$HOME".into(),
            "${other}".into(),
        ];
        let mut o = resolve(&BTreeMap::new(), &empty, "train.py", &args).unwrap();
        assert_eq!(
            worker_argv(&o, "python3", 2),
            vec![
                "python3",
                "-u",
                "train.py",
                "--out=/tmp/2",
                "2",
                "$HOME",
                "${other}"
            ]
        );
        o.module = true;
        assert_eq!(
            worker_argv(&o, "python3", 0)[..4],
            ["python3", "-u", "-m", "train.py"]
        );
        o.module = false;
        o.no_python = true;
        assert_eq!(worker_argv(&o, "python3", 0)[0], "train.py");
    }
}
