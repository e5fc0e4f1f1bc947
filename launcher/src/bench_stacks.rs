//! `toporun bench stacks`: what reading the ranks' stacks costs. N Python processes
//! stand in a function call (as ranks in a collective); the bench times the first
//! capture of all of them (attaching), a later one, and the CPU this process spends
//! sampling them at an interval for a while (the hang watcher's load), alone and with
//! the straggler tracker fed at each sample, in alternating periods of the same run.

use crate::exit::ExitStatus;
use anyhow::{Context, Result};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use toporun_agent::job::straggler::{NodeSeat, StragglerDecide, Tracker};
use toporun_agent::paths::Root;
use toporun_agent::stacks::{RankPid, Sampler};

const RANK: &str = "import time\ndef in_a_collective():\n    time.sleep(3600)\nprint('ready', flush=True)\nin_a_collective()\n";

fn cpu_seconds() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF);
    u.map(|u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    })
    .unwrap_or(0.0)
}

/// The launcher's straggler tracker for `n` local ranks (one node, no GPU read).
fn tracker(n: u32) -> Tracker {
    let seat = NodeSeat {
        node_rank: 0,
        host: "bench".into(),
        gpus: Default::default(),
        uuids: Default::default(),
    };
    let status = toporun_agent::status::JobStatus::new("bench", n);
    let clocks = Box::new(toporun_agent::probe::gpu_clocks::NvmlClocks);
    let decide = StragglerDecide::Here(Default::default());
    Tracker::new(
        Root::live(),
        Duration::from_secs(60),
        seat,
        clocks,
        decide,
        status,
    )
}

fn start(python: &str, n: u32) -> Result<Vec<Child>> {
    use std::io::BufRead;
    (0..n)
        .map(|_| {
            let mut c = Command::new(python)
                .args(["-c", RANK])
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("starting {python}"))?;
            let mut line = String::new();
            std::io::BufReader::new(c.stdout.take().context("stdout")?).read_line(&mut line)?;
            Ok(c)
        })
        .collect()
}

pub fn run(python: &str, n: u32, seconds: u64, interval_ms: u64) -> Result<ExitStatus> {
    let mut children = start(python, n)?;
    let ranks: Vec<RankPid> = (0u32..)
        .zip(&children)
        .map(|(rank, c)| RankPid {
            rank,
            local_rank: rank,
            pid: i32::try_from(c.id()).unwrap_or(i32::MAX),
        })
        .collect();
    let mut sampler = Sampler::default();
    let t = Instant::now();
    let first = sampler.capture(&ranks, Duration::from_secs(5));
    let attach = t.elapsed();
    let t = Instant::now();
    sampler.capture(&ranks, Duration::from_secs(5));
    let later = t.elapsed();
    let read = first.iter().filter(|s| s.error.is_none()).count();
    let every = Duration::from_millis(interval_ms);
    let mut tracker = tracker(n);
    let (mut alone, mut tracked) = ((0.0, 0.0), (0.0, 0.0));
    // Alternating halves, so both see the same noise of a shared machine.
    for half in 0..4 {
        let (cpu0, wall0) = (cpu_seconds(), Instant::now());
        while wall0.elapsed() < Duration::from_secs(seconds) / 4 {
            std::thread::sleep(every);
            let stacks = sampler.capture(&ranks, Duration::from_secs(1));
            if half % 2 == 1 {
                tracker.observe(&ranks, &stacks);
            }
        }
        let spent = (cpu_seconds() - cpu0, wall0.elapsed().as_secs_f64());
        let sum = if half % 2 == 1 {
            &mut tracked
        } else {
            &mut alone
        };
        *sum = (sum.0 + spent.0, sum.1 + spent.1);
    }
    let share = alone.0 / alone.1;
    let with_tracker = tracked.0 / tracked.1;
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    println!(
        "{}",
        serde_json::json!({
            "ranks": n,
            "stacks_read": read,
            "first_capture_ms": attach.as_secs_f64() * 1e3,
            "later_capture_ms": later.as_secs_f64() * 1e3,
            "sampling_interval_ms": interval_ms,
            "sampling_cpu_percent_of_one_core": share * 100.0,
            "sampling_and_stragglers_cpu_percent_of_one_core": with_tracker * 100.0,
            "stragglers_added_cpu_percent_per_rank": (with_tracker - share) * 100.0 / f64::from(n.max(1)),
        })
    );
    Ok(ExitStatus::Success)
}
