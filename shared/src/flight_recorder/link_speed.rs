//! How fast the links carried the job's collectives, against what they should give.
//! A collective's GPU time on the rank that arrived last is its transfer: the others
//! wait inside the kernel first. So each collective that every dump holds counts at
//! its shortest duration, and a straggler does not read as a slow link. The
//! expectation is a fixed latency plus the bytes over the slowest link's class
//! bandwidth, as NCCL models a ring: on 2x H100 NV18 it gives 148, 276 and 314 GB/s
//! at 8 MiB, 64 MiB and 1 GiB where all_reduce measured 165, 267 and 330
//! (tests/fixtures/device/full-node-h100x2); the same GPUs with P2P off measured
//! 26 GB/s, a tenth.

use super::dump::Dump;
use super::gpu_time::{bus_bytes, kind_of, MIN_BUSBW_BYTES};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The slowest link the collectives cross, as its class names it.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkModel {
    /// "NV18 (Hopper) between GPU 0 and GPU 1".
    pub class: String,
    /// What one direction of it carries (GB/s).
    pub gbps: f64,
}

impl LinkModel {
    /// What a collective carrying `bus` bus bytes should reach (GB/s): a fixed
    /// latency, then the bytes at the class bandwidth.
    pub fn expected_gbps(&self, bus: f64) -> f64 {
        bus / (LATENCY_NS + bus / (self.gbps * EFFICIENCY))
    }
}

/// A collective's fixed cost on the GPU before its bytes move (ns).
const LATENCY_NS: f64 = 30_000.0;
/// The share of the class bandwidth a collective's ring reaches.
const EFFICIENCY: f64 = 0.85;
/// Collectives below this fraction of the model are carried by slower links than the
/// class: a link down to PCIe or P2P off carries about a tenth.
pub const SLOW_LINKS: f64 = 1.0 / 3.0;
/// Fewer collectives say nothing of the links.
const MIN_COLLECTIVES: u32 = 20;

/// One collective kind's busbw over the collectives every rank's dump holds, the
/// median of each collective's at its shortest GPU time, and what the model gives
/// for the same bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkSpeed {
    pub kind: String,
    pub count: u32,
    /// Bytes moved per collective, on average.
    pub mean_bytes: u64,
    pub gbps: f64,
    pub expected_gbps: f64,
    /// The fastest collective's busbw, where known: one that ran with nothing beside
    /// it on the GPU shows what the link carries (DDP's buckets, overlapped with the
    /// backward's kernels, run slower on a healthy link).
    pub fastest_gbps: Option<f64>,
}

impl LinkSpeed {
    /// Enough collectives ran far below what the links should carry, and none ran
    /// near it: a link that carried its speed once is not what slows the others.
    pub fn slow(&self) -> bool {
        let floor = self.expected_gbps * SLOW_LINKS;
        self.count >= MIN_COLLECTIVES
            && self.gbps < floor
            && self.fastest_gbps.is_none_or(|f| f < floor)
    }
}

