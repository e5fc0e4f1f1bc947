//! `efa.devices`: EFA / InfiniBand / RoCE devices usable from the container.

use super::options::{PreflightOptions, Requirement};
use crate::facts::{HostFacts, RdmaKind};
use crate::finding::FindingId;
use crate::finding::{Finding, Severity};

pub fn check(facts: &HostFacts, opts: &PreflightOptions) -> Option<Finding> {
    let efa: Vec<_> = facts.efa_devices().collect();
    let gpus = facts.gpus.count();
    let f = |sev, s: String| {
        Finding::new(FindingId::EfaDevices, sev, s)
            .fact("efa", efa.len())
            .fact("rdma", facts.rdma.len())
            .fact("gpus", gpus)
    };
    if facts.rdma.is_empty() {
        return if opts.requires(Requirement::Efa) || opts.requires(Requirement::Rdma) {
            Some(f(Severity::Error, "no RDMA device (EFA/InfiniBand/RoCE) visible: NCCL will use TCP sockets between nodes".into())
                .remedy("request the devices: resources.limits: {vpc.amazonaws.com/efa: 4} (EFA) or rdma/<resource> with the RDMA device plugin / Multus SR-IOV"))
        } else {
            None
        };
    }
    if opts.requires(Requirement::Efa) && efa.is_empty() {
        return Some(f(
            Severity::Error,
            "EFA required but only non-EFA RDMA devices are visible".into(),
        ));
    }
    let no_uverbs: Vec<&str> = facts
        .rdma
        .iter()
        .filter(|d| d.uverbs.is_none() || !d.uverbs_openable)
        .map(|d| d.name.as_str())
        .collect();
    if !no_uverbs.is_empty() {
        return Some(f(Severity::Error, format!("RDMA device(s) without a usable /dev/infiniband/uverbs node: {}", no_uverbs.join(", ")))
            .remedy("the device plugin must mount /dev/infiniband/uverbsN into the container (vpc.amazonaws.com/efa or the RDMA shared device plugin)"));
    }
    let inactive: Vec<&str> = facts
        .rdma
        .iter()
        .filter(|d| !d.is_active() && !d.ports.is_empty())
        .map(|d| d.name.as_str())
        .collect();
    if !inactive.is_empty() {
        return Some(f(
            Severity::Warning,
            format!("RDMA port(s) not ACTIVE: {}", inactive.join(", ")),
        ));
    }
    if !efa.is_empty() {
        if facts.platform.ofi_nccl_plugins.is_empty() {
            return Some(f(Severity::Warning, format!("{} EFA device(s) but no aws-ofi-nccl plugin found: NCCL will not use EFA and falls back to TCP sockets", efa.len()))
                .remedy("use an image with aws-ofi-nccl (AWS Deep Learning Containers ship it under /opt/amazon/ofi-nccl) and put its lib directory on LD_LIBRARY_PATH"));
        }
        return Some(f(
            Severity::Ok,
            format!(
                "{} EFA device(s) for {gpus} GPU(s), aws-ofi-nccl present",
                efa.len()
            ),
        ));
    }
    let kinds: Vec<String> = facts
        .rdma
        .iter()
        .map(|d| {
            format!(
                "{} ({})",
                d.name,
                if d.kind == RdmaKind::Roce {
                    "RoCE"
                } else {
                    "InfiniBand"
                }
            )
        })
        .collect();
    Some(f(
        Severity::Ok,
        format!("RDMA devices: {}", kinds.join(", ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{RdmaDevice, RdmaPort};
    use crate::preflight::testutil::healthy;

    fn efa(n: usize) -> Vec<RdmaDevice> {
        (0..n)
            .map(|i| RdmaDevice {
                name: format!("rdmap{i}s0"),
                kind: RdmaKind::Efa,
                uverbs: Some(format!("/dev/infiniband/uverbs{i}")),
                uverbs_openable: true,
                ports: vec![RdmaPort {
                    port: 1,
                    state: "ACTIVE".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn efa_with_nodes_and_plugin_is_ok() {
        let mut f = healthy();
        f.rdma = efa(4);
        f.platform.product_name = Some("p4d.24xlarge".into());
        f.platform.ofi_nccl_plugins = vec!["/opt/amazon/ofi-nccl/lib/libnccl-net.so".into()];
        assert_eq!(
            check(&f, &PreflightOptions::default()).unwrap().severity,
            Severity::Ok
        );
    }

    #[test]
    fn missing_uverbs_is_an_error() {
        let mut f = healthy();
        f.rdma = efa(2);
        f.rdma[1].uverbs = None;
        assert_eq!(
            check(&f, &PreflightOptions::default()).unwrap().severity,
            Severity::Error
        );
    }

    #[test]
    fn required_but_absent() {
        let opts = PreflightOptions {
            require: vec![Requirement::Efa],
            ..Default::default()
        };
        assert_eq!(check(&healthy(), &opts).unwrap().severity, Severity::Error);
        assert!(check(&healthy(), &PreflightOptions::default()).is_none());
    }
}
