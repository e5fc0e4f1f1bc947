//! PyTorch flight-recorder dumps on disk: every `<prefix><rank>` file read (bounded)
//! and parsed; what cannot be read is said, never a panic.

use std::path::{Path, PathBuf};
use toporun_shared::flight_recorder::{parse, rank_of, Dump};

/// A dump larger than this is not read (the recorder keeps 2000 entries: KBs to MBs).
const MAX_DUMP_BYTES: u64 = 256 << 20;

/// The dump files a path names: a file, or every `<prefix><rank>` file in a directory.
fn files(paths: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths.iter().map(Path::new) {
        match std::fs::read_dir(p) {
            Ok(entries) => {
                let mut found: Vec<PathBuf> = entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|f| {
                        f.file_name()
                            .and_then(|n| n.to_str())
                            .and_then(rank_of)
                            .is_some()
                    })
                    .collect();
                found.sort();
                out.extend(found);
            }
            Err(_) => out.push(p.to_path_buf()),
        }
    }
    out
}

/// Every readable dump of `paths`, and what could not be read.
pub fn read(paths: &[String]) -> (Vec<Dump>, Vec<String>) {
    let (mut dumps, mut unreadable) = (Vec::new(), Vec::new());
    for f in files(paths) {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Some(rank) = rank_of(name) else {
            unreadable.push(format!(
                "{}: no rank at the end of the name (rank_<N>)",
                f.display()
            ));
            continue;
        };
        let bytes = std::fs::File::open(&f).and_then(|h| {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(h, MAX_DUMP_BYTES), &mut buf)?;
            Ok(buf)
        });
        match bytes
            .map_err(|e| e.to_string())
            .and_then(|b| parse(rank, &b).map_err(|e| e.to_string()))
        {
            Ok(d) => dumps.push(d),
            Err(e) => unreadable.push(format!("{}: {e}", f.display())),
        }
    }
    dumps.sort_by_key(|d| d.rank);
    (dumps, unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_gives_its_rank_files_and_garbage_is_said() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("rank_0"), b"garbage").unwrap();
        std::fs::write(d.path().join("notes.txt"), b"x").unwrap();
        let (dumps, bad) = read(&[d.path().display().to_string()]);
        assert!(dumps.is_empty());
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("rank_0: not a pickle"), "{bad:?}");
    }
}
