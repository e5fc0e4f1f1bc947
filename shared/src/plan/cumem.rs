//! NCCL_CUMEM_HOST_ENABLE=0 only where the failure it prevents applies: get_mempolicy
//! refused under NCCL < 2.26.5, or GPUs without P2P (cuda failure 217), and never
//! where it would move the SHM transport into a /dev/shm too small for it.

use super::decision::Decision;
use crate::facts::HostFacts;
use crate::host_buffers::{cumem_host, shm_needed, shm_transport, CumemHost};
use crate::units::format_size;
use std::collections::BTreeMap;

pub(crate) fn decide(
    facts: &HostFacts,
    user_env: &BTreeMap<String, String>,
    local_ranks: u32,
) -> Option<Decision> {
    const NAME: &str = "NCCL_CUMEM_HOST_ENABLE";
    if facts.gpus.count() == 0 {
        return None;
    }
    let state = cumem_host(facts, user_env);
    let shm = shm_transport(facts, user_env);
    let need = shm_needed(local_ranks);
    let shm_fits = facts
        .container
        .shm
        .as_ref()
        .is_some_and(|s| s.total_bytes >= need);
    let why_set = match (&state, &shm) {
        (CumemHost::Blocked { old_nccl: true }, _) => Some(format!(
            "get_mempolicy is refused and NCCL {} (< 2.26.5) does not fall back by itself: its cuMem host allocations would fail",
            facts.platform.nccl_version.as_deref().unwrap_or("?")
        )),
        (CumemHost::Works(_), Some(t)) if t.no_peer_access => Some(format!(
            "{}: cuMem host memory fails between GPUs without peer access (cuda failure 217)",
            t.why
        )),
        _ => None,
    };
    Some(match why_set {
        Some(why) if shm.is_none() || shm_fits => Decision::set(NAME, "0", why),
        Some(why) => Decision::leave(NAME, format!("{why}, but setting it would put the SHM transport's buffers into a /dev/shm of {} (needs about {} for {local_ranks} local ranks): fix /dev/shm first (see shm.size)", facts.container.shm.as_ref().map_or("0 B".into(), |s| format_size(s.total_bytes)), format_size(need))),
        None => Decision::leave(NAME, match &state {
            CumemHost::Works(why) => format!("{why}: cuMem host allocations work, and NCCL's host buffers stay out of /dev/shm"),
            CumemHost::Blocked { .. } => "get_mempolicy is refused, but this NCCL falls back to /dev/shm by itself (>= 2.26.5, or its version is unknown: forcing it off would make /dev/shm carry the SHM transport for certain)".into(),
            CumemHost::Off(v) => format!("{v} is set"),
            CumemHost::Unknown => "no CAP_SYS_NICE, get_mempolicy not probed: NCCL >= 2.26.5 falls back by itself if a seccomp profile refuses it; forcing it off would make /dev/shm carry the SHM transport for certain".into(),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::testutil::healthy;

    fn env() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    #[test]
    fn unknown_nccl_without_sys_nice_is_left_alone() {
        // g6e-like pod: no SYS_NICE, pip NCCL of unknown version: the old rule set it
        // to 0 and broke a small /dev/shm; NCCL's own fallback is safer.
        let mut f = healthy();
        f.container.caps.effective = 0;
        f.platform.nccl_version = None;
        let d = decide(&f, &env(), 4).unwrap();
        assert_eq!(d.value, None, "{}", d.reason);
    }

    #[test]
    fn blocked_get_mempolicy_on_old_nccl_sets_it() {
        let mut f = healthy();
        f.container.get_mempolicy = Some(false);
        f.platform.nccl_version = Some("2.21.5".into());
        assert_eq!(decide(&f, &env(), 4).unwrap().value.as_deref(), Some("0"));
        f.platform.nccl_version = Some("2.28.9".into());
        assert_eq!(decide(&f, &env(), 4).unwrap().value, None);
    }

    #[test]
    fn gpus_without_p2p_set_it_only_when_shm_fits() {
        let mut f = healthy();
        crate::preflight::testutil::without_p2p(&mut f, 0, 1);
        assert_eq!(decide(&f, &env(), 4).unwrap().value.as_deref(), Some("0"));
        f.container.shm.as_mut().unwrap().total_bytes = 64 << 20;
        let d = decide(&f, &env(), 4).unwrap();
        assert_eq!(d.value, None);
        assert!(d.reason.contains("fix /dev/shm first"), "{}", d.reason);
    }
}