/// One collective: its kind, bus bytes, bytes moved, shortest GPU time, the dumps
/// holding it, and its group's size.
struct Seen<'a> {
    kind: &'a str,
    bus: f64,
    moved: u64,
    ns: u64,
    held: u32,
    size: u32,
}

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The link speed of each collective kind the dumps share, against `model`. Only
/// collectives whose time is the transfer count: each at the rank that waited least,
/// held by every rank of its group (a missing rank's dump could hold the short one),
/// past the group's first (NCCL connects its peers inside it: 300-490 ms for 16 MiB
/// on 4x H200, tests/fixtures/device/x4-h200). A kind's speed is the median of its
/// collectives', so a few that still hold a wait cannot make a link look slow.
pub fn link_speeds(dumps: &[Dump], model: &LinkModel) -> Vec<LinkSpeed> {
    let mut seen: BTreeMap<(&str, u64), Seen> = BTreeMap::new();
    for d in dumps {
        for e in d
            .entries
            .iter()
            .filter(|e| !e.is_p2p && e.collective_seq_id > 1)
        {
            let (Some(b), Some(ns)) = (e.bytes, e.duration_ns.filter(|n| *n > 0)) else {
                continue;
            };
            let moved = b.input.max(b.output);
            let size = d.group_sizes.get(&e.group).copied();
            let kind = kind_of(&e.op);
            let n = size.unwrap_or(2);
            let Some(bus) = bus_bytes(kind, b, n).filter(|_| moved >= MIN_BUSBW_BYTES) else {
                continue;
            };
            let everyone = size.unwrap_or(dumps.len() as u32);
            let c = seen
                .entry((e.group.as_str(), e.collective_seq_id))
                .or_insert(Seen {
                    kind,
                    bus,
                    moved,
                    ns,
                    held: 0,
                    size: everyone,
                });
            (c.ns, c.held) = (c.ns.min(ns), c.held + 1);
        }
    }
    // Per kind: each collective's busbw and the model's, and the bytes moved.
    let mut by: BTreeMap<&str, Vec<(f64, f64, u64)>> = BTreeMap::new();
    for c in seen.into_values().filter(|c| c.held >= c.size) {
        by.entry(c.kind).or_default().push((
            c.bus / c.ns as f64,
            model.expected_gbps(c.bus),
            c.moved,
        ));
    }
    by.into_iter()
        .map(|(kind, all)| {
            let count = all.len() as u32;
            LinkSpeed {
                kind: kind.to_string(),
                count,
                mean_bytes: all.iter().map(|c| c.2).sum::<u64>() / u64::from(count),
                gbps: median(all.iter().map(|c| c.0).collect()),
                expected_gbps: median(all.iter().map(|c| c.1).collect()),
                fastest_gbps: all.iter().map(|c| c.0).reduce(f64::max),
            }
        })
        .collect()
}

