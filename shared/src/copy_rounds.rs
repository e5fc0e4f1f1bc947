//! The order in which `preflight --measure` copies between GPUs: every ordered pair
//! once. Pairs joined by NVLink run together, a round at a time, each GPU sending to
//! one peer and receiving from another: NVLink is full duplex and NVSwitch is
//! non-blocking, so those copies share no link (on 4x H200, NV18: 388-389 GB/s each,
//! together or alone). Pairs over PCIe share switches and the root complex: each runs
//! alone.

use crate::facts::GpuFacts;

/// An ordered pair of GPUs (NVML indices): the copy runs from `.0` to `.1`.
pub type Pair = (u32, u32);

/// Rounds of copies for the GPUs `visible` (NVML indices, as CUDA sees them): round k
/// sends from each GPU to the k-th next one, those joined by NVLink together, each
/// other pair in a round of its own. Every ordered pair appears exactly once.
pub fn copy_rounds(gpus: &GpuFacts, visible: &[u32]) -> Vec<Vec<Pair>> {
    let n = visible.len();
    let nvlink = |a: u32, b: u32| {
        gpus.link(a as usize, b as usize)
            .is_some_and(|l| l.is_nvlink())
    };
    let mut rounds = Vec::new();
    for k in 1..n {
        let shift: Vec<Pair> = (0..n).map(|i| (visible[i], visible[(i + k) % n])).collect();
        let (together, alone): (Vec<Pair>, Vec<Pair>) =
            shift.into_iter().partition(|&(a, b)| nvlink(a, b));
        if !together.is_empty() {
            rounds.push(together);
        }
        rounds.extend(alone.into_iter().map(|p| vec![p]));
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::LinkKind;

    fn facts(links: Vec<Vec<LinkKind>>) -> GpuFacts {
        GpuFacts {
            links,
            ..Default::default()
        }
    }

    fn every_pair_once(rounds: &[Vec<Pair>], visible: &[u32]) {
        let mut seen: Vec<Pair> = rounds.iter().flatten().copied().collect();
        seen.sort();
        let mut want: Vec<Pair> = visible
            .iter()
            .flat_map(|&a| {
                visible
                    .iter()
                    .filter(move |&&b| b != a)
                    .map(move |&b| (a, b))
            })
            .collect();
        want.sort();
        assert_eq!(seen, want);
        for r in rounds {
            let mut src: Vec<u32> = r.iter().map(|p| p.0).collect();
            let mut dst: Vec<u32> = r.iter().map(|p| p.1).collect();
            src.sort();
            src.dedup();
            dst.sort();
            dst.dedup();
            assert_eq!(
                (src.len(), dst.len()),
                (r.len(), r.len()),
                "one send and one receive per GPU: {r:?}"
            );
        }
    }

    /// 8 GPUs on NVSwitch: 7 rounds of 8 copies instead of 56 one after another.
    #[test]
    fn nvswitch_gpus_copy_eight_at_a_time() {
        let n = 8;
        let links = LinkKind::mesh(n, LinkKind::NvLink(18));
        let visible: Vec<u32> = (0..n as u32).collect();
        let r = copy_rounds(&facts(links), &visible);
        assert_eq!(r.len(), 7);
        assert!(r.iter().all(|round| round.len() == 8));
        every_pair_once(&r, &visible);
        assert_eq!(r[0][0], (0, 1));
    }

    /// A real PCIe host (g6e.12xlarge, 4x L40S, no NVLink): each copy alone.
    #[test]
    fn pcie_gpus_copy_one_at_a_time() {
        let topo = crate::smi_topo::parse_matrix(include_str!(
            "../../tests/fixtures/topo/g6e.12xlarge.txt"
        ))
        .unwrap();
        let g = facts(topo.links);
        let visible: Vec<u32> = (0..g.count() as u32).collect();
        let r = copy_rounds(&g, &visible);
        assert_eq!(r.len(), visible.len() * (visible.len() - 1));
        assert!(r.iter().all(|round| round.len() == 1));
        every_pair_once(&r, &visible);
    }

    /// NVLink bridges between 0-1 and 2-3 only, GPUs 1 and 3 visible of four: the
    /// PCIe pairs alone; one GPU or none: no copy.
    #[test]
    fn mixed_links_and_a_subset() {
        use LinkKind::*;
        let links = vec![
            vec![Own, NvLink(4), Sys, Sys],
            vec![NvLink(4), Own, Sys, Sys],
            vec![Sys, Sys, Own, NvLink(4)],
            vec![Sys, Sys, NvLink(4), Own],
        ];
        let g = facts(links);
        let all = copy_rounds(&g, &[0, 1, 2, 3]);
        every_pair_once(&all, &[0, 1, 2, 3]);
        assert!(
            all.iter().any(|r| r.len() == 2 && r.contains(&(0, 1))),
            "{all:?}"
        );
        assert!(all.iter().filter(|r| r.len() == 1).all(|r| !g
            .link(r[0].0 as usize, r[0].1 as usize)
            .unwrap()
            .is_nvlink()));
        let two = copy_rounds(&g, &[1, 3]);
        assert_eq!(two, vec![vec![(1, 3)], vec![(3, 1)]]);
        assert!(copy_rounds(&g, &[2]).is_empty());
        assert!(copy_rounds(&g, &[]).is_empty());
    }
}
