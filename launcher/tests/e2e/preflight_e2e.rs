//! `toporun preflight` and `topo` on fixture hosts and captures, through the binary.

use crate::support;
use support::*;

fn findings(host_name: &str, extra: &[&str]) -> (i32, serde_json::Value) {
    let (code, out, err) = run(toporun()
        .args(["--facts", &host(host_name), "preflight", "--format", "json"])
        .args(extra));
    (
        code,
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}")),
    )
}

fn error_ids(v: &serde_json::Value) -> Vec<String> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] == "error")
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect()
}

fn warning_ids(v: &serde_json::Value) -> Vec<String> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] == "warning")
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn healthy_hosts_pass() {
    for h in ["h200x4", "p4d.24xlarge", "p5.48xlarge"] {
        let (code, v) = findings(h, &["--expect-gpus", "4"]);
        assert_eq!(code, 0, "{h}: {v}");
        assert!(error_ids(&v).is_empty(), "{h}");
        assert_eq!(v["ok"], true);
    }
}

#[test]
fn pcie_host_warns_and_fails_when_nvlink_is_required() {
    let (code, v) = findings("g6e.12xlarge", &[]);
    assert_eq!(code, 0);
    assert_eq!(warning_ids(&v), ["gpu.p2p"]);
    let (code, v) = findings("g6e.12xlarge", &["--require", "nvlink"]);
    assert_eq!(code, 1);
    assert_eq!(error_ids(&v), ["gpu.p2p"]);
}

#[test]
fn broken_pods_say_what_is_wrong() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("broken-shm-64mib", &["--min-shm", "16Gi"], &["shm.size"]),
        ("broken-efa-no-ipc-lock", &[], &["caps.ipc_lock", "memlock"]),
        ("broken-fabric-not-started", &[], &["gpu.fabric"]),
        (
            "broken-1-of-8-gpus",
            &["--expect-gpus", "8"],
            &["gpu.visible"],
        ),
        ("broken-1-of-8-gpus", &[], &["gpu.visible"]),
        ("broken-p2p-not-supported", &[], &["gpu.p2p"]),
        ("broken-gpu-health", &[], &["gpu.memory"]),
    ];
    for (h, extra, want) in cases {
        let (code, v) = findings(h, extra);
        assert_eq!(code, 1, "{h}");
        assert_eq!(&error_ids(&v), want, "{h}");
        for f in v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["severity"] == "error")
        {
            assert!(
                f["remedy"].as_str().is_some_and(|r| !r.is_empty()),
                "{h}: error without a fix: {f}"
            );
        }
    }
    let (code, v) = findings("broken-k8s-nccl-env", &[]);
    assert_eq!(code, 0, "warnings only");
    let unknown: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["id"] == "nccl.env")
        .map(|f| f["facts"]["variable"].as_str().unwrap())
        .collect();
    assert_eq!(unknown, ["NCCL_P2P_DIRECT_READ", "NCCL_P2P_DIRECT_WRITE"]);
}

