//! How long a finalised communicator's context and slot rest before another
//! communicator takes them. A thread of NCCL's that passed the generation check just
//! before finalize may still be writing (a proxy thread descheduled between the check
//! and its stores); a second later it is done. Init and finalize only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

static GRACE_NS: AtomicU64 = AtomicU64::new(1_000_000_000);
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Now, in ns since the process's first use (never 0).
pub fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

/// Whether something finalised at `at_ns` (0: never) may be taken again.
pub fn rested(at_ns: u64) -> bool {
    at_ns == 0 || now_ns().saturating_sub(at_ns) >= GRACE_NS.load(Ordering::Relaxed)
}

/// Tests shorten the rest (the crate's own and its integration tests).
#[doc(hidden)]
pub fn set_for_tests(grace: Duration) {
    GRACE_NS.store(grace.as_nanos() as u64, Ordering::Relaxed);
}
