//! One communicator's events. A posted operation takes a record from a ring made at
//! init; its kernel channels are records inside it. NCCL's threads (the one that
//! ends a group, the proxy thread) meet only in atomics: nothing here allocates,
//! locks or makes a system call.

use crate::abi::{EventDescr, EVENT_COLL, EVENT_KERNEL_CH, EVENT_P2P};
use crate::counters_file::{self, Slot};
use crate::kernel_sampling;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use toporun_shared::nccl_counters::layout::*;
use toporun_shared::nccl_counters::{datatype_bytes, NcclFunc};

/// Operations followed at once per communicator; an operation whose record is
/// still in use 256 posts later is counted, not followed.
const RING: usize = 256;
/// Channels per operation (NCCL's MAXCHANNELS).
const CHANNELS: usize = 64;

/// Handle tags: a handle's first 8 bytes say what it is.
const TAG_OP: u64 = 0x746f_706f_6f70_0001;
const TAG_CH: u64 = 0x746f_706f_6368_0002;

/// A channel of an operation's kernel.
#[repr(C)]
struct Channel {
    tag: u64,
    op: *const Op,
    start: AtomicU64,
    stop: AtomicU64,
}

/// A posted operation.
#[repr(C)]
struct Op {
    tag: u64,
    comm: *const Comm,
    /// The posted index it follows, plus one (0: never used).
    index1: AtomicU64,
    func: AtomicU64,
    bytes: AtomicU64,
    channels_expected: AtomicU32,
    started: AtomicU32,
    stopped: AtomicU32,
    first_start: AtomicU64,
    last_stop: AtomicU64,
    channels: [Channel; CHANNELS],
}

/// A communicator's context (what init hands NCCL).
pub struct Comm {
    slot: Slot,
    ops: Box<[Op]>,
}

impl Comm {
    /// A context for the communicator of `slot`, its records linked to it.
    pub fn new(slot: Slot) -> Box<Comm> {
        let ops = (0..RING).map(|_| Op::new()).collect();
        let mut comm = Box::new(Comm { slot, ops });
        let me: *const Comm = &*comm;
        for op in comm.ops.iter_mut() {
            op.comm = me;
            let op_ptr: *const Op = op;
            for ch in op.channels.iter_mut() {
                ch.op = op_ptr;
            }
        }
        comm
    }

    pub fn release(&self) {
        counters_file::release(&self.slot);
        kernel_sampling::stop();
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        self.slot.word(i)
    }

    /// An event starts; its handle (null: not followed).
    ///
    /// # Safety
    /// `d` is a descriptor NCCL passes, valid for the call.
    pub unsafe fn start(&self, d: &EventDescr) -> *mut c_void {
        match d.kind {
            EVENT_COLL => {
                let c = d.u.coll;
                self.post(c.func, c.count, c.datatype, c.n_channels)
            }
            EVENT_P2P => {
                let p = d.u.p2p;
                self.post(p.func, p.count, p.datatype, p.n_channels)
            }
            EVENT_KERNEL_CH => {
                channel_start(d.parent, d.u.kernel_ch.channel_id, d.u.kernel_ch.p_timer)
            }
            _ => std::ptr::null_mut(),
        }
    }

    /// The host posted an operation.
    unsafe fn post(
        &self,
        func: *const c_char,
        count: usize,
        dtype: *const c_char,
        channels: u8,
    ) -> *mut c_void {
        let func = NcclFunc::from_id(FUNC_NAMES.get(func, |s| NcclFunc::from_nccl(s).id() as u64));
        let bytes = count as u64 * DATATYPE_NAMES.get(dtype, datatype_bytes);
        // Whether NCCL times this one, as far as the posts tell: only those get a
        // record (a burst's records must not wait behind thousands of untimed ones).
        let timed = kernel_sampling::post();
        // The posted count is the index source: a read-modify-write, since two
        // threads may post one communicator at once (NCCL posts a plan's operations
        // from the thread that launches it, or from CUDA's host-callback thread for a
        // graph replay or while its host stream is busy), and one lost count would
        // leave this rank an operation behind its peers for good.
        let index = self.word(S_POSTED).fetch_add(1, Relaxed);
        self.publish_open(index, func, bytes);
        let op = &self.ops[index as usize % RING];
        let handle = if !timed {
            std::ptr::null_mut()
        } else if !op.free(self.word(S_COMPLETED).load(Acquire)) {
            // The record's operation is not done (the host is 256 ahead of the GPU).
            counters_file::dropped(&self.slot);
            std::ptr::null_mut()
        } else {
            op.reset(index, func, bytes, channels);
            op as *const Op as *mut c_void
        };
        if channels == 0 && timed {
            // No kernel channel will report it (nothing to move): done as posted.
            self.complete(index, func, bytes, 0, 0);
        }
        handle
    }

