//! `launch.entrypoint`, `launch.python_torch`: the training script a launch would
//! start, and whether the ranks' interpreter can import the torch it imports. A
//! dry run warns (the image may differ from the machine it runs on); a real launch
//! refuses, before any rank starts, what would fail every rank the same way.

use crate::finding::FindingId;
use crate::finding::{Finding, Severity};

/// What the agent read about the entrypoint, where the ranks would start it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrypointFacts {
    /// As given on the command line.
    pub path: String,
    /// toporun's working directory, where the ranks start and a relative path points.
    pub cwd: String,
    /// `--no-python`: a program, looked up on PATH when it has no slash.
    pub program: bool,
    pub state: FileState,
    /// The first top-level `import torch` / `from torch ...` line (1-based).
    pub imports_torch_at: Option<u32>,
    /// Whether the ranks' interpreter finds torch (None: not asked, or no answer).
    pub python_has_torch: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileState {
    Readable,
    Missing,
    /// A directory, or a program without the execute bit.
    NotRunnable(&'static str),
    Unreadable(String),
}

/// The findings for a launch's entrypoint; `python` is the ranks' interpreter.
pub fn check(e: &EntrypointFacts, python: &str, dry_run: bool) -> Vec<Finding> {
    let severity = if dry_run {
        Severity::Warning
    } else {
        Severity::Error
    };
    let mut out = Vec::new();
    let problem = match &e.state {
        FileState::Readable => None,
        FileState::Missing if e.program && !e.path.contains('/') => {
            Some("is not on PATH".to_string())
        }
        FileState::Missing => Some("does not exist".to_string()),
        FileState::NotRunnable(why) => Some(format!("cannot be run: {why}")),
        FileState::Unreadable(err) => Some(format!("cannot be read: {err}")),
    };
    if let Some(problem) = problem {
        let what = if e.program {
            "program"
        } else {
            "training script"
        };
        let place = if dry_run {
            " (the image that runs the job may hold it; check there)"
        } else {
            "; no rank was started"
        };
        out.push(
            Finding::new(
                FindingId::LaunchEntrypoint,
                severity,
                format!(
                    "the {what} {} {problem} in {}{place}",
                    e.path, e.cwd
                ),
            )
            .fact("path", &e.path)
            .fact("cwd", &e.cwd)
            .remedy("give the script's path as the ranks will see it (absolute, or relative to the working directory above), or start toporun in the script's directory"),
        );
    }
    if let (Some(line), Some(false)) = (e.imports_torch_at, e.python_has_torch) {
        out.push(
            Finding::new(
                FindingId::LaunchPythonTorch,
                severity,
                format!(
                    "{python} cannot import torch, which {} imports at line {line}: every rank would fail with ModuleNotFoundError{}",
                    e.path,
                    if dry_run { "" } else { "; no rank was started" }
                ),
            )
            .fact("python", python)
            .fact("script", &e.path)
            .remedy("activate the environment that has torch before starting toporun, set PYTHON_EXEC to its interpreter, or put the trainer's Python first on PATH"),
        );
    }
    out
}

/// The first line of `source` that imports torch at the top level (column 0), so
/// it runs whenever the script does; imports inside functions or `try:` are not.
pub fn top_level_torch_import(source: &str) -> Option<u32> {
    source
        .lines()
        .position(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let torch = |m: &str| m.split('.').next() == Some("torch");
            !l.starts_with(char::is_whitespace)
                && match words.as_slice() {
                    ["import", rest @ ..] => rest.iter().any(|m| torch(m.trim_end_matches(','))),
                    ["from", m, "import", ..] => torch(m),
                    _ => false,
                }
        })
        .map(|i| i as u32 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(state: FileState) -> EntrypointFacts {
        EntrypointFacts {
            path: "nonexist.py".into(),
            cwd: "/work".into(),
            program: false,
            state,
            imports_torch_at: None,
            python_has_torch: None,
        }
    }

    #[test]
    fn a_missing_script_warns_in_a_dry_run_and_is_an_error_at_launch() {
        let f = facts(FileState::Missing);
        let dry = check(&f, "/usr/bin/python3", true);
        assert_eq!(dry.len(), 1);
        assert_eq!(dry[0].severity, Severity::Warning);
        assert!(
            dry[0]
                .summary
                .contains("nonexist.py does not exist in /work"),
            "{}",
            dry[0].summary
        );
        let real = check(&f, "/usr/bin/python3", false);
        assert_eq!(real[0].severity, Severity::Error);
        assert!(real[0].summary.contains("no rank was started"));
    }

    #[test]
    fn a_readable_script_says_nothing() {
        assert!(check(&facts(FileState::Readable), "python3", false).is_empty());
    }

    #[test]
    fn a_program_not_on_path_and_a_directory() {
        let mut f = facts(FileState::Missing);
        f.program = true;
        f.path = "trainer".into();
        assert!(check(&f, "", true)[0]
            .summary
            .contains("program trainer is not on PATH"));
        f.state = FileState::NotRunnable("a directory");
        assert!(check(&f, "", true)[0]
            .summary
            .contains("cannot be run: a directory"));
    }

    #[test]
    fn an_interpreter_without_torch_for_a_script_that_imports_it() {
        let mut f = facts(FileState::Readable);
        f.imports_torch_at = Some(3);
        f.python_has_torch = Some(false);
        let out = check(&f, "/usr/bin/python3", false);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].id, "launch.python_torch");
        assert!(out[0]
            .summary
            .starts_with("/usr/bin/python3 cannot import torch"));
        assert!(out[0].remedy.as_deref().unwrap().contains("PYTHON_EXEC"));
        f.python_has_torch = Some(true);
        assert!(check(&f, "/usr/bin/python3", false).is_empty());
        f.python_has_torch = None;
        assert!(check(&f, "/usr/bin/python3", false).is_empty());
    }

    #[test]
    fn only_top_level_torch_imports_count() {
        assert_eq!(top_level_torch_import("import os\nimport torch\n"), Some(2));
        assert_eq!(
            top_level_torch_import("import os, torch.distributed as dist\n"),
            Some(1)
        );
        assert_eq!(
            top_level_torch_import("from torch.nn import Linear\n"),
            Some(1)
        );
        assert_eq!(top_level_torch_import("import torchvision\n"), None);
        assert_eq!(
            top_level_torch_import("try:\n    import torch\nexcept ImportError:\n    pass\n"),
            None
        );
        assert_eq!(
            top_level_torch_import("# import torch\nx = 'import torch'\n"),
            None
        );
    }
}
