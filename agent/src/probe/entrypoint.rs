//! Reads what a launch would start: the training script (or `--no-python` program)
//! where the ranks would open it, and whether the ranks' interpreter finds torch.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use toporun_shared::preflight::entrypoint::{top_level_torch_import, EntrypointFacts, FileState};

/// Enough of a script to find its imports.
const SOURCE_BYTES: u64 = 256 << 10;
/// An interpreter that has not answered by then is not waited for.
const PYTHON_ANSWER: Duration = Duration::from_secs(5);

/// What the launch would start. `cwd` is where the ranks start (toporun's own working
/// directory); `env` the environment they inherit (PATH, PYTHONPATH). None for `-m`:
/// a module is found by the interpreter, not here.
pub fn read(
    entry: &str,
    module: bool,
    program: bool,
    python: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
) -> Option<EntrypointFacts> {
    if module || entry.is_empty() {
        return None;
    }
    let path = locate(entry, program, cwd, env);
    let state = path
        .as_deref()
        .map_or(FileState::Missing, |p| state(p, program));
    let imports_torch_at = match (&state, &path, program) {
        (FileState::Readable, Some(p), false) => {
            head(p).as_deref().and_then(top_level_torch_import)
        }
        _ => None,
    };
    let python_has_torch = imports_torch_at.and_then(|_| finds_torch(python, cwd, env));
    Some(EntrypointFacts {
        path: entry.to_string(),
        cwd: cwd.display().to_string(),
        program,
        state,
        imports_torch_at,
        python_has_torch,
    })
}

/// The file the ranks would open: a path with a slash (or any script) from `cwd`;
/// a program's bare name from PATH, as execvp finds it.
fn locate(
    entry: &str,
    program: bool,
    cwd: &Path,
    env: &BTreeMap<String, String>,
) -> Option<PathBuf> {
    if !program || entry.contains('/') {
        let p = cwd.join(entry);
        return p.symlink_metadata().is_ok().then_some(p);
    }
    env.get("PATH")?
        .split(':')
        .map(|d| cwd.join(d).join(entry))
        .find(|p| p.is_file())
}

fn state(path: &Path, program: bool) -> FileState {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return FileState::Missing,
        Err(e) => return FileState::Unreadable(e.to_string()),
    };
    if meta.is_dir() {
        return FileState::NotRunnable("a directory");
    }
    if program {
        return if meta.permissions().mode() & 0o111 == 0 {
            FileState::NotRunnable("not executable (chmod +x)")
        } else {
            FileState::Readable
        };
    }
    match std::fs::File::open(path) {
        Ok(_) => FileState::Readable,
        Err(e) => FileState::Unreadable(e.to_string()),
    }
}

fn head(path: &Path) -> Option<String> {
    let mut text = String::new();
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(SOURCE_BYTES).read_to_end(&mut bytes).ok()?;
    text.push_str(&String::from_utf8_lossy(&bytes));
    Some(text)
}

/// Asks the interpreter, in the ranks' environment, whether it finds torch (without
/// importing it: find_spec only searches the path). None when it gives no answer.
fn finds_torch(python: &str, cwd: &Path, env: &BTreeMap<String, String>) -> Option<bool> {
    let mut child = Command::new(python)
        .args([
            "-c",
            "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 3)",
        ])
        .current_dir(cwd)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) => {
                return match s.code() {
                    Some(0) => Some(true),
                    Some(3) => Some(false),
                    _ => None,
                }
            }
            Ok(None) if start.elapsed() < PYTHON_ANSWER => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> BTreeMap<String, String> {
        std::env::vars().collect()
    }

    #[test]
    fn a_missing_script_and_a_present_one() {
        let d = tempfile::tempdir().unwrap();
        let e = read("nope.py", false, false, "python3", d.path(), &env()).unwrap();
        assert_eq!(e.state, FileState::Missing);
        std::fs::write(d.path().join("t.py"), "import os\nimport torch\n").unwrap();
        let e = read("t.py", false, false, "/bin/false", d.path(), &env()).unwrap();
        assert_eq!(e.state, FileState::Readable);
        assert_eq!(e.imports_torch_at, Some(2));
        // /bin/false answers 1: neither yes nor no.
        assert_eq!(e.python_has_torch, None);
        assert_eq!(read("x", true, false, "python3", d.path(), &env()), None);
    }

    #[test]
    fn an_interpreter_that_lacks_torch_says_so() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("t.py"), "import torch\n").unwrap();
        // A stand-in interpreter that answers as Python's find_spec would: not found.
        let py = d.path().join("py");
        std::fs::write(&py, "#!/bin/sh\nexit 3\n").unwrap();
        std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = read("t.py", false, false, py.to_str().unwrap(), d.path(), &env()).unwrap();
        assert_eq!(e.python_has_torch, Some(false));
    }

    #[test]
    fn programs_are_found_on_path_and_need_the_execute_bit() {
        let d = tempfile::tempdir().unwrap();
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/usr/bin:/bin".to_string());
        let e = read("true", false, true, "", d.path(), &env).unwrap();
        assert_eq!(e.state, FileState::Readable);
        let e = read("no-such-program-here", false, true, "", d.path(), &env).unwrap();
        assert_eq!(e.state, FileState::Missing);
        std::fs::write(d.path().join("run.sh"), "echo\n").unwrap();
        let e = read("./run.sh", false, true, "", d.path(), &env).unwrap();
        assert!(
            matches!(e.state, FileState::NotRunnable(_)),
            "{:?}",
            e.state
        );
        let e = read(".", false, false, "", d.path(), &env).unwrap();
        assert_eq!(e.state, FileState::NotRunnable("a directory"));
    }
}