    /// The ring entry the agent reads while `index` is open.
    fn publish_open(&self, index: u64, func: NcclFunc, bytes: u64) {
        let i = index as usize;
        self.word(open_word(i, O_INDEX1)).store(0, Relaxed);
        self.word(open_word(i, O_FUNC))
            .store(func.id() as u64, Relaxed);
        self.word(open_word(i, O_BYTES)).store(bytes, Relaxed);
        self.word(open_word(i, O_KERNEL_START)).store(0, Relaxed);
        self.word(open_word(i, O_INDEX1)).store(index + 1, Release);
    }

    /// Operation `index` finished on the GPU, `first..last` on its timer.
    fn complete(&self, index: u64, func: NcclFunc, bytes: u64, first: u64, last: u64) {
        let ns = last.saturating_sub(first);
        self.word(S_BUSY_NS).fetch_add(ns, Relaxed);
        self.word(S_LAST_STOP_NS).fetch_max(last, Relaxed);
        let f = |w| self.word(func_word(func.id(), w));
        f(F_COUNT).fetch_add(1, Relaxed);
        f(F_BYTES).fetch_add(bytes, Relaxed);
        f(F_GPU_NS).fetch_add(ns, Relaxed);
        if bytes >= BIG_BYTES {
            f(F_BIG_COUNT).fetch_add(1, Relaxed);
            f(F_BIG_BYTES).fetch_add(bytes, Relaxed);
            f(F_BIG_GPU_NS).fetch_add(ns, Relaxed);
        }
        self.word(S_DONE).fetch_add(1, Relaxed);
        self.word(S_COMPLETED).fetch_max(index + 1, Release);
    }
}

impl Op {
    fn new() -> Op {
        Op {
            tag: TAG_OP,
            comm: std::ptr::null(),
            index1: AtomicU64::new(0),
            func: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            channels_expected: AtomicU32::new(0),
            started: AtomicU32::new(0),
            stopped: AtomicU32::new(0),
            first_start: AtomicU64::new(u64::MAX),
            last_stop: AtomicU64::new(0),
            channels: std::array::from_fn(|_| Channel {
                tag: TAG_CH,
                op: std::ptr::null(),
                start: AtomicU64::new(0),
                stop: AtomicU64::new(0),
            }),
        }
    }

    /// Whether the record may follow a new operation: never used, or its operation is
    /// done (itself, or passed by a later one: `completed`) and no channel of it runs.
    fn free(&self, completed: u64) -> bool {
        let old = self.index1.load(Acquire);
        let done = old == 0 || completed >= old;
        done && self.started.load(Acquire) == self.stopped.load(Acquire)
    }

    fn index(&self) -> u64 {
        self.index1.load(Relaxed).saturating_sub(1)
    }

    fn reset(&self, index: u64, func: NcclFunc, bytes: u64, channels: u8) {
        self.index1.store(index + 1, Relaxed);
        self.func.store(func.id() as u64, Relaxed);
        self.bytes.store(bytes, Relaxed);
        self.channels_expected.store(channels.into(), Relaxed);
        self.started.store(0, Relaxed);
        self.stopped.store(0, Relaxed);
        self.first_start.store(u64::MAX, Relaxed);
        self.last_stop.store(0, Release);
    }

    fn comm(&self) -> &Comm {
        // Set once at init; the context outlives its records.
        unsafe { &*self.comm }
    }
}

/// What the last NCCL string seen at one pointer said, in one word (the pointer above
/// the low byte, the value in it). NCCL names functions and datatypes with its own
/// static strings, one pointer each: matching the same one again on every post read
/// cold lines (the string, the name table) between a rank's Python and CUDA calls.
struct NameCache(AtomicU64);

static FUNC_NAMES: NameCache = NameCache(AtomicU64::new(0));
static DATATYPE_NAMES: NameCache = NameCache(AtomicU64::new(0));

impl NameCache {
    /// `parse(name)` (below 256) for the string at `s`, from the cache when the last
    /// string parsed was at `s`.
    ///
    /// # Safety
    /// `s` is null or a C string, and a pointer once seen names the same string for
    /// the process's life (NCCL's string literals do).
    unsafe fn get(&self, s: *const c_char, parse: impl FnOnce(&[u8]) -> u64) -> u64 {
        let key = (s as u64) << 8;
        let cached = self.0.load(Relaxed);
        if cached != 0 && cached & !0xff == key && (s as u64) >> 56 == 0 {
            return cached & 0xff;
        }
        let value = parse(bytes_of(s)).min(0xff);
        self.0.store(key | value, Relaxed);
        value
    }
}

