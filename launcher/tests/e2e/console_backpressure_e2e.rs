//! A console that stops draining must not grow toporun: with `--tee=3` and a rank
//! writing 512 MiB while nobody reads toporun's stdout, toporun stays small (the rank
//! waits on its pipe, as under torchrun), and once the console drains again every
//! line reaches both the console and the log file. 512 MiB is five times the RSS
//! bound, and the log file it leaves is small enough for a nearly full disk.

use crate::support;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::*;

const LINES: u64 = 1 << 19; // 512 Ki lines of 1 KiB: 512 MiB

fn files_named(dir: &std::path::Path, name: &str, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_named(&p, name, out);
        } else if p.file_name().is_some_and(|n| n == name) {
            out.push(p);
        }
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_stalled_console_holds_the_rank_back_and_loses_nothing() {
    let logs = tempfile::tempdir().unwrap();
    let writer = format!(
        "import sys\nline = b'x' * 1023 + b'\\n'\nblock = line * 64\nfor _ in range({}):\n    sys.stdout.buffer.write(block)\n",
        LINES / 64
    );
    let mut child = toporun()
        .args([
            "--standalone",
            "--nproc-per-node=1",
            "--tee=3",
            "--nccl-report=off",
        ])
        .arg("--log-dir")
        .arg(logs.path())
        .arg("--no-python")
        .arg(python())
        .args(["-c", &writer])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Nobody reads toporun's stdout for 5 s: the rank fills the queue and blocks.
    let stalled = Instant::now();
    let mut peak = 0;
    while stalled.elapsed() < Duration::from_secs(5) {
        peak = peak.max(rss_mb(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "toporun died while its console was stalled"
    );
    // Then the console drains: count every line.
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let (mut newlines, mut bytes) = (0u64, 0u64);
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        bytes += n as u64;
        newlines += buf[..n].iter().filter(|b| **b == b'\n').count() as u64;
        peak = peak.max(rss_mb(pid));
    }
    let status = child.wait().unwrap();
    assert!(peak < 100, "toporun's RSS peaked at {peak} MB");
    assert!(status.success(), "{status:?}");
    assert_eq!(newlines, LINES, "console lines ({bytes} bytes)");
    let mut found = Vec::new();
    files_named(logs.path(), "stdout.log", &mut found);
    assert_eq!(found.len(), 1, "{found:?}");
    let size = std::fs::metadata(&found[0]).unwrap().len();
    assert_eq!(size, LINES * 1024, "the log file lost output");
    eprintln!("stalled console, 512 MiB through --tee=3: toporun RSS peak {peak} MB");
}