/// The H200 capture with only /dev/shm (and NCCL variables) changed: measured on
/// 2x H200, 64 MiB works with P2P and with cuMem host memory; it fails only with the
/// SHM transport in /dev/shm files (P2P off and NCCL_CUMEM_HOST_ENABLE=0).
#[test]
fn small_shm_is_an_error_only_where_nccl_needs_shm_files() {
    let text = std::fs::read_to_string(host("h200x4")).unwrap();
    let mut facts: serde_json::Value = serde_json::from_str(&text).unwrap();
    facts["container"]["shm"]["total_bytes"] = serde_json::json!(64u64 << 20);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("small-shm.json");
    std::fs::write(&p, facts.to_string()).unwrap();
    let p = p.to_str().unwrap();
    let (code, out, _) = run(toporun().args(["preflight", "--facts", p]));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("shm.size") && out.contains("64 MiB") && out.contains("DataLoader"),
        "{out}"
    );
    facts["container"]["env"]["NCCL_P2P_DISABLE"] = serde_json::json!("1");
    let q = dir.path().join("p2p-off.json");
    std::fs::write(&q, facts.to_string()).unwrap();
    let (code, out, _) = run(toporun().args(["preflight", "--facts", q.to_str().unwrap()]));
    assert_eq!(code, 0, "SHM transport in cuMem host memory: {out}");
    facts["container"]["env"]["NCCL_CUMEM_HOST_ENABLE"] = serde_json::json!("0");
    let q = dir.path().join("shm-files.json");
    std::fs::write(&q, facts.to_string()).unwrap();
    let (code, out, _) = run(toporun().args(["preflight", "--facts", q.to_str().unwrap()]));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("failed to extend /dev/shm"), "{out}");
    // An explicit --min-shm stays a hard floor.
    let (code, _, _) = run(toporun().args(["preflight", "--min-shm", "128Mi", "--facts", p]));
    assert_eq!(code, 1);
    let (code, _, _) = run(toporun().args(["preflight", "--min-shm", "32Mi", "--facts", p]));
    assert_eq!(code, 0);
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn junit_is_valid_xml_with_a_failure_per_error() {
    let (code, out, _) = run(toporun().args([
        "--facts",
        &host("broken-efa-no-ipc-lock"),
        "preflight",
        "--format",
        "junit",
    ]));
    assert_eq!(code, 1);
    let py = std::process::Command::new(python())
        .args(["-c", "import sys, xml.etree.ElementTree as E; r = E.fromstring(sys.stdin.read()); print(len(r.findall('.//testcase')), len(r.findall('.//failure')))"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(out.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    let counts = String::from_utf8(py.stdout).unwrap();
    let (cases, failures) = counts.trim().split_once(' ').unwrap();
    assert!(cases.parse::<u32>().unwrap() >= 8);
    assert_eq!(failures, "2");
}

#[test]
fn bad_input_exits_2_with_a_message() {
    let (code, _, err) = run(toporun().args(["preflight", "--facts", "/nonexistent/facts.json"]));
    assert_eq!(code, 2);
    assert!(err.contains("cannot read facts file"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{not json").unwrap();
    let (code, _, err) = run(toporun().args(["preflight", "--facts", bad.to_str().unwrap()]));
    assert_eq!(code, 2);
    assert!(err.contains("not a valid toporun facts file"), "{err}");
    let (code, _, err) = run(toporun().args(["preflight", "--min-shm", "lots"]));
    assert_eq!(code, 2);
    assert!(err.contains("--min-shm"), "{err}");
    let (code, _, _) = run(toporun().args(["preflight", "--format", "xml"]));
    assert_eq!(code, 2);
}

/// `toporun topo --format json` of a capture in tests/fixtures/topo.
fn topo_json(file: &str) -> serde_json::Value {
    let path = fixtures().join("topo").join(file);
    let (code, out, err) = run(toporun().args([
        "topo",
        "--format",
        "json",
        "--nvidia-smi-topo",
        path.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{file}: {err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn topo_json_for_every_capture() {
    let cases = [
        ("h200x4.txt", 4, "NV18"),
        ("p4d.24xlarge.txt", 8, "NV12"),
        ("p5.48xlarge.txt", 8, "NV18"),
        ("g6e.12xlarge.txt", 4, "NODE"),
        ("dgx1-v100.txt", 8, ""),
        ("dgx-a100.txt", 8, "NV12"),
        ("dgx2-16gpu.txt", 16, "NV6"),
        ("pcie-mlx4-8gpu.txt", 8, ""),
    ];
    for (file, n, all) in cases {
        let m: Vec<Vec<String>> =
            serde_json::from_value(topo_json(file)["matrix"].clone()).unwrap();
        assert_eq!(m.len(), n, "{file}");
        for (i, row) in m.iter().enumerate() {
            assert_eq!(row.len(), n);
            for (j, code) in row.iter().enumerate() {
                if i == j {
                    assert_eq!(code, "X");
                } else if !all.is_empty() {
                    assert_eq!(code, all, "{file} [{i}][{j}]");
                }
            }
        }
    }
}

#[test]
fn topo_json_for_public_captures_matches_their_text() {
    let v = topo_json("dgx1-v100.txt");
    // DGX-1's hybrid cube mesh: GPU0 has NV1/NV2 to 1-4, SYS to 5-7 (captured as SOC).
    assert_eq!(
        v["matrix"][0],
        serde_json::json!(["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"])
    );
    assert_eq!(v["matrix"][5][1], "NV2");
    let v = topo_json("pcie-mlx4-8gpu.txt");
    assert_eq!(
        v["matrix"][0],
        serde_json::json!(["X", "PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"])
    );
    assert_eq!(v["gpus"][4]["cpu_affinity"], "10-19,30-39");
    assert_eq!(topo_json("dgx-a100.txt")["gpus"][2]["numa_node"], 1);
}

/// Each NVML health fault injected in the fixture is named, with its GPU, in every
/// output format; the pending row remap is an error, the others warnings.
#[test]
fn gpu_health_faults_are_named_in_every_format() {
    let (code, v) = findings("broken-gpu-health", &[]);
    assert_eq!(code, 1);
    let summary = |id: &str| {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("no {id}: {v}"))["summary"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(summary("gpu.memory").contains("GPU1: a row remap is pending"));
    for (id, needle) in [
        ("gpu.pcie", "GPU3: x8 of x16"),
        ("gpu.throttle", "GPU2: hardware thermal"),
        ("gpu.nvlink", "GPU0: 16 of 18 links up"),
        ("gpu.processes", "GPU2: 1 process"),
    ] {
        assert!(summary(id).contains(needle), "{id}: {}", summary(id));
        assert!(warning_ids(&v).contains(&id.to_string()), "{id}");
    }
    let (code, text, _) = run(toporun().args(["--facts", &host("broken-gpu-health"), "preflight"]));
    assert_eq!(code, 1);
    assert!(
        text.contains("GPU3: x8 of x16") && text.contains("fix: cordon and drain"),
        "{text}"
    );
    let (_, junit, _) = run(toporun().args([
        "--facts",
        &host("broken-gpu-health"),
        "preflight",
        "--format",
        "junit",
    ]));
    assert!(
        junit.contains("gpu.memory") && junit.contains("row remap is pending"),
        "{junit}"
    );
}

/// A real measurement (1x H100, tests/fixtures/device/measure-h100) replayed from its
/// facts: at its PCIe Gen5 x16 class; the same host with a halved host->device figure
/// is named with the class it misses.
#[test]
fn measured_links_are_checked_against_their_class() {
    let (code, v) = findings("h200x1-measured", &[]);
    assert_eq!(code, 0, "{v}");
    let path = host("h100x1-measured");
    let (code, v) = findings("h100x1-measured", &[]);
    assert_eq!(code, 0, "{v}");
    let by_id = |v: &serde_json::Value, id: &str| {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("no {id}: {v}"))
            .clone()
    };
    let f = by_id(&v, "gpu.host_bandwidth");
    assert_eq!(f["severity"], "ok", "{f}");
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .contains("GPU0 54.9/55.1 GB/s"),
        "{f}"
    );
    let mut facts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    facts["bandwidth"]["host"][0]["h2d_gbps"] = serde_json::json!(21.5);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("slow.json");
    std::fs::write(&p, facts.to_string()).unwrap();
    let (code, out, err) = run(toporun().args([
        "--facts",
        p.to_str().unwrap(),
        "preflight",
        "--format",
        "json",
    ]));
    assert_eq!(code, 0, "a slow link is a warning: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = by_id(&v, "gpu.host_bandwidth");
    assert_eq!(f["severity"], "warning", "{f}");
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .contains("GPU0 21.5 GB/s host->device")
            && f["summary"].as_str().unwrap().contains("PCIe Gen5 x16"),
        "{f}"
    );
}

/// No CUDA driver here: --measure says so and checks the rest; with --facts it refuses.
#[test]
fn measure_without_a_driver_is_a_note_and_with_facts_a_usage_error() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        // A GPU machine: scripts/device/gpu_measure_links.sh covers it.
        support::skip(
            "measure_without_a_driver_is_a_note_and_with_facts_a_usage_error",
            "this machine has a CUDA driver",
        );
        return;
    }
    let (code, out, err) = run(toporun().args([
        "preflight",
        "--measure",
        "--no-metadata",
        "--format",
        "json",
    ]));
    assert_eq!(code, 0, "{out} {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["bandwidth"]["error"]
            .as_str()
            .unwrap()
            .contains("libcuda.so.1"),
        "{v}"
    );
    let (code, _, err) =
        run(toporun().args(["--facts", &host("h200x4"), "preflight", "--measure"]));
    assert_eq!(code, 2);
    assert!(err.contains("--measure measures this machine"), "{err}");
    // The launch's preflight measures when asked, says why it could not, and starts.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("noop.py");
    std::fs::write(&script, "print('rank ran')\n").unwrap();
    let (code, out, err) = run(toporun()
        .args([
            "--preflight-measure",
            "--standalone",
            "--nproc-per-node=1",
            "--no-python",
        ])
        .arg("python3")
        .arg(&script));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("rank ran"), "{out}");
    assert!(
        err.contains("links not measured: no CUDA driver library"),
        "{err}"
    );
}
