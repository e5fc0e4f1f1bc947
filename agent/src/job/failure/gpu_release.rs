//! Before a restart, the last attempt's processes must have let go of their GPU
//! memory, or the new ranks fail with "CUDA out of memory". Waits (bounded, and said)
//! until no process of this job (a descendant of toporun: ranks, their children, the
//! orphans it reaps as subreaper) holds memory on a GPU, as NVML lists them through
//! the GPU probe.

use crate::paths::{Root, PROC};
use crate::probe::{GpuProbe, GpuProcess};
use std::time::{Duration, Instant};

/// How long a restart waits for GPU memory to be released.
pub const RELEASE_WAIT: Duration = Duration::from_secs(30);

/// A process of the job still holding GPU memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub process: GpuProcess,
    pub cmdline: String,
}

impl Holder {
    pub fn line(&self) -> String {
        let mem = self
            .process
            .used_bytes
            .map(|b| format!("{} of ", toporun_shared::units::format_size(b)))
            .unwrap_or_default();
        let uuid = self
            .process
            .uuid
            .as_ref()
            .map(|u| format!(" {u}"))
            .unwrap_or_default();
        format!(
            "pid {} ({}) holds {mem}GPU {}{uuid}",
            self.process.pid, self.cmdline, self.process.gpu
        )
    }
}

/// The parent of `pid`, from /proc/<pid>/stat (after the command's closing paren).
fn parent(root: &Root, pid: u32) -> Option<u32> {
    let stat = root.read(format!("{PROC}/{pid}/stat"))?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` descends from `ancestor` (a pid NVML names that this PID namespace
/// does not show descends from nothing here).
fn descends(root: &Root, mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        match parent(root, pid) {
            Some(p) if p == ancestor => return true,
            Some(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
    false
}

fn holders(probe: &dyn GpuProbe, root: &Root, me: u32) -> Vec<Holder> {
    probe
        .processes()
        .into_iter()
        .filter(|p| descends(root, p.pid, me))
        .map(|p| Holder {
            cmdline: root
                .read(format!("{PROC}/{}/cmdline", p.pid))
                .map(|c| c.replace('\0', " ").trim().to_string())
                .unwrap_or_default(),
            process: p,
        })
        .collect()
}

/// Waits until no process descending from `me` holds GPU memory: how long it waited,
/// or those still holding it after `bound`.
pub async fn wait_released(
    probe: &dyn GpuProbe,
    root: &Root,
    me: u32,
    bound: Duration,
) -> Result<Duration, Vec<Holder>> {
    let start = Instant::now();
    let mut said = false;
    loop {
        let held = holders(probe, root, me);
        if held.is_empty() {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= bound {
            return Err(held);
        }
        if !said {
            let who: Vec<String> = held.iter().map(Holder::line).collect();
            crate::console::say!("toporun: waiting up to {}s for the last attempt's GPU memory to be released before the restart: {}", bound.as_secs(), who.join("; "));
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use toporun_shared::facts::GpuFacts;

    /// NVML as a test sees it: `pid` holds memory for the first `calls` looks.
    struct Held {
        pid: u32,
        calls: usize,
        seen: AtomicUsize,
    }

    impl GpuProbe for Held {
        fn probe(&self) -> GpuFacts {
            GpuFacts::default()
        }

        fn processes(&self) -> Vec<GpuProcess> {
            if self.seen.fetch_add(1, Ordering::Relaxed) >= self.calls {
                return Vec::new();
            }
            vec![GpuProcess {
                gpu: 1,
                uuid: Some("GPU-6ae3437b-088d-f0e2-8caf-05f9283b5476".into()),
                pid: self.pid,
                used_bytes: Some(2 << 30),
            }]
        }
    }

    fn held(pid: u32, calls: usize) -> Held {
        Held {
            pid,
            calls,
            seen: AtomicUsize::new(0),
        }
    }

    #[tokio::test]
    async fn a_child_holding_memory_is_waited_for_then_named() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let (pid, me) = (child.id(), std::process::id());
        let root = Root::live();
        // Released after two looks: waited for.
        let waited = wait_released(&held(pid, 2), &root, me, Duration::from_secs(5)).await;
        assert!(waited.unwrap() >= Duration::from_millis(400));
        // Never released: named after the bound.
        let err = wait_released(
            &held(pid, usize::MAX),
            &root,
            me,
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert_eq!(
            err[0].line(),
            format!("pid {pid} (sleep 30) holds 2 GiB of GPU 1 GPU-6ae3437b-088d-f0e2-8caf-05f9283b5476")
        );
        // Another job's process (not ours) is not waited for.
        let other = wait_released(&held(1, usize::MAX), &root, me, Duration::from_secs(5)).await;
        assert_eq!(other.map(|d| d < Duration::from_secs(1)), Ok(true));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
