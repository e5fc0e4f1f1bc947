//! NCCL_TOPO_FILE: the platform's topology XML where it exists on disk (aws-ofi-nccl
//! for p4d/p4de/g5.48xlarge, Azure ND v4/v5), otherwise NCCL's own detection.

use super::decision::Decision;
use crate::facts::HostFacts;

const NAME: &str = "NCCL_TOPO_FILE";

/// Instance type -> the XML file name aws-ofi-nccl ships for it.
const AWS: &[(&str, &str)] = &[
    ("p4d.24xlarge", "p4d-24xl-topo.xml"),
    ("p4de.24xlarge", "p4de-24xl-topo.xml"),
    ("g5.48xlarge", "g5.48xl-topo.xml"),
];
const AZURE: &[(&str, &str)] = &[
    ("ND96asr_v4", "ndv4-topo.xml"),
    ("ND96amsr_A100_v4", "ndv4-topo.xml"),
    ("ND96isr_H100_v5", "ndv5-topo.xml"),
    ("ND96isr_H200_v5", "ndv5-topo.xml"),
];

pub(crate) fn decide(facts: &HostFacts) -> Decision {
    let product = facts
        .platform
        .product_name
        .as_deref()
        .unwrap_or_default()
        .trim();
    let file_named = |name: &str| {
        facts
            .platform
            .topology_files
            .iter()
            .find(|f| f.ends_with(&format!("/{name}")))
            .cloned()
    };
    if let Some((ty, xml)) = AWS.iter().find(|(ty, _)| *ty == product) {
        return match file_named(xml) {
            Some(path) => Decision::set(NAME, path, format!("{ty}: aws-ofi-nccl's topology file for this instance type (the plugin sets the same path itself when it loads; explicit here so non-EFA runs get it too)")),
            None => Decision::leave(NAME, format!("{ty}, but {xml} is not on disk: NCCL detects the topology itself")),
        };
    }
    for (_, xml) in AZURE {
        if let Some(path) = file_named(xml) {
            return Decision::set(
                NAME,
                path,
                format!("Azure ND topology file {xml} is present"),
            );
        }
    }
    Decision::leave(
        NAME,
        if product.is_empty() {
            "no platform topology file applies: NCCL detects the topology itself".to_string()
        } else {
            format!("no topology file for {product}: NCCL detects the topology itself")
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p4d_file_when_present() {
        let mut f = HostFacts::default();
        f.platform.product_name = Some("p4d.24xlarge".into());
        assert_eq!(decide(&f).value, None);
        f.platform.topology_files =
            vec!["/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml".into()];
        assert_eq!(
            decide(&f).value.as_deref(),
            Some("/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml")
        );
        f.platform.product_name = Some("g6e.12xlarge".into());
        assert_eq!(decide(&f).value, None);
    }
}
