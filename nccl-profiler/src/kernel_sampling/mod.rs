//! Which operations NCCL times on the GPU (`KernelSampling`, in the shared crate,
//! says why): a burst of operations is timed, then none until the next burst, about
//! one period's worth of posts later (jittered, counted in posts so that where a burst
//! begins does not follow a step's pauses). Operations are still counted as posted,
//! one by one, whether timed or not.
//!
//! NCCL keeps one activation mask per process and copies it into each operation as
//! it is enqueued; the plugin flips its kernel-channel bit from the thread that posts
//! operations. The plugin's idea of which operations are timed is a guess (a group's
//! operations are all enqueued before its first post); the counters take an operation
//! as timed only once its kernel channels report. On the post path only atomics: no
//! lock, allocation or system call (the clock, read through the vDSO, about 16
//! times a period).

#[cfg(any(test, feature = "bench-control"))]
mod bench_control;
mod state;

#[cfg(feature = "bench-control")]
pub use bench_control::*;
#[cfg(any(test, feature = "bench-control"))]
pub use state::BenchMode;
#[cfg(test)]
pub use state::{POSTED, TIMED};

use state::*;
use std::ffi::c_int;
use std::sync::atomic::Ordering::*;
use toporun_shared::nccl_counters::sampling::LAUNCH_BLOCKING_VAR;
use toporun_shared::nccl_counters::{KernelSampling, SAMPLING_VAR};

/// The sampling the rank's environment asks for (toporun checked the value before
/// the rank started; one it did not check falls back to the default).
pub fn from_env() -> KernelSampling {
    let var = |k| std::env::var(k).ok();
    let blocking = var(LAUNCH_BLOCKING_VAR);
    KernelSampling::for_rank(var(SAMPLING_VAR).as_deref(), blocking.as_deref()).unwrap_or_default()
}

/// A communicator is counted: NCCL's mask is `mask`; the sampling is `s`. The first
/// communicator of a process sets the state up (a later one's init would relabel
/// operations already enqueued); every one then writes NCCL's mask as the state
/// says.
pub fn start(mask: *mut c_int, s: KernelSampling) {
    let mut users = USERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if *users == 0 {
        let (burst, period_ns) = state_words(s);
        STARTED_BURST.store(burst, SeqCst);
        STARTED_PERIOD_NS.store(period_ns, SeqCst);
        #[cfg(any(test, feature = "bench-control"))]
        BENCH.store(BenchMode::Sampled as i32, SeqCst);
        RNG.store(u64::from(std::process::id()) | 1 << 40, Relaxed);
        // The clock's epoch set here, not at a first post (its lock would be taken
        // there, by every thread posting at once).
        let _ = now_ns();
        RATE.store(0, Relaxed);
        HOT.clock_mask.store(0, Relaxed);
        // The first period begins with the first post: from init it would hold the
        // time the job took to post it, and a rate of one post.
        PERIOD_START_NS.store(0, Relaxed);
        PERIOD_START_POST.store(0, Relaxed);
        // The first operations are timed: a job's first collectives say most about
        // its links.
        HOT.posts.store(0, SeqCst);
        HOT.burst_from.store(0, SeqCst);
        HOT.burst.store(burst, SeqCst);
        HOT.period_ns.store(period_ns, SeqCst);
        MASK.store(mask, SeqCst);
    }
    *users += 1;
    sync_mask();
}

/// A counted communicator is gone; with the last, NCCL's mask may go with the plugin.
pub fn stop() {
    let mut users = USERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *users = users.saturating_sub(1);
    if *users == 0 {
        MASK.store(std::ptr::null_mut(), SeqCst);
    }
}

