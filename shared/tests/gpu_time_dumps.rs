//! Real flight-recorder dumps taken while a 2-rank NCCL job trained (2x H200, torch
//! 2.11, TORCH_NCCL_ENABLE_TIMING=1, through TORCH_NCCL_DEBUG_INFO_PIPE_FILE; the job
//! is `scripts/device/gpu_nccl_straggler.sh`'s `slow`: rank 1 runs 3x the matmuls of rank 0).

use flate2::read::GzDecoder;
use std::io::Read;
use toporun_shared::flight_recorder::{gpu_times, parse, Dump};

fn dump(rank: u32) -> Dump {
    let f = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../tests/fixtures/device/nccl-straggler-h200x2/rank_{rank}.pkl.gz"
    ));
    let mut bytes = Vec::new();
    GzDecoder::new(std::fs::File::open(f).unwrap())
        .read_to_end(&mut bytes)
        .unwrap();
    parse(rank, &bytes).unwrap()
}

#[test]
fn the_fast_rank_waits_inside_its_collectives_for_the_slow_one() {
    let d = [dump(0), dump(1)];
    assert_eq!(d[0].group_sizes.get("0"), Some(&2));
    let e = &d[0].entries[0];
    assert!(e.time_created_ns > 1_700_000_000_000_000_000, "{e:?}");
    assert_eq!(e.bytes.map(|b| b.input), Some(4 << 20), "{e:?}");
    let t = gpu_times(&d);
    assert_eq!(t.len(), 2);
    let (fast, slow) = (t[0].share(), t[1].share());
    assert!((0.5..0.7).contains(&fast), "rank 0: {fast}");
    assert!((0.1..0.25).contains(&slow), "rank 1: {slow}");
    // The same collectives on both ranks, over ~1.2 s of each rank's clock.
    assert!(t[0].timed.abs_diff(t[1].timed) < 20, "{t:?}");
    assert!((1.0e9..1.4e9).contains(&(t[1].span_ns as f64)), "{t:?}");
    // The slow rank arrives last and waits least: its all_reduces show what the NVLink
    // pair moves (4 MiB buckets), the fast rank's include its wait.
    let bw = |i: usize| {
        t[i].busbw
            .iter()
            .find(|b| b.kind == "all_reduce")
            .unwrap()
            .gbps
    };
    assert!(bw(1) > 3.0 * bw(0), "{} vs {}", bw(1), bw(0));
}

/// The links of the same job: each all_reduce at the rank that waited least runs near
/// what NV18 gives for 4 MiB, so the straggler does not read as slow links.
#[test]
fn the_straggler_is_not_a_slow_link() {
    use toporun_shared::flight_recorder::{link_speeds, LinkModel};
    let d = [dump(0), dump(1)];
    let nv18 = LinkModel {
        class: "NV18 (Hopper)".into(),
        gbps: 370.8,
    };
    let s = link_speeds(&d, &nv18);
    let ar = s.iter().find(|s| s.kind == "all_reduce").unwrap();
    assert!(ar.count > 3000, "{ar:?}");
    assert!((60.0..120.0).contains(&ar.gbps), "{ar:?}");
    let ratio = ar.gbps / ar.expected_gbps;
    assert!((0.6..1.5).contains(&ratio), "{ar:?}");
    assert!(!ar.slow());
}

/// A 4x H200 job's dumps (tests/fixtures/device/x4-h200/failures): all four ranks after
/// a hang stop (`metrics`), and three of four (`skip`: rank 1 never dumped).
fn x4_dumps(case: &str) -> Vec<Dump> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../tests/fixtures/device/x4-h200/failures/{case}/fr"
    ));
    (0..4)
        .filter_map(|rank| {
            let bytes = std::fs::read(dir.join(format!("rank_{rank}"))).ok()?;
            Some(parse(rank, &bytes).unwrap())
        })
        .collect()
}

/// The link rule counts only collectives whose time is the transfer: with every rank
/// (past NCCL's connection in the first one, 300-490 ms here), 16 MiB all_reduces run
/// at what NV18 gives; with a rank's dump missing, the others' waits could be all it
/// holds, and nothing is judged (the sums' rule said 0.73 GB/s of `skip`).
#[test]
fn the_links_are_judged_on_every_ranks_transfers_only() {
    use toporun_shared::flight_recorder::{link_speeds, LinkModel};
    let nv18 = LinkModel {
        class: "NV18 (Hopper)".into(),
        gbps: 370.8,
    };
    let all = x4_dumps("metrics");
    assert_eq!(all.len(), 4);
    let s = link_speeds(&all, &nv18);
    let ar = s
        .iter()
        .find(|s| s.kind == "all_reduce")
        .expect("all_reduce");
    let r = ar.gbps / ar.expected_gbps;
    assert!((0.5..1.5).contains(&r), "{ar:?}");
    let some = x4_dumps("skip");
    assert_eq!(some.len(), 3);
    assert!(
        link_speeds(&some, &nv18).is_empty(),
        "{:?}",
        link_speeds(&some, &nv18)
    );
}
