//! The flight recorder's variables toporun gives the ranks, from the user's own
//! environment: where the dumps go, what makes every rank dump, and what makes the
//! ranks time their collectives for the GPU straggler rule. The user's values win.

use crate::version::Version;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The variable torch reads the dump prefix from.
pub const DUMP_PREFIX_VAR: &str = "TORCH_FR_DUMP_TEMP_FILE";

/// Its name before torch 2.7, which torch still reads.
pub const OLD_DUMP_PREFIX_VAR: &str = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE";

/// Whether stock ProcessGroupNCCL's monitor dumps on a timeout and polls the
/// workers' store for `exception_dump`.
pub const DUMP_ON_TIMEOUT_VAR: &str = "TORCH_NCCL_DUMP_ON_TIMEOUT";

/// What toporun sets beside the prefix, unless the user set them (or their older
/// names): entries kept (torch's default since 2.5; 0 before, which records nothing),
/// and stock ProcessGroupNCCL's monitor polling the store for `exception_dump`
/// (off by default in some releases), so that every rank dumps on a timeout or when
/// toporun asks at a hang stop.
pub const RECORDER_DEFAULTS: [(&str, &str, &str); 2] = [
    (
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "2000",
    ),
    (DUMP_ON_TIMEOUT_VAR, DUMP_ON_TIMEOUT_VAR, "1"),
];

/// ProcessGroupNCCL times each collective on the GPU (its entries' `duration_ms`).
pub const TIMING_VAR: &str = "TORCH_NCCL_ENABLE_TIMING";
/// The dump pipe's prefix, by its torch 2.11 name and its later one.
pub const PIPE_VARS: [&str; 2] = [
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
    "TORCH_FR_DEBUG_INFO_PIPE_FILE",
];
/// The buffer size under its old name: torch before 2.8 knows no other, and its dump
/// pipe (`DumpPipe`, ProcessGroupNCCL.hpp) reads only this name in every release to
/// 2.11, where a value of 0, the default before 2.11, opens no pipe.
pub const PIPE_BUFFER_VAR: &str = "TORCH_NCCL_TRACE_BUFFER_SIZE";
/// The first torch with TORCH_FR_BUFFER_SIZE, which warns once a rank (`Utils.hpp`,
/// getCvarInt) whenever the old name is set at all.
const FR_NAMES: Version = Version::new(2, 8, 0);
/// The first torch whose dump pipe opens without the old name (its default 2000).
const PIPE_DEFAULT_ON: Version = Version::new(2, 11, 0);

pub use crate::user_env::UserEnv;

/// What the job asks of the ranks' recorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecorderSwitches {
    /// `--flight-recorder on`.
    pub on: bool,
    /// The ranks time their collectives: `--gpu-timing on`, the straggler watch on,
    /// and GPUs to time.
    pub gpu_timed: bool,
    /// The ranks' torch, where probed: the variables' names follow it.
    pub torch: Option<Version>,
}

/// The name the buffer size goes under for `torch` (unknown: the new one).
fn buffer_var(torch: Option<Version>) -> &'static str {
    match torch {
        Some(v) if v < FR_NAMES => PIPE_BUFFER_VAR,
        _ => RECORDER_DEFAULTS[0].0,
    }
}

/// Whether toporun gives the dump pipe the buffer size under its old name: only
/// before torch 2.8, which knows no other. On 2.8-2.10 the old name makes every rank
/// print torch's deprecation warning, so toporun leaves it to the user there (and
/// an unknown torch is taken for a current one).
fn pipe_needs_old_name(torch: Option<Version>) -> bool {
    torch.is_some_and(|v| v < FR_NAMES)
}

/// Whether the ranks' dump pipe opens with what toporun and the user set: the
/// user's own old buffer name decides where they set it (0 shuts it); else every
/// torch but 2.8-2.10, which need that name.
pub fn pipe_opens(user: &UserEnv, torch: Option<Version>) -> bool {
    if let Some(n) = user.get(PIPE_BUFFER_VAR) {
        return n.trim().parse::<u64>().is_ok_and(|n| n > 0);
    }
    !torch.is_some_and(|v| v >= FR_NAMES && v < PIPE_DEFAULT_ON)
}

/// The user chose the dump prefix, under either name.
pub fn user_dump_prefix(user: &UserEnv) -> Option<&String> {
    user.get(DUMP_PREFIX_VAR)
        .or_else(|| user.get(OLD_DUMP_PREFIX_VAR))
}

/// toporun chooses where the ranks dump: the recorder is on and the user set no
/// dump prefix of their own.
pub fn toporun_dumps(user: &UserEnv, sw: RecorderSwitches) -> bool {
    sw.on && user_dump_prefix(user).is_none()
}

