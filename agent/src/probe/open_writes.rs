//! The regular files a process has open for writing, from /proc/<pid>/fd and the
//! flags in /proc/<pid>/fdinfo: read while a rank lives, so that when a write fails
//! (a full checkpoint volume) toporun knows which volume it was writing to.

use crate::paths::{Root, PROC};

/// Paths kept per process: a rank writes a few files at a time.
const KEPT: usize = 16;
/// O_ACCMODE of the `flags:` line (octal): O_WRONLY 1, O_RDWR 2.
const ACCESS_MODE: u32 = 0o3;

/// The files `pid` has open for writing (absolute paths, no devices or sockets).
pub fn open_for_writing(root: &Root, pid: i32) -> Vec<String> {
    let dir = format!("{PROC}/{pid}/fd");
    let mut out = Vec::new();
    for fd in root.list(&dir) {
        let Ok(target) = std::fs::read_link(root.join(format!("{dir}/{fd}"))) else {
            continue;
        };
        let path = target.to_string_lossy().into_owned();
        if !path.starts_with('/') || path.starts_with("/dev/") || path.starts_with("/proc/") {
            continue; // sockets, pipes, anon inodes, devices
        }
        let writing = root
            .read(format!("{PROC}/{pid}/fdinfo/{fd}"))
            .and_then(|info| {
                let flags = info.lines().find_map(|l| l.strip_prefix("flags:"))?;
                u32::from_str_radix(flags.trim(), 8).ok()
            })
            .is_some_and(|f| f & ACCESS_MODE != 0);
        if writing && !out.contains(&path) {
            out.push(path);
            if out.len() == KEPT {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_open_for_writing_is_found_one_open_for_reading_is_not() {
        let d = tempfile::tempdir().unwrap();
        let w = d.path().join("step3.pt");
        let mut file = std::fs::File::create(&w).unwrap();
        file.write_all(b"x").unwrap();
        let r = d.path().join("data.bin");
        std::fs::write(&r, b"y").unwrap();
        let _reading = std::fs::File::open(&r).unwrap();
        let found = open_for_writing(&Root::live(), std::process::id() as i32);
        let w = w.to_string_lossy().into_owned();
        assert!(found.contains(&w), "{found:?}");
        assert!(
            !found.contains(&r.to_string_lossy().into_owned()),
            "{found:?}"
        );
    }
}
