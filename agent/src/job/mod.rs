//! The job's lifecycle on one node, behind one call: the launcher builds a [`Job`]
//! (options, facts, plan, interpreter) and hands it to [`run`] with its signal
//! [`Events`](crate::supervise::Events); rendezvous, attempts, restarts, supervision
//! and the NCCL report happen here. Submodules depend on each other in one
//! direction (lifecycle -> session, ranks, nccl_report -> spec, error) and never on
//! this file.

mod error;
mod lifecycle;
pub mod nccl_report;
mod ranks;
mod run_dir;
mod session;
mod spec;

pub use error::JobError;
pub use lifecycle::run;
pub use spec::{Job, NodePlace};
