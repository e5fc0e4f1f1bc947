//! This node's ranks' NCCL counters, as toporun's profiler plugin writes them (one
//! file per rank in the attempt's counters directory, on /dev/shm). Each look maps a
//! file read-only for the moment of reading and reads its words atomically, as the
//! plugin's protocol wants (`open_entry`): an entry caught mid-write is left out,
//! never read mixed. No mapping outlives the look.

use crate::paths::Root;
use crate::probe::rank_usage;
use crate::stacks::RankPid;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use toporun_shared::nccl_counters::layout::{FILE_BYTES, FILE_WORDS, MAX_COMMS};
use toporun_shared::nccl_counters::{
    counters_file, decode_words, CountersError, NodeReading, RankCounters,
};

#[derive(Debug, Clone)]
pub struct CountersFiles {
    dir: PathBuf,
    /// Files already said to be unreadable (said once each).
    said: Arc<Mutex<BTreeSet<PathBuf>>>,
}

/// What a rank's counters file said.
#[derive(Debug)]
pub enum RankFile {
    /// Not made yet (its NCCL made no communicator, or loaded no plugin).
    None,
    Read(RankCounters),
    /// There, and not a counters file this toporun reads.
    Unreadable(CountersError),
}

impl CountersFiles {
    pub fn new(dir: PathBuf) -> CountersFiles {
        CountersFiles {
            dir,
            said: Default::default(),
        }
    }

    /// Rank `r`'s counters: the file its own process wrote (where a child or parent of
    /// the rank made NCCL first, the rank's file is the one beside it with its pid).
    pub fn rank(&self, r: &RankPid) -> RankFile {
        let main = counters_file(&self.dir, r.rank);
        let mut own = main.clone().into_os_string();
        own.push(format!(".{}", r.pid));
        match read(Path::new(&own)) {
            RankFile::None => read(&main),
            own => own,
        }
    }

    /// Every live rank's counters (those with a file), and the ranks whose file does
    /// not read (said once a file: the plugin is of another toporun).
    pub fn read(&self, live: &[RankPid]) -> (BTreeMap<u32, RankCounters>, BTreeSet<u32>) {
        let (mut read, mut unreadable) = (BTreeMap::new(), BTreeSet::new());
        for r in live {
            match self.rank(r) {
                RankFile::None => {}
                RankFile::Read(c) => {
                    self.say_uncounted(r.rank, &c);
                    read.insert(r.rank, c);
                }
                RankFile::Unreadable(e) => {
                    self.say_unreadable(r.rank, &e);
                    unreadable.insert(r.rank);
                }
            }
        }
        (read, unreadable)
    }

    fn say_unreadable(&self, rank: u32, e: &CountersError) {
        let path = counters_file(&self.dir, rank);
        let Ok(mut said) = self.said.lock() else {
            return;
        };
        if said.insert(path.clone()) {
            crate::console::say_warning!(
                "rank {rank}'s NCCL counters file {} does not read ({e}): while it does not, NCCL's counters judge no hang on this node (the stacks do, where they can be read); the ranks most likely load a profiler plugin of another toporun: use the libtoporun_nccl_profiler.so installed beside this toporun",
                path.display()
            );
        }
    }

    /// What the rank's plugin could not count, said once a rank and kind.
    fn say_uncounted(&self, rank: u32, c: &RankCounters) {
        if c.uncounted == 0 && c.two_ranks == 0 {
            return;
        }
        let Ok(mut said) = self.said.lock() else {
            return;
        };
        let key = |kind: &str| counters_file(&self.dir, rank).with_extension(kind);
        if c.uncounted > 0 && said.insert(key("uncounted")) {
            crate::console::say!(
                "toporun: rank {rank}'s NCCL made communicators past the {MAX_COMMS} its profiler plugin counts at once ({} so far not counted): a hang in those is judged from the stacks alone",
                c.uncounted
            );
        }
        if c.two_ranks > 0 && said.insert(key("two-ranks")) {
            crate::console::say!(
                "toporun: rank {rank}'s process holds two ranks of one NCCL communicator (it drives two GPUs): its counters are not one rank's, and may mislead the hang and straggler rules; one process per GPU is what toporun judges"
            );
        }
    }

