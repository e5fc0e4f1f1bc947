//! Platform: DMI identity (EC2 instance type), NCCL topology files, NCCL and its
//! network plugin on disk, /etc/nccl.conf.

use crate::paths::{self, Root};
use toporun_shared::facts::PlatformFacts;

pub fn probe(root: &Root) -> PlatformFacts {
    let mut topology_files = Vec::new();
    for dir in paths::TOPOLOGY_DIRS {
        for f in root.list(dir).into_iter().filter(|f| f.ends_with(".xml")) {
            topology_files.push(format!("/{dir}/{f}"));
        }
    }
    let mut ofi_nccl_plugins = Vec::new();
    let mut nccl_version = None;
    for dir in paths::LIB_DIRS {
        for f in root.list(dir) {
            if f.starts_with("libnccl-net") && f.contains(".so") {
                ofi_nccl_plugins.push(format!("/{dir}/{f}"));
            }
            // libnccl.so.2.28.9: the version is in the real file's name.
            if let Some(v) = f
                .strip_prefix("libnccl.so.")
                .filter(|v| v.matches('.').count() == 2)
            {
                nccl_version.get_or_insert_with(|| v.to_string());
            }
        }
    }
    let nccl_conf = root
        .read(paths::ETC_NCCL_CONF)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    PlatformFacts {
        product_name: root
            .read(format!("{}/product_name", paths::SYS_DMI_ID))
            .filter(|s| !s.is_empty()),
        sys_vendor: root
            .read(format!("{}/sys_vendor", paths::SYS_DMI_ID))
            .filter(|s| !s.is_empty()),
        topology_files,
        ofi_nccl_plugins,
        nccl_version,
        nccl_conf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn p4d_image_layout() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        fs::create_dir_all(p.join("sys/devices/virtual/dmi/id")).unwrap();
        fs::write(
            p.join("sys/devices/virtual/dmi/id/product_name"),
            "p4d.24xlarge\n",
        )
        .unwrap();
        fs::create_dir_all(p.join("opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml")).unwrap();
        fs::write(
            p.join("opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml"),
            "<system/>",
        )
        .unwrap();
        fs::create_dir_all(p.join("opt/amazon/ofi-nccl/lib")).unwrap();
        fs::write(p.join("opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"), "").unwrap();
        fs::create_dir_all(p.join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::write(p.join("usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5"), "").unwrap();
        fs::create_dir_all(p.join("etc")).unwrap();
        fs::write(p.join("etc/nccl.conf"), "# comment\nNCCL_DEBUG=WARN\n").unwrap();
        let f = probe(&Root::at(p));
        assert_eq!(f.product_name.as_deref(), Some("p4d.24xlarge"));
        assert_eq!(
            f.topology_files,
            vec!["/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml"]
        );
        assert_eq!(f.ofi_nccl_plugins.len(), 1);
        assert_eq!(f.nccl_version.as_deref(), Some("2.21.5"));
        assert_eq!(f.nccl_conf["NCCL_DEBUG"], "WARN");
    }
}
