//! The rank's counters file and its communicator slots. A file once mapped stays
//! mapped for the life of the process (as does the library, `lib.rs`): NCCL may
//! still report an event of a communicator it has finalised (a host callback queued
//! behind a hung kernel, a proxy thread another communicator shares), and a store
//! into an unmapped page would be a SIGSEGV in the user's job. Only init and
//! finalize come here.

use crate::reuse_grace;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use toporun_shared::nccl_counters::layout::*;

/// Where the agent wants this rank's counters (set per rank by toporun).
pub use toporun_shared::nccl_counters::COUNTERS_VAR as PATH_VAR;

/// A mapped counters file's words, mapped for good.
pub type FileWords = &'static [AtomicU64];

/// The file this process counts in: the path asked for and where it went (the path,
/// or this process's own beside it).
static FILE: Mutex<Option<(PathBuf, FileWords)>> = Mutex::new(None);

/// When each slot of the file was last finalised here (0: not since mapped).
static RELEASED_AT: [AtomicU64; MAX_COMMS] = [const { AtomicU64::new(0) }; MAX_COMMS];

/// One communicator's slot in a mapped file.
#[derive(Clone, Copy)]
pub struct Slot {
    pub index: usize,
    file: FileWords,
}

impl Slot {
    /// Slot word `i`.
    pub fn word(&self, i: usize) -> &'static AtomicU64 {
        debug_assert!(i < SLOT_WORDS);
        &self.file[slot_word(self.index, i)]
    }

    /// The slot `index` of the file whose first word is `file` (a mapping never
    /// unmapped, FILE_WORDS long).
    pub fn at(file: *const AtomicU64, index: usize) -> Slot {
        Slot {
            index,
            file: unsafe { std::slice::from_raw_parts(file, FILE_WORDS) },
        }
    }

    /// The file's first word.
    pub fn file_ptr(&self) -> *mut AtomicU64 {
        self.file.as_ptr().cast_mut()
    }

    /// File word `i`.
    fn file_word(&self, i: usize) -> &'static AtomicU64 {
        &self.file[i]
    }

    /// The slot's words, for the open ring's protocol.
    pub fn words(&self) -> toporun_shared::nccl_counters::open_entry::SlotOf<'static> {
        toporun_shared::nccl_counters::open_entry::SlotOf {
            file: self.file,
            slot: self.index,
        }
    }
}

/// The pid a counters file was last written by, where it is one.
fn owner(f: &mut std::fs::File) -> Option<u64> {
    let mut head = [0u8; 8 * (H_PID + 1)];
    f.read_exact(&mut head).ok()?;
    let word = |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().unwrap_or_default());
    (word(H_MAGIC) == MAGIC).then(|| word(H_PID))
}

/// Whether process `pid` lives (not this one).
fn alive(pid: u64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// This process's own file beside `path`, where another live process holds `path`
/// (a child of the rank, or its parent, that initialised NCCL first): the agent reads
/// the one whose pid is the rank's.
pub fn own_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{}", std::process::id()));
    PathBuf::from(p)
}

/// Maps `path` for good, made whole with zeros written (a sparse file's first store
/// on a full volume would be a SIGBUS inside NCCL); Err(pid) where another live
/// process writes it.
fn open(path: &Path) -> std::io::Result<Result<FileWords, u64>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let pid = u64::from(std::process::id());
    match owner(&mut f) {
        Some(p) if p == pid => {}
        Some(p) if alive(p) => return Ok(Err(p)),
        _ => {
            let mut fresh = vec![0u8; FILE_BYTES];
            fresh[H_VERSION * 8..H_VERSION * 8 + 8].copy_from_slice(&VERSION.to_le_bytes());
            fresh[H_PID * 8..H_PID * 8 + 8].copy_from_slice(&pid.to_le_bytes());
            fresh[..8].copy_from_slice(&MAGIC.to_le_bytes());
            f.seek(SeekFrom::Start(0))?;
            f.write_all(&fresh)?;
            f.set_len(FILE_BYTES as u64)?;
        }
    }
    // The agent reads the same file; nothing else writes it. Never unmapped.
    let map: &'static memmap2::MmapMut =
        Box::leak(Box::new(unsafe { memmap2::MmapMut::map_mut(&f)? }));
    // Page-aligned, FILE_BYTES long, and only ever accessed atomically.
    let words = unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<AtomicU64>(), FILE_WORDS) };
    Ok(Ok(words))
}

