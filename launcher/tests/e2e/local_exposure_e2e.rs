//! What a job exposes on its machine: a one-node job's store listens on loopback only,
//! its run directory and logs are the job's user's alone, and the ranks get the
//! open-file limit they would have had under torchrun (toporun raises only its own).

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;
use support::*;

/// An address of this machine that is not loopback (None in a sandbox without one).
fn outside_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?; // TEST-NET-1: nothing is sent
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn a_one_node_jobs_store_listens_on_loopback_only() {
    let Some(outside) = outside_address() else {
        skip(
            "a_one_node_jobs_store_listens_on_loopback_only",
            "no non-loopback address here",
        );
        return;
    };
    let port = free_port();
    let mut job = toporun()
        .args([
            "--nnodes=1",
            "--nproc-per-node=1",
            "--master-addr=127.0.0.1",
            &format!("--master-port={port}"),
            "--nccl-report=off",
            "--no-python",
            "sleep",
            "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    listening(port);
    let from_outside =
        std::net::TcpStream::connect_timeout(&(outside, port).into(), Duration::from_secs(2));
    sigterm(&job);
    let _ = job.wait();
    assert!(
        from_outside.is_err(),
        "the store of a local job answered on {outside}:{port}"
    );
}

#[test]
fn run_directories_are_private_and_ranks_keep_their_open_file_limit() {
    let logs = tempfile::tempdir().unwrap();
    let mut c = toporun();
    c.args([
        "--standalone",
        "--nproc-per-node=1",
        "--tee=3",
        "--nccl-report=off",
    ])
    .arg("--log-dir")
    .arg(logs.path())
    .args(["--no-python", "sh", "-c", "ulimit -Sn"])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    with_nofile(&mut c, 1024, 8192);
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1024"),
        "the rank's soft limit: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let runs: Vec<_> = std::fs::read_dir(logs.path()).unwrap().flatten().collect();
    assert_eq!(runs.len(), 1);
    let run = runs[0].path();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&run), 0o700, "run directory");
    let log = run.join("attempt_0/0/stdout.log");
    assert_eq!(mode(&log), 0o600, "rank log");
    assert_eq!(mode(&run.join("attempt_0/0")), 0o700, "rank directory");
}
