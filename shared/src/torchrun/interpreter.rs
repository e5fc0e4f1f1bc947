//! The Python the ranks run, chosen like torchrun's (`PYTHON_EXEC`, else its own
//! `sys.executable`): toporun installed as `/venv/bin/torchrun` runs `/venv/bin/python3`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The interpreter and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    pub path: String,
    pub why: String,
}

const NAMES: &[&str] = &["python3", "python"];

/// `invoked`: argv[0] as the shell gave it; `exists`: whether a file is there.
pub fn choose(
    env: &BTreeMap<String, String>,
    invoked: &str,
    exists: &dyn Fn(&Path) -> bool,
) -> Interpreter {
    if let Some(p) = env.get("PYTHON_EXEC").filter(|p| !p.is_empty()) {
        return Interpreter {
            path: p.clone(),
            why: "PYTHON_EXEC".into(),
        };
    }
    let on_path = |name: &str| -> Option<PathBuf> {
        env.get("PATH")?
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(name))
            .find(|p| exists(p))
    };
    // The directory toporun was started from: argv[0]'s, or PATH's for a bare name.
    let dir = if invoked.contains('/') {
        Path::new(invoked).parent().map(Path::to_path_buf)
    } else {
        on_path(invoked).and_then(|p| p.parent().map(Path::to_path_buf))
    };
    if let Some(dir) = dir {
        if let Some(p) = NAMES.iter().map(|n| dir.join(n)).find(|p| exists(p)) {
            return Interpreter {
                path: p.display().to_string(),
                why: format!("beside {invoked}, as torchrun runs its own interpreter"),
            };
        }
    }
    if let Some(venv) = env.get("VIRTUAL_ENV").filter(|v| !v.is_empty()) {
        if let Some(p) = NAMES
            .iter()
            .map(|n| Path::new(venv).join("bin").join(n))
            .find(|p| exists(p))
        {
            return Interpreter {
                path: p.display().to_string(),
                why: "the active virtualenv (VIRTUAL_ENV)".into(),
            };
        }
    }
    match NAMES.iter().find_map(|n| on_path(n)) {
        Some(p) => Interpreter {
            path: p.display().to_string(),
            why: "python3 on PATH".into(),
        },
        None => Interpreter {
            path: "python3".into(),
            why: "no python3 found on PATH; set PYTHON_EXEC".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn torchrun_symlink_in_a_venv_runs_the_venvs_python() {
        let files = [
            "/venv/bin/python3",
            "/usr/bin/python3",
            "/venv/bin/torchrun",
        ];
        let exists = |p: &Path| files.iter().any(|f| Path::new(f) == p);
        let e = env(&[("PATH", "/usr/bin:/venv/bin")]);
        assert_eq!(
            choose(&e, "/venv/bin/torchrun", &exists).path,
            "/venv/bin/python3"
        );
        // Found through PATH as a bare name.
        assert_eq!(choose(&e, "torchrun", &exists).path, "/venv/bin/python3");
        // PYTHON_EXEC wins; then VIRTUAL_ENV; then python3 on PATH.
        let e2 = env(&[("PATH", "/usr/bin"), ("PYTHON_EXEC", "/opt/py")]);
        assert_eq!(
            choose(&e2, "/usr/local/bin/toporun", &exists).path,
            "/opt/py"
        );
        let e3 = env(&[("PATH", "/usr/bin"), ("VIRTUAL_ENV", "/venv")]);
        assert_eq!(
            choose(&e3, "/usr/local/bin/toporun", &exists).path,
            "/venv/bin/python3"
        );
        let e4 = env(&[("PATH", "/usr/bin")]);
        let i = choose(&e4, "/usr/local/bin/toporun", &exists);
        assert_eq!(
            (i.path.as_str(), i.why.as_str()),
            ("/usr/bin/python3", "python3 on PATH")
        );
    }
}
