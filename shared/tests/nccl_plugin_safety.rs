//! What 2x H200 (torch 2.11, NCCL 2.28.9) gave for issue 63, kept under
//! tests/fixtures/device/nccl-plugin-safety-h200x2 (`scripts/device/gpu_plugin_safety.sh`):
//! a C++ program on NCCL alone, no Python stacks to read, its counters files (layout
//! version 4) as the attempt's end left them. The counters alone name the rank stuck
//! before a collective and the rank whose GPU is slow.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};
use toporun_shared::nccl_counters::{decode, window, NcclWatch, NodeReading, RankCounters};
use toporun_shared::stacks::{counters_alone, CountersAlone, Places};

const SET: &str = "nccl-plugin-safety-h200x2";

fn fixture(path: &str) -> PathBuf {
    common::device_fixture(SET, path)
}

fn counters(run: &str, rank: u32) -> RankCounters {
    common::counters_file(SET, &format!("{run}/rank_{rank}.gz"))
}

/// The stuck run's node read twice 20 s apart with nothing moving (the ranks were
/// stopped at the hang: their counters stand as they were then), rank 1's CPU idle.
#[test]
fn the_c_program_s_stuck_rank_is_named_from_the_counters_alone() {
    let ranks = [counters("cjob-stuck2", 0), counters("cjob-stuck2", 1)];
    let comm = |r: usize| ranks[r].comms.iter().find(|c| c.live).unwrap().clone();
    assert_eq!(
        (comm(0).posted, comm(1).posted),
        (201, 200),
        "rank 1 never posted 201"
    );
    let reading = NodeReading {
        live: vec![0, 1],
        counters: [(0, ranks[0].clone()), (1, ranks[1].clone())].into(),
        cpu: [(0, Duration::from_secs(20)), (1, Duration::from_millis(40))].into(),
        ..Default::default()
    };
    let (mut watch, t0, timeout) = (
        NcclWatch::default(),
        Instant::now(),
        Duration::from_secs(15),
    );
    assert!(matches!(
        counters_alone(&mut watch, reading.clone(), &Places::new(), timeout, t0),
        CountersAlone::Moving
    ));
    let CountersAlone::Hang(hang) = counters_alone(
        &mut watch,
        reading,
        &Places::new(),
        timeout,
        t0 + Duration::from_secs(15),
    ) else {
        panic!("a hang");
    };
    assert_eq!(hang.odd, vec![1]);
    let text = hang.text(&Places::new());
    let said = std::fs::read_to_string(fixture("cjob-stuck2/stderr")).unwrap();
    let headline = format!(
        "rank 1 never posted all_reduce (16 MiB, operation 201 on communicator {:#x}) that rank 0 waits in: rank 1 is stuck (CPU 0% of the 15s)",
        comm(0).hash
    );
    assert!(hang.headline.starts_with(&headline), "{}", hang.headline);
    assert!(said.contains(&headline), "the device said the same: {said}");
    assert!(text.contains("the counters alone decide"), "{text}");
}

/// The slow run: rank 1's GPU computes 3x as long, so it spends almost none of the
/// run in collectives while rank 0 waits for it in each.
#[test]
fn the_c_program_s_slow_gpu_waits_least() {
    let before = decode(&toporun_shared::nccl_counters::words::Words::default().bytes()).unwrap();
    let span = Duration::from_secs(80);
    let share = |r: u32| {
        let after = counters("cjob-slow2", r);
        assert_eq!(after.comms.len(), 1);
        window::gpu_time(r, &before, &after, span, after.comms[0].hash)
            .unwrap()
            .share()
    };
    let (fast, slow) = (share(0), share(1));
    assert!(slow < 0.05, "the slow rank waits {slow:.2}");
    assert!(fast > 0.5, "its peer waits {fast:.2}");
    let said = std::fs::read_to_string(fixture("cjob-slow2/stderr")).unwrap();
    assert!(said.contains("toporun: straggler: rank 1 "), "{said}");
    assert!(!said.contains("straggler: rank 0"), "{said}");
}

/// The runs wrote a layout this toporun reads, and nothing crashed or
/// warned where the job was healthy.
#[test]
fn the_runs_were_of_this_layout_and_the_healthy_one_said_nothing() {
    assert_eq!(counters("cjob-slow2", 0).comms[0].nranks, 2);
    let v = std::fs::read(fixture("cjob-stuck2/rank_0.gz")).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&v[..]), &mut bytes).unwrap();
    // Layout 4, the one this issue brought (5 added the fastest operation since).
    assert_eq!(u64::from_le_bytes(bytes[8..16].try_into().unwrap()), 4);
    let healthy = std::fs::read_to_string(fixture("cjob-healthy2/stderr")).unwrap();
    assert!(!healthy.contains("warning"), "{healthy}");
    assert!(!healthy.contains("toporun: hang"), "{healthy}");
    let churn = std::fs::read_to_string(fixture("churn2/stdout")).unwrap();
    assert!(churn.contains("churn: 300 cycles"), "{churn}");
    let crash = ["Segmentation fault", "SIGSEGV", "SIGBUS", "core dumped"];
    let log = std::fs::read_to_string(fixture("churn2/stderr")).unwrap();
    assert!(crash.iter().all(|c| !log.contains(c)), "{log}");
}

