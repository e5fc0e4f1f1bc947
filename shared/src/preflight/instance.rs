//! `instance.devices`: what this machine should have (its instance type, from the
//! cloud's metadata service or the DMI product name) against what the container sees.
//! Silent off-cloud and for instance types without GPUs in the table.

use crate::facts::{HostFacts, RdmaKind};
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};
use crate::instance_types::{self, InstanceType, Rdma};

/// The instance type and where it was read. The metadata service first; on AWS the
/// DMI product name is the instance type too (GCP's and Azure's are generic).
pub fn instance_type(facts: &HostFacts) -> Option<(String, String)> {
    if let Some(c) = &facts.cloud {
        return Some((c.instance_type.clone(), c.source.clone()));
    }
    let dmi = facts.platform.product_name.as_deref()?.trim();
    instance_types::lookup(dmi).map(|_| (dmi.to_string(), "DMI product name".to_string()))
}

pub fn check(facts: &HostFacts) -> Option<Finding> {
    let (name, from) = instance_type(facts)?;
    let f = |sev, s: String| {
        Finding::new(FindingId::InstanceDevices, sev, s)
            .fact("instance_type", &name)
            .fact("from", &from)
    };
    let Some(t) = instance_types::lookup(&name) else {
        return Some(f(
            Severity::Info,
            format!("instance {name} ({from}): not in toporun's table of GPU instance types, nothing to compare"),
        ));
    };
    let f = |sev, s: String| f(sev, s).fact("source", t.source);
    if let Some(c) = facts.cloud.as_ref() {
        if let Some(dmi) = facts.platform.product_name.as_deref().map(str::trim) {
            if instance_types::lookup(dmi).is_some() && !dmi.eq_ignore_ascii_case(&c.instance_type)
            {
                return Some(
                    f(
                        Severity::Warning,
                        format!(
                            "the metadata service says {}, the DMI product name says {dmi}",
                            c.instance_type
                        ),
                    )
                    .remedy("a facts file or image from another machine? probe again on this node"),
                );
            }
        }
    }
    let gpus = facts.gpus.count() as u32;
    if gpus == 0 {
        return Some(f(Severity::Warning, format!("{name}: {} {} GPUs expected, none visible in this container", t.gpus, t.gpu_model))
            .remedy(format!("request them: resources.limits: {{nvidia.com/gpu: {}}}, with the NVIDIA runtime (runtimeClassName: nvidia)", t.gpus)));
    }
    let named: Vec<&str> = facts.gpus.devices.iter().map(|d| d.name.as_str()).collect();
    if !named.is_empty() && !named.iter().all(|n| n.contains(t.gpu_model)) {
        return Some(f(Severity::Warning, format!("{name} has {} GPUs, NVML names {}", t.gpu_model, named[0]))
            .remedy("the instance type and the GPUs disagree: check the node's labels and the metadata endpoint"));
    }
    let share = format!(
        "{gpus} of its {} {} GPUs{}",
        t.gpus,
        t.gpu_model,
        if t.nvlink { " (NVLink)" } else { "" }
    );
    if let Some(problem) = rdma_missing(facts, t, gpus) {
        // NVLink instances are built for multi-node training, their NICs are its
        // fabric; on the others (g5, g6, g6e) EFA is an option many jobs never use.
        let sev = if t.nvlink {
            Severity::Warning
        } else {
            Severity::Info
        };
        return Some(problem(f(sev, String::new()), &name));
    }
    Some(f(
        if gpus < t.gpus {
            Severity::Info
        } else {
            Severity::Ok
        },
        format!(
            "{name} ({from}): this container sees {share}{}",
            rdma_seen(facts, t)
        ),
    ))
}

type Amend = Box<dyn FnOnce(Finding, &str) -> Finding>;

/// The instance's RDMA NICs that should be visible for this pod's share of the GPUs
/// and are not: a finding to fill in.
fn rdma_missing(facts: &HostFacts, t: &InstanceType, gpus: u32) -> Option<Amend> {
    // A pod with part of the GPUs is expected to hold the same part of the NICs.
    let part = |n: u32| (n * gpus.min(t.gpus)).div_ceil(t.gpus);
    let count = |k: RdmaKind| facts.rdma.iter().filter(|d| d.kind == k).count() as u32;
    let (want, seen, what, remedy) = match t.rdma {
        Rdma::Efa(n) => (
            part(n),
            count(RdmaKind::Efa),
            "EFA devices",
            format!("request vpc.amazonaws.com/efa: {} in the pod (resources.limits), with the EFA device plugin on the node", part(n)),
        ),
        Rdma::InfiniBand(n) => (
            part(n),
            count(RdmaKind::Infiniband),
            "InfiniBand HCAs",
            "give the pod the HCAs: the RDMA shared device plugin's resource (rdma/ib) or the Network Operator's, and IPC_LOCK".to_string(),
        ),
        Rdma::Roce(n) => (
            part(n),
            count(RdmaKind::Roce),
            "RDMA NICs (RoCE)",
            "attach the RDMA network to the pod (GKE: networking.gke.io/interfaces with the RDMA network, and the RDMA device plugin)".to_string(),
        ),
        Rdma::GpuDirectTcp(_) | Rdma::None => return None,
    };
    if seen >= want {
        return None;
    }
    Some(Box::new(move |f: Finding, name: &str| {
        let mut f = f
            .fact("expected", want)
            .fact("visible", seen)
            .remedy(remedy);
        f.summary = format!("{name}: {want} {what} expected, {seen} visible in this container: NCCL falls back to TCP sockets between nodes");
        f
    }))
}

