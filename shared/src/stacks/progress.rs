//! Whether ranks make progress. A rank makes none while every thread's frames and line
//! numbers stay the same and it writes nothing; the job hangs when every rank has made
//! none for the hang timeout. A rank inside one blocking call (a checkpoint write)
//! longer than the timeout counts as making none: the timeout must exceed it.

use super::model::RankStack;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// One look at a rank: where its threads stand, and how much it has written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub signature: u64,
    /// Bytes written so far (/proc/<pid>/io wchar): output, logs, checkpoints.
    pub written: u64,
}

impl Sample {
    pub fn of(stack: &RankStack, written: u64) -> Sample {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        stack.threads.hash(&mut h);
        Sample {
            signature: h.finish(),
            written,
        }
    }
}

/// Each rank's last sample, and when it last changed.
#[derive(Debug)]
pub struct Progress {
    last: BTreeMap<u32, (Sample, Instant)>,
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            last: BTreeMap::new(),
        }
    }

    /// Records rank `rank`'s sample taken at `now`.
    pub fn observe(&mut self, rank: u32, sample: Sample, now: Instant) {
        if self.last.get(&rank).is_none_or(|(s, _)| *s != sample) {
            self.last.insert(rank, (sample, now));
        }
    }

    /// How long rank `rank` has made no progress.
    pub fn stalled(&self, rank: u32, now: Instant) -> Option<Duration> {
        self.last
            .get(&rank)
            .map(|(_, at)| now.saturating_duration_since(*at))
    }

    /// When every one of `ranks` has made no progress for `timeout`: the shortest of
    /// their stalls (how long the job has hung).
    pub fn hung(&self, ranks: &[u32], timeout: Duration, now: Instant) -> Option<Duration> {
        let stalls: Option<Vec<Duration>> = ranks.iter().map(|r| self.stalled(*r, now)).collect();
        let least = stalls?.into_iter().min()?;
        (least >= timeout).then_some(least)
    }
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(signature: u64, written: u64) -> Sample {
        Sample { signature, written }
    }

    #[test]
    fn a_job_hangs_only_when_every_rank_stands_still() {
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let timeout = Duration::from_secs(10);
        let mut p = Progress::new();
        for r in 0..4 {
            p.observe(r, s(1, 0), t0);
        }
        // Rank 1 computes: its lines change every sample.
        for t in 1..=12 {
            p.observe(1, s(100 + t, 0), at(t));
            for r in [0, 2, 3] {
                p.observe(r, s(1, 0), at(t));
            }
        }
        assert_eq!(p.hung(&[0, 1, 2, 3], timeout, at(12)), None);
        // Rank 1 stops too: 10 s later the job hangs.
        for t in 13..=22 {
            for r in 0..4 {
                p.observe(r, s(if r == 1 { 112 } else { 1 }, 0), at(t));
            }
        }
        assert_eq!(
            p.hung(&[0, 1, 2, 3], timeout, at(22)),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn output_is_progress_and_an_unseen_rank_is_not_hung() {
        let t0 = Instant::now();
        let mut p = Progress::new();
        p.observe(0, s(1, 10), t0);
        p.observe(0, s(1, 20), t0 + Duration::from_secs(5));
        assert_eq!(
            p.stalled(0, t0 + Duration::from_secs(6)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(p.hung(&[0, 1], Duration::ZERO, t0), None);
    }
}
