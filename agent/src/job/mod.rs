//! The job's lifecycle on one node, behind one call: the launcher builds a [`Job`]
//! (options, facts, plan, interpreter) and hands it to [`run`] with its signal
//! [`Events`](crate::supervise::Events); rendezvous, attempts, restarts, supervision
//! and the NCCL report happen here. The core (`spec`, `error`, `entry`,
//! `transitions`, `round_loop`, `lifecycle`, `attempt`, `rank_events`, `ranks`, `run_dir`,
//! `nccl_report`, `preemption`) beside four rooms: `session/` (hosting or joining the
//! store, rounds, stops across nodes), `failure/` (why a rank failed, what it leads
//! to), `hang/` (stacks sampled, hangs decided and answered), `straggler/` (the rank
//! the others wait for, from the same samples). Submodules depend on each other in one
//! direction (lifecycle -> round_loop -> transitions, failure; lifecycle -> attempt ->
//! rank_events, session, failure, hang -> straggler -> spec, error) and never on this
//! file.

mod attempt;
mod attempt_timer;
mod attempt_watches;
mod counters_dir;
mod entry;
mod error;
mod failure;
mod hang;
mod lifecycle;
pub mod nccl_report;
mod preemption;
mod rank_events;
mod ranks;
mod round_loop;
mod run_dir;
mod session;
mod spec;
pub mod straggler;
mod task_guard;
mod transitions;

pub use error::JobError;
pub use failure::causes::XID_REPLAY_VAR;
pub use failure::recorder::gpu_timing_line;
pub use hang::stacks_socket;
pub use lifecycle::run;
pub use preemption::STOP_FILE_VAR;
pub use spec::{
    FileTimerSetting, HangWatch, Job, NodePlace, RdzvSettings, ReportSettings, StopSettings,
    WatchSettings, INIT_WARN_VAR, RDZV_TOKEN_VAR,
};
