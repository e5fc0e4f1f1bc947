//! How a launch learns what NCCL did: its INFO log written to per-rank files under
//! the attempt directory (the variables the ranks get for it), or the user's own
//! NCCL_DEBUG_FILE followed, or no report where the user's NCCL_DEBUG prints to the
//! console.

use crate::user_env::UserEnv;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How this launch learns what NCCL did.
pub enum Capture {
    Off(String),
    Files {
        dir: PathBuf,
        prefix: String,
        /// Variables toporun adds to the ranks (none when the user set the file).
        env: BTreeMap<String, String>,
    },
}

/// Decides the capture for one attempt directory. `on`: `--nccl-report on`; `user`: the environment the ranks inherit.
pub fn capture(on: bool, user: &UserEnv, attempt_dir: &Path) -> Capture {
    if !on {
        return Capture::Off("--nccl-report off".into());
    }
    let user = |k: &str| user.get(k).filter(|v| !v.is_empty());
    if let Some(pattern) = user("NCCL_DEBUG_FILE") {
        let path = Path::new(pattern);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Capture::Files {
            dir: path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
            prefix: name.split('%').next().unwrap_or("").to_string(),
            env: BTreeMap::new(),
        };
    }
    if let Some(level) = user("NCCL_DEBUG") {
        return Capture::Off(format!("NCCL_DEBUG={level} set by you without NCCL_DEBUG_FILE: NCCL prints to the ranks' console, toporun reads no file"));
    }
    let dir = attempt_dir.join("nccl");
    let mut env = BTreeMap::from([
        ("NCCL_DEBUG".to_string(), "INFO".to_string()),
        (
            "NCCL_DEBUG_FILE".to_string(),
            dir.join("nccl.%h.%p.log").display().to_string(),
        ),
    ]);
    if user("NCCL_DEBUG_SUBSYS").is_none() {
        // INIT carries the version, the communicators and every `via` line.
        env.insert("NCCL_DEBUG_SUBSYS".into(), "INIT".into());
    }
    Capture::Files {
        dir,
        prefix: "nccl.".into(),
        env,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::user_env::env_of as user;

    #[test]
    fn toporun_captures_init_lines_under_the_attempt() {
        let Capture::Files { dir, prefix, env } = capture(true, &user(&[]), Path::new("/r/a_0"))
        else {
            panic!("off")
        };
        assert_eq!(dir, PathBuf::from("/r/a_0/nccl"));
        assert_eq!(prefix, "nccl.");
        assert_eq!(env["NCCL_DEBUG"], "INFO");
        assert_eq!(env["NCCL_DEBUG_FILE"], "/r/a_0/nccl/nccl.%h.%p.log");
        assert_eq!(env["NCCL_DEBUG_SUBSYS"], "INIT");
    }

    #[test]
    fn the_users_file_is_followed_and_their_subsystems_kept() {
        let theirs = user(&[("NCCL_DEBUG_FILE", "/logs/n.%h.%p")]);
        let Capture::Files { dir, prefix, env } = capture(true, &theirs, Path::new("/r")) else {
            panic!("off")
        };
        assert_eq!((dir, prefix.as_str()), (PathBuf::from("/logs"), "n."));
        assert!(env.is_empty());
        let subsys = user(&[("NCCL_DEBUG_SUBSYS", "ALL")]);
        let Capture::Files { env, .. } = capture(true, &subsys, Path::new("/r")) else {
            panic!("off")
        };
        assert!(!env.contains_key("NCCL_DEBUG_SUBSYS"), "{env:?}");
    }

    #[test]
    fn off_by_option_or_by_a_console_nccl_debug() {
        assert!(matches!(
            capture(false, &user(&[]), Path::new("/r")),
            Capture::Off(_)
        ));
        let console = user(&[("NCCL_DEBUG", "WARN")]);
        let Capture::Off(why) = capture(true, &console, Path::new("/r")) else {
            panic!("on")
        };
        assert!(why.contains("NCCL_DEBUG=WARN"), "{why}");
    }
}
