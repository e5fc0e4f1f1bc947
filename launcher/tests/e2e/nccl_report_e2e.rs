//! The live NCCL report on this CPU machine: ranks write real captured NCCL logs to
//! their NCCL_DEBUG_FILE as NCCL does, and toporun's report must say what those logs
//! say (same-host P2P, other-hostname NET/Socket, a failure signature).

use crate::support;
use std::process::{Command, Stdio};
use support::*;

fn launch(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = toporun();
    c.args(args)
        .arg("fake_nccl.py")
        .env("PYTHON_EXEC", "python3")
        .current_dir(scripts());
    for (k, v) in env {
        c.env(k, v);
    }
    let (code, out, err) = run(&mut c);
    (code, format!("{out}{err}"))
}

#[test]
fn same_host_ranks_report_p2p_and_write_the_json() {
    let dir = tempfile::tempdir().unwrap();
    let logs = format!(
        "{},{}",
        nccl_log("h200x2-two-nodes-same-host-node0.log"),
        nccl_log("h200x2-two-nodes-same-host-node1.log")
    );
    let (code, out) = launch(
        &[
            "--standalone",
            "--nproc-per-node=2",
            "--log-dir",
            dir.path().to_str().unwrap(),
        ],
        &[
            ("FAKE_NCCL_LOGS", &logs),
            ("NCCL_PROFILER_PLUGIN", "/opt/comma/libnccl-profiler.so"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "toporun: nccl: 2 ranks on 1 node, 1 rank pair via P2P/CUMEM (P2P): best available"
        ),
        "{out}"
    );
    // The user's profiler plugin is named with the report, and why NCCL's counters
    // are missing from it.
    assert!(
        out.contains("toporun: nccl: NCCL's own counters: off, your NCCL_PROFILER_PLUGIN=/opt/comma/libnccl-profiler.so is kept"),
        "{out}"
    );
    // The ranks got NCCL's debug settings; the console stayed clean of NCCL lines.
    assert!(
        out.contains("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_FILE="),
        "{out}"
    );
    assert!(!out.contains("NCCL INFO"), "{out}");
    let json = files_under(dir.path())
        .into_iter()
        .find(|p| p.ends_with("nccl-report.json"))
        .expect("nccl-report.json in the run dir");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert_eq!(v["communicators"][0]["nranks"], 2);
    assert_eq!(v["communicators"][0]["links"][0]["via"], "P2P/CUMEM");
    for doc in ["nccl-report.json", "nccl-report-job.json"] {
        let path = files_under(dir.path())
            .into_iter()
            .find(|p| p.ends_with(doc))
            .unwrap_or_else(|| panic!("{doc} in the run dir"));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(v["nccl_profiler"]["plugin"], "user", "{doc}: {v}");
        assert_eq!(
            v["nccl_profiler"]["path"], "/opt/comma/libnccl-profiler.so",
            "{doc}"
        );
    }
    let files: Vec<_> = files_under(dir.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/nccl/nccl."))
        .collect();
    assert_eq!(
        files.len(),
        2,
        "one file per rank, %h and %p substituted: {files:?}"
    );
}

#[test]
fn a_failure_signature_is_reported_as_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("uds.log");
    std::fs::write(&bad, "vm:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\nvm:1:1 [0] misc/ipcsocket.cc:221 NCCL WARN UDS: Sending data over socket /tmp/nccl-socket-1-ab failed : Connection refused (111)\n").unwrap();
    let (code, out) = launch(
        &["--standalone", "--nproc-per-node=1"],
        &[
            ("FAKE_NCCL_LOGS", bad.to_str().unwrap()),
            ("FAKE_NCCL_EXIT", "1"),
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("NCCL failed on this node")
            && out.contains("network namespaces")
            && out.contains("NCCL_CUMEM_ENABLE=0"),
        "{out}"
    );
}

#[test]
fn off_and_user_settings_leave_nccl_alone() {
    let logs = nccl_log("h200x2-two-nodes-same-host-node0.log");
    let (code, out) = launch(
        &["--standalone", "--nproc-per-node=1", "--nccl-report=off"],
        &[("FAKE_NCCL_LOGS", &logs)],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("NCCL_DEBUG=- NCCL_DEBUG_SUBSYS=- NCCL_DEBUG_FILE=-"),
        "{out}"
    );
    assert!(!out.contains("toporun: nccl"), "{out}");
    let (code, out) = launch(
        &["--standalone", "--nproc-per-node=1"],
        &[("FAKE_NCCL_LOGS", &logs), ("NCCL_DEBUG", "INFO")],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=- NCCL_DEBUG_FILE=-"),
        "{out}"
    );
    assert!(
        out.contains("nccl report off: NCCL_DEBUG=INFO set by you"),
        "{out}"
    );
    // The user's own NCCL_DEBUG_FILE is followed where it points.
    let dir = tempfile::tempdir().unwrap();
    let pattern = format!("{}/mine.%h.%p", dir.path().display());
    let (code, out) = launch(
        &["--standalone", "--nproc-per-node=1"],
        &[("FAKE_NCCL_LOGS", &logs), ("NCCL_DEBUG_FILE", &pattern)],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("toporun: nccl: 2 ranks on 1 node"), "{out}");
}

#[test]
fn two_nodes_with_other_hostnames_report_sockets_job_wide() {
    if !can_unshare_uts("two_nodes_with_other_hostnames_report_sockets_job_wide") {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let logs = format!(
        "{},{}",
        nccl_log("h200x2-two-nodes-other-hostname-node0.log"),
        nccl_log("h200x2-two-nodes-other-hostname-node1.log")
    );
    let args = |r: u32| {
        vec![
            "--nnodes=2".to_string(),
            format!("--node-rank={r}"),
            "--master-addr=127.0.0.1".into(),
            format!("--master-port={port}"),
            "--nproc-per-node=1".into(),
            "--colocated=warn".into(),
            "fake_nccl.py".into(),
        ]
    };
    let spawn = |c: &mut Command| {
        c.env("PYTHON_EXEC", "python3")
            .env("FAKE_NCCL_LOGS", &logs)
            .env("FAKE_NCCL_STAY", "1")
            .current_dir(scripts())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let n0 = spawn(toporun().args(args(0)));
    let n1 = spawn(
        Command::new("unshare")
            .args([
                "--uts",
                "sh",
                "-c",
                "hostname otherpod && exec \"$0\" \"$@\"",
                env!("CARGO_BIN_EXE_toporun"),
            ])
            .args(args(1)),
    );
    let o0 = n0.wait_with_output().unwrap();
    let o1 = n1.wait_with_output().unwrap();
    let (s0, s1) = (
        String::from_utf8_lossy(&o0.stderr),
        String::from_utf8_lossy(&o1.stderr),
    );
    assert!(
        o0.status.success() && o1.status.success(),
        "{s0}\n---\n{s1}"
    );
    assert!(
        s0.contains("toporun: nccl: 2 ranks on 2 nodes, 1 rank pair via NET/Socket/0 (SOCK)"),
        "{s0}"
    );
    assert!(
        s1.contains("toporun: nccl (node 1): 2 ranks on 2 nodes"),
        "{s1}"
    );
    // toporun predicted it: the co-location warning says NCCL takes them apart.
    assert!(
        s0.contains("warning: rdzv.colocated") && s0.contains("separate hosts"),
        "{s0}"
    );
    assert!(!s0.contains("nccl.prediction"), "{s0}");
}
