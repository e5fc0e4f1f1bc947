//! The run directory: `<log_dir or a temp dir>/<run_id>_<random>`, as torchrun names
//! it; the temp dir goes away at exit.

use crate::job::error::JobError;
use std::path::PathBuf;

/// 0700: rank output is the job's own, as under torchrun.
fn private() -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    std::fs::Permissions::from_mode(0o700)
}

/// Writes a report of the run directory as pretty JSON; best effort (a report that
/// cannot be written never fails the job).
pub fn write_json(path: &std::path::Path, v: &impl serde::Serialize) {
    if let Ok(s) = serde_json::to_string_pretty(v) {
        let _ = std::fs::write(path, s);
    }
}

/// Creates a directory (and its parents) that only the job's user can enter.
pub fn create_private_dir(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

/// The folders an attempt makes for what the ranks may write (flight-recorder dumps,
/// NCCL logs), removed at the attempt's end when nothing was written there.
const MAYBE_UNUSED: &[&str] = &["fr", "nccl"];

/// Removes an attempt's unused folders when dropped (after its reports were read).
pub struct UnusedRemoved(pub PathBuf);

impl Drop for UnusedRemoved {
    fn drop(&mut self) {
        for name in MAYBE_UNUSED {
            // Fails, and keeps the folder, when anything is in it.
            let _ = std::fs::remove_dir(self.0.join(name));
        }
    }
}

/// The job's run directory: `--log-dir`, else `torchelastic_*` in $TMPDIR, with
/// `<run id>_*` in it. Kept after the job, as torchrun keeps it: the failure summary
/// names the error files there, `--redirects` logs go there, and the reports and dumps
/// read after a failure stay for the user (toporun removes only the folders it made
/// and nobody used).
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    pub fn create(log_dir: Option<&str>, run_id: &str) -> Result<RunDir, JobError> {
        let base = match log_dir {
            Some(d) => {
                std::fs::create_dir_all(d).map_err(|source| JobError::Path {
                    what: "cannot create --log-dir",
                    path: d.into(),
                    source,
                })?;
                PathBuf::from(d)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("torchelastic_")
                    .permissions(private())
                    .tempdir()
                    .map_err(|source| JobError::Path {
                        what: "cannot create the run directory in",
                        path: std::env::temp_dir(),
                        source,
                    })?;
                t.keep()
            }
        };
        let run = tempfile::Builder::new()
            .prefix(&format!("{run_id}_"))
            .permissions(private())
            .tempdir_in(&base)
            .map_err(|source| JobError::Path {
                what: "cannot create the run directory in",
                path: base.clone(),
                source,
            })?;
        Ok(RunDir { path: run.keep() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_keeps_only_the_folders_it_used() {
        let d = tempfile::tempdir().unwrap();
        for name in ["fr", "nccl", "0"] {
            std::fs::create_dir(d.path().join(name)).unwrap();
        }
        std::fs::write(d.path().join("nccl/nccl.host.1.log"), "NCCL INFO\n").unwrap();
        drop(UnusedRemoved(d.path().to_path_buf()));
        assert!(!d.path().join("fr").exists());
        assert!(d.path().join("nccl/nccl.host.1.log").exists());
        assert!(d.path().join("0").exists());
    }
}