/// The flight recorder's variables the ranks get (none where the user chose the dump
/// prefix or the recorder is off).
pub fn recorder_vars(user: &UserEnv, sw: RecorderSwitches, attempt_dir: &Path) -> UserEnv {
    let mut env = BTreeMap::new();
    if !toporun_dumps(user, sw) {
        return env;
    }
    let dir = attempt_dir.join("fr");
    let old_torch = sw.torch.is_some_and(|v| v < FR_NAMES);
    let prefix_var = if old_torch {
        OLD_DUMP_PREFIX_VAR
    } else {
        DUMP_PREFIX_VAR
    };
    env.insert(prefix_var.into(), format!("{}/rank_", dir.display()));
    for (name, old, value) in RECORDER_DEFAULTS {
        if !user.contains_key(name) && !user.contains_key(old) {
            let name = if name == RECORDER_DEFAULTS[0].0 {
                buffer_var(sw.torch)
            } else {
                name
            };
            env.insert(name.into(), value.into());
        }
    }
    if sw.gpu_timed {
        env.extend(timing_vars(user, attempt_dir, sw.torch));
    }
    env
}

/// Where each rank's dump pipe is (`<prefix><rank>.pipe`): the user's, else
/// `<attempt dir>/fr-pipe/rank_`.
pub fn pipe_prefix(user: &UserEnv, attempt_dir: &Path) -> PathBuf {
    PIPE_VARS
        .iter()
        .find_map(|v| user.get(*v))
        .map(PathBuf::from)
        .unwrap_or_else(|| attempt_dir.join("fr-pipe").join("rank_"))
}

/// What makes the ranks time their collectives and dump on a write to their pipe,
/// each unless the user set it: the timing, the pipe (both names: torch to 2.11 reads
/// TORCH_NCCL_DEBUG_INFO_PIPE_FILE; TORCH_FR_DEBUG_INFO_PIPE_FILE is the new name's
/// pattern, read by none yet and harmless), and, before torch 2.8, the buffer size
/// under the old name, the only one it reads (2.11 opens the pipe at its default;
/// on 2.8-2.10 the old name would make every rank print a deprecation warning:
/// [`pipe_opens`]).
pub fn timing_vars(user: &UserEnv, attempt_dir: &Path, torch: Option<Version>) -> UserEnv {
    let mut env = BTreeMap::new();
    if !user.contains_key(TIMING_VAR) {
        env.insert(TIMING_VAR.into(), "1".into());
    }
    if PIPE_VARS.iter().all(|v| !user.contains_key(*v)) {
        let prefix = pipe_prefix(user, attempt_dir).display().to_string();
        for v in PIPE_VARS {
            env.insert(v.into(), prefix.clone());
        }
    }
    if pipe_needs_old_name(torch) && !user.contains_key(PIPE_BUFFER_VAR) {
        let (buffer, _, default) = RECORDER_DEFAULTS[0];
        let size = user.get(buffer).map_or(default, |s| s.as_str());
        env.insert(PIPE_BUFFER_VAR.into(), size.into());
    }
    env
}

/// Where the ranks' dumps go: `<attempt dir>/fr` unless the user chose
/// (TORCH_FR_DUMP_TEMP_FILE, its directory); None with the recorder off.
pub fn dump_dir(user: &UserEnv, on: bool, attempt_dir: &Path) -> Option<PathBuf> {
    if let Some(prefix) = user_dump_prefix(user) {
        return Path::new(prefix).parent().map(Path::to_path_buf);
    }
    on.then(|| attempt_dir.join("fr"))
}