/// The same on 4x H200 (tests/fixtures/device/nccl-plugin-safety-h200x4): the stuck rank
/// named from the counters alone within --hang-timeout + 10 s of its hold, and so with
/// 40 communicators live; the slow GPU named; a healthy run silent.
#[test]
fn on_four_gpus_the_stuck_slow_and_healthy_runs_are_told_apart() {
    let x4 = |path: &str| {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/device/nccl-plugin-safety-h200x4")
            .join(path);
        std::fs::read_to_string(p).unwrap()
    };
    let at = |text: &str, what: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what}"));
        line[1..line.find(']').unwrap()].trim().parse().unwrap()
    };
    for (run, hold) in [
        ("cjob-stuck4", "hold: rank 1 blocks"),
        ("many4", "hold: rank 1 blocks"),
    ] {
        let err = x4(&format!("{run}/stderr"));
        let took = at(&err, "never posted") - at(&err, hold);
        assert!(
            (15.0..=25.0).contains(&took),
            "{run}: named {took:.1} s after the hold"
        );
        assert!(err.contains("rank 1 is stuck (CPU 0%"), "{run}: {err}");
        assert!(err.contains("that ranks 0,2-3 wait in"), "{run}: {err}");
    }
    assert!(x4("cjob-stuck4/stderr").contains("the counters alone decide"));
    let slow = x4("cjob-slow4/stderr");
    assert!(slow.contains("toporun: straggler: rank 1 "), "{slow}");
    let healthy = x4("cjob-healthy4/stderr");
    assert!(
        !healthy.contains("toporun: warning") && !healthy.contains("toporun: hang"),
        "{healthy}"
    );
    let ranks: Vec<RankCounters> = (0..4)
        .map(|r| common::counters_file(X4, &format!("cjob-stuck4/rank_{r}.gz")))
        .collect();
    let posted: Vec<u64> = ranks
        .iter()
        .map(|c| c.comms.iter().find(|x| x.live).unwrap().posted)
        .collect();
    assert_eq!(posted, [201, 200, 201, 201], "rank 1 one behind");
}

const X4: &str = "nccl-plugin-safety-h200x4";

fn fixture_x4(path: &str) -> PathBuf {
    common::device_fixture(X4, path)
}

/// On 4x H200, 200 cycles of communicators made, split to share a proxy, destroyed
/// and aborted mid-collective ended with no crash; the C++ program's healthy run under
/// the default 60 s straggler window said nothing, and its counters, read as the
/// agent reads them, show every rank level with nothing open.
#[test]
fn on_four_gpus_the_churn_ends_clean_and_a_healthy_run_under_the_defaults_is_silent() {
    let read = |p: &str| std::fs::read_to_string(fixture_x4(p)).unwrap();
    let churn = read("churn4/stdout");
    assert_eq!(churn.matches("churn: 200 cycles").count(), 4, "{churn}");
    let crash = ["Segmentation fault", "SIGSEGV", "SIGBUS", "core dumped"];
    let log = read("churn4/stderr");
    assert!(crash.iter().all(|c| !log.contains(c)), "{log}");
    assert!(read("churn4/summary.txt").contains("== churn4: exit 0"));
    let healthy = read("cjob-healthy4-default/stderr");
    assert!(!healthy.contains("--straggler-window"), "the defaults");
    assert!(
        !healthy.contains("toporun: warning") && !healthy.contains("toporun: hang"),
        "{healthy}"
    );
    let ranks: Vec<RankCounters> = (0..4)
        .map(|r| common::counters_file(X4, &format!("cjob-healthy4-default/rank_{r}.gz")))
        .collect();
    let node = NodeReading {
        counters: ranks
            .iter()
            .cloned()
            .enumerate()
            .map(|(r, c)| (r as u32, c))
            .collect(),
        ..Default::default()
    };
    let mut w = NcclWatch::default();
    assert_eq!(
        w.observe(&node, Instant::now()),
        toporun_shared::nccl_counters::NcclState::Idle
    );
    let posted: Vec<u64> = ranks
        .iter()
        .map(|c| c.comms.iter().map(|x| x.posted).sum())
        .collect();
    assert!(
        posted.iter().all(|p| *p == posted[0] && *p > 1000),
        "{posted:?}"
    );
}
