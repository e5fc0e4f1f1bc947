//! A rank's counters file read into plain values.

use super::func::NcclFunc;
use super::layout::*;
use super::open_entry::{self, AtomicWords, SlotOf};
use super::sampling::KernelSampling;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CountersError {
    #[error("counters file has {0} bytes, fewer than the {FILE_BYTES} of its layout")]
    Short(usize),
    #[error("not a toporun NCCL counters file (magic {0:#x})")]
    Magic(u64),
    #[error("counters layout version {0}, this toporun reads 1 to {VERSION}")]
    Version(u64),
}

/// One rank's NCCL, as its profiler plugin last wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankCounters {
    pub pid: u32,
    /// Communicators initialised, ever.
    pub inits: u64,
    /// Events the plugin could not follow.
    pub dropped: u64,
    /// Slots in use (live or finalised), in slot order.
    pub comms: Vec<CommCounters>,
    /// Which operations NCCL times on the GPU.
    #[serde(default = "every_one")]
    pub sampling: KernelSampling,
    /// Communicators the plugin could not count (every slot live).
    #[serde(default)]
    pub uncounted: u64,
    /// Communicators of which this process holds two ranks (one process, two GPUs).
    #[serde(default)]
    pub two_ranks: u64,
}

/// One communicator on one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommCounters {
    pub slot: usize,
    pub generation: u64,
    pub live: bool,
    pub hash: u64,
    pub rank: u32,
    pub nranks: u32,
    pub nnodes: u32,
    pub posted: u64,
    /// One past the highest posted index whose completion NCCL timed: every
    /// operation before it completed; later ones may have too, untimed (sampling).
    #[serde(alias = "completed")]
    pub timed_upto: u64,
    /// Operations completed, one by one.
    pub done: u64,
    pub busy_ns: u64,
    pub last_stop_ns: u64,
    /// The last operations posted that the ring still holds, oldest first.
    #[serde(default)]
    pub recent: Vec<PostedOp>,
    /// It posted a send or a recv, timed or not (layout version 6; the plugin's own
    /// word, set at the post).
    #[serde(default)]
    pub posted_p2p: bool,
    /// NCCL times every operation (no sampling): `timed_upto` is exact.
    #[serde(default = "timed_by_default")]
    pub every_op_timed: bool,
    /// The fastest big operation of the last epoch or two of the GPU timer (from
    /// layout version 5).
    #[serde(default)]
    pub fastest: Option<Fastest>,
    /// Totals of the functions that ran.
    pub funcs: Vec<FuncTotals>,
}

/// The fastest big operation lately: its function and its algorithm bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fastest {
    pub func: NcclFunc,
    /// Bytes per ns: GB/s.
    pub gbps: f64,
}

/// An operation posted, as the ring holds it (completed or not).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PostedOp {
    /// Its posted index on the communicator (0-based).
    pub index: u64,
    pub func: NcclFunc,
    pub bytes: u64,
    /// GPU timer when its first channel started; None: its kernel has not started.
    pub kernel_start_ns: Option<u64>,
    /// NCCL times it on the GPU, so its completion will be seen: every operation is
    /// (no sampling), or its kernel channels reported.
    #[serde(default = "timed_by_default")]
    pub timed: bool,
}

impl PostedOp {
    /// Operation `index`, where the ring no longer holds it: what it was is not known.
    pub fn unknown(index: u64) -> PostedOp {
        PostedOp {
            index,
            func: NcclFunc::Unknown,
            bytes: 0,
            kernel_start_ns: None,
            timed: false,
        }
    }
}

fn every_one() -> KernelSampling {
    KernelSampling::All // files before sampling timed every operation
}

fn timed_by_default() -> bool {
    true // files before sampling timed every operation
}

/// One function's completed operations on one communicator.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FuncTotals {
    pub func: NcclFunc,
    pub count: u64,
    pub bytes: u64,
    pub gpu_ns: u64,
    pub big_count: u64,
    pub big_bytes: u64,
    pub big_gpu_ns: u64,
}

impl CommCounters {
    /// Operations posted past the last timed completion: still running, or (under
    /// sampling) completed untimed.
    pub fn past_timed(&self) -> u64 {
        self.posted.saturating_sub(self.timed_upto)
    }

