//! NCCL_CUMEM_HOST_ENABLE=0 when SYS_NICE is missing and NCCL cannot fall back itself.

use super::Decision;
use crate::facts::{cap, HostFacts};
use crate::version::Version;

pub(crate) fn decide(facts: &HostFacts) -> Option<Decision> {
    const NAME: &str = "NCCL_CUMEM_HOST_ENABLE";
    if facts.gpus.count() == 0 {
        return None;
    }
    if facts.container.caps.has_effective(cap::SYS_NICE) {
        return Some(Decision::leave(
            NAME,
            "CAP_SYS_NICE is present: cuMem host allocations work",
        ));
    }
    let nccl = facts
        .platform
        .nccl_version
        .as_deref()
        .and_then(Version::parse);
    Some(match nccl {
        Some(v) if v >= Version::new(2, 26, 5) => Decision::leave(NAME, format!("no CAP_SYS_NICE, but NCCL {v} falls back to /dev/shm by itself")),
        _ => Decision::set(NAME, "0", format!("no CAP_SYS_NICE and NCCL {}: cuMem host allocations need get_mempolicy, which Docker's seccomp refuses without it", nccl.map_or("of unknown version".to_string(), |v| format!("{v} (< 2.26.5)")))),
    })
}
