//! Parser for `nvidia-smi topo -m` (and `topo -p2p r|w|n`) captures, as operators
//! paste them into tickets: tabs or spaces, ANSI escapes in the header, NIC/mlx5
//! columns and rows, CPU/NUMA affinity columns, the legend.

use crate::cpulist;
use crate::facts::MAX_GPUS;
use crate::facts::{Gpu, GpuFacts, GpuSource, LinkKind, P2pPair, P2pState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmiTopo {
    /// `links[i][j]` in GPU index order.
    pub links: Vec<Vec<LinkKind>>,
    /// Per GPU: the CPU Affinity column, when present.
    pub cpu_affinity: Vec<Option<Vec<u32>>>,
    /// Per GPU: the NUMA Affinity column, when a number.
    pub numa: Vec<Option<u32>>,
    /// NIC columns by name (mlx5_0, or NIC0 resolved through the NIC legend).
    pub nics: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmiTopoError {
    #[error("no GPU header line (a line starting with GPU0) found: is this `nvidia-smi topo -m` output?")]
    NoHeader,
    #[error("GPU header lists {header} GPUs but {rows} GPU rows follow")]
    RowCount { header: usize, rows: usize },
    #[error("row {row}: {detail}")]
    Row { row: String, detail: String },
    #[error("{0} GPUs in one capture: toporun reads at most {MAX_GPUS} per host")]
    TooManyGpus(usize),
}

/// Removes ANSI escape sequences (nvidia-smi underlines the header on a terminal).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // Parameters and intermediates, then one final byte in @..~.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

fn is_indexed(token: &str, prefix: &str) -> bool {
    token
        .strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn is_gpu(token: &str) -> bool {
    is_indexed(token, "GPU")
}

fn is_nic(token: &str) -> bool {
    is_indexed(token, "NIC")
        || token.starts_with("mlx")
        || token.starts_with("rdmap")
        || token.starts_with("efa")
}

/// The matrix part of a capture: header columns and the rows that follow.
struct Grid<'a> {
    columns: Vec<&'a str>,
    rows: Vec<Vec<&'a str>>,
}

fn grid(text: &str) -> Result<Grid<'_>, SmiTopoError> {
    let mut lines = text.lines();
    let header = lines
        .by_ref()
        .map(str::split_whitespace)
        .map(Iterator::collect::<Vec<_>>)
        .find(|t| t.first().is_some_and(|t| is_gpu(t)))
        .ok_or(SmiTopoError::NoHeader)?;
    let rows = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .take_while(|t| !t.is_empty() && !t[0].starts_with("Legend"))
        .collect();
    Ok(Grid {
        columns: header,
        rows,
    })
}

/// Parses `nvidia-smi topo -m`.
pub fn parse_matrix(raw: &str) -> Result<SmiTopo, SmiTopoError> {
    let text = strip_ansi(raw);
    let g = grid(&text)?;
    let n = g.columns.iter().take_while(|t| is_gpu(t)).count();
    if n > MAX_GPUS {
        return Err(SmiTopoError::TooManyGpus(n));
    }
    let nic_cols: Vec<&str> = g.columns[n..]
        .iter()
        .copied()
        .take_while(|t| is_nic(t))
        .collect();
    let gpu_rows: Vec<&Vec<&str>> = g.rows.iter().filter(|r| is_gpu(r[0])).collect();
    if gpu_rows.len() != n {
        return Err(SmiTopoError::RowCount {
            header: n,
            rows: gpu_rows.len(),
        });
    }
    let mut links = Vec::with_capacity(n);
    let mut cpu_affinity = Vec::with_capacity(n);
    let mut numa = Vec::with_capacity(n);
    for (i, row) in gpu_rows.iter().enumerate() {
        let err = |detail: String| SmiTopoError::Row {
            row: row[0].to_string(),
            detail,
        };
        if row[0] != format!("GPU{i}") {
            return Err(err(format!("expected GPU{i} here")));
        }
        if row.len() < 1 + n {
            return Err(err(format!("{} link columns, expected {n}", row.len() - 1)));
        }
        let parsed: Vec<LinkKind> = row[1..=n]
            .iter()
            .map(|c| {
                c.parse()
                    .map_err(|e: crate::facts::LinkParseError| err(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        if parsed[i] != LinkKind::Own {
            return Err(err(format!("diagonal is {}, expected X", parsed[i])));
        }
        links.push(parsed);
        let rest = row.get(1 + n + nic_cols.len()..).unwrap_or_default();
        cpu_affinity.push(rest.first().and_then(|c| cpulist::parse(c)));
        numa.push(rest.get(1).and_then(|c| c.parse().ok()));
    }
    let asymmetric = (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .find(|&(i, j)| links[i][j] != links[j][i]);
    if let Some((i, j)) = asymmetric {
        return Err(SmiTopoError::Row {
            row: format!("GPU{i}"),
            detail: format!(
                "GPU{i}->GPU{j} is {} but GPU{j}->GPU{i} is {}",
                links[i][j], links[j][i]
            ),
        });
    }
    let nics = nic_cols
        .iter()
        .map(|c| resolve_nic_name(&text, c))
        .collect();
    Ok(SmiTopo {
        links,
        cpu_affinity,
        numa,
        nics,
    })
}

/// `NIC0` resolves through the "NIC Legend" (`NIC0: mlx5_0`); other names stay.
fn resolve_nic_name(text: &str, column: &str) -> String {
    let wanted = format!("{column}:");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(&wanted))
        .map(|name| name.trim().to_string())
        .next()
        .unwrap_or_else(|| column.to_string())
}

/// Parses `nvidia-smi topo -p2p r|w|n|a|p`: a GPU matrix of OK/CNS/GNS/TNS/NS/U.
pub fn parse_p2p(raw: &str) -> Result<Vec<Vec<Option<P2pState>>>, SmiTopoError> {
    let text = strip_ansi(raw);
    let g = grid(&text)?;
    let n = g.columns.iter().take_while(|t| is_gpu(t)).count();
    if n > MAX_GPUS {
        return Err(SmiTopoError::TooManyGpus(n));
    }
    g.rows
        .iter()
        .filter(|r| is_gpu(r[0]))
        .map(|row| {
            if row.len() < 1 + n {
                return Err(SmiTopoError::Row {
                    row: row[0].into(),
                    detail: format!("expected {n} columns"),
                });
            }
            Ok(row[1..=n].iter().map(|c| P2pState::from_smi(c)).collect())
        })
        .collect()
}

impl SmiTopo {
    /// GPU facts from the capture: links, and devices with their CPU/NUMA affinity.
    pub fn into_gpu_facts(
        self,
        read: Option<&[Vec<Option<P2pState>>]>,
        write: Option<&[Vec<Option<P2pState>>]>,
    ) -> GpuFacts {
        let n = self.links.len();
        let devices = (0..n)
            .map(|i| Gpu {
                index: i as u32,
                cpu_affinity: self.cpu_affinity[i].clone().unwrap_or_default(),
                numa_node: self.numa[i],
                ..Default::default()
            })
            .collect();
        let state = |m: Option<&[Vec<Option<P2pState>>]>, a: usize, b: usize| {
            m.and_then(|m| m.get(a)?.get(b).copied().flatten())
                .unwrap_or(P2pState::Unknown)
        };
        let p2p = if read.is_some() || write.is_some() {
            (0..n)
                .flat_map(|a| ((a + 1)..n).map(move |b| (a, b)))
                .map(|(a, b)| P2pPair {
                    a,
                    b,
                    read: state(read, a, b),
                    write: state(write, a, b),
                })
                .collect()
        } else {
            Vec::new()
        };
        GpuFacts {
            source: GpuSource::NvidiaSmiTopo,
            devices,
            links: self.links,
            p2p,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: &str = include_str!("../../tests/fixtures/topo/h200x4.txt");
    const G6E: &str = include_str!("../../tests/fixtures/topo/g6e.12xlarge.txt");

    #[test]
    fn h200_capture_with_ansi_and_tabs() {
        let t = parse_matrix(H200).unwrap();
        assert_eq!(t.links.len(), 4);
        assert!(t.links.iter().enumerate().all(|(i, r)| r
            .iter()
            .enumerate()
            .all(|(j, l)| (i == j) == (*l == LinkKind::Own))));
        assert_eq!(t.links[0][3], LinkKind::NvLink(18));
        assert_eq!(t.cpu_affinity[2].as_ref().unwrap().len(), 64);
        assert_eq!(t.numa[0], Some(0));
    }

    #[test]
    fn pcie_capture_reads_node() {
        let t = parse_matrix(G6E).unwrap();
        assert_eq!(t.links[1][2], LinkKind::Node);
    }

    #[test]
    fn nic_columns_and_rows_are_skipped_and_named() {
        let text = "\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\
GPU0\t X \tPXB\tPIX\tSYS\t0-11\t0\t\tN/A\n\
GPU1\tPXB\t X \tPXB\tSYS\t0-11\t0\t\tN/A\n\
NIC0\tPIX\tPXB\t X \tSYS\n\
NIC1\tSYS\tSYS\tSYS\t X \n\n\
Legend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n";
        let t = parse_matrix(text).unwrap();
        assert_eq!(
            t.links,
            vec![
                vec![LinkKind::Own, LinkKind::Pxb],
                vec![LinkKind::Pxb, LinkKind::Own]
            ]
        );
        assert_eq!(t.nics, vec!["mlx5_0", "mlx5_1"]);
        assert_eq!(t.cpu_affinity[1].as_ref().unwrap().len(), 12);
    }

    #[test]
    fn asymmetric_or_short_matrices_are_errors() {
        assert!(matches!(parse_matrix("hello"), Err(SmiTopoError::NoHeader)));
        let bad = "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV2\t X \n";
        assert!(parse_matrix(bad).is_err());
        let short = "\tGPU0\tGPU1\nGPU0\t X \n";
        assert!(parse_matrix(short).is_err());
    }

    #[test]
    fn p2p_matrix_reads_ok_and_ns() {
        let m = parse_p2p(include_str!(
            "../../tests/fixtures/topo/h200x4-p2p-read.txt"
        ))
        .unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0][1], Some(P2pState::Ok));
        assert_eq!(m[0][0], None);
        let prop = parse_p2p(include_str!(
            "../../tests/fixtures/topo/h200x4-p2p-prop.txt"
        ))
        .unwrap();
        assert_eq!(prop[0][1], Some(P2pState::NotSupported));
    }
}