    /// The first operation posted past the last timed completion, where the ring
    /// still holds it.
    pub fn first_past_timed(&self) -> Option<PostedOp> {
        (self.posted > self.timed_upto)
            .then(|| self.op(self.timed_upto))
            .flatten()
    }

    /// Posted operation `index`, where the ring still holds it.
    pub fn op(&self, index: u64) -> Option<PostedOp> {
        self.recent.iter().find(|o| o.index == index).copied()
    }

    /// It carries point-to-point traffic (send/recv: pipeline stages post different
    /// counts by design): one lately, or one ever completed (the totals stay set when
    /// the ring holds only collectives).
    pub fn carries_p2p(&self) -> bool {
        self.posted_p2p
            || self.recent.iter().any(|o| o.func.is_p2p())
            || self.funcs.iter().any(|f| f.func.is_p2p() && f.count > 0)
    }
}

/// Reads `bytes` (a whole counters file, as copied).
pub fn decode(bytes: &[u8]) -> Result<RankCounters, CountersError> {
    if bytes.len() < FILE_BYTES {
        return Err(CountersError::Short(bytes.len()));
    }
    let words: Vec<AtomicU64> = bytes
        .chunks_exact(8)
        .take(FILE_WORDS)
        .map(|c| AtomicU64::new(u64::from_le_bytes(c.try_into().unwrap_or_default())))
        .collect();
    decode_words(&words)
}

/// Reads a counters file's words as the plugin writes them (a live mapping): an
/// entry or a slot caught mid-write is left out, never read mixed.
pub fn decode_words(file: &[AtomicU64]) -> Result<RankCounters, CountersError> {
    if file.len() < FILE_WORDS {
        return Err(CountersError::Short(file.len() * 8));
    }
    let h = |i: usize| file[i].load(Ordering::Acquire);
    if h(H_MAGIC) != MAGIC {
        return Err(CountersError::Magic(h(H_MAGIC)));
    }
    let version = h(H_VERSION);
    if !(1..=VERSION).contains(&version) {
        return Err(CountersError::Version(version));
    }
    let sampling = match version {
        1 | 2 => KernelSampling::All,
        _ => KernelSampling::of_words(h(H_SAMPLE_BURST), h(H_SAMPLE_PERIOD_MS)),
    };
    let all_timed = sampling == KernelSampling::All;
    let p2p_slots = if version >= 6 { h(H_P2P_SLOTS) } else { 0 };
    let mut comms: Vec<CommCounters> = (0..MAX_COMMS)
        .filter_map(|slot| {
            let mut c = comm(
                &SlotOf { file, slot },
                slot,
                (all_timed, version >= 4, version >= 5),
            )?;
            c.posted_p2p = p2p_slots & (1 << slot) != 0;
            Some(c)
        })
        .collect();
    if version == 1 {
        comms.iter_mut().for_each(|c| c.done = c.timed_upto);
    }
    let since_v4 = |i| if version >= 4 { h(i) } else { 0 };
    Ok(RankCounters {
        pid: h(H_PID) as u32,
        inits: h(H_INITS),
        dropped: h(H_DROPPED),
        comms,
        sampling,
        uncounted: since_v4(H_UNCOUNTED),
        two_ranks: since_v4(H_TWO_RANKS),
    })
}

