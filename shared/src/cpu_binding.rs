//! `--numa-binding`: the CPUs each local rank is pinned to, from its GPU's CPU
//! affinity (and the L3 cache domains for core-complex). One function for the dry run
//! and the launch, so they cannot disagree.

use crate::torchrun::options::NumaBinding;

/// `--numa-binding=exclusive` with more ranks on one affinity set than it has CPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--numa-binding=exclusive: {ranks} local ranks share GPU CPU affinity of {cpus} CPUs; each needs at least one of its own (use node, or fewer ranks)")]
pub struct TooFewCpus {
    pub ranks: usize,
    pub cpus: usize,
}

/// `affinity[r]`: the CPU affinity of local rank r's GPU (empty: unknown).
/// `l3_groups`: CPUs sharing one L3 cache. Ok(None): no binding.
pub fn cpus_for(
    mode: NumaBinding,
    affinity: &[Vec<u32>],
    l3_groups: &[Vec<u32>],
    local_rank: usize,
) -> Result<Option<Vec<u32>>, TooFewCpus> {
    let Some(mine) = affinity.get(local_rank).filter(|a| !a.is_empty()) else {
        return Ok(None);
    };
    // Ranks whose GPUs share this affinity set split it.
    let sharing: Vec<usize> = (0..affinity.len())
        .filter(|r| affinity[*r] == *mine)
        .collect();
    let idx = sharing.iter().position(|r| *r == local_rank).unwrap_or(0);
    match mode {
        NumaBinding::None => Ok(None),
        NumaBinding::Node | NumaBinding::Socket => Ok(Some(mine.clone())),
        NumaBinding::Exclusive => {
            if sharing.len() > mine.len() {
                return Err(TooFewCpus {
                    ranks: sharing.len(),
                    cpus: mine.len(),
                });
            }
            let per = mine.len() / sharing.len();
            Ok(Some(
                mine.iter().skip(idx * per).take(per).copied().collect(),
            ))
        }
        NumaBinding::CoreComplex => {
            let domains: Vec<Vec<u32>> = l3_groups
                .iter()
                .map(|g| {
                    g.iter()
                        .filter(|c| mine.contains(c))
                        .copied()
                        .collect::<Vec<u32>>()
                })
                .filter(|g| !g.is_empty())
                .collect();
            if domains.is_empty() {
                return Ok(Some(mine.clone()));
            }
            Ok(Some(domains[idx % domains.len()].clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_split_the_gpus_cpus() {
        let aff = vec![
            (0..8).collect::<Vec<u32>>(),
            (0..8).collect(),
            (8..16).collect(),
        ];
        let l3 = vec![
            (0..4).collect::<Vec<u32>>(),
            (4..8).collect(),
            (8..16).collect(),
        ];
        assert_eq!(
            cpus_for(NumaBinding::Node, &aff, &l3, 1)
                .unwrap()
                .unwrap()
                .len(),
            8
        );
        assert_eq!(
            cpus_for(NumaBinding::Exclusive, &aff, &l3, 1)
                .unwrap()
                .unwrap(),
            [4, 5, 6, 7]
        );
        assert_eq!(
            cpus_for(NumaBinding::CoreComplex, &aff, &l3, 0)
                .unwrap()
                .unwrap(),
            [0, 1, 2, 3]
        );
        assert_eq!(
            cpus_for(NumaBinding::CoreComplex, &aff, &l3, 1)
                .unwrap()
                .unwrap(),
            [4, 5, 6, 7]
        );
        assert_eq!(cpus_for(NumaBinding::None, &aff, &l3, 0).unwrap(), None);
        let crowded = vec![vec![0, 1]; 3];
        assert!(cpus_for(NumaBinding::Exclusive, &crowded, &[], 0)
            .unwrap_err()
            .to_string()
            .contains("3 local ranks"));
    }
}
