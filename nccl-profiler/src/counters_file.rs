//! The rank's counters file, mapped once per process while any communicator lives
//! (NCCL may dlclose the plugin after the last one and load it again: nothing
//! outlives that), and its communicator slots. Only init and finalize come here.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use toporun_shared::nccl_counters::layout::*;

/// Where the agent wants this rank's counters (set per rank by toporun).
pub use toporun_shared::nccl_counters::COUNTERS_VAR as PATH_VAR;

struct Mapped {
    map: memmap2::MmapMut,
    users: usize,
}

static FILE: Mutex<Option<Mapped>> = Mutex::new(None);

/// One communicator's slot in the mapped file, valid until [`release`].
pub struct Slot {
    pub index: usize,
    /// The file's first word.
    file: *const AtomicU64,
}

impl Slot {
    /// Slot word `i`.
    pub fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < SLOT_WORDS);
        self.file_word(slot_word(self.index, i))
    }

    /// File word `i`.
    fn file_word(&self, i: usize) -> &AtomicU64 {
        assert!(i < FILE_WORDS);
        // The mapping holds FILE_WORDS words and stays mapped while the slot is held.
        unsafe { &*self.file.add(i) }
    }
}

fn words(map: &memmap2::MmapMut) -> &[AtomicU64] {
    // Page-aligned, FILE_BYTES long, and only ever accessed atomically.
    unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<AtomicU64>(), FILE_WORDS) }
}

/// The pid a counters file was last written by, where it is one.
fn owner(f: &mut std::fs::File) -> Option<u64> {
    let mut head = [0u8; 8 * (H_PID + 1)];
    f.read_exact(&mut head).ok()?;
    let word = |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().unwrap_or_default());
    (word(H_MAGIC) == MAGIC).then(|| word(H_PID))
}

/// Maps the rank's file for this process: made whole with zeros written (a sparse
/// file's first store on a full disk would be a SIGBUS inside NCCL), and never taken
/// from another live process (a child of the rank that initialises NCCL with the same
/// variable counts nowhere).
fn open(path: &Path) -> std::io::Result<memmap2::MmapMut> {
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
        Some(p) if Path::new(&format!("/proc/{p}")).exists() => {
            return Err(std::io::Error::other(format!("in use by process {p}")));
        }
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
    // The agent reads the same file; nothing else writes it.
    unsafe { memmap2::MmapMut::map_mut(&f) }
}

/// A slot for a new communicator: a free one, else one whose communicator was
/// finalised; None when all are live.
pub fn claim(path: &Path, identity: [u64; 4]) -> std::io::Result<Option<Slot>> {
    let mut file = FILE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if file.is_none() {
        *file = Some(Mapped {
            map: open(path)?,
            users: 0,
        });
    }
    let Some(m) = file.as_mut() else {
        return Ok(None);
    };
    let w = words(&m.map);
    let state = |s: usize| w[slot_word(s, S_STATE)].load(Ordering::Acquire);
    let Some(index) = (0..MAX_COMMS)
        .find(|&s| state(s) == FREE)
        .or_else(|| (0..MAX_COMMS).find(|&s| state(s) == FINALIZED))
    else {
        return Ok(None);
    };
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
    gen.fetch_add(1, Ordering::AcqRel);
    w[base + S_STATE].store(LIVE, Ordering::Release);
    w[H_INITS].fetch_add(1, Ordering::Relaxed);
    m.users += 1;
    Ok(Some(Slot {
        index,
        file: w.as_ptr(),
    }))
}

/// The communicator of `slot` is gone; the last one unmaps the file.
pub fn release(slot: &Slot) {
    let mut file = FILE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    slot.word(S_STATE).store(FINALIZED, Ordering::Release);
    if let Some(m) = file.as_mut() {
        m.users = m.users.saturating_sub(1);
        if m.users == 0 {
            *file = None;
        }
    }
}

/// Says in the header how operations are picked for timing.
pub fn sampling(slot: &Slot, (burst, period_ms): (u64, u64)) {
    slot.file_word(H_SAMPLE_BURST)
        .store(burst, Ordering::Relaxed);
    slot.file_word(H_SAMPLE_PERIOD_MS)
        .store(period_ms, Ordering::Relaxed);
}

/// Counts an event the plugin could not follow.
pub fn dropped(slot: &Slot) {
    slot.file_word(H_DROPPED).fetch_add(1, Ordering::Relaxed);
}
