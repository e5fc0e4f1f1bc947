//! What can end a job before its ranks decide it: bad input (exit 2) or a failure of
//! the machinery around them (exit 1).

use toporun_shared::torchrun::OptionsError;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The options or environment cannot describe a job (exit 2, like argparse).
    #[error("{0}")]
    Usage(String),
    /// The rendezvous, the store or the run directory failed (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl JobError {
    /// A failure with what it was doing and why.
    pub fn failed(context: impl std::fmt::Display, cause: impl std::fmt::Display) -> JobError {
        JobError::Failed(format!("{context}: {cause}"))
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            JobError::Usage(_) => 2,
            JobError::Failed(_) => 1,
        }
    }
}

impl From<OptionsError> for JobError {
    fn from(e: OptionsError) -> JobError {
        if e.usage {
            JobError::Usage(e.message)
        } else {
            JobError::Failed(e.message)
        }
    }
}