/// The host posted an operation: whether NCCL times it (as far as this plugin can
/// tell: the mask as its posts left it when the operation was enqueued; operations
/// of one group were all enqueued before the group's first post). Counts it against
/// the burst, or towards the next. Outside bursts: a load and a store and a few
/// loads; the clock only now and then.
pub fn post() -> bool {
    let burst = u64::from(HOT.burst.load(Relaxed));
    if burst == 0 {
        return HOT.period_ns.load(Relaxed) == 0; // all, or none: the mask never changes
    }
    // A load and a store, not a locked read-modify-write (which stalls the post
    // while it holds the line). Posts of two threads racing here (two
    // communicators, or NCCL's host-callback thread beside the launching one) may
    // share an index or set the count back: a burst comes a few posts early or
    // late, and a mask left behind is made the state's again at the next period's
    // end. Only where bursts fall depends on this count.
    let i = HOT.posts.load(Relaxed);
    HOT.posts.store(i.wrapping_add(1), Relaxed);
    if i & HOT.clock_mask.load(Relaxed) == 0 {
        count_rate(i);
    }
    let from = HOT.burst_from.load(SeqCst);
    let end = from.saturating_add(burst);
    if i.saturating_add(1) == from {
        // This one was enqueued before the bit goes on: the next `burst` are timed.
        sync_mask();
    }
    if i < from {
        return false;
    }
    if i >= end {
        // A burst whose last post has not placed the next yet, or never will (another
        // thread's posts overtook it while it did): any later post places it.
        place_next_burst(from, i.saturating_add(1), i);
        return false;
    }
    if i + 1 == end {
        // The burst's last: the ones after it are not timed.
        place_next_burst(from, end, i);
    }
    #[cfg(feature = "bench-control")]
    bench_control::count_timed();
    true
}

/// The burst that began at `from` is over: the next begins a gap after post index
/// `after` (post `i` decides the gap), unless another thread placed it first.
fn place_next_burst(from: u64, after: u64, i: u64) {
    let next = after.saturating_add(next_gap(i));
    if HOT
        .burst_from
        .compare_exchange(from, next, SeqCst, SeqCst)
        .is_ok()
    {
        sync_mask();
    }
}

/// At post `i`: if a period has passed since the current one began, the posts it
/// held are the rate, and the clock is read about 16 times the next.
fn count_rate(i: u64) {
    let (now, start) = (now_ns().max(1), PERIOD_START_NS.load(Relaxed));
    if start == 0 {
        let _ = PERIOD_START_NS.compare_exchange(0, now, Relaxed, Relaxed);
        return;
    }
    if now.saturating_sub(start) < HOT.period_ns.load(Relaxed)
        || PERIOD_START_NS
            .compare_exchange(start, now, Relaxed, Relaxed)
            .is_err()
    {
        return;
    }
    let posts = i.saturating_sub(PERIOD_START_POST.swap(i, Relaxed));
    let rate = posts.max(1);
    RATE.store(rate, Relaxed);
    HOT.clock_mask.store(clock_mask(posts), Relaxed);
    // A burst placed further than any gap at this rate (from the first period's
    // estimate, or a faster rate's gap) comes a gap at this rate from here instead.
    let from = HOT.burst_from.load(SeqCst);
    if from > i.saturating_add(rate + rate / 2 + 1) {
        place_next_burst(from, i.saturating_add(1), i);
    }
    // Racing posts may have left the mask behind the count (see `post`): once a
    // period it is made the state's again.
    sync_mask();
}

/// Index bits that skip the clock: it is read about 16 times a period of `posts`,
/// at most every 64th post (a period's end is seen at most 64 posts late).
fn clock_mask(posts: u64) -> u64 {
    let every = (posts / 16).clamp(1, 64);
    (1 << every.ilog2()) - 1
}

/// Posts until the next burst after the one ending at post `i`: about one period's
/// worth, at least one. Before a period has ended, the posts so far scaled to one.
fn next_gap(i: u64) -> u64 {
    let mut rate = RATE.load(Relaxed);
    if rate == 0 {
        let elapsed = now_ns()
            .saturating_sub(PERIOD_START_NS.load(Relaxed))
            .max(1);
        let posts = i.saturating_sub(PERIOD_START_POST.load(Relaxed)) + 1;
        let period = HOT.period_ns.load(Relaxed);
        rate = u64::try_from(u128::from(posts) * u128::from(period) / u128::from(elapsed))
            .unwrap_or(u64::MAX);
    }
    jittered(rate).max(1)
}

