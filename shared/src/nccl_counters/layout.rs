//! The counters file toporun's NCCL profiler plugin writes and the agent reads: an
//! array of little-endian u64 words, one file per rank. The plugin maps it and
//! updates words atomically on NCCL's threads; the agent reads the file. Named word
//! indexes here are the one statement of the layout both sides use.

/// Words 0..HEADER_WORDS: the file's header.
pub const HEADER_WORDS: usize = 16;
/// "TOPONCCL" as a little-endian word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TOPONCCL");
/// Bumped when a word's meaning changes: 2 added S_DONE (version 1 files, as the
/// first GPU runs kept them, read with done = completed); 3 added sampling (the
/// header's H_SAMPLE_* words; earlier files timed every operation).
/// 4 added the kernel index words (`S_KERNEL_OPEN`) and the uncounted words of the
/// header (`H_UNCOUNTED`...); 5 the fastest big operation (`S_FAST_*`); 6 the slots
/// that posted point-to-point (`H_P2P_SLOTS`).
pub const VERSION: u64 = 6;

/// Header words.
pub const H_MAGIC: usize = 0;
pub const H_VERSION: usize = 1;
pub const H_PID: usize = 2;
/// Communicators initialised in this process, ever.
pub const H_INITS: usize = 3;
/// Events the plugin could not follow (its rings were full).
pub const H_DROPPED: usize = 4;
/// How the plugin picks operations to time on the GPU: bursts of H_SAMPLE_BURST
/// operations about H_SAMPLE_PERIOD_MS apart; 0 and 0: every one; 0 and
/// [`NEVER`]: none.
pub const H_SAMPLE_BURST: usize = 5;
pub const H_SAMPLE_PERIOD_MS: usize = 6;
pub const NEVER: u64 = u64::MAX;
/// Communicators this process did not count: every slot was live when they began.
pub const H_UNCOUNTED: usize = 7;
/// Communicators counted here whose hash a live slot already held: this process is
/// two ranks of one communicator (it drives two GPUs), which a reader must not take
/// as one rank's.
pub const H_TWO_RANKS: usize = 8;
/// Bit `s` set: slot `s`'s communicator posted a send or a recv, timed or not (under
/// sampling an untimed one leaves no total, and the ring keeps only the last 8);
/// cleared when a communicator claims the slot.
pub const H_P2P_SLOTS: usize = 9;

/// Communicators one file holds at once (a finalised one's slot is reused last).
pub const MAX_COMMS: usize = 32;
/// Words per communicator slot.
pub const SLOT_WORDS: usize = 128;
/// Beside each open-ring entry, the posted index + 1 its kernel start was stamped for
/// (`open_entry` says why): words SLOT_WORDS - OPEN_RING on.
pub const S_KERNEL_OPEN: usize = SLOT_WORDS - OPEN_RING;
/// Words in the whole file.
pub const FILE_WORDS: usize = HEADER_WORDS + MAX_COMMS * SLOT_WORDS;
/// Bytes in the whole file.
pub const FILE_BYTES: usize = FILE_WORDS * 8;

/// Slot states (word S_STATE).
pub const FREE: u64 = 0;
pub const LIVE: u64 = 1;
pub const FINALIZED: u64 = 2;

