//! The kernel OOM killer, seen from the container's memory cgroup: v2
//! (`memory.events` `oom_kill`, `memory.max`, `memory.peak`) or v1
//! (`memory.oom_control` `oom_kill`, kernel 4.13+, `memory.limit_in_bytes`,
//! `memory.max_usage_in_bytes`). Parsers of the files' text; the agent reads them.

/// Which hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The memory cgroup of a process, from its `/proc/<pid>/cgroup`: the v1 memory
/// controller's line where there is one (a hybrid host keeps memory on v1), else the
/// v2 line (`0::/path`).
pub fn memory_cgroup(proc_cgroup: &str) -> Option<(CgroupVersion, String)> {
    controller_cgroup(proc_cgroup, "memory")
}

/// A process's cgroup for `controller`: the v1 line naming it, else the v2 line.
pub fn controller_cgroup(proc_cgroup: &str, controller: &str) -> Option<(CgroupVersion, String)> {
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == controller) {
            return Some((CgroupVersion::V1, path.to_string()));
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some((CgroupVersion::V2, path.to_string()));
        }
    }
    v2
}

/// `oom_kill N` in `memory.events` (v2) or `memory.oom_control` (v1).
pub fn oom_kills(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

/// A limit in bytes: v2's "max" and v1's near-2^63 "unlimited" are none.
pub fn limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// What the memory cgroup says at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryReading {
    pub oom_kills: u64,
    pub limit: Option<u64>,
    /// The highest use the kernel recorded (v2 on kernels 5.19+, v1 always).
    pub peak: Option<u64>,
}

/// The fix for an OOM kill in a pod.
pub const FIX: &str = "raise the container's memory limit (resources.limits.memory), or lower what the ranks hold in host memory (fewer DataLoader workers, smaller prefetch_factor, pinned-memory buffers)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_memory_wins_on_a_hybrid_host_and_v2_stands_alone() {
        let hybrid = "12:memory:/toporun-test\n0::/user.slice\n";
        assert_eq!(
            memory_cgroup(hybrid),
            Some((CgroupVersion::V1, "/toporun-test".into()))
        );
        let joined = "5:cpuacct,memory:/docker/abc\n";
        assert_eq!(memory_cgroup(joined).unwrap().1, "/docker/abc");
        assert_eq!(
            memory_cgroup("0::/\n"),
            Some((CgroupVersion::V2, "/".into()))
        );
        assert_eq!(memory_cgroup("garbage"), None);
    }

    #[test]
    fn kills_and_limits_are_read() {
        assert_eq!(
            oom_kills("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"),
            Some(1)
        );
        assert_eq!(
            oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
            Some(2)
        );
        assert_eq!(limit("max\n"), None);
        assert_eq!(limit("9223372036854771712\n"), None);
        assert_eq!(limit("268435456\n"), Some(256 << 20));
    }
}
