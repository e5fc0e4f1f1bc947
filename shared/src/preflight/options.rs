//! What the caller asks of the host: GPUs expected, /dev/shm floor, requirements.

use serde::{Deserialize, Serialize};

/// What the job needs from the host, beyond the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Requirement {
    Nvlink,
    Rdma,
    Efa,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightOptions {
    pub expect_gpus: Option<u32>,
    pub min_shm_bytes: u64,
    /// --min-shm was given: a hard floor (error below it), not a recommendation.
    pub min_shm_explicit: bool,
    pub require: Vec<Requirement>,
}

/// NCCL's own advice (`--shm-size=1g`).
pub const DEFAULT_MIN_SHM: u64 = 1 << 30;

impl Default for PreflightOptions {
    fn default() -> Self {
        PreflightOptions {
            expect_gpus: None,
            min_shm_bytes: DEFAULT_MIN_SHM,
            min_shm_explicit: false,
            require: Vec::new(),
        }
    }
}

impl PreflightOptions {
    pub fn requires(&self, r: Requirement) -> bool {
        self.require.contains(&r)
    }
}
