//! Where the ranks' counters files go: a memory file system (`/dev/shm`), never the
//! run directory. The plugin stores into its mapping from NCCL's threads; on a
//! copy-on-write or network volume (often the checkpoints' one, where `--log-dir`
//! points) such a store can wait on the volume, or raise SIGBUS in NCCL's thread
//! once the volume fills. On tmpfs it is a store to memory.

use crate::facts::ShmFacts;
use serde::Serialize;
use std::path::{Path, PathBuf};

use super::layout::FILE_BYTES;

/// Room kept free on /dev/shm beyond the counters: NCCL's own shared-memory
/// transport and the DataLoader's workers live there too.
pub const SHM_HEADROOM: u64 = 4 << 20;

/// Where an attempt's counters go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "place")]
pub enum CountersPlace {
    /// This directory, on the memory file system.
    Memory { dir: PathBuf },
    /// /dev/shm has too little room left.
    NoRoom { free: u64, needed: u64 },
    /// No memory file system at /dev/shm (not mounted, or not tmpfs).
    NoMemoryFs { fs_type: Option<String> },
}

impl CountersPlace {
    /// For attempt `attempt` of the run whose directory is named `run_name`, `ranks`
    /// ranks here, with `/dev/shm` at `shm_dir` as `shm` says.
    pub fn choose(
        shm: Option<&ShmFacts>,
        shm_dir: &Path,
        run_name: &str,
        attempt: u32,
        ranks: u32,
    ) -> CountersPlace {
        let Some(shm) = shm.filter(|s| s.fs_type.as_deref() == Some("tmpfs")) else {
            return CountersPlace::NoMemoryFs {
                fs_type: shm.and_then(|s| s.fs_type.clone()),
            };
        };
        // A rank's file, and one beside it where a child of the rank made NCCL first.
        let needed = u64::from(ranks.max(1)) * 2 * FILE_BYTES as u64 + SHM_HEADROOM;
        if shm.free_bytes < needed {
            return CountersPlace::NoRoom {
                free: shm.free_bytes,
                needed,
            };
        }
        CountersPlace::Memory {
            dir: shm_dir
                .join(format!("toporun-{run_name}"))
                .join(format!("attempt_{attempt}")),
        }
    }

    /// The directory, where the counters can go.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            CountersPlace::Memory { dir } => Some(dir),
            _ => None,
        }
    }

    /// Why the counters are off, with the fix; None where they go to memory.
    pub fn refusal(&self) -> Option<String> {
        const WHY: &str = "NCCL's own counters are off for this attempt (they are never put on a disk volume, where a store from NCCL's thread can stall or SIGBUS the rank)";
        const FIX: &str = "give the pod a memory /dev/shm (Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm; docker: --shm-size=1g), or --nccl-profiler off to silence this";
        match self {
            CountersPlace::Memory { .. } => None,
            CountersPlace::NoRoom { free, needed } => Some(format!(
                "/dev/shm has {} free, fewer than the {} the counters and NCCL's headroom need: {WHY}; {FIX}",
                crate::units::format_size(*free),
                crate::units::format_size(*needed)
            )),
            CountersPlace::NoMemoryFs { fs_type } => Some(format!(
                "/dev/shm is {}: {WHY}; {FIX}",
                fs_type
                    .as_deref()
                    .map_or("not mounted".to_string(), |t| format!("{t}, not tmpfs"))
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shm(free: u64, ty: &str) -> ShmFacts {
        ShmFacts {
            total_bytes: free * 2,
            free_bytes: free,
            fs_type: Some(ty.into()),
            dev: None,
        }
    }

    #[test]
    fn counters_go_to_a_tmpfs_with_room_and_nowhere_else() {
        let at = |s: Option<ShmFacts>, ranks| {
            CountersPlace::choose(s.as_ref(), Path::new("/dev/shm"), "job_ab12", 1, ranks)
        };
        let ok = at(Some(shm(64 << 20, "tmpfs")), 8);
        assert_eq!(
            ok.dir(),
            Some(Path::new("/dev/shm/toporun-job_ab12/attempt_1"))
        );
        assert_eq!(ok.refusal(), None);
        // 64 MiB, docker's default, holds 8 ranks; 4.2 MiB does not.
        let full = at(Some(shm(4_300_000, "tmpfs")), 8);
        assert!(
            matches!(full, CountersPlace::NoRoom { needed, .. } if needed == 8 * 2 * FILE_BYTES as u64 + SHM_HEADROOM)
        );
        assert!(
            full.refusal().unwrap().contains("--shm-size"),
            "{:?}",
            full.refusal()
        );
        let disk = at(Some(shm(1 << 30, "overlay")), 8);
        assert_eq!(disk.dir(), None);
        assert!(disk
            .refusal()
            .unwrap()
            .starts_with("/dev/shm is overlay, not tmpfs"));
        assert!(at(None, 8)
            .refusal()
            .unwrap()
            .starts_with("/dev/shm is not mounted"));
    }
}
