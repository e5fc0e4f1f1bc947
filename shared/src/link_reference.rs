//! What a link should carry: reference copy bandwidths by link class, each with where
//! the figure comes from. `preflight --measure` compares every measured link with its
//! class and names the links below `SLOW_FRACTION` of it.

use crate::facts::{Gpu, GpuFacts, LinkKind, PcieLink};

/// A link measured below this fraction of its class is a finding.
pub const SLOW_FRACTION: f64 = 0.7;

#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// GB/s one copy in one direction should reach.
    pub gbps: f64,
    /// The class, as a person names it: "NV18 (Hopper)", "PCIe Gen5 x16".
    pub class: String,
    pub source: &'static str,
}

/// NCCL's own model of one NVLink's usable bandwidth (GB/s per direction), by GPU
/// architecture: src/graph/topo.h, SM60/70/80/86/90/100_NVLINK_BW.
const NCCL_TOPO_H: &str = "NCCL src/graph/topo.h (SMxx_NVLINK_BW: NCCL's model of one link); on NV18 Hopper 370.8 GB/s, and all_reduce reached 353.4 GB/s busbw on 4x H200 (tests/fixtures/source/bench)";

fn nvlink_per_link(gpu_name: &str) -> Option<(f64, &'static str)> {
    let n = gpu_name.to_ascii_uppercase();
    let has = |keys: &[&str]| keys.iter().any(|k| n.contains(k));
    Some(if has(&["B200", "B100", "GB200", "B300"]) {
        (40.1, "Blackwell")
    } else if has(&["H100", "H200", "H800", "H20", "GH200"]) {
        (20.6, "Hopper")
    } else if has(&["A100", "A800", "A30"]) {
        (20.0, "Ampere")
    } else if has(&["A40", "A6000", "A10", "3090"]) {
        (12.0, "Ampere GA10x")
    } else if has(&["V100"]) {
        (20.0, "Volta")
    } else if has(&["P100"]) {
        (18.0, "Pascal")
    } else {
        return None;
    })
}

/// Raw GB/s of one PCIe lane per generation (after line coding), PCI-SIG.
fn lane_raw_gbps(gen: u32) -> Option<f64> {
    Some(match gen {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        6 => 7.563,
        _ => return None,
    })
}

/// NCCL's PCI_BW (12 GB/s for Gen3 x16) over Gen3 x16's raw 15.75 GB/s: the share of
/// a PCIe link a copy can use.
const PCIE_EFFICIENCY: f64 = 12.0 / 15.75;
const PCIE_SOURCE: &str = "PCI-SIG lane rate x NCCL's PCI_BW efficiency (12 GB/s for Gen3 x16, src/graph/topo.h); measured on H100/H200 hosts: README";

/// A GPU's host link at its best (maximum generation and width).
pub fn host(gpu: &Gpu) -> Option<Reference> {
    let p = gpu.health.pcie?;
    pcie(p.max_gen, p.max_width)
}

/// Classes measured on real hosts by `scripts/device/gpu_measure_links.sh` (toporun and
/// PyTorch in one run): preferred to the model where one exists.
const MEASURED: &[(&str, f64, &str)] = &[(
    "PCIe Gen5 x16",
    55.0,
    "measured: 1x H100 80GB HBM3 55.0/55.0 and 1x H200 55.1/55.2 GB/s, pinned host->device/device->host, median of 5 runs, toporun and PyTorch within 0.4% (tests/fixtures/device/measure-h100, measure-h200)",
)];

fn pcie(gen: u32, width: u32) -> Option<Reference> {
    let lane = lane_raw_gbps(gen)?;
    if width == 0 {
        return None;
    }
    let class = format!("PCIe Gen{gen} x{width}");
    if let Some((_, gbps, source)) = MEASURED.iter().find(|(c, _, _)| *c == class) {
        return Some(Reference {
            gbps: *gbps,
            class,
            source,
        });
    }
    Some(Reference {
        gbps: lane * width as f64 * PCIE_EFFICIENCY,
        class,
        source: PCIE_SOURCE,
    })
}

