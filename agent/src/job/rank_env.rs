//! Every variable toporun adds to an attempt's ranks besides the plan and torchrun's
//! own, in one place and without I/O: the launch and the dry run call it alike. The
//! launch makes the directories the variables name beforehand
//! (`recorder::prepare_dumps`, the attempt directory).

use crate::job::failure::recorder::recorder_vars;
use crate::job::preemption::STOP_FILE_VAR;
use crate::job::spec::Job;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// torch's file timer: the file the ranks' FileTimerClient writes to.
pub const TIMER_FILE_VAR: &str = "TORCHELASTIC_TIMER_FILE";

/// Where an attempt's files are, as the ranks' variables name them.
pub struct AttemptPlaces<'a> {
    pub run_dir: &'a Path,
    pub attempt_dir: &'a Path,
    /// The file timer's file, where toporun serves one.
    pub timer_file: Option<String>,
    /// XDG_CACHE_HOME for the ranks, where their cache root cannot be written.
    pub cache_home: Option<PathBuf>,
}

/// What every rank of the attempt gets from toporun: `report` (the NCCL report's
/// capture), the file timer, the flight recorder's settings, the stop file, the
/// diagnostics. Each applies where the user set nothing (`Job::rank_env`).
pub fn attempt_env(
    p: &Job,
    at: &AttemptPlaces,
    report: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = report.clone();
    if let Some(f) = &at.timer_file {
        env.insert(TIMER_FILE_VAR.into(), f.clone());
    }
    let recorder = recorder_vars(p, at.attempt_dir);
    if let (false, Some(cache)) = (recorder.is_empty(), &at.cache_home) {
        env.insert("XDG_CACHE_HOME".into(), cache.display().to_string());
    }
    env.extend(recorder);
    let stop_file = p.stop_file(at.run_dir);
    env.insert(STOP_FILE_VAR.into(), stop_file.display().to_string());
    env.extend(p.diagnostics_env());
    env
}
