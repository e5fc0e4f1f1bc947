//! Every /proc, /sys, /dev and /etc path toporun reads, relative to a root directory so
//! tests can point probes at a tree of small files.

use std::path::{Path, PathBuf};

pub const PROC_SELF_NS: &str = "proc/self/ns";
pub const PROC_SELF_MOUNTS: &str = "proc/self/mounts";
pub const PROC_SELF_STATUS: &str = "proc/self/status";
pub const PROC_1_COMM: &str = "proc/1/comm";
pub const PROC_BOOT_ID: &str = "proc/sys/kernel/random/boot_id";
pub const PROC_RANDOM_UUID: &str = "proc/sys/kernel/random/uuid";
pub const PROC_NET_ROUTE: &str = "proc/net/route";
pub const PROC_NET_IPV6_ROUTE: &str = "proc/net/ipv6_route";
pub const PROC: &str = "proc";
pub const PROC_NET_TCP: &str = "proc/net/tcp";
pub const PROC_NET_TCP6: &str = "proc/net/tcp6";
pub const SYS_CLASS_NET: &str = "sys/class/net";
pub const SYS_CLASS_INFINIBAND: &str = "sys/class/infiniband";
pub const SYS_CPU: &str = "sys/devices/system/cpu";
pub const SYS_CPU_ONLINE: &str = "sys/devices/system/cpu/online";
pub const SYS_DMI_ID: &str = "sys/devices/virtual/dmi/id";
pub const SYS_CGROUP_V2_MEMORY_MAX: &str = "sys/fs/cgroup/memory.max";
pub const PROC_SELF_CGROUP: &str = "proc/self/cgroup";
pub const SYS_FS_CGROUP: &str = "sys/fs/cgroup";
pub const SYS_FS_CGROUP_MEMORY: &str = "sys/fs/cgroup/memory";
pub const SYS_FS_CGROUP_CPU: &str = "sys/fs/cgroup/cpu";
pub const SYS_FS_CGROUP_CPU_CPUACCT: &str = "sys/fs/cgroup/cpu,cpuacct";
pub const SYS_FS_CGROUP_UNIFIED: &str = "sys/fs/cgroup/unified";
pub const SYS_CGROUP_V1_MEMORY_LIMIT: &str = "sys/fs/cgroup/memory/memory.limit_in_bytes";
pub const DEV: &str = "dev";
pub const DEV_SHM: &str = "dev/shm";
pub const DEV_INFINIBAND: &str = "dev/infiniband";
pub const ETC_NCCL_CONF: &str = "etc/nccl.conf";
/// Mounted into every pod that has a service account token (the default).
pub const K8S_SERVICE_ACCOUNT: &str = "var/run/secrets/kubernetes.io/serviceaccount";

/// Where aws-ofi-nccl and Azure images keep NCCL topology XMLs.
pub const TOPOLOGY_DIRS: &[&str] = &[
    "opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml",
    "opt/aws-ofi-nccl/share/aws-ofi-nccl/xml",
    "usr/local/share/aws-ofi-nccl/xml",
    "opt/microsoft",
];

/// Where NCCL and its network plugins are installed.
pub const LIB_DIRS: &[&str] = &[
    "opt/amazon/ofi-nccl/lib",
    "opt/amazon/ofi-nccl/lib64",
    "opt/aws-ofi-nccl/lib",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/local/lib",
    "usr/local/nccl/lib",
    "usr/lib64",
];

/// Debian/Ubuntu system Python packages (pip's nvidia-nccl-cu* may live there).
pub const SYSTEM_PYTHON_PACKAGES: &[&str] = &["usr/lib/python3/dist-packages"];

/// The file-system root probes read from: "/" live, a temp dir in tests.
#[derive(Debug, Clone)]
pub struct Root(PathBuf);

impl Root {
    pub fn live() -> Self {
        Root(PathBuf::from("/"))
    }

    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Root(dir.into())
    }

    pub fn is_live(&self) -> bool {
        self.0 == Path::new("/")
    }

    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.0.join(rel)
    }

    /// A small text file, trimmed; None when absent or unreadable.
    pub fn read(&self, rel: impl AsRef<Path>) -> Option<String> {
        std::fs::read_to_string(self.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// A text file as it is, its first `limit` bytes at most (a config file a user
    /// names may be /dev/zero); None when absent, unreadable or not UTF-8.
    pub fn read_at_most(&self, rel: impl AsRef<Path>, limit: u64) -> Option<String> {
        use std::io::Read;
        let mut text = String::new();
        let file = std::fs::File::open(self.join(rel)).ok()?;
        file.take(limit).read_to_string(&mut text).ok()?;
        Some(text)
    }

    /// Names in a directory, sorted; empty when it does not exist.
    pub fn list(&self, rel: impl AsRef<Path>) -> Vec<String> {
        self.list_starting(rel, "")
    }

    /// The names in `rel` that start with `prefix`, sorted: a distribution's library
    /// directory holds a thousand names, of which a probe wants a few.
    pub fn list_starting(&self, rel: impl AsRef<Path>, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.join(rel))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .as_encoded_bytes()
                            .starts_with(prefix.as_bytes())
                    })
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

/// A fresh random id (the kernel's UUID generator), unique to this process and call;
/// the pid where /proc is not readable.
pub fn random_id() -> String {
    Root::live()
        .read(PROC_RANDOM_UUID)
        .unwrap_or_else(|| format!("{:x}", std::process::id()))
}

/// Writes `text` at `rel` under a test tree, making its folders.
#[cfg(test)]
pub fn write_under(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("a relative path under the root"))
        .expect("a writable test tree");
    std::fs::write(p, text).expect("a writable test tree");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_sorted_names_with_a_prefix_or_all() {
        let d = tempfile::tempdir().unwrap();
        for f in ["libz.so", "libnccl.so.2", "libnccl-net.so", "libc.so.6"] {
            write_under(d.path(), &format!("usr/lib/{f}"), "");
        }
        let root = Root::at(d.path());
        assert_eq!(
            root.list_starting("usr/lib", "libnccl"),
            ["libnccl-net.so", "libnccl.so.2"]
        );
        assert_eq!(root.list("usr/lib").len(), 4);
        assert!(root.list("usr/nowhere").is_empty());
    }
}
