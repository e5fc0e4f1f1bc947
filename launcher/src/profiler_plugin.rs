//! Where toporun's NCCL profiler plugin is installed: beside the binary (a cargo
//! build; the release files, named by architecture), or in `../lib` or
//! `../lib/toporun` (the image's /usr/local/bin and /usr/local/lib). The binary's own
//! path is the real one, a `torchrun` symlink resolved.

use std::path::PathBuf;
use toporun_shared::nccl_counters::PLUGIN_FILE;

/// The plugin's path, or the places looked at.
pub fn find() -> Result<PathBuf, Vec<PathBuf>> {
    let exe = std::env::current_exe().map_err(|_| Vec::new())?;
    let Some(dir) = exe.parent() else {
        return Err(Vec::new());
    };
    let places = [
        dir.to_path_buf(),
        dir.join("../lib"),
        dir.join("../lib/toporun"),
    ];
    let released = format!(
        "libtoporun_nccl_profiler-{}-linux-gnu.so",
        std::env::consts::ARCH
    );
    places
        .iter()
        .flat_map(|d| [d.join(PLUGIN_FILE), d.join(&released)])
        .find(|f| f.is_file())
        .and_then(|f| f.canonicalize().ok())
        .ok_or_else(|| places.to_vec())
}