    /// The node's ranks now: their counters, their main threads' CPU time and the
    /// bytes they wrote, with whether each one's GPU ran kernels lately (`gpu_busy`,
    /// where NVML's samples say).
    pub fn node(
        &self,
        root: &Root,
        live: &[RankPid],
        gpu_busy: &BTreeMap<u32, bool>,
    ) -> NodeReading {
        let (counters, unreadable) = self.read(live);
        NodeReading {
            live: live.iter().map(|r| r.rank).collect(),
            counters,
            cpu: live
                .iter()
                .filter_map(|r| Some((r.rank, rank_usage::main_thread_cpu(root, r.pid)?)))
                .collect(),
            written: live
                .iter()
                .filter_map(|r| Some((r.rank, crate::stacks::written(root, r.pid)?)))
                .collect(),
            on_gpu: Default::default(),
            whole_job: false,
            unreadable,
            gpu_busy: gpu_busy.clone(),
        }
    }
}

/// The counters file at `path`, mapped for the read.
fn read(path: &Path) -> RankFile {
    let Ok(f) = std::fs::File::open(path) else {
        return RankFile::None;
    };
    // The plugin makes its file empty and then writes it whole, once: a short file
    // is one being made (an older layout of another size reads as another version).
    let len = f.metadata().map_or(0, |m| m.len()) as usize;
    if len < FILE_BYTES {
        return RankFile::None;
    }
    // Read-only and shared: the plugin's stores show through. The plugin never
    // shrinks its file (it sizes it once, before mapping), so no page goes away
    // under the read.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&f) }) else {
        return RankFile::None;
    };
    // Page-aligned, at least FILE_BYTES long; read only atomically.
    let words = unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<AtomicU64>(), FILE_WORDS) };
    match decode_words(words) {
        Ok(c) => RankFile::Read(c),
        Err(e) => RankFile::Unreadable(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toporun_shared::nccl_counters::layout::H_VERSION;
    use toporun_shared::nccl_counters::words::Words;
    use toporun_shared::nccl_counters::NcclFunc;

    fn rank(rank: u32, pid: i32) -> RankPid {
        RankPid {
            rank,
            local_rank: rank,
            pid,
        }
    }

    /// A file of another layout version is said, and its rank is unreadable, not
    /// missing; a rank whose own process wrote a file beside the rank's is read
    /// from its own.
    #[test]
    fn another_version_is_unreadable_and_the_rank_s_own_file_wins() {
        let dir = tempfile::tempdir().unwrap();
        let files = CountersFiles::new(dir.path().to_path_buf());
        let mut w = Words::default();
        w.comm(0, 0xa, 0, 2)
            .ops(0, NcclFunc::AllReduce, 64, 3, 3, 10);
        std::fs::write(counters_file(dir.path(), 0), w.bytes()).unwrap();
        let mut other = Words::default();
        other.0[H_VERSION] = 99;
        std::fs::write(counters_file(dir.path(), 1), other.bytes()).unwrap();
        let (read, unreadable) = files.read(&[rank(0, 10), rank(1, 11), rank(2, 12)]);
        assert_eq!(read.keys().copied().collect::<Vec<_>>(), [0]);
        assert_eq!(unreadable.into_iter().collect::<Vec<_>>(), [1]);
        // A file still being made (the plugin writes it whole after making it
        // empty) is no file yet, not an unreadable one.
        std::fs::write(counters_file(dir.path(), 2), [0u8; 64]).unwrap();
        let (read, unreadable) = files.read(&[rank(2, 12)]);
        assert!(read.is_empty() && unreadable.is_empty(), "{unreadable:?}");
        // Rank 0's own process (pid 10) counts beside a child's file.
        let mut own = Words::default();
        own.comm(0, 0xb, 0, 2)
            .ops(0, NcclFunc::AllReduce, 64, 7, 7, 10);
        let own_path = format!("{}.10", counters_file(dir.path(), 0).display());
        std::fs::write(own_path, own.bytes()).unwrap();
        let (read, _) = files.read(&[rank(0, 10)]);
        assert_eq!(read[&0].comms[0].hash, 0xb);
    }
}
