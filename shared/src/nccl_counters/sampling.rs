//! Which operations toporun's plugin has NCCL time on the GPU. Kernel-channel events
//! make NCCL post a proxy operation for every channel of every collective (intra-node
//! ones included) and its proxy thread poll the kernel's timestamps: on 4x H200 11-21%
//! on back-to-back all_reduces of 128 KiB-2 MiB (docs/measurements.md). So by default
//! bursts of operations are timed, about a period apart; every operation is still
//! counted as posted. `TOPORUN_NCCL_KERNEL_SAMPLING` chooses: `all`, `off` or `BURST/PERIOD_MS`.

use crate::toporun_vars::ToporunVar;
use serde::{Deserialize, Serialize};

/// The variable the ranks' plugin reads (toporun checks it before the ranks start).
pub const SAMPLING_VAR: &str = ToporunVar::NcclKernelSampling.name();
/// CUDA's variable that makes every launch wait (then NCCL reports operations only
/// through host callbacks: every one is timed).
pub const LAUNCH_BLOCKING_VAR: &str = "CUDA_LAUNCH_BLOCKING";
/// Operations timed a burst, and the mean milliseconds from one burst to the next.
pub const DEFAULT_BURST: u64 = 8;
pub const DEFAULT_PERIOD_MS: u64 = 500;

/// Which operations NCCL times on the GPU (kernel channels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KernelSampling {
    /// Every one: completions are exact.
    All,
    /// None: only posts are counted.
    Off,
    /// Bursts of `burst` operations about `period_ms` apart; the others' completion
    /// is seen only when a later timed one completes.
    Bursts { burst: u64, period_ms: u64 },
}

impl Default for KernelSampling {
    /// What the plugin does unless told otherwise.
    fn default() -> Self {
        KernelSampling::Bursts {
            burst: DEFAULT_BURST,
            period_ms: DEFAULT_PERIOD_MS,
        }
    }
}

/// A value of the variable that says nothing toporun knows.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{SAMPLING_VAR}={0}: say all, off, or BURST/PERIOD_MS (operations timed a burst, milliseconds between bursts), as 8/500")]
pub struct BadSampling(pub String);

impl KernelSampling {
    pub fn parse(value: &str) -> Result<KernelSampling, BadSampling> {
        let bad = || BadSampling(value.to_string());
        match value.trim() {
            "all" => Ok(KernelSampling::All),
            "off" => Ok(KernelSampling::Off),
            v => {
                let (b, p) = v.split_once('/').ok_or_else(bad)?;
                let burst: u64 = b.trim().parse().map_err(|_| bad())?;
                let period_ms: u64 = p.trim().parse().map_err(|_| bad())?;
                if burst == 0 || burst > u64::from(u32::MAX) || period_ms == 0 {
                    return Err(bad());
                }
                Ok(KernelSampling::Bursts { burst, period_ms })
            }
        }
    }

    /// For a rank whose environment has `value` for the variable and `launch_blocking`
    /// for CUDA_LAUNCH_BLOCKING. Unset, the default; but with launches blocking NCCL
    /// reports an operation only through a host callback it queues for work with a
    /// proxy part, which an operation outside a burst does not have: every one is
    /// timed then.
    pub fn for_rank(
        value: Option<&str>,
        launch_blocking: Option<&str>,
    ) -> Result<KernelSampling, BadSampling> {
        // Set empty counts as unset, as for every toporun variable.
        let value = value.filter(|v| !v.trim().is_empty());
        match (value, launch_blocking.map(str::trim)) {
            (Some(v), _) => KernelSampling::parse(v),
            (None, Some("1")) => Ok(KernelSampling::All),
            (None, _) => Ok(KernelSampling::default()),
        }
    }

    /// The counters file's header words (H_SAMPLE_BURST, H_SAMPLE_PERIOD_MS).
    pub fn words(self) -> (u64, u64) {
        match self {
            KernelSampling::All => (0, 0),
            KernelSampling::Off => (0, super::layout::NEVER),
            KernelSampling::Bursts { burst, period_ms } => (burst, period_ms),
        }
    }

    /// From the header words.
    pub fn of_words(burst: u64, period_ms: u64) -> KernelSampling {
        match (burst, period_ms) {
            (0, 0) => KernelSampling::All,
            (0, _) => KernelSampling::Off,
            (burst, period_ms) => KernelSampling::Bursts { burst, period_ms },
        }
    }

    /// What the dry run says of it.
    pub fn text(self) -> String {
        match self {
            KernelSampling::All => format!("NCCL times every operation on the GPU ({SAMPLING_VAR}=all: 11-21% slower back-to-back collectives of 128 KiB-2 MiB)"),
            KernelSampling::Off => format!("NCCL times no operation on the GPU ({SAMPLING_VAR}=off): hangs are judged from operations posted, no GPU straggler is named"),
            KernelSampling::Bursts { burst, period_ms } => format!("NCCL times bursts of {burst} operations on the GPU, about one every {period_ms} ms of operations ({SAMPLING_VAR}=all to time every one, as CUDA graphs need)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_says_all_off_or_bursts() {
        assert_eq!(KernelSampling::parse("all"), Ok(KernelSampling::All));
        assert_eq!(KernelSampling::parse("off"), Ok(KernelSampling::Off));
        assert_eq!(
            KernelSampling::parse(" 4 / 250 "),
            Ok(KernelSampling::Bursts {
                burst: 4,
                period_ms: 250
            })
        );
        for bad in ["", "8", "0/100", "8/0", "x/1", "fast", "99999999999/1"] {
            let e = KernelSampling::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("say all, off, or BURST/PERIOD_MS"),
                "{e}"
            );
        }
        let rank = KernelSampling::for_rank;
        assert_eq!(rank(None, None), Ok(KernelSampling::default()));
        assert_eq!(
            rank(None, Some("1")),
            Ok(KernelSampling::All),
            "launches block"
        );
        assert_eq!(
            rank(Some("off"), Some("1")),
            Ok(KernelSampling::Off),
            "yours wins"
        );
    }

    #[test]
    fn header_words_read_back() {
        for s in [
            KernelSampling::All,
            KernelSampling::Off,
            KernelSampling::default(),
        ] {
            let (b, p) = s.words();
            assert_eq!(KernelSampling::of_words(b, p), s);
        }
    }
}
