//! An attempt's NCCL counters directory, on /dev/shm (`CountersPlace` says why):
//! made private before the ranks start; at the attempt's end its files are copied
//! into the attempt's directory (`nccl-counters/`, what the ranks' NCCL last said,
//! for the user and the reports) and the directory removed.

use crate::job::run_dir::create_private_dir;
use crate::job::spec::Job;
use std::path::{Path, PathBuf};

pub struct CountersDir {
    dir: PathBuf,
    /// Where the last counters are kept: `<attempt dir>/nccl-counters`.
    kept: PathBuf,
}

impl CountersDir {
    /// The counters directory for attempt `attempt` of the run in `run_dir`, `ranks`
    /// ranks here, where the ranks load toporun's plugin; None where the counters
    /// cannot go to memory (said when `say`: the first attempt).
    pub fn make(
        p: &Job,
        (run_dir, attempt_dir): (&Path, &Path),
        attempt: u32,
        ranks: usize,
        say: bool,
    ) -> Option<Self> {
        let name = run_dir
            .file_name()
            .map_or_else(|| "run".to_string(), |n| n.to_string_lossy().into_owned());
        let place = p.counters_place(&name, attempt, ranks)?;
        let refusal = match place.dir().map(create_private_dir) {
            Some(Ok(())) => None,
            Some(Err(e)) => Some(format!(
                "cannot make {} ({e}): NCCL's own counters are off for this attempt",
                place
                    .dir()
                    .map_or(String::new(), |d| d.display().to_string())
            )),
            None => place.refusal(),
        };
        if let Some(why) = refusal {
            if say {
                crate::console::say_warning!("{why}");
            }
            return None;
        }
        place.dir().map(|d| CountersDir {
            dir: d.to_path_buf(),
            kept: attempt_dir.join("nccl-counters"),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Copies the counters files into the attempt's directory (best effort).
    fn keep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        if create_private_dir(&self.kept).is_err() {
            return;
        }
        for e in entries.flatten() {
            let _ = std::fs::copy(e.path(), self.kept.join(e.file_name()));
        }
    }
}

impl Drop for CountersDir {
    fn drop(&mut self) {
        self.keep();
        let _ = std::fs::remove_dir_all(&self.dir);
        // The run's folder goes with its last attempt (fails while another remains).
        if let Some(run) = self.dir.parent() {
            let _ = std::fs::remove_dir(run);
        }
    }
}
