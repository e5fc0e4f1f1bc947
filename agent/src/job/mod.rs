//! The job's lifecycle on one node, behind one call: the launcher builds a [`Job`]
//! (options, facts, plan, interpreter) and hands it to [`run`] with its signal
//! [`Events`](crate::supervise::Events); rendezvous, attempts, restarts, supervision
//! and the NCCL report happen here. Submodules depend on each other in one
//! direction (lifecycle -> session, ranks, nccl_report -> spec, error) and never on
//! this file.

mod causes;
mod entry;
mod error;
mod failure;
mod gpu_release;
mod hang_exchange;
mod hang_response;
mod hang_watch;
mod lifecycle;
mod meeting;
mod multi_node;
mod multi_node_join;
pub mod nccl_report;
mod node_table;
mod ranks;
mod rdzv_connect;
mod recorder;
mod run_dir;
mod session;
mod single_node;
mod spec;
pub mod stacks_socket;
mod store_host;
mod transitions;

pub use error::JobError;
pub use lifecycle::run;
pub use spec::{HangWatch, Job, NodePlace};
