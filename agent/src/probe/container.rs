//! Namespaces, /dev/shm, capabilities, rlimits, cgroup memory, identity and CPUs.

use crate::paths::{self, Root};
use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use toporun_shared::facts::{CapsFacts, ContainerFacts, Limit, Namespace, Rlimits, ShmFacts};

/// The kernel's initial namespaces have fixed inode numbers (include/linux/proc_ns.h);
/// net and mnt got theirs in Linux 6.18.
const INITIAL_NS: &[(&str, u64)] = &[
    ("ipc", 0xEFFFFFFF),
    ("uts", 0xEFFFFFFE),
    ("user", 0xEFFFFFFD),
    ("pid", 0xEFFFFFFC),
    ("cgroup", 0xEFFFFFFB),
    ("time", 0xEFFFFFFA),
];
const NS_KINDS: &[&str] = &["ipc", "pid", "net", "uts", "mnt", "cgroup", "user"];

/// Variables that matter to a launch, kept in the facts.
pub fn relevant_env(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "OMP_NUM_THREADS",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "HOSTNAME",
    ];
    EXACT.contains(&name)
        || ["NCCL_", "FI_", "PET_", "TORCH", "TOPORUN_"]
            .iter()
            .any(|p| name.starts_with(p))
}

pub fn probe(root: &Root, env: impl Iterator<Item = (String, String)>) -> ContainerFacts {
    let pid = std::process::id();
    let env: Vec<(String, String)> = env.collect();
    // The kubelet sets this variable in every container, and mounts the token by default.
    let kubernetes = env.iter().any(|(k, _)| k == "KUBERNETES_SERVICE_HOST")
        || root.join(paths::K8S_SERVICE_ACCOUNT).exists();
    ContainerFacts {
        kubernetes: Some(kubernetes),
        namespaces: namespaces(root),
        pid,
        is_pid1: pid == 1,
        pid1_comm: root.read(paths::PROC_1_COMM),
        shm: shm(root),
        caps: caps_facts(),
        rlimits: rlimits(),
        cgroup_memory_limit: cgroup_memory_limit(root),
        boot_id: root.read(paths::PROC_BOOT_ID),
        seccomp: seccomp_mode(root),
        get_mempolicy: Some(get_mempolicy_allowed()),
        hostname: nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
        cpu_count: std::thread::available_parallelism()
            .map_or(1, |n| n.get() as u32)
            .max(online_cpus(root)),
        cpu_affinity: affinity(),
        l3_groups: l3_groups(root),
        env: env
            .into_iter()
            .filter(|(k, _)| relevant_env(k))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn namespaces(root: &Root) -> BTreeMap<String, Namespace> {
    NS_KINDS
        .iter()
        .filter_map(|kind| {
            let meta = std::fs::metadata(root.join(paths::PROC_SELF_NS).join(kind)).ok()?;
            let initial = INITIAL_NS
                .iter()
                .find(|(k, _)| k == kind)
                .map(|(_, ino)| meta.ino() == *ino);
            Some((
                kind.to_string(),
                Namespace {
                    inode: meta.ino(),
                    initial,
                },
            ))
        })
        .collect()
}

pub fn shm(root: &Root) -> Option<ShmFacts> {
    let path = root.join(paths::DEV_SHM);
    let st = nix::sys::statvfs::statvfs(&path).ok()?;
    let frsize = st.fragment_size() as u64;
    let mounts = root.read(paths::PROC_SELF_MOUNTS).unwrap_or_default();
    // The last mount on /dev/shm is the one in effect.
    let fs_type = mounts
        .lines()
        .rev()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, mnt, ty) = (f.next()?, f.next()?, f.next()?);
            (mnt == "/dev/shm").then(|| ty.to_string())
        })
        .next();
    Some(ShmFacts {
        total_bytes: frsize * st.blocks() as u64,
        free_bytes: frsize * st.blocks_available() as u64,
        fs_type,
        dev: std::fs::metadata(&path).ok().map(|m| m.dev()),
    })
}

/// `Seccomp:` of /proc/self/status: 0 none, 1 strict, 2 filter.
fn seccomp_mode(root: &Root) -> Option<u32> {
    root.read(paths::PROC_SELF_STATUS)?
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))?
        .trim()
        .parse()
        .ok()
}

/// Calls get_mempolicy as NCCL's cuMem host allocation path does: a seccomp filter
/// that refuses it (Docker's default without CAP_SYS_NICE) answers EPERM.
fn get_mempolicy_allowed() -> bool {
    let mut mode: libc::c_int = 0;
    // SAFETY: asks only for the calling thread's policy mode into a local int; no
    // node mask (null, 0) and no address.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM)
}

fn caps_facts() -> CapsFacts {
    let mask = |set| {
        caps::read(None, set)
            .map(|s| s.iter().map(|c| c.bitmask()).fold(0, |a, b| a | b))
            .unwrap_or(0)
    };
    CapsFacts {
        effective: mask(caps::CapSet::Effective),
        permitted: mask(caps::CapSet::Permitted),
        bounding: mask(caps::CapSet::Bounding),
    }
}

