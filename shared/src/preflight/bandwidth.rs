//! `gpu.bandwidth` and `gpu.host_bandwidth`: the links as measured by `--measure`,
//! each against its class (`link_reference`), with the cause a slow one suggests.

use crate::facts::{Gpu, HostFacts, LinkBandwidth, PairCopy};
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};
use crate::link_reference::{self, Reference, SLOW_FRACTION};

pub fn check(facts: &HostFacts) -> Vec<Finding> {
    let Some(m) = &facts.bandwidth else {
        return Vec::new();
    };
    if m.pairs.is_empty() && m.host.is_empty() {
        return vec![Finding::new(
            FindingId::GpuBandwidth,
            Severity::Info,
            format!(
                "links not measured: {}",
                m.error.as_deref().unwrap_or("no GPU")
            ),
        )];
    }
    let mut out = Vec::new();
    if !m.pairs.is_empty() {
        out.push(pairs(facts, m));
    }
    if !m.host.is_empty() {
        out.push(host(facts, m));
    }
    if let Some(e) = &m.error {
        out.push(Finding::new(
            FindingId::GpuBandwidth,
            Severity::Warning,
            format!("measurement stopped early: {e}"),
        ));
    }
    out
}

fn gpu(facts: &HostFacts, i: u32) -> Option<&Gpu> {
    facts.gpus.devices.iter().find(|d| d.index == i)
}

fn timing(m: &LinkBandwidth) -> String {
    let host = match m.host_buffer_bytes {
        0 => String::new(),
        b if b == m.buffer_bytes => String::new(),
        b => format!(" ({} MiB with host memory)", b >> 20),
    };
    format!(
        "{:.2} s with CUDA initialisation ({:.2} s), {} MiB copies{host}",
        m.seconds,
        m.init_seconds,
        m.buffer_bytes >> 20
    )
}

fn pairs(facts: &HostFacts, m: &LinkBandwidth) -> Finding {
    let mut slow = Vec::new();
    let mut classes: Vec<String> = Vec::new();
    for c in &m.pairs {
        let (Some(a), Some(b)) = (gpu(facts, c.src), gpu(facts, c.dst)) else {
            continue;
        };
        let link = facts.gpus.link(c.src as usize, c.dst as usize);
        let reference = link.and_then(|l| link_reference::pair(a, b, l));
        if let Some(r) = &reference {
            if !classes.contains(&r.class) {
                classes.push(r.class.clone());
            }
        }
        let below = reference
            .as_ref()
            .is_some_and(|r| c.gbps < SLOW_FRACTION * r.gbps);
        let staged_nvlink = !c.peer_access && link.is_some_and(|l| l.is_nvlink());
        if below || staged_nvlink {
            slow.push(format!(
                "GPU{}->GPU{} {:.1} GB/s{}: {}",
                c.src,
                c.dst,
                c.gbps,
                reference
                    .as_ref()
                    .map(|r| format!(
                        " ({:.0}% of {}'s {:.0})",
                        100.0 * c.gbps / r.gbps,
                        r.class,
                        r.gbps
                    ))
                    .unwrap_or_default(),
                pair_cause(facts, a, b, c, reference.as_ref())
            ));
        }
    }
    let gbps: Vec<f64> = m.pairs.iter().map(|c| c.gbps).collect();
    let lo = gbps.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = gbps.iter().copied().fold(0.0, f64::max);
    let base = |sev, s: String| {
        Finding::new(FindingId::GpuBandwidth, sev, s)
            .fact("pairs", m.pairs.len())
            .fact("min_gbps", format!("{lo:.1}"))
            .fact("max_gbps", format!("{hi:.1}"))
            .fact(
                "reference",
                format!(
                    "{}; slow below {:.0}%",
                    if classes.is_empty() {
                        "none for these links".to_string()
                    } else {
                        classes.join(", ")
                    },
                    SLOW_FRACTION * 100.0
                ),
            )
    };
    if slow.is_empty() {
        return base(
            Severity::Ok,
            format!(
                "{} GPU-to-GPU copies measured: {lo:.1}-{hi:.1} GB/s, every one at its link's class ({})",
                m.pairs.len(),
                timing(m)
            ),
        );
    }
    base(
        Severity::Warning,
        format!(
            "{} of {} GPU-to-GPU copies below their link's class: {}",
            slow.len(),
            m.pairs.len(),
            slow.join("; ")
        ),
    )
    .remedy("collectives between these GPUs run at the slow figure; fix the cause named, or keep tensor-parallel groups off these pairs")
}

