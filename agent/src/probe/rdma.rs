//! RDMA devices from /sys/class/infiniband: EFA, InfiniBand, RoCE.

use crate::paths::{self, Root};
use toporun_shared::facts::{RdmaDevice, RdmaKind, RdmaPort};

const EFA_VENDOR: &str = "0x1d0f";

pub fn probe(root: &Root) -> Vec<RdmaDevice> {
    root.list(paths::SYS_CLASS_INFINIBAND)
        .into_iter()
        .map(|name| {
            let dir = format!("{}/{name}", paths::SYS_CLASS_INFINIBAND);
            let vendor = root.read(format!("{dir}/device/vendor"));
            let ports: Vec<RdmaPort> = root
                .list(format!("{dir}/ports"))
                .into_iter()
                .filter_map(|p| {
                    let pdir = format!("{dir}/ports/{p}");
                    let gid_types = format!("{pdir}/gid_attrs/types");
                    let roce_v2 = root
                        .list(&gid_types)
                        .into_iter()
                        .filter(|i| {
                            root.read(format!("{gid_types}/{i}"))
                                .is_some_and(|t| t.eq_ignore_ascii_case("RoCE v2"))
                        })
                        .filter_map(|i| i.parse().ok())
                        .collect();
                    Some(RdmaPort {
                        port: p.parse().ok()?,
                        // "4: ACTIVE" -> "ACTIVE"
                        state: root
                            .read(format!("{pdir}/state"))
                            .map(|s| s.rsplit(' ').next().unwrap_or_default().to_string())
                            .unwrap_or_default(),
                        link_layer: root.read(format!("{pdir}/link_layer")).unwrap_or_default(),
                        roce_v2_gid_indices: roce_v2,
                    })
                })
                .collect();
            let kind = if vendor.as_deref() == Some(EFA_VENDOR) {
                RdmaKind::Efa
            } else if ports
                .iter()
                .any(|p| p.link_layer.eq_ignore_ascii_case("Ethernet"))
            {
                RdmaKind::Roce
            } else if ports
                .iter()
                .any(|p| p.link_layer.eq_ignore_ascii_case("InfiniBand"))
            {
                RdmaKind::Infiniband
            } else {
                RdmaKind::Unknown
            };
            let uverbs = root
                .list(format!("{dir}/device/infiniband_verbs"))
                .into_iter()
                .next()
                .map(|u| format!("/{}/{u}", paths::DEV_INFINIBAND));
            let uverbs_openable = uverbs.as_ref().is_some_and(|u| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(root.join(u.trim_start_matches('/')))
                    .is_ok()
            });
            RdmaDevice {
                pci_device: root.read(format!("{dir}/device/device")),
                pci_vendor: vendor,
                name,
                kind,
                ports,
                uverbs,
                uverbs_openable,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn efa_and_roce_from_a_fake_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let ib = dir.path().join("sys/class/infiniband");
        let efa = ib.join("rdmap16s27");
        fs::create_dir_all(efa.join("device/infiniband_verbs/uverbs0")).unwrap();
        fs::create_dir_all(efa.join("ports/1")).unwrap();
        fs::write(efa.join("device/vendor"), "0x1d0f\n").unwrap();
        fs::write(efa.join("device/device"), "0xefa1\n").unwrap();
        fs::write(efa.join("ports/1/state"), "4: ACTIVE\n").unwrap();
        fs::create_dir_all(dir.path().join("dev/infiniband")).unwrap();
        fs::write(dir.path().join("dev/infiniband/uverbs0"), "").unwrap();
        let mlx = ib.join("mlx5_0");
        fs::create_dir_all(mlx.join("ports/1/gid_attrs/types")).unwrap();
        fs::write(
            mlx.join("device/vendor")
                .parent()
                .map(|p| {
                    fs::create_dir_all(p).unwrap();
                    p.join("vendor")
                })
                .unwrap(),
            "0x15b3\n",
        )
        .unwrap();
        fs::write(mlx.join("ports/1/state"), "4: ACTIVE\n").unwrap();
        fs::write(mlx.join("ports/1/link_layer"), "Ethernet\n").unwrap();
        fs::write(mlx.join("ports/1/gid_attrs/types/0"), "IB/RoCE v1\n").unwrap();
        fs::write(mlx.join("ports/1/gid_attrs/types/3"), "RoCE v2\n").unwrap();
        let devs = probe(&Root::at(dir.path()));
        assert_eq!(devs.len(), 2);
        let mlx = &devs[0];
        assert_eq!(mlx.kind, RdmaKind::Roce);
        assert_eq!(mlx.ports[0].roce_v2_gid_indices, vec![3]);
        assert!(mlx.uverbs.is_none());
        let efa = &devs[1];
        assert_eq!(efa.kind, RdmaKind::Efa);
        assert_eq!(efa.uverbs.as_deref(), Some("/dev/infiniband/uverbs0"));
        assert!(efa.uverbs_openable);
        assert!(efa.is_active());
    }
}
