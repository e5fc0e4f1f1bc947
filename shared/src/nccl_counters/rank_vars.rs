//! Whether the ranks load toporun's NCCL profiler plugin, and the variables that
//! make them: NCCL_PROFILER_PLUGIN (an absolute path) and, per rank, where its
//! counters go. A plugin the user chose wins: NCCL loads one per process.

use super::sampling::{BadSampling, KernelSampling, LAUNCH_BLOCKING_VAR, SAMPLING_VAR};
use crate::user_env::UserEnv;
use crate::version::Version;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The variable NCCL loads its profiler plugin from.
pub const PLUGIN_VAR: &str = "NCCL_PROFILER_PLUGIN";
/// Where the plugin writes the rank's counters (set per rank by toporun).
pub const COUNTERS_VAR: &str = crate::toporun_vars::ToporunVar::NcclCounters.name();
/// The plugin's file name, installed beside toporun.
pub const PLUGIN_FILE: &str = "libtoporun_nccl_profiler.so";

/// What the ranks get.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Profiler {
    /// toporun's plugin, at this path, timing these operations on the GPU.
    Toporun(PathBuf, KernelSampling),
    /// The user's own NCCL_PROFILER_PLUGIN, kept.
    User(String),
    /// `--nccl-profiler off`.
    #[default]
    Off,
    /// Not found beside toporun (the places looked at).
    NotInstalled(Vec<PathBuf>),
    /// The ranks' NCCL has no profiler API v5 (before [`FIRST_NCCL`]).
    NcclTooOld(Version),
}

/// The first NCCL that loads a profiler plugin of API v5.
pub const FIRST_NCCL: Version = Version::new(2, 28, 3);

impl Profiler {
    /// From what the user set, `--nccl-profiler`, the ranks' NCCL where known, and the
    /// plugin found (or the places looked at); a sampling the plugin would not
    /// understand is refused here, before any rank starts.
    pub fn choose(
        user: &UserEnv,
        on: bool,
        nccl: Option<Version>,
        found: Result<PathBuf, Vec<PathBuf>>,
    ) -> Result<Profiler, BadSampling> {
        if let Some(v) = user.get(PLUGIN_VAR) {
            return Ok(Profiler::User(v.clone()));
        }
        Ok(match (on, found) {
            (false, _) => Profiler::Off,
            // It would never load: the dump timing, not a warning a minute in.
            (true, _) if let Some(v) = nccl.filter(|v| *v < FIRST_NCCL) => Profiler::NcclTooOld(v),
            (true, Ok(p)) => {
                let var = |k: &str| user.get(k).map(String::as_str);
                let sampling =
                    KernelSampling::for_rank(var(SAMPLING_VAR), var(LAUNCH_BLOCKING_VAR))?;
                Profiler::Toporun(p, sampling)
            }
            (true, Err(looked)) => Profiler::NotInstalled(looked),
        })
    }

    /// The plugin toporun gives the ranks.
    pub fn plugin(&self) -> Option<&Path> {
        match self {
            Profiler::Toporun(p, _) => Some(p),
            _ => None,
        }
    }

    /// What the NCCL report's documents say of it.
    pub fn report(&self) -> ProfilerReport {
        let (plugin, path) = match self {
            Profiler::Toporun(p, _) => (PluginKind::Toporun, Some(p.display().to_string())),
            Profiler::User(v) => (PluginKind::User, Some(v.clone())),
            Profiler::Off => (PluginKind::Off, None),
            Profiler::NotInstalled(_) => (PluginKind::NotInstalled, None),
            Profiler::NcclTooOld(_) => (PluginKind::NcclTooOld, None),
        };
        ProfilerReport {
            plugin,
            path,
            says: self.line(),
        }
    }

