//! A benchmark's switch of what the plugin asks of NCCL (builds with the
//! `bench-control` feature, and the unit tests): never on a shipped plugin's path.

use crate::kernel_sampling::state::{
    bench_now, now_ns, state_words, sync_mask, BenchMode, BENCH, HOT, PERIOD_START_NS,
    SAMPLING_LEFT_NS, STARTED_BURST, STARTED_PERIOD_NS, USERS,
};
use std::ffi::c_int;
#[cfg(feature = "bench-control")]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::*;
use toporun_shared::nccl_counters::KernelSampling;

impl BenchMode {
    /// From the exported control's number (0-4 in the order above).
    pub fn from_code(code: c_int) -> Option<BenchMode> {
        [
            Self::Silent,
            Self::Posted,
            Self::Sampled,
            Self::All,
            Self::Ignored,
        ]
        .get(usize::try_from(code).ok()?)
        .copied()
    }
}

/// Switches what NCCL is asked for; false where no communicator is counted.
pub fn bench_mode(mode: BenchMode) -> bool {
    let users = USERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if *users == 0 {
        return false;
    }
    let (burst, period_ns) = match mode {
        BenchMode::Silent | BenchMode::Posted | BenchMode::Ignored => {
            state_words(KernelSampling::Off)
        }
        // Bursts go on where they stopped (restarting them here gave every short
        // segment a burst at its start).
        BenchMode::Sampled => (STARTED_BURST.load(SeqCst), STARTED_PERIOD_NS.load(SeqCst)),
        BenchMode::All => state_words(KernelSampling::All),
    };
    pause_period_clock(bench_now(), mode);
    BENCH.store(mode as i32, SeqCst);
    // Through (0, period) only, a mode of its own: (burst, 0) would end a period at
    // every post. A post racing the switch may count under either mode; the benchmark
    // switches between timed blocks.
    HOT.burst.store(0, SeqCst);
    HOT.period_ns.store(period_ns, SeqCst);
    HOT.burst.store(burst, SeqCst);
    sync_mask();
    true
}

/// Whether a benchmark has the plugin ignore what NCCL reports.
#[cfg(feature = "bench-control")]
pub fn bench_ignores() -> bool {
    bench_now() == BenchMode::Ignored
}

/// The period's clock runs only while sampling, so that a benchmark's sampled
/// blocks learn the rate a job sampling all along would (counted over wall time,
/// the posts of a quarter of it would place bursts four times as often).
fn pause_period_clock(was: BenchMode, mode: BenchMode) {
    let now = now_ns();
    match (was == BenchMode::Sampled, mode == BenchMode::Sampled) {
        (true, false) => SAMPLING_LEFT_NS.store(now, SeqCst),
        (false, true) => {
            let away = now.saturating_sub(SAMPLING_LEFT_NS.load(SeqCst));
            let _ = PERIOD_START_NS.fetch_update(SeqCst, SeqCst, |s| (s != 0).then(|| s + away));
        }
        _ => {}
    }
}

/// Posts the plugin took as timed while bursting, for a benchmark's check that
/// bursts are as rare as meant (bench builds only: not on a shipped hot path).
#[cfg(feature = "bench-control")]
pub static BENCH_TIMED: AtomicU64 = AtomicU64::new(0);

#[cfg(feature = "bench-control")]
pub(super) fn count_timed() {
    BENCH_TIMED.fetch_add(1, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::{post, POSTED, TIMED};
    use super::*;
    use std::sync::atomic::AtomicI32;

    /// A benchmark's blocks outside sampling do not count towards the period, so the
    /// sampled blocks learn the rate a job sampling all along would.
    #[test]
    fn the_bench_switch_stops_the_period_clock_outside_sampling() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        static NCCL_MASK: AtomicI32 = AtomicI32::new(0);
        let _counted = hourly_bursts_of_2(&NCCL_MASK);
        post(); // the first period begins
        let before = PERIOD_START_NS.load(Relaxed);
        assert!(bench_mode(BenchMode::Posted));
        advance_ms(30.0);
        assert!(bench_mode(BenchMode::All), "still away from sampling");
        advance_ms(30.0);
        assert!(bench_mode(BenchMode::Sampled));
        let moved = PERIOD_START_NS.load(Relaxed) - before;
        assert_eq!(moved, 60_000_000, "the period begins as much later");
        assert!(bench_mode(BenchMode::Sampled));
        assert_eq!(
            PERIOD_START_NS.load(Relaxed) - before,
            moved,
            "sampling all along"
        );
    }

    /// A benchmark's switch: silent empties NCCL's mask, posted leaves the post bits,
    /// all sets the kernel bit, and the started sampling comes back with its bursts.
    #[test]
    fn the_bench_switch_writes_what_each_mode_asks_of_nccl() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        assert!(!bench_mode(BenchMode::All), "no communicator counted yet");
        static NCCL_MASK: AtomicI32 = AtomicI32::new(0);
        let _counted = hourly_bursts_of_2(&NCCL_MASK);
        assert!(bench_mode(BenchMode::Silent));
        assert_eq!(NCCL_MASK.load(Relaxed), 0);
        assert!(bench_mode(BenchMode::Posted));
        assert_eq!(NCCL_MASK.load(Relaxed), POSTED);
        assert!(!post(), "posted: nothing timed");
        assert!(bench_mode(BenchMode::All));
        assert_eq!(NCCL_MASK.load(Relaxed), TIMED);
        assert!(post() && post() && post(), "all: every one timed");
        assert!(bench_mode(BenchMode::Sampled));
        assert_eq!(NCCL_MASK.load(Relaxed), TIMED, "the first burst still open");
        assert!(post() && post());
        assert!(!post(), "a burst of 2, then none");
        assert_eq!(NCCL_MASK.load(Relaxed), POSTED);
        assert_eq!(BenchMode::from_code(0), Some(BenchMode::Silent));
        assert_eq!(BenchMode::from_code(3), Some(BenchMode::All));
        assert!(bench_mode(BenchMode::Ignored));
        assert_eq!(NCCL_MASK.load(Relaxed), POSTED, "NCCL still reports posts");
        assert_eq!(bench_now(), BenchMode::Ignored);
        assert!(bench_mode(BenchMode::Posted));
        assert_eq!(bench_now(), BenchMode::Posted);
        assert_eq!(BenchMode::from_code(4), Some(BenchMode::Ignored));
        assert_eq!(BenchMode::from_code(5), None);
        assert_eq!(BenchMode::from_code(-1), None);
    }
}
