//! NCCL_P2P_LEVEL: always decided and printed.

use super::decision::Decision;
use crate::facts::{HostFacts, LinkKind};
use std::collections::BTreeMap;

const NAME: &str = "NCCL_P2P_LEVEL";

pub(crate) fn decide(facts: &HostFacts, _user: &BTreeMap<String, String>) -> Decision {
    let g = &facts.gpus;
    let pairs: Vec<(usize, usize, LinkKind)> = g.pairs().collect();
    if pairs.is_empty() {
        return Decision::leave(
            NAME,
            format!("{} GPU(s): no GPU pair to connect", g.count()),
        );
    }
    let broken: Vec<String> = g
        .nvlink_pairs_without_p2p()
        .iter()
        .map(|(a, b, _)| format!("GPU{a}-GPU{b}"))
        .collect();
    if !broken.is_empty() {
        // NCCL aborts on NVLink pairs whose P2P NVML reports disabled; LOC keeps it
        // from trying and stages through /dev/shm instead.
        return Decision::set(NAME, "LOC", format!("NVML reports P2P read/write not supported on NVLink pair(s) {}: NCCL would abort; P2P off (SHM, ~13x slower) is the working fallback (see finding gpu.p2p)", broken.join(", ")));
    }
    let nv = pairs.iter().filter(|(_, _, l)| l.is_nvlink()).count();
    let pcie_switch = pairs
        .iter()
        .filter(|(_, _, l)| matches!(l, LinkKind::Pix | LinkKind::Pxb))
        .count();
    let n = pairs.len();
    let link = pairs.first().map(|p| p.2.to_string()).unwrap_or_default();
    let p2p = if g.p2p.is_empty() {
        "P2P status not known (no NVML data), assumed OK"
    } else {
        "P2P read/write OK"
    };
    if nv == n {
        Decision::set(
            NAME,
            "NVL",
            format!(
                "all {n} GPU pairs are NVLink-connected ({link}) with {p2p}: P2P only over NVLink"
            ),
        )
    } else if nv > 0 && pcie_switch > 0 {
        Decision::set(NAME, "PXB", format!("mixed host: {nv} NVLink pair(s), {pcie_switch} behind PCIe switches: PXB keeps P2P on both, never across host bridges or sockets"))
    } else if nv > 0 {
        Decision::set(NAME, "NVL", format!("mixed host: {nv} of {n} pairs NVLink-connected, the rest cross host bridges or sockets where P2P is slower than SHM: P2P only over NVLink"))
    } else if pcie_switch > 0 {
        Decision::set(NAME, "PXB", format!("PCIe host: {pcie_switch} of {n} pairs share PCIe switches: P2P through switches, never across host bridges or sockets"))
    } else {
        Decision::set(NAME, "PXB", format!("PCIe host without shared switches ({link}): no pair qualifies for P2P; PXB keeps NCCL's safe default explicit, traffic goes through SHM"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{P2pPair, P2pState};
    use crate::preflight::testutil::healthy;

    fn set_links(f: &mut HostFacts, link: impl Fn(usize, usize) -> LinkKind) {
        for (i, row) in f.gpus.links.iter_mut().enumerate() {
            for (j, l) in row.iter_mut().enumerate() {
                *l = if i == j {
                    LinkKind::Own
                } else {
                    link(i.min(j), i.max(j))
                };
            }
        }
    }

    #[test]
    fn rules() {
        let empty = BTreeMap::new();
        let mut f = healthy();
        assert_eq!(decide(&f, &empty).value.as_deref(), Some("NVL"));
        set_links(&mut f, |_, _| LinkKind::Node);
        assert_eq!(decide(&f, &empty).value.as_deref(), Some("PXB"));
        set_links(&mut f, |a, b| {
            if a / 2 == b / 2 {
                LinkKind::NvLink(4)
            } else {
                LinkKind::Pxb
            }
        });
        let d = decide(&f, &empty);
        assert_eq!(d.value.as_deref(), Some("PXB"));
        assert!(d.reason.contains("mixed"));
        set_links(&mut f, |a, b| {
            if a / 2 == b / 2 {
                LinkKind::NvLink(4)
            } else {
                LinkKind::Sys
            }
        });
        assert_eq!(decide(&f, &empty).value.as_deref(), Some("NVL"));
        let mut broken = healthy();
        broken.gpus.p2p = vec![P2pPair {
            a: 0,
            b: 1,
            read: P2pState::NotSupported,
            write: P2pState::NotSupported,
        }];
        assert_eq!(decide(&broken, &empty).value.as_deref(), Some("LOC"));
        broken.gpus = Default::default();
        assert_eq!(decide(&broken, &empty).value, None);
    }
}
