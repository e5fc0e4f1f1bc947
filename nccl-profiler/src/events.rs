//! One communicator's events. A posted operation takes a record from a ring made at
//! init; its kernel channels are records inside it. NCCL's threads (the one that
//! ends a group, the proxy thread) meet only in atomics: nothing here allocates,
//! locks or makes a system call.
//!
//! A context, its records and its slot stay valid for the life of the process
//! (`comm_pool`): NCCL may report an event of a communicator after finalising it
//! (a proxy thread shared by split communicators reports its last channels late;
//! an abort leaves channels started and never stopped). Such an event finds its
//! communicator's generation moved on and is ignored.

use crate::abi::{EventDescr, EVENT_COLL, EVENT_KERNEL_CH, EVENT_P2P};
use crate::counters_file::{self, Slot};
use crate::kernel_sampling;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use toporun_shared::nccl_counters::layout::*;
use toporun_shared::nccl_counters::open_entry;
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
    /// The communicator's generation when the record was taken.
    generation: AtomicU64,
    /// The posted index it follows, plus one (0: never used).
    index1: AtomicU64,
    func: AtomicU64,
    bytes: AtomicU64,
    /// Channels NCCL said it runs on; 0: not said (CollNet's operations carry 0 and
    /// still report their channels), the last channel running is the last.
    channels_expected: AtomicU32,
    started: AtomicU32,
    stopped: AtomicU32,
    /// Set by the one stop that completes it (later stops change nothing).
    completed: AtomicU32,
    first_start: AtomicU64,
    last_stop: AtomicU64,
    channels: [Channel; CHANNELS],
}

/// A communicator's context: what NCCL holds is a [`Ticket`] to it.
pub struct Comm {
    /// The slot's file (never unmapped) and index, set at each use.
    file: AtomicPtr<AtomicU64>,
    slot: AtomicUsize,
    /// Bumped when the communicator is finalised: events of an earlier use are
    /// ignored.
    generation: AtomicU64,
    ops: Box<[Op]>,
}

// Shared by NCCL's threads: every field that changes after the context is made is an
// atomic; the raw pointers are set once, before NCCL sees the context.
unsafe impl Sync for Comm {}
unsafe impl Send for Comm {}

/// What NCCL holds as a communicator's context: the context and the generation it
/// was given in (a few bytes a communicator, never freed).
pub struct Ticket {
    comm: &'static Comm,
    generation: u64,
}

impl Ticket {
    pub fn new(comm: &'static Comm) -> Ticket {
        Ticket {
            comm,
            generation: comm.generation.load(Acquire),
        }
    }

    /// The communicator, unless finalised since.
    pub fn comm(&self) -> Option<&'static Comm> {
        (self.comm.generation.load(Acquire) == self.generation).then_some(self.comm)
    }
}

impl Comm {
    /// A context for the communicator of `slot`, its records linked to it, for good.
    pub fn leak(slot: Slot) -> &'static Comm {
        let ops = (0..RING).map(|_| Op::new()).collect();
        let comm: &'static mut Comm = Box::leak(Box::new(Comm {
            file: AtomicPtr::new(std::ptr::null_mut()),
            slot: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            ops,
        }));
        let me: *const Comm = comm;
        for op in comm.ops.iter_mut() {
            op.comm = me;
            let op_ptr: *const Op = op;
            for ch in op.channels.iter_mut() {
                ch.op = op_ptr;
            }
        }
        comm.take(slot);
        comm
    }

    /// The context serves the communicator of `slot` (new, or taken again from the
    /// pool): records of an earlier use are cleared.
    pub fn take(&self, slot: Slot) {
        for op in self.ops.iter() {
            op.index1.store(0, Relaxed);
            op.started.store(0, Relaxed);
            op.stopped.store(0, Relaxed);
        }
        self.file.store(slot.file_ptr(), Relaxed);
        self.slot.store(slot.index, Release);
    }

    /// The communicator is finalised: its events from now on are ignored, its slot
    /// freed for another.
    pub fn release(&self) {
        self.generation.fetch_add(1, AcqRel);
        counters_file::release(&self.slot());
        kernel_sampling::stop();
    }

    fn slot(&self) -> Slot {
        let index = self.slot.load(Acquire);
        Slot::at(self.file.load(Relaxed), index)
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
        let slot = self.slot();
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
        let index = slot.word(S_POSTED).fetch_add(1, Relaxed);
        if func.is_p2p() {
            counters_file::posted_p2p(&slot);
        }
        open_entry::publish(&slot.words(), index, func.id() as u64, bytes);
        let op = &self.ops[index as usize % RING];
        if !timed {
            std::ptr::null_mut()
        } else if !op.free(slot.word(S_TIMED_UPTO).load(Acquire)) {
            // The record's operation is not done (the host is 256 ahead of the GPU).
            counters_file::dropped(&slot);
            std::ptr::null_mut()
        } else {
            op.reset(self.generation.load(Relaxed), index, func, bytes, channels);
            op as *const Op as *mut c_void
        }
    }

    /// Operation `index` finished on the GPU, `first..last` on its timer.
    fn complete(&self, index: u64, func: NcclFunc, bytes: u64, first: u64, last: u64) {
        let slot = self.slot();
        let ns = last.saturating_sub(first);
        slot.word(S_BUSY_NS).fetch_add(ns, Relaxed);
        slot.word(S_LAST_STOP_NS).fetch_max(last, Relaxed);
        let f = |w| slot.word(func_word(func.id(), w));
        f(F_COUNT).fetch_add(1, Relaxed);
        f(F_BYTES).fetch_add(bytes, Relaxed);
        f(F_GPU_NS).fetch_add(ns, Relaxed);
        if bytes >= BIG_BYTES {
            f(F_BIG_COUNT).fetch_add(1, Relaxed);
            f(F_BIG_BYTES).fetch_add(bytes, Relaxed);
            f(F_BIG_GPU_NS).fetch_add(ns, Relaxed);
            note_fastest(&slot, func, bytes, ns, last);
        }
        slot.word(S_DONE).fetch_add(1, Relaxed);
        slot.word(S_TIMED_UPTO).fetch_max(index + 1, Release);
    }
}

