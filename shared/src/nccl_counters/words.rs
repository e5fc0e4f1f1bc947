//! A counters file built word by word, as the plugin writes it: for tests here and in
//! the crates that read the files (no GPU needed).

use super::func::NcclFunc;
use super::layout::*;

/// A file's words.
pub struct Words(pub Vec<u64>);

impl Default for Words {
    fn default() -> Self {
        let mut w = vec![0; FILE_WORDS];
        (w[H_MAGIC], w[H_VERSION]) = (MAGIC, VERSION);
        Words(w)
    }
}

impl Words {
    /// Slot `slot` live for communicator `hash`, rank `rank` of `nranks`, one node.
    pub fn comm(&mut self, slot: usize, hash: u64, rank: u32, nranks: u32) -> &mut Self {
        let s = |i| slot_word(slot, i);
        self.0[s(S_STATE)] = LIVE;
        self.0[s(S_COMM_HASH)] = hash;
        (self.0[s(S_RANK)], self.0[s(S_NRANKS)]) = (rank.into(), nranks.into());
        self.0[s(S_NNODES)] = 1;
        self
    }

    /// `posted` operations of `func` of `bytes` each, `completed` of them done
    /// with `gpu_ns` each.
    pub fn ops(
        &mut self,
        slot: usize,
        func: NcclFunc,
        bytes: u64,
        posted: u64,
        completed: u64,
        gpu_ns: u64,
    ) -> &mut Self {
        let s = |i| slot_word(slot, i);
        self.0[s(S_POSTED)] += posted;
        self.0[s(S_TIMED_UPTO)] += completed;
        self.0[s(S_DONE)] += completed;
        self.0[s(S_BUSY_NS)] += completed * gpu_ns;
        let f = |i| s(func_word(func.id(), i));
        self.0[f(F_COUNT)] += completed;
        self.0[f(F_BYTES)] += completed * bytes;
        self.0[f(F_GPU_NS)] += completed * gpu_ns;
        if bytes >= BIG_BYTES {
            self.0[f(F_BIG_COUNT)] += completed;
            self.0[f(F_BIG_BYTES)] += completed * bytes;
            self.0[f(F_BIG_GPU_NS)] += completed * gpu_ns;
        }
        let first_open = self.0[s(S_TIMED_UPTO)];
        self.ring(slot, first_open, func, bytes)
    }

    /// `posted` more operations of `func` that NCCL does not time (sampling).
    pub fn untimed(&mut self, slot: usize, func: NcclFunc, bytes: u64, posted: u64) -> &mut Self {
        let first = self.0[slot_word(slot, S_POSTED)];
        self.0[slot_word(slot, S_POSTED)] += posted;
        (self.0[H_SAMPLE_BURST], self.0[H_SAMPLE_PERIOD_MS]) = (8, 100);
        self.ring(slot, first, func, bytes)
    }

    /// The kernel of posted operation `index` of `slot` started at `ns` (with
    /// sampling: NCCL timed it).
    pub fn started(&mut self, slot: usize, index: u64, ns: u64) -> &mut Self {
        self.0[slot_word(slot, open_word(index as usize, O_KERNEL_START))] = ns;
        self.0[slot_word(slot, kernel_word(index as usize))] = index + 1;
        self
    }

    /// Ring entries for the operations posted from `first`.
    fn ring(&mut self, slot: usize, first: u64, func: NcclFunc, bytes: u64) -> &mut Self {
        let s = |i| slot_word(slot, i);
        for index in first..self.0[s(S_POSTED)] {
            let o = |i| s(open_word(index as usize, i));
            (self.0[o(O_INDEX1)], self.0[o(O_FUNC)], self.0[o(O_BYTES)]) =
                (index + 1, func.id() as u64, bytes);
        }
        self
    }

    /// The fastest big operation of `slot` lately: `func` at `gbps` (algorithm
    /// bandwidth).
    pub fn fastest(&mut self, slot: usize, func: NcclFunc, gbps: f64) -> &mut Self {
        let s = |i| slot_word(slot, i);
        self.0[s(S_FAST_EPOCH)] = 1;
        self.0[s(S_FAST_RATE)] = (gbps * FAST_SCALE as f64) as u64;
        self.0[s(S_FAST_FUNC)] = func.id() as u64;
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}
