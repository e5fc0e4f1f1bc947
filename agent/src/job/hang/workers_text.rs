//! Where the ranks' child processes (DataLoader workers) stand, for the hang report and
//! `toporun stacks`: a rank waiting for a batch stands in the DataLoader, and the
//! culprit frame is in a worker.

use crate::paths::Root;
use crate::stacks::{RankPid, Sampler};
use std::time::Duration;

/// Worker processes shown per rank, and frames per worker.
const WORKERS_SHOWN: usize = 4;
const WORKER_FRAMES: usize = 3;

/// `distributed/distributed_c10d.py`: the file and its folder.
fn short(file: &str) -> String {
    let parts: Vec<&str> = file.rsplit('/').take(2).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// Where the ranks' child processes (DataLoader workers) stand, bounded: a rank
/// waiting for a batch is held by a worker, whose frames are the culprit's.
pub fn workers_text(root: &Root, live: &[RankPid]) -> String {
    let mut sampler = Sampler::default();
    let mut out = String::new();
    for r in live {
        let kids: Vec<RankPid> = crate::stacks::children(root, r.pid)
            .into_iter()
            .take(WORKERS_SHOWN)
            .map(|pid| RankPid { pid, ..*r })
            .collect();
        for s in sampler.capture(&kids, Duration::from_secs(1)) {
            let Some(t) = s.main_thread() else {
                continue; // not a Python process, or gone
            };
            let frames: Vec<String> = t
                .frames
                .iter()
                .take(WORKER_FRAMES)
                .map(|f| format!("{} ({}:{})", f.function, short(&f.file), f.line))
                .collect();
            out.push_str(&format!(
                "  rank {} worker pid {}: {}\n",
                r.rank,
                s.pid,
                frames.join(" <- ")
            ));
        }
    }
    if out.is_empty() {
        return out;
    }
    format!("toporun: hang: where the ranks' worker processes stand (DataLoader workers):\n{out}")
}