/// A big operation of `bytes` took `ns` on the GPU, ending at `last` on its timer:
/// the epoch's fastest where none was faster. Completions of one communicator come
/// from NCCL's proxy thread, one at a time: plain loads and stores.
fn note_fastest(slot: &Slot, func: NcclFunc, bytes: u64, ns: u64, last: u64) {
    if ns == 0 {
        return;
    }
    let rate = u64::try_from(u128::from(bytes) * u128::from(FAST_SCALE) / u128::from(ns))
        .unwrap_or(u64::MAX);
    let epoch = last / FAST_EPOCH_NS + 1;
    let w = |i| slot.word(i);
    let now = w(S_FAST_EPOCH).load(Relaxed);
    if now != epoch {
        let (prev_rate, prev_func) = if now + 1 == epoch {
            (w(S_FAST_RATE).load(Relaxed), w(S_FAST_FUNC).load(Relaxed))
        } else {
            (0, 0)
        };
        w(S_FAST_PREV_RATE).store(prev_rate, Relaxed);
        w(S_FAST_PREV_FUNC).store(prev_func, Relaxed);
        w(S_FAST_RATE).store(0, Relaxed);
        w(S_FAST_EPOCH).store(epoch, Relaxed);
    }
    if rate > w(S_FAST_RATE).load(Relaxed) {
        w(S_FAST_FUNC).store(func.id() as u64, Relaxed);
        w(S_FAST_RATE).store(rate, Relaxed);
    }
}

impl Op {
    fn new() -> Op {
        Op {
            tag: TAG_OP,
            comm: std::ptr::null(),
            generation: AtomicU64::new(0),
            index1: AtomicU64::new(0),
            func: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            channels_expected: AtomicU32::new(0),
            started: AtomicU32::new(0),
            stopped: AtomicU32::new(0),
            completed: AtomicU32::new(0),
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

    fn reset(&self, generation: u64, index: u64, func: NcclFunc, bytes: u64, channels: u8) {
        self.generation.store(generation, Relaxed);
        self.index1.store(index + 1, Relaxed);
        self.func.store(func.id() as u64, Relaxed);
        self.bytes.store(bytes, Relaxed);
        self.channels_expected.store(channels.into(), Relaxed);
        self.started.store(0, Relaxed);
        self.stopped.store(0, Relaxed);
        self.completed.store(0, Relaxed);
        self.first_start.store(u64::MAX, Relaxed);
        self.last_stop.store(0, Release);
    }

    /// The communicator, unless the record is of an earlier use of its context.
    fn comm(&self) -> Option<&Comm> {
        // Set once when the context was made; the context is never freed.
        let comm = unsafe { &*self.comm };
        (comm.generation.load(Acquire) == self.generation.load(Acquire)).then_some(comm)
    }

    /// Whether the stop that made `stopped` stops is the operation's last: the
    /// channels NCCL said all stopped, or, where it said none, every channel started
    /// so far.
    fn last_channel(&self, stopped: u32) -> bool {
        let expected = self.channels_expected.load(Relaxed);
        let last = if expected == 0 {
            stopped == self.started.load(Acquire)
        } else {
            stopped >= expected
        };
        last && self.completed.swap(1, AcqRel) == 0
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
    let Some(comm) = op.comm() else {
        return std::ptr::null_mut();
    };
    let Some(ch) = op.channels.get(usize::from(id)) else {
        counters_file::dropped(&comm.slot());
        return std::ptr::null_mut();
    };
    ch.start.store(timer, Relaxed);
    ch.stop.store(0, Relaxed);
    op.first_start.fetch_min(timer, Relaxed);
    if op.started.fetch_add(1, AcqRel) == 0 {
        open_entry::stamp_kernel_start(&comm.slot().words(), op.index(), timer);
    }
    ch as *const Channel as *mut c_void
}

/// NCCL recorded a state of the event of `handle`: a channel's stop time.
///
/// # Safety
/// `handle` is null or one this plugin returned.
pub unsafe fn channel_stop_time(handle: *mut c_void, timer: u64) {
    if tag_of(handle) == TAG_CH {
        (*(handle as *const Channel)).stop.store(timer, Relaxed);
    }
}

/// The event of `handle` stops: for a channel, the operation completes with its
/// last channel.
///
/// # Safety
/// `handle` is null or one this plugin returned.
pub unsafe fn stop(handle: *mut c_void) {
    if tag_of(handle) != TAG_CH {
        return; // An operation's own stop means enqueued, not done.
    }
    let ch = &*(handle as *const Channel);
    let op = &*ch.op;
    let Some(comm) = op.comm() else {
        return; // finalised since: its slot may count another communicator now
    };
    let stop = ch.stop.load(Relaxed).max(ch.start.load(Relaxed));
    op.last_stop.fetch_max(stop, Relaxed);
    let stopped = op.stopped.fetch_add(1, AcqRel) + 1;
    if op.last_channel(stopped) {
        let func = NcclFunc::from_id(op.func.load(Relaxed));
        let first = op.first_start.load(Relaxed);
        comm.complete(
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
