//! Follows the NCCL debug files of this node's ranks (NCCL_DEBUG_FILE, one per
//! process) while they initialise, feeding the shared log reader.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use toporun_shared::nccl_log::{Analyzer, LogReport, MAX_LINE};

/// Bytes read from one file at most: an INIT log is tens of KB; a rank that logs
/// NCCL_DEBUG=TRACE for hours must not grow toporun.
const MAX_FILE_BYTES: u64 = 64 << 20;
/// Bytes read per file per poll, so one poll stays short.
const CHUNK: u64 = 1 << 20;

#[derive(Default)]
struct Followed {
    offset: u64,
    partial: Vec<u8>,
}

pub struct NcclWatch {
    dir: PathBuf,
    /// Only files whose name starts with this (the NCCL_DEBUG_FILE pattern's prefix).
    prefix: String,
    files: HashMap<PathBuf, Followed>,
    analyzer: Analyzer,
}

impl NcclWatch {
    pub fn new(dir: &Path, prefix: &str) -> Self {
        NcclWatch {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
            files: HashMap::new(),
            analyzer: Analyzer::new(),
        }
    }

    /// Reads what the files gained since the last poll; returns whether any did.
    pub fn poll(&mut self) -> bool {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return false;
        };
        let mut grew = false;
        for e in entries.flatten() {
            let name = e.file_name();
            if !name.to_string_lossy().starts_with(&self.prefix) {
                continue;
            }
            let path = e.path();
            let f = self.files.entry(path.clone()).or_default();
            grew |= read_new(&path, f, &mut self.analyzer);
        }
        grew
    }

    pub fn report(&self) -> LogReport {
        self.analyzer.report()
    }

    /// Processes whose communicator init completed.
    pub fn completed(&self) -> usize {
        self.analyzer.completed_processes()
    }

    /// Processes that logged a transport line (connected at init or first collective).
    pub fn linked(&self) -> usize {
        self.analyzer.linked_processes()
    }
}

fn read_new(path: &Path, f: &mut Followed, analyzer: &mut Analyzer) -> bool {
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len < f.offset {
        // NCCL truncates on open: a new process reused the name.
        *f = Followed::default();
    }
    if len == f.offset
        || f.offset >= MAX_FILE_BYTES
        || file.seek(SeekFrom::Start(f.offset)).is_err()
    {
        return false;
    }
    let mut buf = Vec::new();
    let want = CHUNK.min(MAX_FILE_BYTES - f.offset);
    let Ok(n) = file.take(want).read_to_end(&mut buf) else {
        return false;
    };
    f.offset += n as u64;
    f.partial.extend_from_slice(&buf);
    let complete = f
        .partial
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    for line in f.partial[..complete].split(|&b| b == b'\n') {
        analyzer.feed(&String::from_utf8_lossy(line));
    }
    f.partial.drain(..complete);
    if f.partial.len() > MAX_LINE {
        f.partial.clear();
    }
    n > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn follows_growth_partial_lines_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nccl.h.7.log");
        let mut w = std::fs::File::create(&p).unwrap();
        std::fs::write(dir.path().join("other.txt"), "h:9:9 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 5 nranks 9 commId 0x9 - Init COMPLETE\n").unwrap();
        let mut watch = NcclWatch::new(dir.path(), "nccl.");
        write!(w, "h:7:7 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 2 commId 0xa - Init START\nh:7:7 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CU").unwrap();
        w.flush().unwrap();
        assert!(watch.poll());
        assert!(
            watch.report().comms[0].links.is_empty(),
            "half a line waits"
        );
        writeln!(w, "MEM\nh:7:7 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 2 commId 0xa - Init COMPLETE").unwrap();
        w.flush().unwrap();
        assert!(watch.poll());
        let r = watch.report();
        assert_eq!(r.comms.len(), 1, "other.txt is not followed");
        assert_eq!(r.comms[0].links[0].via, "P2P/CUMEM");
        assert_eq!(watch.completed(), 1);
        assert!(!watch.poll());
        std::fs::write(&p, "x\n").unwrap();
        assert!(
            watch.poll(),
            "a truncated file is read again from its start"
        );
    }
}
