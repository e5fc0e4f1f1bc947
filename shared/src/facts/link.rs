//! How two GPUs are connected, in `nvidia-smi topo -m`'s legend.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// The connection between two GPUs, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// The GPU itself (`X`).
    Own,
    /// A bonded set of n NVLinks (`NV#`).
    NvLink(u32),
    /// At most one PCIe bridge.
    Pix,
    /// Several PCIe bridges, no host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Between host bridges within one NUMA node.
    Node,
    /// Across the inter-socket link (old captures say `SOC`).
    Sys,
}

impl LinkKind {
    /// Every GPU of `n` reaching every other by `kind` (an NVSwitch node): test hosts.
    #[cfg(test)]
    pub fn mesh(n: usize, kind: LinkKind) -> Vec<Vec<LinkKind>> {
        (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| if i == j { LinkKind::Own } else { kind })
                    .collect()
            })
            .collect()
    }

    pub fn is_nvlink(self) -> bool {
        matches!(self, LinkKind::NvLink(_))
    }

    /// Whether NCCL's default P2P level (PXB) lets P2P take this path.
    pub fn p2p_by_default(self) -> bool {
        matches!(
            self,
            LinkKind::Own | LinkKind::NvLink(_) | LinkKind::Pix | LinkKind::Pxb
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU link code {0:?} (expected X, NV<n>, PIX, PXB, PHB, NODE, SYS)")]
pub struct LinkParseError(pub String);

impl FromStr for LinkKind {
    type Err = LinkParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let code = s.trim();
        Ok(match code.to_ascii_uppercase().as_str() {
            "X" => LinkKind::Own,
            "PIX" => LinkKind::Pix,
            "PXB" => LinkKind::Pxb,
            "PHB" => LinkKind::Phb,
            "NODE" => LinkKind::Node,
            "SYS" | "SOC" => LinkKind::Sys,
            upper => match upper.strip_prefix("NV").map(str::parse::<u32>) {
                Some(Ok(n)) if n > 0 => LinkKind::NvLink(n),
                _ => return Err(LinkParseError(code.to_string())),
            },
        })
    }
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkKind::Own => f.write_str("X"),
            LinkKind::NvLink(n) => write!(f, "NV{n}"),
            LinkKind::Pix => f.write_str("PIX"),
            LinkKind::Pxb => f.write_str("PXB"),
            LinkKind::Phb => f.write_str("PHB"),
            LinkKind::Node => f.write_str("NODE"),
            LinkKind::Sys => f.write_str("SYS"),
        }
    }
}

impl Serialize for LinkKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LinkKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_legend_code_and_prints_it_back() {
        for code in ["X", "NV18", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"] {
            assert_eq!(code.parse::<LinkKind>().unwrap().to_string(), code);
        }
    }

    #[test]
    fn old_soc_reads_as_sys() {
        assert_eq!("SOC".parse::<LinkKind>().unwrap(), LinkKind::Sys);
    }

    #[test]
    fn rejects_unknown_codes() {
        assert!("NV".parse::<LinkKind>().is_err());
        assert!("NV0".parse::<LinkKind>().is_err());
        assert!("FOO".parse::<LinkKind>().is_err());
    }

    #[test]
    fn default_p2p_stops_at_host_bridge() {
        assert!(LinkKind::Pxb.p2p_by_default());
        assert!(!LinkKind::Phb.p2p_by_default());
        assert!(!LinkKind::Node.p2p_by_default());
    }
}
