//! Why a job stopped, named: typed causes with a precedence (`cause`), the rank's
//! last Python exception from its output (`python_error`), /dev/shm exhausted
//! (`shm`), the OOM killer in the memory cgroup (`oom`), and the exit codes a pod
//! failure policy can act on (`exit_codes`).

mod cause;
pub mod disk;
pub mod exit_codes;
pub mod gpu_health;
pub mod gpu_memory;
pub mod judge;
pub mod last_words;
pub mod native_crash;
pub mod nccl_error;
pub mod oom;
pub mod peer;
pub mod python_error;
pub mod shm;
pub mod signal;
pub mod watchdog;
pub mod xid;

pub use cause::{by_precedence, Cause, CauseKind};
