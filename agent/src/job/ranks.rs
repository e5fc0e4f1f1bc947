//! One attempt's rank commands: argv, environment, CPUs, log sinks and error file.

use crate::job::error::JobError;
use crate::job::spec::{Job, NodePlace};
use crate::supervise::{line_prefix, LogPlan, RankCmd};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toporun_shared::torchrun::worker;

pub fn rank_commands(
    p: &Job,
    node: &NodePlace,
    run_dir: &Path,
    attempt: u32,
    report_env: &BTreeMap<String, String>,
) -> Result<Vec<RankCmd>, JobError> {
    let job = p.job_env(node, attempt, run_dir);
    let template = p.opts.log_line_prefix_template.as_deref();
    node.places
        .iter()
        .map(|place| {
            let dir = PathBuf::from(&job.attempt_dir).join(place.local_rank.to_string());
            crate::job::run_dir::create_private_dir(&dir).map_err(|source| JobError::Path {
                what: "cannot create",
                path: dir.clone(),
                source,
            })?;
            let diagnostics = p.diagnostics_env();
            let env = p.rank_env(
                place,
                &job,
                &[&node.extra_env.vars, report_env, &diagnostics],
            );
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
                watch_stderr: p.watch_stderr,
            };
            let (stdout, stderr) = plan.sinks();
            Ok(RankCmd {
                local_rank: place.local_rank,
                rank: place.rank,
                argv: worker::worker_argv(&p.opts, &p.python, place.local_rank),
                env,
                cpus: p.cpus_for(place.local_rank)?,
                error_file: dir.join("error.json"),
                stdout,
                stderr,
                stderr_tail: Default::default(),
            })
        })
        .collect()
}