    /// What the dry run and the NCCL report say of it.
    pub fn line(&self) -> String {
        match self {
            Profiler::Toporun(p, sampling) => format!(
                "NCCL's own counters: the ranks load toporun's profiler plugin ({PLUGIN_VAR}={}; NCCL 2.28.3 or later loads it); GPU stragglers and hangs are judged from operations posted and completing on the GPU, without flight-recorder dumps while the job trains; {}",
                p.display(),
                sampling.text()
            ),
            Profiler::User(v) => format!(
                "NCCL's own counters: off, your {PLUGIN_VAR}={v} is kept (NCCL loads one profiler plugin); {WITHOUT}"
            ),
            Profiler::Off => format!("NCCL's own counters: off (--nccl-profiler off); {WITHOUT}"),
            Profiler::NcclTooOld(v) => format!(
                "NCCL's own counters: off, the ranks' NCCL {v} has no profiler plugin API v5 ({FIRST_NCCL} or later loads toporun's); {WITHOUT}"
            ),
            Profiler::NotInstalled(looked) => format!(
                "NCCL's own counters: off, {PLUGIN_FILE} is not installed beside toporun (looked in {}); install it there (scripts/dev/build_release.sh, the image) for NCCL-side hang and straggler detection",
                looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// Which profiler plugin the ranks load, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginKind {
    Toporun,
    User,
    Off,
    NotInstalled,
    NcclTooOld,
}

/// The profiler plugin the ranks were given, as the NCCL report's JSON has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProfilerReport {
    pub plugin: PluginKind,
    /// NCCL_PROFILER_PLUGIN as the ranks have it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The line the dry run prints.
    pub says: String,
}

/// How toporun watches NCCL ranks without its plugin.
const WITHOUT: &str = "hangs are judged from the ranks' stacks, GPU stragglers from flight-recorder dumps where the GPU timing is on (its line says)";

/// Rank `rank`'s counters file in the attempt's directory.
pub fn counters_file(counters_dir: &Path, rank: u32) -> PathBuf {
    counters_dir.join(format!("rank_{rank}"))
}

/// Where the ranks load toporun's plugin from and count into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginPlaces<'a> {
    pub plugin: &'a Path,
    /// The attempt's counters directory (`CountersPlace`: in memory).
    pub counters: &'a Path,
}

/// The plugin's variables for rank `rank` (none without toporun's plugin).
pub fn profiler_vars(places: Option<PluginPlaces>, rank: u32) -> UserEnv {
    let mut env = BTreeMap::new();
    if let Some(p) = places {
        env.insert(PLUGIN_VAR.into(), p.plugin.display().to_string());
        let file = counters_file(p.counters, rank);
        env.insert(COUNTERS_VAR.into(), file.display().to_string());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::user_env::env_of as env;

    /// An NCCL before 2.28.3 (probed from the ranks' libnccl) never loads the plugin:
    /// toporun does not give it, and the dump timing stands.
    #[test]
    fn an_nccl_without_profiler_v5_gets_no_plugin() {
        let found = || Ok(PathBuf::from("/usr/local/lib/libtoporun_nccl_profiler.so"));
        let old = Profiler::choose(&env(&[]), true, Version::parse("2.21.5"), found()).unwrap();
        assert_eq!(old, Profiler::NcclTooOld(Version::new(2, 21, 5)));
        assert_eq!(old.plugin(), None);
        assert!(
            old.line()
                .contains("the ranks' NCCL 2.21.5 has no profiler plugin API v5 (2.28.3 or later"),
            "{}",
            old.line()
        );
        assert_eq!(old.report().plugin, PluginKind::NcclTooOld);
        assert_eq!(
            serde_json::to_value(old.report().plugin).unwrap(),
            "nccl-too-old"
        );
        for new in ["2.28.3", "2.28.9", "2.29.1"] {
            let p = Profiler::choose(&env(&[]), true, Version::parse(new), found()).unwrap();
            assert!(p.plugin().is_some(), "{new}");
        }
        // Unknown: given (it is the default); the user's own and the switch still win.
        assert!(Profiler::choose(&env(&[]), true, None, found())
            .unwrap()
            .plugin()
            .is_some());
        let user = env(&[(PLUGIN_VAR, "/opt/x.so")]);
        let kept = Profiler::choose(&user, true, Version::parse("2.21.5"), found()).unwrap();
        assert_eq!(kept, Profiler::User("/opt/x.so".into()));
        assert_eq!(kept.report().path.as_deref(), Some("/opt/x.so"));
    }

    #[test]
    fn the_user_s_plugin_wins_then_the_switch_then_the_install() {
        let found = || {
            Ok(PathBuf::from(
                "/opt/toporun/lib/libtoporun_nccl_profiler.so",
            ))
        };
        let user = env(&[(PLUGIN_VAR, "/opt/comma/libnccl-profiler.so")]);
        let choose = |user: &UserEnv, on, found| Profiler::choose(user, on, None, found).unwrap();
        assert_eq!(
            choose(&user, true, found()),
            Profiler::User("/opt/comma/libnccl-profiler.so".into())
        );
        assert_eq!(choose(&env(&[]), false, found()), Profiler::Off);
        let p = choose(&env(&[]), true, found());
        assert_eq!(
            p.plugin(),
            Some(Path::new("/opt/toporun/lib/libtoporun_nccl_profiler.so"))
        );
        assert!(
            p.line()
                .contains("bursts of 8 operations on the GPU, about one every 500 ms"),
            "{}",
            p.line()
        );
        let missing = choose(&env(&[]), true, Err(vec!["/usr/bin".into()]));
        assert!(
            missing.line().contains("looked in /usr/bin"),
            "{}",
            missing.line()
        );
        assert!(choose(&user, true, found())
            .line()
            .contains("your NCCL_PROFILER_PLUGIN=/opt/comma"));
    }

    /// The sampling variable is checked before any rank starts, and said.
    #[test]
    fn the_sampling_is_checked_and_said() {
        let found = || {
            Ok(PathBuf::from(
                "/opt/toporun/lib/libtoporun_nccl_profiler.so",
            ))
        };
        let all = Profiler::choose(&env(&[(SAMPLING_VAR, "all")]), true, None, found()).unwrap();
        assert!(
            all.line().contains("NCCL times every operation"),
            "{}",
            all.line()
        );
        let bad = Profiler::choose(&env(&[(SAMPLING_VAR, "often")]), true, None, found());
        assert_eq!(bad, Err(BadSampling("often".into())));
        // Without toporun's plugin the variable means nothing and is not checked.
        let off = Profiler::choose(&env(&[(SAMPLING_VAR, "often")]), false, None, found());
        assert_eq!(off, Ok(Profiler::Off));
    }

    #[test]
    fn each_rank_counts_into_its_own_file() {
        let plugin = Path::new("/opt/toporun/lib/libtoporun_nccl_profiler.so");
        let counters = Path::new("/dev/shm/toporun-job_x/attempt_0");
        let v = profiler_vars(Some(PluginPlaces { plugin, counters }), 3);
        assert_eq!(v[PLUGIN_VAR], plugin.display().to_string());
        assert_eq!(v[COUNTERS_VAR], "/dev/shm/toporun-job_x/attempt_0/rank_3");
        assert!(profiler_vars(None, 3).is_empty());
    }
}