/// Slot `slot`'s communicator, unless free or caught while a new communicator takes
/// it (its generation odd, or moved while read); `all_timed`: the file times every
/// operation; `stamped`: it has the kernel index words; `version5`: the fastest words.
fn comm(
    w: &SlotOf,
    slot: usize,
    (all_timed, stamped, version5): (bool, bool, bool),
) -> Option<CommCounters> {
    let generation = w.load(S_GENERATION, Ordering::Acquire);
    let state = w.load(S_STATE, Ordering::Acquire);
    if state == FREE || generation % 2 == 1 {
        return None;
    }
    let r = |i: usize| w.load(i, Ordering::Relaxed);
    let (posted, timed_upto) = (r(S_POSTED), r(S_TIMED_UPTO).min(r(S_POSTED)));
    let recent = (posted.saturating_sub(OPEN_RING as u64)..posted)
        .filter_map(|i| open_op(w, i, all_timed, stamped))
        .collect();
    let funcs = (0..NcclFunc::COUNT)
        .map(|f| FuncTotals {
            func: NcclFunc::from_id(f as u64),
            count: r(func_word(f, F_COUNT)),
            bytes: r(func_word(f, F_BYTES)),
            gpu_ns: r(func_word(f, F_GPU_NS)),
            big_count: r(func_word(f, F_BIG_COUNT)),
            big_bytes: r(func_word(f, F_BIG_BYTES)),
            big_gpu_ns: r(func_word(f, F_BIG_GPU_NS)),
        })
        .filter(|t| t.count > 0)
        .collect();
    let fastest = [
        (S_FAST_RATE, S_FAST_FUNC),
        (S_FAST_PREV_RATE, S_FAST_PREV_FUNC),
    ]
    .into_iter()
    .map(|(rate, func)| (r(rate), r(func)))
    .filter(|(rate, _)| *rate > 0 && version5)
    .max_by_key(|(rate, _)| *rate)
    .map(|(rate, func)| Fastest {
        func: NcclFunc::from_id(func),
        gbps: rate as f64 / FAST_SCALE as f64,
    });
    let c = CommCounters {
        slot,
        generation,
        live: state == LIVE,
        hash: r(S_COMM_HASH),
        rank: r(S_RANK) as u32,
        nranks: r(S_NRANKS) as u32,
        nnodes: r(S_NNODES) as u32,
        posted,
        timed_upto,
        done: r(S_DONE),
        busy_ns: r(S_BUSY_NS),
        last_stop_ns: r(S_LAST_STOP_NS),
        recent,
        every_op_timed: all_timed,
        posted_p2p: false,
        fastest,
        funcs,
    };
    w.fence(Ordering::Acquire);
    (w.load(S_GENERATION, Ordering::Relaxed) == generation).then_some(c)
}

/// The ring's entry for posted index `index`, if it still holds that one whole.
fn open_op(w: &SlotOf, index: u64, all_timed: bool, stamped: bool) -> Option<PostedOp> {
    let e = open_entry::read(w, index, stamped)?;
    Some(PostedOp {
        index,
        func: NcclFunc::from_id(e.func_word & FUNC_ID_BITS),
        bytes: e.bytes,
        kernel_start_ns: e.kernel_start_ns,
        timed: all_timed || e.kernel_start_ns.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl_counters::words::Words;

    #[test]
    fn a_file_reads_back_its_communicators_and_open_operation() {
        let mut w = Words::default();
        w.comm(0, 0xabc, 1, 4)
            .ops(0, NcclFunc::AllReduce, 4 << 20, 10, 9, 1000);
        let c = decode(&w.bytes()).unwrap();
        assert_eq!(c.comms.len(), 1);
        let comm = &c.comms[0];
        assert_eq!((comm.hash, comm.rank, comm.nranks), (0xabc, 1, 4));
        assert_eq!(
            (comm.posted, comm.timed_upto, comm.past_timed()),
            (10, 9, 1)
        );
        assert_eq!(comm.busy_ns, 9000);
        let open = comm.first_past_timed().unwrap();
        assert_eq!(
            (open.index, open.func, open.bytes),
            (9, NcclFunc::AllReduce, 4 << 20)
        );
        assert_eq!(open.kernel_start_ns, None);
        assert_eq!(comm.funcs[0].big_bytes, 9 * (4 << 20));
    }

    #[test]
    fn a_foreign_or_short_file_is_refused() {
        assert_eq!(decode(&[0; 8]), Err(CountersError::Short(8)));
        let mut w = Words::default();
        w.0[H_MAGIC] = 7;
        assert_eq!(decode(&w.bytes()), Err(CountersError::Magic(7)));
        let mut w = Words::default();
        w.0[H_VERSION] = 9;
        assert_eq!(decode(&w.bytes()), Err(CountersError::Version(9)));
    }

    #[test]
    fn an_open_entry_overwritten_by_later_posts_is_not_guessed() {
        let mut w = Words::default();
        w.comm(0, 1, 0, 2).ops(0, NcclFunc::AllReduce, 64, 20, 0, 0);
        let c = decode(&w.bytes()).unwrap();
        assert_eq!(
            c.comms[0].first_past_timed(),
            None,
            "index 0 was overwritten by index 8 and 16"
        );
    }
}
