//! RDMA: NCCL_IB_HCA as an exact list of active IB/RoCE devices, NCCL_IB_GID_INDEX for
//! RoCE v2 on NCCL < 2.21; EFA needs nothing current AWS guidance still requires.

use super::decision::Decision;
use crate::facts::{HostFacts, RdmaKind};
use crate::version::Version;

pub(crate) fn decide(facts: &HostFacts) -> Vec<Decision> {
    let mut out = Vec::new();
    if facts.efa_devices().next().is_some() {
        out.push(Decision::leave("FI_EFA_USE_DEVICE_RDMA", "libfabric >= 1.18 with aws-ofi-nccl >= 1.7 enables EFA RDMA by itself (AWS guidance); FI_PROVIDER=efa is likewise only for aws-ofi-nccl <= 1.5"));
    }
    let ib: Vec<_> = facts
        .rdma
        .iter()
        .filter(|d| matches!(d.kind, RdmaKind::Infiniband | RdmaKind::Roce))
        .collect();
    if ib.is_empty() {
        return out;
    }
    let active: Vec<&str> = ib
        .iter()
        .filter(|d| d.is_active())
        .map(|d| d.name.as_str())
        .collect();
    if active.is_empty() {
        out.push(Decision::leave(
            "NCCL_IB_HCA",
            "no IB/RoCE port is ACTIVE: nothing to select",
        ));
        return out;
    }
    out.push(Decision::set("NCCL_IB_HCA", format!("={}", active.join(",")), format!("the {} active IB/RoCE device(s); '=' matches exactly, so mlx5_1 cannot also catch mlx5_10", active.len())));
    let roce = ib
        .iter()
        .find(|d| d.kind == RdmaKind::Roce && d.is_active());
    if let Some(dev) = roce {
        let nccl = facts
            .platform
            .nccl_version
            .as_deref()
            .and_then(Version::parse);
        let gid = dev
            .ports
            .iter()
            .flat_map(|p| p.roce_v2_gid_indices.iter())
            .min();
        match (nccl, gid) {
            (Some(v), _) if v >= Version::new(2, 21, 0) => out.push(Decision::leave("NCCL_IB_GID_INDEX", format!("NCCL {v} picks the RoCE v2 GID itself (auto since 2.21)"))),
            (_, Some(idx)) => out.push(Decision::set("NCCL_IB_GID_INDEX", idx.to_string(), format!("RoCE v2 GID index of {} (NCCL older than 2.21 or unknown defaults to 0, RoCE v1)", dev.name))),
            (_, None) => out.push(Decision::leave("NCCL_IB_GID_INDEX", format!("{} shows no RoCE v2 GID", dev.name))),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{RdmaDevice, RdmaPort};

    fn dev(name: &str, kind: RdmaKind, active: bool, gids: Vec<u32>) -> RdmaDevice {
        RdmaDevice {
            name: name.into(),
            kind,
            ports: vec![RdmaPort {
                port: 1,
                state: if active { "ACTIVE" } else { "DOWN" }.into(),
                roce_v2_gid_indices: gids,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn exact_hca_list_and_gid_by_version() {
        let mut f = HostFacts {
            rdma: vec![
                dev("mlx5_0", RdmaKind::Roce, true, vec![3]),
                dev("mlx5_1", RdmaKind::Roce, false, vec![]),
                dev("mlx5_10", RdmaKind::Roce, true, vec![3]),
            ],
            ..Default::default()
        };
        let d = decide(&f);
        assert_eq!(d[0].value.as_deref(), Some("=mlx5_0,mlx5_10"));
        assert_eq!(d[1].value.as_deref(), Some("3"));
        f.platform.nccl_version = Some("2.28.9".into());
        assert_eq!(decide(&f)[1].value, None);
    }
}