/// Slot words, from the slot's first word.
pub const S_STATE: usize = 0;
/// The communicator's hash: the same on every rank of it.
pub const S_COMM_HASH: usize = 1;
pub const S_RANK: usize = 2;
pub const S_NRANKS: usize = 3;
pub const S_NNODES: usize = 4;
/// Collectives and point-to-point operations posted (the host called them). Counted
/// as a post begins: the open ring's entry for the newest may follow a moment later.
pub const S_POSTED: usize = 5;
/// One past the highest posted index whose kernels NCCL timed to their stop:
/// operations of one communicator run in order on its stream, so all before it are
/// done too; under sampling, later ones may be done, untimed.
pub const S_TIMED_UPTO: usize = 6;
/// GPU time inside operations (ns): each one's last channel stop minus its first
/// channel start, waits for peers included.
pub const S_BUSY_NS: usize = 7;
/// The GPU timer at the latest completion.
pub const S_LAST_STOP_NS: usize = 8;
/// Bumped before and after the slot's identity words change (odd: being written).
pub const S_GENERATION: usize = 9;
/// Operations timed and completed, counted one by one (S_TIMED_UPTO is a high-water
/// mark: one completing after a later one does not move it). With sampling, S_BUSY_NS
/// over S_DONE is the mean GPU time of an operation.
pub const S_DONE: usize = 10;
/// The fastest operation of at least [`BIG_BYTES`] completed in the current epoch of
/// the GPU timer ([`FAST_EPOCH_NS`] long; the epoch + 1 in S_FAST_EPOCH), as its bytes
/// per ns times [`FAST_SCALE`], and its function; and the epoch before's. One that ran
/// with nothing beside it on the GPU runs at the link's speed, where a kernel sharing
/// the GPU with compute (DDP's buckets during backward) does not.
pub const S_FAST_EPOCH: usize = 11;
pub const S_FAST_RATE: usize = 12;
pub const S_FAST_FUNC: usize = 13;
pub const S_FAST_PREV_RATE: usize = 14;
pub const S_FAST_PREV_FUNC: usize = 15;
pub const FAST_EPOCH_NS: u64 = 10_000_000_000;
pub const FAST_SCALE: u64 = 1024;

/// The last OPEN_RING posted operations, OPEN_WORDS each, from S_OPEN.
pub const S_OPEN: usize = 16;
pub const OPEN_RING: usize = 8;
pub const OPEN_WORDS: usize = 4;
/// Entry words: posted index + 1 (0: empty), function (its id in the low 32 bits;
/// the first sampled GPU captures also set bit 32, the plugin's guess that NCCL times
/// it: ignored), bytes, GPU timer when its first channel started (0: not yet, or not
/// timed: with sampling, an operation whose channels reported is the one NCCL timed).
pub const O_INDEX1: usize = 0;
pub const O_FUNC: usize = 1;
pub const O_BYTES: usize = 2;
pub const O_KERNEL_START: usize = 3;
/// The bits of an entry's function word that hold the function's id.
pub const FUNC_ID_BITS: u64 = 0xffff_ffff;

/// Per function (by [`super::NcclFunc`] id), FUNC_WORDS each, from S_FUNCS.
pub const S_FUNCS: usize = S_OPEN + OPEN_RING * OPEN_WORDS;
pub const FUNC_WORDS: usize = 6;
/// Function words: completed, bytes, GPU ns; and of those of at least
/// [`BIG_BYTES`], count, bytes and GPU ns (smaller ones time latency, not links).
pub const F_COUNT: usize = 0;
pub const F_BYTES: usize = 1;
pub const F_GPU_NS: usize = 2;
pub const F_BIG_COUNT: usize = 3;
pub const F_BIG_BYTES: usize = 4;
pub const F_BIG_GPU_NS: usize = 5;
/// Operations from this size count for bandwidth.
pub const BIG_BYTES: u64 = 1 << 20;

/// Word index of slot `slot`'s word `word`.
pub const fn slot_word(slot: usize, word: usize) -> usize {
    HEADER_WORDS + slot * SLOT_WORDS + word
}

/// Word index, within a slot, of open-ring entry `i`'s word `word`.
pub const fn open_word(i: usize, word: usize) -> usize {
    S_OPEN + (i % OPEN_RING) * OPEN_WORDS + word
}

/// Word index, within a slot, of open-ring entry `i`'s kernel index.
pub const fn kernel_word(i: usize) -> usize {
    S_KERNEL_OPEN + i % OPEN_RING
}

/// Word index, within a slot, of function `func`'s word `word`.
pub const fn func_word(func: usize, word: usize) -> usize {
    S_FUNCS + func * FUNC_WORDS + word
}

const _: () = assert!(func_word(super::func::NcclFunc::COUNT, 0) <= S_KERNEL_OPEN);
const _: () = assert!(MAX_COMMS <= 64 && H_P2P_SLOTS < HEADER_WORDS);