/// The likeliest reason a GPU pair copies slowly, from what else is known of it.
fn pair_cause(facts: &HostFacts, a: &Gpu, b: &Gpu, c: &PairCopy, r: Option<&Reference>) -> String {
    let link = facts.gpus.link(c.src as usize, c.dst as usize);
    if !c.peer_access {
        return format!(
            "no CUDA peer access between them (NVML P2P: {}), so copies are staged through host memory: P2P disabled by the driver or a VM without P2P",
            facts
                .gpus
                .p2p(c.src as usize, c.dst as usize)
                .map(|p| format!("read {:?}, write {:?}", p.read, p.write))
                .unwrap_or_else(|| "unknown".into())
        );
    }
    if link.is_some_and(|l| l.is_nvlink()) {
        let most = facts
            .gpus
            .devices
            .iter()
            .map(|d| d.nvlink.active_links)
            .max()
            .unwrap_or(0);
        for g in [a, b] {
            if g.nvlink.active_links < most {
                return format!(
                    "degraded NVLink: GPU{} has {} of {most} links up",
                    g.index, g.nvlink.active_links
                );
            }
        }
        return "NVLink slower than its class with every link up: link errors or retraining (nvidia-smi nvlink -e), or a GPU throttled".into();
    }
    if let Some(narrow) = [a, b].iter().find_map(|g| {
        let p = g.health.pcie?;
        (p.width < p.max_width).then(|| {
            format!(
                "GPU{}'s PCIe link trained at x{} of x{}",
                g.index, p.width, p.max_width
            )
        })
    }) {
        return narrow;
    }
    if r.is_some() {
        return "P2P under a PCIe switch slower than the link: ACS or the IOMMU redirects it through the root complex (disable ACS on the switch ports, or boot with iommu=pt)".into();
    }
    "the path crosses the CPU".into()
}

