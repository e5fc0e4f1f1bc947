//! The flight recorder's variables toporun gives the ranks, from the user's own
//! environment: where the dumps go, what makes every rank dump, and what makes the
//! ranks time their collectives for the GPU straggler rule. The user's values win.

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
/// The buffer size the pipe needs set under this name (torch 2.11).
pub const PIPE_BUFFER_VAR: &str = "TORCH_NCCL_TRACE_BUFFER_SIZE";

pub use crate::user_env::UserEnv;

/// What the job asks of the ranks' recorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecorderSwitches {
    /// `--flight-recorder on`.
    pub on: bool,
    /// The ranks time their collectives: `--gpu-timing on`, the straggler watch on,
    /// and GPUs to time.
    pub gpu_timed: bool,
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
    env.insert(DUMP_PREFIX_VAR.into(), format!("{}/rank_", dir.display()));
    for (name, old, value) in RECORDER_DEFAULTS {
        if !user.contains_key(name) && !user.contains_key(old) {
            env.insert(name.into(), value.into());
        }
    }
    if sw.gpu_timed {
        env.extend(timing_vars(user, attempt_dir));
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
/// each unless the user set it: the timing, the pipe (both names: torch 2.11 reads
/// TORCH_NCCL_DEBUG_INFO_PIPE_FILE, later releases TORCH_FR_DEBUG_INFO_PIPE_FILE),
/// and the buffer size under the name the pipe needs (torch 2.11 opens no pipe
/// without TORCH_NCCL_TRACE_BUFFER_SIZE).
pub fn timing_vars(user: &UserEnv, attempt_dir: &Path) -> UserEnv {
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
    if !user.contains_key(PIPE_BUFFER_VAR) {
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
    };
    const TIMED: RecorderSwitches = RecorderSwitches {
        on: true,
        gpu_timed: true,
    };

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

    #[test]
    fn timing_sets_both_pipe_names_and_the_buffer_the_pipe_needs() {
        let env = recorder_vars(
            &user(&[("TORCH_FR_BUFFER_SIZE", "64")]),
            TIMED,
            Path::new("/a"),
        );
        assert_eq!(env[TIMING_VAR], "1");
        for v in PIPE_VARS {
            assert_eq!(env[v], "/a/fr-pipe/rank_");
        }
        assert_eq!(env[PIPE_BUFFER_VAR], "64");
        let mine = user(&[(PIPE_VARS[1], "/p/rank_"), (TIMING_VAR, "0")]);
        let env = timing_vars(&mine, Path::new("/a"));
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
