//! The container's memory cgroup, found from /proc/self/cgroup (v1's memory
//! controller, or v2), read at the start of an attempt and when a rank dies: its OOM
//! kills, limit and peak.

use crate::paths::{self, Root};
use std::path::PathBuf;
use toporun_shared::root_cause::oom::{self, CgroupVersion, MemoryReading};

#[derive(Debug, Clone)]
pub struct MemoryCgroup {
    /// Relative to the root.
    dir: PathBuf,
    version: CgroupVersion,
}

impl MemoryCgroup {
    /// The cgroup's directory: its path under the hierarchy where the container sees
    /// the whole tree, else the mount itself (a container with its own cgroup
    /// namespace, or a v1 mount of its cgroup alone).
    pub fn find(root: &Root) -> Option<MemoryCgroup> {
        let (version, path) = oom::memory_cgroup(&root.read(paths::PROC_SELF_CGROUP)?)?;
        let path = path.trim_start_matches('/');
        let (mounts, probe): (&[&str], &str) = match version {
            CgroupVersion::V1 => (&[paths::SYS_FS_CGROUP_MEMORY], "memory.oom_control"),
            CgroupVersion::V2 => (
                &[paths::SYS_FS_CGROUP, paths::SYS_FS_CGROUP_UNIFIED],
                "memory.events",
            ),
        };
        mounts
            .iter()
            .flat_map(|m| [PathBuf::from(m).join(path), PathBuf::from(m)])
            .find(|d| root.join(d.join(probe)).exists())
            .map(|dir| MemoryCgroup { dir, version })
    }

    pub fn read(&self, root: &Root) -> MemoryReading {
        let file = |name: &str| root.read(self.dir.join(name)).unwrap_or_default();
        let (events, limit, peak) = match self.version {
            CgroupVersion::V1 => (
                "memory.oom_control",
                "memory.limit_in_bytes",
                "memory.max_usage_in_bytes",
            ),
            CgroupVersion::V2 => ("memory.events", "memory.max", "memory.peak"),
        };
        MemoryReading {
            oom_kills: oom::oom_kills(&file(events)).unwrap_or(0),
            limit: oom::limit(&file(limit)),
            peak: file(peak).trim().parse().ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::paths::write_under as write;

    #[test]
    fn a_v1_cgroup_is_found_under_the_hierarchy_and_read() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "proc/self/cgroup", "4:memory:/job/a\n0::/\n");
        let cg = "sys/fs/cgroup/memory/job/a";
        write(
            d.path(),
            &format!("{cg}/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        );
        write(
            d.path(),
            &format!("{cg}/memory.limit_in_bytes"),
            "268435456\n",
        );
        write(
            d.path(),
            &format!("{cg}/memory.max_usage_in_bytes"),
            "268000000\n",
        );
        let root = Root::at(d.path());
        let m = MemoryCgroup::find(&root).expect("found");
        let r = m.read(&root);
        assert_eq!(
            (r.oom_kills, r.limit, r.peak),
            (1, Some(256 << 20), Some(268_000_000))
        );
    }

    #[test]
    fn a_v2_container_sees_its_cgroup_at_the_mount() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "proc/self/cgroup", "0::/\n");
        write(
            d.path(),
            "sys/fs/cgroup/memory.events",
            "oom 0\noom_kill 0\n",
        );
        write(d.path(), "sys/fs/cgroup/memory.max", "max\n");
        let root = Root::at(d.path());
        let r = MemoryCgroup::find(&root).unwrap().read(&root);
        assert_eq!((r.oom_kills, r.limit, r.peak), (0, None, None));
    }
}