/// What a copy between two GPUs with this link should reach. None where no class
/// figure applies (the path crosses the CPU, or nothing is known of the GPUs).
pub fn pair(a: &Gpu, b: &Gpu, link: LinkKind) -> Option<Reference> {
    match link {
        LinkKind::NvLink(n) => {
            let (per, arch) = nvlink_per_link(&a.name)?;
            Some(Reference {
                gbps: per * n as f64,
                class: format!("NV{n} ({arch})"),
                source: NCCL_TOPO_H,
            })
        }
        // P2P under PCIe switches: the slower of the two GPUs' links bounds it.
        LinkKind::Pix | LinkKind::Pxb => {
            let slower = |p: PcieLink| (p.max_gen, p.max_width);
            let (ga, wa) = slower(a.health.pcie?);
            let (gb, wb) = slower(b.health.pcie?);
            let mut r = pcie(ga.min(gb), wa.min(wb))?;
            r.class = format!("{link} ({})", r.class);
            Some(r)
        }
        _ => None,
    }
}

/// The slowest link between any two of `gpus` (indices into the facts), named with
/// the pair: what bounds a collective among them. None for fewer than two GPUs or
/// where a pair has no class figure (its path crosses the CPU).
pub fn slowest_pair(facts: &GpuFacts, gpus: &[usize]) -> Option<(Reference, usize, usize)> {
    let mut slowest: Option<(Reference, usize, usize)> = None;
    for (i, &a) in gpus.iter().enumerate() {
        for &b in &gpus[i + 1..] {
            let (ga, gb) = (facts.devices.get(a)?, facts.devices.get(b)?);
            let r = pair(ga, gb, facts.link(a, b)?)?;
            if slowest.as_ref().is_none_or(|s| r.gbps < s.0.gbps) {
                slowest = Some((r, a, b));
            }
        }
    }
    slowest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str, gen: u32, width: u32) -> Gpu {
        let mut g = Gpu {
            name: name.into(),
            ..Default::default()
        };
        g.health.pcie = Some(PcieLink {
            gen: 1,
            max_gen: gen,
            width,
            max_width: width,
        });
        g
    }

    #[test]
    fn nvlink_class_is_links_times_nccls_per_link_model() {
        let h = gpu("NVIDIA H200", 5, 16);
        let r = pair(&h, &h, LinkKind::NvLink(18)).unwrap();
        assert!((r.gbps - 370.8).abs() < 0.01, "{r:?}");
        assert_eq!(r.class, "NV18 (Hopper)");
        let a = gpu("NVIDIA A100-SXM4-40GB", 4, 16);
        assert_eq!(pair(&a, &a, LinkKind::NvLink(12)).unwrap().gbps, 240.0);
        assert!(pair(&gpu("Mystery GPU", 4, 16), &h, LinkKind::NvLink(4)).is_none());
    }

    #[test]
    fn pcie_class_follows_generation_and_width() {
        let g5 = host(&gpu("NVIDIA H100 PCIe", 5, 16)).unwrap();
        assert_eq!(g5.gbps, 55.0, "measured on the H100 host");
        assert!(g5.source.starts_with("measured"));
        let g5x8 = host(&gpu("NVIDIA H100 PCIe", 5, 8)).unwrap();
        assert!((g5x8.gbps - 24.0).abs() < 0.1, "{g5x8:?}");
        let g4x8 = host(&gpu("x", 4, 8)).unwrap();
        assert!((g4x8.gbps - 12.0).abs() < 0.1, "{g4x8:?}");
        let (a, b) = (gpu("L40S", 4, 16), gpu("L40S", 4, 8));
        let r = pair(&a, &b, LinkKind::Pix).unwrap();
        assert_eq!(r.class, "PIX (PCIe Gen4 x8)");
        assert!(pair(&a, &b, LinkKind::Sys).is_none());
    }

    #[test]
    fn the_slowest_pair_bounds_the_group() {
        let mut f = GpuFacts {
            devices: (0..3)
                .map(|_| gpu("NVIDIA H100 80GB HBM3", 5, 16))
                .collect(),
            ..Default::default()
        };
        let nv = |n| LinkKind::NvLink(n);
        f.links = vec![
            vec![LinkKind::Own, nv(18), nv(18)],
            vec![nv(18), LinkKind::Own, nv(6)],
            vec![nv(18), nv(6), LinkKind::Own],
        ];
        let (r, a, b) = slowest_pair(&f, &[0, 1, 2]).unwrap();
        assert_eq!((r.class.as_str(), a, b), ("NV6 (Hopper)", 1, 2));
        assert_eq!(slowest_pair(&f, &[0, 1]).unwrap().0.class, "NV18 (Hopper)");
        assert_eq!(slowest_pair(&f, &[0]), None, "one GPU");
        f.links[0][2] = LinkKind::Sys;
        assert_eq!(slowest_pair(&f, &[0, 2]), None, "through the CPU");
    }
}
