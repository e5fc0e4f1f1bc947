//! The open ring's entries, written by the plugin on NCCL's threads while the agent
//! reads them, without a torn entry ever read as whole: a seqlock whose sequence is
//! the entry's own index word.
//!
//! - The host thread publishes an entry: its index word to 0 (being written), a
//!   release fence, the fields, then the index word with Release.
//! - The thread that sees the operation's first kernel channel start (NCCL's proxy
//!   thread, one per communicator) stamps the start the same way under a second
//!   index word of its own (`S_KERNEL_OPEN`), so a late stamp never lands on an
//!   entry republished for a later operation.
//! - The reader loads an index word with Acquire, the fields, an acquire fence, and
//!   the index word again: the entry counts only where both loads say the index it
//!   wants. Indexes only grow, so a sequence never repeats.
//!
//! Generic over [`AtomicWords`] so that the same code runs on the mapped file, on a
//! captured copy, and under a model checker (the tests).

use super::layout::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// A communicator slot's words, as atomics.
pub trait AtomicWords {
    fn load(&self, i: usize, order: Ordering) -> u64;
    fn store(&self, i: usize, v: u64, order: Ordering);
    /// A fence of `order` for the memory these words live in.
    fn fence(&self, order: Ordering);
}

/// A slot's words within a file's words.
pub struct SlotOf<'a> {
    pub file: &'a [AtomicU64],
    pub slot: usize,
}

impl AtomicWords for SlotOf<'_> {
    fn load(&self, i: usize, order: Ordering) -> u64 {
        self.file[slot_word(self.slot, i)].load(order)
    }
    fn store(&self, i: usize, v: u64, order: Ordering) {
        self.file[slot_word(self.slot, i)].store(v, order)
    }
    fn fence(&self, order: Ordering) {
        std::sync::atomic::fence(order)
    }
}

/// An entry read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub func_word: u64,
    pub bytes: u64,
    /// GPU timer when its first channel started, where stamped for this index.
    pub kernel_start_ns: Option<u64>,
}

/// The host publishes operation `index`.
pub fn publish<W: AtomicWords + ?Sized>(w: &W, index: u64, func_word: u64, bytes: u64) {
    let i = index as usize;
    w.store(open_word(i, O_INDEX1), 0, Ordering::Relaxed);
    // The fields below must not be seen before the entry reads as being written.
    w.fence(Ordering::Release);
    w.store(open_word(i, O_FUNC), func_word, Ordering::Relaxed);
    w.store(open_word(i, O_BYTES), bytes, Ordering::Relaxed);
    w.store(kernel_word(i), 0, Ordering::Relaxed);
    w.store(open_word(i, O_KERNEL_START), 0, Ordering::Relaxed);
    w.store(open_word(i, O_INDEX1), index + 1, Ordering::Release);
}

/// Operation `index`'s first kernel channel started at `timer`: stamped unless the
/// host has republished the entry for a later operation. One thread stamps a
/// communicator's entries (NCCL's proxy thread).
pub fn stamp_kernel_start<W: AtomicWords + ?Sized>(w: &W, index: u64, timer: u64) {
    let i = index as usize;
    if w.load(open_word(i, O_INDEX1), Ordering::Acquire) != index + 1 {
        return;
    }
    w.store(kernel_word(i), 0, Ordering::Relaxed);
    w.fence(Ordering::Release);
    w.store(open_word(i, O_KERNEL_START), timer, Ordering::Relaxed);
    w.store(kernel_word(i), index + 1, Ordering::Release);
}

/// Operation `index`'s entry, where the ring holds it whole; `stamped`: the file
/// has the kernel index words (version 4 on), else a start is taken as it reads.
pub fn read<W: AtomicWords + ?Sized>(w: &W, index: u64, stamped: bool) -> Option<Entry> {
    let i = index as usize;
    let want = index + 1;
    if w.load(open_word(i, O_INDEX1), Ordering::Acquire) != want {
        return None;
    }
    let func_word = w.load(open_word(i, O_FUNC), Ordering::Relaxed);
    let bytes = w.load(open_word(i, O_BYTES), Ordering::Relaxed);
    let k1 = w.load(kernel_word(i), Ordering::Acquire);
    let start = w.load(open_word(i, O_KERNEL_START), Ordering::Relaxed);
    w.fence(Ordering::Acquire);
    let k2 = w.load(kernel_word(i), Ordering::Relaxed);
    if w.load(open_word(i, O_INDEX1), Ordering::Relaxed) != want {
        return None;
    }
    let stamp_whole = !stamped || (k1 == want && k2 == want);
    Some(Entry {
        func_word,
        bytes,
        kernel_start_ns: Some(start).filter(|t| *t > 0 && stamp_whole),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    struct Plain(Vec<AtomicU64>);

    impl Plain {
        fn new() -> Plain {
            Plain((0..SLOT_WORDS).map(|_| AtomicU64::new(0)).collect())
        }
        fn set(&self, i: usize, v: u64) {
            self.0[i].store(v, Ordering::Relaxed)
        }
    }

    impl AtomicWords for Plain {
        fn load(&self, i: usize, o: Ordering) -> u64 {
            self.0[i].load(o)
        }
        fn store(&self, i: usize, v: u64, o: Ordering) {
            self.0[i].store(v, o)
        }
        fn fence(&self, o: Ordering) {
            std::sync::atomic::fence(o)
        }
    }

    #[test]
    fn a_published_and_stamped_entry_reads_back() {
        let w = Plain::new();
        publish(&w, 3, 5, 4096);
        assert_eq!(
            read(&w, 3, true),
            Some(Entry {
                func_word: 5,
                bytes: 4096,
                kernel_start_ns: None
            })
        );
        stamp_kernel_start(&w, 3, 77);
        assert_eq!(read(&w, 3, true).unwrap().kernel_start_ns, Some(77));
        assert_eq!(read(&w, 11, true), None, "index 11 shares the entry");
    }

    /// Entries caught mid-write, as a reader on another core can see them.
    #[test]
    fn torn_entries_are_not_read() {
        let w = Plain::new();
        publish(&w, 3, 5, 4096);
        // The host has begun republishing the entry for index 11.
        w.set(open_word(3, O_INDEX1), 0);
        w.set(open_word(3, O_BYTES), 1 << 20);
        assert_eq!(read(&w, 3, true), None);
        assert_eq!(read(&w, 11, true), None);
        // A late stamp for 3 after index 11 was published is not 11's start.
        publish(&w, 11, 6, 1 << 20);
        stamp_kernel_start(&w, 3, 99);
        assert_eq!(read(&w, 11, true).unwrap().kernel_start_ns, None);
        // A stamp caught between its start word and its index word.
        w.set(open_word(11, O_KERNEL_START), 123);
        assert_eq!(read(&w, 11, true).unwrap().kernel_start_ns, None);
        // A file from before the kernel index words takes the start as it reads.
        assert_eq!(read(&w, 11, false).unwrap().kernel_start_ns, Some(123));
        w.set(kernel_word(11), 12);
        assert_eq!(read(&w, 11, true).unwrap().kernel_start_ns, Some(123));
    }
}
