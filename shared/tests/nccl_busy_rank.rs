//! What 2x H200 gave for issue 61's busy rank (tests/fixtures/device/nccl-busy-rank-h200x2,
//! `scripts/device/gpu_profiler.sh`): a rank alone in a 35 s evaluation and a rank
//! spinning in Python both never post the collective the other waits in, both with
//! their CPU busy; the evaluating rank's GPU runs kernels (NVML's utilization above 0
//! at every sample), the spinning rank's is idle. Fed to the windows as toporun's
//! tracker reads NVML, the first is work that moves, the second the hang.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use toporun_shared::stacks::activity::Activity;
use toporun_shared::stacks::rank_window::{GpuNow, RankWindow, Reading};
use toporun_shared::stacks::{busy_gpu, BusyGpu};

const SET: &str = "nccl-busy-rank-h200x2";

fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/device")
        .join(SET)
        .join(path)
}

/// Seconds since the first sample, and `gpu`'s utilization, from nvidia-smi's CSV
/// (`2026/11/28 16:04:23.587, 0, 0 %`).
fn utilization(run: &str, gpu: u32) -> Vec<(f64, u32)> {
    let text = std::fs::read_to_string(fixture(&format!("{run}/gpu-util.csv"))).unwrap();
    let secs = |stamp: &str| {
        let time = stamp.split(' ').nth(1).unwrap();
        let mut p = time.split(':').map(|x| x.parse::<f64>().unwrap());
        p.next().unwrap() * 3600.0 + p.next().unwrap() * 60.0 + p.next().unwrap()
    };
    let rows: Vec<(f64, u32, u32)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(", ").collect();
            let util = f[2].trim_end_matches(" %").parse().unwrap();
            (secs(f[0]), f[1].parse().unwrap(), util)
        })
        .collect();
    let t0 = rows[0].0;
    rows.into_iter()
        .filter(|r| r.1 == gpu)
        .map(|r| (r.0 - t0, r.2))
        .collect()
}

/// Seconds into the run of the first stderr line containing `what`.
fn said_at(run: &str, what: &str) -> f64 {
    let err = std::fs::read_to_string(fixture(&format!("{run}/stderr"))).unwrap();
    let line = err.lines().find(|l| l.contains(what)).unwrap();
    line[1..line.find(']').unwrap()].trim().parse().unwrap()
}

/// The held rank's window up to `until` s, a reading every sample of its GPU.
fn window(run: &str, gpu: u32, until: f64) -> RankWindow {
    let mut w = RankWindow::new(Duration::from_secs(60));
    for (at, util) in utilization(run, gpu).into_iter().filter(|s| s.0 <= until) {
        w.push(Reading {
            at: Duration::from_secs_f64(at),
            activity: Activity::Compute,
            place: None,
            cpu: None,
            rss_bytes: None,
            throttling: None,
            gpu: Some(GpuNow {
                index: gpu,
                util_pct: Some(util),
                sm_mhz: None,
                sm_max_mhz: None,
                limits: Vec::new(),
                pcie_replays: None,
                nvlink_errors: None,
            }),
        });
    }
    w
}

/// At the moment the counters found each held rank busy past the timeout, its GPU
/// over the last 5 s (the tracker's look-back): the evaluation's ran kernels, the
/// spin's did not.
#[test]
fn an_evaluation_s_gpu_runs_and_a_spinning_rank_s_idles() {
    let within = 5.0;
    let eval_at = said_at("hang2-eval", "no hang said");
    let eval = window("hang2-eval", 0, eval_at);
    let from = Duration::from_secs_f64(eval_at - within);
    assert_eq!(eval.gpu_busy_since(from), Some(true));
    let spin_at = said_at("hang2-spin", "toporun: hang: rank 1 never posted");
    let spin = window("hang2-spin", 1, spin_at);
    let from = Duration::from_secs_f64(spin_at - within);
    assert_eq!(spin.gpu_busy_since(from), Some(false));
    // And through the whole hold: the evaluation's GPU never read idle, the spin's
    // GPU idle from half a second after it began.
    let hold = said_at("hang2-eval", "hold: rank 0 starts eval");
    let done = said_at("hang2-eval", "evaluation done");
    let during = utilization("hang2-eval", 0);
    assert!(during
        .iter()
        .filter(|s| s.0 > hold + 1.0 && s.0 < done)
        .all(|s| s.1 > 0));
    let hold = said_at("hang2-spin", "hold: rank 1 starts spin");
    let during = utilization("hang2-spin", 1);
    assert!(during.iter().filter(|s| s.0 > hold + 1.0).all(|s| s.1 == 0));
    // What the hang watch then decides for each busy rank.
    let seen = |r: u32, ran: bool| -> BTreeMap<u32, bool> { [(r, ran)].into() };
    assert_eq!(busy_gpu(&[0], &seen(0, true)), Some(BusyGpu::Runs));
    assert_eq!(
        busy_gpu(&[1], &seen(1, false)),
        None,
        "the spin is the hang"
    );
}

/// The job: the evaluation ran to its end under --on-hang stop (exit 0), the spin was
/// stopped (exit 124).
#[test]
fn the_evaluation_finished_and_the_spin_was_stopped() {
    let summary = std::fs::read_to_string(fixture("summary.txt")).unwrap();
    assert!(
        summary.contains("== hang eval on 2 ranks: exit 0"),
        "{summary}"
    );
    assert!(
        summary.contains("== hang spin on 2 ranks: exit 124"),
        "{summary}"
    );
}
