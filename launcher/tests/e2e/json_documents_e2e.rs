//! The JSON documents' field names, as scripts read them: each command's output on a
//! fixture host carries exactly these top-level (and per-item) fields.

use crate::support;
use serde_json::Value;
use support::*;

fn json(args: &[&str]) -> Value {
    let (_, out, err) = run(toporun().args(args));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"))
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

#[test]
fn topo_preflight_dry_run_and_nccl_log_documents() {
    let h = host("h200x4");
    let topo = json(&["topo", "--facts", &h, "--format", "json"]);
    assert_eq!(
        keys(&topo),
        ["gpus", "matrix", "nics", "p2p", "rdma", "source"]
    );
    assert_eq!(
        keys(&topo["gpus"][0]),
        [
            "cpu_affinity",
            "index",
            "name",
            "numa_node",
            "pci_bus_id",
            "uuid"
        ]
    );
    assert_eq!(keys(&topo["p2p"][0]), ["a", "b", "read", "write"]);

    let pre = json(&["preflight", "--facts", &h, "--format", "json"]);
    assert_eq!(keys(&pre), ["findings", "ok"]);
    assert_eq!(
        keys(&pre["findings"][0]),
        ["facts", "id", "remedy", "severity", "summary"]
            .into_iter()
            .filter(|k| pre["findings"][0].get(k).is_some())
            .collect::<Vec<_>>()
    );
    let measured = json(&[
        "preflight",
        "--facts",
        &host("h100x1-measured"),
        "--format",
        "json",
    ]);
    assert_eq!(keys(&measured), ["bandwidth", "findings", "ok"]);

    let dry = json(&[
        "launch",
        "--dry-run",
        "--facts",
        &h,
        "--format",
        "json",
        "--nproc-per-node=2",
        "t.py",
    ]);
    assert_eq!(
        keys(&dry),
        [
            "findings",
            "global_ranks",
            "host",
            "nccl_expected",
            "nccl_report",
            "nnodes",
            "notes",
            "nproc_per_node",
            "plan",
            "python",
            "ranks"
        ]
    );
    assert_eq!(keys(&dry["host"]), ["gpus", "hostname", "links", "product"]);
    assert_eq!(keys(&dry["python"]), ["path", "why"]);
    assert_eq!(
        keys(&dry["ranks"][0]),
        [
            "argv",
            "cpus",
            "env",
            "gpu",
            "gpu_uuid",
            "local_rank",
            "rank"
        ]
    );

    let log = fixtures().join("nccl-logs/h200x4-default.log");
    let nl = json(&["nccl-log", log.to_str().unwrap(), "--format", "json"]);
    assert_eq!(
        keys(&nl),
        [
            "communicators",
            "findings",
            "nccl_lines",
            "net_plugins",
            "version"
        ]
    );
    assert_eq!(
        keys(&nl["communicators"][0]),
        [
            "complete",
            "id",
            "links",
            "local_ranks",
            "nnodes",
            "nranks",
            "ranks",
            "summary"
        ]
    );
}