fn host(facts: &HostFacts, m: &LinkBandwidth) -> Finding {
    let mut slow = Vec::new();
    let mut figures = Vec::new();
    for h in &m.host {
        figures.push(format!("GPU{} {:.1}/{:.1}", h.gpu, h.h2d_gbps, h.d2h_gbps));
        let Some(g) = gpu(facts, h.gpu) else { continue };
        let Some(r) = link_reference::host(g) else {
            continue;
        };
        let worst = h.h2d_gbps.min(h.d2h_gbps);
        if worst < SLOW_FRACTION * r.gbps {
            let cause = g
                .health
                .pcie
                .filter(|p| p.width < p.max_width || p.gen < p.max_gen)
                .map(|p| format!("the link runs at Gen{} x{} of Gen{} x{} (NVML, read before the copies)", p.gen, p.width, p.max_gen, p.max_width))
                .unwrap_or_else(|| "the link trained below its speed under load, pinned memory on a remote NUMA node, or another process copying over the same link".into());
            slow.push(format!(
                "GPU{} {:.1} GB/s host->device, {:.1} device->host ({:.0}% of {}'s {:.0}): {cause}",
                h.gpu,
                h.h2d_gbps,
                h.d2h_gbps,
                100.0 * worst / r.gbps,
                r.class,
                r.gbps
            ));
        }
    }
    let f = |sev, s: String| {
        Finding::new(FindingId::GpuHostBandwidth, sev, s)
            .fact("gpus", m.host.len())
            .fact("h2d_d2h_gbps", figures.join(", "))
    };
    if slow.is_empty() {
        return f(
            Severity::Ok,
            format!(
                "host<->GPU copies from pinned memory near each GPU: {} GB/s (host->device/device->host)",
                figures.join(", ")
            ),
        );
    }
    f(
        Severity::Warning,
        format!("host<->GPU copies below their PCIe link's class: {}", slow.join("; ")),
    )
    .remedy("data loading and CPU offload run at the slow figure: check nvidia-smi -q -d PCI under load (lspci -vv: LnkSta vs LnkCap); reseat or report the GPU if its link trains low")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{HostCopy, P2pPair, P2pState, PcieLink};
    use crate::preflight::testutil::healthy;

    fn measured(pair_gbps: f64, peer: bool) -> HostFacts {
        let mut f = healthy();
        for d in &mut f.gpus.devices {
            d.name = "NVIDIA H200".into();
            d.nvlink.active_links = 18;
            d.health.pcie = Some(PcieLink {
                gen: 5,
                max_gen: 5,
                width: 16,
                max_width: 16,
            });
        }
        let mut m = LinkBandwidth {
            buffer_bytes: 64 << 20,
            seconds: 0.9,
            init_seconds: 0.6,
            ..Default::default()
        };
        for a in 0..4 {
            for b in 0..4 {
                if a != b {
                    m.pairs.push(PairCopy {
                        src: a,
                        dst: b,
                        gbps: if (a, b) == (0, 1) { pair_gbps } else { 380.0 },
                        peer_access: peer || (a, b) != (0, 1),
                    });
                }
            }
            m.host.push(HostCopy {
                gpu: a,
                h2d_gbps: 55.0,
                d2h_gbps: 55.0,
                cpus: String::new(),
            });
        }
        f.bandwidth = Some(m);
        f
    }

    fn by_id(f: &HostFacts, id: &str) -> Finding {
        check(f).into_iter().find(|x| x.id == id).unwrap()
    }

    #[test]
    fn links_at_their_class_are_ok() {
        let f = measured(375.0, true);
        let x = by_id(&f, "gpu.bandwidth");
        assert_eq!(x.severity, Severity::Ok, "{x:?}");
        assert!(x.facts["reference"].contains("NV18 (Hopper)"));
        assert_eq!(by_id(&f, "gpu.host_bandwidth").severity, Severity::Ok);
    }

    #[test]
    fn the_host_copies_size_is_said_where_it_differs() {
        let mut f = measured(375.0, true);
        let said = |f: &HostFacts| by_id(f, "gpu.bandwidth").summary;
        assert!(said(&f).ends_with("64 MiB copies)"), "{}", said(&f));
        f.bandwidth.as_mut().unwrap().host_buffer_bytes = 16 << 20;
        assert!(
            said(&f).ends_with("64 MiB copies (16 MiB with host memory))"),
            "{}",
            said(&f)
        );
    }

    #[test]
    fn a_slow_nvlink_pair_names_a_degraded_link() {
        let mut f = measured(200.0, true);
        f.gpus.devices[1].nvlink.active_links = 12;
        let x = by_id(&f, "gpu.bandwidth");
        assert_eq!(x.severity, Severity::Warning);
        assert!(
            x.summary
                .contains("GPU0->GPU1 200.0 GB/s (54% of NV18 (Hopper)'s 371)"),
            "{}",
            x.summary
        );
        assert!(
            x.summary.contains("GPU1 has 12 of 18 links up"),
            "{}",
            x.summary
        );
    }

    #[test]
    fn no_peer_access_on_nvlink_is_staged_through_host() {
        let mut f = measured(20.0, false);
        f.gpus.p2p = vec![P2pPair {
            a: 0,
            b: 1,
            read: P2pState::NotSupported,
            write: P2pState::NotSupported,
        }];
        let x = by_id(&f, "gpu.bandwidth");
        assert!(
            x.summary.contains("staged through host memory"),
            "{}",
            x.summary
        );
        assert!(x.summary.contains("NotSupported"), "{}", x.summary);
    }

    #[test]
    fn a_slow_host_link_names_the_narrow_width() {
        let mut f = measured(380.0, true);
        f.gpus.devices[2].health.pcie = Some(PcieLink {
            gen: 5,
            max_gen: 5,
            width: 8,
            max_width: 16,
        });
        f.bandwidth.as_mut().unwrap().host[2].h2d_gbps = 26.0;
        let x = by_id(&f, "gpu.host_bandwidth");
        assert_eq!(x.severity, Severity::Warning);
        assert!(
            x.summary.contains("GPU2 26.0 GB/s host->device"),
            "{}",
            x.summary
        );
        assert!(x.summary.contains("Gen5 x8 of Gen5 x16"), "{}", x.summary);
    }

    #[test]
    fn without_a_driver_it_says_so_and_nothing_else() {
        let mut f = healthy();
        f.bandwidth = Some(LinkBandwidth {
            error: Some("no CUDA driver".into()),
            ..Default::default()
        });
        let all = check(&f);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].severity, Severity::Info);
        assert!(all[0].summary.contains("no CUDA driver"));
        assert!(check(&healthy()).is_empty());
    }
}
