//! Where NCCL keeps the host buffers of its SHM transport, and so whether /dev/shm's
//! size matters: measured on 2x H200 with NCCL 2.28.9 (tests/fixtures/device/
//! nccl-evidence.md). /dev/shm files are used only when some pair of local ranks runs
//! on the SHM transport and cuMem host allocations are off or refused.

use crate::facts::{cap, HostFacts, LinkKind};
use crate::version::Version;
use std::collections::BTreeMap;

/// First NCCL release that falls back to /dev/shm by itself when cuMem host
/// allocations fail (get_mempolicy refused).
pub const CUMEM_HOST_FALLBACK: Version = Version::new(2, 26, 5);

/// One SHM segment of NCCL 2.28.9 between two local ranks (`failed to extend
/// /dev/shm/nccl-wexIdu to 9637892 bytes`).
pub const SHM_SEGMENT_BYTES: u64 = 9_637_892;

/// /dev/shm segments NCCL 2.28.9 held per directed connection between two local
/// ranks on the SHM transport: 2 ranks used 77,201,408 bytes = 2 connections x 4 x
/// 9.6 MB (scripts/device/gpu_nccl_evidence.sh, shm-use row, 2x H200).
pub const SHM_SEGMENTS_PER_PAIR: u64 = 4;

/// The least /dev/shm the SHM transport needs between `local_ranks` ranks whose host
/// buffers are /dev/shm files: a ring connects each rank to the next (n directed
/// connections; 2 for 2 ranks, as measured). Trees and more channels need more, so a
/// /dev/shm below this is certain to fail, not certain to suffice above it.
pub fn shm_needed(local_ranks: u32) -> u64 {
    u64::from(local_ranks.max(2)) * SHM_SEGMENTS_PER_PAIR * SHM_SEGMENT_BYTES
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
    /// Not probed (facts captured before the get_mempolicy probe) and CAP_SYS_NICE
    /// missing: blocked only under a seccomp profile like Docker's default.
    Unknown,
}

impl CumemHost {
    /// Certain to put NCCL's host buffers in /dev/shm files.
    pub fn uses_shm_files(&self) -> bool {
        matches!(self, CumemHost::Off(_) | CumemHost::Blocked { .. })
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
    match facts.container.get_mempolicy {
        Some(true) => return CumemHost::Works("get_mempolicy is allowed".into()),
        None if facts.container.caps.has_effective(cap::SYS_NICE) => {
            return CumemHost::Works("CAP_SYS_NICE is effective".into())
        }
        None => return CumemHost::Unknown,
        Some(false) => {}
    }
    CumemHost::Blocked {
        old_nccl: nccl_version(facts).is_some_and(|v| v < CUMEM_HOST_FALLBACK),
    }
}

/// Why some pair of local ranks will use the SHM transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmTransport {
    pub why: String,
    /// The GPUs cannot reach each other at all (not just beyond NCCL's P2P level).
    pub no_peer_access: bool,
}

/// Whether NCCL's P2P level (`NCCL_P2P_LEVEL`, default PXB) lets P2P take `link`.
pub fn p2p_level_allows(link: LinkKind, level: Option<&str>) -> bool {
    let rank = |l: LinkKind| match l {
        LinkKind::Own => 0,
        LinkKind::NvLink(_) => 1,
        LinkKind::Pix => 2,
        LinkKind::Pxb => 3,
        LinkKind::Phb | LinkKind::Node => 4,
        LinkKind::Sys => 5,
    };
    let max = match level.map(|v| v.trim().to_ascii_uppercase()).as_deref() {
        Some("LOC" | "0") => 0,
        Some("NVL" | "NVB" | "C2C") => 1,
        Some("PIX" | "1") => 2,
        None | Some("PXB" | "2" | "P2C" | "PXN") => 3,
        Some("PHB" | "3") => 4,
        Some(_) => 5,
    };
    rank(link) <= max
}

/// Some pair of local ranks will use the SHM transport, if one will: P2P off by the
/// user, two GPUs without P2P between them, or a link beyond NCCL's P2P level.
pub fn shm_transport(facts: &HostFacts, env: &BTreeMap<String, String>) -> Option<ShmTransport> {
    let user = |why: String| {
        Some(ShmTransport {
            why,
            no_peer_access: false,
        })
    };
    if let Some(v) = env.get("NCCL_P2P_DISABLE").filter(|v| v.trim() == "1") {
        return user(format!("NCCL_P2P_DISABLE={v}"));
    }
    let level = env.get("NCCL_P2P_LEVEL").map(String::as_str);
    let g = &facts.gpus;
    let n = g.count();
    let pairs = || (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b)));
    if let Some((a, b)) = pairs().find(|&(a, b)| g.p2p(a, b).is_some() && !g.p2p_ok(a, b)) {
        return Some(ShmTransport {
            why: format!("GPUs {a} and {b} report no P2P"),
            no_peer_access: true,
        });
    }
    pairs()
        .find_map(|(a, b)| {
            let link = g.link(a, b)?;
            (!p2p_level_allows(link, level)).then_some((a, b, link))
        })
        .and_then(|(a, b, link)| {
            user(format!(
                "GPUs {a} and {b} are linked by {link}, beyond NCCL's P2P level {}",
                level.unwrap_or("PXB (default)")
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_p2p_level_decides_pcie_paths() {
        assert!(p2p_level_allows(LinkKind::Pxb, None));
        assert!(!p2p_level_allows(LinkKind::Node, None));
        assert!(p2p_level_allows(LinkKind::Node, Some("SYS")));
        assert!(!p2p_level_allows(LinkKind::NvLink(18), Some("LOC")));
    }

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
