//! What a rank's process uses, read at each stack sample for the straggler finding:
//! its CPU time and resident memory (/proc/<pid>/stat, status) and its CPU cgroup's
//! throttling counters (cpu.stat, v1 or v2).

use crate::paths::{self, Root};
use std::path::PathBuf;
use std::time::Duration;
use toporun_shared::root_cause::oom::{controller_cgroup, CgroupVersion};
use toporun_shared::stacks::rank_window::Throttling;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankUsage {
    /// User plus system time of the process (its threads included).
    pub cpu: Duration,
    pub rss_bytes: Option<u64>,
}

/// Clock ticks per second of /proc's times (USER_HZ: 100 on every Linux toporun
/// runs on; read once).
fn ticks_per_second() -> u64 {
    use std::sync::OnceLock;
    static HZ: OnceLock<u64> = OnceLock::new();
    *HZ.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|v| u64::try_from(v).ok())
            .filter(|v| *v > 0)
            .unwrap_or(100)
    })
}

pub fn read(root: &Root, pid: i32) -> Option<RankUsage> {
    let dir = PathBuf::from(paths::PROC).join(pid.to_string());
    let stat = root.read(dir.join("stat"))?;
    // Fields after the command (which may hold spaces and parentheses).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are the 14th and 15th fields; `rest` starts at the 3rd.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = ticks_per_second();
    let rss_bytes = root.read(dir.join("status")).and_then(|s| {
        let kb = s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
        Some(
            kb.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()?
                * 1024,
        )
    });
    Some(RankUsage {
        cpu: Duration::from_micros(ticks * 1_000_000 / hz),
        rss_bytes,
    })
}

/// The throttling counters of the CPU cgroup `pid` is in: v1's cpu controller
/// (mounted as `cpu` or `cpu,cpuacct`), or v2's unified tree.
pub fn throttling(root: &Root, pid: i32) -> Option<Throttling> {
    let own = PathBuf::from(paths::PROC)
        .join(pid.to_string())
        .join("cgroup");
    let (version, path) = controller_cgroup(&root.read(own)?, "cpu")?;
    let path = path.trim_start_matches('/');
    let mounts: &[&str] = match version {
        CgroupVersion::V1 => &[paths::SYS_FS_CGROUP_CPU, paths::SYS_FS_CGROUP_CPU_CPUACCT],
        CgroupVersion::V2 => &[paths::SYS_FS_CGROUP, paths::SYS_FS_CGROUP_UNIFIED],
    };
    mounts
        .iter()
        .flat_map(|m| [PathBuf::from(m).join(path), PathBuf::from(m)])
        .find_map(|d| Throttling::parse(&root.read(d.join("cpu.stat"))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &std::path::Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn cpu_time_and_rss_come_from_stat_and_status() {
        let d = tempfile::tempdir().unwrap();
        // A command with a space and a parenthesis, as Python threads can have.
        let stat = "42 (pt main) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100";
        write(d.path(), "proc/42/stat", stat);
        write(
            d.path(),
            "proc/42/status",
            "Name:\tpython\nVmRSS:\t  204800 kB\n",
        );
        let u = read(&Root::at(d.path()), 42).unwrap();
        let hz = ticks_per_second();
        assert_eq!(u.cpu, Duration::from_micros(300 * 1_000_000 / hz));
        assert_eq!(u.rss_bytes, Some(200 * 1024 * 1024));
        assert_eq!(read(&Root::at(d.path()), 43), None);
    }

    #[test]
    fn throttling_is_read_from_the_ranks_own_cpu_cgroup() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "proc/7/cgroup",
            "4:memory:/pod\n1:cpu,cpuacct:/pod/slow\n0::/\n",
        );
        write(
            d.path(),
            "sys/fs/cgroup/cpu,cpuacct/pod/slow/cpu.stat",
            "nr_periods 50\nnr_throttled 40\nthrottled_time 2000000000\n",
        );
        let t = throttling(&Root::at(d.path()), 7).unwrap();
        assert_eq!(
            (t.periods, t.throttled, t.throttled_us),
            (50, 40, 2_000_000)
        );
        write(d.path(), "proc/8/cgroup", "0::/job\n");
        write(
            d.path(),
            "sys/fs/cgroup/job/cpu.stat",
            "nr_periods 5\nnr_throttled 1\nthrottled_usec 700\n",
        );
        assert_eq!(
            throttling(&Root::at(d.path()), 8).unwrap().throttled_us,
            700
        );
    }
}