/// The file for `path`: the one mapped already, else `path`, else this process's own
/// beside it.
fn file_for(path: &Path) -> std::io::Result<FileWords> {
    let mut file = FILE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, words)) = file.as_ref().filter(|(p, _)| p == path) {
        return Ok(words);
    }
    let words = match open(path)? {
        Ok(w) => w,
        Err(holder) => open(&own_path(path))?
            .map_err(|p| std::io::Error::other(format!("in use by processes {holder} and {p}")))?,
    };
    // A file mapped for another path before stays mapped (tests change the path;
    // toporun gives a rank one).
    *file = Some((path.to_path_buf(), words));
    RELEASED_AT
        .iter()
        .for_each(|r| r.store(0, Ordering::Relaxed));
    Ok(words)
}

/// What became of a communicator at init.
pub enum Claimed {
    Slot(Slot),
    /// Every slot was live, or finalised too recently to take: counted in the header
    /// as uncounted.
    Full,
}

/// A slot for a new communicator: a free one, else one whose communicator was
/// finalised.
pub fn claim(path: &Path, identity: [u64; 4]) -> std::io::Result<Claimed> {
    let w = file_for(path)?;
    // One claim at a time: two inits must not take one slot.
    let _one = FILE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let state = |s: usize| w[slot_word(s, S_STATE)].load(Ordering::Acquire);
    let released = |s: usize| RELEASED_AT[s].load(Ordering::Relaxed);
    let Some(index) = (0..MAX_COMMS).find(|&s| state(s) == FREE).or_else(|| {
        (0..MAX_COMMS)
            .filter(|&s| state(s) == FINALIZED && reuse_grace::rested(released(s)))
            .min_by_key(|&s| released(s))
    }) else {
        w[H_UNCOUNTED].fetch_add(1, Ordering::Relaxed);
        return Ok(Claimed::Full);
    };
    let hash = identity[0];
    if (0..MAX_COMMS)
        .any(|s| state(s) == LIVE && w[slot_word(s, S_COMM_HASH)].load(Ordering::Relaxed) == hash)
    {
        w[H_TWO_RANKS].fetch_add(1, Ordering::Relaxed);
    }
    let base = slot_word(index, 0);
    let gen = &w[base + S_GENERATION];
    gen.fetch_add(1, Ordering::AcqRel);
    for (i, x) in w[base..base + SLOT_WORDS].iter().enumerate() {
        if i != S_GENERATION {
            x.store(0, Ordering::Relaxed);
        }
    }
    for (i, v) in [S_COMM_HASH, S_RANK, S_NRANKS, S_NNODES]
        .into_iter()
        .zip(identity)
    {
        w[base + i].store(v, Ordering::Relaxed);
    }
    // A new communicator has posted nothing yet, point-to-point included.
    w[H_P2P_SLOTS].fetch_and(!(1u64 << index), Ordering::Relaxed);
    w[base + S_STATE].store(LIVE, Ordering::Relaxed);
    gen.fetch_add(1, Ordering::AcqRel);
    w[H_INITS].fetch_add(1, Ordering::Relaxed);
    Ok(Claimed::Slot(Slot { index, file: w }))
}

/// The communicator of `slot` is gone; its slot may be taken again (the mapping
/// stays).
pub fn release(slot: &Slot) {
    RELEASED_AT[slot.index].store(reuse_grace::now_ns(), Ordering::Relaxed);
    slot.word(S_STATE).store(FINALIZED, Ordering::Release);
}

/// Says in the header how operations are picked for timing.
pub fn sampling(slot: &Slot, (burst, period_ms): (u64, u64)) {
    slot.file_word(H_SAMPLE_BURST)
        .store(burst, Ordering::Relaxed);
    slot.file_word(H_SAMPLE_PERIOD_MS)
        .store(period_ms, Ordering::Relaxed);
}

/// The slot's communicator posted a send or a recv: said once (a load first, so
/// that a pipeline's every post does not write the shared header word).
pub fn posted_p2p(slot: &Slot) {
    let bit = 1u64 << slot.index;
    let w = slot.file_word(H_P2P_SLOTS);
    if w.load(Ordering::Relaxed) & bit == 0 {
        w.fetch_or(bit, Ordering::Relaxed);
    }
}

/// Counts an event the plugin could not follow.
pub fn dropped(slot: &Slot) {
    slot.file_word(H_DROPPED).fetch_add(1, Ordering::Relaxed);
}
