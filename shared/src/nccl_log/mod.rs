//! Reading NCCL's INFO/WARN log: which communicators formed, which ranks they hold
//! and on which hosts, the transport of every channel between two ranks, the network
//! plugin, and known failure lines with their cause; and how a launch captures that
//! log (`capture`). Pure: fed line by line, from
//! files, a rank's console or a ticket, in any order and interleaving.

mod capture;
mod digest;
mod judge;
mod line;
mod matrix;
mod report;
mod signature;
mod summary;
mod transport;

pub use capture::{capture, Capture};
pub use digest::{CommDigest, Digest};
pub use judge::{judge, Topology};
pub use line::{parse as parse_line, Level, Line, MAX_LINE};
pub use matrix::render as render_matrix;
pub use report::{Comm, Failure, Link, LogReport, RankInfo, Verdict, UNIDENTIFIED};
pub use signature::{match_line as known_failure, Known};
pub use summary::TRANSPORT_ID;
pub use summary::{comm_line, findings};
pub use transport::{Class, Transport};

use crate::finding::FindingId;
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Default)]
struct CommState {
    nranks: Option<u32>,
    nnodes: Option<u32>,
    local_ranks: Option<u32>,
    ranks: BTreeMap<u32, RankInfo>,
    links: BTreeMap<(u32, u32), BTreeSet<String>>,
}

#[derive(Default)]
struct Proc {
    /// comm pointer -> communicator key.
    by_ptr: HashMap<String, String>,
    /// The communicator whose init this process is in (channel lines carry none).
    current: Option<String>,
}

/// Incremental reader: `feed` lines in any order, `report` at any time.
#[derive(Default)]
pub struct Analyzer {
    procs: HashMap<(String, u32), Proc>,
    comms: BTreeMap<String, CommState>,
    order: Vec<String>,
    version: Option<String>,
    plugins: BTreeSet<String>,
    failures: Vec<Failure>,
    seen_failures: BTreeSet<(String, u32, FindingId)>,
    nccl_lines: usize,
    completed: BTreeSet<(String, u32)>,
    linked: BTreeSet<(String, u32)>,
}

/// `key value` pairs of an init line (`rank 0 nranks 2 cudaDev 0 busId 60 ...`).
fn field<'a>(msg: &'a str, name: &str) -> Option<&'a str> {
    let mut it = msg.split_whitespace();
    while let Some(w) = it.next() {
        if w == name {
            return it.next();
        }
    }
    None
}

fn num(msg: &str, name: &str) -> Option<u32> {
    field(msg, name)?.parse().ok()
}

/// NCCL prints the PCI bus id as a hex int64: domain<<20 | bus<<12 | device<<4 | fn.
pub fn decode_bus_id(hex: &str) -> Option<String> {
    let v = u64::from_str_radix(hex.trim_start_matches("0x"), 16).ok()?;
    Some(format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        v >> 20,
        (v >> 12) & 0xff,
        (v >> 4) & 0xff,
        v & 0xf
    ))
}

/// `a[d] -> b[d]` of a channel line: the two ranks.
fn channel_ranks(msg: &str) -> Option<(u32, u32)> {
    let (left, right) = msg.split_once(" -> ")?;
    let from = left.rsplit(' ').next()?.split('[').next()?.parse().ok()?;
    let to = right.split('[').next()?.trim().parse().ok()?;
    Some((from, to))
}

impl Analyzer {
    pub fn new() -> Self {
        Self::default()
    }

    fn comm(&mut self, key: &str) -> &mut CommState {
        if !self.comms.contains_key(key) {
            self.order.push(key.to_string());
        }
        self.comms.entry(key.to_string()).or_default()
    }

    /// Processes (host, pid) that completed the init of at least one communicator.
    pub fn completed_processes(&self) -> usize {
        self.completed.len()
    }

    /// Processes that logged at least one transport (`via`) line. NCCL >= 2.22
    /// connects most transports at the first collective, after Init COMPLETE.
    pub fn linked_processes(&self) -> usize {
        self.linked.len()
    }

    /// Reads a whole text (several lines).
    pub fn feed_text(&mut self, text: &str) {
        for l in text.lines() {
            self.feed(l);
        }
    }

