//! What a rank's process uses, read at each stack sample for the straggler finding:
//! its CPU time and resident memory (one read of /proc/<pid>/stat) and its CPU
//! cgroup's throttling counters (cpu.stat, v1 or v2; the file found once per rank).

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

/// A sysconf value, read once per process by the caller's static.
fn sysconf(var: nix::unistd::SysconfVar, fallback: u64) -> u64 {
    nix::unistd::sysconf(var)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(fallback)
}

/// Clock ticks per second of /proc's times (USER_HZ: 100 on every Linux toporun
/// runs on).
fn ticks_per_second() -> u64 {
    static HZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| sysconf(nix::unistd::SysconfVar::CLK_TCK, 100))
}

fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| sysconf(nix::unistd::SysconfVar::PAGE_SIZE, 4096))
}

pub fn read(root: &Root, pid: i32) -> Option<RankUsage> {
    usage_in(
        root,
        PathBuf::from(paths::PROC)
            .join(pid.to_string())
            .join("stat"),
    )
}

/// The CPU time of the rank's main thread alone (its Python, not NCCL's proxy
/// thread, which polls while operations are in flight).
pub fn main_thread_cpu(root: &Root, pid: i32) -> Option<Duration> {
    let pid = pid.to_string();
    let stat = PathBuf::from(paths::PROC)
        .join(&pid)
        .join("task")
        .join(&pid)
        .join("stat");
    Some(usage_in(root, stat)?.cpu)
}

/// Whether the rank's process is stopped (state `T`: SIGSTOP or Ctrl-Z; `t`: held
/// by a tracer): it runs nothing until continued, whatever its stack says.
pub fn stopped(root: &Root, pid: i32) -> bool {
    let stat = root.read(
        PathBuf::from(paths::PROC)
            .join(pid.to_string())
            .join("stat"),
    );
    // The state is the field after the command, which may hold spaces and parentheses.
    stat.and_then(|s| s.get(s.rfind(')')? + 2..)?.chars().next())
        .is_some_and(|state| matches!(state, 'T' | 't'))
}

fn usage_in(root: &Root, stat_file: PathBuf) -> Option<RankUsage> {
    let stat = root.read(stat_file)?;
    // Fields after the command (which may hold spaces and parentheses); `rest`
    // starts at the 3rd field: utime, stime are the 14th, 15th, rss (pages) the 24th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = field(14)? + field(15)?;
    Some(RankUsage {
        cpu: Duration::from_micros(ticks * 1_000_000 / ticks_per_second()),
        rss_bytes: field(24).map(|pages| pages * page_size()),
    })
}

/// The throttling counters in a `cpu.stat` found by [`cpu_stat_of`].
pub fn throttling(root: &Root, cpu_stat: &std::path::Path) -> Option<Throttling> {
    Throttling::parse(&root.read(cpu_stat)?)
}

/// The `cpu.stat` of the CPU cgroup `pid` is in (relative to the root): v1's cpu
/// controller (mounted as `cpu` or `cpu,cpuacct`), or v2's unified tree.
pub fn cpu_stat_of(root: &Root, pid: i32) -> Option<PathBuf> {
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
        .map(|d| d.join("cpu.stat"))
        .find(|f| throttling(root, f).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::paths::write_under as write;

    #[test]
    fn cpu_time_and_rss_come_from_stat() {
        let d = tempfile::tempdir().unwrap();
        // A command with a space and a parenthesis, as Python threads can have.
        let stat = "42 (pt main) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 900000 51200 18446744073709551615";
        write(d.path(), "proc/42/stat", stat);
        let u = read(&Root::at(d.path()), 42).unwrap();
        let hz = ticks_per_second();
        assert_eq!(u.cpu, Duration::from_micros(300 * 1_000_000 / hz));
        assert_eq!(u.rss_bytes, Some(51200 * page_size()));
        assert_eq!(read(&Root::at(d.path()), 43), None);
    }

    #[test]
    fn a_stopped_process_is_told_by_its_state() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "proc/42/stat", "42 (pt main) x) T 1 42 42 0");
        write(d.path(), "proc/43/stat", "43 (python) S 1 43 43 0");
        write(d.path(), "proc/44/stat", "44 (gdb target) t 1 44 44 0");
        let root = Root::at(d.path());
        assert!(stopped(&root, 42));
        assert!(!stopped(&root, 43));
        assert!(stopped(&root, 44), "held by a tracer");
        assert!(!stopped(&root, 45), "gone: not stopped");
    }

    #[test]
    fn this_process_reads_as_the_kernel_counts_it() {
        let me = i32::try_from(std::process::id()).unwrap();
        let u = read(&Root::live(), me).unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        // stat's count is the kernel's per-CPU approximation, status's the exact
        // sum: a few MB apart at most (the neighbouring fields are vsize and rlimit).
        let rss = u.rss_bytes.unwrap() / 1024;
        assert!(
            rss.abs_diff(kb) < 16 * 1024,
            "stat {rss} kB, status {kb} kB"
        );
    }

    /// A thread spinning beside an idle main thread (a rank blocked in a read while
    /// NCCL's proxy polls): the process's CPU time grows, its main thread's does not.
    #[test]
    fn the_main_thread_s_cpu_leaves_other_threads_out() {
        let me = i32::try_from(std::process::id()).unwrap();
        let root = Root::live();
        let (main0, all0) = (
            main_thread_cpu(&root, me).unwrap(),
            read(&root, me).unwrap().cpu,
        );
        std::thread::spawn(move || {
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while read(&Root::live(), me).unwrap().cpu < all0 + Duration::from_millis(300)
                && std::time::Instant::now() < until
            {
                std::hint::black_box((0..10_000u64).sum::<u64>());
            }
        })
        .join()
        .unwrap();
        let all = read(&root, me).unwrap().cpu - all0;
        let main = main_thread_cpu(&root, me).unwrap() - main0;
        assert!(all >= Duration::from_millis(300), "{all:?}");
        assert!(main < Duration::from_millis(100), "main thread {main:?}");
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
        let root = Root::at(d.path());
        let at = |pid| throttling(&root, &cpu_stat_of(&root, pid).unwrap()).unwrap();
        let t = at(7);
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
        assert_eq!(at(8).throttled_us, 700);
        assert_eq!(cpu_stat_of(&root, 9), None);
    }
}
