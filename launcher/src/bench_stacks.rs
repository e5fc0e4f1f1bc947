//! `toporun bench stacks`: what reading the ranks' stacks costs. N Python processes
//! stand in a function call (as ranks in a collective); the bench times the first
//! capture of all of them (attaching), a later one, and the CPU this process spends
//! sampling them at an interval for a while (the hang watcher's load).

use anyhow::{Context, Result};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
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

pub fn run(python: &str, n: u32, seconds: u64, interval_ms: u64) -> Result<u8> {
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
    let (cpu0, wall0) = (cpu_seconds(), Instant::now());
    while wall0.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(interval_ms));
        sampler.capture(&ranks, Duration::from_secs(1));
    }
    let share = (cpu_seconds() - cpu0) / wall0.elapsed().as_secs_f64();
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
        })
    );
    Ok(crate::exit::SUCCESS)
}
