//! toporun's NCCL profiler plugin. NCCL loads it from `NCCL_PROFILER_PLUGIN` (toporun
//! sets it for every rank it starts) and calls the `ncclProfiler_v5` table: per
//! communicator, every collective and point-to-point operation as it is posted and
//! its kernel channels' GPU start and stop times. The plugin counts them into the
//! rank's counters file (`TOPORUN_NCCL_COUNTERS`), which toporun's agent reads for
//! hangs, stragglers and link speeds. No panic crosses into NCCL.

mod abi;
mod comm_pool;
mod counters_file;
mod events;
mod kernel_sampling;
mod library_pin;
mod reuse_grace;

#[doc(hidden)]
pub use reuse_grace::set_for_tests as set_reuse_grace_for_tests;

pub use abi::{
    CollDescr, DescrUnion, EventDescr, KernelChDescr, P2pDescr, ProfilerV5, StateArgs, EVENT_COLL,
    EVENT_KERNEL_CH, EVENT_P2P, NCCL_SUCCESS, STATE_KERNEL_CH_STOP,
};
pub use counters_file::PATH_VAR;
pub use toporun_shared::nccl_counters::SAMPLING_VAR;

use abi::{Logger, NcclResult, LOG_INFO, LOG_INIT};
use counters_file::Claimed;
use events::Ticket;
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// The table NCCL looks up.
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclProfiler_v5: ProfilerV5 = ProfilerV5 {
    name: c"toporun".as_ptr(),
    init,
    start_event,
    stop_event,
    record_event_state,
    finalize,
};

/// Runs `f`; a panic is caught and turned into `on_panic`.
fn guarded<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

fn log(logfn: Logger, text: &str) {
    let (Some(log), Ok(text)) = (logfn, CString::new(text)) else {
        return;
    };
    unsafe {
        log(
            LOG_INFO,
            LOG_INIT,
            c"toporun".as_ptr(),
            0,
            c"%s".as_ptr(),
            text.as_ptr(),
        )
    };
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn init(
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    _name: *const c_char,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Logger,
) -> NcclResult {
    // Every outcome is success (a null context where the communicator is not
    // counted): an error makes newer NCCL unload the plugin under the other
    // communicators.
    guarded(NCCL_SUCCESS, || {
        if context.is_null() {
            return NCCL_SUCCESS; // nowhere to say a context: nothing counted
        }
        *context = std::ptr::null_mut();
        let Some(path) = std::env::var_os(PATH_VAR).map(PathBuf::from) else {
            return NCCL_SUCCESS; // not started by toporun: no events asked
        };
        library_pin::pin();
        let identity = [comm_id, rank as u64, nranks as u64, nnodes as u64];
        match counters_file::claim(&path, identity) {
            Ok(Claimed::Slot(slot)) => {
                let sampling = kernel_sampling::from_env();
                counters_file::sampling(&slot, sampling.words());
                let comm = comm_pool::take(slot);
                *context = Box::into_raw(Box::new(Ticket::new(comm))).cast();
                // Writes NCCL's mask as the sampling says (atomically: the posting
                // threads write it too).
                kernel_sampling::start(mask, sampling);
                log(logfn, &format!("toporun profiler: communicator {comm_id:#x} rank {rank} of {nranks} counted in {}", path.display()));
                NCCL_SUCCESS
            }
            Ok(Claimed::Full) => {
                log(logfn, "toporun profiler: every counters slot is live; this communicator is not counted (the file's header counts it)");
                NCCL_SUCCESS
            }
            Err(e) => {
                // Success with no context: an error makes newer NCCL unload the
                // plugin while other communicators may still use it.
                log(
                    logfn,
                    &format!(
                        "toporun profiler: cannot map {}: {e}; this communicator is not counted",
                        path.display()
                    ),
                );
                NCCL_SUCCESS
            }
        }
    })
}

unsafe extern "C" fn start_event(
    context: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut EventDescr,
) -> NcclResult {
    guarded(NCCL_SUCCESS, || {
        if handle.is_null() {
            return NCCL_SUCCESS;
        }
        *handle = std::ptr::null_mut();
        if context.is_null() || descr.is_null() {
            return NCCL_SUCCESS;
        }
        #[cfg(feature = "bench-control")]
        if kernel_sampling::bench_ignores() {
            return NCCL_SUCCESS;
        }
        if let Some(comm) = (*(context as *const Ticket)).comm() {
            *handle = comm.start(&*descr);
        }
        NCCL_SUCCESS
    })
}

unsafe extern "C" fn stop_event(handle: *mut c_void) -> NcclResult {
    guarded(NCCL_SUCCESS, || {
        events::stop(handle);
        NCCL_SUCCESS
    })
}

unsafe extern "C" fn record_event_state(
    handle: *mut c_void,
    state: c_int,
    args: *mut StateArgs,
) -> NcclResult {
    guarded(NCCL_SUCCESS, || {
        if state == STATE_KERNEL_CH_STOP && !args.is_null() {
            events::channel_stop_time(handle, (*args).kernel_ch_timer);
        }
        NCCL_SUCCESS
    })
}

unsafe extern "C" fn finalize(context: *mut c_void) -> NcclResult {
    guarded(NCCL_SUCCESS, || {
        if context.is_null() {
            return NCCL_SUCCESS;
        }
        // The ticket is never freed (NCCL may still pass it); the context goes back
        // to the pool, its generation moved on. Events still in flight
        // (ncclCommAbort) never stop, or stop late: ignored.
        if let Some(comm) = (*(context as *const Ticket)).comm() {
            comm.release();
            comm_pool::give_back(comm);
        }
        NCCL_SUCCESS
    })
}

/// A benchmark's switch, in builds with the `bench-control` feature only (the
/// counters would no longer say which operations are timed): 0 no event asked, 1
/// posts counted, 2 the rank's sampling, 3 every operation timed, 4 posts reported
/// but ignored (`kernel_sampling::BenchMode`). Returns 0, or -1 where no communicator
/// is counted or the mode is unknown. `scripts/device/gpu_profiler_cost_inproc_rank.py`
/// calls it.
#[cfg(feature = "bench-control")]
#[no_mangle]
pub extern "C" fn toporun_nccl_profiler_bench_mode(mode: c_int) -> c_int {
    guarded(-1, || {
        match kernel_sampling::BenchMode::from_code(mode).map(kernel_sampling::bench_mode) {
            Some(true) => 0,
            _ => -1,
        }
    })
}

/// Operations timed in bursts so far (bench builds only).
#[cfg(feature = "bench-control")]
#[no_mangle]
pub extern "C" fn toporun_nccl_profiler_bench_timed() -> u64 {
    kernel_sampling::BENCH_TIMED.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_at_the_boundary() {
        assert_eq!(guarded(7, || panic!("inside the plugin")), 7);
        assert_eq!(guarded(7, || 1), 1);
    }
}