/// NCCL's C string as bytes (empty where null).
unsafe fn bytes_of<'a>(s: *const c_char) -> &'a [u8] {
    if s.is_null() {
        return &[];
    }
    CStr::from_ptr(s).to_bytes()
}

/// What a handle is (null and foreign handles: nothing).
unsafe fn tag_of(handle: *const c_void) -> u64 {
    if handle.is_null() {
        return 0;
    }
    *(handle as *const u64)
}

/// A channel of `parent`'s kernel started at `timer`.
unsafe fn channel_start(parent: *mut c_void, id: u8, timer: u64) -> *mut c_void {
    if tag_of(parent) != TAG_OP {
        return std::ptr::null_mut();
    }
    let op = &*(parent as *const Op);
    let Some(ch) = op.channels.get(usize::from(id)) else {
        counters_file::dropped(&op.comm().slot);
        return std::ptr::null_mut();
    };
    ch.start.store(timer, Relaxed);
    ch.stop.store(0, Relaxed);
    op.first_start.fetch_min(timer, Relaxed);
    if op.started.fetch_add(1, AcqRel) == 0 {
        stamp_kernel_start(op.comm(), op.index(), timer);
    }
    ch as *const Channel as *mut c_void
}

/// The open-ring entry of `index` gets its first channel's start, unless the host
/// republished the entry for a later index meanwhile.
fn stamp_kernel_start(comm: &Comm, index: u64, timer: u64) {
    let entry = |w| comm.word(open_word(index as usize, w));
    if entry(O_INDEX1).load(Acquire) != index + 1 {
        return;
    }
    let stamped = entry(O_KERNEL_START).compare_exchange(0, timer, Relaxed, Relaxed);
    if stamped.is_ok() && entry(O_INDEX1).load(Acquire) != index + 1 {
        let _ = entry(O_KERNEL_START).compare_exchange(timer, 0, Relaxed, Relaxed);
    }
}

/// NCCL recorded a state of the event of `handle`: a channel's stop time.
///
/// # Safety
/// `handle` is null or one this plugin returned, and not yet stopped.
pub unsafe fn channel_stop_time(handle: *mut c_void, timer: u64) {
    if tag_of(handle) == TAG_CH {
        (*(handle as *const Channel)).stop.store(timer, Relaxed);
    }
}

/// The event of `handle` stops: for a channel, the operation completes with its
/// last channel.
///
/// # Safety
/// `handle` is null or one this plugin returned, and not yet stopped.
pub unsafe fn stop(handle: *mut c_void) {
    if tag_of(handle) != TAG_CH {
        return; // An operation's own stop means enqueued, not done.
    }
    let ch = &*(handle as *const Channel);
    let op = &*ch.op;
    let stop = ch.stop.load(Relaxed).max(ch.start.load(Relaxed));
    op.last_stop.fetch_max(stop, Relaxed);
    let stopped = op.stopped.fetch_add(1, AcqRel) + 1;
    if stopped == op.channels_expected.load(Relaxed) {
        let func = NcclFunc::from_id(op.func.load(Relaxed));
        let first = op.first_start.load(Relaxed);
        op.comm().complete(
            op.index(),
            func,
            op.bytes.load(Relaxed),
            first.min(stop),
            op.last_stop.load(Relaxed),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A pointer seen again gives what its string said without reading it; another
    /// pointer is read; null reads as empty every time.
    #[test]
    fn the_name_cache_reads_each_new_pointer_and_only_those() {
        let cache = NameCache(AtomicU64::new(0));
        let (a, b) = (c"ncclFloat32", c"ncclBfloat16");
        let reads = Cell::new(0);
        let get = |s: *const c_char| unsafe {
            cache.get(s, |name| {
                reads.set(reads.get() + 1);
                datatype_bytes(name)
            })
        };
        assert_eq!(get(a.as_ptr()), 4);
        assert_eq!(get(a.as_ptr()), 4);
        assert_eq!(reads.get(), 1, "the same pointer again: not read");
        assert_eq!(get(b.as_ptr()), 2);
        assert_eq!(get(a.as_ptr()), 4);
        assert_eq!(reads.get(), 3, "each change of pointer read");
        assert_eq!(get(std::ptr::null()), 0);
        assert_eq!(get(std::ptr::null()), 0);
        assert_eq!(reads.get(), 5, "null: never cached");
    }
}
