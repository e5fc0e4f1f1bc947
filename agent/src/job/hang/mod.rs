//! A job that stands still: each rank's stack sampled while it runs (`watch`), the
//! decision across nodes (`exchange`) on each node's samples (`node_sample`), what a
//! hang leads to (`response`), and every rank's stack on demand (`stacks_socket`,
//! `toporun stacks`), with where the ranks' DataLoader workers stand (`workers_text`);
//! an NCCL error torch's watchdog raised, said when it shows (`nccl_errors`).

pub(super) mod exchange;
mod nccl_errors;
pub(super) mod node_sample;
pub(super) mod response;
pub mod stacks_socket;
pub(super) mod watch;
pub(super) mod workers_text;
