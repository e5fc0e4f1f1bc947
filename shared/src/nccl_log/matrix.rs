//! The transport matrix of a communicator, laid out like `nvidia-smi topo -m`.

use super::report::Comm;
use super::transport::Transport;
use std::fmt::Write;

/// Past this many ranks the matrix is not drawn (a summary is).
pub const MAX_DRAWN: u32 = 32;

/// Rows and columns are ranks; a cell is the fastest transport NCCL logged between
/// the two (either direction): P2P, SHM, RDMA, SOCK; `X` the rank itself, `.` no
/// direct channel (rings and trees connect neighbours only).
pub fn render(c: &Comm) -> String {
    let n = c.size().min(MAX_DRAWN + 1);
    if n == 0 || n > MAX_DRAWN {
        return String::new();
    }
    let cell = |a: u32, b: u32| -> String {
        if a == b {
            return "X".into();
        }
        c.links
            .iter()
            .filter(|l| (l.from, l.to) == (a, b) || (l.from, l.to) == (b, a))
            .filter_map(|l| Transport::parse(&l.via))
            .min_by_key(Transport::rank)
            .map_or(".".into(), |t| t.short().into())
    };
    let mut out = String::from("        ");
    for b in 0..n {
        let _ = write!(out, "{:<6}", format!("R{b}"));
    }
    out.push_str("host\n");
    for a in 0..n {
        let _ = write!(out, "  {:<6}", format!("R{a}"));
        for b in 0..n {
            let _ = write!(out, "{:<6}", cell(a, b));
        }
        out.push_str(c.host_of(a).unwrap_or("?"));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::analyze;
    use super::*;

    #[test]
    fn ring_neighbours_and_missing_pairs() {
        let log = "\
h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 3 nNodes 1 localRanks 3 localRank 0 MNNVL 0
h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
h:2:2 [1] NCCL INFO Channel 00 : 1[1] -> 2[2] via SHM/direct/direct
";
        let m = render(&analyze(log).comms[0]);
        let rows: Vec<&str> = m.lines().collect();
        assert!(rows[0].contains("R0") && rows[0].contains("R2"));
        assert_eq!(
            rows[1].split_whitespace().collect::<Vec<_>>(),
            ["R0", "X", "P2P", ".", "h"]
        );
        assert_eq!(
            rows[2].split_whitespace().collect::<Vec<_>>(),
            ["R1", "P2P", "X", "SHM", "h"]
        );
        assert_eq!(rows[3].split_whitespace().last(), Some("?"));
    }
}
