//! The status endpoint: liveness, readiness, Prometheus metrics and a JSON status of
//! the job on this node (`--status-port`, `TORCHELASTIC_HEALTH_CHECK_PORT`).

mod metrics;
mod server;
mod state;

pub use server::serve;
pub use state::{JobStatus, RankState, RankStatus, Snapshot};
