//! What an Xid (the NVIDIA driver's GPU error code, delivered by NVML's critical-error
//! events) means for a job: the training code's own fault, or the GPU's and node's.
//! Source: NVIDIA's Xid catalog for Ampere and newer GPUs
//! (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: mnemonic,
//! description and resolution bucket of each Xid); an Xid not listed is neither.

use serde::Serialize;

/// Whose fault an Xid is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// The application's (an illegal address, a kernel fault): restart the app.
    Code,
    /// The GPU's or the node's: drain the node, reset or service the GPU.
    Hardware,
    /// Neither known: reported, judged by the rest of the evidence.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct XidInfo {
    pub xid: u64,
    pub meaning: &'static str,
    pub verdict: Verdict,
}

const TABLE: &[(u64, &str, Verdict)] = &[
    (
        13,
        "graphics engine exception (an illegal instruction or address in a kernel)",
        Verdict::Code,
    ),
    (
        31,
        "GPU memory page fault (a kernel read or wrote an illegal address)",
        Verdict::Code,
    ),
    (
        43,
        "GPU stopped processing the application's channel (a fault in its kernel)",
        Verdict::Code,
    ),
    (
        48,
        "double-bit (uncorrectable) ECC error",
        Verdict::Hardware,
    ),
    (
        63,
        "ECC page retirement or row remapping recorded",
        Verdict::Hardware,
    ),
    (
        64,
        "ECC page retirement or row remapping failed",
        Verdict::Hardware,
    ),
    (74, "NVLink error", Verdict::Hardware),
    (79, "GPU has fallen off the bus", Verdict::Hardware),
    (92, "high single-bit ECC error rate", Verdict::Hardware),
    (94, "contained uncorrectable ECC error", Verdict::Hardware),
    (95, "uncontained uncorrectable ECC error", Verdict::Hardware),
    (
        119,
        "GSP RPC timeout (the GPU's system processor stopped answering)",
        Verdict::Hardware,
    ),
    (120, "GSP error", Verdict::Hardware),
    (140, "unrecovered ECC error", Verdict::Hardware),
    (144, "NVLink SAW error", Verdict::Hardware),
    (145, "NVLink RLW error", Verdict::Hardware),
    (146, "NVLink TLW error", Verdict::Hardware),
    (147, "NVLink TREX error", Verdict::Hardware),
    (148, "NVLink NVLPW control error", Verdict::Hardware),
    (149, "NVLink NETIR error", Verdict::Hardware),
    (150, "NVLink MSE error", Verdict::Hardware),
];

pub fn info(xid: u64) -> XidInfo {
    TABLE
        .iter()
        .find(|(x, ..)| *x == xid)
        .map(|&(xid, meaning, verdict)| XidInfo {
            xid,
            meaning,
            verdict,
        })
        .unwrap_or(XidInfo {
            xid,
            meaning: "not in toporun's table (see NVIDIA's Xid catalog)",
            verdict: Verdict::Unknown,
        })
}

/// The fix for a node-fatal Xid.
pub const FIX: &str = "drain the node (kubectl drain) and have the GPU reset or serviced; restarting the job on this node will fail again";

/// One Xid event, as a judgement needs it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct XidEvent {
    /// The GPU's NVML index, UUID and PCI bus id.
    pub gpu: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub xid: u64,
    /// Seconds since the Unix epoch.
    pub at: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_faults_and_the_node_faults_of_the_catalog() {
        for x in [13, 31, 43] {
            assert_eq!(info(x).verdict, Verdict::Code, "{x}");
        }
        for x in [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 144, 150] {
            assert_eq!(info(x).verdict, Verdict::Hardware, "{x}");
        }
        assert_eq!(info(999).verdict, Verdict::Unknown);
        assert_eq!(info(79).meaning, "GPU has fallen off the bus");
    }
}
