//! `toporun nccl-log` on every captured NCCL log: communicators, sizes, and the
//! transport of every link, as NCCL logged them.

use crate::support;

use serde_json::Value;
use support::{host, nccl_log, run, toporun};

fn json(args: &[&str]) -> (i32, Value) {
    let (code, out, err) = run(toporun().arg("nccl-log").args(args).arg("--format=json"));
    (
        code,
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}")),
    )
}

/// (nranks, nnodes, sorted "from->to via class" of every link) of each communicator.
fn comms(v: &Value) -> Vec<(Value, Value, Vec<String>)> {
    v["communicators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let mut links: Vec<String> = c["links"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    format!(
                        "{}->{} {} {}",
                        l["from"],
                        l["to"],
                        l["via"].as_str().unwrap(),
                        l["class"].as_str().unwrap()
                    )
                })
                .collect();
            links.sort();
            (c["nranks"].clone(), c["nnodes"].clone(), links)
        })
        .collect()
}

fn ring4(via: &str, class: &str) -> Vec<String> {
    let mut v: Vec<String> = [(0, 1), (1, 2), (2, 3), (3, 0)]
        .iter()
        .map(|(a, b)| format!("{a}->{b} {via} {class}"))
        .collect();
    v.sort();
    v
}

#[test]
fn h200x4_single_node_logs_by_transport() {
    for (file, via, class) in [
        ("h200x4-default.log", "P2P/CUMEM", "p2p"),
        ("h200x4-p2p_nvl.log", "P2P/CUMEM", "p2p"),
        ("h200x4-proto_simple.log", "P2P/CUMEM", "p2p"),
        ("h200x4-p2p_off.log", "SHM/direct/direct", "shm"),
    ] {
        let (_, v) = json(&[&nccl_log(file)]);
        let c = comms(&v);
        assert_eq!(c.len(), 1, "{file}");
        assert_eq!(
            (c[0].0.as_u64(), c[0].1.as_u64()),
            (Some(4), Some(1)),
            "{file}"
        );
        assert_eq!(c[0].2, ring4(via, class), "{file}");
        assert_eq!(v["version"], "2.28.9+cuda13.0");
        assert_eq!(v["communicators"][0]["complete"], true, "{file}");
    }
}

#[test]
fn p2p_and_shm_off_go_over_sockets_between_every_pair() {
    let (code, v) = json(&[&nccl_log("h200x4-p2p_shm_off.log")]);
    let c = comms(&v);
    assert_eq!((c[0].0.as_u64(), c[0].1.as_u64()), (Some(4), Some(4)));
    assert!(c[0].2.iter().all(|l| l.ends_with("NET/Socket/0 net")));
    assert_eq!(c[0].2.len(), 11);
    // One host, four NCCL "nodes": not the best this host allows.
    assert_eq!(code, 1);
    assert_eq!(v["findings"][0]["id"], "nccl.transport");
}

#[test]
fn two_nodes_one_host_and_other_hostname() {
    let (code, v) = json(&[
        &nccl_log("h200x2-two-nodes-same-host-node0.log"),
        &nccl_log("h200x2-two-nodes-same-host-node1.log"),
    ]);
    assert_eq!(code, 0);
    let c = comms(&v);
    assert_eq!((c[0].0.as_u64(), c[0].1.as_u64()), (Some(2), Some(1)));
    assert_eq!(c[0].2, ["0->1 P2P/CUMEM p2p", "1->0 P2P/CUMEM p2p"]);
    assert_eq!(v["communicators"][0]["complete"], true);

    let (_, v) = json(&[
        &nccl_log("h200x2-two-nodes-other-hostname-node0.log"),
        &nccl_log("h200x2-two-nodes-other-hostname-node1.log"),
    ]);
    let c = comms(&v);
    assert_eq!((c[0].0.as_u64(), c[0].1.as_u64()), (Some(2), Some(2)));
    assert_eq!(c[0].2, ["0->1 NET/Socket/0 net", "1->0 NET/Socket/0 net"]);
    let hosts: Vec<&str> = v["communicators"][0]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["vm", "otherpod"]);
}

#[test]
fn two_toporun_nodes_in_one_container_are_one_nccl_node() {
    let (_, v) = json(&[&nccl_log("h200x4-two-nodes-same-container-node0.log")]);
    let c = comms(&v);
    assert_eq!((c[0].0.as_u64(), c[0].1.as_u64()), (Some(4), Some(1)));
    assert_eq!(v["communicators"][0]["local_ranks"], 4);
    assert!(c[0].2.iter().all(|l| l.ends_with("P2P/CUMEM p2p")));
}

#[test]
fn efa_pods_and_split_communicators() {
    let (code, v) = json(&[&nccl_log("p4d-4pods-efa-libfabric.log")]);
    assert_eq!(code, 0);
    assert_eq!(v["net_plugins"][0], "Libfabric");
    let c = comms(&v);
    assert_eq!(c.len(), 2, "the world communicator and its ncclCommSplit");
    assert!(c
        .iter()
        .all(|c| c.0.as_u64() == Some(4) && c.1.as_u64() == Some(4)));
    assert!(v["communicators"][1]["id"]
        .as_str()
        .unwrap()
        .contains("/color "));
    assert_eq!(c[1].2.len(), 6);
    assert!(c[1]
        .2
        .iter()
        .all(|l| l.ends_with("NET/Libfabric/0/GDRDMA net")));
}

