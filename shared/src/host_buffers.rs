//! Where NCCL keeps the host buffers of its SHM transport, and so whether /dev/shm's
//! size matters: measured on 2x H200 with NCCL 2.28.9 (tests/fixtures/device/
//! nccl-evidence.md). /dev/shm files are used only when some pair of local ranks runs
//! on the SHM transport and cuMem host allocations are off or refused.

use crate::facts::{cap, HostFacts};
use crate::version::Version;
use std::collections::BTreeMap;

/// First NCCL release that falls back to /dev/shm by itself when cuMem host
/// allocations fail (get_mempolicy refused).
pub const CUMEM_HOST_FALLBACK: Version = Version::new(2, 26, 5);

/// One SHM segment of NCCL 2.28.9 between two local ranks (`failed to extend
/// /dev/shm/nccl-wexIdu to 9637892 bytes`).
pub const SHM_SEGMENT_BYTES: u64 = 9_637_892;

/// /dev/shm files NCCL 2.28.9 held per directed pair of local ranks on the SHM
/// transport (measured: scripts/gpu_nccl_evidence.sh, shm-usage row).
pub const SHM_SEGMENTS_PER_PAIR: u64 = 8;

/// What /dev/shm must hold for the SHM transport between `local_ranks` ranks whose
/// host buffers are /dev/shm files (every directed pair).
pub fn shm_needed(local_ranks: u32) -> u64 {
    let n = u64::from(local_ranks.max(2));
    n * (n - 1) * SHM_SEGMENTS_PER_PAIR * SHM_SEGMENT_BYTES
}

/// The state of NCCL's cuMem host allocations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CumemHost {
    /// They work: host buffers are anonymous cuMem memory, not /dev/shm files.
    Works(String),
    /// Off by a variable (the user's or the plan's): host buffers are /dev/shm files.
    Off(String),
    /// get_mempolicy is refused: NCCL >= 2.26.5 falls back to /dev/shm files, older
    /// NCCL fails unless NCCL_CUMEM_HOST_ENABLE=0.
    Blocked { old_nccl: bool },
}

impl CumemHost {
    pub fn uses_shm_files(&self) -> bool {
        !matches!(self, CumemHost::Works(_))
    }
}

pub fn nccl_version(facts: &HostFacts) -> Option<Version> {
    facts
        .platform
        .nccl_version
        .as_deref()
        .and_then(Version::parse)
}

/// From the variables in force and the get_mempolicy probe (CAP_SYS_NICE stands in
/// for it in facts captured before the probe existed).
pub fn cumem_host(facts: &HostFacts, env: &BTreeMap<String, String>) -> CumemHost {
    for var in ["NCCL_CUMEM_ENABLE", "NCCL_CUMEM_HOST_ENABLE"] {
        if env.get(var).map(|v| v.trim()) == Some("0") {
            return CumemHost::Off(format!("{var}=0"));
        }
    }
    let allowed = facts
        .container
        .get_mempolicy
        .unwrap_or_else(|| facts.container.caps.has_effective(cap::SYS_NICE));
    if allowed {
        return CumemHost::Works(if facts.container.get_mempolicy.is_some() {
            "get_mempolicy is allowed".into()
        } else {
            "CAP_SYS_NICE is effective".into()
        });
    }
    CumemHost::Blocked {
        old_nccl: nccl_version(facts).is_some_and(|v| v < CUMEM_HOST_FALLBACK),
    }
}

/// Why some pair of local ranks will use the SHM transport, if one will: P2P off by
/// the user, or two of the GPUs without P2P between them.
pub fn shm_transport(facts: &HostFacts, env: &BTreeMap<String, String>) -> Option<String> {
    if let Some(v) = env.get("NCCL_P2P_DISABLE").filter(|v| v.trim() == "1") {
        return Some(format!("NCCL_P2P_DISABLE={v}"));
    }
    if env.get("NCCL_P2P_LEVEL").map(|v| v.trim()) == Some("LOC") {
        return Some("NCCL_P2P_LEVEL=LOC".into());
    }
    let g = &facts.gpus;
    let n = g.count();
    (0..n)
        .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
        .find(|&(a, b)| g.p2p(a, b).is_some() && !g.p2p_ok(a, b))
        .map(|(a, b)| format!("GPUs {a} and {b} report no P2P"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_need_grows_with_pairs_and_two_ranks_exceed_64mib() {
        assert!(
            shm_needed(2) > 64 << 20,
            "measured: 2 ranks failed in 64 MiB"
        );
        assert!(shm_needed(8) > shm_needed(4));
        assert!(shm_needed(8) < 16 << 30, "fits the recommended 16Gi");
    }
}
