//! What a cloud GPU instance type has: its GPUs, whether they are NVLink-connected,
//! and its RDMA NICs, each row with the document it comes from. Preflight compares
//! the container's view with it: a pod that did not request the EFA devices or the
//! InfiniBand NICs sees none, and nothing else says so.

/// The kind of RDMA NIC an instance carries for GPU traffic between nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rdma {
    None,
    /// AWS Elastic Fabric Adapter (the `vpc.amazonaws.com/efa` resource).
    Efa(u32),
    /// InfiniBand HCAs (Azure ND: `rdma/ib` or the RDMA shared device plugin).
    InfiniBand(u32),
    /// RoCE NICs for GPUDirect RDMA (GCP a3-ultra and a4: RDMA network over CX-7).
    Roce(u32),
    /// Extra NICs for GPUDirect-TCPX/TCPXO (GCP a3-high/a3-mega): not RDMA devices.
    GpuDirectTcp(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceType {
    pub name: &'static str,
    pub provider: &'static str,
    pub gpus: u32,
    /// As in NVML's GPU name ("H100" is in "NVIDIA H100 80GB HBM3").
    pub gpu_model: &'static str,
    pub nvlink: bool,
    pub rdma: Rdma,
    pub source: &'static str,
}

const AWS_P: &str = "https://aws.amazon.com/ec2/instance-types/p5/ and /p4/, /p6/; EFA counts: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html";
const AWS_G: &str = "https://aws.amazon.com/ec2/instance-types/g5/, /g6/, /g6e/; EFA: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types";
const GCP_A3: &str = "https://cloud.google.com/compute/docs/accelerator-optimized-machines (A3 and A4 series: GPUs, NICs)";
const AZURE_ND: &str = "https://learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/ (ND A100 v4, ND H100 v5, ND H200 v5 series)";

pub const TABLE: &[InstanceType] = &[
    row("p4d.24xlarge", "aws", 8, "A100", true, Rdma::Efa(4), AWS_P),
    row("p4de.24xlarge", "aws", 8, "A100", true, Rdma::Efa(4), AWS_P),
    row("p5.48xlarge", "aws", 8, "H100", true, Rdma::Efa(32), AWS_P),
    row("p5e.48xlarge", "aws", 8, "H200", true, Rdma::Efa(32), AWS_P),
    row(
        "p5en.48xlarge",
        "aws",
        8,
        "H200",
        true,
        Rdma::Efa(16),
        AWS_P,
    ),
    row(
        "p6-b200.48xlarge",
        "aws",
        8,
        "B200",
        true,
        Rdma::Efa(8),
        AWS_P,
    ),
    row("g5.12xlarge", "aws", 4, "A10G", false, Rdma::None, AWS_G),
    row("g5.24xlarge", "aws", 4, "A10G", false, Rdma::None, AWS_G),
    row("g5.48xlarge", "aws", 8, "A10G", false, Rdma::Efa(1), AWS_G),
    row("g6.12xlarge", "aws", 4, "L4", false, Rdma::None, AWS_G),
    row("g6.24xlarge", "aws", 4, "L4", false, Rdma::None, AWS_G),
    row("g6.48xlarge", "aws", 8, "L4", false, Rdma::Efa(1), AWS_G),
    row("g6e.12xlarge", "aws", 4, "L40S", false, Rdma::Efa(1), AWS_G),
    row("g6e.24xlarge", "aws", 4, "L40S", false, Rdma::Efa(2), AWS_G),
    row("g6e.48xlarge", "aws", 8, "L40S", false, Rdma::Efa(4), AWS_G),
    row(
        "a3-highgpu-8g",
        "gcp",
        8,
        "H100",
        true,
        Rdma::GpuDirectTcp(4),
        GCP_A3,
    ),
    row(
        "a3-megagpu-8g",
        "gcp",
        8,
        "H100",
        true,
        Rdma::GpuDirectTcp(8),
        GCP_A3,
    ),
    row(
        "a3-ultragpu-8g",
        "gcp",
        8,
        "H200",
        true,
        Rdma::Roce(8),
        GCP_A3,
    ),
    row(
        "a4-highgpu-8g",
        "gcp",
        8,
        "B200",
        true,
        Rdma::Roce(8),
        GCP_A3,
    ),
    row(
        "Standard_ND96asr_v4",
        "azure",
        8,
        "A100",
        true,
        Rdma::InfiniBand(8),
        AZURE_ND,
    ),
    row(
        "Standard_ND96amsr_A100_v4",
        "azure",
        8,
        "A100",
        true,
        Rdma::InfiniBand(8),
        AZURE_ND,
    ),
    row(
        "Standard_ND96isr_H100_v5",
        "azure",
        8,
        "H100",
        true,
        Rdma::InfiniBand(8),
        AZURE_ND,
    ),
    row(
        "Standard_ND96isr_H200_v5",
        "azure",
        8,
        "H200",
        true,
        Rdma::InfiniBand(8),
        AZURE_ND,
    ),
];

const fn row(
    name: &'static str,
    provider: &'static str,
    gpus: u32,
    gpu_model: &'static str,
    nvlink: bool,
    rdma: Rdma,
    source: &'static str,
) -> InstanceType {
    InstanceType {
        name,
        provider,
        gpus,
        gpu_model,
        nvlink,
        rdma,
        source,
    }
}

/// The row for an instance type as the metadata service or DMI names it (Azure's
/// vmSize compares case-insensitively: "standard_nd96isr_h100_v5" is seen too).
pub fn lookup(name: &str) -> Option<&'static InstanceType> {
    let name = name.trim();
    TABLE.iter().find(|t| t.name.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found_in_any_case() {
        for t in TABLE {
            assert_eq!(
                TABLE.iter().filter(|u| u.name == t.name).count(),
                1,
                "{}",
                t.name
            );
            assert_eq!(lookup(&t.name.to_lowercase()), Some(t));
            assert!(t.source.starts_with("https://"), "{}", t.name);
        }
        assert_eq!(lookup("p5.48xlarge").unwrap().rdma, Rdma::Efa(32));
        assert!(lookup("m5.large").is_none());
    }
}