#[test]
fn mixed_shm_and_net_without_init_lines() {
    let (_, v) = json(&[&nccl_log("pods-mixed-shm-net.log")]);
    let c = comms(&v);
    assert_eq!(c[0].0, Value::Null, "the log never states the size");
    assert_eq!(c[0].2.iter().filter(|l| l.ends_with("shm")).count(), 3);
    assert_eq!(
        c[0].2
            .iter()
            .filter(|l| l.ends_with("NET/Socket/0 net"))
            .count(),
        4
    );
}

#[test]
fn topology_judges_shm_on_an_nvlink_host() {
    let (code, out, _) = run(toporun().args([
        "--facts",
        &host("h200x4"),
        "nccl-log",
        &nccl_log("h200x4-p2p_off.log"),
    ]));
    assert_eq!(code, 1);
    assert!(out.contains("NOT the best available"), "{out}");
    assert!(
        out.contains("P2P over NVLink (NV18)") && out.contains("12.9x slower"),
        "{out}"
    );
    let (code, out, _) = run(toporun().args([
        "--facts",
        &host("h200x4"),
        "nccl-log",
        &nccl_log("h200x4-default.log"),
    ]));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("best available"));
    // The matrix reads like nvidia-smi topo -m.
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["R0", "X", "P2P", ".", "P2P", "h200-node"]),
        "{out}"
    );
}

#[test]
fn known_failures_are_named_with_their_fix() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("fail.log");
    std::fs::write(&f, "[default1]:vm:2001:2001 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n[default1]:vm:2001:2001 [0] misc/ipcsocket.cc:221 NCCL WARN UDS: Sending data over socket /tmp/nccl-socket-1-ab failed : Connection refused (111)\nTraceback (most recent call last):\n").unwrap();
    let (code, v) = json(&[f.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(v["findings"][0]["id"], "nccl.split_netns");
    assert_eq!(v["findings"][0]["severity"], "error");
    assert!(v["findings"][0]["remedy"]
        .as_str()
        .unwrap()
        .contains("NCCL_CUMEM_ENABLE=0"));
}

#[test]
fn garbage_empty_binary_and_missing_files_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.log");
    std::fs::write(&empty, "").unwrap();
    let text = dir.path().join("text.log");
    std::fs::write(&text, "epoch 1 loss 0.3\nNCCL INFO but not a header\n").unwrap();
    let bin = dir.path().join("bin.log");
    let bytes: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&bin, bytes).unwrap();
    for f in [&empty, &text, &bin] {
        let (code, out, err) = run(toporun().args(["nccl-log", f.to_str().unwrap()]));
        assert_eq!(code, 2, "{f:?}: {out}{err}");
        assert!(err.contains("no NCCL log line"), "{err}");
    }
    let (code, _, err) = run(toporun().args(["nccl-log", "/nonexistent/x.log"]));
    assert_eq!(code, 2);
    assert!(err.contains("cannot read /nonexistent/x.log"), "{err}");
    let (code, _, err) = run(toporun()
        .args(["nccl-log", "/dev/zero"])
        .env("TOPORUN_TEST", "1"));
    assert_eq!(code, 2, "{err}");
}

/// The logs of this project's own 2x H200 runs (scripts/device/gpu_nccl_evidence.sh, rows of
/// tests/fixtures/device/nccl-evidence.md): what NCCL did in each scenario.
#[test]
fn h200x2_evidence_scenarios() {
    let cases: &[(&str, u64, &str, &[&str])] = &[
        ("same", 1, "P2P/CUMEM", &[]),
        ("uts-join", 1, "P2P/CUMEM", &[]),
        ("net-warn", 1, "P2P/IPC", &[]),
        ("net-cumem1", 1, "P2P/CUMEM", &["nccl.split_netns"]),
        ("netuts-warn", 2, "NET/Socket/0", &[]),
        ("netuts-join", 1, "P2P/IPC", &[]),
        ("pod-shared-warn", 2, "NET/Socket/0", &[]),
        ("pod-shared-join", 2, "NET/Socket/0", &[]),
        ("pod-own-join", 2, "NET/Socket/0", &[]),
        (
            "pod-joined-own-gpu-failed",
            1,
            "P2P/IPC",
            &["nccl.peer_gpu"],
        ),
    ];
    for (tag, nnodes, via, failures) in cases {
        let f = |n: u32| nccl_log(&format!("h200x2-evidence/{tag}-node{n}.log"));
        let (code, v) = json(&[&f(0), &f(1)]);
        let c = &v["communicators"][0];
        assert_eq!(c["nnodes"].as_u64(), Some(*nnodes), "{tag}");
        assert_eq!(c["nranks"], 2, "{tag}");
        let vias: std::collections::BTreeSet<&str> = c["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["via"].as_str().unwrap())
            .collect();
        assert_eq!(vias.into_iter().collect::<Vec<_>>(), [*via], "{tag}");
        let ids: std::collections::BTreeSet<&str> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.into_iter().collect::<Vec<_>>(), *failures, "{tag}");
        assert_eq!(code, u8::from(!failures.is_empty()) as i32, "{tag}");
    }
}
