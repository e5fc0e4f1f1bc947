//! The process's sampling state, shared by the post path (`kernel_sampling`) and a
//! benchmark's switch (`bench_control`): the hot words every post touches, the
//! period's clock, and NCCL's activation mask written to say what the state says.

use crate::abi::{EVENT_COLL, EVENT_KERNEL_CH, EVENT_P2P};
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;
#[cfg(not(test))]
use std::sync::OnceLock;
use toporun_shared::nccl_counters::KernelSampling;

/// Operations NCCL always reports to the plugin.
pub const POSTED: c_int = (EVENT_COLL | EVENT_P2P) as c_int;
/// With their kernels' channels timed.
pub const TIMED: c_int = POSTED | EVENT_KERNEL_CH as c_int;

/// The words every post reads or writes, on one cache line: between a rank's Python
/// and CUDA calls the line is cold, one miss rather than one a word.
#[repr(C, align(64))]
pub(crate) struct Hot {
    /// Burst length; 0 with `period_ns` 0: every operation timed; 0 otherwise: none.
    pub(crate) burst: AtomicU32,
    pub(crate) period_ns: AtomicU64,
    /// Posts counted while sampling: a post's index (a load and a store a post).
    pub(crate) posts: AtomicU64,
    /// The index of the current or next burst's first post. Bursts are placed in
    /// posts, not time: the post that begins one may come right before a pause, so the
    /// first one after a pause is timed as often as any other.
    pub(crate) burst_from: AtomicU64,
    /// The clock is read when a post's index has none of these bits: about 16 times a
    /// period, every post where posts are rare (the clock costs about as much as the
    /// rest of a post's bookkeeping).
    pub(crate) clock_mask: AtomicU64,
}

pub(crate) static HOT: Hot = Hot {
    burst: AtomicU32::new(0),
    period_ns: AtomicU64::new(0),
    posts: AtomicU64::new(0),
    burst_from: AtomicU64::new(0),
    clock_mask: AtomicU64::new(0),
};

/// NCCL's process-wide mask (null: no communicator counted).
pub(crate) static MASK: AtomicPtr<c_int> = AtomicPtr::new(std::ptr::null_mut());
/// Posts in the last period (0: none has ended yet), and the current period's start
/// (ns since EPOCH, 0 before the first post; and the post index): how many posts a
/// period holds, so bursts come about a period apart.
pub(crate) static RATE: AtomicU64 = AtomicU64::new(0);
pub(crate) static PERIOD_START_NS: AtomicU64 = AtomicU64::new(0);
pub(crate) static PERIOD_START_POST: AtomicU64 = AtomicU64::new(0);
/// The sampling the first communicator set (what `BenchMode::Sampled` returns to).
pub(crate) static STARTED_BURST: AtomicU32 = AtomicU32::new(0);
pub(crate) static STARTED_PERIOD_NS: AtomicU64 = AtomicU64::new(0);
/// A benchmark's mode (`BenchMode`'s code; sampled unless a benchmark switched).
#[cfg(any(test, feature = "bench-control"))]
pub(crate) static BENCH: AtomicI32 = AtomicI32::new(BenchMode::Sampled as i32);
/// When a benchmark last switched away from sampling.
#[cfg(any(test, feature = "bench-control"))]
pub(crate) static SAMPLING_LEFT_NS: AtomicU64 = AtomicU64::new(0);
pub(crate) static RNG: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
#[cfg(not(test))]
static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();

/// The monotonic clock (through the vDSO), in ns since the first reading.
#[cfg(not(test))]
pub(crate) fn now_ns() -> u64 {
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// The unit tests' clock, which they move (`kernel_sampling`'s tests' `advance_ms`):
/// periods end when a test says, whatever the machine does meanwhile.
#[cfg(test)]
pub(crate) static TEST_CLOCK_NS: AtomicU64 = AtomicU64::new(1_000_000_000);

#[cfg(test)]
pub(crate) fn now_ns() -> u64 {
    TEST_CLOCK_NS.load(SeqCst)
}

/// The mask the state asks for.
pub(crate) fn wanted() -> c_int {
    #[cfg(any(test, feature = "bench-control"))]
    if bench_now() == BenchMode::Silent {
        return 0;
    }
    // Sequentially consistent: a benchmark's switch changes these too.
    match (HOT.burst.load(SeqCst), HOT.period_ns.load(SeqCst)) {
        (0, 0) => TIMED,
        (0, _) => POSTED,
        (burst, _) => {
            // The next post's index inside the burst: the operation enqueued next is timed.
            let (next, from) = (HOT.posts.load(SeqCst), HOT.burst_from.load(SeqCst));
            if (from..from.saturating_add(burst.into())).contains(&next) {
                TIMED
            } else {
                POSTED
            }
        }
    }
}

/// NCCL's mask made to say what the state says. Two threads may change the state at
/// once (two communicators, NCCL's callback thread): each writes after its change
/// and writes again if the state moved meanwhile, so the last word is the state's
/// (sequentially consistent: a store still in one core's buffer must not land after
/// another core's later word). It retries only when another thread moved the state.
pub(crate) fn sync_mask() {
    let p = MASK.load(SeqCst);
    if p.is_null() {
        return;
    }
    // NCCL reads it with relaxed atomic loads; the pointer stays valid while a
    // communicator of this process lives (USERS).
    let mask = unsafe { AtomicI32::from_ptr(p) };
    loop {
        let want = wanted();
        mask.store(want, SeqCst);
        if wanted() == want {
            return;
        }
    }
}

/// `burst` and `period_ns` for a sampling (all: no burst, no period; off: no burst, a
/// period that never ends).
pub(crate) fn state_words(s: KernelSampling) -> (u32, u64) {
    let (burst, period_ms) = s.words();
    (
        u32::try_from(burst).unwrap_or(u32::MAX),
        period_ms.saturating_mul(1_000_000),
    )
}

/// Communicators counted in this process; the state is set up by the first and the
/// mask pointer dropped with the last (init and finalize only: a lock is fine).
pub(crate) static USERS: Mutex<u32> = Mutex::new(0);

#[cfg(any(test, feature = "bench-control"))]
/// What a benchmark has the plugin ask of NCCL, switched inside one process so that
/// each variant's cost is measured against the others on the same communicators
/// (separate processes differ by more than the plugin costs). The counters file's
/// header keeps the sampling the rank started with: not for a job toporun watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum BenchMode {
    /// No event asked: as if no plugin were loaded (NCCL checks an empty mask).
    Silent,
    /// Operations counted as posted, none timed.
    Posted,
    /// The sampling the rank started with; bursts go on where they stopped.
    Sampled,
    /// Every operation timed.
    All,
    /// As posted, but the plugin returns as soon as NCCL calls it: what NCCL's own
    /// calls cost, apart from the plugin's counting.
    Ignored,
}

#[cfg(any(test, feature = "bench-control"))]
/// The mode a benchmark switched to (sampled where none did).
pub fn bench_now() -> BenchMode {
    BenchMode::from_code(BENCH.load(SeqCst)).unwrap_or(BenchMode::Sampled)
}
