//! Which operations NCCL times on the GPU (`KernelSampling`, in the shared crate,
//! says why): a burst of operations is timed, then none until the next burst, about
//! one period later (jittered, so a training step's rhythm cannot line up with it).
//! Operations are still counted as posted, one by one, whether timed or not.
//!
//! NCCL keeps one activation mask per process and reads it as each operation is
//! enqueued; the plugin flips its kernel-channel bit from the host thread that posts
//! operations. Only atomics: no lock, allocation or system call (the clock is read
//! through the vDSO).

use crate::abi::{EVENT_COLL, EVENT_KERNEL_CH, EVENT_P2P};
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};
use std::sync::OnceLock;
use std::time::Instant;
use toporun_shared::nccl_counters::{KernelSampling, SAMPLING_VAR};

/// Operations NCCL always reports to the plugin.
pub const POSTED: c_int = (EVENT_COLL | EVENT_P2P) as c_int;
/// With their kernels' channels timed.
pub const TIMED: c_int = POSTED | EVENT_KERNEL_CH as c_int;

/// The sampling the rank's environment asks for (toporun checked the value before
/// the rank started; one it did not check falls back to the default).
pub fn from_env() -> KernelSampling {
    std::env::var(SAMPLING_VAR)
        .ok()
        .and_then(|v| KernelSampling::parse(&v).ok())
        .unwrap_or_default()
}

/// NCCL's process-wide mask (null: no communicator counted).
static MASK: AtomicPtr<c_int> = AtomicPtr::new(std::ptr::null_mut());
/// Burst length; 0 with PERIOD_NS 0: every operation timed; 0 otherwise: none.
static BURST: AtomicU32 = AtomicU32::new(0);
static PERIOD_NS: AtomicU64 = AtomicU64::new(0);
/// Operations left to time in this burst.
static LEFT: AtomicU32 = AtomicU32::new(0);
/// When the next burst may begin (ns since EPOCH).
static NEXT_NS: AtomicU64 = AtomicU64::new(0);
static RNG: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn set_mask(value: c_int) {
    let p = MASK.load(Acquire);
    if !p.is_null() {
        // NCCL reads it with relaxed atomic loads; the pointer stays valid while a
        // communicator of this process lives.
        unsafe { AtomicI32::from_ptr(p) }.store(value, Relaxed);
    }
}

/// A communicator is counted: NCCL's mask is `mask`; the sampling is `s`. Returns
/// the mask to start with.
pub fn start(mask: *mut c_int, s: KernelSampling) -> c_int {
    let (burst, period_ns) = match s {
        KernelSampling::All => (0, 0),
        KernelSampling::Off => (0, u64::MAX),
        KernelSampling::Bursts { burst, period_ms } => (
            u32::try_from(burst).unwrap_or(u32::MAX),
            period_ms.saturating_mul(1_000_000),
        ),
    };
    BURST.store(burst, Relaxed);
    PERIOD_NS.store(period_ns, Relaxed);
    RNG.store(u64::from(std::process::id()) | 1 << 40, Relaxed);
    if !mask.is_null() {
        MASK.store(mask, Release);
    }
    // The first operations are timed: a job's first collectives say most about links.
    LEFT.store(burst, Relaxed);
    NEXT_NS.store(now_ns().saturating_add(jittered(period_ns)), Relaxed);
    match s {
        KernelSampling::Off => POSTED,
        _ => TIMED,
    }
}

/// The last counted communicator is gone: NCCL's mask may go with the plugin.
pub fn stop() {
    MASK.store(std::ptr::null_mut(), Release);
}

/// Whether operations posted now are being timed.
pub fn timing() -> bool {
    match (BURST.load(Relaxed), PERIOD_NS.load(Relaxed)) {
        (0, 0) => true,
        (0, _) => false,
        _ => LEFT.load(Relaxed) > 0,
    }
}

/// The host posted an operation: count it against the burst, or begin the next
/// burst when its time has come.
pub fn posted() {
    let burst = BURST.load(Relaxed);
    if burst == 0 {
        return; // all or none: the mask never changes
    }
    let left = LEFT.load(Relaxed);
    if left > 0 {
        if LEFT.fetch_sub(1, Relaxed) == 1 {
            set_mask(POSTED);
        }
        return;
    }
    let (now, next) = (now_ns(), NEXT_NS.load(Relaxed));
    if now < next {
        return;
    }
    let wait = jittered(PERIOD_NS.load(Relaxed));
    if NEXT_NS
        .compare_exchange(next, now.saturating_add(wait), Relaxed, Relaxed)
        .is_ok()
    {
        LEFT.store(burst, Relaxed);
        set_mask(TIMED);
    }
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

    #[test]
    fn the_jitter_stays_within_half_a_period_either_way() {
        for _ in 0..1000 {
            let j = jittered(100);
            assert!((50..150).contains(&j), "{j}");
        }
    }
}
