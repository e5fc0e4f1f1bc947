//! The last bytes a rank wrote to stderr, kept in memory (bounded), so that when it
//! fails toporun can name its last Python exception or a full /dev/shm.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use toporun_shared::root_cause::watchdog::{last_timeout, WatchdogTimeout, ERROR_MARKER};

/// Bytes kept per rank: a deep traceback fits many times over.
pub const TAIL_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, Default)]
pub struct Tail {
    bytes: Arc<Mutex<VecDeque<u8>>>,
    /// The pipe reached its end (everything the rank wrote is here).
    closed: Arc<AtomicBool>,
    /// A forwarder reads into it (else there is nothing to wait for).
    fed: Arc<AtomicBool>,
    /// NCCL's watchdog said it timed out, as it came (the hang watch acts on it).
    watchdog: Arc<Mutex<Option<WatchdogTimeout>>>,
    /// torch's watchdog raised an NCCL error (its marker came): the hang watch reads
    /// the error from the text then, and not before.
    nccl_error: Arc<AtomicBool>,
}

impl Tail {
    pub fn feeding(&self) {
        self.fed.store(true, Ordering::Relaxed);
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Waits (at most `limit`) until the rank's last bytes are in: its pipe may hold
    /// the traceback it wrote just before exiting.
    pub fn wait_closed(&self, limit: std::time::Duration) {
        let start = std::time::Instant::now();
        while self.fed.load(Ordering::Relaxed)
            && !self.closed.load(Ordering::Relaxed)
            && start.elapsed() < limit
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    pub fn push(&self, bytes: &[u8]) {
        let Ok(mut q) = self.bytes.lock() else { return };
        let bytes = &bytes[bytes.len().saturating_sub(TAIL_BYTES)..];
        let over = (q.len() + bytes.len()).saturating_sub(TAIL_BYTES);
        let over = over.min(q.len());
        q.drain(..over);
        q.extend(bytes);
        let Ok(mut w) = self.watchdog.lock() else {
            return;
        };
        let error_seen = self.nccl_error.load(Ordering::Relaxed);
        if w.is_some() && error_seen {
            return; // the first timeout is the one kept
        }
        // The marker's line may straddle reads: look at the new bytes and a line
        // before, whole lines only (a line cut short would give its fields cut).
        // Copied out rather than made contiguous: that moved the whole 64 KiB ring
        // at each read of a chatty rank.
        let look = (bytes.len() + 1024).min(q.len());
        let recent: Vec<u8> = q.range(q.len() - look..).copied().collect();
        let recent = String::from_utf8_lossy(&recent);
        let whole = recent.rfind('\n').map_or("", |end| &recent[..end]);
        if !error_seen && whole.contains(ERROR_MARKER) {
            self.nccl_error.store(true, Ordering::Relaxed);
        }
        if w.is_none() {
            *w = last_timeout(whole);
        }
    }

    /// torch's watchdog raised an NCCL error on the rank (its line came).
    pub fn nccl_error_seen(&self) -> bool {
        self.nccl_error.load(Ordering::Relaxed)
    }

    /// NCCL's watchdog's timeout, once the rank has said it.
    pub fn watchdog(&self) -> Option<WatchdogTimeout> {
        self.watchdog.lock().ok()?.clone()
    }

    pub fn text(&self) -> String {
        let bytes: Vec<u8> = self
            .bytes
            .lock()
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The last [`TAIL_BYTES`] of a log file (a rank whose stderr went to a file).
pub fn file_tail(path: &std::path::Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES as u64)));
    let mut buf = Vec::new();
    let _ = f.take(TAIL_BYTES as u64).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdogs_line_is_caught_as_it_comes_even_split_across_reads() {
        let t = Tail::default();
        t.push(b"[rank0]:[E1125 ProcessGroupNCCL.cpp:685] [Rank 0] Watchdog caught collective ");
        assert_eq!(t.watchdog(), None);
        t.push(b"operation timeout: WorkNCCL(SeqNum=17, OpType=ALLREDUCE, Timeout(ms)=25000) ran for 25012 milliseconds before timing out.\n");
        let w = t.watchdog().expect("caught");
        assert_eq!((w.seq, w.timeout_ms), (Some(17), Some(25000)));
        // Its line followed by part of the next one, in one read.
        let t = Tail::default();
        t.push(b"[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=BROADCAST, Timeout(ms)=6000) ran for 6001 milliseconds before timing out.\n[rank0]:[E1125 ProcessGroupNCCL.cpp:2119] Process group watchdog thr");
        let w = t.watchdog().expect("caught");
        assert_eq!((w.seq, w.op.as_deref()), (Some(9), Some("broadcast")));
        assert!(!t.nccl_error_seen());
        // The watchdog's NCCL error, split across reads, after a timeout was kept.
        t.push(b"[Rank 0] Collective WorkNCCL(SeqNum=10) raised the following ");
        assert!(!t.nccl_error_seen());
        t.push(b"async exception: NCCL error: invalid usage\n");
        assert!(t.nccl_error_seen());
    }

    #[test]
    fn only_the_last_bytes_are_kept() {
        let t = Tail::default();
        t.push(&vec![b'a'; TAIL_BYTES]);
        t.push(b"ValueError: x\n");
        let text = t.text();
        assert_eq!(text.len(), TAIL_BYTES);
        assert!(text.ends_with("aValueError: x\n"));
        t.push(&vec![b'b'; TAIL_BYTES * 2]);
        assert_eq!(t.text(), "b".repeat(TAIL_BYTES));
    }
}