/// A period between half and one and a half times `period` (xorshift).
fn jittered(period: u64) -> u64 {
    let mut x = RNG.load(Relaxed);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    RNG.store(x, Relaxed);
    (period / 2).saturating_add(x % period.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI32;
    use std::sync::Mutex;

    #[test]
    fn the_jitter_stays_within_half_a_period_either_way() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..1000 {
            let j = jittered(100);
            assert!((50..150).contains(&j), "{j}");
        }
        assert_eq!(jittered(0), 0);
        assert!(jittered(u64::MAX) >= u64::MAX / 2, "no overflow");
    }

    /// The sampling state is the process's: one test at a time.
    pub(super) static ONE: Mutex<()> = Mutex::new(());

    /// The clock moves on by `ms`.
    pub(super) fn advance_ms(ms: f64) {
        TEST_CLOCK_NS.fetch_add((ms * 1e6) as u64, SeqCst);
    }

    /// A communicator counted for the test's length (stopped even when it fails).
    pub(super) struct Counted;
    impl Counted {
        fn start(mask: &'static AtomicI32, s: KernelSampling) -> Counted {
            start(mask.as_ptr(), s);
            Counted
        }
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            stop();
        }
    }

    /// Bursts of `burst` about `period_ms` apart, counted for the test's length.
    pub(super) fn bursts(mask: &'static AtomicI32, burst: u64, period_ms: u64) -> Counted {
        Counted::start(mask, KernelSampling::Bursts { burst, period_ms })
    }

    /// Bursts of 2 an hour apart, as if the last hour held 100 posts: the gap after a
    /// burst is then 50 to 149 posts, and no period ends during a test.
    pub(super) fn hourly_bursts_of_2(mask: &'static AtomicI32) -> Counted {
        let counted = bursts(mask, 2, 3_600_000);
        RATE.store(100, Relaxed);
        counted
    }

    /// After a burst, the next begins about a period's worth of posts later (half to
    /// one and a half times), and times `burst` posts.
    #[test]
    fn bursts_come_a_period_of_posts_apart() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        static NCCL_MASK: AtomicI32 = AtomicI32::new(0);
        let _counted = hourly_bursts_of_2(&NCCL_MASK);
        let timed: Vec<bool> = (0..2).map(|_| post()).collect();
        assert_eq!(timed, [true, true]);
        assert_eq!(NCCL_MASK.load(Relaxed), POSTED);
        for _ in 0..20 {
            RATE.store(100, Relaxed); // as if the last hour held 100 posts
            let mut untimed = 0;
            while !post() {
                untimed += 1;
                assert!(untimed < 150, "no burst after {untimed} posts");
            }
            // The gap is jittered(100): 50 to 149 posts.
            assert!((50..150).contains(&untimed), "{untimed}");
            assert!(post(), "a burst of 2");
            assert_eq!(NCCL_MASK.load(Relaxed), POSTED, "the burst is over");
        }
    }

    /// The first period begins with the first post, however long after init it
    /// comes: from init, it held one post, and the next period's gaps were one post.
    #[test]
    fn the_first_period_begins_with_the_first_post() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        static NCCL_MASK: AtomicI32 = AtomicI32::new(0);
        let _counted = bursts(&NCCL_MASK, 2, 20);
        advance_ms(50.0);
        // 1000 posts 30 us apart: the first period (20 ms) ends at about post 667.
        for _ in 0..1000 {
            post();
            advance_ms(0.03);
        }
        let rate = RATE.load(Relaxed);
        assert!(
            (600..=700).contains(&rate),
            "a period of 20 ms at a post every 30 us held {rate} posts"
        );
    }

    /// Before any period has ended, the gap after a burst follows the posts so far
    /// scaled to a period (it was one post: all but one operation in each burst's
    /// length plus one timed until the first period ended).
    #[test]
    fn before_a_period_ends_bursts_are_spaced_by_the_posts_so_far() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        static NCCL_MASK: AtomicI32 = AtomicI32::new(0);
        let _counted = bursts(&NCCL_MASK, 2, 3_600_000);
        assert!(post() && post(), "the first operations are timed");
        assert_eq!(RATE.load(Relaxed), 0, "no period has ended");
        assert!(
            (0..10_000).all(|_| !post()),
            "two posts in microseconds: an hour holds billions"
        );
        assert_eq!(NCCL_MASK.load(Relaxed), POSTED);
    }

    /// A burst placed far (as from the first period's estimate when its first posts
    /// came at once) comes a gap at the measured rate away once a period ends.
    #[test]
    fn a_period_s_end_pulls_a_far_burst_to_its_rate() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        static NCCL_MASK: AtomicI32 = AtomicI32::new(0);
        let _counted = bursts(&NCCL_MASK, 2, 20);
        assert!(post() && post(), "the first operations are timed");
        HOT.burst_from.store(u64::MAX / 2, SeqCst);
        // A post every 20 us: the period (20 ms) ends at about post 1000, which
        // places the far burst a gap of 500 to 1500 posts on.
        let posts = (0..5000)
            .take_while(|_| {
                advance_ms(0.02);
                !post()
            })
            .count();
        assert!(
            (1000..=2600).contains(&posts),
            "the burst came after {posts} posts"
        );
    }

    /// A burst whose last post never placed the next (another thread's posts took
    /// the index it waited for): the next post places it, so bursts go on.
    #[test]
    fn bursts_go_on_when_the_burst_s_last_post_is_overtaken() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        static NCCL_MASK: AtomicI32 = AtomicI32::new(0);
        let _counted = hourly_bursts_of_2(&NCCL_MASK);
        HOT.burst_from.store(5, SeqCst);
        HOT.posts.store(50, SeqCst);
        let untimed = (0..200).take_while(|_| !post()).count();
        // This post and a gap of jittered(100): 51 to 150 untimed.
        assert!(
            (51..=150).contains(&untimed),
            "{untimed} posts to the next burst"
        );
        assert!(HOT.burst_from.load(Relaxed) > 50);
    }

    #[test]
    fn the_clock_is_read_about_16_times_a_period_and_at_least_every_64th_post() {
        let every = |posts| clock_mask(posts) + 1;
        assert_eq!(every(0), 1);
        assert_eq!(every(31), 1, "rare posts: every one");
        assert_eq!(every(32), 2);
        assert_eq!(every(100), 4, "a power of two, at most posts/16");
        assert_eq!(every(1024), 64);
        assert_eq!(every(u64::MAX), 64);
    }

    /// Threads posting at once: some but not all are timed, and at the next period's
    /// end NCCL's mask is as the state says.
    #[test]
    fn concurrent_posts_keep_the_burst_and_the_mask_consistent() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        static NCCL_MASK: AtomicI32 = AtomicI32::new(0);
        let _counted = bursts(&NCCL_MASK, 3, 1);
        assert_eq!(NCCL_MASK.load(Relaxed), TIMED);
        let timed: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..20_000).filter(|_| post()).count() as u32))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert!(timed > 0 && timed < 80_000, "{timed}");
        end_the_period_at_the_next_post();
        post();
        assert_eq!(NCCL_MASK.load(Relaxed), wanted(), "the mask is the state's");
    }

    /// The period ends at the next post: that post reads the clock, and a period
    /// of 1 ns has passed.
    pub(super) fn end_the_period_at_the_next_post() {
        HOT.clock_mask.store(0, Relaxed);
        HOT.period_ns.store(1, Relaxed);
        PERIOD_START_NS.store(1, Relaxed);
    }

    /// A count set back by a racing post leaves the mask behind the state (here:
    /// timing, where the state says the burst is ahead); the period's end mends it.
    #[test]
    fn a_period_end_makes_a_stale_mask_the_states_again() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        static NCCL_MASK: AtomicI32 = AtomicI32::new(0);
        let _counted = hourly_bursts_of_2(&NCCL_MASK);
        assert!(post() && post() && !post(), "the first burst, then none");
        // Ten posts before the next burst, at a rate that keeps it where it is.
        HOT.posts.store(HOT.burst_from.load(Relaxed) - 10, Relaxed);
        PERIOD_START_POST.store(0, Relaxed);
        NCCL_MASK.store(TIMED, Relaxed); // as a racing post's sync could leave it
        assert!(!post(), "outside a burst, the plugin follows nothing");
        assert_eq!(
            NCCL_MASK.load(Relaxed),
            TIMED,
            "stale until the period ends"
        );
        end_the_period_at_the_next_post();
        assert!(!post());
        assert_eq!(NCCL_MASK.load(Relaxed), POSTED);
    }
}