/// The finding for collectives far below their links, or None.
pub fn slow_links_line(speeds: &[LinkSpeed], model: &LinkModel) -> Option<String> {
    let s = speeds.iter().find(|s| s.slow())?;
    Some(format!(
        "{} of {:.0} MiB run at {:.0} GB/s on the GPU where {} should give about {:.0} GB/s \
         (the median of {} collectives, each at the rank that waited least): the collectives do not use \
         that link (NCCL_P2P_DISABLE or NCCL_P2P_LEVEL set, a link down to PCIe, NCCL's \
         transports in the NCCL report) or share it with other work",
        s.kind,
        s.mean_bytes as f64 / f64::from(1 << 20),
        s.gbps,
        model.class,
        s.expected_gbps,
        s.count,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flight_recorder::dump::all_reduces;

    const NV18: f64 = 370.8;

    fn model() -> LinkModel {
        LinkModel {
            class: "NV18 (Hopper) between GPU 0 and GPU 1".into(),
            gbps: NV18,
        }
    }

    /// Rank `rank`'s dump: `n` all_reduces of `mib` MiB, the i-th taking `us(i)` us.
    fn dump(rank: u32, n: u64, mib: u64, us: impl Fn(u64) -> u64) -> Dump {
        all_reduces(rank, 0..n, mib << 20, |seq| (1 + seq, us(seq) * 1000))
    }

    /// Both ranks' dumps, every collective taking `us(i)` on each.
    fn pair(n: u64, mib: u64, us: impl Fn(u64) -> u64 + Copy) -> [Dump; 2] {
        [dump(0, n, mib, us), dump(1, n, mib, us)]
    }

    #[test]
    fn the_model_matches_nv18_all_reduce_measured_on_h100() {
        // 2x H100 NV18, tests/fixtures/device/full-node-h100x2: 165, 267, 330 GB/s.
        for (mib, measured) in [(8, 165.2), (64, 266.9), (1024, 330.0)] {
            let bus = (mib << 20) as f64; // 2 * (1/2) * bytes for 2 ranks
            let us = bus / measured / 1000.0;
            let s = &link_speeds(&pair(30, mib, |_| us as u64), &model())[0];
            let r = s.gbps / s.expected_gbps;
            assert!((0.85..1.2).contains(&r), "{mib} MiB: {r}");
            assert!(!s.slow());
        }
    }

    #[test]
    fn each_collective_counts_at_the_rank_that_waited_least() {
        // 25 MiB at 230 GB/s is 114 us. Rank 0 waits 5 ms in every other one (rank 1
        // is a straggler there), rank 1 in the others: neither is the link.
        let fast = |i: u64, r: u64| if i % 2 == r { 5114 } else { 114 };
        let d = [
            dump(0, 40, 25, |i| fast(i, 0)),
            dump(1, 40, 25, |i| fast(i, 1)),
        ];
        let s = &link_speeds(&d, &model())[0];
        // Collectives 0 and 1 are the connection's: not counted.
        assert_eq!((s.count, s.mean_bytes), (38, 25 << 20));
        assert!((s.gbps - 229.9).abs() < 1.0, "{}", s.gbps);
        assert!(!s.slow(), "{s:?}");
        assert_eq!(slow_links_line(std::slice::from_ref(s), &model()), None);
    }

    #[test]
    fn collectives_through_the_host_are_named_against_nvlink() {
        // P2P off on the same H100 pair: 26.5 GB/s at 64 MiB.
        let us = (64u64 << 20) as f64 / 26.5 / 1000.0;
        let s = link_speeds(&pair(30, 64, |_| us as u64), &model());
        assert!(s[0].slow(), "{s:?}");
        let line = slow_links_line(&s, &model()).unwrap();
        assert!(
            line.starts_with("all_reduce of 64 MiB run at 27 GB/s on the GPU where NV18 (Hopper) between GPU 0 and GPU 1 should give about 276 GB/s (the median of 28 collectives"),
            "{line}"
        );
    }

    #[test]
    fn few_or_small_or_unshared_collectives_say_nothing() {
        let slow = |_| 100_000;
        assert!(
            !link_speeds(&pair(21, 64, slow), &model())[0].slow(),
            "19 past the first two"
        );
        assert!(
            link_speeds(&pair(30, 0, slow), &model()).is_empty(),
            "< 1 MiB"
        );
        // One rank's dump alone: its collectives may all hold its waits.
        assert!(
            link_speeds(&[dump(0, 30, 64, slow)], &model()).is_empty(),
            "a rank missing"
        );
        // Rank 1 holds collectives 30.. only: nothing in common.
        let mut late = dump(1, 30, 64, slow);
        late.entries
            .iter_mut()
            .for_each(|e| e.collective_seq_id += 30);
        assert!(link_speeds(&[dump(0, 30, 64, slow), late], &model()).is_empty());
    }

    /// The healthy job that was told its link was slow (2x H100 NV18): 22 all_reduces
    /// of 16 MiB at 83 us, the first holding NCCL's connection setup (180 ms on both
    /// ranks), the 12th the 35 s rank 1 spent in its own work while rank 0 waited.
    #[test]
    fn a_healthy_link_with_a_long_single_rank_pause_is_not_slow() {
        let us = |r: u64| {
            move |i: u64| match i {
                1 => 180_000,
                12 if r == 0 => 35_000_000,
                _ => 83,
            }
        };
        let d = [dump(0, 23, 16, us(0)), dump(1, 23, 16, us(1))];
        let s = &link_speeds(&d, &model())[0];
        assert_eq!(s.count, 21, "{s:?}");
        assert!(!s.slow(), "{s:?}");
        let r = s.gbps / s.expected_gbps;
        assert!((0.85..1.2).contains(&r), "{s:?}");
        // What the rule said before: the sums' ratio with the first collective in.
        let (bus, ns) = (22.0 * f64::from(16u32 << 20), 180e6 + 21.0 * 83e3);
        assert!(bus / ns < s.expected_gbps * SLOW_LINKS, "{}", bus / ns);
    }
}