/// Whether stock ProcessGroupNCCL's monitor looks for `exception_dump`: not when the
/// user turned its store polling off.
pub fn monitor_polls(user: &UserEnv) -> bool {
    user.get(DUMP_ON_TIMEOUT_VAR)
        .and_then(|v| crate::flags::torch_bool(v))
        != Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ON: RecorderSwitches = RecorderSwitches {
        on: true,
        gpu_timed: false,
        torch: None,
    };
    const TIMED: RecorderSwitches = RecorderSwitches {
        on: true,
        gpu_timed: true,
        torch: None,
    };

    /// Each torch gets names it reads without a deprecation warning: 2.11 the new
    /// names only (its pipe opens at its default), 2.8-2.10 and an unknown torch the
    /// new ones too (their pipe stays shut unless the user names the old buffer
    /// variable: no rank warns for toporun), 2.7 the old names only.
    #[test]
    fn the_names_follow_the_ranks_torch() {
        let at = |v: &str| {
            let sw = RecorderSwitches {
                torch: Version::parse(v),
                ..TIMED
            };
            recorder_vars(&user(&[]), sw, Path::new("/a"))
        };
        let new = at("2.11.0");
        assert_eq!(new["TORCH_FR_BUFFER_SIZE"], "2000");
        assert!(!new.contains_key(PIPE_BUFFER_VAR), "{new:?}");
        assert!(new.contains_key(DUMP_PREFIX_VAR) && new.contains_key(PIPE_VARS[0]));
        let mid = at("2.9.1");
        assert_eq!(mid["TORCH_FR_BUFFER_SIZE"], "2000");
        assert!(!mid.contains_key(PIPE_BUFFER_VAR), "{mid:?}");
        let unknown = recorder_vars(&user(&[]), TIMED, Path::new("/a"));
        assert!(!unknown.contains_key(PIPE_BUFFER_VAR), "{unknown:?}");
        let old = at("2.7.1");
        assert_eq!(old[PIPE_BUFFER_VAR], "2000");
        assert!(!old.contains_key("TORCH_FR_BUFFER_SIZE"), "{old:?}");
        assert!(old.contains_key(OLD_DUMP_PREFIX_VAR) && !old.contains_key(DUMP_PREFIX_VAR));
    }

    use crate::user_env::env_of as user;

    #[test]
    fn the_recorder_dumps_under_the_attempt_with_its_defaults() {
        let env = recorder_vars(&user(&[]), ON, Path::new("/r/attempt_0"));
        assert_eq!(env[DUMP_PREFIX_VAR], "/r/attempt_0/fr/rank_");
        assert_eq!(env["TORCH_FR_BUFFER_SIZE"], "2000");
        assert_eq!(env[DUMP_ON_TIMEOUT_VAR], "1");
        assert!(!env.contains_key(TIMING_VAR), "{env:?}");
    }

    #[test]
    fn a_users_prefix_or_a_recorder_off_gives_nothing() {
        let off = RecorderSwitches { on: false, ..TIMED };
        assert!(recorder_vars(&user(&[]), off, Path::new("/a")).is_empty());
        let theirs = user(&[(OLD_DUMP_PREFIX_VAR, "/mine/x_")]);
        assert!(recorder_vars(&theirs, TIMED, Path::new("/a")).is_empty());
        assert_eq!(
            dump_dir(&theirs, false, Path::new("/a")),
            Some("/mine".into())
        );
        assert_eq!(dump_dir(&user(&[]), false, Path::new("/a")), None);
    }

    #[test]
    fn a_users_older_name_keeps_the_default_away() {
        let env = recorder_vars(
            &user(&[("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")]),
            TIMED,
            Path::new("/a"),
        );
        assert!(!env.contains_key("TORCH_FR_BUFFER_SIZE"), "{env:?}");
        assert!(
            !env.contains_key(PIPE_BUFFER_VAR),
            "the user's own value is kept"
        );
    }

    /// The pipe opens on every torch but 2.8-2.10, where only the user's own old
    /// buffer name (nonzero) opens it; the user's 0 shuts it anywhere.
    #[test]
    fn the_pipe_opens_by_torch_and_the_users_old_name() {
        let v = |s| Version::parse(s);
        let none = user(&[]);
        assert!(pipe_opens(&none, v("2.11.0")) && pipe_opens(&none, v("2.7.1")));
        assert!(pipe_opens(&none, None));
        assert!(!pipe_opens(&none, v("2.8.0")) && !pipe_opens(&none, v("2.10.1")));
        assert!(pipe_opens(&user(&[(PIPE_BUFFER_VAR, "500")]), v("2.9.0")));
        assert!(!pipe_opens(&user(&[(PIPE_BUFFER_VAR, "0")]), v("2.9.0")));
        // The user's 0 shuts it on any torch.
        assert!(!pipe_opens(&user(&[(PIPE_BUFFER_VAR, "0")]), v("2.11.0")));
        assert!(!pipe_opens(&user(&[(PIPE_BUFFER_VAR, "0")]), None));
    }

    #[test]
    fn timing_sets_both_pipe_names_and_the_buffer_the_pipe_needs() {
        let old = RecorderSwitches {
            torch: Version::parse("2.7.1"),
            ..TIMED
        };
        let env = recorder_vars(
            &user(&[("TORCH_FR_BUFFER_SIZE", "64")]),
            old,
            Path::new("/a"),
        );
        assert_eq!(env[TIMING_VAR], "1");
        for v in PIPE_VARS {
            assert_eq!(env[v], "/a/fr-pipe/rank_");
        }
        assert_eq!(env[PIPE_BUFFER_VAR], "64");
        let mine = user(&[(PIPE_VARS[1], "/p/rank_"), (TIMING_VAR, "0")]);
        let env = timing_vars(&mine, Path::new("/a"), None);
        assert!(!env.contains_key(TIMING_VAR) && !env.contains_key(PIPE_VARS[0]));
        assert_eq!(
            pipe_prefix(&mine, Path::new("/a")),
            PathBuf::from("/p/rank_")
        );
    }

    #[test]
    fn the_monitor_polls_unless_turned_off() {
        assert!(monitor_polls(&user(&[])));
        assert!(monitor_polls(&user(&[(DUMP_ON_TIMEOUT_VAR, "1")])));
        assert!(!monitor_polls(&user(&[(DUMP_ON_TIMEOUT_VAR, "0")])));
    }
}
