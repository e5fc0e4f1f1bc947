//! A node's NCCL report in a few hundred bytes, for the store: what the job-wide
//! report on the host merges.

use super::report::{Comm, LogReport};
use super::transport::{Class, Transport};
use crate::finding::Finding;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CommDigest {
    pub id: String,
    pub nranks: Option<u32>,
    pub nnodes: Option<u32>,
    /// Ranks that logged here, and those whose init completed.
    pub ranks: BTreeSet<u32>,
    pub complete: BTreeSet<u32>,
    /// Rank pairs (low-high) by NCCL's transport name.
    pub pairs: BTreeMap<String, BTreeSet<(u32, u32)>>,
    /// Links below what the hardware allows: "0->1 via SHM/direct/direct".
    pub below_best: BTreeSet<String>,
    /// Links judged best.
    pub best: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Digest {
    pub version: Option<String>,
    pub comms: Vec<CommDigest>,
    pub findings: Vec<Finding>,
}

fn comm_digest(c: &Comm) -> CommDigest {
    let mut d = CommDigest {
        id: c.id.clone(),
        nranks: c.nranks,
        nnodes: c.nnodes,
        ranks: c.ranks.iter().map(|r| r.rank).collect(),
        complete: c
            .ranks
            .iter()
            .filter(|r| r.complete)
            .map(|r| r.rank)
            .collect(),
        ..Default::default()
    };
    for l in &c.links {
        d.pairs
            .entry(l.via.clone())
            .or_default()
            .insert((l.from.min(l.to), l.from.max(l.to)));
        match &l.verdict {
            Some(v) if !v.best => {
                d.below_best
                    .insert(format!("{}->{} via {}", l.from, l.to, l.via));
            }
            Some(_) => d.best += 1,
            None => {}
        }
    }
    d
}

impl Digest {
    pub fn of(report: &LogReport, findings: Vec<Finding>) -> Digest {
        Digest {
            version: report.version.clone(),
            comms: report.comms.iter().map(comm_digest).collect(),
            findings,
        }
    }

    /// Several nodes' digests as one: communicators by id, findings without repeats.
    pub fn merge(all: &[Digest]) -> Digest {
        let mut out = Digest::default();
        for d in all {
            out.version = out.version.or_else(|| d.version.clone());
            for c in &d.comms {
                let pos = out.comms.iter().position(|x| x.id == c.id);
                let m = match pos {
                    Some(i) => &mut out.comms[i],
                    None => {
                        out.comms.push(CommDigest {
                            id: c.id.clone(),
                            ..Default::default()
                        });
                        out.comms.last_mut().expect("pushed")
                    }
                };
                m.nranks = m.nranks.max(c.nranks);
                m.nnodes = m.nnodes.max(c.nnodes);
                m.ranks.extend(&c.ranks);
                m.complete.extend(&c.complete);
                for (via, p) in &c.pairs {
                    m.pairs.entry(via.clone()).or_default().extend(p);
                }
                m.below_best.extend(c.below_best.iter().cloned());
                m.best += c.best;
            }
            for f in &d.findings {
                if !out
                    .findings
                    .iter()
                    .any(|x| x.id == f.id && x.summary == f.summary)
                {
                    out.findings.push(f.clone());
                }
            }
        }
        out
    }

    /// The communicator that spans the most ranks (the job's world, usually).
    pub fn world(&self) -> Option<&CommDigest> {
        self.comms
            .iter()
            .max_by_key(|c| (c.nranks.unwrap_or(0), c.ranks.len()))
    }

    /// `8 ranks on 1 node, 4 rank pairs via P2P/CUMEM (P2P): best available`.
    pub fn line(&self) -> String {
        let Some(c) = self.world() else {
            return "no communicator in NCCL's log yet".into();
        };
        let n = c.nranks.unwrap_or(c.ranks.len() as u32);
        let nodes = c.nnodes.map_or(String::new(), |m| {
            format!(" on {m} node{}", if m == 1 { "" } else { "s" })
        });
        let vias = c
            .pairs
            .iter()
            .map(|(via, p)| {
                let class = Transport::parse(via).map_or("?", |t| t.short());
                format!(
                    "{} rank pair{} via {via} ({class})",
                    p.len(),
                    if p.len() == 1 { "" } else { "s" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let verdict = if !c.below_best.is_empty() {
            format!(
                ": {} link(s) below what the hardware allows",
                c.below_best.len()
            )
        } else if c.best > 0 {
            ": best available".into()
        } else {
            String::new()
        };
        let others = self.comms.len() - 1;
        format!(
            "{n} ranks{nodes}, {}{verdict}{}",
            if vias.is_empty() {
                "no transport lines".into()
            } else {
                vias
            },
            if others > 0 {
                format!(" (+{others} more communicator(s))")
            } else {
                String::new()
            }
        )
    }

    /// Whether the world communicator's ranks all use P2P or SHM (one NCCL host).
    pub fn classes(&self) -> BTreeSet<Class> {
        self.world()
            .map(|c| {
                c.pairs
                    .keys()
                    .filter_map(|v| Transport::parse(v).map(|t| t.class))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{analyze, judge};
    use super::*;

    #[test]
    fn two_nodes_digests_merge_into_the_job() {
        let n0 = "h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 2 cudaDev 0 busId 60 commId 0xab - Init START\nh:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\nh:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0\nh:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 2 cudaDev 0 busId 60 commId 0xab - Init COMPLETE\n";
        let n1 = n0
            .replace("h:1:1", "g:2:2")
            .replace("rank 0 ", "rank 1 ")
            .replace("0[0] -> 1[1] [send]", "0[0] -> 1[1] [receive]");
        let mut r0 = analyze(n0);
        judge(&mut r0, None);
        let d = Digest::merge(&[Digest::of(&r0, vec![]), Digest::of(&analyze(&n1), vec![])]);
        let w = d.world().unwrap();
        assert_eq!(w.complete.len(), 2);
        assert_eq!(
            d.line(),
            "2 ranks on 2 nodes, 1 rank pair via NET/Socket/0 (SOCK)"
        );
        let back: Digest = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }
}