    /// Reads one line; lines that are not NCCL's are ignored.
    pub fn feed(&mut self, raw: &str) {
        let Some(l) = line::parse(raw) else {
            return;
        };
        self.nccl_lines += 1;
        let msg = l.msg;
        let proc_key = (l.host.to_string(), l.pid);
        if let Some(k) = signature::match_line(msg) {
            if self.seen_failures.insert((l.host.to_string(), l.pid, k.id)) {
                self.failures.push(Failure {
                    host: l.host.to_string(),
                    pid: l.pid,
                    dev: l.dev,
                    line: msg.chars().take(300).collect(),
                    known: k.clone(),
                });
            }
        }
        if l.level == Level::Warn {
            return;
        }
        if let Some(v) = msg.strip_prefix("NCCL version ") {
            self.version
                .get_or_insert_with(|| v.split_whitespace().next().unwrap_or(v).to_string());
        } else if let Some(p) = msg.strip_prefix("Using network ").or_else(|| {
            msg.strip_prefix("Assigned NET plugin ")
                .and_then(|s| s.strip_suffix(" to comm"))
        }) {
            self.plugins.insert(p.trim().to_string());
        } else if msg.contains("Init START") || msg.contains("Init COMPLETE") {
            self.init_line(&proc_key, &l, msg);
        } else if msg.starts_with("comm 0x") && msg.contains("nNodes") {
            self.summary_line(&proc_key, msg);
        } else if msg.starts_with("Channel") && msg.contains(" via ") {
            let (Some((from, to)), Some((_, via))) = (channel_ranks(msg), msg.split_once(" via "))
            else {
                return;
            };
            let Some(t) = Transport::parse(via) else {
                return;
            };
            // The sender logs its connections, the receiver its `[receive]` ones.
            let own = if msg.contains("[receive]") { to } else { from };
            let key = self
                .procs
                .get(&proc_key)
                .and_then(|p| p.current.clone())
                .unwrap_or_else(|| UNIDENTIFIED.to_string());
            self.linked.insert(proc_key.clone());
            let c = self.comm(&key);
            c.links.entry((from, to)).or_default().insert(t.via);
            c.ranks.entry(own).or_insert_with(|| RankInfo {
                rank: own,
                host: proc_key.0.clone(),
                pid: proc_key.1,
                cuda_dev: l.dev,
                ..Default::default()
            });
        }
    }

    fn init_line(&mut self, proc_key: &(String, u32), l: &Line, msg: &str) {
        let Some(ptr) = field(msg, "comm") else {
            return;
        };
        let nranks = num(msg, "nranks");
        // ncclCommSplit logs no commId: its parent's id and the colour name it.
        let split = field(msg, "parent").and_then(|parent| {
            let p = self.procs.get(proc_key)?.by_ptr.get(parent)?;
            Some(format!("{p}/color {}", field(msg, "color").unwrap_or("?")))
        });
        let key = field(msg, "commId")
            .map(str::to_string)
            .or(split)
            .or_else(|| nranks.map(|n| format!("nranks={n}")))
            .unwrap_or_else(|| UNIDENTIFIED.to_string());
        let done = msg.contains("Init COMPLETE");
        if done {
            self.completed.insert(proc_key.clone());
        }
        let proc = self.procs.entry(proc_key.clone()).or_default();
        proc.by_ptr.insert(ptr.to_string(), key.clone());
        proc.current = Some(key.clone());
        let c = self.comm(&key);
        c.nranks = c.nranks.or(nranks);
        if let Some(rank) = num(msg, "rank") {
            let r = c.ranks.entry(rank).or_insert_with(|| RankInfo {
                rank,
                host: l.host.to_string(),
                pid: l.pid,
                ..Default::default()
            });
            r.cuda_dev = r.cuda_dev.or(num(msg, "cudaDev")).or(l.dev);
            r.nvml_dev = r.nvml_dev.or(num(msg, "nvmlDev"));
            if r.bus_id.is_none() {
                r.bus_id = field(msg, "busId").and_then(decode_bus_id);
            }
            r.complete |= done;
        }
    }

    fn summary_line(&mut self, proc_key: &(String, u32), msg: &str) {
        let ptr = field(msg, "comm").unwrap_or_default().to_string();
        let nranks = num(msg, "nRanks");
        let proc = self.procs.entry(proc_key.clone()).or_default();
        let key = proc
            .by_ptr
            .get(&ptr)
            .cloned()
            .or_else(|| nranks.map(|n| format!("nranks={n}")))
            .unwrap_or_else(|| UNIDENTIFIED.to_string());
        proc.by_ptr.insert(ptr, key.clone());
        proc.current = Some(key.clone());
        let c = self.comm(&key);
        c.nranks = c.nranks.or(nranks);
        if let Some(n) = num(msg, "nNodes") {
            c.nnodes = Some(c.nnodes.map_or(n, |m| m.max(n)));
        }
        if let Some(n) = num(msg, "localRanks") {
            c.local_ranks = Some(c.local_ranks.map_or(n, |m| m.max(n)));
        }
        if let Some(rank) = num(msg, "rank") {
            let r = c.ranks.entry(rank).or_insert_with(|| RankInfo {
                rank,
                host: proc_key.0.clone(),
                pid: proc_key.1,
                ..Default::default()
            });
            r.local_rank = r.local_rank.or(num(msg, "localRank"));
        }
    }