fn limit(resource: Resource) -> Limit {
    let conv = |v| (v != RLIM_INFINITY).then_some(v);
    getrlimit(resource).map_or(Limit::default(), |(soft, hard)| Limit {
        soft: conv(soft),
        hard: conv(hard),
    })
}

fn rlimits() -> Rlimits {
    Rlimits {
        memlock: limit(Resource::RLIMIT_MEMLOCK),
        nofile: limit(Resource::RLIMIT_NOFILE),
        stack: limit(Resource::RLIMIT_STACK),
    }
}

fn cgroup_memory_limit(root: &Root) -> Option<u64> {
    root.read(paths::SYS_CGROUP_V2_MEMORY_MAX)
        .or_else(|| root.read(paths::SYS_CGROUP_V1_MEMORY_LIMIT))
        .and_then(|v| v.parse::<u64>().ok())
        // cgroup v1 reports "no limit" as a page-rounded i64::MAX.
        .filter(|v| *v < (1u64 << 62))
}

fn online_cpus(root: &Root) -> u32 {
    root.read(paths::SYS_CPU_ONLINE)
        .and_then(|l| toporun_shared::cpulist::parse(&l))
        .map_or(1, |c| c.len() as u32)
}

/// CPUs sharing an L3 cache, one group per cache.
fn l3_groups(root: &Root) -> Vec<Vec<u32>> {
    let mut groups: Vec<Vec<u32>> = root
        .list(paths::SYS_CPU)
        .iter()
        .filter(|n| n.starts_with("cpu") && n[3..].parse::<u32>().is_ok())
        .filter_map(|n| {
            root.read(format!(
                "{}/{n}/cache/index3/shared_cpu_list",
                paths::SYS_CPU
            ))
        })
        .filter_map(|l| toporun_shared::cpulist::parse(&l))
        .collect();
    groups.sort();
    groups.dedup();
    groups
}

fn affinity() -> Vec<u32> {
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .map(|c| c as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_mask(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    }

    #[test]
    fn capability_masks_match_proc_status() {
        let c = caps_facts();
        assert_eq!(c.effective, status_mask("CapEff:"));
        assert_eq!(c.permitted, status_mask("CapPrm:"));
        assert_eq!(c.bounding, status_mask("CapBnd:"));
    }

    #[test]
    fn namespace_inodes_match_proc_links() {
        let ns = namespaces(&Root::live());
        for kind in ["ipc", "pid", "net", "uts"] {
            let link = std::fs::read_link(format!("/proc/self/ns/{kind}")).unwrap();
            let want = format!("{kind}:[{}]", ns[kind].inode);
            assert_eq!(link.to_string_lossy(), want);
        }
        let ipc = &ns["ipc"];
        assert_eq!(ipc.initial, Some(ipc.inode == 4026531839));
        assert_eq!(ns["net"].initial, None);
    }

    #[test]
    fn shm_matches_statvfs_of_dev_shm() {
        let s = shm(&Root::live()).expect("/dev/shm mounted here");
        let st = nix::sys::statvfs::statvfs("/dev/shm").unwrap();
        assert_eq!(
            s.total_bytes,
            st.fragment_size() as u64 * st.blocks() as u64
        );
        assert!(s.free_bytes <= s.total_bytes);
    }

    #[test]
    fn shm_reads_under_a_fake_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dev/shm")).unwrap();
        std::fs::create_dir_all(dir.path().join("proc/self")).unwrap();
        std::fs::write(
            dir.path().join("proc/self/mounts"),
            "shm /dev/shm tmpfs rw,size=65536k 0 0\n",
        )
        .unwrap();
        let s = shm(&Root::at(dir.path())).unwrap();
        assert_eq!(s.fs_type.as_deref(), Some("tmpfs"));
    }

    #[test]
    fn a_pod_is_told_by_its_variable_or_its_service_account_mount() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::at(d.path());
        let none = std::iter::empty();
        assert_eq!(probe(&root, none).kubernetes, Some(false));
        let var = vec![(
            "KUBERNETES_SERVICE_HOST".to_string(),
            "10.96.0.1".to_string(),
        )];
        assert_eq!(probe(&root, var.into_iter()).kubernetes, Some(true));
        std::fs::create_dir_all(d.path().join(paths::K8S_SERVICE_ACCOUNT)).unwrap();
        assert_eq!(probe(&root, std::iter::empty()).kubernetes, Some(true));
    }

    #[test]
    fn rlimits_match_getrlimit_and_env_is_filtered() {
        let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(
            rlimits().nofile.soft,
            (soft != RLIM_INFINITY).then_some(soft)
        );
        let env = vec![
            ("NCCL_DEBUG".to_string(), "INFO".to_string()),
            ("SECRET_TOKEN".into(), "x".into()),
        ];
        let facts = probe(&Root::live(), env.into_iter());
        assert!(facts.env.contains_key("NCCL_DEBUG"));
        assert!(!facts.env.contains_key("SECRET_TOKEN"));
        assert_eq!(facts.pid, std::process::id());
        assert!(!facts.cpu_affinity.is_empty());
    }
}
