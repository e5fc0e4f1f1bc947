//! The Python stacks of a job's ranks, as data: what a capture gives (`RankStack`),
//! grouped across ranks with the odd ones first (`merge`), whether ranks still make
//! progress (`progress`), the report of a hang (`hang_report`; from NCCL's counters:
//! `nccl_hang`) and the view across
//! nodes (`job_view`); what a rank was doing at a sample (`activity`), its recent
//! samples (`rank_window`) and the rank the others wait for (`straggler`; under overlapping
//! NCCL groups, communicator by communicator: `comm_waits`; the measure both use:
//! `wait_rule`); where a rank
//! stands in a hang, waiting for its peers or elsewhere (`standing`); what a rank in its
//! teardown said before (`teardown`).

pub mod activity;
pub mod comm_waits;
pub mod hang_report;
pub mod job_view;
mod merge;
mod model;
mod nccl_hang;
pub use nccl_hang::{
    busy_gpu, busy_line, counters_alone, nccl_verdict, BusyGpu, CountersAlone, NcclVerdict,
};
pub mod progress;
pub mod rank_window;
pub mod standing;
pub mod straggler;
pub mod teardown;
pub mod top_table;
pub mod wait_rule;

pub use merge::{merge, rank_label, ranks_text, render_placed, render_text, Group, Place, Places};
pub use model::{Frame, RankStack, ThreadStack};
