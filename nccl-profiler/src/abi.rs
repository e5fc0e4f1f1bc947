//! NCCL's profiler plugin interface, version 5 (NCCL 2.28.3 and later; 2.29 still
//! loads it), written from `ext-profiler/example/nccl/profiler_v5.h` and
//! `profiler.h`. Only the members this plugin reads are spelled out; a union member
//! left out makes the union smaller than NCCL's, which is sound for a reader.

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// ncclResult_t.
pub type NcclResult = c_int;
pub const NCCL_SUCCESS: NcclResult = 0;

/// Event type bits (ncclProfileColl...).
pub const EVENT_COLL: u64 = 1 << 1;
pub const EVENT_P2P: u64 = 1 << 2;
pub const EVENT_KERNEL_CH: u64 = 1 << 6;

/// ncclProfilerKernelChStop: its args carry the channel's GPU stop time.
pub const STATE_KERNEL_CH_STOP: c_int = 22;

/// ncclDebugLogger_t: (level, flags, file, line, fmt, ...).
pub type Logger =
    Option<unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...)>;
/// NCCL_LOG_INFO and the NCCL_INIT subsystem.
pub const LOG_INFO: c_int = 3;
pub const LOG_INIT: c_ulong = 1;

/// ncclProfilerEventDescr_v5_t.
#[repr(C)]
pub struct EventDescr {
    pub kind: u64,
    pub parent: *mut c_void,
    pub rank: c_int,
    pub u: DescrUnion,
}

#[repr(C)]
pub union DescrUnion {
    pub coll: CollDescr,
    pub p2p: P2pDescr,
    pub kernel_ch: KernelChDescr,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollDescr {
    pub seq: u64,
    pub func: *const c_char,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pDescr {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    pub parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelChDescr {
    pub channel_id: u8,
    /// The GPU's global timer when the channel started (ns).
    pub p_timer: u64,
}

/// ncclProfilerEventStateArgs_v5_t (its kernelCh member).
#[repr(C)]
pub union StateArgs {
    pub kernel_ch_timer: u64,
    pub proxy_step_size: usize,
}

pub type InitFn = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    Logger,
) -> NcclResult;
pub type StartFn =
    unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut EventDescr) -> NcclResult;
pub type StopFn = unsafe extern "C" fn(*mut c_void) -> NcclResult;
pub type RecordFn = unsafe extern "C" fn(*mut c_void, c_int, *mut StateArgs) -> NcclResult;
pub type FinalizeFn = unsafe extern "C" fn(*mut c_void) -> NcclResult;

/// ncclProfiler_v5_t.
#[repr(C)]
pub struct ProfilerV5 {
    pub name: *const c_char,
    pub init: InitFn,
    pub start_event: StartFn,
    pub stop_event: StopFn,
    pub record_event_state: RecordFn,
    pub finalize: FinalizeFn,
}

// The table is read-only and its name a static string.
unsafe impl Sync for ProfilerV5 {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Offsets as a C compiler lays out profiler_v5.h on x86-64 and aarch64 (LP64).
    #[test]
    fn layouts_match_the_header() {
        assert_eq!(offset_of!(EventDescr, u), 24);
        assert_eq!(offset_of!(CollDescr, count), 32);
        assert_eq!(offset_of!(CollDescr, datatype), 48);
        assert_eq!(offset_of!(CollDescr, n_channels), 56);
        assert_eq!(offset_of!(CollDescr, algo), 64);
        assert_eq!(size_of::<CollDescr>(), 88);
        assert_eq!(offset_of!(P2pDescr, count), 24);
        assert_eq!(offset_of!(P2pDescr, n_channels), 36);
        assert_eq!(offset_of!(KernelChDescr, p_timer), 8);
        assert_eq!(size_of::<StateArgs>(), 8);
        assert_eq!(size_of::<ProfilerV5>(), 48);
    }
}