fn rdma_seen(facts: &HostFacts, t: &InstanceType) -> String {
    match t.rdma {
        Rdma::Efa(_) => format!(" and {} EFA device(s)", facts.efa_devices().count()),
        Rdma::InfiniBand(_) | Rdma::Roce(_) => format!(" and {} RDMA device(s)", facts.rdma.len()),
        Rdma::GpuDirectTcp(n) => {
            format!("; its {n} GPUDirect-TCPX NICs need GKE's multi-network setup (not checked)")
        }
        Rdma::None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{CloudInstance, RdmaDevice};
    use crate::preflight::testutil::healthy;

    fn on(name: &str, gpus: usize, gpu_name: &str) -> HostFacts {
        let mut f = healthy();
        f.gpus.devices.truncate(gpus);
        for d in &mut f.gpus.devices {
            d.name = gpu_name.into();
        }
        f.gpus.links = vec![vec![]; gpus];
        f.cloud = Some(CloudInstance {
            provider: "aws".into(),
            instance_type: name.into(),
            source: "AWS IMDSv2".into(),
            millis: 3,
        });
        f
    }

    fn devices(kind: RdmaKind, n: usize) -> Vec<RdmaDevice> {
        (0..n)
            .map(|i| RdmaDevice {
                name: format!("dev{i}"),
                kind,
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn missing_efa_says_how_many_to_request() {
        let f = on("p5.48xlarge", 4, "NVIDIA H100 80GB HBM3");
        let x = check(&f).unwrap();
        assert_eq!(x.severity, Severity::Warning);
        // 4 of 8 GPUs: half of the 32 EFA devices.
        assert!(
            x.summary
                .starts_with("p5.48xlarge: 16 EFA devices expected, 0 visible"),
            "{}",
            x.summary
        );
        assert!(x.remedy.unwrap().contains("vpc.amazonaws.com/efa: 16"));
    }

    #[test]
    fn a_full_view_is_ok_and_a_partial_one_info() {
        let mut f = on("p5.48xlarge", 4, "NVIDIA H100 80GB HBM3");
        f.rdma = devices(RdmaKind::Efa, 16);
        let x = check(&f).unwrap();
        assert_eq!(x.severity, Severity::Info, "{x:?}");
        assert!(
            x.summary
                .contains("4 of its 8 H100 GPUs (NVLink) and 16 EFA"),
            "{}",
            x.summary
        );
        let mut f = on("Standard_ND96isr_H100_v5", 4, "NVIDIA H100 80GB HBM3");
        f.rdma = devices(RdmaKind::Infiniband, 3);
        let x = check(&f).unwrap();
        assert!(
            x.summary.contains("4 InfiniBand HCAs expected, 3 visible"),
            "{}",
            x.summary
        );
    }

    #[test]
    fn the_dmi_name_serves_on_aws_and_off_cloud_says_nothing() {
        let mut f = healthy();
        assert!(check(&f).is_none());
        f.platform.product_name = Some("Standard PC (Q35 + ICH9, 2009)".into());
        assert!(check(&f).is_none());
        f.platform.product_name = Some("g6e.12xlarge".into());
        for d in &mut f.gpus.devices {
            d.name = "NVIDIA L40S".into();
        }
        let x = check(&f).unwrap();
        assert_eq!(x.facts["from"], "DMI product name");
        assert_eq!(x.severity, Severity::Info, "EFA is optional on g6e: {x:?}");
        assert!(
            x.summary.contains("1 EFA devices expected, 0 visible"),
            "{x:?}"
        );
        f.rdma = devices(RdmaKind::Efa, 1);
        assert_eq!(check(&f).unwrap().severity, Severity::Ok);
    }

    #[test]
    fn wrong_gpus_or_a_disagreeing_dmi_are_warnings() {
        let f = on("p4d.24xlarge", 4, "NVIDIA H100 80GB HBM3");
        assert!(check(&f)
            .unwrap()
            .summary
            .contains("has A100 GPUs, NVML names NVIDIA H100"));
        let mut f = on("p5.48xlarge", 4, "NVIDIA H100 80GB HBM3");
        f.platform.product_name = Some("p4d.24xlarge".into());
        assert!(check(&f)
            .unwrap()
            .summary
            .contains("DMI product name says p4d.24xlarge"));
    }
}