    /// The report so far. Links are merged per (from, to, via); a communicator whose
    /// size no line gave is sized by the highest rank seen.
    pub fn report(&self) -> LogReport {
        let mut comms: Vec<Comm> = self
            .order
            .iter()
            .filter_map(|k| Some((k, self.comms.get(k)?)))
            .filter(|(_, c)| !c.ranks.is_empty() || !c.links.is_empty())
            .map(|(k, c)| {
                let links: Vec<Link> = c
                    .links
                    .iter()
                    .flat_map(|(&(from, to), vias)| {
                        vias.iter().filter_map(move |v| {
                            let t = Transport::parse(v)?;
                            Some(Link {
                                from,
                                to,
                                via: t.via,
                                class: t.class,
                                rdma: t.rdma,
                                verdict: None,
                            })
                        })
                    })
                    .collect();
                Comm {
                    id: k.clone(),
                    nranks: c.nranks,
                    nnodes: c.nnodes,
                    local_ranks: c.local_ranks,
                    ranks: c.ranks.values().cloned().collect(),
                    links,
                }
            })
            .collect();
        // Channel lines of a process whose init lines were cut off: with one
        // communicator in the log they can only belong to it.
        if comms.len() == 2 {
            if let Some(i) = comms.iter().position(|c| c.id == UNIDENTIFIED) {
                let orphan = comms.remove(i);
                let c = &mut comms[0];
                for r in orphan.ranks {
                    if !c.ranks.iter().any(|k| k.rank == r.rank) {
                        c.ranks.push(r);
                    }
                }
                c.ranks.sort_by_key(|r| r.rank);
                for l in orphan.links {
                    if !c
                        .links
                        .iter()
                        .any(|k| (k.from, k.to, &k.via) == (l.from, l.to, &l.via))
                    {
                        c.links.push(l);
                    }
                }
                c.links
                    .sort_by(|a, b| (a.from, a.to, &a.via).cmp(&(b.from, b.to, &b.via)));
            }
        }
        LogReport {
            version: self.version.clone(),
            net_plugins: self.plugins.iter().cloned().collect(),
            comms,
            failures: self.failures.clone(),
            nccl_lines: self.nccl_lines,
        }
    }
}

/// Reads a whole log at once.
pub fn analyze(text: &str) -> LogReport {
    let mut a = Analyzer::new();
    a.feed_text(text);
    a.report()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAME_HOST: &str = "\
vm:1168:1168 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:1168:1168 [0] NCCL INFO ncclCommInitRankConfig comm 0x22 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 60 commId 0x44 - Init START
vm:1169:1169 [0] NCCL INFO ncclCommInitRankConfig comm 0x45 rank 1 nranks 2 cudaDev 0 nvmlDev 1 busId 70 commId 0x44 - Init START
vm:1168:1168 [0] NCCL INFO comm 0x22 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
[default1]:vm:1169:1169 [0] NCCL INFO comm 0x45 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0
vm:1168:1168 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
vm:1169:1169 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM
vm:1168:1168 [0] NCCL INFO ncclCommInitRankConfig comm 0x22 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 60 commId 0x44 - Init COMPLETE
";

    #[test]
    fn one_communicator_from_two_interleaved_ranks() {
        let r = analyze(SAME_HOST);
        assert_eq!(r.version.as_deref(), Some("2.28.9+cuda13.0"));
        assert_eq!(r.comms.len(), 1);
        let c = &r.comms[0];
        assert_eq!(
            (c.id.as_str(), c.nranks, c.nnodes, c.local_ranks),
            ("0x44", Some(2), Some(1), Some(2))
        );
        assert_eq!(c.links.len(), 2);
        assert!(c
            .links
            .iter()
            .all(|l| l.class == Class::P2p && l.via == "P2P/CUMEM"));
        assert_eq!(c.ranks[0].bus_id.as_deref(), Some("0000:00:06.0"));
        assert_eq!(c.ranks[1].local_rank, Some(1));
        assert!(!c.complete(), "rank 1 never logged Init COMPLETE");
    }

    #[test]
    fn failures_are_found_once_per_process() {
        let log = "h:1:1 [0] NCCL WARN Error: failed to extend /dev/shm/nccl-x to 9637892 bytes\nh:1:1 [0] NCCL WARN Error: failed to extend /dev/shm/nccl-y to 9637892 bytes\n";
        let r = analyze(log);
        assert_eq!(r.failures.len(), 1);
        assert_eq!(r.failures[0].known.id, "nccl.shm_full");
        assert_eq!(r.fatal().count(), 1);
    }

    #[test]
    fn garbage_never_panics() {
        let mut junk = String::new();
        for i in 0..2000u32 {
            let c = char::from_u32((i * 7919) % 0x2FFF).unwrap_or('x');
            junk.push(c);
            if i % 37 == 0 {
                junk.push_str(" NCCL INFO Channel ");
            }
            if i % 91 == 0 {
                junk.push_str(" -> ");
            }
            if i % 53 == 0 {
                junk.push('\n');
            }
        }
        let r = analyze(&junk);
        assert!(r.comms.iter().all(|c| c.links.is_empty()));
        assert_eq!(decode_bus_id("zz"), None);
    }

    #[test]
    fn bus_ids_decode_like_nccl() {
        assert_eq!(decode_bus_id("60").as_deref(), Some("0000:00:06.0"));
        assert_eq!(decode_bus_id("1000").as_deref(), Some("0000:01:00.0"));
        assert_eq!(decode_bus_id("a01c0").as_deref(), Some("0000:a0:1c.0"));
    }
}
