//! One attempt's rank commands: this node's ranks (Job::node_ranks, as the dry run
//! shows them) with their directories, log sinks and error files.

use crate::job::error::JobError;
use crate::job::spec::{Job, NodePlace};
use crate::supervise::{line_prefix, Duplicate, LogPlan, RankCmd};
use std::path::Path;
use toporun_shared::rank_env::AttemptPlaces;
use toporun_shared::user_env::UserEnv;

/// `at`: the attempt's places (its directory under `run_dir`); `report`: the NCCL
/// report's variables.
pub fn rank_commands(
    p: &Job,
    node: &NodePlace,
    (attempt, run_dir): (u32, &Path),
    at: &AttemptPlaces,
    report: &UserEnv,
) -> Result<Vec<RankCmd>, JobError> {
    let template = p.opts.log_line_prefix_template.as_deref();
    let duplicate = (
        duplicate_file(p, at.attempt_dir, false)?,
        duplicate_file(p, at.attempt_dir, true)?,
    );
    p.node_ranks(node, (attempt, run_dir), at, report)?
        .into_iter()
        .map(|spec| {
            let place = &spec.place;
            let dir = at.attempt_dir.join(place.local_rank.to_string());
            crate::job::run_dir::create_private_dir(&dir).map_err(|source| JobError::Path {
                what: "cannot create",
                path: dir.clone(),
                source,
            })?;
            let (r, t) = (
                p.opts.redirects.for_rank(place.local_rank),
                p.opts.tee.for_rank(place.local_rank),
            );
            let shown = p
                .opts
                .local_ranks_filter
                .as_ref()
                .is_none_or(|f| f.contains(&place.local_rank));
            let plan = LogPlan {
                redirect_out: r.stdout,
                redirect_err: r.stderr,
                tee_out: t.stdout,
                tee_err: t.stderr,
                shown,
                dir: &dir,
                prefix: line_prefix(template, &p.opts.role, place.rank, place.local_rank),
                watch_stderr: p.watch.stderr,
                duplicate: (duplicate.0.as_ref(), duplicate.1.as_ref()),
            };
            let (stdout, stderr) = plan.sinks();
            Ok(RankCmd {
                local_rank: place.local_rank,
                rank: place.rank,
                argv: spec.argv,
                env: spec.env,
                cpus: spec.cpus,
                error_file: dir.join("error.json"),
                stdout,
                stderr,
                stderr_tail: Default::default(),
            })
        })
        .collect()
}

/// `attempt_N/filtered_stdout.log` (or stderr's), made empty for the attempt where
/// filters were given, as torchrun opens it, even if no rank tees that stream.
fn duplicate_file(
    p: &Job,
    attempt_dir: &Path,
    stderr: bool,
) -> Result<Option<Duplicate>, JobError> {
    let needles = p.opts.line_filters.of(stderr);
    if needles.is_empty() {
        return Ok(None);
    }
    let name = if stderr {
        "filtered_stderr.log"
    } else {
        "filtered_stdout.log"
    };
    let file = attempt_dir.join(name);
    crate::supervise::private_file(&file).map_err(|source| JobError::Path {
        what: "cannot create",
        path: file.clone(),
        source,
    })?;
    Ok(Some(Duplicate {
        needles: needles.to_vec(),
        file,
    }))
}
